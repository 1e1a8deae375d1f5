"""Atomic DMA: the atomic unit's word reads and write-throughs as one-beat AXI4 bursts."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from spec import params as P
from rtl.common.axi import AxiReadSignature, AxiWriteSignature, Burst, Cache
from rtl.responder.atomic_unit import AtomicWordWrite

__all__ = ["AtomicDma"]

BEAT = P.DATA_BYTES
LANE_BITS = (BEAT // 8 - 1).bit_length()      # 8-byte lanes of a beat


class AtomicDma(wiring.Component):
    """Puts the :class:`~rtl.responder.atomic_unit.AtomicUnit`'s 8-byte word reads and
    writes on AXI4: each one a one-beat burst of size 8 (ARID ``AXI_ID_ATOMIC_READ``,
    AWID ``AXI_ID_ATOMIC_WRITE``), the word in its lane of the 128-byte bus.

    A read's AR is held in a register until taken; its lane waits in a queue for the R
    beat (one ID: R in AR order). A write's AW and W go out together, each held until
    taken; a B is a write done. One read and one write a cycle.

    Parameters
    ----------
    reads : int
        Reads in flight (a power of two): the AtomicUnit's cache entries are enough.

    Members
    -------
    rd_req : In(stream.Signature({addr}))
    rd_resp : Out(stream.Signature(64))
    wr_req : In(stream.Signature(AtomicWordWrite))
        A word and its byte strobes (a 4-byte atomic writes only its half).
    wr_done : Out(1)
    rd : Out(AxiReadSignature)
    wr : Out(AxiWriteSignature)
    """
    def __init__(self, *, reads=64):
        if not isinstance(reads, int) or reads < 2 or reads & (reads - 1):
            raise ValueError(f"reads must be a power of two >= 2, not {reads!r}")
        self.reads = reads
        kw = dict(addr_width=P.DMA_ADDR_WIDTH, data_width=8 * BEAT, id_width=P.AXI_ID_WIDTH)
        super().__init__({
            "rd_req": In(stream.Signature(data.StructLayout({"addr": unsigned(64)}))),
            "rd_resp": Out(stream.Signature(unsigned(64))),
            "wr_req": In(stream.Signature(AtomicWordWrite)),
            "wr_done": Out(1),
            "rd": Out(AxiReadSignature(**kw)),
            "wr": Out(AxiWriteSignature(**kw)),
        })

    def elaborate(self, platform):
        m = Module()
        rd, wr = self.rd, self.wr
        # ---- reads ----
        m.submodules.lanes = lanes = SyncFIFOBuffered(width=LANE_BITS, depth=self.reads)
        ar_valid, ar_addr = Signal(), Signal(64)
        take_r = Signal()
        m.d.comb += [self.rd_req.ready.eq((~ar_valid | rd.arready) & lanes.w_rdy),
                     take_r.eq(self.rd_req.valid & self.rd_req.ready),
                     lanes.w_en.eq(take_r), lanes.w_data.eq(self.rd_req.p.addr[3:3 + LANE_BITS])]
        with m.If(take_r):
            m.d.sync += [ar_valid.eq(1), ar_addr.eq(self.rd_req.p.addr)]
        with m.Elif(rd.arready):
            m.d.sync += ar_valid.eq(0)
        m.d.comb += [rd.arvalid.eq(ar_valid), rd.arid.eq(P.AXI_ID_ATOMIC_READ), rd.araddr.eq(ar_addr),
                     rd.arlen.eq(0), rd.arsize.eq(3), rd.arburst.eq(Burst.INCR),
                     rd.arcache.eq(Cache.NORMAL_NON_CACHEABLE_BUFFERABLE),
                     self.rd_resp.valid.eq(rd.rvalid), self.rd_resp.p.eq(rd.rdata.word_select(lanes.r_data, 64)),
                     rd.rready.eq(self.rd_resp.ready), lanes.r_en.eq(rd.rvalid & rd.rready)]
        # ---- writes ----
        aw_valid, w_valid = Signal(), Signal()
        w_addr, w_data, w_strb = Signal(64), Signal(64), Signal(8)
        take_w = Signal()
        m.d.comb += [self.wr_req.ready.eq((~aw_valid | wr.awready) & (~w_valid | wr.wready)),
                     take_w.eq(self.wr_req.valid & self.wr_req.ready)]
        with m.If(take_w):
            m.d.sync += [aw_valid.eq(1), w_valid.eq(1), w_addr.eq(self.wr_req.p.addr), w_data.eq(self.wr_req.p.data),
                         w_strb.eq(self.wr_req.p.strb)]
        with m.Else():
            with m.If(wr.awready):
                m.d.sync += aw_valid.eq(0)
            with m.If(wr.wready):
                m.d.sync += w_valid.eq(0)
        lane = w_addr[3:3 + LANE_BITS]
        m.d.comb += [wr.awvalid.eq(aw_valid), wr.awid.eq(P.AXI_ID_ATOMIC_WRITE), wr.awaddr.eq(w_addr),
                     wr.awlen.eq(0), wr.awsize.eq(3), wr.awburst.eq(Burst.INCR),
                     wr.awcache.eq(Cache.NORMAL_NON_CACHEABLE_BUFFERABLE),
                     wr.wvalid.eq(w_valid), wr.wdata.eq(w_data.replicate(BEAT // 8)),
                     wr.wstrb.eq(w_strb.as_unsigned() << (lane * 8)), wr.wlast.eq(1),
                     wr.bready.eq(1), self.wr_done.eq(wr.bvalid)]
        return m
