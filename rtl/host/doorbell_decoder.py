"""UAR doorbell decoder: 8-byte doorbell writes on the AXI4 slave -> (QP, producer limit)."""
from amaranth.hdl import *
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from spec import formats as F
from rtl.common.axi import AxiWriteSignature, Resp
from rtl.common.records import DoorbellEvent

__all__ = ["DoorbellDecoder"]


class DoorbellDecoder(wiring.Component):
    """Decodes doorbell writes into the UAR BAR.

    QP n owns the page at ``n << 12``; its doorbell register sits at offset 0x800
    (0x900, BlueFlame's other half, is accepted too). The 8 bytes written are the
    first 8 of a control segment, ``{BE32(index << 8 | opcode), BE32(qpn << 8 | ds)}``;
    every WQEBB before ``index + ceil(ds / 4)`` is then ready. This one rule covers
    rdma-core (last WQE's ctrl words) and NVSHMEM (next free index, ds = 0).

    BlueFlame: a 64-byte burst (8 beats) to 0x800 or 0x900 carries a whole
    one-WQEBB WQE. Its first 8 bytes are the doorbell; the event also carries the
    WQEBB, so the engine can send it without reading the send queue.

    A write elsewhere in the page, a partial write, a QPN that does not match the
    page, a burst of another length or a page beyond the QP table is dropped and
    reported on ``dropped`` (once per write).
    Backpressure from ``events`` stalls W, so no doorbell is ever lost.

    Parameters
    ----------
    num_qps : int
        Number of QPs (pages) decoded.

    Members
    -------
    bus : In(AxiWriteSignature(addr 32, data 64))
    events : Out(stream.Signature(DoorbellEvent))
    accepted, dropped : Out(1)
        One-cycle strobes for the counters.
    """
    def __init__(self, *, num_qps, id_width=4):
        if num_qps < 1 or num_qps > (1 << 20):
            raise ValueError(f"num_qps must be 1..2**20, not {num_qps}")
        self.num_qps = num_qps
        super().__init__({
            "bus": In(AxiWriteSignature(addr_width=32, data_width=64, id_width=id_width)),
            "events": Out(stream.Signature(DoorbellEvent(num_qps))),
            "accepted": Out(1), "dropped": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        addr = Signal(32)
        bid = Signal.like(bus.awid)
        bf = Signal()                    # the write is a BlueFlame burst
        beat = Signal(3)
        ok = Signal()                    # every beat so far was good
        first = Signal(64)               # the burst's first 8 bytes (ctrl segment)
        wqebb = Signal(8 * F.WQEBB)

        def fields(word):
            byte = [word.word_select(i, 8) for i in range(8)]
            return Cat(byte[2], byte[1]), Cat(byte[6], byte[5], byte[4]), byte[7][:6]

        ctrl = Mux(beat == 0, bus.wdata, first)
        index, qpn_field, ds = fields(ctrl)
        page = addr[F.UAR_PAGE_SHIFT:]
        offset = addr[:F.UAR_PAGE_SHIFT] - (beat << 3)
        good = Signal()
        m.d.comb += good.eq((bus.wstrb == 0xFF)
                            & ((offset == F.UAR_DB_OFFSET) | (offset == F.UAR_DB_OFFSET_ALT))
                            & (page < self.num_qps) & (qpn_field == page)
                            & (~bf | ((ds + 3) >> 2 == 1)))
        m.d.comb += [
            self.events.p.qpn.eq(page),
            self.events.p.limit.eq(index + ((ds + 3) >> 2)),       # spec.formats.doorbell_limit
            self.events.p.bf.eq(bf),
            self.events.p.wqebb.eq(Cat(wqebb[64:], bus.wdata)),
        ]

        with m.FSM():
            with m.State("ADDR"):
                m.d.comb += bus.awready.eq(1)
                with m.If(bus.awvalid):
                    m.d.sync += [addr.eq(bus.awaddr), bid.eq(bus.awid), bf.eq(bus.awlen == 7),
                                 beat.eq(0), ok.eq(1)]
                    with m.If((bus.awlen != 0) & (bus.awlen != 7)):
                        m.d.sync += ok.eq(0)
                    m.next = "DATA"
            with m.State("DATA"):
                # A doorbell (or a BlueFlame burst's last beat) waits for the event queue.
                last = bus.wlast
                fire = last & ok & good
                m.d.comb += [
                    self.events.valid.eq(bus.wvalid & fire),
                    bus.wready.eq(~fire | self.events.ready),
                ]
                with m.If(bus.wvalid & bus.wready):
                    m.d.sync += [addr.eq(addr + 8), beat.eq(beat + 1), ok.eq(ok & good),
                                 wqebb.eq(Cat(wqebb[64:], bus.wdata))]
                    with m.If(beat == 0):
                        m.d.sync += first.eq(bus.wdata)
                    with m.If(last):
                        m.d.comb += [self.accepted.eq(ok & good), self.dropped.eq(~(ok & good))]
                        m.next = "RESP"
            with m.State("RESP"):
                m.d.comb += [bus.bvalid.eq(1), bus.bid.eq(bid), bus.bresp.eq(Resp.OKAY)]
                with m.If(bus.bready):
                    m.next = "ADDR"
        return m
