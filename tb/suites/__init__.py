"""The cocotb suites. Point-driven ones (bench, bench_pair, seeds) make one cocotb test a point."""
import json

import cocotb


def point_tests(namespace, prefix, tag, points, name, run, out):
    """Add to ``namespace`` (a suite's globals()) the cocotb test ``<prefix>_<k>`` of each of
    ``points``: it says which point it runs, awaits ``run(dut, point)`` (a record with a
    ``point`` name) and writes the record to ``<out>/<point>.json``."""
    def make(k, p):
        async def test(dut):
            print(f"[{tag}] point {k + 1}/{len(points)}: {name(p)}", flush=True)
            rec = await run(dut, p)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{rec['point']}.json").write_text(json.dumps(rec, indent=2))
        test.__name__ = test.__qualname__ = f"{prefix}_{k:03d}"
        return cocotb.test()(test)
    for k, p in enumerate(points):
        namespace[f"{prefix}_{k:03d}"] = make(k, p)
