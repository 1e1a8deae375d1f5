"""Two-engine system regressions (tb/suites/pair.py, design ``ibgda_nic_pair``).

The lossless test runs on Icarus and on Verilator; the fault-injection matrix (5 fault
kinds x 3 rates, tens of thousands of cycles of two 1024-bit engines each) runs on
Verilator only: on Icarus (about 70 cycles/s for two engines) it alone would take over
an hour, and the RTL it exercises is the same.
"""
import pytest

from rtl.build import PAIR_TOP_NAME
from tb.suites import fault_matrix
from tb.runner import SIMULATORS, cocotb_tests, run

COCOTB_TESTS = cocotb_tests("pair")


@pytest.mark.parametrize("testcase", COCOTB_TESTS)
@pytest.mark.parametrize("sim", SIMULATORS)
def test_pair(sim, testcase):
    run(sim, "tb.suites.pair", testcase, test_dir=None, top=PAIR_TOP_NAME)


@pytest.mark.parametrize("testcase", fault_matrix.NAMES)
def test_pair_faults(testcase):
    run("verilator", "tb.suites.pair", testcase, test_dir=None, top=PAIR_TOP_NAME)
