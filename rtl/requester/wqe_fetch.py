"""WQE fetch: AXI4 burst reads of WQEBBs from the send queues in GPU memory."""
from amaranth.hdl import *
from amaranth.lib import wiring, stream, fifo
from amaranth.lib.wiring import In, Out

from spec import formats as F
from spec.params import AXI_ID_WQE_FETCH
from rtl.common.axi import AxiReadSignature, Burst, Cache, beats_to_page_end
from rtl.requester.qp_table import FetchJob

__all__ = ["WqeFetch"]


class WqeFetch(wiring.Component):
    """Reads the WQEBBs of each burst as AXI bursts of 128-byte beats, two WQEBBs a beat.

    WQEBB n of a queue lives at ``sq_base + ((n & (depth - 1)) << 6)``. A job is read
    as runs of consecutive WQEBBs that stop at the ring end, at a 4 KiB boundary (AXI)
    and after ``max_run`` WQEBBs; a run is one INCR burst of 128-byte beats from the
    128-byte-aligned address below it, so a beat carries two WQEBBs (one at a run's
    ends when the run is not aligned). Each run is issued only when the WQEBB buffer
    has room for it (credits), so the read data channel never stalls; the buffer
    depth is the most WQEBBs in flight. The buffer is two FIFO banks (even and odd
    entries) so that a beat writes two WQEBBs while the parser reads one per cycle.

    Parameters
    ----------
    num_qps, num_cqs, max_burst : int
        As for :class:`QpTable` (``max_burst`` sizes the job's count field).
    buffer_depth : int
        WQEBBs buffered = most reads in flight (a power of two).
    max_run : int
        Most WQEBBs per AXI burst (even, at most 64: 4 KiB).

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
    def __init__(self, *, num_qps, num_cqs, max_burst, buffer_depth=512, max_run=32, data_width=1024,
                 id_width=4):
        if buffer_depth < 4 or buffer_depth & (buffer_depth - 1):
            raise ValueError(f"buffer_depth must be a power of two >= 4, not {buffer_depth}")
        if data_width != 2 * 8 * F.WQEBB:
            raise ValueError(f"data_width must be two WQEBBs (1024 bits), not {data_width}")
        if max_run < 2 or max_run % 2 or max_run > 64 or max_run > buffer_depth:
            raise ValueError(f"max_run must be even, 2..64 and within the buffer, not {max_run}")
        self.buffer_depth, self.max_run, self.data_width = buffer_depth, max_run, data_width
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
        bb = 8 * F.WQEBB
        half = self.buffer_depth // 2
        banks = [fifo.SyncFIFOBuffered(width=bb, depth=half) for _ in range(2)]
        m.submodules.bank0, m.submodules.bank1 = banks
        # Per burst: lane of its first WQEBB and its WQEBB count, for the read data.
        run_bits = self.max_run.bit_length()
        m.submodules.runs = runs = fifo.SyncFIFO(width=1 + run_bits, depth=self.buffer_depth)

        # Credits: WQEBBs requested whose data has not yet left the buffer.
        credits = Signal(range(self.buffer_depth + 1))
        issued = Signal(run_bits)
        popped = Signal()
        m.d.sync += credits.eq(credits + issued - popped)

        job = Signal.like(self.jobs.p)
        have = Signal()                  # a job is loaded and has WQEBBs left
        left = Signal.like(self.jobs.p.count)
        index = Signal(16)
        depth = Signal(17)
        m.d.comb += depth.eq(1 << job.cfg.log_depth)
        slot = Signal(16)
        m.d.comb += slot.eq(index & (depth - 1))
        addr = Signal(64)
        m.d.comb += addr.eq(job.cfg.sq_base + (slot << 6))
        # WQEBBs of this run: to the ring end, to the 4 KiB boundary, max_run, what is left.
        run = Signal(run_bits)
        to_end = Signal(17)
        to_4k = Signal(7)
        m.d.comb += [to_end.eq(depth - slot), to_4k.eq(beats_to_page_end(addr, 6))]
        cands = [left, to_end, to_4k]
        smallest = C(self.max_run, run_bits)
        for c in cands:
            smallest = Mux(c < smallest, c, smallest)
        m.d.comb += run.eq(smallest)
        beats = Signal(range(self.max_run // 2 + 2))
        m.d.comb += beats.eq((addr[6] + run + 1) >> 1)

        m.d.comb += [
            dma.arid.eq(AXI_ID_WQE_FETCH), dma.araddr.eq(Cat(C(0, 7), addr[7:])), dma.arlen.eq(beats - 1), dma.arsize.eq(7),
            dma.arburst.eq(Burst.INCR), dma.arcache.eq(Cache.NORMAL_NON_CACHEABLE_BUFFERABLE),
        ]
        fire = Signal()
        last_run = Signal()
        m.d.comb += [
            dma.arvalid.eq(have & (credits + run <= self.buffer_depth) & runs.w_rdy),
            fire.eq(dma.arvalid & dma.arready),
            last_run.eq(fire & (run == left)),
        ]
        # The next job is taken in the cycle of the last run, so bursts follow back to back.
        free = Signal()
        m.d.comb += [
            free.eq(~have | last_run),
            self.bursts.valid.eq(self.jobs.valid & free), self.bursts.p.eq(self.jobs.p),
            self.jobs.ready.eq(self.bursts.ready & free),
        ]
        with m.If(fire):
            m.d.comb += [issued.eq(run), runs.w_en.eq(1), runs.w_data.eq(Cat(addr[6], run))]
            m.d.sync += [left.eq(left - run), index.eq(index + run)]
            with m.If(last_run):
                m.d.sync += have.eq(0)
        with m.If(self.jobs.valid & self.jobs.ready & ~self.jobs.p.bf):     # BlueFlame: nothing to read
            m.d.sync += [job.eq(self.jobs.p), left.eq(self.jobs.p.count), index.eq(self.jobs.p.ci),
                         have.eq(1)]

        # Read data: every WQEBB has a buffer slot already, so R never stalls.
        lane0 = Signal()                 # lane of the next WQEBB in the current burst
        rem = Signal(run_bits)           # its WQEBBs still to come
        started = Signal()
        m.d.comb += dma.rready.eq(1)
        cur_lane = Mux(started, lane0, runs.r_data[0])
        cur_rem = Mux(started, rem, runs.r_data[1:])
        two = Signal()
        m.d.comb += two.eq((cur_lane == 0) & (cur_rem >= 2))
        wp = Signal()                    # bank of the next entry written
        rp = Signal()                    # bank of the next entry read
        first = dma.rdata.word_select(cur_lane, bb)
        second = dma.rdata[bb:]
        with m.If(dma.rvalid):
            n = Mux(two, 2, 1)
            with m.If(two):
                m.d.comb += [banks[0].w_en.eq(1), banks[1].w_en.eq(1)]
                m.d.comb += [banks[0].w_data.eq(Mux(wp, second, first)), banks[1].w_data.eq(Mux(wp, first, second))]
            with m.Else():
                for k in range(2):
                    m.d.comb += [banks[k].w_en.eq(wp == k), banks[k].w_data.eq(first)]
            m.d.sync += wp.eq(wp ^ (n == 1))
            with m.If(cur_rem == n):
                m.d.comb += runs.r_en.eq(1)
                m.d.sync += started.eq(0)
            with m.Else():
                m.d.sync += [started.eq(1), lane0.eq(0), rem.eq(cur_rem - n)]

        head = Mux(rp, banks[1].r_data, banks[0].r_data)
        head_valid = Mux(rp, banks[1].r_rdy, banks[0].r_rdy)
        m.d.comb += [self.wqebbs.valid.eq(head_valid), self.wqebbs.p.eq(head)]
        with m.If(self.wqebbs.valid & self.wqebbs.ready):
            m.d.comb += [popped.eq(1), banks[0].r_en.eq(rp == 0), banks[1].r_en.eq(rp == 1)]
            m.d.sync += rp.eq(~rp)
        return m
