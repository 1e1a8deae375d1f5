"""Shares the DMA master: read requests of the WQE and payload fetch, writes of the CQE writer."""
from amaranth.hdl import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .axi import AxiReadSignature, AxiWriteSignature, AxiSignature

__all__ = ["DmaArbiter"]

_AR = ("arid", "araddr", "arlen", "arsize", "arburst", "arlock", "arcache", "arprot")
_R = ("rid", "rdata", "rresp", "rlast")


class DmaArbiter(wiring.Component):
    """Two AXI4 read masters and one write master onto one AXI4 master.

    AR: the WQE fetch wins when both ask (its reads are short and gate all the rest);
    a request once shown is held until accepted, as AXI requires. R: routed by ARID
    (0 = WQE fetch, 1 = payload fetch); both consumers reserve buffer space before
    they read, so R never stalls. AW/W/B pass straight through.

    Members
    -------
    wqe, payload : In(AxiReadSignature)
    cqe : In(AxiWriteSignature)
    bus : Out(AxiSignature)
    """
    def __init__(self, *, data_width=1024, id_width=4):
        rd = AxiReadSignature(addr_width=64, data_width=data_width, id_width=id_width)
        wr = AxiWriteSignature(addr_width=64, data_width=data_width, id_width=id_width)
        super().__init__({
            "wqe": In(rd), "payload": In(rd), "cqe": In(wr),
            "bus": Out(AxiSignature(addr_width=64, data_width=data_width, id_width=id_width)),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        locked = Signal()
        grant = Signal()            # 0 wqe, 1 payload
        sel = Signal()
        m.d.comb += sel.eq(Mux(locked, grant, ~self.wqe.arvalid))
        src = [self.wqe, self.payload]
        with m.If(sel):
            m.d.comb += [getattr(bus, n).eq(getattr(self.payload, n)) for n in _AR]
            m.d.comb += [bus.arvalid.eq(self.payload.arvalid), self.payload.arready.eq(bus.arready)]
        with m.Else():
            m.d.comb += [getattr(bus, n).eq(getattr(self.wqe, n)) for n in _AR]
            m.d.comb += [bus.arvalid.eq(self.wqe.arvalid), self.wqe.arready.eq(bus.arready)]
        with m.If(bus.arvalid & ~bus.arready):
            m.d.sync += [locked.eq(1), grant.eq(sel)]
        with m.Else():
            m.d.sync += locked.eq(0)

        for s in src:
            m.d.comb += [getattr(s, n).eq(getattr(bus, n)) for n in _R]
        m.d.comb += [
            self.wqe.rvalid.eq(bus.rvalid & (bus.rid == 0)),
            self.payload.rvalid.eq(bus.rvalid & (bus.rid != 0)),
            bus.rready.eq(Mux(bus.rid == 0, self.wqe.rready, self.payload.rready)),
        ]
        for name, member in self.cqe.signature.members.items():
            if member.flow == In:       # driven by the CQE writer (flipped view)
                m.d.comb += getattr(bus, name).eq(getattr(self.cqe, name))
            else:
                m.d.comb += getattr(self.cqe, name).eq(getattr(bus, name))
        return m
