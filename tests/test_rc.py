"""Receive-side system regressions (tb/test_rc.py) on Icarus and on Verilator, one pytest test per cocotb test."""
import pytest

from tests.sim import SIMULATORS, cocotb_tests, run

COCOTB_TESTS = cocotb_tests("test_rc")


@pytest.mark.parametrize("testcase", COCOTB_TESTS)
@pytest.mark.parametrize("sim", SIMULATORS)
def test_rc(sim, testcase):
    run(sim, "tb.test_rc", testcase, test_dir=None)
