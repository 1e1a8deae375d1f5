"""Two-engine system regressions (tb/suites/pair.py, design ``ibgda_nic_pair``).

Every test runs on Verilator, a smoke set on Icarus (``ICARUS``). The fault matrix (5
kinds x 3 rates, 13,000 to 50,000 cycles of two 1024-bit engines each,
``fault_matrix.cases``) runs on Verilator in ``make test``; ``make faults`` runs it on
both simulators (on Icarus, about 340 cycles/s for two engines, 50 s to 190 s a cell).
"""
import pytest

from rtl.build import PAIR_TOP_NAME
from tb.suites import fault_matrix
from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("pair")
# Icarus (about 70 cycles a second for two engines) runs the smoke set: every atomic form
# among WRITEs between two engines, with their ACKs and atomic ACKs
# (every two-engine test there took 30-65 s of the 12-minute budget); the single-engine
# suites take the local-error flush, the responder's errors and the gather lists through
# Icarus. Verilator runs every test.
ICARUS = ("rc_atomics_back_to_back",)


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, icarus=ICARUS))
def test_pair(sim, testcase):
    run(sim, "tb.suites.pair", testcase, test_dir=None, top=PAIR_TOP_NAME)


@pytest.mark.parametrize("sim,testcase", fault_matrix.cases())
def test_pair_faults(sim, testcase):
    run(sim, "tb.suites.pair", testcase, test_dir=None, top=PAIR_TOP_NAME)
