"""The RTL engine (Verilator, the single-engine top) against Linux Soft-RoCE (rdma_rxe) in a
qemu guest at path MTU 1024 and 4096: tb/suites/interop_mtu.py, one pytest test per cocotb
test (tests/interop/harness.py: one simulation and one guest boot for the module; when the
guest cannot start every test FAILS with the reason, never skips).

Part of the full interop suite only (``make interop``, IBGDA_INTEROP_FULL=1:
tests/interop/conftest.py); ``make test`` runs its short form, tb/suites/interop.py's
``mtu4096_both_ways``."""
import pytest

from tb.runner import cocotb_tests
from tests.interop.harness import check, run_once

MODULE = "interop_mtu"


@pytest.fixture(scope="module")
def suite():
    return run_once(MODULE)


@pytest.mark.parametrize("testcase", cocotb_tests(MODULE))
def test_engine_rxe_mtu(suite, testcase):
    check(suite, MODULE, testcase)
