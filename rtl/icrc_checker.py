"""Receive side of the ICRC: the MAC RX adapter and the ICRC check.

``MacRxAdapter`` turns the MAC RX AXI-Stream (the segment format of MAC TX,
docs/interfaces.md) into :func:`~rtl.rx_beat.RxBeat` beats; ``IcrcChecker`` marks
each frame's last beat with ``icrc_ok``.
"""
import struct
import zlib

from amaranth.hdl import *
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from spec import formats as F
from . import icrc_math
from .axi import AxiStreamSignature
from .rx_beat import RxBeat, SEGMENT as SEG

__all__ = ["MacRxAdapter", "IcrcChecker", "RESIDUE", "MIN_FRAME"]

BEAT = 128

# Shortest frame with a whole BTH and an ICRC; shorter ones are reported not ok.
MIN_FRAME = F.OFF_BTH + F.BTH_LEN + F.ICRC_LEN


def _register(msg):
    """The unit's CRC register after ``msg``: zero start, first 4 bytes inverted (icrc_math)."""
    return icrc_math.crc_bits(0, int.from_bytes(msg, "little") ^ 0xFFFFFFFF, 8 * len(msg))


def _derive_residue():
    """The register after a message followed by its own CRC-32 (little-endian).

    Before the CRC bytes the register holds ``~crc`` (zlib's final inversion undone);
    feeding 32 data bits equals xoring them into the register and stepping 32 zero
    bits, so the register becomes ``crc_bits(~crc ^ crc, 0, 32)`` =
    ``crc_bits(0xFFFFFFFF, 0, 32)`` whatever the message. Checked below against zlib
    on messages of different lengths.
    """
    residue = icrc_math.crc_bits(0xFFFFFFFF, 0, 32)
    for msg in (b"\xff" * 8, bytes(range(61)), b"\xff" * 8 + bytes(200)):
        whole = msg + struct.pack("<I", zlib.crc32(msg))
        assert _register(whole) == residue
        assert zlib.crc32(whole) == residue ^ 0xFFFFFFFF      # the same seen through zlib
    return residue


RESIDUE = _derive_residue()     # 0xDEBB20E3, the CRC-32 residue

# The register after the residue and k zero bytes, k = 0..127: a beat's lanes past a
# frame's end are fed as zeros, and the zero-byte step is invertible, so comparing
# with this table is the same as removing the zeros (the inserter's unshift) and
# comparing with RESIDUE, without 7 matrix stages behind the XOR tree.
_RESIDUE_AFTER_ZEROS = tuple(icrc_math.crc_bits(RESIDUE, 0, 8 * k) for k in range(BEAT))


class MacRxAdapter(wiring.Component):
    """Decodes the MAC RX segment format into receive beats, without latency.

    A frame starts at lane 0 on the first beat after reset and on the beat after a
    ``tlast`` beat without ``tuser``. ``tuser`` = 1 on a ``tlast`` beat: the current
    frame ends in lanes 0..63 and the next starts at lane 64, running into the next
    beat. ``nbytes`` is the count of contiguous ``tkeep`` ones from lane 0 (within
    lanes 0..63 when ``tuser``; 128 on a full beat). Back-pressure passes straight
    through; the only state is whether the next beat continues a frame.

    Members
    -------
    i : In(AxiStreamSignature(data_width=1024, user_width=1))
        MAC RX (``tdata``, ``tkeep``, ``tvalid``, ``tready``, ``tlast``, ``tuser``), sink.
    o : Out(stream.Signature(RxBeat()))
        The same beats with ``sop``, ``last``, ``nbytes`` and ``sop_hi``; ``icrc_ok`` = 0.
    """
    def __init__(self):
        super().__init__({"i": In(AxiStreamSignature(data_width=8 * BEAT, user_width=1)),
                          "o": Out(stream.Signature(RxBeat(BEAT)))})

    def elaborate(self, platform):
        m = Module()
        cont = Signal()         # lane 0 of the next beat continues a frame

        # Lanes past the lower segment do not belong to the current frame on a tuser beat.
        keep = Signal(BEAT)
        m.d.comb += keep.eq(Mux(self.i.tuser[0], self.i.tkeep[:SEG], self.i.tkeep))
        zeros = Signal(BEAT)
        m.d.comb += zeros.eq(~keep)
        lowest = Signal(BEAT)       # one-hot: the lowest lane without keep
        m.d.comb += lowest.eq(zeros & (~zeros + 1))
        count = Signal(8)           # its lane number (one-hot to binary); 128 when all are kept
        m.d.comb += count.eq(Cat(*[Cat(*[lowest[j] for j in range(BEAT) if (j >> b) & 1]).any()
                                   for b in range(7)], zeros == 0))

        m.d.comb += [
            self.o.valid.eq(self.i.tvalid),
            self.i.tready.eq(self.o.ready),
            self.o.p.data.eq(self.i.tdata),
            self.o.p.sop.eq(~cont),
            self.o.p.last.eq(self.i.tlast),
            self.o.p.nbytes.eq(count),
            self.o.p.sop_hi.eq(self.i.tlast & self.i.tuser[0]),
        ]
        with m.If(self.i.tvalid & self.o.ready):
            m.d.sync += cont.eq(~self.i.tlast | self.i.tuser[0])
        return m


class IcrcChecker(wiring.Component):
    """Checks the RoCEv2 ICRC of every received frame, one beat per cycle.

    The receiver learns a frame's length only on its last beat, so the CRC runs over
    the whole frame including its 4 ICRC bytes: for a right ICRC the register then
    holds the constant residue (``RESIDUE``). The message and masks are those of
    ``IcrcInserter`` (SPEC section 5): from frame byte 6, bytes 6-13 as the 0xFF
    prefix, IPv4 TOS, TTL, header checksum, UDP checksum and BTH byte 4 as 0xFF, for
    a frame starting at lane 0 or at lane 64. A 1024-bit parallel CRC in two 512-bit
    halves takes a beat per cycle, so a beat can end one frame and start the next.
    On the last beat the lanes past the frame are fed as zeros and the register is
    compared with the residue advanced by that many zero bytes. Frames shorter than
    ``MIN_FRAME`` (58) bytes, or with a malformed ``nbytes``, are reported not ok.

    Members
    -------
    i : In(stream.Signature(RxBeat()))
        Receive beats (``icrc_ok`` ignored).
    o : Out(stream.Signature(RxBeat()))
        The same beats one cycle later; ``icrc_ok`` set on a frame's last beat when
        its ICRC is right, 0 on every other beat.
    """
    def __init__(self):
        super().__init__({"i": In(stream.Signature(RxBeat(BEAT))),
                          "o": Out(stream.Signature(RxBeat(BEAT)))})

    def elaborate(self, platform):
        m = Module()
        a_cols, b_cols = icrc_math.update_matrices(8 * BEAT)
        half = 8 * SEG
        beat = self.i.p
        state = Signal(32)      # CRC register of the frame that continues into the next beat

        # The current frame ("A", the one holding lane 0) owns lanes 0..nbytes-1 of its
        # last beat; the lanes behind it may hold anything.
        past = Signal(range(BEAT))      # lanes past A's end (an nbytes over 128 is refused below)
        m.d.comb += past.eq(Mux(beat.last & (beat.nbytes < BEAT), BEAT - beat.nbytes, 0))
        shamt = Signal(range(8 * BEAT))
        m.d.comb += shamt.eq(past * 8)
        keep = Signal(8 * BEAT)
        m.d.comb += keep.eq(Const((1 << (8 * BEAT)) - 1, 8 * BEAT) >> shamt)

        first_mask, first_zero, ones = icrc_math.first_segment_masks(BEAT)
        first = first_mask & ~first_zero & ((1 << (8 * BEAT)) - 1)
        masked = Signal(8 * BEAT)           # A's message bytes in this beat
        with m.If(beat.sop):
            m.d.comb += masked.eq(((beat.data & first) | ones) & keep)
        with m.Else():
            m.d.comb += masked.eq(beat.data & keep)
        # The next frame ("B") from lane 64 when sop_hi: its whole first segment (it runs
        # into the next beat), masks shifted by one segment.
        seg_mask = (1 << half) - 1
        masked_b = Signal(half)
        m.d.comb += masked_b.eq((beat.data[half:] & (first & seg_mask)) | (ones & seg_mask))

        # One 1024-bit CRC step as two halves: when B starts, A's bytes are all in the
        # lower half and the upper half's product alone is B's starting register
        # (zero register, zeros in front cost nothing).
        upper = Signal(half)
        m.d.comb += upper.eq(Mux(beat.sop_hi, masked_b, masked[half:]))
        lo = Signal(32)
        hi = Signal(32)
        m.d.comb += [lo.eq(icrc_math.apply(b_cols[:half], masked[:half], half)),
                     hi.eq(icrc_math.apply(b_cols[half:], upper, half))]
        s_in = Signal(32)
        m.d.comb += s_in.eq(Mux(beat.sop, 0, state))
        hi_a = Signal(32)
        m.d.comb += hi_a.eq(Mux(beat.sop_hi, 0, hi))
        s_new = Signal(32)
        m.d.comb += s_new.eq(icrc_math.apply(a_cols, s_in, 32) ^ lo ^ hi_a)

        # Verdict on A's last beat: its register, advanced by the zero lanes past its end.
        expect = Signal(32)
        with m.Switch(past):
            for n, value in enumerate(_RESIDUE_AFTER_ZEROS):
                with m.Case(n):
                    m.d.comb += expect.eq(value)
        well_formed = Signal()
        m.d.comb += well_formed.eq((beat.nbytes != 0) & (beat.nbytes <= Mux(beat.sop_hi, SEG, BEAT))
                                   & ~(beat.sop & (beat.nbytes < MIN_FRAME)))
        ok = Signal()
        m.d.comb += ok.eq(beat.last & well_formed & (s_new == expect))

        # One register stage.
        m.d.comb += self.i.ready.eq(~self.o.valid | self.o.ready)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [self.o.valid.eq(1), self.o.p.eq(beat), self.o.p.icrc_ok.eq(ok)]
            with m.If(beat.sop_hi):
                m.d.sync += state.eq(hi)
            with m.Elif(~beat.last):
                m.d.sync += state.eq(s_new)
        return m
