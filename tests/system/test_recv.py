"""Two-sided verbs at the NIC's responder (tb/suites/recv.py) on Icarus and on Verilator, one pytest test per cocotb test."""
import pytest

from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("recv")


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS))
def test_recv(sim, testcase):
    run(sim, "tb.suites.recv", testcase, test_dir=None)
