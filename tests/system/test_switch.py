"""Four engines through a switch model (tb/suites/switch.py, design ``ibgda_nic_quad``):
all-to-all RC WRITEs, lossless and with every fault kind, on Verilator only: four 1024-bit
engines run at about 35 cycles a second on Icarus (the lossless run took 82 s of the
regression's budget there, the faulty one 200 s); the two-engine tests run on both."""
import pytest

from rtl.build import QUAD_TOP_NAME
from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("switch")
# A known failure, not hidden: since 614f20b (the IBTA pad and the SEND requester) the run
# with every fault kind at 2% ends with NIC 0..3 missing CQEs (it passes at 07a1c36, the
# commit before; the two-engine fault matrix passes kind by kind). Strict: when it passes
# again, the mark must go.
KNOWN_FAILING = {"all_to_all_faults": "hangs since 614f20b (all fault kinds at 2% over the switch): "
                                      "under investigation, issue 18's closing note"}


@pytest.mark.parametrize("sim,testcase", [
    pytest.param(s, t, marks=pytest.mark.xfail(strict=True, reason=KNOWN_FAILING[t])) if t in KNOWN_FAILING
    else (s, t) for s, t in sim_cases(COCOTB_TESTS, COCOTB_TESTS)])
def test_switch(sim, testcase):
    run(sim, "tb.suites.switch", testcase, test_dir=None, top=QUAD_TOP_NAME)
