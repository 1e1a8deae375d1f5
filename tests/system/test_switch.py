"""Four engines through a switch model (tb/suites/switch.py, design ``ibgda_nic_quad``):
all-to-all RC WRITEs, lossless and with every fault kind, on Icarus and on Verilator."""
import pytest

from rtl.build import QUAD_TOP_NAME
from tb.runner import SIMULATORS, cocotb_tests, run

COCOTB_TESTS = cocotb_tests("switch")


@pytest.mark.parametrize("testcase", COCOTB_TESTS)
@pytest.mark.parametrize("sim", SIMULATORS)
def test_switch(sim, testcase):
    run(sim, "tb.suites.switch", testcase, test_dir=None, top=QUAD_TOP_NAME)
