"""Short and full interop suites. ``make test`` (plain pytest) collects the short one:
test_guest.py, test_engine_rxe.py (which includes ``mtu4096_both_ways``, the short form of
the MTU matrix) and test_engine_rxe_drops.py. ``make interop`` (scripts/run_interop.py)
sets IBGDA_INTEROP_FULL=1 and so also collects the files in FULL_ONLY: the path-MTU matrix
at 1024 and 4096 (test_engine_rxe_mtu.py: one more simulation and guest boot)."""
import os

FULL_ONLY = ["test_engine_rxe_mtu.py"]


def full():
    return os.environ.get("IBGDA_INTEROP_FULL", "") not in ("", "0")


collect_ignore = [] if full() else FULL_ONLY
