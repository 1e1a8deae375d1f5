"""Test order and the simulation builds of ``make test``."""
import os

from tb.runner import BackgroundBuild, designs_for, prebuild

_background = None


def pytest_sessionstart(session):
    """Build the simulation models the selected system tests need, each announced in one
    line (the tools' output goes to build logs): the Icarus ones (seconds) before any
    test starts, the Verilator ones (about a minute each) in the background while the
    block, model and Icarus tests run (the Verilator tests come last: ``rank``). Runs
    once, in the process that runs or distributes the tests; set IBGDA_PREBUILD=0 to
    leave the builds to the first test of each design."""
    global _background
    if hasattr(session.config, "workerinput") or os.environ.get("IBGDA_PREBUILD") == "0":
        return
    designs = designs_for(session.config.args)
    if designs:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        say = (lambda msg: reporter.write_line(msg)) if reporter else None
        jobs = int(os.environ.get("IBGDA_BUILD_JOBS", "2"))
        prebuild([d for d in designs if d[0] == "icarus"], jobs=jobs, say=say)
        later = [d for d in designs if d[0] == "verilator"]
        if later:
            _background = BackgroundBuild(later, jobs=jobs, say=say)


def pytest_sessionfinish(session):
    if _background is not None:
        _background.wait()


# Longest tests first, so that neither pytest-xdist worker is left with a long one at
# the end: the Makefile runs pytest-xdist with --maxschedchunk=1, which deals each worker
# two tests and then hands out one test at a time from one queue in this order. The
# Verilator tests come after all others, so that their models build meanwhile
# (pytest_sessionstart).
FIRST = ["test_pair[icarus-rc_atomics", "test_pair[icarus-rc_reads", "test_default_scenario[icarus",
         "test_pair[icarus", "test_nic[icarus", "test_rc[icarus", "tests/blocks"]
VERILATOR = ["test_bench_small", "test_switch[verilator-all_to_all_faults", "test_hardening[verilator-control",
             "test_nic[verilator-weighted_share", "test_fuzz[fuzz_wqes", "test_pair_faults[verilator",
             "test_two_sided_faults[verilator", "test_switch[verilator",
             "test_rc[verilator-rx_every", "test_fuzz", "[verilator-"]


def rank(nodeid):
    """Position of a test in the queue: the Verilator tests after the rest, each group
    in the order of its pattern list (first matching pattern), then collection order."""
    late = any(pat in nodeid for pat in VERILATOR)
    patterns = VERILATOR if late else FIRST
    return late, next((k for k, pat in enumerate(patterns) if pat in nodeid), len(patterns))


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: rank(item.nodeid))       # stable: collection order within a rank
