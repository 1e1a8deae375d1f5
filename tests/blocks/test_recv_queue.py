"""RecvQueue (rtl/responder/recv_queue.py): receive queues in GPU memory.

The cocotb testbench is tb/recv_queue_bench.py (its docstring: the reference and the
memory model). Here the two-instance top ``recv_queue_pair`` (``a``: prefetch depth 32, a pool of 128,
``b``: depth 0, no prefetch; 8 QPs, max_sge 4) is elaborated once (kept while its sources
are unchanged) and compiled once per simulator, then each cocotb test runs on Icarus and
on Verilator, except the 66,000-WQE counter wrap (Verilator only: about 150,000 cycles).
The argument checks run in this process.
"""
import fcntl
import hashlib
import shutil
from pathlib import Path

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from rtl.build import flavour_path, to_verilog
from rtl.responder.recv_queue import RecvQueue
from tb.runner import ROOT, require, sim_source

TOP = "recv_queue_pair"
CONFIGS = {"a": dict(num_qps=8, max_sge=4, depth=32, pool=128, max_reads=512),
           "b": dict(num_qps=8, max_sge=4, depth=0, pool=32, max_reads=512)}
TESTS = ["random_traffic", "post_seen_by_later_query", "rnr_flood_answered_at_once", "fresh_qps_overlap", "reset_mid_life", "throughput", "counter_wrap"]
VERILATOR_ONLY = {"counter_wrap"}
SOURCES = ["rtl/build.py", "rtl/responder/recv_queue.py", "rtl/common/axi.py", "rtl/common/stream.py", "rtl/common/contexts.py",
           "spec/formats.py", "spec/params.py", "tests/blocks/test_recv_queue.py"]


class RecvQueuePair(wiring.Component):
    """Two RecvQueues side by side (ports ``a__*``, ``b__*``): one simulator build for both."""
    def __init__(self):
        super().__init__({name: Out(RecvQueue(**cfg).signature) for name, cfg in CONFIGS.items()})

    def elaborate(self, platform):
        m = Module()
        for name, cfg in CONFIGS.items():
            m.submodules[name] = dut = RecvQueue(**cfg)
            wiring.connect(m, wiring.flipped(getattr(self, name)), dut)
        return m


def _verilog(sim):
    """The pair's Verilog for ``sim`` (rtl/build.py's flavours: Verilator's with each reset
    in its flip-flop)."""
    out = ROOT / "build" / "rtl" / TOP
    out.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(b"".join((ROOT / s).read_bytes() for s in SOURCES)).hexdigest()
    path, stamp = out / f"{TOP}.v", out / ".source-hash"
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path.exists() and stamp.exists() and stamp.read_text() == digest):
            for flavour, text in to_verilog(RecvQueuePair(), TOP).items():
                flavour_path(path, flavour).write_text(text)
            stamp.write_text(digest)
    return flavour_path(path, "_sdff") if sim == "verilator" else path


def _build(sim):
    from cocotb_tools.runner import get_runner
    require(sim)
    bdir = ROOT / "build" / f"sim_{sim}_{TOP}"
    bdir.mkdir(parents=True, exist_ok=True)
    with open(bdir.parent / f".{bdir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        source = sim_source(_verilog(sim), sim, top=TOP if sim == "verilator" else None)
        args = (["-Wno-fatal", "-Wno-WIDTH", "-Wno-UNOPTFLAT", "-O1", "--x-assign", "fast", "--x-initial", "fast"]
                if sim == "verilator" else [])
        key = hashlib.sha256(source.read_bytes() + repr((sim, args)).encode()).hexdigest()
        stamp = bdir / ".build-hash"
        target = bdir / (TOP if sim == "verilator" else "sim.vvp")
        fresh = stamp.exists() and stamp.read_text() == key and target.exists()
        runner = get_runner(sim)
        runner.build(sources=[source], hdl_toplevel=TOP, build_dir=bdir, build_args=args,
                     timescale=("1ns", "1ps"), always=not fresh, log_file=bdir / "build.log")
        stamp.write_text(key)
    return runner, bdir


@pytest.mark.parametrize("sim,test", [(s, t) for s in ("icarus", "verilator") for t in TESTS
                                      if s == "verilator" or t not in VERILATOR_ONLY])
def test_recv_queue(sim, test):
    runner, bdir = _build(sim)
    runner.test(hdl_toplevel=TOP, test_module="tb.recv_queue_bench", testcase=test, build_dir=bdir,
                test_dir=bdir / "runs" / test, log_file=bdir / "runs" / f"{test}.log")


@pytest.mark.parametrize("kwargs,error", [
    (dict(num_qps=6), "num_qps"), (dict(num_qps=8, max_sge=0), "max_sge"), (dict(num_qps=8, max_sge=8), "max_sge"),
    (dict(num_qps=8, depth=3), "depth"), (dict(num_qps=8, depth=1024), "depth"),
    (dict(num_qps=8, pool=16), "pool"), (dict(num_qps=8, pool=96), "pool"),
    (dict(num_qps=8, data_width=512), "data_width"), (dict(num_qps=8, max_reads=100), "max_reads"),
    (dict(num_qps=8, axi_id=16), "axi_id")])
def test_recv_queue_arguments(kwargs, error):
    with pytest.raises(ValueError, match=error):
        RecvQueue(**kwargs)
