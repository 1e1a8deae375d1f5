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

__all__ = ["IcrcChecker", "RESIDUE", "MIN_FRAME", "PAD_FRAME", "PAD_IP_LENGTHS"]

BEAT = DATA_BYTES             # 128 bytes
assert BEAT == QUARTER * QUARTERS

# Shortest frame with a whole BTH and an ICRC; shorter ones are reported not ok.
MIN_FRAME = F.OFF_BTH + F.BTH_LEN + F.ICRC_LEN
# The checker's length test relies on it: a frame of one quarter is too short, one of
# three or more long enough, one of two long enough from MIN_FRAME - 32 bytes in the second.
assert QUARTER < MIN_FRAME <= 2 * QUARTER + 1

# Ethernet padding: a frame of PAD_FRAME (60) bytes may carry a shorter IPv4 packet and
# zero bytes up to the Ethernet minimum behind it (model.parse.parse_frame cuts the
# frame at the IPv4 length). Only packets of MIN_FRAME (58) or 59 bytes can be checked,
# so the IPv4 total lengths 44 and 45, with 2 and 1 pad bytes; shorter ones are too
# short whatever the ICRC says (RxHeaderParser drops them as BAD_LENGTH).
PAD_FRAME = F.ETH_MIN_FRAME
PAD_IP_LENGTHS = {PAD_FRAME - F.OFF_IP - k: k for k in (1, 2)}     # {45: 1, 44: 2}
IP_LEN_AT = F.OFF_IP + F.get_field(F.IPV4, "total_len")[0]        # frame bytes 16-17, big-endian
# The checker's use of them: the IPv4 length lies in a frame's first quarter, a 60-byte
# frame ends in its second with PAD_EBYTES bytes there, and its pad bytes are the last
# one or two of those.
PAD_EBYTES = PAD_FRAME - QUARTER
assert IP_LEN_AT + 2 <= QUARTER < PAD_FRAME <= 2 * QUARTER and PAD_FRAME - max(PAD_IP_LENGTHS.values()) == MIN_FRAME


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

    Ethernet padding (``model.parse.parse_frame``'s rule): a packet shorter than 60
    bytes arrives padded to ``PAD_FRAME`` (60) bytes by the MAC, and the packet ends
    where its IPv4 total length (frame bytes 16-17) says. A 60-byte frame whose IPv4
    length is 44 or 45 (a packet of 58 or 59 bytes: a 0-byte SEND ONLY, or a 1-byte one
    without the IBTA pad) is checked as that packet: its last 2 or 1 bytes are zeroed in
    the message like the lanes past a frame's end, and the register is compared with the
    residue advanced by those bytes as well, so ``icrc_ok`` is the verdict on the ICRC in
    front of the padding, whatever the pad bytes hold (IEEE 802.3 pads with zeros; the
    model ignores them, and so does this check). The IPv4 length is read in the frame's
    first quarter (from quarter 3 of the last beat for a frame ending in quarter 0, kept
    in a register). Every other frame, a 60-byte one with IPv4 length 46 included, is
    checked on its last 4 bytes; a 60-byte frame with an IPv4 length under 44 too (a
    packet too short for a BTH and an ICRC: the header parser drops it as BAD_LENGTH
    before it looks at ``icrc_ok``).

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

        # Ethernet padding: per quarter, the pad bytes a 60-byte frame starting there
        # would carry by its IPv4 length (bit 0: one, tl 45; bit 1: two, tl 44); a frame
        # ending in its second quarter takes them from the quarter before it, from
        # quarter 3 of the last beat for quarter 0.
        ip_len_of = {k: tl for tl, k in PAD_IP_LENGTHS.items()}     # pad bytes -> IPv4 length
        pads = []
        for q in range(QUARTERS):
            d = beat.data[qbits * q:qbits * (q + 1)]
            ip_len = Signal(16, name=f"ip_len{q}")
            m.d.comb += ip_len.eq(Cat(d[8 * (IP_LEN_AT + 1):8 * (IP_LEN_AT + 2)], d[8 * IP_LEN_AT:8 * (IP_LEN_AT + 1)]))
            pad = Signal(2, name=f"pad{q}")
            m.d.comb += pad.eq(Cat(ip_len == ip_len_of[1], ip_len == ip_len_of[2]))
            pads.append(pad)
        pad_carry = Signal(2)   # quarter 3's pad bits, for a frame that ends in the next beat

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
            # A 60-byte frame (ending in its second quarter with 28 bytes there) whose
            # IPv4 length is 44 or 45: its last 2 or 1 bytes are Ethernet padding, not
            # part of the message. cut[0]: lane 27 is padding, cut[1]: lane 26 too.
            pad_first = pads[q - 1] if q else pad_carry
            is_min = Signal(name=f"is_min{q}")
            m.d.comb += is_min.eq((n == 1) & (ebytes == PAD_EBYTES))
            cut = Signal(2, name=f"cut{q}")
            m.d.comb += cut.eq(Cat(is_min & pad_first.any(), is_min & pad_first[1]))
            # Bytes past the frame's end are zeroed (they may hold anything), and so are
            # the pad bytes: their contents do not matter, as in parse_frame.
            lane_cut = {PAD_EBYTES - 1: cut[0], PAD_EBYTES - 2: cut[1]}
            keep = Signal(qbits, name=f"keep{q}")
            m.d.comb += keep.eq(Cat(*[(~eop | ((ebytes > i) & ~lane_cut[i] if i in lane_cut else (ebytes > i))).replicate(8)
                                      for i in range(QUARTER)]))
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
            # a padded frame: its message ends 1 or 2 bytes before the quarter's data does
            with m.If(cut[1]):
                m.d.comb += expect.eq(_RESIDUE_AFTER_ZEROS[BEAT - QUARTER * q - (PAD_EBYTES - 2)])
            with m.Elif(cut[0]):
                m.d.comb += expect.eq(_RESIDUE_AFTER_ZEROS[BEAT - QUARTER * q - (PAD_EBYTES - 1)])
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
                         is_open.eq(open_before), state.eq(reg), run.eq(before), pad_carry.eq(pads[-1])]
        return m
