"""System regressions of the receive side (cocotb): the NIC as RC responder.

A peer requester is played by the golden model (model/rc.py): its frames enter on
MAC RX at the 400G line rate, with duplicates, gaps and go-back-N resends, damaged
frames, access violations and frames for QPs that are not ready mixed in. The model
responder (``RcResponder``) sees the same frames; the NIC's ACK/NAK frames on MAC TX,
the bytes in GPU memory and the receive counters must equal its.
"""
import random

import cocotb
from cocotb.triggers import ClockCycles

from model.frames import Port, QpContext, build_write_frames
from model.mr import MemoryRegion
from model.rc import RcResponder, build_response
from spec.formats import Access, Aeth
from tb.env import NicEnv, PORT_IP, PORT_MAC, peer_ip, peer_mac

PD = 7
DST = 0x2000_0000
KEY = (0x21 << 8) | 0x5A
KEY_RO = (0x22 << 8) | 0x11                       # no remote write
KEY_PD = (0x23 << 8) | 0x22                       # another PD
REGION_LEN = 1 << 20
REGIONS = [
    MemoryRegion(key=KEY, base=DST, length=REGION_LEN, access=Access.LOCAL_WRITE | Access.REMOTE_WRITE, pd=PD),
    MemoryRegion(key=KEY_RO, base=DST, length=REGION_LEN, access=Access.REMOTE_READ, pd=PD),
    MemoryRegion(key=KEY_PD, base=DST, length=REGION_LEN, access=Access.REMOTE_WRITE, pd=PD + 1),
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


async def responder_env(dut, rnd, mtus, ack_every):
    env = await NicEnv(dut).start()
    cq = await env.cq(0, 6)
    model = RcResponder(Port(smac=PORT_MAC, sip=PORT_IP))
    peers = {}
    for q, mtu in mtus.items():
        psn = 0xFFFFF0 if q == 1 else rnd.randrange(1 << 24)          # QP 1 wraps its PSN
        await env.qp(q, cq, mtu=mtu, remote_qpn=0x100 + q, rq_psn=psn, pd=PD, ack_every=ack_every[q])
        model.add_qp(QpContext(qpn=q, remote_qpn=0x100 + q, dmac=peer_mac(q), dip=peer_ip(q), start_psn=psn,
                               mtu=mtu), PD, ack_every=ack_every[q])
        peers[q] = (QpContext(qpn=0x100 + q, remote_qpn=q, dmac=PORT_MAC, dip=PORT_IP, start_psn=psn, mtu=mtu), mtu)
    for r in REGIONS:
        await env.ctl.register_mr(r.key, r.base, r.length, r.access, r.pd)
        model.register(r)
    return env, model, peers


async def run_and_check(env, model, frames, *, acks=()):
    """``acks``: indices of frames that are ACKs for the NIC's requester side (the
    responder model does not take them; the NIC counts them as ACKs received)."""
    acks = set(acks)
    expect = [model.receive(f) for k, f in enumerate(frames) if k not in acks]
    for f in frames:
        env.rx.send(f)
    responses = [e.response for e in expect if e.response is not None]
    while not env.rx.idle:
        await ClockCycles(env.dut.clk, 64)
    await env.wire.wait_frames(len(responses), timeout_cycles=20_000)
    await ClockCycles(env.dut.clk, 300)                   # the last writes reach memory
    got = [f.data for f in env.wire.frames]
    assert len(got) == len(responses), f"{len(got)} ACK/NAK frames, the model sends {len(responses)}"
    for k, (g, w) in enumerate(zip(got, responses)):
        assert g == w, f"response {k}: RTL {g.hex()} model {w.hex()}"
    # GPU memory: every accepted payload in place, nothing else written
    image = {}
    for e in expect:
        for addr, data in e.writes:
            for i, b in enumerate(data):
                image[addr + i] = b
    lo = DST
    hi = DST + REGION_LEN
    span = env.mem.read(lo, hi - lo)
    for addr in range(lo, hi):
        if span[addr - lo] != image.get(addr, 0):
            raise AssertionError(f"GPU memory at {addr:#x}: {span[addr - lo]:#04x}, "
                                 f"expected {image.get(addr, 0):#04x}")
    c = await env.ctl.read_counters()
    mc = model.counters
    want = {"rx_accepted": mc.accepted, "acks_sent": mc.acks_sent, "naks_sent": sum(mc.naks_sent.values())}
    for reason in ("bad_length", "not_roce", "bad_ip_checksum", "bad_icrc", "bad_pkey", "bad_opcode", "bad_address",
                   "qp_not_ready", "psn_duplicate", "psn_out_of_order", "access_error", "invalid_request"):
        want[f"rx_{reason}"] = mc.dropped[reason]
    diff = {k: (c[k], v) for k, v in want.items() if c[k] != v}
    assert not diff, f"counters (RTL, model) that differ: {diff}"
    assert c["rx_ack_received"] == len(acks)
    return expect, c


@cocotb.test()
async def responder_writes_with_faults(dut):
    """WRITEs of every shape from 3 peer QPs with faults mixed in: ACK/NAK frames, memory and counters as the model."""
    rnd = random.Random(5)
    env, model, peers = await responder_env(dut, rnd, {1: 256, 2: 1024, 3: 512}, {1: 1, 2: 2, 3: 4})
    frames = traffic(rnd, peers, 6)
    expect, c = await run_and_check(env, model, frames)
    reasons = {e.reason for e in expect}
    for r in (None, "psn_duplicate", "psn_out_of_order", "access_error", "qp_not_ready", "bad_address"):
        assert r in reasons, f"the traffic did not exercise {r}"
    dut._log.info(f"{len(frames)} frames, counters {c}, MAC RX stalls {env.rx.stall_cycles}")


@cocotb.test()
async def responder_line_rate(dut):
    """Back-to-back WRITEs of all sizes at the 400G line rate: MAC RX is never held back."""
    rnd = random.Random(9)
    env, model, peers = await responder_env(dut, rnd, {1: 4096, 3: 1024}, {1: 8, 3: 1})
    frames = traffic(rnd, peers, 8, faults=False, aligned=True)
    await run_and_check(env, model, frames)
    assert env.rx.stall_cycles == 0, f"MAC RX waited {env.rx.stall_cycles} cycles"


def _not_roce(n, k):
    """An n-byte Ethernet frame of another EtherType (dropped as not RoCE)."""
    head = PORT_MAC.to_bytes(6, "big") + peer_mac(1).to_bytes(6, "big") + b"\x88\xb5"
    return (head + bytes((k + i) & 0xFF for i in range(n)))[:n]


@cocotb.test()
async def rx_every_frame_size(dut):
    """Every frame size from 60 to 300 bytes (and longer ones), back to back at the 400G
    line rate: floods of 1500 frames for each size up to 75 bytes (not-RoCE frames; 62-byte
    ACKs, 74-byte WRITE ONLYs without payload and 75-byte ones with 1 byte, each the first
    half of one QP, then alternating between two QPs, so that two QPs' ACKs or requests
    end in one beat), which need more than one frame per cycle and would outrun a path
    taking one (its buffers hold about 100 such frames; each such WRITE is answered by
    its own ACK, each 1-byte one is its own write: a quarter each to one byte, to
    consecutive bytes, 256 bytes apart and at random, so the last value of a byte shows
    the order), runs of 16 WRITE ONLYs of each size from 76 bytes (2-226 payload bytes,
    alternating between two QPs), then a random mix. MAC RX is never held back, and ACK frames, memory and
    counters equal the model's. Icarus runs about 50 cycles a second on this design, so there the floods
    are 40 frames, the runs 1 and the mix 40 (the same checks on a shorter stream)."""
    rnd = random.Random(11)
    flood, run, mix = (1500, 16, 400) if cocotb.SIM_NAME.lower().startswith("verilator") else (40, 1, 40)
    env, model, peers = await responder_env(dut, rnd, {1: 4096, 3: 1024}, {1: 8, 3: 1})
    psn = {q: ctx.start_psn for q, (ctx, _) in peers.items()}
    va = [DST]

    def write(q, p, at=None):
        ctx, _ = peers[q]
        (f,) = build_write_frames(ctx, peer_port(q), va[0] if at is None else at, KEY,
                                  bytes(rnd.randrange(256) for _ in range(p)), psn[q])
        psn[q] = (psn[q] + 1) & 0xFFFFFF
        if at is None:
            va[0] += p + rnd.randrange(1, 64)
        return f

    def one_byte_at(k):
        # 1-byte WRITEs (75-byte frames, 1.01 a cycle): a quarter of the flood each to one
        # byte, to consecutive bytes, 256 bytes apart, at random (above what va[0] reaches)
        j = k % (flood // 4)
        return [DST + 0xE0005, DST + 0xE1000 + j, DST + 0xE2003 + 256 * j,
                DST + 0xFA000 + rnd.randrange(0x6000)][min(3, 4 * k // flood)]

    def ack(q):
        ctx, _ = peers[q]
        return build_response(QpContext(qpn=ctx.qpn, remote_qpn=q, dmac=PORT_MAC, dip=PORT_IP, mtu=ctx.mtu),
                              peer_port(q), rnd.randrange(1 << 24), Aeth.ACK, rnd.randrange(1 << 24))

    def frame(n, k):
        if n == 62:
            return ack(1 if k < flood // 2 or k % 2 else 3)
        if n == 74:
            return write(1 if k < flood // 2 or k % 2 else 3, 0)
        if n == 75:
            return write(1 if k < flood // 2 or k % 2 else 3, 1, one_byte_at(k))
        if n < 74:
            return _not_roce(n, k)
        return write(1 if k % 2 or n > 74 + 1024 else 3, n - 74)       # QP 3's MTU is 1024

    frames = [frame(n, k) for n in list(range(60, 301)) + [512, 1024, 1500, 1098]
              for k in range(flood if n <= 75 else run)]
    for k in range(mix):                     # a mix of every kind and size
        n = rnd.choice([rnd.randrange(60, 200), 62, rnd.randrange(74, 90)])
        frames.append(frame(n, k))
    acks = [k for k, f in enumerate(frames) if len(f) == 62]
    await run_and_check(env, model, frames, acks=acks)
    dut._log.info(f"{len(frames)} frames, MAC RX stalls {env.rx.stall_cycles}")
    assert env.rx.stall_cycles == 0, f"MAC RX waited {env.rx.stall_cycles} cycles"
