"""Receive-side system regressions (tb/suites/rc.py) on Icarus and on Verilator, one pytest test per cocotb test."""
import pytest

from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("rc")
# floods of 1,500+ frames; every frame size (39 s on Icarus: responder_line_rate and the
# others take the receive path through Icarus)
VERILATOR_ONLY = ("duplicate_flood", "duplicate_flood_while_sending", "rx_every_frame_size")


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, VERILATOR_ONLY))
def test_rc(sim, testcase):
    run(sim, "tb.suites.rc", testcase, test_dir=None)
