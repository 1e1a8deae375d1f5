"""The responder's READ RESPONSE frames (``PayloadFetch`` into ``PacketBuilder(back_to_back=True)``,
wired as in ``ResponderPath``): once a frame's first beat has left, its other beats follow
in the very next cycles (``valid`` never drops inside a frame: MAC TX would underrun), and
every frame is the golden responder's (``model.read_atomic.build_read_responses``, ICRC
left as zeros).

GPU memory answers each burst in AR order after a fixed latency, its beats back to back;
between two bursts it may pause (``gap``), as the beats of other reads on the shared
``m_axi`` read port come between them (the atomic unit's, the requester's payload fetch's,
the receive queue's). MAC TX takes a beat at random (``p_ready``).

Every way the old builder broke the rule fails here: a 100-byte READ whose payload spans
two raw beats held its frame's last 34 bytes for a lane-64 merge a cycle after its first
beat left (the fault matrix's 162-byte underrun); a frame flushed from a long residual held
its last bytes the same way; and a packet whose payload crosses a burst boundary started
before the second burst arrived.
"""
import random

import pytest
from amaranth.hdl import Elaboratable, Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from model.frames import Port, QpContext
from model.read_atomic import build_read_responses
from rtl.requester.message import MessageKind
from rtl.requester.packet_builder import PacketBuilder
from rtl.requester.payload_fetch import PayloadFetch
from spec.params import DATA_BYTES as BEAT, SEGMENT_BYTES as SEG

BASE = 0x1000_0000
MEMORY = bytes(random.Random(1).randrange(256) for _ in range(0x6000))
PORT = Port(smac=0x020000000001, sip=0x0A000001)
MTU_CODE = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}
LATENCY = 12                      # cycles from AR to the burst's first beat


class _ReadResponses(Elaboratable):
    """The fetch and the builder, connected as in ``ResponderPath`` (without its message queue)."""
    def __init__(self, buffer_beats=64):
        self.fetch = PayloadFetch(num_qps=8, num_cqs=8, buffer_beats=buffer_beats, max_burst_beats=32, arid=3)
        self.builder = PacketBuilder(num_qps=8, num_cqs=8, merge_messages=False, back_to_back=True,
                                     buffer_beats=buffer_beats)

    def elaborate(self, platform):
        m = Module()
        m.submodules.fetch, m.submodules.builder = f, b = self.fetch, self.builder
        wiring.connect(m, f.messages_out, b.messages)
        wiring.connect(m, f.payload, b.payload)
        m.d.comb += [b.payload_level.eq(f.level), b.port_mac.eq(PORT.smac), b.port_ip.eq(PORT.sip),
                     b.inline.valid.eq(0)]
        return m


def _run(reads, *, gap, p_ready, seed):
    """Send ``reads`` ((qpn, offset, length, mtu, psn, msn) each) through; the frames (bytes,
    ICRC as zeros) and the cycles a frame was open on the output with ``valid`` low."""
    rnd = random.Random(seed)
    top = _ReadResponses()
    f, b = top.fetch, top.builder
    frames, bubbles = [], []

    async def bench(ctx):
        pending = list(reads)
        bursts = []                   # [cycle its first beat may go, address, beats left]
        r_free_at = 0                 # the R channel's next beat no earlier than this cycle
        cur, open_frame = None, False
        for cycle in range(40 * sum(1 + n // BEAT for _, _, n, _, _, _ in reads) + 2000):
            # drive this cycle's inputs
            if pending:
                qpn, off, n, mtu, psn, msn = pending[0]
                p = f.messages_in.p
                ctx.set(p.as_value(), 0)
                ctx.set(p.kind, MessageKind.READ_RESPONSE)
                ctx.set(p.qpn, qpn)
                ctx.set(p.signaled, 1)
                ctx.set(p.cfg.dmac, 0x020000000010 + qpn)
                ctx.set(p.cfg.dip, 0x0A000010 + qpn)
                ctx.set(p.cfg.remote_qpn, 0x100 + qpn)
                ctx.set(p.cfg.mtu, MTU_CODE[mtu])
                ctx.set(p.addr, BASE + off)
                ctx.set(p.length, n)
                ctx.set(p.psn, psn)
                ctx.set(p.rkey, msn)
            ctx.set(f.messages_in.valid, bool(pending))
            ctx.set(f.dma.arready, 1)
            beat = bool(bursts) and bursts[0][0] <= cycle and r_free_at <= cycle
            if beat:
                addr = bursts[0][1]
                ctx.set(f.dma.rdata, int.from_bytes(MEMORY[addr - BASE:addr - BASE + BEAT], "little"))
                ctx.set(f.dma.rid, 3)
                ctx.set(f.dma.rlast, bursts[0][2] == 1)
            ctx.set(f.dma.rvalid, bool(beat))
            ready = rnd.random() < p_ready
            ctx.set(b.frames.ready, ready)
            await ctx.delay(1e-12)
            # what this cycle's edge takes
            if pending and ctx.get(f.messages_in.ready):
                pending.pop(0)
            if ctx.get(f.dma.arvalid):
                bursts.append([cycle + LATENCY, ctx.get(f.dma.araddr), ctx.get(f.dma.arlen) + 1])
            if beat:
                assert ctx.get(f.dma.rready)
                bursts[0][1] += BEAT
                bursts[0][2] -= 1
                if bursts[0][2] == 0:
                    bursts.pop(0)
                    r_free_at = cycle + 1 + gap(rnd)      # other reads' beats in between
            valid = ctx.get(b.frames.valid)
            if open_frame and not valid:
                bubbles.append(cycle)
            if valid and ready:
                o = ctx.get(b.frames.p)
                assert o.frame, "a READ RESPONSE message makes no marker beat"
                data = o.data.to_bytes(BEAT, "little")
                if cur is None:
                    cur = bytearray()
                if o.last:
                    cur += data[:o.nbytes if not o.sop_hi else min(o.nbytes, SEG)]
                    frames.append(bytes(cur))
                    cur = None
                    if o.sop_hi:              # a frame starts at lane 64 (a READ's next packet)
                        assert not o.end_hi, "a READ RESPONSE frame of at most 64 bytes never starts at lane 64"
                        cur = bytearray(data[SEG:])
                else:
                    cur += data
                open_frame = cur is not None
            await ctx.tick()
            if not pending and not bursts and len(frames) == sum(max(1, -(-n // mtu)) for _, _, n, mtu, _, _ in reads):
                break

    sim = Simulator(top)
    sim.add_clock(2e-9)
    sim.add_testbench(bench)
    sim.run()
    return frames, bubbles


def _want(reads):
    out = []
    for qpn, off, n, mtu, psn, msn in reads:
        qp = QpContext(qpn=qpn, remote_qpn=0x100 + qpn, dmac=0x020000000010 + qpn, dip=0x0A000010 + qpn, mtu=mtu)
        out += [fr[:-4] + bytes(4) for fr in build_read_responses(qp, PORT, MEMORY[off:off + n], psn, msn)]
    return out


def _check(reads, *, gap, p_ready, seed=0):
    frames, bubbles = _run(reads, gap=gap, p_ready=p_ready, seed=seed)
    assert not bubbles, f"valid dropped inside a frame in cycles {bubbles[:8]} (MAC TX would underrun)"
    assert frames == _want(reads)


def test_tail_of_two_raw_beats():
    """The fault matrix's frame: a 100-byte READ ONLY (162 bytes) whose payload starts 40
    bytes into a raw beat: its first beat (58 header bytes, 70 payload) leaves with the first
    raw beat, its last 34 bytes must leave in the next cycle, not be held for lane 64."""
    _check([(1, 0x1F00 + 40, 100, 1024, 0x30, 7)], gap=lambda r: 0, p_ready=1.0)


def test_tail_after_a_flush():
    """A 197-byte READ ONLY (262 bytes) from 59 bytes into a raw beat: the first raw beat's
    69 bytes leave no full beat behind the 58 header bytes, the second's 128 leave 262 to
    send (two beats and 6 bytes); those 6 go right after the second beat, not held."""
    _check([(3, 0x2000 + 59, 197, 4096, 0x50, 11)], gap=lambda r: 0, p_ready=1.0)


def test_packet_across_a_burst_boundary():
    """A 2 MTU + 100 READ (MTU 1024) whose second packet crosses the 4 KiB boundary, so its
    beats come from two bursts with 30 cycles of other reads between them: that packet
    starts only once the second burst has arrived."""
    _check([(2, 0x1000 - 1500, 2 * 1024 + 100, 1024, 0x40, 9)], gap=lambda r: 30, p_ready=1.0)


@pytest.mark.parametrize("seed", range(3))
def test_random_reads(seed):
    """READs of 0 B .. 3 MTU + 5 at random offsets and MTUs, pauses of 0..40 cycles between
    bursts, MAC TX ready at random."""
    rnd = random.Random(seed)
    reads = []
    for k in range(24):
        mtu = rnd.choice([256, 1024, 4096])
        n = rnd.choice([0, 1, 8, 60, 100, 130, mtu - 1, mtu, mtu + 1, 2 * mtu + 100, 3 * mtu + 5])
        off = rnd.randrange(len(MEMORY) - n)
        reads.append((1 + k % 4, off, n, mtu, rnd.randrange(1 << 24), rnd.randrange(1 << 24)))
    _check(reads, gap=lambda r: r.choice([0, 0, 1, 3, 17, 40]), p_ready=0.8, seed=seed)
