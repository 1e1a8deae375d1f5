"""READ and atomics with the NIC as requester and the golden responder as its peer
(tb/suites/remote.py), one pytest test per cocotb test, on both simulators."""
import pytest

from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("remote")
VERILATOR_ONLY = ("fetch_add_counts_exactly_once", "atomic_ack_lost")


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, VERILATOR_ONLY))
def test_remote(sim, testcase):
    run(sim, "tb.suites.remote", testcase, test_dir=None)
