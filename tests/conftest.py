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



# Longest tests first, so that neither pytest-xdist worker is left with a long one at
# the end: the Makefile runs pytest-xdist with --maxschedchunk=1, which deals each worker
# two tests and then hands out one test at a time from one queue in this order (the
# builds are done by then, in pytest_sessionstart). The Icarus system runs are the longest
# (weighted_share about 400 s, back_to_back_stream 330 s on a loaded machine).
FIRST = ["test_nic[icarus-weighted_share", "test_nic[icarus-back_to_back_stream", "test_default_scenario[icarus",
         "test_rc[icarus-rx_every", "test_switch[icarus", "test_bench_small", "test_pair[icarus", "test_nic[icarus",
         "test_pair[", "test_pair_faults[", "test_switch[", "test_rc[", "test_nic[", "test_default_scenario"]


def pytest_collection_modifyitems(session, config, items):
    """Order the tests by ``FIRST`` (first matching pattern), the rest as collected."""
    def rank(item):
        return next((k for k, pat in enumerate(FIRST) if pat in item.nodeid), len(FIRST))
    items.sort(key=rank)            # stable: collection order within a rank
