"""RxPayloadWriter in Amaranth's simulator: received frames in the MAC segment format,
payloads written into an AXI memory model, discarded frames kept out of memory."""
import random

import pytest
from amaranth.sim import Simulator

from model.frames import Port, QpContext, build_packet, build_write_frames
from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from rtl.common.axi_write_arbiter import AxiWriteArbiter
from rtl.common.rx_beat import RxSegmentBeat
from rtl.common.stream import Pair
from rtl.responder.payload_writer import RxPayloadWriter, RxWriteCommand
from rtl.responder.write_issuer import RxWriteIssuer
from rtl.responder.write_sorter import RxWriteOrder, RxWriteSorter
from rtl.common.stream import StreamFifo as _StreamFifo
from spec.formats import Op
from spec.params import axi_bursts
from spec.params import DATA_BYTES

BEAT = DATA_BYTES
SEG = 64
PAGE = 4096
BASE = 0x1234_5600_0000_0000          # the memory region under test (high address bits set)
SIZE = 128 * 1024
SIZES = (0, 1, 7, 8, 50, 55, 56, 57, 63, 64, 65, 127, 128, 129, 200, 1000, 4096)
ALIGNS = (0, 1, 63, 64, 127)
QP = QpContext(qpn=3, remote_qpn=0x1234, dmac=0x020000000002, dip=0x0A000002, mtu=4096)
PORT = Port(smac=0x020000000001, sip=0x0A000001)


def _canary(i):
    return (i * 7 + 0xA5) & 0xFF


def _frame(offset, payload, va, psn):
    """A WRITE frame whose payload starts at ``offset``: 70 (ONLY, from build_write_frames),
    54 (LAST), 58/74 (4 more header bytes in front of the payload, standing for an ImmDt:
    the writer reads no header, only the command's offset)."""
    if offset == 70:
        (f,) = build_write_frames(QP, PORT, va, 0x55, payload, psn)
        return f
    imm = b"\xde\xad\xbe\xef" if offset in (58, 74) else b""
    if offset in (54, 58):
        return build_packet(QP, PORT, Op.WRITE_LAST, psn, imm + payload)
    return build_packet(QP, PORT, Op.WRITE_ONLY, psn, imm + payload, reth=(va, 0x55, len(payload)))


def _bursts(addr, length):
    """The AW bursts a write must produce: (line address, beats), split at 4 KiB
    (``spec.params.axi_bursts``; a burst within one page is never longer than a page)."""
    return axi_bursts(addr, length, BEAT, PAGE // BEAT)


class Item:
    """One frame and its command."""
    def __init__(self, frame, write, addr, offset, length):
        self.frame, self.write, self.addr, self.offset, self.length = frame, write, addr, offset, length
        assert offset + length + 4 <= len(frame)

    @property
    def payload(self):
        return self.frame[self.offset:self.offset + self.length]


def _workload(rnd, aligns=ALIGNS, offsets=(70, 54, 58, 74), discards=True):
    """Writes of every size at every alignment, 4 KiB crossings, discarded frames between."""
    items, cursor, psn = [], 0, 0
    writes = [(p, a) for p in SIZES for a in aligns]
    rnd.shuffle(writes)

    def place(p, align):
        nonlocal cursor
        addr = (cursor + BEAT - 1) // BEAT * BEAT + align
        if addr // PAGE != (addr + max(p, 1) - 1) // PAGE and rnd.random() < 0.5:
            addr = (addr // PAGE + 1) * PAGE + align      # not every write should cross a page
        cursor = addr + p + rnd.randrange(1, 40)          # canary bytes between payloads
        return addr

    def discard():
        nonlocal psn
        kind = rnd.randrange(4)
        if kind == 0:                                     # a WRITE the responder rejects
            p = rnd.choice(SIZES)
            off = rnd.choice((70, 54))
            f = _frame(off, bytes(rnd.randrange(256) for _ in range(p)), 0, psn)
        elif kind == 1:                                   # short frames: ACK-sized, padded minimum
            f, off, p = bytes(rnd.randrange(256) for _ in range(rnd.choice((58, 60, 64)))), 54, 0
        elif kind == 2:                                   # a jumbo frame of another protocol
            f, off, p = bytes(rnd.randrange(256) for _ in range(9000)), 70, 1000
        else:
            f, off, p = bytes(rnd.randrange(256) for _ in range(rnd.randrange(69, 300))), 54, 8
        psn += 1
        # aimed at memory the test watches, so a leak shows
        return Item(f, 0, BASE + rnd.randrange(SIZE - 4200), off, min(p, len(f) - off - 4))

    for p, align in writes:
        if discards and rnd.random() < 0.35:
            items.append(discard())
        off = rnd.choice(offsets)
        payload = bytes(rnd.randrange(256) for _ in range(p))
        addr = BASE + place(p, align)
        items.append(Item(_frame(off, payload, addr, psn), 1, addr, off, p))
        psn += 1
    # explicit 4 KiB crossings at every alignment class
    for p, back in ((4096, 640), (200, 1), (129, 64), (1000, 3), (4096, 4095), (128, 127), (65, 1)):
        boundary = ((cursor + back) // PAGE + 1) * PAGE
        addr = BASE + boundary - back
        cursor = boundary - back + p + 16
        payload = bytes(rnd.randrange(256) for _ in range(p))
        off = rnd.choice(offsets)
        items.append(Item(_frame(off, payload, addr, psn), 1, addr, off, p))
        psn += 1
    assert cursor < SIZE - 4200
    return items


def _beats(frames):
    """The segment format of MAC TX (tests/blocks/test_blocks.py ``_beats``): a frame of more than
    68 bytes starts at lane 64 behind a last beat of at most 64 bytes, else at lane 0.
    Returns beat dicts (the RxSegmentBeat fields and, for the checks, ``sop`` and
    ``nbytes``), per frame the index of its last beat, and per frame its start lane (0 or
    64)."""
    stream, starts = bytearray(), []
    for f in frames:
        rem = len(stream) % BEAT
        if stream and rem and rem <= SEG and len(f) > 68:
            stream += bytes(SEG - rem)
        elif rem:
            stream += bytes(BEAT - rem)
        starts.append(len(stream))
        stream += f
    stream += bytes(-len(stream) % BEAT)
    beats, last_beat = [], []
    k = 0                                                  # the frame holding lane 0
    for b in range(len(stream) // BEAT):
        lo, hi = b * BEAT, (b + 1) * BEAT
        while starts[k] + len(frames[k]) <= lo:
            k += 1
        end = starts[k] + len(frames[k])
        last = end <= hi
        sop_hi = last and k + 1 < len(frames) and starts[k + 1] == lo + SEG
        assert not sop_hi or end <= lo + SEG
        if last:
            last_beat.append(b)
        beats.append({"data": int.from_bytes(stream[lo:hi], "little"), "sop": int(starts[k] == lo),
                      "last": int(last), "nbytes": (end - lo) if last else 0, "sop_hi": int(sop_hi)})
    assert len(last_beat) == len(frames)
    return beats, last_beat, [o % BEAT for o in starts]


class _WriterPath(wiring.Component):
    """The writer as the top level uses it: its commands through the RxWriteSorter, its
    bursts through the RxWriteIssuer (port p0; p1 has nothing to do without inline
    payloads) and the AxiWriteArbiter (the CQE writer's side idle)."""
    def __init__(self):
        w = RxPayloadWriter()
        self._writer = w
        self._issuer = RxWriteIssuer()
        super().__init__({"beats": In(stream.Signature(RxSegmentBeat(BEAT))),
                          "commands": In(stream.Signature(RxWriteCommand)),
                          "dma": Out(w.dma.signature),
                          "done": Out(1), "done_length": Out(13), "writes": Out(32), "bytes": Out(64)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.writer = w = self._writer
        m.submodules.sorter = srt = RxWriteSorter()
        m.submodules.orders = q = _StreamFifo(Pair(RxWriteOrder), 16)
        m.submodules.issuer = iss = self._issuer
        wiring.connect(m, wiring.flipped(self.beats), w.beats)
        m.d.comb += [srt.i.valid.eq(self.commands.valid), srt.i.p.p[0].eq(self.commands.p),
                     self.commands.ready.eq(srt.i.ready)]
        wiring.connect(m, srt.commands, w.commands)
        m.d.comb += srt.verdicts.ready.eq(1)        # (the resegmenter's: every frame here is written)
        wiring.connect(m, srt.orders, q.i)
        wiring.connect(m, q.o, iss.orders)
        wiring.connect(m, w.dma, iss.writer)
        m.submodules.arbiter = arb = AxiWriteArbiter(ids=(0, 2))
        wiring.connect(m, iss.p0, arb.b)
        wiring.connect(m, arb.bus, wiring.flipped(self.dma))
        m.d.comb += arb.a.bready.eq(1)
        m.d.comb += [iss.p1.awready.eq(1), iss.p1.wready.eq(1),
                     self.done.eq(w.done), self.done_length.eq(w.done_length),
                     self.writes.eq(w.writes), self.bytes.eq(w.bytes)]
        return m


def _simulate(items, *, p_arrive, p_valid, p_cmd, p_aw, p_w, b_delay, seed, max_cycles, cmd_delay=6,
              path=False):
    """Run the writer (``path``: with the sorter and issuer) on ``items``; return the
    memory image and the run's record."""
    rnd = random.Random(seed)
    dut = _WriterPath() if path else RxPayloadWriter()
    beats, last_beat, lanes = _beats([it.frame for it in items])
    mem = bytearray(_canary(i) for i in range(SIZE))
    rec = {"aw": [], "taken": [], "written": {}, "done": [], "cycles": 0}
    # expected bursts in AW order, each tagged with its write's index among the writes
    writes = [it for it in items if it.write]
    exp_bursts = [(b, n) for n, it in enumerate(writes) for b in _bursts(it.addr, it.length)]
    bursts_of = [len(_bursts(it.addr, it.length)) for it in writes]
    ends = {b: k for k, b in enumerate(last_beat)}

    async def bench(ctx):
        fifo = []                        # beats that have arrived upstream (index into beats)
        arrived = 0
        cmd_ready_at = {}                # frame index -> cycle its command may be offered
        cmd_next = 0
        beat_on = cmd_on = False
        awq, wq = [], []                 # AWs waiting for W beats; W beats waiting for an AW
        bq = []                          # cycle each completed burst's B may go
        b_done = 0
        cycle = 0
        while True:
            # ---- upstream: beats arrive in a FIFO; a frame's command a few cycles after its last beat
            while arrived < len(beats) and (p_arrive is None or rnd.random() < p_arrive):
                fifo.append(arrived)                     # p_arrive None: everything is there at once
                if arrived in ends:
                    cmd_ready_at[ends[arrived]] = cycle + rnd.randrange(0, cmd_delay + 1)
                arrived += 1
                if p_arrive is not None:
                    break
            if not beat_on and fifo and rnd.random() < p_valid:
                beat_on = True
                for name in ("data", "last", "sop_hi"):          # RxSegmentBeat
                    ctx.set(getattr(dut.beats.p, name), beats[fifo[0]][name])
            ctx.set(dut.beats.valid, beat_on)
            if (not cmd_on and cmd_next < len(items) and cmd_ready_at.get(cmd_next, 1 << 60) <= cycle
                    and rnd.random() < p_cmd):
                cmd_on = True
                it = items[cmd_next]
                ctx.set(dut.commands.p.write, it.write)
                ctx.set(dut.commands.p.addr, it.addr)
                ctx.set(dut.commands.p.offset, it.offset)
                ctx.set(dut.commands.p.length, it.length)
            ctx.set(dut.commands.valid, cmd_on)
            ctx.set(dut.dma.awready, rnd.random() < p_aw)
            ctx.set(dut.dma.wready, rnd.random() < p_w)
            b_on = bool(bq) and bq[0] <= cycle
            ctx.set(dut.dma.bvalid, b_on)
            ctx.set(dut.dma.bid, 2)
            await ctx.delay(1e-12)

            # ---- sample this cycle's handshakes
            if beat_on and ctx.get(dut.beats.ready):
                rec["taken"].append(cycle)
                fifo.pop(0)
                beat_on = False
            if cmd_on and ctx.get(dut.commands.ready):
                cmd_on = False
                cmd_next += 1
            if ctx.get(dut.dma.awvalid) and ctx.get(dut.dma.awready):
                aw = (ctx.get(dut.dma.awid), ctx.get(dut.dma.awaddr), ctx.get(dut.dma.awlen) + 1,
                      ctx.get(dut.dma.awsize), ctx.get(dut.dma.awburst))
                awid, addr, n, size, burst = aw
                assert (awid, size, burst) == (2, 7, 1), aw
                assert 1 <= n <= 32 and addr % BEAT == 0, aw
                assert addr // PAGE == (addr + n * BEAT - 1) // PAGE, f"burst {addr:#x}+{n} beats crosses 4 KiB"
                rec["aw"].append((addr, n))
                awq.append([addr, n, 0])
            if ctx.get(dut.dma.wvalid) and ctx.get(dut.dma.wready):
                wq.append((ctx.get(dut.dma.wdata), ctx.get(dut.dma.wstrb), ctx.get(dut.dma.wlast)))
            if b_on and ctx.get(dut.dma.bready):
                bq.pop(0)
                b_done += 1
            if ctx.get(dut.done):
                rec["done"].append((cycle, ctx.get(dut.done_length)))
            # a write is complete once all its bursts (and all earlier writes') have their B
            complete, seen = 0, 0
            for nb in bursts_of:
                if seen + nb > b_done:
                    break
                seen += nb
                complete += 1
            assert len(rec["done"]) <= complete, f"cycle {cycle}: done before the data's B response"
            assert ctx.get(dut.writes) == len(rec["done"]) - bool(ctx.get(dut.done))

            # ---- W beats land in memory in AW order
            while awq and wq:
                addr, n, k = awq[0]
                data, strb, last = wq.pop(0)
                assert bool(last) == (k == n - 1), f"wlast={last} on beat {k} of {n} at {addr:#x}"
                assert strb, f"W beat {k} of the burst at {addr:#x} writes nothing"
                line = addr + k * BEAT
                raw = data.to_bytes(BEAT, "little")
                for lane in range(BEAT):
                    if strb >> lane & 1:
                        a = line + lane
                        assert BASE <= a < BASE + SIZE, f"write outside the region: {a:#x}"
                        mem[a - BASE] = raw[lane]
                        rec["written"][a] = rec["written"].get(a, 0) + 1
                if k == n - 1:
                    awq.pop(0)
                    bq.append(cycle + 1 + rnd.randrange(0, b_delay + 1))
                else:
                    awq[0][2] += 1

            await ctx.tick()
            cycle += 1
            if (len(rec["taken"]) == len(beats) and cmd_next == len(items) and b_done == len(exp_bursts)
                    and not awq and not wq and len(rec["done"]) == len(writes)):
                break
            assert cycle < max_cycles, (f"stuck: {len(rec['taken'])}/{len(beats)} beats, {cmd_next}/{len(items)} "
                                        f"commands, {b_done}/{len(exp_bursts)} B, {len(rec['done'])} done")
        for _ in range(3):               # nothing more may happen
            await ctx.delay(1e-12)
            assert not ctx.get(dut.dma.awvalid) and not ctx.get(dut.dma.wvalid) and not ctx.get(dut.done)
            await ctx.tick()
        rec["writes"], rec["bytes"] = ctx.get(dut.writes), ctx.get(dut.bytes)
        rec["cycles"] = cycle

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(bench)
    sim.run()
    rec["exp_bursts"] = [b for b, _ in exp_bursts]
    rec["beats"], rec["lanes"] = beats, lanes
    return mem, rec


def _check(items, mem, rec):
    expect = bytearray(_canary(i) for i in range(SIZE))
    payload_bytes = set()
    for it in items:
        if it.write:
            expect[it.addr - BASE:it.addr - BASE + it.length] = it.payload
            payload_bytes.update(range(it.addr, it.addr + it.length))
    assert rec["aw"] == rec["exp_bursts"]
    assert set(rec["written"]) == payload_bytes, "wstrb must mark exactly the payload bytes"
    assert all(n == 1 for n in rec["written"].values()), "a payload byte was written twice"
    for i in range(SIZE):               # byte for byte, canary included
        if mem[i] != expect[i]:
            raise AssertionError(f"memory at {BASE + i:#x}: {mem[i]:#04x}, expected {expect[i]:#04x}")
    writes = [it for it in items if it.write]
    assert [n for _, n in rec["done"]] == [it.length for it in writes]
    assert rec["writes"] == len(writes)
    assert rec["bytes"] == sum(it.length for it in writes)


@pytest.mark.parametrize("seed,stall", [(1, 0.3), (2, 0.6)], ids=["light-stalls", "heavy-stalls"])
def test_payloads_reach_memory(seed, stall):
    """Every size at every alignment (and across 4 KiB) lands byte for byte; discarded frames
    leave the canary untouched; AW/W/B rules hold; commands come after their frames."""
    rnd = random.Random(seed)
    items = _workload(rnd)
    keep = 1 - stall
    mem, rec = _simulate(items, p_arrive=0.9, p_valid=keep, p_cmd=keep, p_aw=keep, p_w=keep,
                         b_delay=6, seed=seed, max_cycles=20_000)
    assert any(b["sop_hi"] for b in rec["beats"]) and any(not it.write for it in items)
    _check(items, mem, rec)


def _rate_run(items, path=False):
    mem, rec = _simulate(items, p_arrive=None, p_valid=1.0, p_cmd=1.0, p_aw=1.0, p_w=1.0, b_delay=0,
                         seed=5, max_cycles=5_000, cmd_delay=0, path=path)
    _check(items, mem, rec)
    taken = rec["taken"]
    return taken[-1] - taken[0] + 1, len(taken), rec


def _stream(rnd, sizes, align):
    """Writes of ``sizes`` (random offsets) placed one after the other at ``align`` mod 128."""
    items, cursor = [], 0
    for psn, p in enumerate(sizes):
        addr = BASE + (cursor + BEAT - 1) // BEAT * BEAT + align
        cursor = addr - BASE + p + 1
        off = rnd.choice((70, 54, 58, 74))
        items.append(Item(_frame(off, bytes(rnd.randrange(256) for _ in range(p)), addr, psn), 1, addr, off, p))
    assert cursor <= SIZE
    return items


def test_aligned_rate():
    """No stalls, aligned addresses: one input beat per cycle, also when a beat ends one
    frame and starts the next at lane 64; the one documented exception, a beat that holds
    a whole frame of at most 64 bytes from lane 0 and starts another at lane 64, takes two."""
    rnd = random.Random(9)
    sizes = list(SIZES) + [rnd.randrange(0, 400) for _ in range(60)] + [rnd.randrange(0, 7) for _ in range(10)]
    sizes += [4000, 2500]
    rnd.shuffle(sizes)
    items = _stream(rnd, sizes, 0)
    cycles, nbeats, rec = _rate_run(items)
    assert sum(b["sop_hi"] for b in rec["beats"]) >= 20
    short = sum(1 for b in rec["beats"] if b["sop"] and b["last"] and b["sop_hi"])
    assert 0 < short < 10
    assert cycles == nbeats + short, f"{nbeats} beats ({short} with a short frame) took {cycles} cycles"


@pytest.mark.parametrize("align", [1, 63, 64, 127])
def test_unaligned_rate(align):
    """No stalls, unaligned addresses: the input waits only for W beats (one per cycle)."""
    rnd = random.Random(10 + align)
    sizes = list(SIZES) + [rnd.randrange(0, 400) for _ in range(30)]
    rnd.shuffle(sizes)
    items = _stream(rnd, sizes, align)
    cycles, nbeats, rec = _rate_run(items)
    w_beats = sum(n for _, n in rec["aw"])
    # a frame at lane 64 whose first W beat comes from its first input beat costs a cycle
    late = sum(1 for it, lane in zip(items, rec["lanes"])
               if lane == SEG and it.length and it.addr % BEAT > SEG + it.offset)
    print(f"align {align}: {nbeats} beats, {w_beats} W beats, {late} late starts, {cycles} cycles")
    assert cycles <= max(nbeats, w_beats) + late, (cycles, nbeats, w_beats, late)


@pytest.mark.parametrize("seed", [3, 4])
def test_path_rate(seed):
    """The sorter, issuer and arbiter behind the writer cost it no throughput: WRITE ONLYs
    of 92..199 bytes back to back (1-2 W beats each, the W channel over 95% busy) take
    the writer alone's cycles plus the path's latency of 2."""
    rnd = random.Random(seed)
    items, cursor = [], 0
    for psn, n in enumerate(n for n in range(92, 200) for _ in range(4)):
        p, addr = n - 74, BASE + cursor
        cursor += n - 74 + rnd.randrange(1, 64)
        items.append(Item(_frame(70, bytes(rnd.randrange(256) for _ in range(p)), addr, psn), 1, addr, 70, p))
    alone, nbeats, rec = _rate_run(items)
    path, _, rec_path = _rate_run(items, path=True)
    w_beats = sum(n for _, n in rec["aw"])
    print(f"{nbeats} beats, {w_beats} W beats: writer {alone} cycles, with the path {path}")
    assert rec_path["aw"] == rec["aw"]
    assert w_beats > 0.95 * alone
    assert path <= alone + 2
