"""The RTL engine (Verilator, the single-engine top) against Linux Soft-RoCE (rdma_rxe) in a
qemu guest: tb/suites/interop_drops.py (the bridge drops chosen frames
both ways: both sides retransmit, nothing lost or applied twice), one pytest test per cocotb test.

The cocotb suite runs once for the module (one simulation, one guest boot); each pytest
test reports its cocotb test's outcome. The run's folder (pcap and frame log of each test,
the guest's console, the simulation's output) is build/sim_verilator/runs/interop_drops/. When the
guest cannot start every test FAILS with the reason (never skips).
"""
import fcntl
import os
import time
import xml.etree.ElementTree as ET

import pytest

from rtl.build import TOP_NAME
from tb.runner import build, build_dir, cocotb_tests

COCOTB_TESTS = cocotb_tests("interop_drops")
RUN_DIR = build_dir("verilator") / "runs" / "interop_drops"


def _run_suite(xml, log):
    runner, bdir = build("verilator")
    for old in [xml, log, *RUN_DIR.glob("*.pcap"), *RUN_DIR.glob("*.log")]:
        old.unlink(missing_ok=True)            # nothing of an earlier run is taken for this one's
    try:
        runner.test(hdl_toplevel=TOP_NAME, test_module="tb.suites.interop_drops", build_dir=bdir, test_dir=RUN_DIR,
                    extra_env={"IBGDA_INTEROP_OUT": str(RUN_DIR)}, results_xml=str(xml), log_file=log)
    except SystemExit:
        pass                                   # (failures: reported test by test below)


@pytest.fixture(scope="module")
def suite():
    """Run the suite once per pytest run. Under pytest-xdist (make test) the tests of this
    module may go to both workers: the first to take the lock runs the simulation, the
    other waits for it and reads the same results (one guest, one simulation)."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    xml, log, stamp = RUN_DIR / "results.xml", RUN_DIR / "sim.log", RUN_DIR / ".session"
    session = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid-{os.getpid()}-{time.time_ns()}"
    with open(RUN_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (stamp.exists() and stamp.read_text() == session and xml.exists()):
            stamp.unlink(missing_ok=True)
            _run_suite(xml, log)
            stamp.write_text(session)
    out = {"log": log, "cases": {}}
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            bad = case.find("failure")
            if bad is None:
                bad = case.find("error")
            out["cases"][case.get("name")] = None if bad is None else (bad.get("message") or "") + "\n" + (bad.text or "")
    return out


def _tail(path, n=60):
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"({path} missing)"


@pytest.mark.parametrize("testcase", COCOTB_TESTS)
def test_engine_rxe_drops(suite, testcase):
    cases = suite["cases"]
    if testcase not in cases:
        pytest.fail(f"{testcase}: no result (the simulation ended abnormally); the end of {suite['log']}:\n"
                    f"{_tail(suite['log'])}", pytrace=False)
    if cases[testcase] is not None:
        pytest.fail(f"{testcase} failed: {cases[testcase]}\n(frames: {RUN_DIR / (testcase + '.log')}, "
                    f"{RUN_DIR / (testcase + '.pcap')}; simulation output: {suite['log']})", pytrace=False)
