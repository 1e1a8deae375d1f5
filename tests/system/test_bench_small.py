"""Small versions of the `make bench` sweeps, held to the golden cycle model (Verilator).

Every point runs tb/suites/bench.py as `make bench` does: every frame's cycle must equal the
cycle model's, and the figures below are deterministic facts of the simulation (cycle
counts), checked against the issue's targets. Verilator only: these runs are thousands
of cycles of a 1024-bit datapath, which Icarus takes minutes for; Icarus runs the same
blocks in every system test (tests/system/test_nic.py).
"""
import json
import shutil

from tb.runner import ROOT, run

POINTS = [
    {"size": 8, "qps": 8, "batch": 32, "latency_ns": 1000, "msgs": 64},
    # 512 messages per QP: long enough for the steady state, where the 150-byte payload reads
    # and their WQE reads must not share one port (they would reach 0.98 of the wire)
    {"size": 150, "qps": 8, "batch": 32, "latency_ns": 1000, "msgs": 512},
    {"size": 4096, "qps": 8, "batch": 32, "latency_ns": 1000, "msgs": 8},
    {"kind": "latency", "latency_ns": 1000},
    {"kind": "share", "weights": [1, 2, 4], "window": 20000, "latency_ns": 1000},
]


def test_bench_small():
    out = ROOT / "build" / "test_bench_small"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    run("verilator", "tb.suites.bench", None, extra_env={"IBGDA_BENCH_OUT": str(out), "BENCH_POINTS": json.dumps(POINTS)},
        test_dir=out / "run")
    recs = {f.stem: json.loads(f.read_text()) for f in out.glob("*.json")}
    assert len(recs) == len(POINTS), sorted(recs)
    w8 = recs["write_8B_8qp_b32_1000ns"]
    assert w8["messages_per_s"] >= 450e6, w8
    for name in ("write_150B_8qp_b32_1000ns", "write_4096B_8qp_b32_1000ns"):
        assert recs[name]["ratio_to_wire_limit"] >= 0.99, recs[name]
    lat = recs["latency_1000ns"]["cases"]
    assert lat["inline_8B"]["db_to_first_byte_cycles"] <= 500 + 32, lat
    assert lat["blueflame_8B"]["db_to_first_byte_cycles"] <= 32, lat
    # a pointer WQE pushed by BlueFlame needs only the payload's round trip
    assert lat["blueflame_pointer_64B"]["db_to_first_byte_cycles"] <= 500 + 32, lat
    for case, row in lat.items():
        assert row["db_to_first_byte_cycles"] == row["cycle_model"], (case, lat)
    share = recs["share_w1-2-4_20000"]
    assert share["max_share_error"] < 0.02, share
