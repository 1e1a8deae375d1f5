"""Test order and the simulation builds of ``make test``."""
import os

from tb.runner import designs_for, prebuild


def pytest_sessionstart(session):
    """Build every simulation model the selected system tests need before they start,
    two at a time, each announced in one line (the tools' output goes to build logs).
    Runs once, in the process that runs or distributes the tests; set IBGDA_PREBUILD=0
    to leave the builds to the first test of each design."""
    if hasattr(session.config, "workerinput") or os.environ.get("IBGDA_PREBUILD") == "0":
        return
    designs = designs_for(session.config.args)
    if designs:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        say = (lambda msg: reporter.write_line(msg)) if reporter else None
        prebuild(designs, jobs=int(os.environ.get("IBGDA_BUILD_JOBS", "2")), say=say)



# The three Verilator builds (single NIC: about 4 minutes; pair and quad, whose engine
# tb/runner.py compiles once as a hier_block: about 2 each) first, so that no worker
# waits on another's build: the Makefile runs pytest-xdist with --maxschedchunk=1, which
# deals each of the two workers two tests and then hands out one test at a time from
# one queue in this order. Worker A gets the single-NIC build and the Icarus switch run,
# worker B the pair and quad builds; then every other simulator test (its design built
# by then), then the short block tests.
FIRST = ["test_nic[verilator-single_pointer_write", "test_switch[icarus-all_to_all]",
         "test_pair[verilator-rc_writes", "test_switch[verilator-all_to_all]",
         "test_switch[", "test_pair[icarus-rc_writes", "test_rc[icarus-rx_every",
         "test_pair[", "test_pair_faults[", "test_rc[", "test_bench_small", "test_nic[", "test_default_scenario"]


def pytest_collection_modifyitems(session, config, items):
    """Order the tests by ``FIRST`` (first matching pattern), the rest as collected."""
    def rank(item):
        return next((k for k, pat in enumerate(FIRST) if pat in item.nodeid), len(FIRST))
    items.sort(key=rank)            # stable: collection order within a rank
