"""Self-test of the tb models against a port-only top (tb_selftest_top.v), no NIC RTL.

Python drives both sides: the models act as they would against the DUT, and
small stimulus drivers here play the DUT's master ports.
"""

import random
from collections import deque
from pathlib import Path

import cocotb
import pytest
from cocotb.clock import Clock
from cocotb.triggers import Combine, RisingEdge
from cocotbext.axi import AxiLiteBus, AxiLiteRam, AxiMasterWrite, AxiRamWrite, AxiWriteBus
from cocotbext.axi.sparse_memory import SparseMemory as AxiSparseMemory

from spec.formats import CQE64, CTRL_SEG, DATA_SEG, RADDR_SEG, CqeOp, WqeOp, pack, unpack
from spec.params import NUM_CQS, NUM_QPS, wire_bytes
from tb.clock import ClockCycles, CycleCounter
from spec.csr import ADDR, CHECK_COUNTERS, ID_VALUE, REQ_COUNTERS, RX_COUNTERS, TX_COUNTERS
from tb.control import NicControl
from tb.gpu import GpuModel, be32
from tb.memory import DmaMemory
from tb.wire import Wire400G

BUS = 128
async def setup(dut):
    Clock(dut.clk, 2, unit="ns").start()
    counter = CycleCounter(dut.clk)
    for sig in dut:                     # no X/Z anywhere: every port is an input of the top
        if sig._name != "clk":
            sig.value = 0
    dut.rst.value = 1
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await RisingEdge(dut.clk)
    return counter


# ---- stimulus: AXI read master -----------------------------------------------------
class ReadMaster:
    """Issues queued ARs (one per cycle, not before their ``at`` cycle) and collects R beats.

    ``ready(cycle) -> bool`` gives rready per cycle. Checks R stays stable while stalled.
    """

    def __init__(self, dut, counter, ready=lambda cycle: True):
        self.dut, self.counter, self.ready = dut, counter, ready
        self.pending = deque()          # (at, id, addr, len, size_log2)
        self.issued = []                # (cycle, id, addr, len, size_log2)
        self.beats = []                 # (cycle, id, data, last)
        self.unstable = 0
        self._ar_on = self._r_on = False
        self._stalled = None
        dut.m_axi_arvalid.value = 0
        dut.m_axi_rready.value = 0
        self.task = cocotb.start_soon(self._run())

    def read(self, aid, addr, alen, size=7, at=0):
        self.pending.append((at, aid, addr, alen, size))

    async def _run(self):
        d = self.dut
        while True:
            await RisingEdge(d.clk)
            now = self.counter.now
            c = now - 1
            if self._ar_on and d.m_axi_arready.value == 1:
                self.issued.append((c,) + self.pending.popleft()[1:])
            rv = d.m_axi_rvalid.value == 1
            if rv:
                beat = (int(d.m_axi_rid.value), int(d.m_axi_rdata.value), int(d.m_axi_rlast.value))
                if self._stalled is not None and beat != self._stalled:
                    self.unstable += 1
                self._stalled = None
                if self._r_on:
                    self.beats.append((c,) + beat)
                else:
                    self._stalled = beat
            elif self._stalled is not None:
                self.unstable += 1      # rvalid dropped before the handshake
                self._stalled = None
            if self.pending and self.pending[0][0] <= now:
                _, aid, addr, alen, size = self.pending[0]
                d.m_axi_arid.value = aid
                d.m_axi_araddr.value = addr
                d.m_axi_arlen.value = alen
                d.m_axi_arsize.value = size
                d.m_axi_arburst.value = 1
                d.m_axi_arvalid.value = 1
                self._ar_on = True
            elif self._ar_on:
                d.m_axi_arvalid.value = 0
                self._ar_on = False
            self._r_on = bool(self.ready(now))
            d.m_axi_rready.value = int(self._r_on)


def beat_lanes(addr, alen, size_log2):
    """(beat address, first lane, byte count) of each beat of an INCR burst."""
    size = 1 << size_log2
    out = []
    for i in range(alen + 1):
        a = addr if i == 0 else (addr & ~(size - 1)) + i * size
        out.append((a, a % BUS, size - (a % size)))
    return out


def check_read_data(mem, rm):
    """Beats come back in AR order with the right id, rlast and lane data."""
    k = 0
    for cycle, aid, addr, alen, size in rm.issued:
        for i, (a, lane, n) in enumerate(beat_lanes(addr, alen, size)):
            bc, bid, data, last = rm.beats[k]
            k += 1
            assert bid == aid, f"beat {k}: id {bid} != {aid}"
            assert last == (i == alen), f"read {addr:#x} beat {i}: rlast={last}"
            got = data.to_bytes(BUS, "little")[lane:lane + n]
            assert got == mem.read(a, n), f"read {addr:#x} beat {i}: data mismatch"
    assert k == len(rm.beats)


@cocotb.test()
async def test_dma_reads(dut):
    """Latency, ordering, narrow/unaligned bursts, reads in flight."""
    counter = await setup(dut)
    lat = 20
    mem = DmaMemory(dut, counter, read_latency=lat)
    rng = random.Random(1)
    mem.write(0x1000, bytes(rng.getrandbits(8) for _ in range(40_000)))
    rm = ReadMaster(dut, counter)
    start = counter.now + 2
    for args in ((1, 0x1000, 0), (1, 0x1080, 3), (0, 0x2043, 1), (1, 0x1004, 3, 2), (0, 0x3000, 255),
                 (2, 0x1FFFE, 2, 1)):
        rm.read(*args, at=start)
    await ClockCycles(dut.clk, lat + 300)
    assert len(rm.issued) == 6
    assert [c for c, *_ in rm.issued] == list(range(start, start + 6)), "AR not accepted at once"
    check_read_data(mem, rm)
    # first beat exactly `lat` after the first AR, then one beat per cycle
    assert rm.beats[0][0] == rm.issued[0][0] + lat
    assert [b[0] for b in rm.beats] == list(range(rm.beats[0][0], rm.beats[0][0] + len(rm.beats)))
    assert mem.max_reads_in_flight == 6
    rec = mem.reads[2]
    assert (rec.addr, rec.length, rec.beats, rec.id) == (0x2043, 2 * BUS - 0x43, 2, 0)
    assert rec.start_cycle == start + 2 and rec.end_cycle == rm.beats[6][0]
    assert mem.reads[3].length == 16 and mem.reads[5].length == 6
    assert mem.read(0x7000_0000, 4) == bytes(4)      # unmapped reads are zero

    # many reads in flight: each first beat exactly latency later
    mem.read_latency = 100
    rm.issued.clear(), rm.beats.clear()
    start = counter.now + 2
    for i in range(50):
        rm.read(i % 16, 0x1000 + 64 * i, 0, 6, at=start)
    await ClockCycles(dut.clk, 200)
    assert [b[0] for b in rm.beats] == [c + 100 for c, *_ in rm.issued]
    assert mem.max_reads_in_flight == 50
    check_read_data(mem, rm)


@cocotb.test()
async def test_dma_bandwidth_backpressure(dut):
    """Bandwidth limit and rready backpressure."""
    counter = await setup(dut)
    mem = DmaMemory(dut, counter, read_latency=5, read_bytes_per_cycle=64)
    rng = random.Random(2)
    mem.write(0x4000, bytes(rng.getrandbits(8) for _ in range(8192)))
    rm = ReadMaster(dut, counter)
    rm.read(3, 0x4000, 7, at=counter.now + 1)
    rm.read(4, 0x4400, 7, at=counter.now + 1)
    await ClockCycles(dut.clk, 60)
    cycles = [b[0] for b in rm.beats]
    assert len(cycles) == 16 and all(b - a == 2 for a, b in zip(cycles, cycles[1:])), cycles
    check_read_data(mem, rm)

    mem.read_bytes_per_cycle = 128
    rm.ready = lambda cycle: cycle % 3 != 0
    rm.issued.clear(), rm.beats.clear()
    for i in range(8):
        rm.read(i, 0x4000 + 300 * i, i * 3 % 8, at=counter.now + 1)
    await ClockCycles(dut.clk, 120)
    assert len(rm.beats) == sum(i * 3 % 8 + 1 for i in range(8))
    assert rm.unstable == 0
    check_read_data(mem, rm)
    assert all(r.end_cycle is not None for r in mem.reads)


@cocotb.test()
async def test_dma_streaming(dut):
    """Default 500-cycle latency: 40 x 4 KiB reads back to back keep the bus full."""
    counter = await setup(dut)
    mem = DmaMemory(dut, counter)
    rm = ReadMaster(dut, counter)
    start = counter.now + 1
    for i in range(40):
        rm.read(1, 0x10_0000 + 4096 * i, 31, at=start)
    await ClockCycles(dut.clk, 500 + 40 * 32 + 50)
    cycles = [b[0] for b in rm.beats]
    assert cycles == list(range(start + 500, start + 500 + 40 * 32))
    assert mem.max_reads_in_flight == 40 and mem.crossings_4k == 0
    rm.read(1, 0x10_0FC0, 1, at=counter.now)     # 2 beats: 0x100FC0.. and 0x101000..
    await ClockCycles(dut.clk, 600)
    assert mem.crossings_4k == 1


@cocotb.test()
async def test_dma_writes(dut):
    """AW/W with strobes and bursts, narrow writes, B one cycle after wlast."""
    counter = await setup(dut)
    mem = DmaMemory(dut, counter)
    axim = AxiMasterWrite(AxiWriteBus.from_prefix(dut, "m_axi"), dut.clk, dut.rst)
    bvalid_cycles = []

    async def watch_b():
        while True:
            await RisingEdge(dut.clk)
            if dut.m_axi_bvalid.value == 1:
                bvalid_cycles.append(counter.now - 1)
    cocotb.start_soon(watch_b())

    mem.write(0x8000, b"\xee" * 1024)
    data = bytes(range(256)) * 2
    await axim.write(0x8003, data[:300])
    assert mem.read(0x8000, 3) == b"\xee" * 3
    assert mem.read(0x8003, 300) == data[:300]
    assert mem.read(0x8003 + 300, 4) == b"\xee" * 4
    await axim.write(0x9000 + 6, b"\x11\x22\x33\x44", size=1)   # narrow: 2-byte beats
    assert mem.read(0x9004, 8) == b"\0\0\x11\x22\x33\x44\0\0"
    cqe = bytes(range(64))
    await axim.write(0xA040, cqe, awid=0)
    assert mem.read(0xA040, 64) == cqe and mem.read(0xA000, 64) == bytes(64)
    for w in mem.writes:
        assert w.end_cycle + 1 in bvalid_cycles and w.end_cycle not in bvalid_cycles
    last = mem.writes[-1]
    assert (last.addr, last.length, last.id, last.data) == (0xA040, 64, 0, cqe)
    assert [w.addr for w in mem.writes_covering(0xA040, 64)] == [0xA040]


@cocotb.test()
async def test_dma_two_write_ports(dut):
    """A second write port lands in the same memory; a burst that writes a byte that one in
    flight on the other port writes too (their order is undefined) is a protocol error,
    and only then: bytes of one line that only one of them writes (by their strobes) are
    not."""
    counter = await setup(dut)
    mem = DmaMemory(dut, counter, write_prefixes=("m_axi_rx",), strict=False)
    m0 = AxiMasterWrite(AxiWriteBus.from_prefix(dut, "m_axi"), dut.clk, dut.rst)
    m1 = AxiMasterWrite(AxiWriteBus.from_prefix(dut, "m_axi_rx"), dut.clk, dut.rst)
    # disjoint lines at once, then the same line one after the other: no error
    await Combine(cocotb.start_soon(m0.write(0x1000, b"\x11" * 256)),
                  cocotb.start_soon(m1.write(0x1100, b"\x22" * 8)))
    await m1.write(0x1010, b"\x33")
    await m0.write(0x1011, b"\x44")
    assert mem.protocol_errors == 0
    assert mem.read(0x1000, 0x10) == b"\x11" * 0x10 and mem.read(0x1010, 2) == b"\x33\x44"
    assert mem.read(0x1100, 8) == b"\x22" * 8
    assert {w.port for w in mem.writes} == {"m_axi", "m_axi_rx"}
    # different bytes of one line on both ports at once (a payload's last beat and an
    # atomic's word beside it): both land
    await Combine(cocotb.start_soon(m0.write(0x3000, b"\x77" * 0x68)),
                  cocotb.start_soon(m1.write(0x3068, b"\x88" * 8)))
    assert mem.protocol_errors == 0
    assert mem.read(0x3000, 0x70) == b"\x77" * 0x68 + b"\x88" * 8
    # one byte of the same line written on both ports at once
    await Combine(cocotb.start_soon(m0.write(0x2000, b"\x55" * 4)),
                  cocotb.start_soon(m1.write(0x2002, b"\x66")))
    assert mem.protocol_errors == 1


@cocotb.test()
async def test_dma_b_latency_visibility(dut):
    """Random write-response latency per burst and writes that land at their B: a
    write's bytes stay unseen until its B, each port's B come in AW order, and a "data"
    write on one port and a later "flag" write on the other can land flag first: the
    test memory can show a put-with-signal ordering violation (the engine must keep one)."""
    counter = await setup(dut)
    mem = DmaMemory(dut, counter, write_prefixes=("m_axi_rx",), b_latency=(1, 40), visible_at_b=True, seed=3)
    m0 = AxiMasterWrite(AxiWriteBus.from_prefix(dut, "m_axi"), dut.clk, dut.rst)
    m1 = AxiMasterWrite(AxiWriteBus.from_prefix(dut, "m_axi_rx"), dut.clk, dut.rst)
    flag_first, seen = [0], []

    async def watch():
        while True:
            await RisingEdge(dut.clk)
            for k in range(1, 13):
                data = mem.read(0x1000 + 0x100 * k, 8) == bytes([k]) * 8
                flag = mem.read(0x8000 + 8 * k, 1) == bytes([k])
                if flag and not data:
                    flag_first[0] += 1
    cocotb.start_soon(watch())
    for k in range(1, 13):
        t = cocotb.start_soon(m0.write(0x1000 + 0x100 * k, bytes([k]) * 8))
        await ClockCycles(dut.clk, 1)
        await m1.write(0x8000 + 8 * k, bytes([k]))          # the "flag", after the data's AW
        await t
        seen.append(mem.read(0x1000 + 0x100 * k, 8))
    assert seen == [bytes([k]) * 8 for k in range(1, 13)], "every write lands by its B"
    assert mem.protocol_errors == 0 and flag_first[0] > 0, "no flag landed before its data"
    # one port: B in AW order, each burst unseen until its B
    b_order = []

    async def watch_b():
        while len(b_order) < 6:
            await RisingEdge(dut.clk)
            if dut.m_axi_bvalid.value == 1 and dut.m_axi_bready.value == 1:
                b_order.append(counter.now)
    cocotb.start_soon(watch_b())
    tasks = [cocotb.start_soon(m0.write(0x20000 + 0x80 * k, bytes([0x40 + k]) * 4)) for k in range(6)]
    await ClockCycles(dut.clk, 3)
    assert mem.read(0x20000, 4) == bytes(4), "unseen before its B"
    for t in tasks:
        await t
    mine = [w for w in mem.writes if w.addr >= 0x20000]
    assert [w.addr for w in mine] == [0x20000 + 0x80 * k for k in range(6)]
    assert all(mem.read(0x20000 + 0x80 * k, 4) == bytes([0x40 + k]) * 4 for k in range(6))


# ---- stimulus: AXI-Stream source -------------------------------------------------------
class StreamSource:
    """Sends queued frames on m_axis_tx as fast as tready allows; ``keeps`` overrides tkeep per beat,
    ``stall`` holds tvalid low for that many cycles after a frame's first beat."""

    def __init__(self, dut, counter):
        self.dut, self.counter = dut, counter
        self.queue = deque()            # (frame bytes, keeps or None)
        self.sent = []                  # (first presented cycle, last handshake cycle)
        self._beats = deque()
        self._on = False
        self._presented = None
        self._gap = 0
        dut.m_axis_tx_tvalid.value = 0
        self.task = cocotb.start_soon(self._run())

    def send(self, frame, keeps=None, stall=0):
        self.queue.append((bytes(frame), keeps, stall))

    async def _run(self):
        d = self.dut
        while True:
            await RisingEdge(d.clk)
            now = self.counter.now
            if self._on and d.m_axis_tx_tready.value == 1:
                _, _, last, self._gap = self._beats.popleft()
                if last:
                    self.sent.append((self._presented, now - 1))
            if not self._beats and self.queue:
                frame, keeps, stall = self.queue.popleft()
                n = -(-len(frame) // BUS)
                for i in range(n):
                    chunk = frame[i * BUS:(i + 1) * BUS]
                    keep = keeps[i] if keeps else (1 << len(chunk)) - 1
                    self._beats.append((int.from_bytes(chunk, "little"), keep, i == n - 1, stall if i == 0 else 0))
                self._presented = now
            if self._gap:
                self._gap -= 1
                d.m_axis_tx_tvalid.value = 0
                self._on = False
            elif self._beats:
                data, keep, last, _ = self._beats[0]
                d.m_axis_tx_tdata.value = data
                d.m_axis_tx_tkeep.value = keep
                d.m_axis_tx_tlast.value = int(last)
                d.m_axis_tx_tvalid.value = 1
                self._on = True
            elif self._on:
                d.m_axis_tx_tvalid.value = 0
                self._on = False


def roce_like_frame(length, seq):
    """An Ethernet/IPv4/UDP(4791) frame of ``length`` bytes (tshark-parsable)."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    hdr = bytes(Ether(dst="02:00:00:00:00:02", src="02:00:00:00:00:01") /
                IP(src="192.168.0.1", dst="192.168.0.2", len=length - 14) /
                UDP(sport=0xC000, dport=4791, len=length - 34))
    body = bytes((seq + i) & 0xFF for i in range(length - len(hdr)))
    return hdr + body


def check_pacing(wire, src, frames):
    """Replays the interfaces.md rule from the presentation cycles."""
    prev_end = 0
    for fr, data, (presented, _) in zip(wire.frames, frames, src.sent):
        assert fr.data == data
        c = max(presented, -(-prev_end // 100) - 1)
        assert fr.first_cycle == c, (fr, presented, prev_end)
        assert fr.start_bytes == max(100 * c, prev_end)
        assert fr.last_cycle == c + -(-len(data) // BUS) - 1
        assert fr.end_bytes == fr.start_bytes + wire_bytes(len(data))
        prev_end = fr.end_bytes


@cocotb.test()
async def test_wire_pacing_pcap(dut):
    """Wire pacing rule, throughput figures, pcap output."""
    counter = await setup(dut)
    wire = Wire400G(dut, counter)
    src = StreamSource(dut, counter)
    small = [roce_like_frame(106, i) for i in range(20)]      # 8-byte RDMA WRITE ONLY size
    for f in small:
        src.send(f)
    await wire.wait_frames(20, timeout_cycles=200)
    check_pacing(wire, src, small)
    assert wire.throughput(wire=True) == pytest.approx(400.0)   # back-to-back on the wire
    assert wire.packet_rate() == pytest.approx(400e9 / 8 / 130 / 1e6)

    two_beat = [roce_like_frame(129, i) for i in range(20)]   # bus-limited: 2 beats per frame
    await ClockCycles(dut.clk, 10)
    for f in two_beat:
        src.send(f)
    await wire.wait_frames(40, timeout_cycles=200)
    assert wire.utilization(21, 40) == pytest.approx(153 / 200, rel=0.02)

    rng = random.Random(3)
    mixed = [roce_like_frame(rng.randrange(60, 1500), i) for i in range(60)]
    await ClockCycles(dut.clk, 7)
    for f in mixed:
        src.send(f)
    await wire.wait_frames(100, timeout_cycles=5000)
    check_pacing(wire, src, small + two_beat + mixed)
    assert wire.protocol_errors == 0 and wire.underrun_cycles == 0
    with pytest.raises(TimeoutError, match="got 100"):
        await wire.wait_frames(101, timeout_cycles=20)

    path = Path.cwd() / "wire.pcap"
    wire.write_pcap(path)
    from scapy.utils import rdpcap
    pkts = rdpcap(str(path))
    assert len(pkts) == len(wire.frames)
    for p, fr in zip(pkts, wire.frames):
        assert bytes(p) == fr.data
        assert int(round(p.time * 10**9)) == round(fr.start_ns)
    # expected timestamps for the tshark check in tests/system/test_tb_models.py
    (Path.cwd() / "wire.expected").write_text("".join(f"{round(f.start_ns)} {len(f.data)}\n" for f in wire.frames))


@cocotb.test()
async def test_wire_underrun(dut):
    """A frame whose tvalid drops inside it leaves no earlier than its last beat, the lost
    wire cycles counted (what a real MAC would underrun on); frames without stalls add none."""
    counter = await setup(dut)
    wire = Wire400G(dut, counter)
    src = StreamSource(dut, counter)
    src.send(roce_like_frame(300, 0), stall=5)      # 3 beats, 5 idle cycles after the first
    src.send(roce_like_frame(300, 1))
    await wire.wait_frames(2, timeout_cycles=100)
    stalled, clean = wire.frames
    assert stalled.last_cycle - stalled.first_cycle == 2 + 5
    # unstalled it would end 324 bytes (3.24 cycles) after its start; its last beat is in its
    # 8th cycle, so the wire end moves 4 cycles later
    assert wire_bytes(300) == 324 and wire.underrun_cycles == 4
    assert stalled.end_bytes == 100 * stalled.last_cycle
    assert clean.end_bytes == clean.start_bytes + 324 and wire.underrun_cycles == 4


@cocotb.test()
async def test_wire_tkeep_errors(dut):
    """Bad tkeep is counted (strict=False) and frames still recorded."""
    counter = await setup(dut)
    wire = Wire400G(dut, counter, strict=False)
    src = StreamSource(dut, counter)
    full = (1 << BUS) - 1
    src.send(bytes(300), keeps=[full, full >> 1, (1 << 44) - 1])       # hole on a middle beat
    src.send(bytes(200), keeps=[full, 0b1011])                          # non-contiguous last
    src.send(bytes(64))
    await wire.wait_frames(3, timeout_cycles=100)
    assert wire.protocol_errors == 2
    assert [len(f) for f in wire.frames] == [128 + 127 + 44, 128 + 4, 64]


# ---- control path and GPU model --------------------------------------------------------
def cqe_bytes(qpn, wqe_counter, owner, opcode=CqeOp.REQ, byte_cnt=0):
    raw = bytearray(64)
    pack(CQE64, raw, 0, sop_drop_qpn=qpn, wqe_counter=wqe_counter, op_own=(opcode << 4) | owner,
         byte_cnt=byte_cnt)
    return bytes(raw)


@cocotb.test()
async def test_control_and_gpu(dut):
    """CSR writes, QP/CQ creation, WQE building, doorbells, CQ polling."""
    counter = await setup(dut)
    csr = AxiLiteRam(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk, dut.rst, size=2**16)
    uar = AxiRamWrite(AxiWriteBus.from_prefix(dut, "s_axi_db"), dut.clk, dut.rst, mem=AxiSparseMemory(2**32))
    mem = DmaMemory(dut, counter)
    nic_w = AxiMasterWrite(AxiWriteBus.from_prefix(dut, "m_axi"), dut.clk, dut.rst)   # plays the NIC's CQE writes
    ctl = NicControl(dut)

    csr.write_dword(0, ID_VALUE)
    assert await ctl.read_id() == ID_VALUE
    await ctl.set_port(0xAABBCCDDEEFF, 0xC0A80001)
    assert [csr.read_dword(ADDR[r]) for r in ("PORT_MAC_LO", "PORT_MAC_HI", "PORT_IP")] == [0xCCDDEEFF, 0xAABB, 0xC0A80001]
    csr.write_dword(ADDR["packets"], 77)
    csr.write_dword(ADDR["rx_accepted"], 12)
    counters = await ctl.read_counters()
    assert counters["packets"] == 77 and counters["doorbells"] == 0 and counters["rx_accepted"] == 12
    # transmit, receive, requester counters, and the checks on what arrives from outside
    assert len(counters) == len(TX_COUNTERS) + len(RX_COUNTERS) + len(REQ_COUNTERS) + len(CHECK_COUNTERS)
    for bad in (dict(qpn=NUM_QPS), dict(sq_base=0x1001), dict(log_depth=16), dict(mtu_code=6), dict(dmac=1 << 48)):
        args = dict(qpn=1, sq_base=0x1000, log_depth=4, cqn=0, remote_qpn=2, start_psn=0, dmac=1, dip=2, mtu_code=5)
        args.update(bad)
        with pytest.raises(ValueError):
            await ctl.create_qp(**args)
    with pytest.raises(ValueError):
        await ctl.create_cq(NUM_CQS, 0x1000, 2)

    gpu = GpuModel(dut, mem, ctl, counter, poll_interval=4)
    cq = await gpu.create_cq(3, 2)
    assert [csr.read_dword(a) for a in (0x200, 0x204, 0x208, 0x20C, 0x210)] == \
        [3, cq.base & 0xFFFFFFFF, cq.base >> 32, 2, 0]
    assert mem.read(cq.base, 256) == b"\xff" * 256
    qp = await gpu.create_qp(5, 2, cq, remote_qpn=0x123456, dmac=0x020000000002, dip=0xC0A80002, start_psn=0x100)
    regs = [csr.read_dword(a) for a in range(0x100, 0x130, 4)]
    assert regs == [5, qp.sq_base & 0xFFFFFFFF, qp.sq_base >> 32, 2, 3, 0x123456, 0x100, 0x00000002, 0x0200,
                    0xC0A80002, 5, 3]

    src = gpu.alloc(64)
    gpu.write(src, bytes(range(64)))
    w0 = qp.post_write(0xDEAD0000, 0x1234, local_addr=src, length=64)
    slot0 = mem.read(qp.sq_base, 64)
    assert unpack(CTRL_SEG, slot0) == dict(opmod_idx_opcode=WqeOp.RDMA_WRITE, qpn_ds=(5 << 8) | 3, signature=0,
                                           rsvd=0, fm_ce_se=0x08, imm=0)
    assert unpack(RADDR_SEG, slot0, 16) == dict(raddr=0xDEAD0000, rkey=0x1234, rsvd=0)
    assert unpack(DATA_SEG, slot0, 32) == dict(byte_count=64, lkey=0x100, addr=src)
    assert (w0.ds, w0.nwqebbs, w0.index, w0.payload) == (3, 1, 0, bytes(range(64)))
    w1 = qp.post_write(0xDEAD1000, 0x1234, inline=b"12345678abcd", signaled=False)
    slot1 = mem.read(qp.sq_base + 64, 64)
    assert slot1[32:48] == be32(12 | 0x80000000) + b"12345678abcd" and slot1[11] == 0
    assert (w1.ds, w1.index, w1.signaled, w1.payload) == (3, 1, False, b"12345678abcd")
    w2 = qp.post_write(0xDEAD2000, 0x1234, inline=bytes(range(40)))
    assert (w2.ds, w2.nwqebbs, w2.index, qp.pi) == (5, 2, 2, 4)
    assert mem.read(qp.sq_base + 128, 128) == w2.wqe

    cyc = await qp.ring_nvshmem()
    assert uar.read((5 << 12) | 0x800, 8) == be32(4 << 8) + be32(5 << 8)
    assert mem.read(qp.dbr_addr, 4) == be32(4)
    assert [w.db_cycle for w in (w0, w1, w2)] == [cyc] * 3 and gpu.doorbells[-1].cycle == cyc
    assert cyc <= counter.now

    w3 = qp.post_write(0xDEAD3000, 0x1234, inline=bytes(100))      # 3 WQEBBs, slots 0..2
    w4 = qp.post_write(0xDEAD4000, 0x1234, inline=bytes(range(30)), opcode=WqeOp.RDMA_WRITE_IMM, imm=0xABCD)
    assert (w3.ds, w3.nwqebbs, w4.ds, w4.nwqebbs, w4.index, w4.slot) == (9, 3, 5, 2, 7, 3)
    assert mem.read(qp.sq_base + 192, 64) == w4.wqe[:64]          # wraps: slot 3 then slot 0
    assert mem.read(qp.sq_base, 64) == w4.wqe[64:]
    assert unpack(CTRL_SEG, w4.wqe)["imm"] == 0xABCD
    cyc2 = await qp.ring_rdma_core()
    assert uar.read((5 << 12) | 0x800, 8) == be32((7 << 8) | WqeOp.RDMA_WRITE_IMM) + be32((5 << 8) | 5)
    assert w3.db_cycle == w4.db_cycle == cyc2 > cyc
    nop = qp.post_nop(signaled=False)
    assert (nop.ds, nop.nwqebbs, unpack(CTRL_SEG, nop.wqe)["fm_ce_se"]) == (1, 1, 0)
    await qp.ring_raw(b"\x01" * 8, offset=0x900)
    assert uar.read((5 << 12) | 0x900, 8) == b"\x01" * 8 and nop.db_cycle is None
    with pytest.raises(ValueError, match="WQEBBs"):
        qp.post_write(0, 0, inline=bytes(250))
    with pytest.raises(ValueError):
        qp.post_write(0, 0, length=8)
    with pytest.raises(ValueError):
        await qp.ring_raw(b"\0" * 4)

    # ring CQ: owner bit flips on wrap; write_cycle comes from the AXI write
    for k in range(4):
        await nic_w.write(cq.slot_addr(k), cqe_bytes(5, 10 + k, 0, byte_cnt=k), awid=0)
    got = await cq.poll(4, timeout_cycles=100)
    assert [c.wqe_counter for c in got] == [10, 11, 12, 13] and all(c.qpn == 5 for c in got)
    for c in got:
        wr = [w for w in mem.writes if w.addr == cq.slot_addr(c.index)][-1]
        assert c.write_cycle == wr.end_cycle and c.seen_cycle > c.write_cycle
    await nic_w.write(cq.slot_addr(4), cqe_bytes(5, 14, 0), awid=0)   # stale owner: not ours
    with pytest.raises(TimeoutError, match="got 0"):
        await cq.poll(1, timeout_cycles=30)
    await nic_w.write(cq.slot_addr(4), cqe_bytes(5, 14, 1, CqeOp.REQ_ERR), awid=0)
    (err,) = await cq.poll(1, timeout_cycles=30)
    assert err.index == 4 and err.is_error and err.wqe_counter == 14

    # collapsed CQ: slot 0 overwritten, poll by wqe_counter
    ccq = await gpu.create_cq(4, 0, collapsed=True)
    await nic_w.write(ccq.base, cqe_bytes(5, 3, 0), awid=0)
    with pytest.raises(TimeoutError, match="wqe_counter 0x3"):
        await ccq.poll_counter(7, timeout_cycles=30)
    await nic_w.write(ccq.base, cqe_bytes(5, 7, 1), awid=0)
    c7 = await ccq.poll_counter(7, timeout_cycles=30)
    assert c7.wqe_counter == 7 and c7.write_cycle == mem.writes[-1].end_cycle
    await nic_w.write(ccq.base, cqe_bytes(5, 9, 0), awid=0)
    (c9,) = await ccq.poll(1, timeout_cycles=30)
    assert c9.wqe_counter == 9
