"""Two-engine system regressions (tb/suites/pair.py, design ``ibgda_nic_pair``).

The lossless tests run on Icarus and on Verilator; the fault and error tests
(``rc_fault_pattern``, ``rc_long_inline_resume``, ``rc_local_error_flush``,
``rc_access_errors`` and the matrix) on Verilator only. The
matrix (5 fault kinds x 3 rates, tens of thousands of cycles of two 1024-bit engines each)
would alone take over an hour on Icarus (about 70 cycles/s for two engines), and the RTL it
exercises is the same.
"""
import pytest

from rtl.build import PAIR_TOP_NAME
from tb.suites import fault_matrix
from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("pair")
# On Icarus these take 65, 17, 14 and 65 s of the regression's budget (on a machine where
# make test takes 12 minutes), and the WRITE streams (rc_writes_back_to_back,
# rc_unsignaled_tail, rc_signal_every_wqe) 43, 32 and 43 s; the single-engine suites cover
# the local-error flush (nop_and_error_wqes), long inline WRITEs (long_inline_writes) and
# the responder's access errors (tb/suites/rc.py) on Icarus, and rc_reads_back_to_back,
# rc_atomics_back_to_back (WRITEs among the READs and atomics) and rc_modify_to_error run
# the two engines there.
VERILATOR_ONLY = ("rc_fault_pattern", "rc_long_inline_resume", "rc_local_error_flush", "rc_access_errors",
                  "rc_atomic_access_errors", "rc_writes_back_to_back", "rc_unsignaled_tail", "rc_signal_every_wqe")


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, VERILATOR_ONLY))
def test_pair(sim, testcase):
    run(sim, "tb.suites.pair", testcase, test_dir=None, top=PAIR_TOP_NAME)


# A known failure, not hidden: with the SENDs, SEND_IMMs and WRITE_IMMs of issue 18 in the
# matrix, corrupt at 5% passes every message, receive CQE, CQE and counter check, then fails
# the last one: a 162-byte READ RESPONSE of NIC 0 (the last packet of a 2 MTU + 100 READ)
# stalls inside on the wire (a MAC underrun), a transmit-side matter of the responder's READ
# path under the extra payload fetches, not of the receive queues. Strict: when it passes
# again, the mark must go.
KNOWN_FAILING = {"faults_corrupt_0p05": "a READ RESPONSE of NIC 0 underruns under the SEND traffic "
                                        "(issue 18, docs/results.md)"}


@pytest.mark.parametrize("testcase", [pytest.param(t, marks=pytest.mark.xfail(strict=True, reason=KNOWN_FAILING[t]))
                                      if t in KNOWN_FAILING else t for t in fault_matrix.NAMES])
def test_pair_faults(testcase):
    run("verilator", "tb.suites.pair", testcase, test_dir=None, top=PAIR_TOP_NAME)
