"""What the engine takes from outside (tb/suites/hardening.py), one pytest test per cocotb
test: on Verilator (their streams would take Icarus minutes); the requests one also on Icarus."""
import pytest

from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("hardening")
# Icarus runs the smoke set (requests from outside the QP); Verilator every test.
ICARUS = ("requests_that_do_not_belong",)


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, icarus=ICARUS))
def test_hardening(sim, testcase):
    run(sim, "tb.suites.hardening", testcase, test_dir=None)
