# amaranth: UnusedElaboratable=no
"""RxHeaderParser in Amaranth's simulator, held to model/rc.py ``parse_frame``.

Frames come from the golden model (``build_rc_packet`` for every WRITE opcode with and
without immediate, ``build_response`` for ACK/NAK), from the smallest up to several
beats, plus bad ones for every drop reason and random header mutations. They are packed
into the receive segment format as the transmit path packs them (a frame of more than
68 bytes starts at lane 64 behind a last beat of at most 64 bytes), with random bytes in
the unused lanes and random ``nbytes``/``icrc_ok`` on beats where they mean nothing.
"""
import random

import pytest
from amaranth.sim import Simulator

from model.frames import Port, QpContext
from model.icrc import icrc, ipv4_checksum
from model.rc import WRITE_OPCODES, build_rc_packet, build_response, parse_frame
from rtl.rx_header_parser import RxHeaderParser
from rtl.rx_packet import RX_DROP_NAMES, RxDrop
from spec.formats import BTH, IPV4, OFF_BTH, OFF_IP, OFF_UDP, UDP, Aeth, Op, pack

BEAT = 128
SEG = 64
DROP = {name: drop for drop, name in RX_DROP_NAMES.items()}


# ---- frames ----------------------------------------------------------------------------
def _endpoints(rnd):
    qp = QpContext(qpn=rnd.randrange(1 << 24), remote_qpn=rnd.randrange(1 << 24),
                   dmac=rnd.randrange(1 << 48), dip=rnd.randrange(1 << 32))
    return qp, Port(smac=rnd.randrange(1 << 48), sip=rnd.randrange(1 << 32))


def _write(rnd, opcode, size):
    qp, port = _endpoints(rnd)
    reth = None
    if opcode in (Op.WRITE_FIRST, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM):
        reth = (rnd.randrange(1 << 64), rnd.randrange(1 << 32), rnd.randrange(1 << 32))
    imm = rnd.randrange(1 << 32) if opcode in (Op.WRITE_LAST_IMM, Op.WRITE_ONLY_IMM) else None
    return build_rc_packet(qp, port, opcode, rnd.randrange(1 << 24), rnd.randbytes(size), reth, imm,
                           ackreq=rnd.choice([None, True, False]))


def _response(rnd, syndrome):
    qp, port = _endpoints(rnd)
    return build_response(qp, port, rnd.randrange(1 << 24), syndrome, rnd.randrange(1 << 24))


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
    bad = []
    w = lambda op=Op.WRITE_ONLY, size=20: _write(rnd, op, size)
    ack = lambda: _response(rnd, Aeth.ACK)
    # PadCnt and SE: pad bytes leave the payload; PadCnt beyond the payload is bad_length
    for op, size, cnt in ((Op.WRITE_ONLY, 8, 3), (Op.WRITE_LAST_IMM, 5, 1), (Op.WRITE_MIDDLE, 1, 3),
                          (Op.WRITE_MIDDLE, 2, 2), (Op.WRITE_ONLY_IMM, 0, 1), (Op.WRITE_FIRST, 130, 2)):
        bad.append(_mutate(w(op, size), _set(BTH, OFF_BTH, flags=cnt << 4 | rnd.choice([0, 0x80]))))
    bad.append(_mutate(ack(), lambda f: (pack(BTH, f, OFF_BTH, flags=0x10), f.append(0)), relen=True))
    bad.append(_mutate(ack(), _set(BTH, OFF_BTH, flags=0x10)))             # pad byte missing
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
    bad += [_mutate(w(), _set(BTH, OFF_BTH, opcode=op)) for op in
            (Op.SEND_ONLY, Op.SEND_FIRST, Op.READ_REQUEST, 0x0D, 0x12, 0x64, 0xFF)]
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
    p, reason = parse_frame(f, opcodes)
    e = {"drop": DROP[reason], "frame_len": min(len(f), 0xFFFF)}
    if p is None:
        e["payload_len"] = 0
        return e, None
    ext = 16 * (p.reth is not None) + 4 * (p.imm is not None) + 4 * (p.aeth is not None)
    va, rkey, dma_len = p.reth or (0, 0, 0)
    syndrome, msn = p.aeth or (0, 0)
    e.update(opcode=p.opcode, se=f[OFF_BTH + 1] >> 7, padcnt=p.padcnt, dqpn=p.dqpn, ackreq=int(p.ackreq),
             psn=p.psn, has_reth=int(p.reth is not None), has_imm=int(p.imm is not None),
             has_aeth=int(p.aeth is not None), va=va, rkey=rkey, dma_len=dma_len, imm=p.imm or 0,
             syndrome=syndrome, msn=msn, payload_offset=54 + ext, payload_len=len(p.payload),
             smac=int.from_bytes(f[6:12], "big"), sip=int.from_bytes(f[OFF_IP + 12:OFF_IP + 16], "big"))
    return e, p.payload


def _got(c):
    """Descriptor (a data.Const of RxPacket) as the dict ``_expect`` gives."""
    return {"drop": c.drop, "frame_len": c.frame_len, "payload_len": c.payload_len, "opcode": c.opcode,
            "se": c.se, "padcnt": c.padcnt, "dqpn": c.dqpn, "ackreq": c.ackreq, "psn": c.psn,
            "has_reth": c.has_reth, "has_imm": c.has_imm, "has_aeth": c.has_aeth, "va": c.reth.va,
            "rkey": c.reth.rkey, "dma_len": c.reth.dma_len, "imm": c.imm, "syndrome": c.aeth.syndrome,
            "msn": c.aeth.msn, "payload_offset": c.payload_offset, "smac": c.smac, "sip": c.sip}


# ---- beats -------------------------------------------------------------------------------
def _beats(frames, oks, rnd):
    """The receive beat stream: a frame of more than 68 bytes starts at lane 64 behind a
    last beat of at most 64 bytes (as the transmit path packs), else at lane 0. Unused
    lanes hold random bytes; ``nbytes`` and ``icrc_ok`` are random where they mean nothing.
    Items: (data, sop, last, nbytes, sop_hi, icrc_ok, frame index ending here or None)."""
    stream = bytearray()
    starts = []
    for f in frames:
        r = len(stream) % BEAT
        if r and r <= SEG and len(f) > 68:
            stream += rnd.randbytes(SEG - r)
        elif r:
            stream += rnd.randbytes(BEAT - r)
        starts.append(len(stream))
        stream += f
    stream += rnd.randbytes(-len(stream) % BEAT)
    beats = []
    k = 0                                   # frame holding lane 0
    for lo in range(0, len(stream), BEAT):
        s, end = starts[k], starts[k] + len(frames[k])
        assert s <= lo < end or s == lo
        last = end <= lo + BEAT
        sop_hi = last and k + 1 < len(frames) and starts[k + 1] == lo + SEG
        assert not sop_hi or end <= lo + SEG
        beats.append((int.from_bytes(stream[lo:lo + BEAT], "little"), int(s == lo), int(last),
                      end - lo if last else rnd.randrange(256), int(sop_hi),
                      int(oks[k]) if last else rnd.randrange(2), k if last else None))
        if last:
            k += 1
    assert k == len(frames)
    return beats


def _run(frames, oks, rnd, *, opcodes=None, gap=0.0, stall_o=0.0, stall_p=0.0):
    """Drive the frames' beats; returns (beats out, descriptors, per-descriptor cycle and
    beats-out count, cycles, input stall cycles, beats in)."""
    dut = RxHeaderParser(opcodes=opcodes)
    beats = _beats(frames, oks, rnd)
    out, got, cycles = [], [], [0]
    when = []                               # (cycle, last beats out so far) per descriptor
    stalled = [0]

    async def bench(ctx):
        i = 0
        presenting = False
        lasts_out = 0
        while len(got) < len(frames):
            assert cycles[0] < 20 * len(beats) + 100, "the parser stopped"
            if not presenting and i < len(beats) and rnd.random() >= gap:
                data, sop, last, nbytes, sop_hi, ok, _ = beats[i]
                ctx.set(dut.i.p, {"data": data, "sop": sop, "last": last, "nbytes": nbytes,
                                  "sop_hi": sop_hi, "icrc_ok": ok})
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
                out.append((b.data, b.sop, b.last, b.nbytes, b.sop_hi, b.icrc_ok))
                lasts_out += b.last
            if ctx.get(dut.packets.valid) and ctx.get(dut.packets.ready):
                got.append(ctx.get(dut.packets.p))
                when.append((cycles[0], lasts_out))
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


def _check(frames, beats, out, got, when, opcodes=None):
    assert out == [b[:6] for b in beats], "beats must pass through unchanged and in order"
    assert len(got) == len(frames)
    reasons = set()
    for k, (f, c) in enumerate(zip(frames, got)):
        want, payload = _expect(f, opcodes)
        have = _got(c)
        reasons.add(want["drop"])
        assert {n: have[n] for n in want} == want, f"frame {k} ({len(f)} bytes): {f[:80].hex()}"
        if payload is not None:
            off, n = have["payload_offset"], have["payload_len"]
            assert f[off:off + n] == payload
        # the descriptor leaves only after the frame's last beat has left on o
        assert when[k][1] >= k + 1, f"descriptor {k} before its last beat"
    return reasons


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rx_header_parser_random_stalls(seed):
    """Every descriptor field equals parse_frame's answer, every drop reason is reached,
    beats pass unchanged, with random input gaps and random stalls on o and packets."""
    rnd = random.Random(seed)
    frames = _frames(rnd)
    oks = [_icrc_ok(f, rnd) for f in frames]
    beats, out, got, when, cycles, stalled = _run(frames, oks, rnd, gap=0.2, stall_o=0.2, stall_p=0.4)
    reasons = _check(frames, beats, out, got, when)
    assert reasons == set(RxDrop), f"drop reasons not reached: {set(RxDrop) - reasons}"
    assert sum(b[4] for b in beats) > 30, "frames must start at lane 64"
    assert any(b[1] and b[2] and b[4] for b in beats), "a whole frame in lanes 0..63 before a lane-64 one"
    assert stalled > 0


def test_rx_header_parser_full_rate():
    """Without stalls the parser takes one beat per cycle, back-to-back frames and lane-64
    starts included, and each descriptor leaves two cycles after its frame's last beat."""
    rnd = random.Random(3)
    frames = _frames(rnd, n_fuzz=20)
    oks = [_icrc_ok(f, rnd) for f in frames]
    beats, out, got, when, cycles, stalled = _run(frames, oks, rnd)
    _check(frames, beats, out, got, when)
    assert stalled == 0
    last_cycle = {b[6]: c for c, b in enumerate(beats) if b[6] is not None}
    assert [c for c, _ in when] == [last_cycle[k] + 2 for k in range(len(frames))]
    assert cycles == len(beats) + 2


def test_rx_header_parser_packets_stalled():
    """With packets not ready, the parser stops at a frame's last beat once three
    descriptors wait, loses nothing, and goes on when they are taken."""
    rnd = random.Random(4)
    frames = [_write(rnd, Op.WRITE_MIDDLE, 4) for _ in range(12)]        # one beat each
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
    saturates at 65,535."""
    rnd = random.Random(6)
    big = _write(rnd, Op.WRITE_ONLY, 65466)
    # 65,674 bytes whose IPv4/UDP lengths would match a count that stopped at 65,536 + 10
    alias = _mutate(big, lambda f: (f.extend(rnd.randbytes(134)), pack(IPV4, f, OFF_IP, total_len=65532),
                                    pack(UDP, f, OFF_UDP, length=65512)))
    frames = [big, _write(rnd, Op.WRITE_MIDDLE, 1), big[:-4] + rnd.randbytes(20) + big[-4:], alias,
              _response(rnd, Aeth.ACK)]
    oks = [_icrc_ok(f, rnd) for f in frames]
    beats, out, got, when, cycles, stalled = _run(frames, oks, rnd)
    _check(frames, beats, out, got, when)
    assert [c.drop for c in got] == [RxDrop.NONE, RxDrop.NONE, RxDrop.BAD_LENGTH, RxDrop.BAD_LENGTH, RxDrop.NONE]
    assert got[0].payload_len == 65466 and got[0].frame_len == 0xFFFF and got[2].frame_len == 0xFFFF


@pytest.mark.parametrize("opcodes", [[Op.SEND_ONLY], [], 5, [Op.ACK, "x"]])
def test_rx_header_parser_arguments(opcodes):
    with pytest.raises(ValueError, match="opcodes"):
        RxHeaderParser(opcodes=opcodes)
