"""SEND, SEND with immediate, WRITE with immediate and RNR with the NIC as requester and
the golden responder with receive queues as its peer (tb/suites/two_sided.py), one pytest
test per cocotb test, on both simulators. The fault matrix (every fault kind at 0.1, 1 and
5% both ways, ``fault_matrix.cases``): every cell on Verilator; ``make faults``: every
cell on both (8-27 s a cell on Icarus: the 12-minute budget of ``make test`` has no room
for them)."""
import pytest

from tb.suites import fault_matrix
from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("two_sided")
# Icarus runs the smoke set (the two-sided requester against the golden responder); the
# RNR tests wait 5,000 cycles a timer, minutes on Icarus (about 50 cycles a second here)
ICARUS = ("sends_to_golden_responder",)


@pytest.mark.parametrize("sim,testcase", sim_cases([t for t in COCOTB_TESTS if t not in fault_matrix.NAMES],
                                                    icarus=ICARUS))
def test_two_sided(sim, testcase):
    run(sim, "tb.suites.two_sided", testcase, test_dir=None)


@pytest.mark.parametrize("sim,testcase", fault_matrix.cases())
def test_two_sided_faults(sim, testcase):
    run(sim, "tb.suites.two_sided", testcase, test_dir=None)
