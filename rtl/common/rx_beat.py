"""The beat formats of the receive path.

MAC RX (``s_axis_rx``, docs/interfaces.md) starts frames on 32-byte boundaries: a
1024-bit beat is four quarters of 32 bytes, and ``tuser`` flags, per quarter, where a
frame starts (``tuser[q]``) and where one ends (``tuser[4 + q]``; ``tkeep`` marks its
bytes in that quarter from the quarter's first lane). A quarter holds bytes of at most
one frame, and a frame takes at least two quarters (the sender leaves the quarter after
a frame of 32 bytes or less empty, and never starts such a frame in quarter 3), so a
beat holds at most two frame starts and two frame ends. This is what keeps every frame size at the 400G line rate: a frame of
``n`` bytes costs ``32 * ceil(n / 32)`` bytes of the 128 bytes a cycle carries, never
more than the ``n + 24`` bytes of wire time (100 bytes a cycle) it takes to arrive.

Inside, the front of the receive path (ICRC check, header parser, beat buffer) carries
:func:`RxBeat`: the same data with the flags decoded once. The payload writer takes
only the frames it writes, repacked by :class:`~rtl.responder.resegmenter.RxResegmenter` into
:func:`RxSegmentBeat`: the 64-byte segment format of MAC TX.
"""
from amaranth.hdl import unsigned
from amaranth.lib import data

from spec.params import RX_START_BYTES as QUARTER
from rtl.common.tx_beat import SEGMENT

__all__ = ["RxBeat", "RxSegmentBeat", "QUARTER", "QUARTERS", "SEGMENT"]

QUARTERS = 4        # frame-start positions per 128-byte beat


def RxBeat(data_bytes=128):
    """Layout of one receive beat in the quarter format.

    Members
    -------
    data : the beat's bytes, byte 0 in bits [7:0].
    sop : 4 bits; bit q: a frame starts at lane ``32 q``.
    eop : 4 bits; bit q: a frame ends in quarter q (lanes ``32 q .. 32 q + 31``).
    ebytes : 4 x 6 bits; with ``eop[q]``, that frame's bytes in quarter q (1..32).
    icrc_ok : 4 bits; after the ICRC check, bit q with ``eop[q]``: the frame ending in
        quarter q has a right ICRC (0 before the check and without ``eop[q]``).
    """
    assert data_bytes == QUARTERS * QUARTER
    return data.StructLayout({
        "data":    unsigned(8 * data_bytes),
        "sop":     unsigned(QUARTERS),
        "eop":     unsigned(QUARTERS),
        "ebytes":  data.ArrayLayout(unsigned(6), QUARTERS),
        "icrc_ok": unsigned(QUARTERS),
    })


def RxSegmentBeat(data_bytes=128):
    """Layout of one beat into the payload writer: the 64-byte segment format.

    A frame starts at lane 0, or at lane 64 of the beat that ends the frame before it in
    lanes 0..63 (``sop_hi``); a frame that starts at lane 64 runs into the next beat.

    Members
    -------
    data : the beat's bytes, byte 0 in bits [7:0].
    last : the current frame (the one holding lane 0) ends in this beat.
    sop_hi : a frame starts at lane 64 and continues into the next beat (only with
        ``last``; the current frame then ends in lanes 0..63).
    """
    return data.StructLayout({
        "data":   unsigned(8 * data_bytes),
        "last":   unsigned(1),
        "sop_hi": unsigned(1),
    })
