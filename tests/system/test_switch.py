"""Four engines through a switch model (tb/suites/switch.py, design ``ibgda_nic_quad``):
all-to-all RC WRITEs, lossless and with every fault kind, on Verilator only: four 1024-bit
engines run at about 35 cycles a second on Icarus (the lossless run took 82 s of the
regression's budget there, the faulty one 200 s); the two-engine tests run on both."""
import pytest

from rtl.build import QUAD_TOP_NAME
from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("switch")


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, icarus=()))
def test_switch(sim, testcase):
    run(sim, "tb.suites.switch", testcase, test_dir=None, top=QUAD_TOP_NAME)
