"""Receive resegmenter: the frames the payload writer takes, repacked from the quarter
format into the 64-byte segment format."""
from amaranth.hdl import *
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from rtl.common.rx_beat import RxBeat, RxSegmentBeat, QUARTER, QUARTERS
from rtl.common.records import RxKeepPair
from spec.params import DATA_BYTES

__all__ = ["RxResegmenter"]

BEAT = DATA_BYTES               # 128 bytes
assert BEAT == QUARTER * QUARTERS
QBITS = 8 * QUARTER
KEEP_SLOTS = 4                  # keep bits held: two needed per beat, a pair taken while <= 2 wait


def _lowest(bits):
    """Index of the lowest set bit of a 4-bit value (3 when none)."""
    return Mux(bits[0], 0, Mux(bits[1], 1, Mux(bits[2], 2, 3)))


class RxResegmenter(wiring.Component):
    """Passes the frames the payload writer must see from the receive beat buffer to it,
    repacked from the quarter format (:func:`rtl.common.rx_beat.RxBeat`) into the segment
    format (:func:`rtl.common.rx_beat.RxSegmentBeat`); drops the others.

    The payload writer realigns payloads with one shift of two beats and is built for
    frames that start at lane 0 or 64; MAC RX starts frames at any quarter (32 bytes).
    Repacking only the kept frames (the WRITE packets the header parser accepts) also
    means that ACKs and rejected frames cost the writer no cycles.

    A kept frame starts at lane 0 of a new output beat, or at lane 64 of the last output
    beat of the kept frame before it when all of these hold: that frame ends in lanes
    0..63; the new frame is longer than 64 bytes (it runs into the next beat, as the
    writer requires); and it starts in the input beat in which the frame before ends
    (dropped frames between them do not matter). The last condition keeps the decision
    local, so a frame's last output beat never waits for traffic that may not come;
    with it, kept frames of 76 bytes or more back to back still need no more output
    beats than their wire time in cycles (the tests count the cycles for 76..200 bytes
    and the output beats up to 9000).

    The keep bit of each frame comes on ``keep``: one transfer per beat in which frames
    end, in frame order, a few cycles after the frame's last beat. A beat is worked on
    once the keep bits of the frames that start in it are there (the frame in progress
    had its bit at its start); up to four bits wait inside, and a transfer is used in
    the cycle it arrives. So the beat buffer in front must hold the beats of the longest
    frame received (two frames when both start in one beat) plus the parser's latency,
    or the receive path stops for good.

    Realignment. Every output segment is two consecutive input quarters of one frame, so
    each half of an output beat is a shift by a multiple of 32 bytes of the window
    ``{cur, prev}`` (eight quarters, ``prev`` the last beat taken): lanes 0..63 take
    window quarters a, a + 1, lanes 64..127 quarters b + 2, b + 3. A frame keeps its
    shift from beat to beat; a and b differ only in the beat that ends one frame in its
    lower half and starts the next in its upper half. An input beat completes the output
    beats of up to three frames (the one in progress, the first and the second that
    start in it), each the beat that reaches window quarter a + 3 and the frame's last
    one; they go out one per cycle, in order. One case needs the next input beat: a
    kept frame starting in quarter 3 right behind a frame ending in lanes 0..63 goes to
    lane 64 only when its second quarter shows it longer than 64 bytes, so the lower
    half waits in ``held`` for one input beat.

    Throughput: one output beat per cycle (registered), and one input beat per cycle
    unless it completes more than one output beat; then one cycle per output beat, the
    input beat taken in the cycle of its last one. An input beat completes at most three
    (a beat holds at most two frame ends), two when the kept frames are longer than 64
    bytes. Beats whose frames are all dropped take one cycle each.

    Members
    -------
    beats : In(stream.Signature(RxBeat()))
        Every received frame, in order (``data``, ``sop`` and ``eop`` used).
    keep : In(stream.Signature(RxKeepPair))
        Per beat in which frames end, their keep bits (1: pass the frame on).
    o : Out(stream.Signature(RxSegmentBeat()))
        The kept frames, byte for byte and in order. Lanes outside frames hold anything.
    """
    def __init__(self):
        super().__init__({
            "beats": In(stream.Signature(RxBeat())),
            "keep": In(stream.Signature(RxKeepPair)),
            "o": Out(stream.Signature(RxSegmentBeat())),
        })

    def elaborate(self, platform):
        m = Module()
        beat, o = self.beats.p, self.o
        sop, eop = beat.sop, beat.eop
        eop5 = Cat(eop, C(0, 1))        # eop[q + 1] for q = 3 reads 0

        prev = Signal(8 * BEAT)
        win = Array([prev.word_select(q, QBITS) for q in range(QUARTERS)]
                    + [beat.data.word_select(q, QBITS) for q in range(QUARTERS)])

        # The frame in progress at the start of the beat (slot 0). Its shift a: the
        # window quarter of lane 0 of its output beat that completes next (1..4).
        in_frame = Signal()
        keep0 = Signal()
        a0 = Signal(4)
        def0 = Signal()                 # it started in quarter 3 behind the lower half in `held`
        held = Signal(2 * QBITS)        # lanes 0..63 of the output beat that waits for it

        # ---- keep bits: a queue of up to four, the arriving pair behind it ----------------
        kq = Signal(KEEP_SLOTS)
        klevel = Signal(range(KEEP_SLOTS + 1))
        take = Signal()
        m.d.comb += [self.keep.ready.eq(klevel <= KEEP_SLOTS - 2),    # registered: room for a pair
                     take.eq(self.keep.valid & self.keep.ready)]
        kin = Signal(2)
        m.d.comb += kin.eq(Mux(self.keep.p.second, self.keep.p.keep, self.keep.p.keep[0]))
        kv = Signal(KEEP_SLOTS + 2)
        avail = Signal(range(KEEP_SLOTS + 3))
        m.d.comb += [kv.eq(kq | (Mux(take, kin, 0) << klevel)),
                     avail.eq(klevel + Mux(take, 1 + self.keep.p.second, 0))]

        # ---- where the frames of this beat are ---------------------------------------------
        sop2 = Signal(QUARTERS)         # the second start
        m.d.comb += sop2.eq(Cat(C(0, 1), sop[1] & sop[0], sop[2] & (sop[:2] != 0), sop[3] & (sop[:3] != 0)))
        p1, p2 = Signal(), Signal()
        g1, g2 = Signal(2), Signal(2)
        m.d.comb += [p1.eq(sop != 0), p2.eq(sop2 != 0), g1.eq(_lowest(sop)), g2.eq(_lowest(sop2))]

        def end_from(g, present, name):
            # the first end at or after quarter g
            ends, e = Signal(name=f"ends_{name}"), Signal(2, name=f"e_{name}")
            tail = Signal(QUARTERS, name=f"eop_{name}")
            m.d.comb += [tail.eq(eop & (C(0b1111, QUARTERS) << g)[:QUARTERS]),
                         ends.eq(present & (tail != 0)), e.eq(_lowest(tail))]
            return ends, e

        ends0, e0 = end_from(C(0, 2), in_frame, "0")
        ends1, e1 = end_from(g1, p1, "1")
        ends2, e2 = end_from(g2, p2, "2")
        need = Signal(2)
        m.d.comb += need.eq(p1 + p2)
        k1, k2 = kv[0], kv[1]
        kept1, kept2 = Signal(), Signal()
        m.d.comb += [kept1.eq(p1 & k1), kept2.eq(p2 & k2)]

        def big(g):
            # a frame starting in quarter g <= 2 is longer than 64 bytes: no end in g, g + 1
            return ~(eop5.bit_select(g, 1) | eop5.bit_select(g + 1, 1))

        def slot(name, present, keep, a, ends, e):
            """A kept frame's output beats that complete in this beat: ``rh``, the one at
            shift a (the frame reaches window quarter a + 3); ``l``, its last one when that
            is another (at shift ``al``); ``lo``: ``l`` holds the frame in lanes 0..63 only
            (its end, window quarter 4 + e, is at most al + 1)."""
            rh, l, lo = Signal(name=f"rh{name}"), Signal(name=f"l{name}"), Signal(name=f"lo{name}")
            al = Signal(4, name=f"al{name}")
            m.d.comb += [
                rh.eq(present & keep & (a <= 4) & (~ends | (e + 1 >= a))),
                l.eq(present & keep & ends & ~(rh & (e + 1 == a))),
                al.eq(Mux(rh, a + 4, a)),
                lo.eq(l & (e + 3 <= al)),
            ]
            return rh, l, al, lo

        # Slot 0: after a deferral its shift is 1 at lane 64 (longer than 64 bytes: no end
        # in quarter 0), else 3 at lane 0.
        a0e = Signal(4)
        m.d.comb += a0e.eq(Mux(def0, Mux(eop[0], 3, 1), a0))
        rh0, l0, al0, lo0 = slot(0, in_frame, keep0, a0e, ends0, e0)

        # A frame ending in lanes 0..63 takes the next kept frame of this beat into lanes
        # 64..127 (pack), or holds its lower half when that frame starts in quarter 3 and
        # its length shows only in the next beat (defer).
        def follow(lo, has_n, g_n):
            pack, defer = Signal(), Signal()
            m.d.comb += [pack.eq(lo & has_n & (g_n <= 2) & big(g_n)),
                         defer.eq(lo & has_n & (g_n == 3) & ~eop[3])]
            return pack, defer

        g_n0 = Signal(2)
        m.d.comb += g_n0.eq(Mux(kept1, g1, g2))
        pack0, defer0 = follow(lo0, kept1 | kept2, g_n0)
        hi64_1 = Signal()               # slot 1 starts at lane 64
        m.d.comb += hi64_1.eq((pack0 | defer0) & kept1)
        # a frame starting in quarter g: lane 64 at window quarter 4 + g means a = 2 + g
        a1 = Signal(4)
        m.d.comb += a1.eq(Mux(hi64_1, 2 + g1, 4 + g1))
        rh1, l1, al1, lo1 = slot(1, p1, k1, a1, ends1, e1)
        pack1, defer1 = follow(lo1, kept2, g2)
        hi64_2 = Signal()
        m.d.comb += hi64_2.eq(((pack0 | defer0) & ~kept1 & kept2) | pack1 | defer1)
        a2 = Signal(4)
        m.d.comb += a2.eq(Mux(hi64_2, 2 + g2, 4 + g2))
        rh2, l2, al2, lo2 = slot(2, p2, k2, a2, ends2, e2)
        a_n0 = Signal(4)
        m.d.comb += a_n0.eq(Mux(kept1, a1, a2))

        # ---- the output beats this input beat completes, in order --------------------------
        # (active, lower half from `held`, shift of lanes 0..63, shift of lanes 64..127, last, sop_hi)
        # A frame's beat at shift a with the frame at lane 64 is the previous frame's last
        # beat. Slot 2 starts in quarter 2 or 3: its first beat completes here only so.
        cands = [
            (in_frame & def0 & eop[0], 1, 0, 0, 1, 0),      # held alone: 64 bytes or less behind it
            (rh0, def0, a0e, a0e, def0 | (ends0 & (e0 + 1 == a0e)), def0),
            (l0 & ~defer0, 0, al0, Mux(pack0, a_n0, al0), 1, pack0),
            (rh1 & ~hi64_1, 0, a1, a1, ends1 & (e1 + 1 == a1), 0),
            (l1 & ~defer1, 0, al1, Mux(pack1, a2, al1), 1, pack1),
            (l2, 0, al2, al2, 1, 0),
        ]
        n = len(cands)
        done = Signal(n)                # emitted in earlier cycles of this beat
        pending = Signal(n)
        m.d.comb += pending.eq(Cat(*(c[0] for c in cands)) & ~done)
        sel = Signal(n)
        lo_held, lo_sh, hi_sh, last, sop_hi = Signal(), Signal(4), Signal(4), Signal(), Signal()
        for i, (_, c_held, c_lo, c_hi, c_last, c_sop_hi) in enumerate(cands):
            with (m.If if i == 0 else m.Elif)(pending[i]):
                m.d.comb += [sel.eq(1 << i), lo_held.eq(c_held), lo_sh.eq(c_lo), hi_sh.eq(c_hi),
                             last.eq(c_last), sop_hi.eq(c_sop_hi)]
        more = Signal()
        m.d.comb += more.eq((pending & ~sel) != 0)

        # Output quarter p takes window quarter p + shift. Indices past 7 only fall on
        # lanes beyond a frame's end, and the upper half's shift is at most 5 where it
        # holds frame bytes: each quarter's mux has only the inputs it can need (7, 6,
        # 5, 4; quarter 0 of `prev` is never read).
        def pick(idx, lo, hi):
            return Array(win[lo:hi + 1])[Mux(idx < lo, 0, Mux(idx > hi, hi, idx) - lo)]

        out = Signal(8 * BEAT)
        m.d.comb += out.eq(Cat(Mux(lo_held, held, Cat(pick(lo_sh, 1, 7), pick(lo_sh + 1, 2, 7))),
                               pick(hi_sh + 2, 3, 7), pick(hi_sh + 3, 4, 7)))

        go, can_emit, emit, consume = Signal(), Signal(), Signal(), Signal()
        m.d.comb += [
            go.eq(self.beats.valid & (avail >= need)),
            can_emit.eq(~o.valid | o.ready),
            emit.eq(go & (pending != 0) & can_emit),
            # the beat goes with its last output beat, or at once when it completes none
            consume.eq(go & ((pending == 0) | (can_emit & ~more))),
            self.beats.ready.eq(consume),
        ]
        with m.If(emit):
            m.d.sync += [o.valid.eq(1), o.p.data.eq(out), o.p.last.eq(last), o.p.sop_hi.eq(sop_hi)]
        with m.Elif(o.ready):
            m.d.sync += o.valid.eq(0)
        with m.If(consume):
            m.d.sync += done.eq(0)
        with m.Elif(emit):
            m.d.sync += done.eq(done | sel)

        with m.If(consume):
            m.d.sync += [kq.eq((kv >> need)[:KEEP_SLOTS]), klevel.eq(avail - need)]
        with m.Else():
            m.d.sync += [kq.eq(kv[:KEEP_SLOTS]), klevel.eq(avail)]

        # ---- the frame in progress into the next beat ---------------------------------------
        def next_a(a):
            # its shift in the next window: 4 less, unless its output beat completed here
            return Mux(a <= 4, a, a - 4)

        with m.If(consume):
            m.d.sync += prev.eq(beat.data)
            with m.If(defer0 | defer1):
                # the deferring frame ends in quarter 0..2 of this beat, in lanes 0..63:
                # its shift is 3..6
                al_d = Mux(defer0, al0, al1)
                m.d.sync += [in_frame.eq(1), keep0.eq(1), def0.eq(1),
                             held.eq(Cat(pick(al_d, 3, 6), pick(al_d + 1, 4, 7)))]
            with m.Elif(p2 & ~ends2):
                m.d.sync += [in_frame.eq(1), keep0.eq(k2), a0.eq(next_a(a2)), def0.eq(0)]
            with m.Elif(p1 & ~p2 & ~ends1):
                m.d.sync += [in_frame.eq(1), keep0.eq(k1), a0.eq(next_a(a1)), def0.eq(0)]
            with m.Elif(in_frame & ~ends0):
                m.d.sync += [a0.eq(next_a(a0e)), def0.eq(0)]
            with m.Else():
                m.d.sync += [in_frame.eq(0), def0.eq(0)]
        return m
