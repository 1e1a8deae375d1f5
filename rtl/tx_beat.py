"""The beat format of the transmit path between the packet builder and the MAC port."""
from amaranth.hdl import unsigned
from amaranth.lib import data

from .message import Completion

__all__ = ["TxBeat"]


def TxBeat(num_qps, num_cqs, data_bytes=128):
    return data.StructLayout({
        "data":      unsigned(8 * data_bytes),   # frame bytes, byte 0 in bits [7:0]
        "nbytes":    unsigned(8),                # valid bytes from lane 0 (all on non-last beats)
        "last":      unsigned(1),
        "frame":     unsigned(1),                # 0: a marker that only carries a completion
        "flen":      unsigned(16),               # frame length incl. ICRC (for the ICRC unit)
        "cpl_valid": unsigned(1),                # on the last beat: write this completion
        "cpl":       Completion(num_qps, num_cqs),
    })
