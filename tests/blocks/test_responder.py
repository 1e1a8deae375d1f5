"""The RC responder block (rtl/responder/responder.py) against the golden model (model/responder.py RcResponder).

WRITE request frames are built by the golden model, decoded by ``model.parse.parse_frame``
into the descriptor the receive header parser would give (that parser has its own test),
and driven back to back through the block, one or two per transfer as the dispatch
hands them over, with random stalls on every output. For every frame the block's
verdict, payload command (frames with payload only) and ACK/NAK must equal what
RcResponder does with the same frame. The block only gets WRITE requests that passed the frame-level
checks (``RxDispatch`` takes the others, and has its own test), so the traffic holds
only such frames.
"""
import random

from amaranth.sim import Simulator

from model.frames import Port, QpContext, build_write_frames
from model.mr import MemoryRegion
from model.parse import WRITE_OPCODES, parse_frame
from model.responder import RcResponder
from rtl.responder.responder import Responder, RxVerdict, RX_VERDICT_NAMES
from rtl.common.rx_packet import RxDrop
from spec.formats import AETH, BTH, OFF_BTH, OFF_EXT, Access, QpState, mtu_code, read_field

NUM_QPS = 16
A_MAC, A_IP = 0x02000000000A, 0x0A000001          # requester
B_PORT = Port(smac=0x02000000000B, sip=0x0A000002)  # responder (this block)
A_PORT = Port(smac=A_MAC, sip=A_IP)
PD = 5
DST = 0x1000_0000
KEY = (0x12 << 8) | 0x5A
KEY_RO = (0x13 << 8) | 0x11       # no remote write
KEY_PD = (0x14 << 8) | 0x22       # another PD
REGIONS = [
    MemoryRegion(key=KEY, base=DST, length=1 << 20, access=Access.LOCAL_WRITE | Access.REMOTE_WRITE, pd=PD),
    MemoryRegion(key=KEY_RO, base=DST, length=1 << 20, access=Access.LOCAL_WRITE | Access.REMOTE_READ, pd=PD),
    MemoryRegion(key=KEY_PD, base=DST, length=1 << 20, access=Access.REMOTE_WRITE, pd=PD + 1),
]


def descriptor(frame):
    """The RxPacket fields the header parser gives for the WRITE request ``frame`` (as a dict)."""
    p, reason = parse_frame(frame, WRITE_OPCODES)
    assert p is not None, reason            # the block only gets frames that passed these checks
    d = {"drop": RxDrop.NONE, "opcode": p.opcode, "dqpn": p.dqpn, "psn": p.psn, "ackreq": int(p.ackreq),
         "has_reth": int(p.reth is not None), "has_imm": int(p.imm is not None),
         "has_aeth": int(p.aeth is not None), "payload_len": len(p.payload),
         "payload_offset": 54 + 16 * (p.reth is not None) + 4 * (p.imm is not None)}
    if p.reth:
        d["reth"] = dict(zip(("va", "rkey", "dma_len"), p.reth))
    return d


def build_traffic(rnd, qps):
    """WRITE frames of several QPs interleaved, with duplicates, gaps, access violations
    and unknown QPs mixed in."""
    streams = {}
    for qpn, (req, mtu) in qps.items():
        psn, frames = req.start_psn, []
        for k in range(rnd.randrange(14, 20)):
            n = rnd.choice([0, 1, 8, 64, mtu - 1, mtu, mtu + 1, 2 * mtu, 3 * mtu - 5])
            key = KEY
            if qpn == 3 and k == 12:
                key = rnd.choice([KEY_RO, KEY_PD, KEY + 1])      # rights, PD, wrong key
            va = DST + rnd.randrange(0, 4096)
            if qpn == 2 and k == 13:
                va = DST + (1 << 20) - n // 2 - 1                 # runs past the region
            fr = build_write_frames(req, A_PORT, va, key, bytes(rnd.randrange(256) for _ in range(n)), psn)
            psn = (psn + len(fr)) & 0xFFFFFF
            frames += fr
        streams[qpn] = frames
    out, sent = [], []
    while any(streams.values()):
        qpn = rnd.choice([q for q, s in streams.items() if s])
        f = streams[qpn].pop(0)
        r = rnd.random()
        if r < 0.06 and sent:
            out.append(rnd.choice(sent))                           # a duplicate of an old frame
        if r > 0.95 and len(streams[qpn]) >= 2:
            # a gap: f is lost the first time, the next two arrive out of order, then the
            # requester goes back to f (go-back-N)
            g = [streams[qpn].pop(0), streams[qpn].pop(0)]
            out += g
            streams[qpn][:0] = g
        out.append(f)
        sent.append(f)
        if 0.3 < r < 0.32:
            other = QpContext(qpn=0x40, remote_qpn=9, dmac=B_PORT.smac, dip=B_PORT.sip, mtu=256)
            out += build_write_frames(other, A_PORT, DST, KEY, b"x" * 8, 0)   # QP 9 was never created
        if 0.32 < r < 0.34:
            other = QpContext(qpn=0x40, remote_qpn=0x123, dmac=B_PORT.smac, dip=B_PORT.sip, mtu=256)
            out += build_write_frames(other, A_PORT, DST, KEY, b"y" * 8, 0)   # outside the table
    return out


def build_invalid(rnd, frames):
    """QPs 4 and 5 each get an invalid request, spliced into ``frames`` in order: on 4 a
    FIRST shorter than the responder's MTU (the requester's MTU is smaller), on 5 a MIDDLE
    outside a message. Each QP is then in the error state, so its next frame is refused.
    Returns {qpn: (start PSN, responder MTU)}."""
    qps = {}
    for qpn, req_mtu, mtu, psn in ((4, 256, 512, 0x10), (5, 256, 256, 0xFFFFFF)):
        req = QpContext(qpn=0x100 + qpn, remote_qpn=qpn, dmac=B_PORT.smac, dip=B_PORT.sip, start_psn=psn,
                        mtu=req_mtu)
        nxt = (psn + 1) & 0xFFFFFF
        fs = build_write_frames(req, A_PORT, DST, KEY, b"a" * 8, psn)             # accepted
        if qpn == 4:
            fs.append(build_write_frames(req, A_PORT, DST, KEY, bytes(3 * req_mtu), nxt)[0])   # FIRST, 256 < 512
        else:
            fs.append(build_write_frames(req, A_PORT, DST, KEY, bytes(3 * req_mtu), psn)[1])   # MIDDLE, PSN nxt
        fs += build_write_frames(req, A_PORT, DST, KEY, b"b" * 8, (psn + 2) & 0xFFFFFF)         # QP in error
        at = sorted(rnd.sample(range(len(frames) + 1), len(fs)))
        for i, (k, f) in enumerate(zip(at, fs)):
            frames.insert(k + i, f)
        qps[qpn] = (psn, mtu)
    return qps


def _set(ctx, sig, d):
    for k, v in d.items():
        f = getattr(sig, k)
        if isinstance(v, dict):
            _set(ctx, f, v)
        else:
            ctx.set(f, v)



def _set_pair(ctx, dut, frames):
    """Present one or two frames' descriptors as one transfer."""
    ctx.set(dut.packets.p.as_value(), 0)
    ctx.set(dut.packets.p.second, len(frames) == 2)
    for k, f in enumerate(frames):
        _set(ctx, dut.packets.p.p[k], descriptor(f))


def _lanes(verdict_valid, verdict):
    return [RxVerdict(verdict[k]) for k in range(2) if verdict_valid >> k & 1]


def _group(rnd, frames):
    """Split ``frames`` into the transfers of one or two the dispatch would make."""
    out, k = [], 0
    while k < len(frames):
        n = 2 if k + 1 < len(frames) and rnd.random() < 0.5 else 1
        out.append(frames[k:k + n])
        k += n
    return out


async def _setup(ctx, dut, qps, regions):
    """Create the QPs (qpn -> (expected PSN, MTU, state, ack_every)) and register the regions;
    the QPs that fatal errors move to ERR (``errors``, for the receive flush) are taken."""
    ctx.set(dut.errors.ready, 1)
    for qpn, (psn, mtu, state, ack_every) in qps.items():
        _set(ctx, dut.commit.p, {"qpn": qpn, "epsn": psn, "cfg": {
            "state": state, "pd": PD, "ack_every": ack_every, "mtu": mtu_code(mtu)}})
        ctx.set(dut.commit.valid, 1)
        await ctx.tick().until(dut.commit.ready)
        ctx.set(dut.commit.valid, 0)
    for r in regions:
        _set(ctx, dut.mr_commit.p, {"index": r.key >> 8, "region": {
            "valid": 1, "key": r.key, "base": r.base, "length": r.length, "access": r.access, "pd": r.pd}})
        ctx.set(dut.mr_commit.valid, 1)
        await ctx.tick().until(dut.mr_commit.ready)
        ctx.set(dut.mr_commit.valid, 0)

def test_responder_matches_model():
    rnd = random.Random(11)
    mtus = {1: 256, 2: 1024, 3: 512}
    qps, model = {}, RcResponder(B_PORT, ack_every=3)
    for qpn, mtu in mtus.items():
        psn = rnd.randrange(1 << 24) if qpn != 1 else 0xFFFFFD           # QP 1 wraps its PSN
        req = QpContext(qpn=0x100 + qpn, remote_qpn=qpn, dmac=B_PORT.smac, dip=B_PORT.sip, start_psn=psn, mtu=mtu)
        resp = QpContext(qpn=qpn, remote_qpn=0x100 + qpn, dmac=A_MAC, dip=A_IP, start_psn=psn, mtu=mtu,
                         state=QpState.RTR if qpn == 2 else QpState.RTS)
        model.add_qp(resp, PD, ack_every=qpn)                             # coalescing 1, 2, 3
        qps[qpn] = (req, mtu)
    for r in REGIONS:
        model.register(r)
    frames = build_traffic(rnd, qps)
    # every QP the block knows: qpn -> (start PSN, MTU, state, ack_every)
    created = {qpn: (qps[qpn][0].start_psn, mtu, QpState.RTR if qpn == 2 else QpState.RTS, qpn)
               for qpn, mtu in mtus.items()}
    for qpn, (psn, mtu) in build_invalid(rnd, frames).items():
        model.add_qp(QpContext(qpn=qpn, remote_qpn=0x100 + qpn, dmac=A_MAC, dip=A_IP, start_psn=psn, mtu=mtu),
                     PD, ack_every=1)
        created[qpn] = (psn, mtu, QpState.RTS, 1)
    expect = [model.receive(f) for f in frames]

    dut = Responder(num_qps=NUM_QPS, num_mrs=64, pd_bits=8)
    got_cmd, got_resp, got_verdict = [], [], []

    async def setup_and_drive(ctx):
        await _setup(ctx, dut, created, REGIONS)
        for group in _group(rnd, frames):
            while rnd.random() < 0.2:
                await ctx.tick()
            _set_pair(ctx, dut, group)
            ctx.set(dut.packets.valid, 1)
            await ctx.tick().until(dut.packets.ready)
            ctx.set(dut.packets.valid, 0)

    def collector(stream, out, fields):
        async def run(ctx):
            while True:
                ctx.set(stream.ready, rnd.random() < 0.7)
                await ctx.tick()

        async def sample(ctx):
            # values sampled at the clock edge: the transfer of the cycle that just ended
            async for _, _, valid, ready, payload in ctx.tick().sample(stream.valid, stream.ready, stream.p):
                if valid and ready:
                    out.extend({k: getattr(e, k) for k in fields} for e in payload.p[:1 + payload.second])
        return run, sample

    async def verdicts(ctx):
        async for _, _, v, verdict in ctx.tick().sample(dut.verdict_valid, dut.verdict):
            got_verdict.extend(_lanes(v, verdict))

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(setup_and_drive)
    for s, out, fields in ((dut.commands, got_cmd, ("write", "addr", "length")),
                           (dut.responses, got_resp, ("qpn", "psn", "syndrome", "msn"))):
        run, sample = collector(s, out, fields)
        sim.add_process(run)
        sim.add_process(sample)
    sim.add_process(verdicts)
    sim.run_until(2e-9 * (len(frames) * 12 + 2000))

    assert len(got_verdict) == len(frames), (len(got_verdict), len(frames))
    with_payload = [k for k, f in enumerate(frames) if descriptor(f)["payload_len"]]
    assert len(got_cmd) == len(with_payload)
    cmd_of = dict(zip(with_payload, got_cmd))
    want_resp = []
    for k, (f, e, v) in enumerate(zip(frames, expect, got_verdict)):
        p, _ = parse_frame(f, WRITE_OPCODES)
        assert RX_VERDICT_NAMES[v] == (e.reason or "accepted"), (k, v, e.reason)
        c = cmd_of.get(k)
        if c is None:
            assert not p.payload and not e.writes, (k, e.writes)      # nothing to write, no command
        elif e.writes:
            (addr, data), = e.writes
            assert c == {"write": 1, "addr": addr, "length": len(data)}, (k, c, e.writes)
        else:
            assert not c["write"], (k, c)
        if e.response is not None:
            r = e.response
            want_resp.append({"qpn": p.dqpn, "psn": read_field(BTH, "psn", r, OFF_BTH),
                              "syndrome": read_field(AETH, "syndrome", r, OFF_EXT),
                              "msn": read_field(AETH, "msn", r, OFF_EXT)})
    assert got_resp == want_resp
    counts = {n: sum(1 for v in got_verdict if RX_VERDICT_NAMES[v] == n) for n in RX_VERDICT_NAMES.values()}
    # the traffic exercised every decision
    for n in ("accepted", "qp_not_ready", "psn_duplicate", "psn_out_of_order", "access_error", "invalid_request"):
        assert counts[n] > 0, (n, counts)


def test_responder_two_per_cycle():
    """Back-to-back pairs, every output ready: a pair taken every cycle, whether its two
    packets are of one QP (lane 1 decides on lane 0's new context), of two QPs, or of
    QPs decided in the pair just before (the bypass), WRITEs without payload among
    them; and the verdicts, writes and ACKs as the model's."""
    model = RcResponder(B_PORT, ack_every=1)
    reqs = {}
    for qpn in (1, 2):
        psn = 0xFFFFF0 + qpn
        reqs[qpn] = QpContext(qpn=0x100 + qpn, remote_qpn=qpn, dmac=B_PORT.smac, dip=B_PORT.sip, start_psn=psn, mtu=256)
        model.add_qp(QpContext(qpn=qpn, remote_qpn=0x100 + qpn, dmac=A_MAC, dip=A_IP, start_psn=psn, mtu=256),
                     PD, ack_every=2)
    for r in REGIONS:
        model.register(r)
    psns = {q: r.start_psn for q, r in reqs.items()}
    frames = []
    for k in range(80):
        qpn = 1 if k < 30 or k % 2 else 2                          # 30 of QP 1, then alternating
        n = (0, 1, 8 + k)[k % 3]
        fs = build_write_frames(reqs[qpn], A_PORT, DST + 64 * k, KEY, bytes([k]) * n, psns[qpn])
        psns[qpn] = (psns[qpn] + 1) & 0xFFFFFF
        frames += fs
    expect = [model.receive(f) for f in frames]
    groups = [frames[k:k + 2] for k in range(0, len(frames), 2)]
    groups[7:8] = [[frames[14]], [frames[15]]]                    # single transfers between pairs

    dut = Responder(num_qps=NUM_QPS, num_mrs=64, pd_bits=8)
    got_verdict, got_cmd, got_resp, taken = [], [], [], []

    async def drive(ctx):
        ctx.set(dut.commands.ready, 1)
        ctx.set(dut.responses.ready, 1)
        await _setup(ctx, dut, {qpn: (req.start_psn, 256, QpState.RTS, 2) for qpn, req in reqs.items()},
                     REGIONS[:1])
        for g in groups:
            _set_pair(ctx, dut, g)
            ctx.set(dut.packets.valid, 1)
            _, _, ready = await ctx.tick().sample(dut.packets.ready)
            taken.append(ready)                        # taken at this edge, no wait
        ctx.set(dut.packets.valid, 0)

    async def monitor(ctx):
        async for _, _, v, verdict, cv, cp, rv, rp in ctx.tick().sample(
                dut.verdict_valid, dut.verdict, dut.commands.valid, dut.commands.p,
                dut.responses.valid, dut.responses.p):
            got_verdict.extend(_lanes(v, verdict))
            if cv:
                got_cmd.extend((c.write, c.addr, c.length) for c in cp.p[:1 + cp.second])
            if rv:
                got_resp.extend((r.qpn, r.psn, r.syndrome) for r in rp.p[:1 + rp.second])

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(drive)
    sim.add_process(monitor)
    sim.run_until(2e-9 * (len(frames) + 200))

    assert all(taken), taken
    assert [RX_VERDICT_NAMES[v] for v in got_verdict] == [e.reason or "accepted" for e in expect]
    assert got_cmd == [(1, e.writes[0][0], len(e.writes[0][1])) for e in expect if e.writes and e.writes[0][1]]
    want_resp = [(e.qpn, read_field(BTH, "psn", e.response, OFF_BTH), read_field(AETH, "syndrome", e.response, OFF_EXT))
                 for e in expect if e.response]
    assert got_resp == want_resp
    assert len(want_resp) >= 30
