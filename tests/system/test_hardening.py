"""What the engine takes from outside (tb/suites/hardening.py), one pytest test per cocotb
test: on Verilator (their streams would take Icarus minutes); the requests one also on Icarus."""
import pytest

from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("hardening")
VERILATOR_ONLY = ("responses_that_do_not_belong", "control_path_under_receive_flood")


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, VERILATOR_ONLY))
def test_hardening(sim, testcase):
    run(sim, "tb.suites.hardening", testcase, test_dir=None)
