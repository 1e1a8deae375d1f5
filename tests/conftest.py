import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:       # `spec` and the tests' helpers import from the checkout
    sys.path.insert(0, str(ROOT))


def pytest_collection_modifyitems(session, config, items):
    """Multi-engine system tests first, Verilator and Icarus ones alternating.

    Their simulator builds are the longest (minutes each); pytest-xdist deals the first
    tests out in turn, so one worker starts on the Verilator models and the other on the
    Icarus ones, and the short tests fill in behind instead of a long build at the end."""
    def system(item):
        return "test_switch.py" in item.nodeid or "test_pair.py" in item.nodeid

    heavy = [i for i in items if system(i)]
    icarus = [i for i in heavy if "icarus" in i.nodeid]
    verilator = [i for i in heavy if "icarus" not in i.nodeid]
    front = []
    while icarus or verilator:
        for group in (verilator, icarus):
            if group:
                front.append(group.pop(0))
    items[:] = front + [i for i in items if not system(i)]
