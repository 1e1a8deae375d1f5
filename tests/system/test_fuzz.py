"""A few thousand of the fuzzer's inputs (tb/suites/fuzz.py) on Verilator in every regression;
`make fuzz` runs 100,000 and more. Icarus is too slow for it (about 50 cycles a second)."""
import json
import subprocess
import sys

import pytest

from tb.runner import ROOT, cocotb_tests, run

COCOTB_TESTS = cocotb_tests("fuzz")
# inputs per class in the regression (make fuzz: scripts/run_fuzz.py)
COUNTS = {"receive": 3000, "responses": 1500, "wqes": 200, "doorbells": 300}


@pytest.mark.parametrize("testcase", COCOTB_TESTS)
def test_fuzz(testcase, tmp_path):
    cls = testcase.removeprefix("fuzz_")
    count = {f"FUZZ_{cls.upper()}": str(COUNTS[cls])} if cls in COUNTS else {}     # (fuzz_found_cases: no count)
    run("verilator", "tb.suites.fuzz", testcase, test_dir=None,
        extra_env={"FUZZ_SEED": "7", **count, "FUZZ_REPORT": str(tmp_path)})


def test_fuzz_responder_resources(tmp_path):
    """The reduced case of `make fuzz`'s seed-1 mismatch (a READ the engine NAKed, invalid
    request, where the model answered it): READs and atomics only (FUZZ_KINDS), dense
    enough that a QP's 16 responder resources fill at line rate. The engine's NAK is
    IBTA's; the fuzzer's model knew no resource limit. Now the model holds the resources
    and a READ or atomic that would find them all held waits for the oldest one's answer
    (tb/suites/fuzz.py receive_plan, `answer_before`). Before that this failed at
    response 97 of 777."""
    run("verilator", "tb.suites.fuzz", "fuzz_receive", test_dir=tmp_path,
        extra_env={"FUZZ_SEED": "1", "FUZZ_RECEIVE": "100", "FUZZ_KINDS": "read,atomic", "FUZZ_REPORT": str(tmp_path)})
    rep = json.loads((tmp_path / "receive.json").read_text())
    assert rep["ok"] and rep["waits_for_an_answer"] > 0, rep


def test_fuzz_fails_on_a_wrong_model(tmp_path):
    """`make fuzz`'s report cannot hide a disagreement: against a deliberately wrong
    expectation (the model told one byte of GPU memory other than it is) the run exits 1,
    the table's total and the last line say FAIL and name the class, and report.json
    lists it with the command that replays it."""
    out = tmp_path / "fuzz"
    p = subprocess.run([sys.executable, "-m", "scripts.run_fuzz", "--seed", "3", "--n", "300", "--only", "receive",
                        "--wrong-model", "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    lines = p.stdout.strip().splitlines()
    assert p.returncode == 1, p.stdout + p.stderr
    total = next(line for line in lines if line.startswith("all "))
    assert total.split()[2] == "FAIL", total
    assert lines[-1].startswith("fuzz: FAILED") and "receive" in lines[-1], lines[-1]
    rep = json.loads((out / "report.json").read_text())
    assert rep["ok"] is False and rep["failed"] == ["receive"], rep
    assert "--only receive --wrong-model" in rep["replay"]["receive"]
    assert "GPU memory at" in rep["classes"][0]["error"]
