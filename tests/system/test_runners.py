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
    import json
    speed = json.loads(res["files"]["p0.json"])["sim_speed"]      # each point's own 10 ns: 5 cycles
    assert speed["cycles"] == 5 and speed["wall_s"] > 0, speed
    assert [(f["test"], f["point"]) for f in res["failed"]] == [("tb.selftest.points.selftest_001", POINTS[1])]
    assert any("deliberately failing" in line for line in res["failed"][0]["why"]), res["failed"][0]["why"]


def test_a_failed_test_raises(tmp_path):
    with pytest.raises(SimulationFailed) as e:
        run("verilator", "tb.selftest.points", None, test_dir=tmp_path,
            extra_env={"SELFTEST_POINTS": '[{"name": "p0", "ok": false}]', "SELFTEST_OUT": str(tmp_path)})
    assert e.value.failed == ["selftest_000"]


def test_profile_split(tmp_path):
    """`make profile`'s split (scripts/run_profile.py): own time grouped by where the code
    lives, and the wall time no Python ran in given to the simulator."""
    import cProfile
    from scripts.run_profile import split
    from model.memory import SparseMemory
    from tb.rx_quarters import pack

    prof = cProfile.Profile()
    prof.enable()
    mem = SparseMemory()
    for k in range(300):
        mem.write(0x1000 + 8 * k, bytes(8))
        pack([bytes(60 + k % 50), bytes(100)])
    prof.disable()
    prof.dump_stats(tmp_path / "p.pstat")
    groups, total = split(tmp_path / "p.pstat", wall=total_wall(prof) + 5.0)
    assert groups.get("tb/rx_quarters.py", 0) > 0 and groups.get("golden model (model/)", 0) > 0, groups
    assert abs(groups["simulator and its C interface (no Python running)"] - 5.0 - (total_wall(prof) - total)) < 1e-6
    assert abs(sum(groups.values()) - (total_wall(prof) + 5.0)) < 1e-6


def total_wall(prof):
    import pstats
    return pstats.Stats(prof).total_tt
