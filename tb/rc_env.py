"""The NIC as RC responder, with the golden model as its peer requester: the peer's
traffic (faults mixed in), the environment with its QPs and memory regions, and the
frame-by-frame, byte-by-byte and counter check against ``RcResponder``. Shared by the
receive suites (tb/suites/rc.py) and the receive benchmark (tb/suites/bench.py)."""
from collections import Counter


from model.cqe import CqContext
from model.frames import Port, QpContext, build_write_frames
from model.memory import SparseMemory
from model.mr import MemoryRegion
from model.responder import RcResponder
from spec import params as P
from spec.formats import DROP_REASONS, OFF_BTH, Access, Op
from tb.env import NicEnv, PORT_IP, PORT_MAC, peer_ip, peer_mac
from .clock import ClockCycles


PD = 7
DST = 0x2000_0000
KEY = (0x21 << 8) | 0x5A
KEY_RO = (0x22 << 8) | 0x11                       # no remote write
KEY_PD = (0x23 << 8) | 0x22                       # another PD
KEY_ATOMIC = (0x24 << 8) | 0x33                   # remote write and remote atomic
REGION_LEN = 1 << 20
RNR_TIMER = 1                                     # the QPs' RNR NAK timer code
REGIONS = [
    MemoryRegion(key=KEY, base=DST, length=REGION_LEN, access=Access.LOCAL_WRITE | Access.REMOTE_WRITE, pd=PD),
    MemoryRegion(key=KEY_RO, base=DST, length=REGION_LEN, access=Access.REMOTE_READ, pd=PD),
    MemoryRegion(key=KEY_PD, base=DST, length=REGION_LEN, access=Access.REMOTE_WRITE | Access.REMOTE_ATOMIC,
                 pd=PD + 1),
    MemoryRegion(key=KEY_ATOMIC, base=DST, length=REGION_LEN, access=Access.REMOTE_WRITE | Access.REMOTE_ATOMIC,
                 pd=PD),
]


def peer_port(q):
    return Port(smac=peer_mac(q), sip=peer_ip(q))


def traffic(rnd, peers, messages, *, faults=True, aligned=False):
    """Frames of the peer requesters, interleaved per message; with ``faults`` also
    duplicates, a lost frame with the next two out of order and then resent from it
    (go-back-N), damaged frames, access violations, frames for unknown QPs and frames
    addressed to another port (MAC or IPv4 address)."""
    streams = {}
    for q, (ctx, mtu) in peers.items():
        psn, frames = ctx.start_psn, []
        for k in range(messages):
            n = 2 * mtu + 3 if k == 1 else rnd.choice([0, 1, 8, 64, 150, mtu - 1, mtu, mtu + 1, 2 * mtu + 3])
            va = DST + 0x4000 * (q * messages + k) + (0 if aligned else rnd.randrange(128))
            key = KEY
            if faults and q == 3 and k == messages - 2:
                key = rnd.choice([KEY_RO, KEY_PD, KEY + 1])           # rights, PD or key wrong
            if faults and q == 2 and k == messages - 1:
                va = DST + REGION_LEN - max(n // 2, 1)                 # runs past the region
            fr = build_write_frames(ctx, peer_port(q), va, key, bytes(rnd.randrange(256) for _ in range(n)), psn)
            psn = (psn + len(fr)) & 0xFFFFFF
            frames.append(fr)
        streams[q] = frames
    out, sent = [], []
    taken = dict.fromkeys(streams, 0)
    while any(streams.values()):
        q = rnd.choice([q for q, s in streams.items() if s])
        msg = streams[q].pop(0)
        taken[q] += 1
        i = 0
        while i < len(msg):
            f = msg[i]
            r = rnd.random() if faults else 1.0
            if faults and taken[q] == 2 and i == 0:
                r = 0.05                                               # every QP's 2nd message sees a gap
            if r < 0.05 and sent:
                out.append(rnd.choice(sent))                           # a duplicate
            if 0.05 <= r < 0.11 and i + 1 < len(msg):
                out += msg[i + 1:i + 3]                                # f lost: a gap, then go-back-N
            if 0.11 <= r < 0.14:
                bad = bytearray(f)
                bad[rnd.randrange(14, len(bad))] ^= 1 << rnd.randrange(8)
                out.append(bytes(bad))                                 # damaged on the wire
            if 0.14 <= r < 0.16:
                other = QpContext(qpn=0x77, remote_qpn=rnd.choice([9, 0x3FF, 0x123456]), dmac=PORT_MAC,
                                  dip=PORT_IP, mtu=256)
                out += build_write_frames(other, peer_port(1), DST, KEY, b"z" * 8, 0)   # no such QP here
            if 0.16 <= r < 0.18:
                # for another port: another destination MAC, or another IPv4 address
                if rnd.random() < 0.5:
                    out.append(bytes([f[0] ^ 0x80]) + f[1:])
                else:
                    ctx, _ = peers[q]
                    other = QpContext(qpn=ctx.qpn, remote_qpn=q, dmac=PORT_MAC, dip=PORT_IP ^ 0x100, mtu=ctx.mtu)
                    out += build_write_frames(other, peer_port(q), DST, KEY, b"y" * 8, 0)
            out.append(f)
            sent.append(f)
            i += 1
    return out


async def responder_env(dut, rnd, mtus, ack_every, *, image=None, resources=None, answer_at_once=True,
                        two_sided=False, recv_qps=(), **env_kw):
    """The NIC with RC QPs (QP q: MTU ``mtus[q]``, ``ack_every[q]``) and the regions, and
    the golden responder of the same set-up. ``image``: a ``SparseMemory`` that holds what
    the model expects GPU memory to hold (``run_and_check`` keeps it): the model then
    executes READs and atomics too, on that image, as the engine does. ``resources``: QP q's
    responder resources (max_dest_rd_atomic; default 16); ``answer_at_once=False``: the
    model holds them until ``run_and_check`` says the answers have left (``answered_at``).
    ``two_sided``: the model takes SENDs too (the QPs have no receive queue: each SEND that
    needs a receive WQE is answered by an RNR NAK, as the NIC does); ``recv_qps``: those QPs
    have a receive queue (16 WQEs of 64 bytes) with nothing posted (every such SEND is RNR
    NAKed after the engine read its doorbell record)."""
    resources = resources or {}
    env = await NicEnv(dut, **env_kw).start()
    cq = await env.cq(0, 6)
    read = image.read if image is not None else env.mem.read if two_sided else None
    cqs = {cq.cqn: CqContext(cq.cqn, 6, base=cq.base)} if recv_qps else None
    model = RcResponder(Port(smac=PORT_MAC, sip=PORT_IP), remote_ops=image is not None, two_sided=two_sided,
                        read_memory=read, answer_at_once=answer_at_once, cqs=cqs)
    peers = {}
    for q, mtu in mtus.items():
        psn = 0xFFFFF0 if q == 1 else rnd.randrange(1 << 24)          # QP 1 wraps its PSN
        limit = resources.get(q, P.MAX_DEST_RD_ATOMIC)
        recv = dict(recv=(4, 6), rcq=cq) if q in recv_qps else {}
        qp = await env.qp(q, cq, mtu=mtu, remote_qpn=0x100 + q, rq_psn=psn, pd=PD, ack_every=ack_every[q],
                          max_dest_rd_atomic=limit, min_rnr_timer=RNR_TIMER, **recv)
        rq = dict(rq=qp.rq, rcqn=cq.cqn) if q in recv_qps else {}
        model.add_qp(QpContext(qpn=q, remote_qpn=0x100 + q, dmac=peer_mac(q), dip=peer_ip(q), start_psn=psn,
                               mtu=mtu, min_rnr_timer=RNR_TIMER, **rq), PD, ack_every=ack_every[q],
                     max_dest_rd_atomic=limit)
        peers[q] = (QpContext(qpn=0x100 + q, remote_qpn=q, dmac=PORT_MAC, dip=PORT_IP, start_psn=psn, mtu=mtu), mtu)
    for r in REGIONS:
        await env.ctl.register_mr(r.key, r.base, r.length, r.access, r.pd)
        model.register(r)
    return env, model, peers


async def run_and_check(env, model, frames, *, acks=(), settle=300, image=None, answered_at=(), answer_before=None,
                        parts=None):
    """``acks``: indices of frames that are ACKs for the NIC's requester side (the
    responder model does not take them; the NIC counts them as ACKs received).
    ``settle``: cycles after the last ACK for the last writes to land. ``image``: the
    model's memory (``responder_env``), GPU memory's initial words already in it.
    ``answered_at``: indices of frames sent only once every response to the frames before
    them is on the wire (the model is told so: ``answers_sent``); the rest go back to back.
    ``answer_before``: ``{k: [(qpn, j), ...]}``: frame k is sent only once the first answer
    (READ RESPONSE, ATOMIC ACK) of frame j, a READ or atomic of QP qpn and its oldest
    holding a responder resource, is on the wire; the model hears of that answer
    (``answers_sent(qpn, 1)``) before frame k.
    ``parts``: {index: label} of frames that start a part of the stream: sent once MAC RX
    has handed over the frames before them and their responses are on the wire (the model
    is not told: nothing it decides depends on it; the wire quiet for 200 cycles), and ``env.part_stalls[label]`` is then
    the MAC RX stall cycles of the part (from its first frame to the next part's)."""
    acks, answered_at, answer_before = set(acks), set(answered_at), answer_before or {}
    parts = dict(parts or {})
    env.part_stalls, label, stalls = {}, None, 0
    image = SparseMemory() if image is None else image
    expect, sent_before = [], {}
    wanted = {j for waits in answer_before.values() for _, j in waits}
    first_answer, tally = {}, Counter()        # frame j -> (its first answer's bytes, how many such before it)
    for k, f in enumerate(frames):
        if k in answered_at:
            model.answers_sent()
            sent_before[k] = sum(len(e.frames_out) for e in expect)
        for qpn, _ in answer_before.get(k, ()):
            model.answers_sent(qpn, 1)
        if k not in acks:
            e = model.receive(f)
            for addr, data in e.writes:     # in order: an atomic reads what came before it
                image.write(addr, data)
            expect.append(e)
            if k in wanted:
                assert e.frames_out, f"frame {k}, which a later frame waits on, has no answer"
                first_answer[k] = (e.frames_out[0], tally[e.frames_out[0]] + 1)
            tally.update(e.frames_out)
    on_wire = _WireTally(env)
    for k, f in enumerate(frames):
        if k in answered_at or k in parts:
            while not env.rx.idle:
                await ClockCycles(env.dut.clk, 16)
        if k in answered_at:
            await env.wire.wait_frames(sent_before[k], timeout_cycles=20_000)
        for _, j in answer_before.get(k, ()):
            await on_wire.wait(*first_answer[j], what=f"the answer to frame {j} (frame {k} waits on it)")
        if k in parts:
            # (coalesced ACKs never come: wait until the wire has been quiet a while)
            while True:
                n = len(env.wire.frames)
                await ClockCycles(env.dut.clk, 200)
                if len(env.wire.frames) == n:
                    break
            if label is not None:
                env.part_stalls[label] = env.rx.stall_cycles - stalls
            label, stalls = parts[k], env.rx.stall_cycles
        env.rx.send(f)
    responses = [f for e in expect for f in e.frames_out]      # ACK/NAKs, ATOMIC ACKs, READ responses
    while not env.rx.idle:
        await ClockCycles(env.dut.clk, 64)
    if label is not None:
        env.part_stalls[label] = env.rx.stall_cycles - stalls
    try:
        await env.wire.wait_frames(len(responses), timeout_cycles=20_000)
    except TimeoutError:
        pass                    # (the frame-by-frame compare says which response is missing)
    await ClockCycles(env.dut.clk, settle)                # the last writes reach memory
    got = [f.data for f in env.wire.frames]
    merged = match_coalesced(got, responses)
    # GPU memory: every accepted payload in place, nothing else written
    lo = DST
    hi = DST + REGION_LEN
    span, want_span = env.mem.read(lo, hi - lo), image.read(lo, hi - lo)
    if span != want_span:
        addr = lo + next(i for i, (x, y) in enumerate(zip(span, want_span)) if x != y)
        raise AssertionError(f"GPU memory at {addr:#x}: {span[addr - lo]:#04x}, expected {want_span[addr - lo]:#04x}")
    c = await env.ctl.read_counters()
    mc = model.counters
    want = {"rx_accepted": mc.accepted, "acks_sent": mc.acks_sent - merged, "acks_coalesced": merged,
            "naks_sent": sum(mc.naks_sent.values()), "rnr_naks_sent": mc.rnr_naks}
    for reason in DROP_REASONS:
        want[f"rx_{reason}"] = mc.dropped[reason]
    diff = {k: (c[k], v) for k, v in want.items() if c[k] != v}
    assert not diff, f"counters (RTL, model) that differ: {diff}"
    assert c["rx_ack_received"] == len(acks)
    return expect, c


class _WireTally:
    """How often each frame has been seen on MAC TX so far, counted as the wire grows."""
    def __init__(self, env):
        self.env, self.seen, self.count = env, 0, Counter()

    async def wait(self, data, times, *, what, timeout_cycles=20_000):
        """Until ``data`` has been on the wire ``times`` times."""
        for _ in range(0, timeout_cycles, 8):
            frames = self.env.wire.frames
            self.count.update(fr.data for fr in frames[self.seen:])
            self.seen = len(frames)
            if self.count[data] >= times:
                return
            await ClockCycles(self.env.dut.clk, 8)
        raise AssertionError(f"{what} was not on the wire within {timeout_cycles} cycles")


def match_coalesced(got, want):
    """Hold the ACK/NAK frames sent (``got``) to the model's (``want``): the same, in order,
    except that a re-ACK identical to the one before it may be missing (``AckCoalescer``
    drops those while the ACK queue is full). Returns how many are missing."""
    j, last, merged = 0, None, 0
    for k, w in enumerate(want):
        if j < len(got) and got[j] == w:
            last, j = w, j + 1
        elif w == last and w[OFF_BTH] == Op.ACK and w[54] >> 5 == 0:    # an ACK like the last one
            merged += 1
        else:
            g = got[j].hex() if j < len(got) else "nothing"
            raise AssertionError(f"response {k} of {len(want)}: RTL sends {g}, the model {w.hex()}")
    assert j == len(got), f"{len(got) - j} ACK/NAK frames more than the model's"
    return merged


def not_roce(n, k):
    """An n-byte Ethernet frame of another EtherType (dropped as not RoCE)."""
    head = PORT_MAC.to_bytes(6, "big") + peer_mac(1).to_bytes(6, "big") + b"\x88\xb5"
    return (head + bytes((k + i) & 0xFF for i in range(n)))[:n]
