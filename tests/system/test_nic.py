"""System regressions (tb/suites/nic.py) on Icarus and on Verilator, one pytest test per cocotb test.

The design is generated and compiled once per simulator (build/sim_<sim>/) and reused.
A missing simulator fails the run with a message saying how to install it.
"""
import pytest

from tb.runner import cocotb_tests, run, sim_cases

COCOTB_TESTS = cocotb_tests("nic")
# 131 QPs each: Verilator only (the edges of the same checks run on Icarus in bad_doorbells
# and nop_and_error_wqes); weighted_share's 6,272 WQEs took Icarus 200 s of the budget;
# back_to_back_stream (32 s on Icarus) and many_qps (17 s): the same transmit path as the
# other Icarus tests, at lengths that only cost time there
VERILATOR_ONLY = ("wqe_sizes", "stale_and_over_depth_doorbells", "weighted_share", "back_to_back_stream",
                  "many_qps", "byte_bound_turns")     # (on Icarus 95-121 s of make test, the longest item)


@pytest.mark.parametrize("sim,testcase", sim_cases(COCOTB_TESTS, VERILATOR_ONLY))
def test_nic(sim, testcase):
    run(sim, "tb.suites.nic", testcase, test_dir=None)
