"""Two-engine system regressions (tb/test_pair.py, design ``ibgda_nic_pair``) on Icarus and Verilator."""
import re
from pathlib import Path

import pytest

from rtl.build import PAIR_TOP_NAME
from tests.sim import SIMULATORS, run

COCOTB_TESTS = re.findall(r"@cocotb\.test\(\)\nasync def (\w+)",
                          (Path(__file__).resolve().parents[1] / "tb" / "test_pair.py").read_text())
assert COCOTB_TESTS, "no cocotb tests found in tb/test_pair.py"


@pytest.mark.parametrize("testcase", COCOTB_TESTS)
@pytest.mark.parametrize("sim", SIMULATORS)
def test_pair(sim, testcase):
    run(sim, "tb.test_pair", testcase, test_dir=None, top=PAIR_TOP_NAME)
