"""SEND, SEND with immediate, WRITE with immediate and RNR with the NIC as requester and
the golden responder with receive queues as its peer (tb/suites/two_sided.py), one pytest
test per cocotb test, on both simulators."""
import pytest

from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("two_sided")
# the RNR waits run 5,000 cycles each: on Icarus (about 50 cycles a second here) only the
# single wait of rnr_retry_exceeded's edges would fit the budget
VERILATOR_ONLY = ("rnr_wait_then_receive", "rnr_retry_forever", "rnr_retry_exceeded")


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, VERILATOR_ONLY))
def test_two_sided(sim, testcase):
    run(sim, "tb.suites.two_sided", testcase, test_dir=None)
