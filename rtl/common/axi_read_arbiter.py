"""Two AXI4 read masters onto one: the payload fetch and the atomic unit share ``m_axi``'s
read channels."""
import functools
import operator

from amaranth.hdl import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from rtl.common.axi import AxiReadSignature

__all__ = ["AxiReadArbiter"]

_AR = ("arid", "araddr", "arlen", "arsize", "arburst", "arlock", "arcache", "arprot")
_R = ("rid", "rdata", "rresp", "rlast")


class AxiReadArbiter(wiring.Component):
    """Round-robin arbiter of two AXI4 read masters.

    AR: one request a handshake, the masters alternating when both ask (``a`` wins the
    first tie); the arbiter holds nothing, so AR is combinational. R: each beat goes to
    the master whose ARID it carries, its ``rready`` back: the masters must use
    different ARIDs, and each sees its own beats in order (AXI keeps one ID's order).

    Parameters
    ----------
    data_width, id_width : int
        Widths of both masters and the bus.
    ids : (int, int or tuple of int)
        The ARID each master uses (R routing); ``b``'s may be several (``b`` is then
        itself an arbiter's bus).

    Members
    -------
    a, b : In(AxiReadSignature)
    bus : Out(AxiReadSignature)
    """
    def __init__(self, *, data_width=1024, id_width=4, ids=(1, 2)):
        b_ids = () if len(ids) != 2 else (ids[1],) if isinstance(ids[1], int) else tuple(ids[1])
        all_ids = (ids[0], *b_ids) if b_ids else ()
        if (not b_ids or len(set(all_ids)) != len(all_ids)
                or not all(isinstance(i, int) and 0 <= i < 1 << id_width for i in all_ids)):
            raise ValueError(f"ids must be two different ARIDs (the second may be a tuple) of {id_width} bits, "
                             f"not {ids!r}")
        self.ids, self._b_ids = ids, b_ids
        sig = AxiReadSignature(addr_width=64, data_width=data_width, id_width=id_width)
        super().__init__({"a": In(sig), "b": In(sig), "bus": Out(sig)})

    def elaborate(self, platform):
        m = Module()
        bus, src = self.bus, (self.a, self.b)
        prefer_b = Signal()
        sel = Signal()
        with m.If(self.a.arvalid & self.b.arvalid):
            m.d.comb += sel.eq(prefer_b)
        with m.Else():
            m.d.comb += sel.eq(self.b.arvalid)
        for k, s in enumerate(src):
            mine = sel == k
            for name in _AR:
                with m.If(mine):
                    m.d.comb += getattr(bus, name).eq(getattr(s, name))
            m.d.comb += s.arready.eq(mine & bus.arready)
            for name in _R:
                m.d.comb += getattr(s, name).eq(getattr(bus, name))
        to_b = Signal()
        m.d.comb += to_b.eq(functools.reduce(operator.or_, [bus.rid == i for i in self._b_ids]))
        m.d.comb += [self.a.rvalid.eq(bus.rvalid & (bus.rid == self.ids[0])), self.b.rvalid.eq(bus.rvalid & to_b),
                     bus.arvalid.eq(self.a.arvalid | self.b.arvalid),
                     bus.rready.eq(Mux(to_b, self.b.rready, self.a.rready))]
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += prefer_b.eq(~sel)
        return m
