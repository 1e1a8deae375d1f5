"""READ and atomics with the NIC as responder, the golden responder as its model
(tb/suites/remote_responder.py), one pytest test per cocotb test, on both simulators."""
import pytest

from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("remote_responder")
# Icarus runs the smoke set (the atomic unit and the READ responder); Verilator every test.
ICARUS = ("responder_atomics_every_form", "responder_reads")


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, icarus=ICARUS))
def test_remote_responder(sim, testcase):
    run(sim, "tb.suites.remote_responder", testcase, test_dir=None)
