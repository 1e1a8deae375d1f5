"""READ and atomics with the NIC as responder, the golden responder as its model
(tb/suites/remote_responder.py), one pytest test per cocotb test, on both simulators."""
import pytest

from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("remote_responder")
VERILATOR_ONLY = ()


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, VERILATOR_ONLY))
def test_remote_responder(sim, testcase):
    run(sim, "tb.suites.remote_responder", testcase, test_dir=None)
