"""Where a CQE64 goes in its CQ and how one is written: shared by the send side's
``CqeWriter`` and the receive side's ``RecvCqeWriter``."""
from amaranth.hdl import *

from spec import formats as F
from rtl.common.axi import Burst, Cache
from rtl.common.headers import header_layout

__all__ = ["Cqe64", "cqe_place", "cqe_write_const", "cqe_beat"]

Cqe64 = header_layout(F.CQE64)
assert Cqe64.size == 8 * F.CQE_SIZE


def cqe_place(entry):
    """``(addr, owner)`` of the next CQE of the CQ whose ``CqEntry`` is ``entry``.

    CQE number k (the producer count) goes to slot ``k & (depth - 1)`` of a ring CQ, or to
    slot 0 of a collapsed CQ (NVSHMEM's choice), with the owner bit ``(k >> log_depth) & 1``,
    which flips on every wrap as libmlx5's poll expects."""
    cfg = entry.cfg
    slot = Mux(cfg.collapsed, 0, entry.count & ((1 << cfg.log_depth) - 1))
    return (cfg.base + (slot << 6))[:64], (entry.count >> cfg.log_depth)[0]


def cqe_write_const(dma, awid):
    """The AXI write fields that are the same for every CQE: one 64-byte beat, ID ``awid``,
    B always taken (nothing waits for it)."""
    return [dma.awid.eq(awid), dma.awlen.eq(0), dma.awsize.eq(6), dma.awburst.eq(Burst.INCR),
            dma.awcache.eq(Cache.NORMAL_NON_CACHEABLE_BUFFERABLE), dma.wlast.eq(1), dma.bready.eq(1)]


def cqe_beat(cqe, addr, data_width):
    """``(wdata, wstrb)`` of the beat that writes the CQE64 ``cqe`` at ``addr``: the CQE in
    every 64-byte lane, the strobes on the lane ``addr`` falls in."""
    per_beat = data_width // (8 * F.CQE_SIZE)
    lane = addr[6:6 + max(1, (per_beat - 1).bit_length())] if per_beat > 1 else C(0, 1)
    return (cqe.as_value().replicate(per_beat),
            Const((1 << F.CQE_SIZE) - 1, data_width // 8) << (lane * F.CQE_SIZE))
