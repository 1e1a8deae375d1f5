"""Self-test of the cocotb testbench models (tb/) on a port-only Verilog top, no NIC RTL."""

import shutil
import subprocess
from pathlib import Path

import pytest
from cocotb_tools.runner import get_runner

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "tb_selftest"
TOP = "tb_selftest_top"



@pytest.fixture(scope="module")
def selftest_run():
    runner = get_runner("icarus")
    runner.build(sources=[ROOT / "tb" / "selftest" / f"{TOP}.v"], hdl_toplevel=TOP, build_dir=BUILD,
                 timescale=("1ns", "1ps"), always=True)
    runner.test(hdl_toplevel=TOP, test_module="tb.selftest.test_models", build_dir=BUILD, test_dir=BUILD)
    return BUILD


def test_tb_models(selftest_run):
    assert (selftest_run / "wire.pcap").exists()


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")
def test_pcap_tshark(selftest_run):
    """tshark reads the nanosecond pcap with the expected timestamps and lengths."""
    out = subprocess.run(["tshark", "-r", str(selftest_run / "wire.pcap"), "-T", "fields",
                          "-e", "frame.time_epoch", "-e", "frame.len", "-e", "udp.dstport"],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    rows = [line.split("\t") for line in out if line.strip()]
    expected = [line.split() for line in (selftest_run / "wire.expected").read_text().splitlines()]
    assert len(rows) == len(expected) > 0
    for (ts, length, dport), (ns, elen) in zip(rows, expected):
        sec, _, frac = ts.partition(".")
        assert int(sec) * 10**9 + int(frac.ljust(9, "0")[:9]) == int(ns)
        assert int(length) == int(elen) and dport == "4791"
