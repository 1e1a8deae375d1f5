"""Receive-side system regressions (tb/test_rc.py) on Icarus and on Verilator, one pytest test per cocotb test."""
import re
from pathlib import Path

import pytest

from tests.sim import SIMULATORS, run

COCOTB_TESTS = re.findall(r"@cocotb\.test\(\)\nasync def (\w+)",
                          (Path(__file__).resolve().parents[1] / "tb" / "test_rc.py").read_text())
assert COCOTB_TESTS, "no cocotb tests found in tb/test_rc.py"


@pytest.mark.parametrize("testcase", COCOTB_TESTS)
@pytest.mark.parametrize("sim", SIMULATORS)
def test_rc(sim, testcase):
    run(sim, "tb.test_rc", testcase, test_dir=None)
