"""READ and atomics with the NIC as requester and the golden responder as its peer
(tb/suites/remote.py), one pytest test per cocotb test, on both simulators."""
import pytest

from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("remote")
# Icarus runs the smoke set (every atomic form from the requester); Verilator every test.
ICARUS = ("atomics_every_form",)


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, icarus=ICARUS))
def test_remote(sim, testcase):
    run(sim, "tb.suites.remote", testcase, test_dir=None)
