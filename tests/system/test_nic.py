"""System regressions (tb/suites/nic.py) on Icarus and on Verilator, one pytest test per cocotb test.

The design is generated and compiled once per simulator (build/sim_<sim>/) and reused.
A missing simulator fails the run with a message saying how to install it.
"""
import pytest

from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("nic")
# Icarus (a hundred times slower) runs the smoke set: a WQE of every form the parser
# takes (pointer, inline, SEND/_IMM, WRITE_IMM, gather), multi-packet messages, the
# local-error flush and the doorbell checks; Verilator runs every test (weighted_share's
# 6,272 WQEs took Icarus 200 s, byte_bound_turns 121 s of the 12-minute budget).
ICARUS = ("single_pointer_write", "multi_packet_writes", "sends_and_write_imm", "gather_lists",
          "nop_and_error_wqes", "bad_doorbells")


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, icarus=ICARUS))
def test_nic(sim, testcase):
    run(sim, "tb.suites.nic", testcase, test_dir=None)
