"""WQE fetch: AXI4 reads of WQEBBs from the send queues in GPU memory."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream, fifo
from amaranth.lib.wiring import In, Out

from spec import formats as F
from .axi import AxiReadSignature
from .qp_table import FetchJob

__all__ = ["WqeFetch"]


class WqeFetch(wiring.Component):
    """Reads the WQEBBs of each burst, one 64-byte read per WQEBB per cycle, many in flight.

    WQEBB n of a queue lives at ``sq_base + ((n & (depth - 1)) << 6)``, so a WQE that
    wraps the ring end is read in two places without special cases. Reads are issued
    only while the WQEBB buffer has room for their data (a credit per buffer slot), so
    the read data channel never stalls and up to ``buffer_depth`` reads are in flight.

    Parameters
    ----------
    num_qps, num_cqs, max_burst : int
        As for :class:`QpTable`.
    buffer_depth : int
        WQEBBs buffered = most reads in flight.
    data_width : int
        DMA data width in bits (1024).

    Members
    -------
    jobs : In(stream.Signature(FetchJob))
    bursts : Out(stream.Signature(FetchJob))
        Each accepted job, in order, for the WQE parser.
    wqebbs : Out(stream.Signature(512))
        The WQEBBs, in order.
    dma : Out(AxiReadSignature)
        ARID 0; R beats arrive here already routed by ID.
    """
    def __init__(self, *, num_qps, num_cqs, max_burst, buffer_depth=16, data_width=1024, id_width=4):
        if buffer_depth < 2 or buffer_depth & (buffer_depth - 1):
            raise ValueError(f"buffer_depth must be a power of two >= 2, not {buffer_depth}")
        if data_width < 512:
            raise ValueError(f"data_width must be at least one WQEBB (512 bits), not {data_width}")
        self.buffer_depth, self.data_width = buffer_depth, data_width
        job = FetchJob(num_qps, num_cqs, max_burst)
        super().__init__({
            "jobs": In(stream.Signature(job)),
            "bursts": Out(stream.Signature(job)),
            "wqebbs": Out(stream.Signature(8 * F.WQEBB)),
            "dma": Out(AxiReadSignature(addr_width=64, data_width=data_width, id_width=id_width)),
        })

    def elaborate(self, platform):
        m = Module()
        dma = self.dma
        lanes = self.data_width // (8 * F.WQEBB)          # WQEBBs per data beat
        m.submodules.buf = buf = fifo.SyncFIFOBuffered(width=8 * F.WQEBB, depth=self.buffer_depth)
        m.submodules.lane = lane = fifo.SyncFIFO(width=max(1, (lanes - 1).bit_length()),
                                                         depth=self.buffer_depth)

        # Credits: reads issued whose WQEBB has not yet left the buffer.
        credits = Signal(range(self.buffer_depth + 1))
        issue = Signal()
        m.d.sync += credits.eq(credits + issue - (buf.r_rdy & buf.r_en))

        job = Signal.like(self.jobs.p)
        have = Signal()                  # a job is loaded and has reads left
        left = Signal.like(self.jobs.p.count)
        index = Signal(16)
        addr = Signal(64)
        m.d.comb += addr.eq(job.cfg.sq_base
                            + ((index & ((1 << job.cfg.log_depth) - 1)) << 6))
        m.d.comb += [
            dma.arid.eq(0), dma.araddr.eq(addr), dma.arlen.eq(0), dma.arsize.eq(6),
            dma.arburst.eq(1), dma.arcache.eq(0b0011),
        ]
        # One read per cycle; the next job is taken in the cycle of the last read, so
        # bursts follow each other without a gap.
        fire = Signal()
        m.d.comb += [dma.arvalid.eq(have & (credits < self.buffer_depth)), fire.eq(dma.arvalid & dma.arready)]
        take = Signal()
        m.d.comb += [
            take.eq(self.jobs.valid & self.bursts.ready & (~have | (fire & (left == 1)))),
            self.bursts.valid.eq(self.jobs.valid & (~have | (fire & (left == 1)))),
            self.bursts.p.eq(self.jobs.p),
            self.jobs.ready.eq(self.bursts.ready & (~have | (fire & (left == 1)))),
        ]
        with m.If(fire):
            m.d.comb += [issue.eq(1), lane.w_en.eq(1), lane.w_data.eq(addr[6:6 + len(lane.w_data)])]
            m.d.sync += [left.eq(left - 1), index.eq(index + 1)]
            with m.If(left == 1):
                m.d.sync += have.eq(0)
        with m.If(take):
            m.d.sync += [job.eq(self.jobs.p), left.eq(self.jobs.p.count), index.eq(self.jobs.p.ci),
                         have.eq(1)]

        # Read data: a buffer slot is reserved for every read, so always ready.
        m.d.comb += [
            dma.rready.eq(1),
            buf.w_en.eq(dma.rvalid), lane.r_en.eq(dma.rvalid),
            buf.w_data.eq(dma.rdata.word_select(lane.r_data, 8 * F.WQEBB) if lanes > 1 else dma.rdata),
            self.wqebbs.valid.eq(buf.r_rdy), self.wqebbs.p.eq(buf.r_data), buf.r_en.eq(self.wqebbs.ready),
        ]
        return m
