

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
