"""Pair splitter: a queue of one-or-two-entry transfers, read out one entry per cycle."""
from amaranth.hdl import *
from amaranth.lib import wiring, fifo, stream
from amaranth.lib.wiring import In, Out

from .rx_packet import Pair

__all__ = ["PairSplitter"]


class PairSplitter(wiring.Component):
    """A queue of one-or-two-entry transfers, read out one entry per cycle.

    Parameters
    ----------
    shape : the entry's shape.
    depth : int
        Transfers held (each one or two entries).

    Members
    -------
    i : In(stream.Signature({second, p[2]}))
        ``p[0]``, then ``p[1]`` when ``second`` = 1.
    o : Out(stream.Signature(shape))
        The entries in order.
    """
    def __init__(self, shape, depth):
        if not isinstance(depth, int) or depth < 2:
            raise ValueError(f"depth must be an integer >= 2, not {depth!r}")
        self._shape, self._depth = shape, depth
        super().__init__({"i": In(stream.Signature(Pair(shape))), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        layout = Pair(self._shape)
        m.submodules.fifo = q = fifo.SyncFIFOBuffered(width=layout.size, depth=self._depth)
        head = Signal(layout)
        half = Signal()                 # p[0] of the head has left; p[1] is next
        m.d.comb += [
            q.w_data.eq(self.i.p), q.w_en.eq(self.i.valid), self.i.ready.eq(q.w_rdy),
            head.eq(q.r_data),
            self.o.valid.eq(q.r_rdy), self.o.p.eq(Mux(half, head.p[1], head.p[0])),
        ]
        with m.If(self.o.valid & self.o.ready):
            with m.If(head.second & ~half):
                m.d.sync += half.eq(1)
            with m.Else():
                m.d.comb += q.r_en.eq(1)
                m.d.sync += half.eq(0)
        return m
