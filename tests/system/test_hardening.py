"""What the engine takes from outside (tb/suites/hardening.py) on Icarus and on Verilator, one pytest test per cocotb test."""
import pytest

from tb.runner import SIMULATORS, cocotb_tests, run

COCOTB_TESTS = cocotb_tests("hardening")


@pytest.mark.parametrize("testcase", COCOTB_TESTS)
@pytest.mark.parametrize("sim", SIMULATORS)
def test_hardening(sim, testcase):
    run(sim, "tb.suites.hardening", testcase, test_dir=None)
