import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:       # `spec` and the tests' helpers import from the checkout
    sys.path.insert(0, str(ROOT))


# Longest simulator builds first (the Makefile runs pytest-xdist with --maxschedchunk=1,
# so tests leave one shared queue in this order): each of the two workers starts on a
# different build, and the short tests fill in behind instead of a build at the end.
# Each worker is first dealt two tests: the first two go to one, the next two to the other.
FIRST = ["test_pair[verilator-rc_writes", "test_pair[verilator-rc_access", "test_pair[icarus-rc_writes",
         "test_switch[icarus-all_to_all]", "test_switch[verilator-all_to_all]", "test_pair[", "test_switch[",
         "test_pair_faults[", "test_nic[verilator-", "test_nic[icarus-"]


def pytest_collection_modifyitems(session, config, items):
    """Order the tests by ``FIRST`` (first matching pattern), the rest as collected."""
    def rank(item):
        return next((k for k, pat in enumerate(FIRST) if pat in item.nodeid), len(FIRST))
    items.sort(key=rank)            # stable: collection order within a rank
