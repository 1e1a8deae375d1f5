"""SEND, SEND with immediate, WRITE with immediate and RNR with the NIC as requester and
the golden responder with receive queues as its peer (tb/suites/two_sided.py), one pytest
test per cocotb test, on both simulators."""
import pytest

from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("two_sided")
# Icarus runs the smoke set (the two-sided requester against the golden responder); the
# RNR tests wait 5,000 cycles a timer, minutes on Icarus (about 50 cycles a second here)
ICARUS = ("sends_to_golden_responder",)


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, icarus=ICARUS))
def test_two_sided(sim, testcase):
    run(sim, "tb.suites.two_sided", testcase, test_dir=None)
