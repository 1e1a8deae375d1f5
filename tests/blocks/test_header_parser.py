# amaranth: UnusedElaboratable=no
"""RxHeaderParser in Amaranth's simulator, held to model/parse.py ``parse_frame``.

Frames come from the golden model (``build_rc_packet`` for every WRITE opcode with and
without immediate, ``build_response`` for ACK/NAK), from the smallest up to several
beats, plus bad ones for every drop reason and random header mutations. They are packed
back to back into the MAC RX quarter format by ``tb.rx_quarters.pack`` (frames start at
every quarter, up to two end per beat), with random bytes in the lanes no frame holds,
random ``ebytes``/``icrc_ok`` in quarters where no frame ends, and ``icrc_ok`` from the
golden model where one does (the ICRC checker is not in this test).
"""
import random

import pytest
from amaranth.sim import Simulator

from model.frames import Port, QpContext
from model.icrc import icrc, ipv4_checksum
from model.parse import WRITE_OPCODES, build_rc_packet, build_response, parse_frame
from model.read_atomic import build_atomic_ack, build_atomic_request, build_masked_atomic_request
from rtl.port.header_parser import RxHeaderParser
from rtl.common.rx_packet import RX_DROP_NAMES, RxDrop
from spec.formats import BTH, ETH, IPV4, OFF_BTH, OFF_IP, OFF_UDP, UDP, Aeth, Op, pack, read_field
from tb.rx_quarters import QUARTER, QUARTERS, pack as pack_beats

BEAT = QUARTER * QUARTERS
DROP = {name: drop for drop, name in RX_DROP_NAMES.items()}
# header bytes a frame of the opcode carries in front of its payload, ICRC included
OVERHEAD = {Op.WRITE_MIDDLE: 58, Op.WRITE_LAST: 58, Op.WRITE_LAST_IMM: 62, Op.WRITE_FIRST: 74,
            Op.WRITE_ONLY: 74, Op.WRITE_ONLY_IMM: 78}


# The receiving port (the parser's port_mac/port_ip): frames are addressed to it, but for
# the bad_address ones.
PORT = Port(smac=0x02A5A5A5A5A5, sip=0x0A0B0C0D)


# ---- frames ----------------------------------------------------------------------------
def _endpoints(rnd, dmac=PORT.smac, dip=PORT.sip):
    qp = QpContext(qpn=rnd.randrange(1 << 24), remote_qpn=rnd.randrange(1 << 24), dmac=dmac, dip=dip)
    return qp, Port(smac=rnd.randrange(1 << 48), sip=rnd.randrange(1 << 32))


def _write(rnd, opcode, size, **dest):
    qp, port = _endpoints(rnd, **dest)
    reth = None
    if opcode in (Op.WRITE_FIRST, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM):
        reth = (rnd.randrange(1 << 64), rnd.randrange(1 << 32), rnd.randrange(1 << 32))
    imm = rnd.randrange(1 << 32) if opcode in (Op.WRITE_LAST_IMM, Op.WRITE_ONLY_IMM) else None
    # (no IBTA pad: every frame size, as a peer that does not pad sends them; PadCnt is
    # set by hand below)
    return build_rc_packet(qp, port, opcode, rnd.randrange(1 << 24), rnd.randbytes(size), reth, imm,
                           ackreq=rnd.choice([None, True, False]), pad=False)


def _response(rnd, syndrome, **dest):
    qp, port = _endpoints(rnd, **dest)
    return build_response(qp, port, rnd.randrange(1 << 24), syndrome, rnd.randrange(1 << 24))


def _atomic(rnd, opcode, nbytes=8, **dest):
    """An atomic request (IBTA or this engine's masked form) or an ATOMIC ACK."""
    qp, port = _endpoints(rnd, **dest)
    psn, va, rkey = rnd.randrange(1 << 24), rnd.randrange(1 << 61) * 8, rnd.randrange(1 << 32)
    w = lambda: rnd.randrange(1 << (8 * nbytes))
    if opcode == Op.ATOMIC_ACK:
        return build_atomic_ack(qp, port, psn, rnd.randrange(1 << 24), rnd.randrange(1 << 64))
    if opcode in (Op.FETCH_ADD, Op.COMPARE_SWAP):
        return build_atomic_request(qp, port, opcode, va, rkey, w(), w() if opcode == Op.COMPARE_SWAP else 0, psn)
    n = 4 if opcode == Op.MASKED_COMPARE_SWAP else 2
    return build_masked_atomic_request(qp, port, opcode, va, rkey, [w() for _ in range(n)], nbytes, psn)


def _mutate(frame, edit, *, fix_csum=True, fix_icrc=True, relen=False):
    """``frame`` with ``edit(bytearray without ICRC)`` applied; then the IPv4/UDP lengths
    (``relen``), the IPv4 checksum and the ICRC recomputed as asked."""
    f = bytearray(frame[:-4])
    edit(f)
    if relen:
        pack(IPV4, f, OFF_IP, total_len=len(f) + 4 - OFF_IP)
        pack(UDP, f, OFF_UDP, length=len(f) + 4 - OFF_UDP)
    if fix_csum:
        pack(IPV4, f, OFF_IP, checksum=ipv4_checksum(f[OFF_IP:OFF_IP + 20]))
    return bytes(f) + (icrc(f) if fix_icrc and len(f) >= OFF_BTH + 12 else frame[-4:])


def _set(table, base, **fields):
    return lambda f: pack(table, f, base, **fields)


def _checksum_zero(rnd):
    """A WRITE whose IPv4 checksum computes to 0x0000 (ident chosen for it)."""
    f = bytearray(_write(rnd, Op.WRITE_ONLY, 8)[:-4])
    pack(IPV4, f, OFF_IP, ident=0, checksum=0)
    s = sum(int.from_bytes(f[OFF_IP + i:OFF_IP + i + 2], "big") for i in range(0, 20, 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    pack(IPV4, f, OFF_IP, ident=0xFFFF - s)
    assert ipv4_checksum(f[OFF_IP:OFF_IP + 20]) == 0
    return bytes(f) + icrc(f)


def _frames(rnd, n_fuzz=150):
    """Good and bad frames (shuffled): every opcode and size class, every drop reason."""
    good = []
    sizes = [0, 1, 2, 4, 8, 40, 54, 55, 56, 58, 60, 64, 100, 128, 150, 190, 300, 513]
    for op in sorted(WRITE_OPCODES):
        good += [_write(rnd, op, s) for s in sizes]
    good += [_response(rnd, s) for s in (Aeth.ACK, 0x00, Aeth.RNR_NAK, Aeth.NAK_PSN_SEQ, Aeth.NAK_INVALID_REQ,
                                         Aeth.NAK_REMOTE_ACCESS, Aeth.NAK_REMOTE_OP)]
    good.append(_write(rnd, Op.WRITE_ONLY, 4096))                          # 33 beats
    for op in (Op.FETCH_ADD, Op.COMPARE_SWAP, Op.ATOMIC_ACK):
        good += [_atomic(rnd, op) for _ in range(3)]
    for op in (Op.MASKED_FETCH_ADD, Op.MASKED_COMPARE_SWAP):
        good += [_atomic(rnd, op, nb) for nb in (4, 8, 8)]
    bad = []
    w = lambda op=Op.WRITE_ONLY, size=20: _write(rnd, op, size)
    ack = lambda: _response(rnd, Aeth.ACK)
    # PadCnt and SE: pad bytes leave the payload; PadCnt beyond the payload is bad_length
    for op, size, cnt in ((Op.WRITE_ONLY, 8, 3), (Op.WRITE_LAST_IMM, 5, 1), (Op.WRITE_MIDDLE, 1, 3),
                          (Op.WRITE_MIDDLE, 2, 2), (Op.WRITE_ONLY_IMM, 0, 1), (Op.WRITE_FIRST, 130, 2)):
        bad.append(_mutate(w(op, size), _set(BTH, OFF_BTH, flags=cnt << 4 | rnd.choice([0, 0x80]))))
    bad.append(_mutate(ack(), lambda f: (pack(BTH, f, OFF_BTH, flags=0x10), f.append(0)), relen=True))
    bad.append(_mutate(ack(), _set(BTH, OFF_BTH, flags=0x10)))             # pad byte missing
    # an atomic request or ATOMIC ACK carries nothing after its headers
    for op in (Op.FETCH_ADD, Op.MASKED_COMPARE_SWAP, Op.ATOMIC_ACK):
        bad.append(_mutate(_atomic(rnd, op), lambda f: f.append(0), relen=True))
        bad.append(_mutate(_atomic(rnd, op), lambda f: f.__delitem__(slice(-1, None)), relen=True))
    # Ethernet padding of 58/59-byte frames to 60 bytes, and 60-byte frames that lie
    for size in (0, 1):
        for op in (Op.WRITE_MIDDLE, Op.WRITE_LAST):
            f = w(op, size)
            bad.append(f + rnd.randbytes(60 - len(f)))
    f = w(Op.WRITE_MIDDLE, 0)
    bad.append(_mutate(f, _set(IPV4, OFF_IP, total_len=43)) + rnd.randbytes(2))   # 57 bytes in IP
    bad.append(_mutate(f, _set(IPV4, OFF_IP, total_len=47)) + rnd.randbytes(2))   # longer than the frame
    bad.append(f + rnd.randbytes(3))                                                # 61 bytes: no padding rule
    bad.append(w(Op.WRITE_MIDDLE, 2))                                              # 60 bytes, exact
    # too short for the headers
    bad += [w()[:k] for k in (1, 14, 42, 57)]
    # not RoCE
    bad.append(_mutate(w(), lambda f: f.__setitem__(slice(12, 14), b"\x86\xdd"), fix_icrc=False))
    bad.append(_mutate(w(), _set(IPV4, OFF_IP, ver_ihl=0x46)))
    bad.append(_mutate(w(), _set(IPV4, OFF_IP, ver_ihl=0x65)))
    bad.append(_mutate(w(), _set(IPV4, OFF_IP, proto=6)))
    bad.append(_mutate(w(), _set(IPV4, OFF_IP, flags_frag=0x2000)))        # MF
    bad.append(_mutate(w(), _set(IPV4, OFF_IP, flags_frag=0x4001)))        # fragment offset
    bad.append(_mutate(w(), _set(IPV4, OFF_IP, flags_frag=0x8000)))        # reserved bit: accepted
    bad.append(_mutate(w(), _set(IPV4, OFF_IP, flags_frag=0)))             # DF clear: accepted
    bad.append(_mutate(w(), _set(UDP, OFF_UDP, dport=4792)))
    # addressed to another port: MAC, IPv4 address, both; a multicast MAC; an ACK
    bad += [_write(rnd, Op.WRITE_ONLY, 20, dmac=PORT.smac ^ 1), _write(rnd, Op.WRITE_MIDDLE, 0, dip=PORT.sip ^ 0x100),
            _write(rnd, Op.WRITE_FIRST, 300, dmac=0, dip=0), _write(rnd, Op.WRITE_LAST, 8, dmac=0x01005E000001),
            _response(rnd, Aeth.ACK, dip=PORT.sip + 1)]
    # IPv4 checksum, including the 0x0000 / 0xFFFF edge
    bad.append(_mutate(w(), lambda f: f.__setitem__(OFF_IP + 11, f[OFF_IP + 11] ^ 1), fix_csum=False))
    bad.append(_mutate(w(), _set(IPV4, OFF_IP, proto=6), fix_csum=False))  # checksum before protocol
    z = _checksum_zero(rnd)
    bad += [z, _mutate(z, _set(IPV4, OFF_IP, checksum=0xFFFF), fix_csum=False)]
    # lengths
    for d in (-1, 1):
        f = w(size=30)
        tl = int.from_bytes(f[OFF_IP + 2:OFF_IP + 4], "big")
        ul = int.from_bytes(f[OFF_UDP + 4:OFF_UDP + 6], "big")
        bad.append(_mutate(f, _set(IPV4, OFF_IP, total_len=tl + d)))
        bad.append(_mutate(f, _set(UDP, OFF_UDP, length=ul + d)))
    bad.append(_mutate(w(Op.WRITE_MIDDLE, 8), _set(BTH, OFF_BTH, opcode=Op.WRITE_ONLY)))      # RETH cut
    bad.append(_mutate(w(Op.WRITE_MIDDLE, 19), _set(BTH, OFF_BTH, opcode=Op.WRITE_ONLY_IMM)))  # ImmDt cut
    bad.append(_mutate(w(Op.WRITE_MIDDLE, 20), _set(BTH, OFF_BTH, opcode=Op.WRITE_ONLY_IMM)))  # fits
    bad.append(_mutate(w(Op.WRITE_MIDDLE, 3), _set(BTH, OFF_BTH, opcode=Op.WRITE_LAST_IMM)))
    bad.append(_mutate(w(Op.WRITE_MIDDLE, 8), _set(BTH, OFF_BTH, opcode=Op.ACK)))             # ACK + payload
    bad.append(_mutate(w(Op.WRITE_MIDDLE, 3), _set(BTH, OFF_BTH, opcode=Op.ACK)))             # AETH cut
    # ICRC: a payload byte, a header byte it covers, the ICRC itself
    bad.append(_mutate(w(size=100), lambda f: f.__setitem__(-1, f[-1] ^ 0x40), fix_icrc=False))
    bad.append(_mutate(w(Op.WRITE_FIRST, 300), lambda f: f.__setitem__(OFF_BTH + 7, f[OFF_BTH + 7] ^ 1),
                       fix_icrc=False))
    f = ack()
    bad.append(f[:-1] + bytes([f[-1] ^ 0x80]))
    # P_Key and opcodes this NIC does not accept
    bad += [_mutate(w(), _set(BTH, OFF_BTH, pkey=k)) for k in (0x7FFF, 0x8001, 0)]
    # BTH TVer (flags bits 3:0) other than 0; and with a bad P_Key, which is checked first
    bad += [_mutate(w(), _set(BTH, OFF_BTH, flags=v)) for v in (0x01, 0x08, 0x0F)]
    bad.append(_mutate(w(), _set(BTH, OFF_BTH, flags=0x02, pkey=5)))
    bad += [_mutate(w(), _set(BTH, OFF_BTH, opcode=op)) for op in
            (0x15, 0x20, Op.READ_REQUEST, 0x0D, 0x12, 0x64, 0xFF)]     # (SENDs are taken: two-sided verbs)
    # two faults at once: the first in parse_frame's order wins
    bad.append(_mutate(w(), lambda f: (pack(IPV4, f, OFF_IP, proto=6), pack(BTH, f, OFF_BTH, pkey=1)),
                       fix_icrc=False))
    bad.append(_mutate(w(), lambda f: (pack(BTH, f, OFF_BTH, pkey=1, opcode=4)), fix_icrc=False))
    bad.append(_mutate(w(), lambda f: (pack(UDP, f, OFF_UDP, length=3), pack(BTH, f, OFF_BTH, opcode=4))))
    # random header mutations; the model says what they are
    for _ in range(n_fuzz):
        f = rnd.choice(good)
        nb = rnd.randrange(1, 4)
        hi = min(len(f) - 4, 78)

        cut = rnd.choice([0] * 6 + [-1, -3, 1, 2, 17])     # sometimes shorter or longer

        def edit(b, nb=nb, hi=hi, cut=cut):
            for _ in range(nb):
                b[rnd.randrange(hi)] = rnd.randrange(256)
            if cut < 0:
                del b[cut:]
            b += rnd.randbytes(max(cut, 0))
        bad.append(_mutate(f, edit, fix_csum=rnd.random() < 0.7, fix_icrc=rnd.random() < 0.7,
                           relen=rnd.random() < 0.3))
    frames = good + bad
    rnd.shuffle(frames)
    return frames


def _icrc_ok(f, rnd):
    """The ICRC verdict an ICRC checker gives: over the IPv4 packet when a 60-byte frame
    carries Ethernet padding behind it (as parse_frame checks it)."""
    if len(f) == 60:
        tl = int.from_bytes(f[OFF_IP + 2:OFF_IP + 4], "big")
        if tl < 60 - OFF_IP:
            f = f[:OFF_IP + tl]
    if len(f) < 58:
        return rnd.random() < 0.5          # never checked: must not matter
    return f[-4:] == icrc(f[:-4])


def _expect(f, opcodes):
    """Descriptor fields parse_frame implies for frame ``f`` (dict), and its payload."""
    p, reason = parse_frame(f, opcodes, PORT)
    e = {"drop": DROP[reason], "frame_len": min(len(f), 0xFFFF)}
    if p is None:
        e["payload_len"] = 0
        return e, None
    a = p.atomic
    ext = (16 * (p.reth is not None) + 4 * (p.imm is not None) + 4 * (p.aeth is not None)
           + 8 * (p.orig is not None) + (0 if a is None else 48 if "log_size" in a else 28))
    va, rkey, dma_len = p.reth or ((a["va"], a["rkey"], 0) if a else (0, 0, 0))
    if a is None:
        atomic = dict(has_atomic=0, log_size=0, ops=[0, 0, 0, 0])
    elif "log_size" in a:
        atomic = dict(has_atomic=1, log_size=a["log_size"], ops=[a[f"op{i}"] for i in range(4)])
    else:
        atomic = dict(has_atomic=1, log_size=3, ops=[a["swap_add"], a["compare"], 0, 0])
    syndrome, msn = p.aeth or (0, 0)
    e.update(opcode=p.opcode, se=f[OFF_BTH + 1] >> 7, padcnt=p.padcnt, dqpn=p.dqpn, ackreq=int(p.ackreq),
             psn=p.psn, has_reth=int(p.reth is not None), has_imm=int(p.imm is not None),
             has_aeth=int(p.aeth is not None), va=va, rkey=rkey, dma_len=dma_len, imm=p.imm or 0,
             syndrome=syndrome, msn=msn, payload_offset=54 + ext, payload_len=len(p.payload),
             orig=p.orig or 0, **atomic,
             smac=read_field(ETH, "smac", f), sip=read_field(IPV4, "sip", f, OFF_IP),
             # 1..4 payload bytes behind a RETH, within one 128-byte line: carried inline
             inline=int(p.reth is not None and p.imm is None and 1 <= len(p.payload) <= 4
                        and va % 128 + len(p.payload) <= 128))
    return e, p.payload


def _got(c):
    """Descriptor (a data.Const of RxPacket) as the dict ``_expect`` gives."""
    return {"drop": c.drop, "frame_len": c.frame_len, "payload_len": c.payload_len, "opcode": c.opcode,
            "se": c.se, "padcnt": c.padcnt, "dqpn": c.dqpn, "ackreq": c.ackreq, "psn": c.psn,
            "has_reth": c.has_reth, "has_imm": c.has_imm, "has_aeth": c.has_aeth, "va": c.reth.va,
            "rkey": c.reth.rkey, "dma_len": c.reth.dma_len, "imm": c.imm, "syndrome": c.aeth.syndrome,
            "msn": c.aeth.msn, "payload_offset": c.payload_offset, "smac": c.smac, "sip": c.sip,
            "inline": c.inline, "inline_data": c.inline_data, "orig": c.orig, "has_atomic": c.has_atomic,
            "log_size": c.atomic.log_size, "ops": [c.atomic.ops[i] for i in range(4)]}


def _sized(rnd, n):
    """A good frame of exactly ``n`` bytes (62..): an ACK for 62, else a WRITE of an
    opcode whose headers fit."""
    ops = [op for op, o in OVERHEAD.items() if o <= n]
    if n == 62 and rnd.random() < 0.5:
        return _response(rnd, Aeth.ACK)
    op = rnd.choice(ops)
    f = _write(rnd, op, n - OVERHEAD[op])
    assert len(f) == n
    return f


# ---- beats -------------------------------------------------------------------------------
def _beats(frames, oks, rnd):
    """The MAC RX beats of ``frames`` back to back (``tb.rx_quarters.pack``), as dicts of
    the RxBeat fields plus ``ended``: the indices of the frames ending in the beat, in
    order. Lanes no frame holds carry random bytes; ``ebytes`` and ``icrc_ok`` are random
    in quarters where no frame ends, ``oks[k]`` where frame k ends."""
    beats = []
    k = 0
    for b in pack_beats(frames):
        free = 0                            # bit mask of the lanes no frame holds
        for lane in range(BEAT):
            if not b.keep >> lane & 1:
                free |= 0xFF << (8 * lane)
        ebytes, icrc_ok, ended = [], 0, []
        for q in range(QUARTERS):
            if b.eop >> q & 1:
                assert b.ended[len(ended)] == frames[k]
                ebytes.append(b.ebytes(q))
                icrc_ok |= int(oks[k]) << q
                ended.append(k)
                k += 1
            else:
                ebytes.append(rnd.randrange(64))
                icrc_ok |= rnd.randrange(2) << q
        beats.append({"data": b.data | (rnd.getrandbits(8 * BEAT) & free), "sop": b.sop, "eop": b.eop,
                      "ebytes": ebytes, "icrc_ok": icrc_ok, "ended": ended})
    assert k == len(frames)
    assert all(len(b["ended"]) <= 2 for b in beats), "more than two frame ends in a beat"
    return beats


def _starts(beats):
    """(beat index, quarter) where each frame starts, in frame order."""
    return [(n, q) for n, b in enumerate(beats) for q in range(QUARTERS) if b["sop"] >> q & 1]


def _fields(b):
    return (b["data"], b["sop"], b["eop"], tuple(b["ebytes"]), b["icrc_ok"])


def _run(frames, oks, rnd, *, opcodes=None, gap=0.0, stall_o=0.0, stall_p=0.0):
    """Drive the frames' beats; returns (beats in, beats out, descriptor pairs, per pair
    (cycle, beats with frame ends out so far), cycles, input stall cycles)."""
    dut = RxHeaderParser(opcodes=opcodes)
    beats = _beats(frames, oks, rnd)
    n_pairs = sum(1 for b in beats if b["ended"])
    out, got, cycles = [], [], [0]
    when = []
    stalled = [0]

    async def bench(ctx):
        ctx.set(dut.port_mac, PORT.smac)
        ctx.set(dut.port_ip, PORT.sip)
        i = 0
        presenting = False
        ends_out = 0
        while len(got) < n_pairs:
            assert cycles[0] < 20 * len(beats) + 100, "the parser stopped"
            if not presenting and i < len(beats) and rnd.random() >= gap:
                b = beats[i]
                ctx.set(dut.i.p, {n: b[n] for n in ("data", "sop", "eop", "ebytes", "icrc_ok")})
                ctx.set(dut.i.valid, 1)
                presenting = True
            elif not presenting:
                ctx.set(dut.i.valid, 0)
            ctx.set(dut.o.ready, int(rnd.random() >= stall_o))
            ctx.set(dut.packets.ready, int(rnd.random() >= stall_p))
            await ctx.delay(1e-12)
            if ctx.get(dut.i.valid) and ctx.get(dut.i.ready):
                presenting = False
                i += 1
            elif ctx.get(dut.i.valid):
                stalled[0] += 1
            if ctx.get(dut.o.valid) and ctx.get(dut.o.ready):
                b = ctx.get(dut.o.p)
                out.append((b.data, b.sop, b.eop, tuple(b.ebytes[q] for q in range(QUARTERS)), b.icrc_ok))
                ends_out += b.eop != 0
            if ctx.get(dut.packets.valid) and ctx.get(dut.packets.ready):
                got.append(ctx.get(dut.packets.p))
                when.append((cycles[0], ends_out))
            await ctx.tick()
            cycles[0] += 1
        for _ in range(5):                  # nothing more may come out
            ctx.set(dut.packets.ready, 1)
            ctx.set(dut.o.ready, 1)
            ctx.set(dut.i.valid, 0)
            await ctx.delay(1e-12)
            assert not ctx.get(dut.packets.valid) and not ctx.get(dut.o.valid)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(bench)
    sim.run()
    return beats, out, got, when, cycles[0], stalled[0]


INLINED = [0]                # descriptors seen with inline payload (checked in _check)


def _check(frames, beats, out, got, when, opcodes=None):
    """Beats passed unchanged; one pair per beat with frame ends, holding those frames'
    descriptors in order, each as parse_frame says. Returns the drop reasons seen."""
    assert out == [_fields(b) for b in beats], "beats must pass through unchanged and in order"
    ending = [b["ended"] for b in beats if b["ended"]]
    assert len(got) == len(ending)
    reasons = set()
    for j, (ks, pair) in enumerate(zip(ending, got)):
        assert pair.second == (len(ks) == 2), f"pair {j}: second"
        for c, k in zip(pair.p, ks):
            f = frames[k]
            want, payload = _expect(f, opcodes)
            have = _got(c)
            reasons.add(want["drop"])
            assert {n: have[n] for n in want} == want, f"frame {k} ({len(f)} bytes): {f[:80].hex()}"
            if payload is not None:
                off, n = have["payload_offset"], have["payload_len"]
                assert f[off:off + n] == payload
                if have["inline"]:
                    assert have["inline_data"].to_bytes(4, "little")[:n] == payload, f"frame {k}: inline bytes"
                    INLINED[0] += 1
        # the pair leaves only after its beat has left on o
        assert when[j][1] >= j + 1, f"pair {j} before its beat"
    return reasons


def _full_rate(frames, oks, rnd, **kw):
    """Run without stalls: one beat per cycle, each pair two cycles after its beat."""
    beats, out, got, when, cycles, stalled = _run(frames, oks, rnd, **kw)
    reasons = _check(frames, beats, out, got, when, kw.get("opcodes"))
    assert stalled == 0
    assert cycles == len(beats) + 2
    assert [c for c, _ in when] == [n + 2 for n, b in enumerate(beats) if b["ended"]]
    return beats, got, reasons


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rx_header_parser_random_stalls(seed):
    """Every descriptor field equals parse_frame's answer, every drop reason is reached,
    beats pass unchanged, with random input gaps and random stalls on o and packets."""
    rnd = random.Random(seed)
    frames = _frames(rnd)
    oks = [_icrc_ok(f, rnd) for f in frames]
    beats, out, got, when, cycles, stalled = _run(frames, oks, rnd, gap=0.2, stall_o=0.2, stall_p=0.4)
    before = INLINED[0]
    reasons = _check(frames, beats, out, got, when)
    assert reasons == set(RxDrop), f"drop reasons not reached: {set(RxDrop) - reasons}"
    assert INLINED[0] > before, "no frame with an inline payload"
    starts = _starts(beats)
    assert {q for _, q in starts} == set(range(QUARTERS)), "frames must start at every quarter"
    assert sum(len(b["ended"]) == 2 for b in beats) > 20, "two frames must end in a beat"
    assert stalled > 0


def test_rx_header_parser_full_rate():
    """Without stalls the parser takes one beat per cycle and each descriptor pair leaves
    two cycles after its beat."""
    rnd = random.Random(3)
    frames = _frames(rnd, n_fuzz=20)
    oks = [_icrc_ok(f, rnd) for f in frames]
    beats, got, _ = _full_rate(frames, oks, rnd)
    assert any(len(b["ended"]) == 2 for b in beats)


def _dense(rnd, n):
    """62-byte ACKs and 65..100-byte frames back to back (mostly ACKs), some with a
    wrong ICRC."""
    frames = []
    for _ in range(n):
        f = _sized(rnd, 62 if rnd.random() < 0.6 else rnd.randint(65, 100))
        if rnd.random() < 0.1:
            f = f[:-1] + bytes([f[-1] ^ 1])
        frames.append(f)
    return frames


def test_rx_header_parser_two_ends_per_beat():
    """Back-to-back 62-byte ACKs and 65..100-byte frames: two frames end in most beats;
    with ``packets`` and ``o`` ready the parser still takes one beat per cycle, and with
    random back-pressure on both it loses nothing."""
    rnd = random.Random(7)
    frames = [_sized(rnd, 62) for _ in range(40)] + _dense(rnd, 300)
    oks = [_icrc_ok(f, rnd) for f in frames]
    beats, got, reasons = _full_rate(frames, oks, rnd)
    two = sum(len(b["ended"]) == 2 for b in beats)
    assert two > 0.6 * len(beats), (two, len(beats))
    assert all(len(b["ended"]) == 2 for b in beats[:20])         # the ACK run: two every beat
    assert {RxDrop.NONE, RxDrop.BAD_ICRC} <= reasons
    assert {q for _, q in _starts(beats)} == set(range(QUARTERS))
    for stall_o, stall_p in ((0.3, 0.0), (0.0, 0.5), (0.3, 0.5)):
        beats, out, got, when, cycles, stalled = _run(frames, oks, rnd, stall_o=stall_o, stall_p=stall_p)
        _check(frames, beats, out, got, when)
        assert stalled > 0


def _placed(rnd, targets):
    """``targets`` [(quarter, frame)] with filler frames between them so that each
    target frame starts at its quarter; returns (frames, indices of the targets)."""
    frames, idx = [], []
    pos = 0                                 # first quarter (counted from the stream's start) free
    for q, f in targets:
        d = (q - pos) % QUARTERS
        fill = {0: [], 1: [rnd.randint(129, 160)], 2: [62], 3: [rnd.randint(65, 96)]}[d]
        if d == 1 and rnd.random() < 0.5:
            fill = [62, rnd.randint(65, 96)]
        for n in fill:
            frames.append(_sized(rnd, n))
            pos += max(-(-n // QUARTER), 2)
        idx.append(len(frames))
        frames.append(f)
        pos += max(-(-len(f) // QUARTER), 2)
    return frames, idx


def test_rx_header_parser_every_quarter():
    """Frames start at every quarter: headers split over two beats (a frame starting at
    quarter 2 or 3 and ending in the next beat, or running on), frames shorter than 58
    bytes across two beats, frames of 32 bytes or less at quarters 0..2, frames of 58..64
    bytes whose header the beat does not hold whole; full rate, then with back-pressure."""
    rnd = random.Random(8)
    w = lambda op=Op.WRITE_ONLY, size=20: _write(rnd, op, size)
    targets = []
    for q in range(QUARTERS):
        for f in ([w()[:k] for k in (1, 14, 31, 32, 33, 42, 43, 50, 57)]
                  + [w(Op.WRITE_MIDDLE, 0), w(Op.WRITE_MIDDLE, 2), _response(rnd, Aeth.ACK),
                     w(Op.WRITE_MIDDLE, 0) + rnd.randbytes(2),                           # padded to 60
                     w(Op.WRITE_LAST_IMM, 0), w(Op.WRITE_LAST_IMM, 2),
                     w(Op.WRITE_MIDDLE, 10), w(Op.WRITE_ONLY, 0), w(Op.WRITE_ONLY_IMM, 0),
                     w(Op.WRITE_ONLY_IMM, 1), w(Op.WRITE_FIRST, 30), w(Op.WRITE_ONLY_IMM, 60),
                     w(Op.WRITE_ONLY, 200), w(Op.WRITE_ONLY_IMM, 300),
                     _mutate(w(Op.WRITE_ONLY_IMM, 0), lambda f: f.__setitem__(-1, f[-1] ^ 1), fix_icrc=False),
                     _mutate(w(Op.WRITE_ONLY, 8), _set(BTH, OFF_BTH, pkey=0x7FFF))]):
            if q < QUARTERS - 1 or len(f) > QUARTER:      # no frame of <= 32 bytes starts in quarter 3
                targets.append((q, f))
    rnd.shuffle(targets)
    frames, idx = _placed(rnd, targets)
    oks = [_icrc_ok(f, rnd) for f in frames]
    beats, got, reasons = _full_rate(frames, oks, rnd)
    starts = _starts(beats)
    for (q, f), k in zip(targets, idx):
        assert starts[k][1] == q
    ends = {k: n for n, b in enumerate(beats) for k in b["ended"]}
    spans = {(starts[k][1], len(frames[k])) for k in idx if ends[k] == starts[k][0] + 1}
    assert {(3, n) for n in (33, 42, 43, 50, 57, 58, 62, 74, 78)} <= spans     # short ones across beats
    assert {(2, n) for n in (74, 78, 79)} <= spans
    assert {RxDrop.NONE, RxDrop.BAD_LENGTH, RxDrop.BAD_ICRC, RxDrop.BAD_PKEY} <= reasons
    beats, out, got, when, cycles, stalled = _run(frames, oks, rnd, gap=0.2, stall_o=0.3, stall_p=0.4)
    _check(frames, beats, out, got, when)


def test_rx_header_parser_packets_stalled():
    """With packets not ready, the parser stops at a beat with frame ends once three
    descriptor pairs wait, loses nothing, and goes on when they are taken."""
    rnd = random.Random(4)
    frames = [_write(rnd, Op.WRITE_MIDDLE, 4) for _ in range(24)]       # 62 bytes: two per beat
    oks = [_icrc_ok(f, rnd) for f in frames]
    beats, out, got, when, cycles, stalled = _run(frames, oks, rnd, stall_p=0.9)
    _check(frames, beats, out, got, when)
    assert stalled > 0


def test_rx_header_parser_opcode_subset():
    """``opcodes`` narrows the accepted set as parse_frame's argument does (ACKs and
    known opcodes outside it are BAD_OPCODE)."""
    rnd = random.Random(5)
    frames = [_write(rnd, op, rnd.choice([0, 9, 70])) for op in sorted(WRITE_OPCODES)]
    frames += [_response(rnd, Aeth.ACK), _response(rnd, Aeth.NAK_PSN_SEQ)]
    rnd.shuffle(frames)
    oks = [_icrc_ok(f, rnd) for f in frames]
    for opcodes in (tuple(WRITE_OPCODES), (Op.ACK,)):
        beats, out, got, when, cycles, stalled = _run(frames, oks, rnd, opcodes=opcodes, stall_p=0.3)
        assert {RxDrop.NONE, RxDrop.BAD_OPCODE} == _check(frames, beats, out, got, when, opcodes)


def test_rx_header_parser_long_frames():
    """Frame lengths beyond 16 bits: a 65,540-byte WRITE ONLY (IPv4 length 65,526) is
    accepted as parse_frame accepts it, a 65,560-byte frame (longer than any IPv4 length
    can say) is BAD_LENGTH, also when its lengths would match a 16-bit count; ``frame_len``
    saturates at 65,535. Each starts at a different quarter."""
    rnd = random.Random(6)
    big = _write(rnd, Op.WRITE_ONLY, 65466)
    # 65,674 bytes whose IPv4/UDP lengths would match a count that stopped at 65,536 + 10
    alias = _mutate(big, lambda f: (f.extend(rnd.randbytes(134)), pack(IPV4, f, OFF_IP, total_len=65532),
                                    pack(UDP, f, OFF_UDP, length=65512)))
    frames = [big, _write(rnd, Op.WRITE_MIDDLE, 1), big[:-4] + rnd.randbytes(20) + big[-4:], alias,
              _response(rnd, Aeth.ACK)]
    oks = [_icrc_ok(f, rnd) for f in frames]
    beats, got, _ = _full_rate(frames, oks, rnd)
    descs = [c for pair in got for c in pair.p[:1 + pair.second]]
    assert [c.drop for c in descs] == [RxDrop.NONE, RxDrop.NONE, RxDrop.BAD_LENGTH, RxDrop.BAD_LENGTH,
                                       RxDrop.NONE]
    assert descs[0].payload_len == 65466 and descs[0].frame_len == 0xFFFF and descs[2].frame_len == 0xFFFF
    assert len({q for _, q in _starts(beats)}) >= 3


@pytest.mark.parametrize("opcodes", [[0x20], [], 5, [Op.ACK, "x"]])
def test_rx_header_parser_arguments(opcodes):
    with pytest.raises(ValueError, match="opcodes"):
        RxHeaderParser(opcodes=opcodes)
