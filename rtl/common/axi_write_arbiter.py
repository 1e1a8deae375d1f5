"""Two AXI4 write masters onto one: the CQE writer and the receive payload writer share ``m_axi``."""
from amaranth.hdl import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from rtl.common.axi import AxiWriteSignature

__all__ = ["AxiWriteArbiter"]

_AW = ("awid", "awaddr", "awlen", "awsize", "awburst", "awlock", "awcache", "awprot")
_W = ("wdata", "wstrb", "wlast")


class AxiWriteArbiter(wiring.Component):
    """Round-robin arbiter of two AXI4 write masters, one burst at a time.

    A grant covers one whole burst: it is taken when an AW is shown, held from the AW
    handshake until the W beat with ``wlast`` (so W beats follow AW order, as AXI4
    requires without write interleaving), then the other master is preferred. A master
    may show W before its AW is accepted; only the granted master's channels reach the
    bus. B is routed back by BID: the masters must use different AWIDs.

    Parameters
    ----------
    data_width, id_width : int
        Widths of both masters and the bus.
    ids : (int, int)
        The AWID each master uses (B routing).

    Members
    -------
    a, b : In(AxiWriteSignature)
        The two masters (``a`` wins the first tie).
    bus : Out(AxiWriteSignature)
    """
    def __init__(self, *, data_width=1024, id_width=4, ids=(0, 2)):
        if len(ids) != 2 or ids[0] == ids[1] or not all(0 <= i < 1 << id_width for i in ids):
            raise ValueError(f"ids must be two different AWIDs of {id_width} bits, not {ids!r}")
        self.ids = ids
        sig = AxiWriteSignature(addr_width=64, data_width=data_width, id_width=id_width)
        super().__init__({"a": In(sig), "b": In(sig), "bus": Out(sig)})

    def elaborate(self, platform):
        m = Module()
        bus, src = self.bus, (self.a, self.b)
        busy = Signal()              # a burst is granted (from its AW shown to its AW and last W done)
        aw_done = Signal()           # its AW has been accepted
        w_done = Signal()            # its last W beat has been accepted
        grant = Signal()             # 0: a, 1: b
        prefer_b = Signal()          # round robin: who wins the next tie
        sel = Signal()
        # Pick a master when free: the one asking, or the preferred one when both ask.
        with m.If(busy):
            m.d.comb += sel.eq(grant)
        with m.Elif(self.a.awvalid & self.b.awvalid):
            m.d.comb += sel.eq(prefer_b)
        with m.Else():
            m.d.comb += sel.eq(self.b.awvalid)

        for i, s in enumerate(src):
            w_open = Signal(name=f"w_open_{'ab'[i]}")
            m.d.comb += w_open.eq((busy | s.awvalid) & ~w_done)
            with m.If(sel == i):
                m.d.comb += [getattr(bus, n).eq(getattr(s, n)) for n in _AW + _W]
                m.d.comb += [
                    bus.awvalid.eq(s.awvalid & ~aw_done), s.awready.eq(bus.awready & ~aw_done),
                    bus.wvalid.eq(s.wvalid & w_open), s.wready.eq(bus.wready & w_open),
                ]
        aw_now = Signal()
        w_now = Signal()
        m.d.comb += [aw_now.eq(aw_done | (bus.awvalid & bus.awready)),
                     w_now.eq(w_done | (bus.wvalid & bus.wready & bus.wlast))]
        with m.If(~busy & bus.awvalid):
            m.d.sync += [busy.eq(1), grant.eq(sel)]
        with m.If((busy | bus.awvalid) & aw_now & w_now):
            m.d.sync += [busy.eq(0), aw_done.eq(0), w_done.eq(0), prefer_b.eq(~sel)]
        with m.Else():
            m.d.sync += [aw_done.eq(aw_now), w_done.eq(w_now)]

        # B: by ID.
        to_b = Signal()
        m.d.comb += to_b.eq(bus.bid == self.ids[1])
        for s in src:
            m.d.comb += [s.bid.eq(bus.bid), s.bresp.eq(bus.bresp)]
        m.d.comb += [
            self.a.bvalid.eq(bus.bvalid & ~to_b), self.b.bvalid.eq(bus.bvalid & to_b),
            bus.bready.eq(Mux(to_b, self.b.bready, self.a.bready)),
        ]
        return m
