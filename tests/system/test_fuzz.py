"""A few thousand of the fuzzer's inputs (tb/suites/fuzz.py) on Verilator in every regression;
`make fuzz` runs 100,000 and more. Icarus is too slow for it (about 50 cycles a second)."""
import pytest

from tb.runner import cocotb_tests, run

COCOTB_TESTS = cocotb_tests("fuzz")
# inputs per class in the regression (make fuzz: scripts/run_fuzz.py)
COUNTS = {"receive": 3000, "responses": 1500, "wqes": 200, "doorbells": 300}


@pytest.mark.parametrize("testcase", COCOTB_TESTS)
def test_fuzz(testcase, tmp_path):
    cls = testcase.removeprefix("fuzz_")
    run("verilator", "tb.suites.fuzz", testcase, test_dir=None,
        extra_env={"FUZZ_SEED": "7", f"FUZZ_{cls.upper()}": str(COUNTS[cls]), "FUZZ_REPORT": str(tmp_path)})
