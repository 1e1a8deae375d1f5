"""System regressions (tb/suites/nic.py) on Icarus and on Verilator, one pytest test per cocotb test.

The design is generated and compiled once per simulator (build/sim_<sim>/) and reused.
A missing simulator fails the run with a message saying how to install it.
"""
import pytest

from tb.runner import SIMULATORS, cocotb_tests, run

COCOTB_TESTS = cocotb_tests("nic")


@pytest.mark.parametrize("testcase", COCOTB_TESTS)
@pytest.mark.parametrize("sim", SIMULATORS)
def test_nic(sim, testcase):
    run(sim, "tb.suites.nic", testcase, test_dir=None)
