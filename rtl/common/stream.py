"""Stream helpers shared by every role: a FIFO with stream ports, and pairs of entries
that travel together (two frames ending in one beat, two ACKs, two writes)."""
from amaranth.hdl import *
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["StreamFifo", "Pair", "pack_pair", "PairSplitter"]


class StreamFifo(wiring.Component):
    """A ``lib.fifo.SyncFIFOBuffered`` with stream ports and a structured payload
    (``level``: the entries it holds)."""
    def __init__(self, shape, depth):
        self._shape, self._depth = shape, depth
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape)),
                          "level": Out(range(depth + 1))})

    def elaborate(self, platform):
        m = Module()
        width = Shape.cast(self._shape).width
        m.submodules.fifo = f = fifo.SyncFIFOBuffered(width=width, depth=self._depth)
        m.d.comb += [
            f.w_data.eq(self.i.p), f.w_en.eq(self.i.valid), self.i.ready.eq(f.w_rdy),
            self.o.p.eq(f.r_data), self.o.valid.eq(f.r_rdy), f.r_en.eq(self.o.ready), self.level.eq(f.level),
        ]
        return m


def Pair(shape):
    """One or two entries of ``shape`` that travel together: ``p[0]``, and ``p[1]`` when
    ``second`` is 1."""
    return data.StructLayout({"second": unsigned(1), "p": data.ArrayLayout(shape, 2)})


def pack_pair(pair, present, entries):
    """Statements that pack the present ones of two candidate ``entries`` to the front of
    ``pair`` (a :func:`Pair` view), in order; the pair holds something when
    ``present[0] | present[1]``."""
    return [pair.second.eq(present[0] & present[1]),
            pair.p[0].eq(Mux(present[0], entries[0], entries[1])), pair.p[1].eq(entries[1])]


class PairSplitter(wiring.Component):
    """A stream of pairs into a stream of their entries, one a cycle, in order (a pair of
    two takes two cycles). Combinational: ``o.p`` is the head pair's next entry."""
    def __init__(self, shape):
        self._shape = shape
        super().__init__({"i": In(stream.Signature(Pair(shape))), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        half = Signal()                  # p[0] has gone: p[1] is next
        m.d.comb += [self.o.valid.eq(self.i.valid), self.o.p.eq(Mux(half, self.i.p.p[1], self.i.p.p[0])),
                     self.i.ready.eq(self.o.ready & (half | ~self.i.p.second))]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += half.eq(~half & self.i.p.second)
        return m
