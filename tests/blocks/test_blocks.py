"""Block-level tests in Amaranth's own simulator: each block against the golden model or the SPEC."""
import random

import pytest
from amaranth.sim import Simulator

from model.frames import Port, QpContext, build_write_frames
from model.icrc import icrc
from rtl.host.doorbell_decoder import DoorbellDecoder
from rtl.port.icrc_inserter import IcrcInserter
from rtl.requester.payload_fetch import PayloadFetch
from rtl.requester.message import MessageKind
from spec.params import DATA_BYTES

BEAT = DATA_BYTES


def _run(dut, bench, cycles_limit=20_000):
    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(bench)
    sim.run()


async def _handshake(ctx, valid, ready):
    """Raise ``valid`` until a clock edge sees ``ready`` with it (the transfer), then drop it."""
    ctx.set(valid, 1)
    while True:
        await ctx.delay(1e-12)          # let combinational logic settle before sampling
        took = ctx.get(ready)
        await ctx.tick()
        if took:
            break
    ctx.set(valid, 0)


def _frames():
    qp = QpContext(qpn=3, remote_qpn=0x1234, dmac=0x020000000002, dip=0x0A000002, mtu=1024, start_psn=0xFFFFFE)
    port = Port(smac=0x020000000001, sip=0x0A000001)
    rnd = random.Random(7)
    out = []
    # payloads that put the ICRC in every position class: within a beat, ending a beat,
    # straddling two beats by 1..3 bytes, and multi-beat frames.
    for p in (0, 1, 8, 50, 51, 52, 53, 54, 55, 58, 123, 180, 181, 182, 183, 184, 1000, 2600):
        out += build_write_frames(qp, port, 0x1000, 0x55, bytes(rnd.randrange(256) for _ in range(p)), 0xFFFFFE)
    return out


def _beats(frames, segments):
    """The builder's beat stream for ``frames`` (ICRC as zeros): one frame per beat start or,
    with ``segments``, a frame of more than 68 bytes packed at lane 64 behind a last beat
    of at most 64 bytes. Items: (data, nbytes, last, flen, sop_hi, flen_hi)."""
    stream = bytearray()
    starts = []                      # (frame index, offset in stream)
    for k, f in enumerate(frames):
        if segments and stream and len(stream) % BEAT and len(stream) % BEAT <= 64 and len(f) > 68:
            stream += bytes(64 - len(stream) % BEAT)
        elif len(stream) % BEAT:
            stream += bytes(BEAT - len(stream) % BEAT)
        starts.append((k, len(stream)))
        stream += f[:-4] + bytes(4)
    stream += bytes(-len(stream) % BEAT)
    beats = []
    for b in range(len(stream) // BEAT):
        lo, hi = b * BEAT, (b + 1) * BEAT
        ends = [(k, o) for k, o in starts if lo < o + len(frames[k]) <= hi]
        cur = [(k, o) for k, o in starts if o < lo + 64 and o + len(frames[k]) > lo]
        upper = [(k, o) for k, o in starts if o == lo + 64]
        k0, o0 = cur[0]
        end = o0 + len(frames[k0])
        last = end <= hi
        sop_hi = bool(upper) and last and end <= lo + 64
        beats.append((int.from_bytes(stream[lo:hi], "little"), (end - lo) if last else BEAT, last,
                      len(frames[k0]), sop_hi, len(frames[upper[0][0]]) if sop_hi else 0))
    return beats


@pytest.mark.parametrize("segments", [False, True], ids=["beat", "segments"])
def test_icrc_inserter_matches_model(segments):
    """Every frame leaves with the ICRC the golden model (zlib) computes, whatever its length,
    also when frames share beats (the next frame starting at lane 64)."""
    dut = IcrcInserter(num_qps=4, num_cqs=4)
    frames = _frames()
    if segments:                     # lengths whose last beat leaves room for the next frame
        short = [f for f in frames if len(f) < 512]          # (the long ones are the beat case's)
        frames = [f for p in zip(short, reversed(short)) for f in p]
    beats = _beats(frames, segments)
    assert not segments or any(b[4] for b in beats)
    got = []

    async def bench(ctx):
        cur = None
        i = 0
        ctx.set(dut.o.ready, 1)
        while len(got) < len(frames):
            if i < len(beats):
                data, n, last, flen, sop_hi, flen_hi = beats[i]
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.p.data, data)
                ctx.set(dut.i.p.nbytes, n)
                ctx.set(dut.i.p.last, last)
                ctx.set(dut.i.p.frame, 1)
                ctx.set(dut.i.p.flen, flen)
                ctx.set(dut.i.p.sop_hi, sop_hi)
                ctx.set(dut.i.p.flen_hi, flen_hi)
            else:
                ctx.set(dut.i.valid, 0)
            await ctx.delay(1e-12)
            took = ctx.get(dut.i.valid) and ctx.get(dut.i.ready)
            if ctx.get(dut.o.valid):
                raw = ctx.get(dut.o.p.data).to_bytes(BEAT, "little")
                n = ctx.get(dut.o.p.nbytes)
                cur = (cur or bytearray()) + raw[:n]
                if ctx.get(dut.o.p.last):
                    got.append(bytes(cur))
                    cur = None
                if ctx.get(dut.o.p.sop_hi):
                    cur = bytearray(raw[64:])
            await ctx.tick()
            i += bool(took)

    _run(dut, bench)
    assert len(got) == len(frames)
    for f, g in zip(frames, got):
        assert g == f, f"frame of {len(f)} bytes: ICRC {g[-4:].hex()} != model {f[-4:].hex()}"
        assert g[-4:] == icrc(f[:-4])


@pytest.mark.parametrize("form", ["rdma_core", "nvshmem"])
def test_doorbell_decoder(form):
    """Both doorbell forms give index + ceil(ds/4); bad writes are dropped; a full queue stalls W."""
    dut = DoorbellDecoder(num_qps=8)

    def data(index, opcode, qpn, ds):
        ctrl = ((index << 8) | opcode).to_bytes(4, "big") + ((qpn << 8) | ds).to_bytes(4, "big")
        return int.from_bytes(ctrl, "little")

    writes = [  # (addr, data, expected event or None)
        ((5 << 12) | 0x800, data(10, 0x08, 5, 6) if form == "rdma_core" else data(12, 0, 5, 0), (5, 12)),
        ((5 << 12) | 0x900, data(0xFFFF, 0x08, 5, 3) if form == "rdma_core" else data(0, 0, 5, 0),
         (5, 0)),                                          # 16-bit wrap
        ((5 << 12) | 0x808, data(1, 0, 5, 0), None),       # not the doorbell register
        ((4 << 12) | 0x800, data(1, 0, 5, 0), None),       # QPN does not match the page
        ((9 << 12) | 0x800, data(1, 0, 9, 0), None),       # no such QP
    ]
    events, stalls = [], []

    async def bench(ctx):
        ctx.set(dut.events.ready, 0)
        for addr, word, _ in writes:
            ctx.set(dut.bus.awaddr, addr)
            await _handshake(ctx, dut.bus.awvalid, dut.bus.awready)
            ctx.set(dut.bus.wvalid, 1)
            ctx.set(dut.bus.wdata, word)
            ctx.set(dut.bus.wstrb, 0xFF)
            ctx.set(dut.bus.wlast, 1)
            stalled = 0
            while True:
                await ctx.delay(1e-12)
                if ctx.get(dut.bus.wready):
                    break
                stalled += 1
                if stalled == 3:              # the event queue is full: W waited for it
                    ctx.set(dut.events.ready, 1)
                    continue
                await ctx.tick()
            stalls.append(stalled)
            if ctx.get(dut.events.valid) and ctx.get(dut.events.ready):
                events.append((ctx.get(dut.events.p.qpn), ctx.get(dut.events.p.limit)))
            await ctx.tick()
            ctx.set(dut.bus.wvalid, 0)
            ctx.set(dut.events.ready, 0)
            await _handshake(ctx, dut.bus.bready, dut.bus.bvalid)

    _run(dut, bench)
    assert events == [e for _, _, e in writes if e is not None]
    # a doorbell waits while the event queue is full (never dropped); a bad write does not
    assert stalls == [3 if e is not None else 0 for _, _, e in writes]


def test_payload_fetch_bursts():
    """Payload reads: aligned beats, never across 4 KiB, at most 32 beats, only with buffer room."""
    dut = PayloadFetch(num_qps=4, num_cqs=4, buffer_beats=64, max_burst_beats=32)
    msgs = [(0x1000_0005, 9000), (0x2000_0F80, 300), (0x3000_0000, 0)]
    ars = []

    async def bench(ctx):
        ctx.set(dut.messages_out.ready, 1)
        ctx.set(dut.dma.arready, 1)
        ctx.set(dut.payload.ready, 0)              # nothing drains: the buffer credit must stop reads
        for addr, n in msgs:
            ctx.set(dut.messages_in.p.kind, MessageKind.WRITE)
            ctx.set(dut.messages_in.p.addr, addr)
            ctx.set(dut.messages_in.p.length, n)
            await _handshake(ctx, dut.messages_in.valid, dut.messages_in.ready)
            for _ in range(40):
                await ctx.delay(1e-12)
                if ctx.get(dut.dma.arvalid):
                    ars.append((ctx.get(dut.dma.araddr), ctx.get(dut.dma.arlen) + 1))
                await ctx.tick()
            break                                   # the first message alone fills the buffer

    _run(dut, bench)
    assert ars[0] == (0x1000_0000, 32)               # 4 KiB boundary at 0x1000_1000
    assert ars[1] == (0x1000_1000, 32)
    assert sum(n for _, n in ars) <= 64, ars         # no read beyond the 64-beat buffer
    for a, n in ars:
        assert a % BEAT == 0 and (a // 4096) == ((a + n * BEAT - 1) // 4096)


def test_memory_region_table_matches_model():
    """Every key check (key, PD, rights, bounds at their edges, zero length) gives the golden
    model's answer, in order, with the results stream stalling at random."""
    from model.mr import MemoryRegion, check
    from rtl.responder.mr_table import MemoryRegionTable
    from spec.formats import Access
    rnd = random.Random(11)
    dut = MemoryRegionTable(num_mrs=16, pd_bits=8, tag_bits=16)
    regions = {}
    for i in range(16):
        if i % 5 == 4:
            continue                                         # never registered: invalid
        regions[i] = MemoryRegion(key=(i << 8) | rnd.randrange(256), base=rnd.randrange(1 << 40) & ~0xFFF,
                                  length=rnd.choice([1, 64, 4096, 1 << 20, (1 << 32) + 5]),
                                  access=rnd.randrange(16), pd=rnd.randrange(4), valid=(i % 7 != 6))
    reqs = []
    for k in range(400):
        i = rnd.randrange(16)
        r = regions.get(i) or MemoryRegion(key=i << 8, base=0, length=0, access=0, pd=0, valid=False)
        key = r.key if rnd.random() < 0.85 else r.key ^ rnd.choice([1, 0x80, 1 << 8])
        length = rnd.choice([0, 1, 8, 4096, r.length, r.length + 1]) % (1 << 32)
        addr = r.base + rnd.choice([0, 1, r.length - length, r.length - length + 1, -1, r.length])
        addr %= 1 << 64
        pd = r.pd if rnd.random() < 0.8 else rnd.randrange(4)
        access = rnd.choice([Access.REMOTE_WRITE, Access.REMOTE_READ, Access.REMOTE_ATOMIC, 0,
                             Access.REMOTE_WRITE | Access.LOCAL_WRITE])
        reqs.append((key, addr, length, access, pd))
    want = [check(regions.get((key >> 8) & 15), key, addr, length, access, pd)
            for key, addr, length, access, pd in reqs]
    assert len(set(want)) == 5, "the requests must reach every outcome"
    got = []

    async def bench(ctx):
        for i, r in regions.items():
            ctx.set(dut.commit.p.index, i)
            ctx.set(dut.commit.p.region, {"valid": int(r.valid), "key": r.key, "base": r.base,
                                          "length": r.length % (1 << 64), "access": r.access, "pd": r.pd})
            await _handshake(ctx, dut.commit.valid, dut.commit.ready)
        k = 0
        while len(got) < len(reqs):
            if k < len(reqs):
                key, addr, length, access, pd = reqs[k]
                ctx.set(dut.requests.valid, 1)
                ctx.set(dut.requests.p, {"key": key, "addr": addr, "length": length, "access": access,
                                         "pd": pd, "tag": k})
            else:
                ctx.set(dut.requests.valid, 0)
            ctx.set(dut.results.ready, rnd.random() < 0.7)
            await ctx.delay(1e-12)
            took = ctx.get(dut.requests.valid) and ctx.get(dut.requests.ready)
            if ctx.get(dut.results.valid) and ctx.get(dut.results.ready):
                got.append((ctx.get(dut.results.p.tag), ctx.get(dut.results.p.status)))
            await ctx.tick()
            k += bool(took)

    _run(dut, bench)
    assert [t for t, _ in got] == list(range(len(reqs)))
    for (t, status), w, r in zip(got, want, reqs):
        assert status == w, f"request {t} {r}: RTL {status}, model {w}"
