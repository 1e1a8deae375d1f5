"""Receive side of the ICRC: ``IcrcChecker`` sets ``icrc_ok`` in the quarter where each
frame with a right ICRC ends (beats from ``rtl.port.rx_adapter.MacRxAdapter``)."""
import struct
import zlib

from amaranth.hdl import *
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from spec import formats as F
from rtl.common import icrc_math
from rtl.common.rx_beat import RxBeat, QUARTER, QUARTERS
from spec.params import DATA_BYTES

__all__ = ["IcrcChecker", "RESIDUE", "MIN_FRAME"]

BEAT = DATA_BYTES             # 128 bytes
assert BEAT == QUARTER * QUARTERS

# Shortest frame with a whole BTH and an ICRC; shorter ones are reported not ok.
MIN_FRAME = F.OFF_BTH + F.BTH_LEN + F.ICRC_LEN
# The checker's length test relies on it: a frame of one quarter is too short, one of
# three or more long enough, one of two long enough from MIN_FRAME - 32 bytes in the second.
assert QUARTER < MIN_FRAME <= 2 * QUARTER + 1


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

# The register after the residue and k zero bytes, k = 0..127: a frame's register is
# taken at the end of its last beat, as if the lanes past its end were zeros, and the
# zero-byte step is invertible, so comparing with this table is the same as removing
# the zeros (the inserter's unshift) and comparing with RESIDUE, without 7 matrix
# stages behind the XOR tree.
_RESIDUE_AFTER_ZEROS = tuple(icrc_math.crc_bits(RESIDUE, 0, 8 * k) for k in range(BEAT))


class IcrcChecker(wiring.Component):
    """Checks the RoCEv2 ICRC of every received frame, one beat per cycle.

    The receiver learns a frame's length only at its end, so the CRC runs over the whole
    frame including its 4 ICRC bytes: for a right ICRC the register then holds the
    constant residue (``RESIDUE``). The message and masks are those of ``IcrcInserter``
    (SPEC section 5): from frame byte 6, bytes 6-13 as the 0xFF prefix, IPv4 TOS, TTL,
    header checksum, UDP checksum and BTH byte 4 as 0xFF; they lie in the frame's first
    two quarters, the second of which is quarter 0 of the next beat for a frame that
    starts at quarter 3.

    A beat can end two frames and start a third, so the 1024-bit parallel CRC is split
    into four 256-bit quarter products, each taken to the end of the beat: a frame's
    register at the beat's end is the carried register stepped over the beat (if the
    frame continues from the last beat) xor the products of its quarters, with the
    bytes past its end zeroed. In the quarter where a frame ends the register is
    compared with the residue advanced by the zero bytes from the frame's end to the
    beat's end. Frames shorter than ``MIN_FRAME`` (58) bytes, which may span two beats,
    or with a malformed ``ebytes`` (0 or over 32), or ending without a start, are
    reported not ok.

    Members
    -------
    i : In(stream.Signature(RxBeat()))
        Receive beats (``icrc_ok`` ignored).
    o : Out(stream.Signature(RxBeat()))
        The same beats one cycle later; ``icrc_ok[q]`` set with ``eop[q]`` when the
        frame ending in quarter q has a right ICRC, 0 elsewhere.
    """
    def __init__(self):
        super().__init__({"i": In(stream.Signature(RxBeat(BEAT))),
                          "o": Out(stream.Signature(RxBeat(BEAT)))})

    def elaborate(self, platform):
        m = Module()
        a_cols, b_cols = icrc_math.update_matrices(8 * BEAT)
        qbits = 8 * QUARTER
        beat = self.i.p

        # The frame open at the end of the last accepted beat.
        is_open = Signal()      # there is one (an end without a start is refused)
        state = Signal(32)      # its register
        run = Signal(2)         # its quarters so far, saturated at 2 (1: the next is its second)

        # The first two quarters' masks of a frame (message = (data & mask) | ones).
        first_mask, first_zero, ones = icrc_math.first_segment_masks(2 * QUARTER)
        first = first_mask & ~first_zero
        qmask = (1 << qbits) - 1
        masks = [(first >> (qbits * k)) & qmask for k in range(2)]
        fills = [(ones >> (qbits * k)) & qmask for k in range(2)]

        def next_run(n):
            return Mux(n == 2, 2, n + 1)

        # Walk the quarters: the register, length and openness of the frame holding each.
        reg = Signal(32)
        m.d.comb += reg.eq(icrc_math.apply(a_cols, state, 32))
        before = run            # quarters of the frame in front of this quarter
        open_before = is_open
        ok = Signal(QUARTERS)
        for q in range(QUARTERS):
            d = beat.data[qbits * q:qbits * (q + 1)]
            eop = beat.eop[q]
            ebytes = beat.ebytes[q]
            n = Signal(2, name=f"n{q}")             # the frame's quarters in front of this one
            m.d.comb += n.eq(Mux(beat.sop[q], 0, before))
            masked = Signal(qbits, name=f"masked{q}")
            with m.Switch(n):
                with m.Case(0):
                    m.d.comb += masked.eq((d & masks[0]) | fills[0])
                with m.Case(1):
                    m.d.comb += masked.eq((d & masks[1]) | fills[1])
                with m.Default():
                    m.d.comb += masked.eq(d)
            # Bytes past the frame's end are zeroed (they may hold anything).
            keep = Signal(qbits, name=f"keep{q}")
            m.d.comb += keep.eq(Cat(*[(~eop | (ebytes > i)).replicate(8) for i in range(QUARTER)]))
            msg = Signal(qbits, name=f"msg{q}")    # a signal: the products pick its bits one by one
            m.d.comb += msg.eq(masked & keep)
            product = Signal(32, name=f"product{q}")
            m.d.comb += product.eq(icrc_math.apply(b_cols[qbits * q:qbits * (q + 1)], msg, qbits))
            # A frame starting here has a zero register in front (zeros in front cost nothing).
            reg_q = Signal(32, name=f"reg{q}")
            m.d.comb += reg_q.eq(Mux(beat.sop[q], 0, reg) ^ product)
            active = Signal(name=f"active{q}")
            m.d.comb += active.eq(beat.sop[q] | open_before)

            expect = Signal(32, name=f"expect{q}")
            with m.Switch(ebytes):
                for e in range(1, QUARTER + 1):
                    with m.Case(e):
                        m.d.comb += expect.eq(_RESIDUE_AFTER_ZEROS[BEAT - QUARTER * q - e])
            # ebytes 1..32, and MIN_FRAME bytes: never in one quarter, always in three.
            well_formed = Signal(name=f"well_formed{q}")
            m.d.comb += well_formed.eq((ebytes != 0) & (ebytes <= QUARTER)
                                       & ((n == 2) | ((n == 1) & (ebytes >= MIN_FRAME - QUARTER))))
            m.d.comb += ok[q].eq(eop & active & well_formed & (reg_q == expect))

            reg = reg_q
            before = next_run(n)
            open_before = active & ~eop

        # One register stage.
        m.d.comb += self.i.ready.eq(~self.o.valid | self.o.ready)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [self.o.valid.eq(1), self.o.p.eq(beat), self.o.p.icrc_ok.eq(ok),
                         # quarter 3's frame, meaningful only while it stays open
                         is_open.eq(open_before), state.eq(reg), run.eq(before)]
        return m
