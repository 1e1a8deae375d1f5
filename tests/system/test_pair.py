"""Two-engine system regressions (tb/suites/pair.py, design ``ibgda_nic_pair``).

The lossless tests run on Icarus and on Verilator; the fault tests (``rc_fault_pattern``,
``rc_long_inline_resume``, ``rc_local_error_flush`` and the matrix) on Verilator only. The
matrix (5 fault kinds x 3 rates, tens of thousands of cycles of two 1024-bit engines each)
would alone take over an hour on Icarus (about 70 cycles/s for two engines), and the RTL it
exercises is the same.
"""
import pytest

from rtl.build import PAIR_TOP_NAME
from tb.suites import fault_matrix
from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("pair")
# Icarus would take 65, 17 and 14 s; the single-engine suite covers the local-error flush
# (nop_and_error_wqes) and long inline WRITEs (long_inline_writes) on Icarus.
VERILATOR_ONLY = ("rc_fault_pattern", "rc_long_inline_resume", "rc_local_error_flush")


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, VERILATOR_ONLY))
def test_pair(sim, testcase):
    run(sim, "tb.suites.pair", testcase, test_dir=None, top=PAIR_TOP_NAME)


@pytest.mark.parametrize("testcase", fault_matrix.NAMES)
def test_pair_faults(testcase):
    run("verilator", "tb.suites.pair", testcase, test_dir=None, top=PAIR_TOP_NAME)
