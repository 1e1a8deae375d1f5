"""The runners that print a table of points (`make bench`, `make seeds`) fail when a
point's check failed: a cocotb run of three points, the second failing, as their tasks
run it (scripts/tasks.py ``run_suite``, through tb.runner ``run``)."""
import pytest

from rtl.build import TOP_NAME
from scripts.tasks import run_suite
from tb.runner import SimulationFailed, run


POINTS = [{"name": "p0", "ok": True}, {"name": "p1", "ok": False}, {"name": "p2", "ok": True}]


def test_a_failed_point_is_named():
    res = run_suite("verilator", "tb.selftest.points", TOP_NAME, "SELFTEST_POINTS", POINTS, "SELFTEST_OUT")
    assert sorted(res["files"]) == ["p0.json", "p2.json"]
    assert [(f["test"], f["point"]) for f in res["failed"]] == [("tb.selftest.points.selftest_001", POINTS[1])]
    assert any("deliberately failing" in line for line in res["failed"][0]["why"]), res["failed"][0]["why"]


def test_a_failed_test_raises(tmp_path):
    with pytest.raises(SimulationFailed) as e:
        run("verilator", "tb.selftest.points", None, test_dir=tmp_path,
            extra_env={"SELFTEST_POINTS": '[{"name": "p0", "ok": false}]', "SELFTEST_OUT": str(tmp_path)})
    assert e.value.failed == ["selftest_000"]
