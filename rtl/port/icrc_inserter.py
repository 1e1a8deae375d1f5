"""ICRC unit: computes each frame's invariant CRC and writes it into the frame's last 4 bytes."""
from amaranth.hdl import *
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from spec import formats as F
from rtl.common import icrc_math
from rtl.common.tx_beat import TxBeat, SEGMENT as SEG
from spec.params import DATA_BYTES

__all__ = ["IcrcInserter"]

BEAT = DATA_BYTES


_apply = icrc_math.apply


def _unshift(m, s, k, name):
    """Register ``s`` less ``k`` trailing zero bytes (k < 128): one conditional 32x32
    matrix per bit of ``k`` (a Signal per stage keeps the expression a DAG)."""
    for bit in range(len(k)):
        nxt = Signal(32, name=f"{name}{bit}")
        m.d.comb += nxt.eq(Mux(k[bit], _apply(icrc_math.unshift_matrix(1 << bit), s, 32), s))
        s = nxt
    return s


class IcrcInserter(wiring.Component):
    """Fills in the RoCEv2 ICRC, one beat per cycle.

    The CRC-32 (zlib) of SPEC section 5 runs over the frame from byte 6 with bytes
    6-13 forced to 0xFF (the 8-byte 0xFF prefix) and the variant fields (IPv4 TOS,
    TTL, checksum, UDP checksum, BTH byte 4) forced to 0xFF, through the payload.
    A 1024-bit parallel CRC takes a beat per cycle. The register starts at zero and
    the first four message bytes are inverted instead of loading all ones, so bytes
    in front of the message cost nothing; bytes after its end are fed as zeros and
    removed with the inverse zero-byte step (7 conditional 32x32 matrices, one per
    bit of the count). The result goes into the 4 bytes the builder reserved at the
    frame's end, even when they straddle two beats. A frame that starts at lane 64 and
    ends in the same beat (``end_hi``, at most 64 bytes) is finished in that beat: its
    register is the upper half's product, less its trailing zero bytes.

    Members
    -------
    i : In(stream.Signature(TxBeat))
    o : Out(stream.Signature(TxBeat))
        The same beats one cycle later, ICRC filled in.
    """
    def __init__(self, *, num_qps, num_cqs):
        layout = TxBeat(num_qps, num_cqs)
        super().__init__({"i": In(stream.Signature(layout)), "o": Out(stream.Signature(layout))})

    def elaborate(self, platform):
        m = Module()
        a_cols, b_cols = icrc_math.update_matrices(8 * BEAT)
        half = 8 * SEG
        beat = self.i.p

        index = Signal(range(512))      # beat number within the current frame
        off = Signal(range(BEAT))       # lane of the current frame's byte 0 (0 or 64)
        cur_flen = Signal(16)
        state = Signal(32)
        pending = Signal(32)            # ICRC bytes that spill into the next beat

        # The current frame ("A"): starts in this beat at lane 0 when index is 0.
        flen_a = Signal(16)
        off_a = Signal(range(BEAT))
        m.d.comb += [flen_a.eq(Mux(index == 0, beat.flen, cur_flen)), off_a.eq(Mux(index == 0, 0, off))]
        msg_end = Signal(17)            # message end, counted from lane 0 of the frame's first beat
        m.d.comb += msg_end.eq(flen_a - F.ICRC_LEN + off_a)

        # Mask the beat down to A's message bytes.
        keep_mask = Signal(8 * BEAT)
        count = Signal(range(BEAT + 1))        # A's message bytes in this beat, from lane 0
        with m.If(msg_end >= (index + 1) * BEAT):
            m.d.comb += count.eq(BEAT)
        with m.Elif(msg_end > index * BEAT):
            m.d.comb += count.eq(msg_end - index * BEAT)
        shamt = Signal(range(8 * BEAT + 1))
        m.d.comb += shamt.eq((BEAT - count) * 8)
        m.d.comb += keep_mask.eq(Const((1 << (8 * BEAT)) - 1, 8 * BEAT) >> shamt)
        # bytes before the message dropped, prefix bytes 0..3 zero (0xFF xor the initial
        # all-ones register), prefix bytes 4..7 and the variant fields all ones
        first_mask, first_zero, ones = icrc_math.first_segment_masks(BEAT)
        masked = Signal(8 * BEAT)
        with m.If(index == 0):
            m.d.comb += masked.eq(((beat.data & first_mask & ~first_zero) | ones) & keep_mask)
        with m.Else():
            m.d.comb += masked.eq(beat.data & keep_mask)
        # The next frame ("B") from lane 64 when sop_hi: its first segment, message bytes only
        # (the builder starts one there only when its message runs past the segment).
        full = (1 << (8 * BEAT)) - 1
        masked_b = Signal(8 * BEAT)
        m.d.comb += masked_b.eq((beat.data & ((first_mask & ~first_zero) << half) & full)
                                | ((ones << half) & full))

        # One 1024-bit CRC step, computed as two halves: A's bytes sit in lanes 0..63 of
        # a beat where B starts, so the upper half's product is B's starting register.
        upper = Signal(half)
        m.d.comb += upper.eq(Mux(beat.sop_hi, masked_b[half:], masked[half:]))
        lo = Signal(32)
        hi = Signal(32)
        m.d.comb += [lo.eq(_apply(b_cols[:half], masked[:half], half)),
                     hi.eq(_apply(b_cols[half:], upper, half))]
        has_msg = Signal()
        m.d.comb += has_msg.eq(count != 0)
        s_in = Mux(index == 0, 0, state)
        s_new = Signal(32)
        m.d.comb += s_new.eq(_apply(a_cols, s_in, 32) ^ lo ^ Mux(beat.sop_hi, 0, hi))

        # Final CRC when this beat holds A's last message byte.
        ends_msg = Signal()
        m.d.comb += ends_msg.eq(has_msg & (msg_end <= (index + 1) * BEAT))
        k = Signal(7)
        m.d.comb += k.eq((index + 1) * BEAT - msg_end)
        s = _unshift(m, s_new, k, "unshift")
        icrc = Signal(32)
        m.d.comb += icrc.eq(~s)
        ins = Signal(8 * BEAT + 32)
        qshift = Signal(range(8 * BEAT + 1))
        m.d.comb += qshift.eq((BEAT - k) * 8)
        m.d.comb += ins.eq(icrc << qshift)

        # A frame that starts at lane 64 and ends in this beat (end_hi): the upper half's
        # product less its trailing bytes, 68 - flen_hi of them (ICRC and beyond, zero).
        k_b = Signal(7)
        m.d.comb += k_b.eq(SEG + F.ICRC_LEN - beat.flen_hi)
        s_b = _unshift(m, hi, k_b, "unshift_hi")
        ins_b = Signal(8 * BEAT)
        m.d.comb += ins_b.eq((~s_b).as_unsigned() << ((beat.flen_hi[:7] + (SEG - F.ICRC_LEN)) * 8))

        # One register stage.
        m.d.comb += self.i.ready.eq(~self.o.valid | self.o.ready)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [self.o.valid.eq(1), self.o.p.eq(beat)]
            with m.If(beat.frame):
                with m.If(index == 0):
                    m.d.sync += [off.eq(0), cur_flen.eq(beat.flen)]
                with m.If(beat.sop_hi & beat.end_hi):
                    m.d.sync += index.eq(0)
                with m.Elif(beat.sop_hi):
                    m.d.sync += [index.eq(1), off.eq(SEG), cur_flen.eq(beat.flen_hi), state.eq(hi)]
                with m.Else():
                    m.d.sync += index.eq(Mux(beat.last, 0, index + 1))
                    with m.If(has_msg):
                        m.d.sync += state.eq(s_new)
                with m.If(ends_msg):
                    m.d.sync += [self.o.p.data.eq(beat.data | ins[:8 * BEAT] | Mux(beat.sop_hi & beat.end_hi, ins_b, 0)),
                                 pending.eq(ins[8 * BEAT:])]
                with m.Elif(index != 0):
                    # a beat with only (the rest of) the ICRC
                    with m.If(~has_msg):
                        m.d.sync += [self.o.p.data.eq(beat.data | pending), pending.eq(0)]
        return m
