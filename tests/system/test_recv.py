"""Two-sided verbs at the NIC's responder (tb/suites/recv.py) on Icarus and on Verilator, one pytest test per cocotb test."""
import pytest

from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("recv")
# Icarus runs the smoke set (a SEND scattered over a receive WQE, WRITE with immediate, the
# receive flush, short frames padded to 60 bytes); Verilator every test (send_flood_rate's
# 2,048 SENDs, RNR, length errors).
ICARUS = ("send_scatter", "write_imm", "flush", "padded_short_frames")


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, icarus=ICARUS))
def test_recv(sim, testcase):
    run(sim, "tb.suites.recv", testcase, test_dir=None)
