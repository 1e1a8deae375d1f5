"""The beat format of the transmit path between the packet builder and the MAC port.

A beat carries up to two frames in 64-byte segments: the rest of the current frame
from lane 0 (``nbytes`` on its last beat) and, when ``sop_hi`` is set, the start of
the next frame in lanes 64..127. Then the current frame ends in lanes 0..63. With
``end_hi`` too, the frame at lane 64 is whole in this beat (``flen_hi`` <= 64 bytes):
the ACK builder puts two ACK frames in one beat that way.
"""
from amaranth.hdl import unsigned
from amaranth.lib import data

from spec.params import SEGMENT_BYTES
from rtl.common.records import Completion

__all__ = ["TxBeat", "SEGMENT"]

SEGMENT = SEGMENT_BYTES     # frames start on 64-byte boundaries


def TxBeat(num_qps, num_cqs, data_bytes=128):
    return data.StructLayout({
        "data":      unsigned(8 * data_bytes),   # frame bytes, byte 0 in bits [7:0]
        "nbytes":    unsigned(8),                # the current frame's bytes from lane 0 (last beat)
        "last":      unsigned(1),                # the current frame ends in this beat
        "frame":     unsigned(1),                # 0: a marker that only carries a completion
        "flen":      unsigned(16),               # current frame's length incl. ICRC (for the ICRC unit)
        "sop_hi":    unsigned(1),                # a frame starts at lane 64 (the current one ends in 0..63)
        "flen_hi":   unsigned(16),               # that frame's length
        "end_hi":    unsigned(1),                # with sop_hi: that frame also ends here (flen_hi <= 64)
        "cpl_valid": unsigned(1),                # on the last beat: write this completion
        "cpl":       Completion(num_qps, num_cqs),
        "answer":    unsigned(1),                # the responder's: a READ marker or ATOMIC ACK of a new
                                                 # READ or atomic of QP ``cpl.qpn`` (ResponseMerge)
    })
