"""The cocotb suites. Point-driven ones (bench, bench_pair, seeds) make one cocotb test a point."""
import json
import time

import cocotb
from cocotb.simtime import get_sim_time

from spec.params import CLOCK_PERIOD_NS


def point_tests(namespace, prefix, tag, points, name, run, out):
    """Add to ``namespace`` (a suite's globals()) the cocotb test ``<prefix>_<k>`` of each of
    ``points``: it says which point it runs, awaits ``run(dut, point)`` (a record with a
    ``point`` name) and writes the record to ``<out>/<point>.json``, with the simulation's
    speed at the point (``sim_speed``: engine cycles simulated, wall seconds, cycles per
    wall second; issue 47's measure, not a check)."""
    def make(k, p):
        async def test(dut):
            print(f"[{tag}] point {k + 1}/{len(points)}: {name(p)}", flush=True)
            wall0, ns0 = time.perf_counter(), get_sim_time("ns")
            rec = await run(dut, p)
            wall, cycles = time.perf_counter() - wall0, (get_sim_time("ns") - ns0) / CLOCK_PERIOD_NS
            rec["sim_speed"] = {"cycles": cycles, "wall_s": wall, "cycles_per_s": cycles / wall,
                                "simulator": cocotb.SIM_NAME}
            print(f"[{tag}] point {k + 1}/{len(points)}: {cycles:.0f} cycles in {wall:.1f} s, "
                  f"{cycles / wall:.0f} cycles/s", flush=True)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{rec['point']}.json").write_text(json.dumps(rec, indent=2))
        test.__name__ = test.__qualname__ = f"{prefix}_{k:03d}"
        return cocotb.test()(test)
    for k, p in enumerate(points):
        namespace[f"{prefix}_{k:03d}"] = make(k, p)
