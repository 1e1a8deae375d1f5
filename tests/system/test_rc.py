"""Receive-side system regressions (tb/suites/rc.py) on Icarus and on Verilator, one pytest test per cocotb test."""
import pytest

from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("rc")
VERILATOR_ONLY = ("duplicate_flood", "duplicate_flood_while_sending")     # floods of 1,500+ frames


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, VERILATOR_ONLY))
def test_rc(sim, testcase):
    run(sim, "tb.suites.rc", testcase, test_dir=None)
