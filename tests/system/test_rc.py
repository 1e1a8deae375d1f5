"""Receive-side system regressions (tb/suites/rc.py) on Icarus and on Verilator, one pytest test per cocotb test."""
import pytest

from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("rc")
# Icarus runs the smoke set (the responder's WRITE path with duplicates, gaps and NAKs);
# Verilator every test: floods of 1,500+ frames, every frame size, line rate, ordering.
ICARUS = ("responder_writes_with_faults",)


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, icarus=ICARUS))
def test_rc(sim, testcase):
    run(sim, "tb.suites.rc", testcase, test_dir=None)
