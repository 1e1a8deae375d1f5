"""The beat format of the receive path, from the MAC RX port to the responder.

MAC RX (``s_axis_rx``) uses the segment format of MAC TX (docs/interfaces.md): frames
start at lane 0 or lane 64; on a beat with ``tuser`` = 1 the current frame ends in
lanes 0..63 (tkeep lanes 0..n-1, tlast = 1) and the next frame starts at lane 64 and
runs into the next beat. So a NIC receives exactly the beat stream a peer's MAC TX
sends, at the same rate. Inside, the receive blocks carry :func:`RxBeat`: the same
data with the frame boundaries decoded once.
"""
from amaranth.hdl import unsigned
from amaranth.lib import data

from .tx_beat import SEGMENT

__all__ = ["RxBeat", "SEGMENT"]


def RxBeat(data_bytes=128):
    """Layout of one receive beat.

    Members
    -------
    data : the beat's bytes, byte 0 in bits [7:0].
    sop : a frame starts at lane 0 of this beat.
    last : the current frame (the one holding lane 0) ends in this beat.
    nbytes : on a ``last`` beat, the current frame's bytes from lane 0 (1..128; 1..64
        when ``sop_hi``).
    sop_hi : a frame starts at lane 64 and continues into the next beat (only with
        ``last``).
    icrc_ok : on a ``last`` beat after the ICRC check, the current frame's ICRC is right
        (0 before the check).
    """
    return data.StructLayout({
        "data":    unsigned(8 * data_bytes),
        "sop":     unsigned(1),
        "last":    unsigned(1),
        "nbytes":  unsigned(8),
        "sop_hi":  unsigned(1),
        "icrc_ok": unsigned(1),
    })
