"""The pytest side of the engine-against-rxe suites (tb/suites/interop*.py): a suite runs
once for its module (one simulation, one guest boot), each pytest test reports its cocotb
test's outcome. A suite's run folder (pcap and frame log of each test, the guest's
console, the simulation's output) is build/sim_verilator/runs/<suite>/."""
import fcntl
import os
import time
import xml.etree.ElementTree as ET

import pytest

from rtl.build import TOP_NAME
from tb.runner import build, build_dir, cocotb_libs


def _run_suite(module, run_dir, xml, log):
    runner, bdir = build("verilator")
    for old in [xml, log, *run_dir.glob("*.pcap"), *run_dir.glob("*.log")]:
        old.unlink(missing_ok=True)            # nothing of an earlier run is taken for this one's
    try:
        runner.test(hdl_toplevel=TOP_NAME, hdl_toplevel_lang="verilog", test_module=f"tb.suites.{module}", build_dir=bdir, test_dir=run_dir,
                    extra_env={"IBGDA_INTEROP_OUT": str(run_dir), "LD_LIBRARY_PATH": cocotb_libs(),
                               "IBGDA_INPUTS": str(bdir / "inputs.json")}, results_xml=str(xml), log_file=log)
    except SystemExit:
        pass                                   # (failures: reported test by test below)


def run_once(module):
    """Run the suite once per pytest run. Under pytest-xdist (make test) the tests of this
    module may go to both workers: the first to take the lock runs the simulation, the
    other waits for it and reads the same results (one guest, one simulation)."""
    run_dir = run_dir_of(module)
    run_dir.mkdir(parents=True, exist_ok=True)
    xml, log, stamp = run_dir / "results.xml", run_dir / "sim.log", run_dir / ".session"
    session = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid-{os.getpid()}-{time.time_ns()}"
    with open(run_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (stamp.exists() and stamp.read_text() == session and xml.exists()):
            stamp.unlink(missing_ok=True)
            _run_suite(module, run_dir, xml, log)
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


def run_dir_of(module):
    return build_dir("verilator") / "runs" / module


def check(suite, module, testcase):
    """Fail ``testcase`` with its cocotb failure and where its frames are."""
    run_dir = run_dir_of(module)
    cases = suite["cases"]
    if testcase not in cases:
        pytest.fail(f"{testcase}: no result (the simulation ended abnormally); the end of {suite['log']}:\n"
                    f"{_tail(suite['log'])}", pytrace=False)
    if cases[testcase] is not None:
        pytest.fail(f"{testcase} failed: {cases[testcase]}\n(frames: {run_dir / (testcase + '.log')}, "
                    f"{run_dir / (testcase + '.pcap')}; simulation output: {suite['log']})", pytrace=False)
