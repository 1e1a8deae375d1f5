"""Four engines through a switch model (tb/suites/switch.py, design ``ibgda_nic_quad``):
all-to-all RC WRITEs, lossless on Icarus (2 WRITEs a QP) and on Verilator (4), with every fault
kind on Verilator only (on Icarus the faulty run took 200 s of the regression's budget)."""
import pytest

from rtl.build import QUAD_TOP_NAME
from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("switch")


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, ("all_to_all_faults",)))
def test_switch(sim, testcase):
    run(sim, "tb.suites.switch", testcase, test_dir=None, top=QUAD_TOP_NAME)
