"""MacRxAdapter + IcrcChecker in Amaranth's simulator: real RoCEv2 frames in the MAC TX
segment format, back to back, verdicts against the golden model (model.icrc)."""
import random
import struct
import zlib

import pytest
from amaranth.hdl import Elaboratable, Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from model.frames import Port, QpContext, build_packet, build_write_frames
from model.icrc import icrc
from model.rc import build_response
from rtl import icrc_math
from rtl.icrc_checker import MIN_FRAME, RESIDUE, IcrcChecker, MacRxAdapter
from spec import formats as F

BEAT = 128
SEG = 64
MASKED = {o + i for o, w in F.ICRC_MASKED for i in range(w)}


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


def _frames(rnd):
    """(frame, kind) pairs: WRITE frames whose ICRC lands in every position class, 62-byte
    ACKs, frames at the length limit, each maybe corrupted (kind says how)."""
    qp = QpContext(qpn=3, remote_qpn=0x1234, dmac=0x020000000002, dip=0x0A000002, mtu=1024,
                   start_psn=0xFFFFFE)
    port = Port(smac=0x020000000001, sip=0x0A000001)

    def rand(n):
        return bytes(rnd.randrange(256) for _ in range(n))

    def write(p):
        return build_write_frames(qp, port, 0x1000 + p, 0x55, rand(p), rnd.randrange(1 << 24))

    def middle(p):                   # WRITE MIDDLE: 58 + p bytes
        return build_packet(qp, port, F.Op.WRITE_MIDDLE, rnd.randrange(1 << 24), rand(p))

    def ack():
        return build_response(qp, port, rnd.randrange(1 << 24), 0, rnd.randrange(1 << 24))

    def trap(cut):
        """A WRITE ONLY whose bytes cut-4..cut-1 are the ICRC of the bytes before: the
        register holds the residue after byte cut-1 although the frame goes on."""
        payload = bytearray(rand(300))
        f = build_write_frames(qp, port, 0, 0x55, bytes(payload), 0)[0]
        payload[cut - 4 - F.HDR_LEN_RETH:cut - F.HDR_LEN_RETH] = _icrc_unchecked(f[:cut - 4])
        f = build_write_frames(qp, port, 0, 0x55, bytes(payload), 0)[0]
        assert f[cut - 4:cut] == _icrc_unchecked(f[:cut - 4])
        return f

    # Groups of frames, shuffled; a group's first frame starts as follows. A frame of more
    # than 68 bytes starts at lane 64 behind a 62-byte ACK or a 64-byte WRITE MIDDLE and
    # at lane 0 behind a 66-byte one. WRITE ONLY = 74 + p bytes. From lane 0: ICRC within
    # a beat (p < 54), ending it (54, 182), straddling by 1..3 (55..57, 183..185); from
    # lane 64: ending (118, 246), straddling (119..121, 247..249); multi-beat up to 3
    # packets at MTU 1024. The edge sizes go both ways, the others at random.
    before = {0: lambda: [middle(8)], SEG: lambda: [rnd.choice([ack, lambda: middle(6)])()],
              None: lambda: []}
    edges = [54, 55, 56, 57, 118, 119, 120, 121, 182, 183, 184, 185, 246, 247, 248, 249]
    sizes = [(p, lane) for p in edges for lane in (0, SEG)]
    sizes += [(p, rnd.choice([None, 0, SEG])) for p in
              [0, 1, 2, 3, 8, 12, 26, 50, 51, 52, 53, 58, 60, 62, 90, 117, 122, 150, 181, 186, 245, 250,
               500, 1000, 2600] + [rnd.randrange(2100) for _ in range(8)]]
    groups = [[(f, None) for f in before[lane]() + write(p)] for p, lane in sizes]
    groups += [
        # ends exactly at lane 64 with the next frame behind it (tuser, nbytes 64)
        [(f, None) for f in [ack()] + write(54) + write(30)],
        [(f, None) for f in [middle(6)] + write(10)],
        # the residue reached inside a frame: no verdict before the last beat
        [(middle(8), None), (trap(BEAT), "none")],
        [(ack(), None), (trap(BEAT + SEG), "none")],
    ]
    body54 = ack()[:54]                                  # Ethernet/IPv4/UDP/BTH only
    body53 = ack()[:53]
    groups.append([(body54 + icrc(body54), "none"),      # 58 bytes, the shortest ok frame
                   (body53 + _icrc_unchecked(body53), "short"),  # 57 bytes, CRC right, too short
                   (rand(20), "short"), (rand(1), "short")])
    rnd.shuffle(groups)
    frames = [x for g in groups for x in g]
    out = []
    for f, kind in frames:
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
        out.append((bytes(f), kind))
    return out


def _expected_ok(f):
    return len(f) >= MIN_FRAME and f[-4:] == icrc(f[:-4])


def _pack(frames, rnd):
    """MAC beats for ``frames`` with the packing rule of the TX path (tests/test_blocks.py
    ``_beats``): a frame of more than 68 bytes starts at lane 64 behind a last beat of at
    most 64 bytes, else at the next beat. Lanes without tkeep get garbage on some beats.
    Returns (beats, starts): beats as dicts of the AXI fields and the expected RxBeat,
    starts the stream offset of each frame."""
    stream = bytearray()
    starts = []
    for f in frames:
        if stream and len(stream) % BEAT and len(stream) % BEAT <= SEG and len(f) > 68:
            stream += bytes(SEG - len(stream) % BEAT)
        elif len(stream) % BEAT:
            stream += bytes(BEAT - len(stream) % BEAT)
        starts.append(len(stream))
        stream += f
    stream += bytes(-len(stream) % BEAT)
    beats = []
    k = 0                            # the frame holding lane 0 of the beat
    for b in range(len(stream) // BEAT):
        lo, hi = b * BEAT, (b + 1) * BEAT
        end = starts[k] + len(frames[k])
        last = end <= hi
        n = end - lo if last else BEAT
        sop_hi = last and k + 1 < len(frames) and starts[k + 1] == lo + SEG
        keep = (1 << n) - 1
        if sop_hi:
            keep |= ((1 << SEG) - 1) << SEG
        data = int.from_bytes(stream[lo:hi], "little")
        if rnd.random() < 0.5:      # the MAC need not zero the lanes it does not keep
            dead = sum(0xFF << (8 * i) for i in range(BEAT) if not (keep >> i) & 1)
            data |= rnd.getrandbits(8 * BEAT) & dead
        beats.append({"tdata": data, "tkeep": keep, "tlast": int(last), "tuser": int(sop_hi),
                      "sop": int(starts[k] == lo), "nbytes": n, "frame": k})
        if last:
            k += 1
    assert k == len(frames)
    return beats, starts


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
        # every set, which matters with three 512-bit XOR trees in the simulator.
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
                    out.append({"tdata": p.data, "sop": p.sop, "last": p.last, "nbytes": p.nbytes,
                                "sop_hi": p.sop_hi, "icrc_ok": p.icrc_ok})
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


def _position_classes(frames, starts):
    """(start lane, where the ICRC ends) for each frame: within a beat, ending one, or
    straddling into the next by 1..3 bytes; and the most beats one frame spans."""
    classes = set()
    for f, s in zip(frames, starts):
        r = (s + len(f)) % BEAT
        classes.add((s % BEAT, "ends" if r == 0 else f"straddle{r}" if r < 4 else "within"))
    spans = max((s + len(f) - 1) // BEAT - s // BEAT + 1 for f, s in zip(frames, starts))
    return classes, spans


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


@pytest.mark.parametrize("mode", ["stalls", "full_rate"])
def test_icrc_checker(mode):
    """Every frame's verdict equals the model's, every beat passes unchanged and in order,
    with random stalls and gaps; at full rate one beat per cycle."""
    rnd = random.Random(2024 if mode == "stalls" else 4202)
    pairs = _frames(rnd)
    frames = [f for f, _ in pairs]
    beats, starts = _pack(frames, rnd)
    classes, spans = _position_classes(frames, starts)
    want = {(lane, c) for lane in (0, SEG) for c in ("within", "ends", "straddle1", "straddle2", "straddle3")}
    assert want <= classes, want - classes
    assert spans >= 9 and any(b["tuser"] and b["nbytes"] == SEG for b in beats)
    # the corruptions do what they say (model verdicts)
    for f, kind in pairs:
        assert _expected_ok(f) == (kind in ("none", "variant", "eth")), (kind, len(f))
    assert {"bit", "icrc", "variant", "eth", "short"} <= {k for _, k in pairs}
    assert any(len(f) == MIN_FRAME and _expected_ok(f) for f in frames)

    p_gap, p_stall = (0.25, 0.3) if mode == "stalls" else (0.0, 0.0)
    out, stats = _run(beats, p_gap, p_stall, rnd)

    assert len(out) == len(beats)
    verdicts = []
    for n, (b, o) in enumerate(zip(beats, out)):
        where = f"beat {n} (frame {b['frame']} of {len(frames[b['frame']])} bytes)"
        assert o["tdata"] == b["tdata"], where
        assert (o["sop"], o["last"], o["sop_hi"]) == (b["sop"], b["tlast"], b["tuser"]), where
        if b["tlast"]:
            assert o["nbytes"] == b["nbytes"], where
            verdicts.append(o["icrc_ok"])
        else:
            assert o["icrc_ok"] == 0, where
    for k, ((f, kind), got) in enumerate(zip(pairs, verdicts)):
        assert got == _expected_ok(f), f"frame {k} ({len(f)} bytes, {kind}): icrc_ok {got}"
    if mode == "full_rate":
        assert stats["not_ready"] == 0
        assert stats["cycles"] == len(beats) + 1        # one beat per cycle, one register
