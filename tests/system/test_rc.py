"""Receive-side system regressions (tb/suites/rc.py) on Icarus and on Verilator, one pytest test per cocotb test."""
import pytest

from tb.runner import SIMULATORS, cocotb_tests, run

COCOTB_TESTS = cocotb_tests("rc")


@pytest.mark.parametrize("testcase", COCOTB_TESTS)
@pytest.mark.parametrize("sim", SIMULATORS)
def test_rc(sim, testcase):
    run(sim, "tb.suites.rc", testcase, test_dir=None)
