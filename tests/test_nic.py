"""System regressions (tb/test_nic.py) on Icarus and on Verilator, one pytest test per cocotb test.

The design is generated and compiled once per simulator (build/sim_<sim>/) and reused.
A missing simulator fails the run with a message saying how to install it.
"""
import re
from pathlib import Path

import pytest

from tests.sim import SIMULATORS, run

COCOTB_TESTS = re.findall(r"@cocotb\.test\(\)\nasync def (\w+)",
                          (Path(__file__).resolve().parents[1] / "tb" / "test_nic.py").read_text())
assert COCOTB_TESTS, "no cocotb tests found in tb/test_nic.py"


@pytest.mark.parametrize("testcase", COCOTB_TESTS)
@pytest.mark.parametrize("sim", SIMULATORS)
def test_nic(sim, testcase):
    run(sim, "tb.test_nic", testcase, test_dir=None)
