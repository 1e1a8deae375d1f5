"""Self-test of how a runner reports failed points (scripts/tasks.py ``run_suite``): three
points through ``point_tests``, the second of which fails its check. No use of the design
beyond its clock; runs on any top."""
import json
import os
from pathlib import Path

from cocotb.triggers import Timer

from tb.suites import point_tests

POINTS = json.loads(os.environ.get("SELFTEST_POINTS", "[]"))
OUT = Path(os.environ.get("SELFTEST_OUT", "."))


async def _run(dut, p):
    await Timer(10, "ns")
    assert p["ok"], f"point {p['name']}: the deliberately failing check"
    return {"point": p["name"]}


point_tests(globals(), "selftest", "selftest", POINTS, lambda p: p["name"], _run, OUT)
