"""MacRxAdapter + IcrcChecker in Amaranth's simulator: real RoCEv2 frames in the MAC RX
quarter format (tb/rx_quarters.py), back to back, verdicts against the golden model
(model.icrc)."""
import random
import struct
import zlib

import pytest
from amaranth.hdl import Elaboratable, Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from model.frames import Port, QpContext, build_packet, build_rc_frame, build_write_frames
from model.icrc import icrc, ipv4_checksum
from model.parse import build_response, parse_frame
from rtl.common import icrc_math
from rtl.port.icrc_checker import MIN_FRAME, RESIDUE, IcrcChecker
from rtl.port.rx_adapter import MacRxAdapter
from spec import formats as F
from tb.rx_quarters import BEAT, QUARTER, QUARTERS, pack

MASKED = {o + i for o, w in F.ICRC_MASKED for i in range(w)}
QMASK = (1 << QUARTER) - 1
# Ethernet padding (model.parse.parse_frame): a frame of 60 bytes may carry a shorter IPv4
# packet; those of 58 and 59 bytes (IPv4 lengths 44 and 45) are long enough to be checked.
PAD_FRAME = F.ETH_MIN_FRAME
PAD_IP_LENGTHS = (MIN_FRAME - F.OFF_IP, MIN_FRAME + 1 - F.OFF_IP)


class _Rx(Elaboratable):
    """The receive front: MAC RX -> adapter -> checker."""
    def __init__(self):
        self.adapter = MacRxAdapter()
        self.checker = IcrcChecker()

    def elaborate(self, platform):
        m = Module()
        m.submodules.adapter = self.adapter
        m.submodules.checker = self.checker
        wiring.connect(m, self.adapter.o, self.checker.i)
        return m


def _icrc_unchecked(body):
    """model.icrc without its length check, for frames too short to carry a BTH."""
    f = bytearray(body)
    for off, width in F.ICRC_MASKED:
        f[off:off + width] = b"\xff" * width
    f = f[:len(body)]                # a mask past the end would have lengthened it
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + bytes(f[F.OFF_IP:])))


def _quarters(n):
    """Quarters a frame of ``n`` bytes takes from its start to the next start (the packer
    leaves one empty behind a frame of one quarter)."""
    return -(-n // QUARTER) + (n <= QUARTER)


def _contiguous(keep):
    """Count of contiguous ones from bit 0: the adapter's ``ebytes`` of a quarter."""
    n = 0
    while keep >> n & 1:
        n += 1
    return n


def _frames(rnd):
    """(frame, kind, start quarter or None) triples: every size of 33..200 bytes with its
    end in every quarter, ACK runs, short frames (some spanning two beats), long WRITEs,
    frames whose masked fields vary, each real one maybe corrupted (kind says how)."""
    qp = QpContext(qpn=3, remote_qpn=0x1234, dmac=0x020000000002, dip=0x0A000002, mtu=1024,
                   start_psn=0xFFFFFE)
    port = Port(smac=0x020000000001, sip=0x0A000001)

    def rand(n):
        return bytes(rnd.randrange(256) for _ in range(n))

    # (no IBTA pad, so that every frame length occurs: a peer that does not pad)
    def write(p):                    # WRITE ONLY = 74 + p bytes, up to MTU 1024 a packet
        return build_write_frames(qp, port, 0x1000 + p, 0x55, rand(p), rnd.randrange(1 << 24), pad=False)

    def middle(p):                   # WRITE MIDDLE: 58 + p bytes
        return build_packet(qp, port, F.Op.WRITE_MIDDLE, rnd.randrange(1 << 24), rand(p), pad=False)

    def ack():                       # 62 bytes
        return build_response(qp, port, rnd.randrange(1 << 24), 0, rnd.randrange(1 << 24))

    def short(n):
        """``n`` (5..57) bytes of headers with their right CRC: too short all the same."""
        body = (ack() + rand(64))[:n - 4]
        return body + _icrc_unchecked(body)

    def trap(cut):
        """A WRITE ONLY whose bytes cut-4..cut-1 are the ICRC of the bytes before: the
        register holds the residue after byte cut-1 although the frame goes on."""
        payload = bytearray(rand(300))
        f = build_write_frames(qp, port, 0, 0x55, bytes(payload), 0, pad=False)[0]
        payload[cut - 4 - F.HDR_LEN_RETH:cut - F.HDR_LEN_RETH] = _icrc_unchecked(f[:cut - 4])
        f = build_write_frames(qp, port, 0, 0x55, bytes(payload), 0, pad=False)[0]
        assert f[cut - 4:cut] == _icrc_unchecked(f[:cut - 4])
        return f

    def variant_all(f):
        """Every masked byte changed: still a right ICRC."""
        f = bytearray(f)
        for pos in MASKED:
            f[pos] ^= rnd.randrange(1, 256)
        return bytes(f)

    items = []
    # Every size of 33..200 bytes: n = 32 k + b with b = 1..32 the bytes in the last
    # quarter, started at quarter b % 4, so that the k of each b put its end in every
    # quarter. Below MIN_FRAME the headers carry a right CRC but are too short.
    for n in range(33, 201):
        b = (n - 1) % QUARTER + 1
        if n < MIN_FRAME:
            items.append((short(n), "short", b % QUARTERS))
        else:
            items.append((middle(n - MIN_FRAME), None, b % QUARTERS))
    # Short frames around the limit; from quarter 3 they span two beats.
    body54 = ack()[:54]                                  # Ethernet/IPv4/UDP/BTH only
    for s in range(QUARTERS):
        items += [(body54 + icrc(body54), "none", s),    # 58 bytes, the shortest ok frame
                  (short(57), "short", s), (short(33), "short", s), (short(40), "short", s),
                  (variant_all(middle(rnd.randrange(100))), "variant", s)]
        if s < QUARTERS - 1:                             # never from quarter 3 (tb/rx_quarters.py)
            items.append((rand(rnd.randrange(1, QUARTER + 1)), "short", s))
    # ACK runs: two ends in a beat, and from quarter 1 a third frame starting behind them.
    for s in (0, 1, None):
        items += [(ack(), None, s)] + [(ack(), None, None) for _ in range(5)]
    # Multi-beat frames (up to 3 packets at MTU 1024) from every quarter.
    for p in [0, 1, 2, 3, 50, 54, 55, 118, 119, 246, 500, 1000, 2600] + [rnd.randrange(2100) for _ in range(6)]:
        s = rnd.choice([0, 1, 2, 3, None])
        for k, f in enumerate(write(p)):
            items.append((f, None, s if k == 0 else None))
    # The residue reached inside a frame: no verdict before its end.
    for cut in (96, 128, 160, 192, 250):
        items.append((trap(cut), "none", rnd.randrange(QUARTERS)))

    rnd.shuffle(items)
    out = []
    for f, kind, start in items:
        kind = kind or rnd.choice(["none", "none", "bit", "icrc", "variant", "eth"])
        f = bytearray(f)
        if kind == "bit":            # any covered bit, the ICRC bytes included
            pos = rnd.choice([i for i in range(F.ETH_LEN, len(f)) if i not in MASKED])
            f[pos] ^= 1 << rnd.randrange(8)
        elif kind == "icrc":
            f[-4:] = bytes(a ^ b for a, b in zip(f[-4:], rnd.randrange(1, 1 << 32).to_bytes(4, "little")))
        elif kind == "variant":      # masked: the verdict must not change
            f[rnd.choice(sorted(MASKED))] ^= 1 << rnd.randrange(8)
        elif kind == "eth":          # not covered at all
            f[rnd.randrange(F.ETH_LEN)] ^= 1 << rnd.randrange(8)
        out.append((bytes(f), kind, start))
    return out


def _place(items):
    """The frames in order, with fillers in front of those asked to start at a given
    quarter (the packer starts a frame at the next free quarter, but one of 32 bytes or
    less not at quarter 3). Returns (frame, kind) pairs and the start quarter of each."""
    qp = QpContext(qpn=5, remote_qpn=0x77, dmac=0x020000000002, dip=0x0A000002, mtu=1024)
    port = Port(smac=0x020000000001, sip=0x0A000001)
    fill = {2: lambda: [build_response(qp, port, 1, 0, 2)],                          # 2 quarters
            3: lambda: [build_packet(qp, port, F.Op.WRITE_MIDDLE, 3, bytes(20), pad=False)]}     # 3 quarters
    fill[1] = lambda: fill[2]() + fill[3]()
    pairs, starts = [], []
    pos = 0

    def skip(f):
        return len(f) <= QUARTER and pos % QUARTERS == QUARTERS - 1

    for f, kind, start in items:
        gap = 0 if start is None else (start - pos) % QUARTERS
        for filler in (fill[gap]() if gap else []):
            assert not skip(filler)
            pairs.append((filler, "none"))
            starts.append(pos % QUARTERS)
            pos += _quarters(len(filler))
        pos += skip(f)
        assert start is None or pos % QUARTERS == start
        pairs.append((f, kind))
        starts.append(pos % QUARTERS)
        pos += _quarters(len(f))
    return pairs, starts


def _ip_len(f):
    return int.from_bytes(f[F.OFF_IP + 2:F.OFF_IP + 4], "big")


def _packet(f):
    """The bytes the ICRC check covers: a 60-byte frame whose IPv4 length says 44 or 45
    (a 58- or 59-byte packet) ends where that length says, behind it Ethernet padding
    of any content (as parse_frame cuts it); every other frame is checked whole (a
    shorter IPv4 length makes parse_frame drop a 60-byte frame as bad_length before its
    ICRC matters)."""
    if len(f) == PAD_FRAME and _ip_len(f) in PAD_IP_LENGTHS:
        return f[:F.OFF_IP + _ip_len(f)]
    return f


def _expected_ok(f):
    f = _packet(f)
    return len(f) >= MIN_FRAME and f[-4:] == icrc(f[:-4])


def _mac_beats(frames, rnd):
    """MAC RX beats of ``frames`` (tb/rx_quarters.pack) as dicts of the AXI fields; lanes
    without tkeep get garbage on some beats (the MAC need not zero them)."""
    beats = []
    for b in pack(frames):
        data = b.data
        if rnd.random() < 0.5:
            dead = sum(0xFF << (8 * i) for i in range(BEAT) if not (b.keep >> i) & 1)
            data |= rnd.getrandbits(8 * BEAT) & dead
        beats.append({"tdata": data, "tkeep": b.keep, "tlast": b.last, "tuser": b.user,
                      "sop": b.sop, "eop": b.eop, "ended": b.ended})
    return beats


def _run(beats, p_gap, p_stall, rnd):
    """Drive ``beats`` by the AXI-Stream rules (valid held until taken), ``tvalid`` low with
    probability ``p_gap``, ``o.ready`` low with ``p_stall``. Returns the output beats and
    ``{"cycles", "not_ready"}`` (cycles a valid beat was not taken)."""
    dut = _Rx()
    a, c = dut.adapter, dut.checker
    out = []
    stats = {"cycles": 0, "not_ready": 0}

    async def bench(ctx):
        # A process, not a testbench: its inputs settle once per cycle instead of after
        # every set, which matters with four 256-bit XOR trees in the simulator.
        with ctx.critical():
            i = 0
            valid = False
            while len(out) < len(beats):
                if not valid and i < len(beats) and rnd.random() >= p_gap:
                    valid = True
                    for name in ("tdata", "tkeep", "tlast", "tuser"):
                        ctx.set(getattr(a.i, name), beats[i][name])
                ctx.set(a.i.tvalid, valid)
                ctx.set(c.o.ready, rnd.random() >= p_stall)
                _, tready, o_valid, o_ready, p = await ctx.delay(1e-12).sample(
                    a.i.tready, c.o.valid, c.o.ready, c.o.p)
                took = valid and tready
                stats["not_ready"] += valid and not took
                if o_valid and o_ready:
                    out.append({"data": p.data, "sop": p.sop, "eop": p.eop,
                                "ebytes": [p.ebytes[q] for q in range(QUARTERS)], "icrc_ok": p.icrc_ok})
                await ctx.tick()
                stats["cycles"] += 1
                if took:
                    i += 1
                    valid = False
                assert stats["cycles"] < 20 * len(beats) + 100, "the stream stopped"

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_process(bench)
    sim.run()
    return out, stats


def test_residue_matches_model():
    """The residue constant: the unit's register after the masked message and the model's
    ICRC is the same for every frame, and is the known CRC-32 residue."""
    assert RESIDUE == 0xDEBB20E3
    qp = QpContext(qpn=1, remote_qpn=2, dmac=0x020000000002, dip=0x0A000002, mtu=256)
    port = Port(smac=0x020000000001, sip=0x0A000001)
    for f in build_write_frames(qp, port, 0, 1, bytes(range(200)) * 3, 5):
        body = bytearray(f[:-4])
        for off, width in F.ICRC_MASKED:
            body[off:off + width] = b"\xff" * width
        msg = bytearray(b"\xff" * 8 + bytes(body[F.OFF_IP:]) + icrc(f[:-4]))
        msg[:4] = bytes(4)                                  # the unit's zero start
        reg = icrc_math.crc_bits(0, int.from_bytes(msg, "little"), 8 * len(msg))
        assert reg == RESIDUE


def test_adapter_decoding():
    """The adapter alone: sop/eop from tuser, ebytes = the contiguous tkeep ones from each
    quarter's first lane (holes behind them and an unkept first lane included), data and
    the handshake straight through, icrc_ok 0."""
    rnd = random.Random(7)
    dut = MacRxAdapter()

    def keep_pattern():
        n = rnd.choice([0, 1, 2, 31, 32, rnd.randrange(QUARTER + 1)])
        keep = (1 << n) - 1
        if n < QUARTER - 1 and rnd.random() < 0.5:      # ones behind a hole do not count
            keep |= rnd.getrandbits(QUARTER) << (n + 1) & QMASK
        return keep

    async def bench(ctx):
        for _ in range(300):
            keep = sum(keep_pattern() << (QUARTER * q) for q in range(QUARTERS))
            data, user = rnd.getrandbits(8 * BEAT), rnd.getrandbits(2 * QUARTERS)
            valid, ready = rnd.randrange(2), rnd.randrange(2)
            for sig, v in ((dut.i.tdata, data), (dut.i.tkeep, keep), (dut.i.tuser, user),
                           (dut.i.tlast, rnd.randrange(2)), (dut.i.tvalid, valid), (dut.o.ready, ready)):
                ctx.set(sig, v)
            p = ctx.get(dut.o.p)
            assert (ctx.get(dut.o.valid), ctx.get(dut.i.tready)) == (valid, ready)
            assert (p.data, p.sop, p.eop, p.icrc_ok) == (data, user & 0xF, user >> 4, 0)
            for q in range(QUARTERS):
                assert p.ebytes[q] == _contiguous(keep >> (QUARTER * q) & QMASK), (q, hex(keep))

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()


def test_malformed_ends():
    """Checker alone: a right 62-byte ACK is ok only with its right ebytes (not 0, not over
    32) and with its start seen (right after reset a frame without one is refused); the
    ends of two short frames with a right CRC that span a beat boundary (57 bytes: not
    ok, 58: ok)."""
    qp = QpContext(qpn=3, remote_qpn=9, dmac=0x020000000002, dip=0x0A000002, mtu=1024)
    port = Port(smac=0x020000000001, sip=0x0A000001)
    ack = build_response(qp, port, 5, 0, 6)
    assert len(ack) == 62 and _expected_ok(ack)
    data = int.from_bytes(ack, "little")
    body54 = ack[:54]
    f58 = body54 + icrc(body54)
    f57 = ack[:53] + _icrc_unchecked(ack[:53])

    def beat(data, sop, eop, ebytes):
        return {"data": data, "sop": sop, "eop": eop, "ebytes": ebytes, "icrc_ok": 0}

    # (beat, the icrc_ok expected), in one stream from reset. First the ACK in quarters
    # 0..1 without its start: after reset the register and quarter count are those of a
    # start, so only the missing start refuses it.
    cases = [(beat(data, 0, 0b0010, [32, 30, 0, 0]), 0),
             (beat(data, 0b0001, 0b0010, [32, 30, 0, 0]), 0b0010)]
    for eb, want in ((30, 0b0100), (0, 0), (33, 0), (63, 0), (29, 0)):          # quarters 1..2
        cases.append((beat(data << (8 * QUARTER), 0b0010, 0b0100, [0, 32, eb, 0]), want))
    for f, want in ((f58, 0b0001), (f57, 0)):                                     # from quarter 3
        d = int.from_bytes(f, "little")
        cases += [(beat(d << (8 * 3 * QUARTER) & ((1 << 8 * BEAT) - 1), 0b1000, 0, [0, 0, 0, 32]), 0),
                  (beat(d >> (8 * QUARTER), 0, 0b0001, [len(f) - QUARTER, 0, 0, 0]), want)]

    dut = IcrcChecker()
    got = []

    async def bench(ctx):
        ctx.set(dut.o.ready, 1)
        ctx.set(dut.i.valid, 1)
        for b, _ in cases:
            ctx.set(dut.i.p, b)
            await ctx.tick()
            got.append(ctx.get(dut.o.p.icrc_ok))

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(bench)
    sim.run()
    for k, ((b, want), g) in enumerate(zip(cases, got)):
        assert g == want, (k, b["sop"], b["eop"], b["ebytes"], g, want)


@pytest.mark.parametrize("mode", ["stalls", "full_rate"])
def test_icrc_checker(mode):
    """Every frame's verdict equals the model's, in the quarter where it ends; every beat
    passes unchanged and in order, with random stalls and gaps; at full rate one beat per
    cycle."""
    rnd = random.Random(2024 if mode == "stalls" else 4202)
    items = _frames(rnd)
    pairs, starts = _place(items)
    frames = [f for f, _ in pairs]
    beats = _mac_beats(frames, rnd)

    # The stream covers what it should: starts as planned and at every quarter, the end
    # of every real frame size class in every quarter, two ends in a beat (both ok, and
    # with a third frame starting), short frames spanning two beats.
    got_starts = [q for b in beats for q in range(QUARTERS) if b["sop"] >> q & 1]
    assert got_starts == starts and set(starts) == set(range(QUARTERS))
    ends = []                        # (end quarter, bytes there) per frame
    k = 0
    for b in beats:
        for q in range(QUARTERS):
            if b["eop"] >> q & 1:
                ends.append((q, (len(frames[k]) - 1) % QUARTER + 1))
                k += 1
    assert k == len(frames)
    assert {(q, e) for (q, e), f in zip(ends, frames) if len(f) >= MIN_FRAME} \
        == {(q, e) for q in range(QUARTERS) for e in range(1, QUARTER + 1)}
    assert set(range(33, 201)) <= {len(f) for f in frames}
    k = 0
    two_ok = third = False
    for b in beats:
        mine = [frames[k + j] for j in range(bin(b["eop"]).count("1"))]
        k += len(mine)
        if len(mine) == 2:
            two_ok |= all(_expected_ok(f) for f in mine)
            third |= b["eop"] == 0b0101 and b["sop"] == 0b1010
    assert two_ok and third
    # short frames from quarter 3 run into the next beat
    assert any(s == 3 and QUARTER < len(f) < MIN_FRAME for f, s in zip(frames, starts))
    assert any(s == 3 and len(f) == MIN_FRAME and _expected_ok(f) for f, s in zip(frames, starts))
    # the corruptions do what they say (model verdicts)
    for f, kind in pairs:
        assert _expected_ok(f) == (kind in ("none", "variant", "eth")), (kind, len(f))
    assert {"bit", "icrc", "variant", "eth", "short"} <= {k for _, k in pairs}

    p_gap, p_stall = (0.25, 0.3) if mode == "stalls" else (0.0, 0.0)
    out, stats = _run(beats, p_gap, p_stall, rnd)

    assert len(out) == len(beats)
    verdicts = []
    for n, (b, o) in enumerate(zip(beats, out)):
        assert o["data"] == b["tdata"], n
        assert (o["sop"], o["eop"]) == (b["sop"], b["eop"]), n
        for q in range(QUARTERS):
            assert o["ebytes"][q] == _contiguous(b["tkeep"] >> (QUARTER * q) & QMASK), (n, q)
            if b["eop"] >> q & 1:
                verdicts.append(o["icrc_ok"] >> q & 1)
            else:
                assert not o["icrc_ok"] >> q & 1, (n, q)
    assert len(verdicts) == len(frames)
    for k, ((f, kind), s, got) in enumerate(zip(pairs, starts, verdicts)):
        assert got == _expected_ok(f), f"frame {k} ({len(f)} bytes from quarter {s}, {kind}): icrc_ok {got}"
    if mode == "full_rate":
        assert stats["not_ready"] == 0
        assert stats["cycles"] == len(beats) + 1        # one beat per cycle, one register
    else:
        assert stats["not_ready"] > 0


def _padded_frames(rnd):
    """(frame, kind, start quarter or None) triples around Ethernet padding: 58- and
    59-byte packets (a 0-byte SEND ONLY and WRITE MIDDLE; a 1-byte SEND ONLY and WRITE
    LAST without the IBTA pad) padded to 60 bytes with zeros or with other bytes, with a
    right ICRC, a wrong one, a bit flipped; 60-byte frames whose last 4 bytes are the
    ICRC of the 56 before them although their IPv4 length says 58 (not ok), unpadded
    60-byte frames (IPv4 length 46) right, with a wrong ICRC and with the ICRC of their
    first 54 bytes in front of the last two (not ok); a 60-byte frame with IPv4 length
    43 (checked whole); each from every quarter and back to back with ACKs and each
    other."""
    qp = QpContext(qpn=3, remote_qpn=0x1234, dmac=0x020000000002, dip=0x0A000002, mtu=1024)
    port = Port(smac=0x020000000001, sip=0x0A000001)

    def psn():
        return rnd.randrange(1 << 24)

    def packet(n):
        """A real packet of ``n`` (58 or 59) bytes, no IBTA pad."""
        op = rnd.choice([F.Op.SEND_ONLY, F.Op.WRITE_MIDDLE if n == MIN_FRAME else F.Op.WRITE_LAST])
        f = build_rc_frame(qp, port, op, psn(), b"", rnd.randbytes(n - MIN_FRAME), pad=False)
        assert len(f) == n and _ip_len(f) == n - F.OFF_IP
        return f

    def pad(f, zeros=True):
        return f + (bytes(PAD_FRAME - len(f)) if zeros else rnd.randbytes(PAD_FRAME - len(f)))

    def tail_icrc(n):
        """A padded frame whose last 4 bytes are the ICRC of the 56 bytes before them."""
        f = bytearray(pad(packet(n)))
        f[-4:] = _icrc_unchecked(bytes(f[:-4]))
        return bytes(f)

    def exact():
        """An unpadded 60-byte frame: WRITE MIDDLE with 2 payload bytes (IPv4 length 46)."""
        return build_packet(qp, port, F.Op.WRITE_MIDDLE, psn(), rnd.randbytes(2), pad=False)

    def exact_early_icrc():
        """Unpadded 60 bytes whose bytes 54..57 are the ICRC of the 54 bytes before."""
        f = bytearray(exact())
        f[54:58] = _icrc_unchecked(bytes(f[:54]))
        return bytes(f)

    def ip_len_43():
        """60 bytes, IPv4 length 43 (a 57-byte packet: too short), a right ICRC over all 60."""
        f = bytearray(exact()[:-4])
        f[F.OFF_IP + 2:F.OFF_IP + 4] = (43).to_bytes(2, "big")
        f[F.OFF_IP + 10:F.OFF_IP + 12] = bytes(2)
        f[F.OFF_IP + 10:F.OFF_IP + 12] = ipv4_checksum(bytes(f[F.OFF_IP:F.OFF_UDP])).to_bytes(2, "big")
        return bytes(f) + _icrc_unchecked(bytes(f))

    def corrupt_icrc(f):
        """The packet's ICRC (in front of the padding) changed."""
        f = bytearray(f)
        end = len(_packet(bytes(f)))
        f[end - 4:end] = bytes(a ^ b for a, b in zip(f[end - 4:end], rnd.randrange(1, 1 << 32).to_bytes(4, "little")))
        return bytes(f)

    def flip(f):
        """A bit of the BTH, payload or ICRC flipped (the IPv4 and UDP headers have checks
        of their own in front of the ICRC's)."""
        f = bytearray(f)
        end = len(_packet(bytes(f)))
        pos = rnd.choice([i for i in range(F.OFF_BTH, end) if i not in MASKED])
        f[pos] ^= 1 << rnd.randrange(8)
        return bytes(f)

    makers = {
        "pad_zero": lambda n: pad(packet(n)),
        "pad_bytes": lambda n: pad(packet(n), zeros=False),         # what the pad holds does not matter
        "pad_icrc": lambda n: corrupt_icrc(pad(packet(n), zeros=rnd.random() < 0.5)),
        "pad_bit": lambda n: flip(pad(packet(n), zeros=rnd.random() < 0.5)),
        "pad_tail_icrc": tail_icrc,
        "exact": lambda n: exact(),
        "exact_icrc": lambda n: corrupt_icrc(exact()),
        "exact_early_icrc": lambda n: exact_early_icrc(),
        "ip_len_43": lambda n: ip_len_43(),
    }
    items = []
    for kind, make in makers.items():
        for n in (MIN_FRAME, MIN_FRAME + 1):
            for s in range(QUARTERS):
                items.append((make(n), kind, s))
                items.append((make(n), kind, None))          # behind whatever came before
    # ACKs (62 bytes) between them: a padded frame and an ACK ending in one beat
    for _ in range(24):
        items.append((build_response(qp, port, psn(), 0, psn()), "ack", None))
    rnd.shuffle(items)
    return items


@pytest.mark.parametrize("mode", ["stalls", "full_rate"])
def test_padded_60_byte_frames(mode):
    """60-byte frames that carry a 58- or 59-byte packet and Ethernet padding (a 0-byte
    SEND ONLY from rxe; a peer without the IBTA pad): the verdict is on the ICRC in front
    of the padding, whatever the pad bytes hold, as parse_frame checks it; a wrong ICRC
    there is refused, and so is a right CRC in the last 4 bytes; unpadded 60-byte frames
    are checked on their last 4 bytes. From every quarter (from quarter 3 across two
    beats), two ends in a beat, with stalls and at full rate."""
    rnd = random.Random(60 if mode == "stalls" else 59)
    pairs, starts = _place(_padded_frames(rnd))
    frames = [f for f, _ in pairs]
    want = {"pad_zero": 1, "pad_bytes": 1, "pad_icrc": 0, "pad_bit": 0, "pad_tail_icrc": 0,
            "exact": 1, "exact_icrc": 0, "exact_early_icrc": 0, "ip_len_43": 1, "ack": 1, "none": 1}
    opcodes = {F.Op.SEND_ONLY, F.Op.WRITE_MIDDLE, F.Op.WRITE_LAST, F.Op.ACK}
    for f, kind in pairs:
        assert _expected_ok(f) == want[kind], kind
        # the model's own verdict: every frame here has right headers, so the ICRC decides,
        # except the too-short packet behind padding (a length drop before the ICRC)
        _, reason = parse_frame(f, opcodes)
        assert reason == ("bad_length" if kind == "ip_len_43" else None if want[kind] else "bad_icrc"), (kind, reason)
    # every kind from every quarter; padded ones from quarter 3 run into the next beat
    assert {(k, s) for (f, k), s in zip(pairs, starts) if len(f) == PAD_FRAME} \
        == {(k, s) for k in want if k not in ("ack", "none") for s in range(QUARTERS)}
    beats = _mac_beats(frames, rnd)
    k = 0
    two = set()
    for b in beats:
        mine = [pairs[k + j][1] for j in range(bin(b["eop"]).count("1"))]
        k += len(mine)
        if len(mine) == 2:
            two |= set(mine)
    assert {"pad_zero", "pad_bytes", "pad_icrc", "pad_tail_icrc", "ack"} <= two

    p_gap, p_stall = (0.25, 0.3) if mode == "stalls" else (0.0, 0.0)
    out, _ = _run(beats, p_gap, p_stall, rnd)
    verdicts = [o["icrc_ok"] >> q & 1 for o in out for q in range(QUARTERS) if o["eop"] >> q & 1]
    assert len(verdicts) == len(frames)
    wrong = {}                       # kind -> [(frame, IPv4 length, start quarter)] with a wrong verdict
    for k, ((f, kind), s, got) in enumerate(zip(pairs, starts, verdicts)):
        if got != want[kind]:
            wrong.setdefault(kind, []).append((k, _ip_len(f), s))
    assert not wrong, "wrong verdicts (frame, IPv4 length, start quarter): " + "; ".join(
        f"{kind} ({sum(k == kind for _, k in pairs)} frames): {v}" for kind, v in sorted(wrong.items()))
