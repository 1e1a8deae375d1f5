"""The RTL engine (Verilator, the single-engine top) against Linux Soft-RoCE (rdma_rxe) in a
qemu guest: tb/suites/interop.py, one pytest test per cocotb test (tests/interop/harness.py:
one simulation and one guest boot for the module; when the guest cannot start every test
FAILS with the reason, never skips)."""
import pytest

from tb.runner import cocotb_tests
from tests.interop.harness import check, run_once

MODULE = "interop"


@pytest.fixture(scope="module")
def suite():
    return run_once(MODULE)


@pytest.mark.parametrize("testcase", cocotb_tests(MODULE))
def test_engine_rxe(suite, testcase):
    check(suite, MODULE, testcase)
