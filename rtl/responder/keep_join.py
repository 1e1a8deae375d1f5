"""Receive keep join: which frames of the segment stream the resegmenter passes on, from
the dispatch's candidates and the write sorter's verdicts."""
from amaranth.hdl import *
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from rtl.common.records import RxKeepPair

__all__ = ["RxKeepJoin"]


class RxKeepJoin(wiring.Component):
    """Keep bits for the resegmenter: a frame passes on to the payload writer only when
    the writer will write it.

    The dispatch says, per beat in which frames end, which of them carry payload in the
    segment stream (``candidates``: a request with payload not carried inline, or a
    READ RESPONSE with payload), long before the responder decides them. The write
    sorter says, in the same frame order, which of those the writer takes (``verdicts``:
    accepted, or discarded as a duplicate, behind a gap, answered by an RNR NAK...). A
    candidate pair goes on with each candidate bit replaced by the next verdict; other
    frames keep their 0. So a discarded frame never reaches the resegmenter's output or
    the writer: the resegmenter drops the beats of frames it does not keep at one input
    beat a cycle, which is the line rate whatever the frame size, while a kept frame
    costs the writer at least a cycle.

    Verdicts wait in a queue of ``depth`` bits (taken while ``depth - 2`` or fewer wait, so
    two always fit); a candidate pair waits until its verdicts are there. One pair a
    cycle; the output is registered.

    Parameters
    ----------
    depth : int
        Verdict bits held (at least 4).

    Members
    -------
    candidates : In(stream.Signature(RxKeepPair))
        Per beat with frame ends: 1 for a frame of the segment stream.
    verdicts : In(stream.Signature(RxKeepPair))
        One or two verdicts (packed to the front) per transfer, one per candidate, in order.
    keep : Out(stream.Signature(RxKeepPair))
        The candidates' pairs with each candidate's verdict.
    """
    def __init__(self, depth=8):
        if not isinstance(depth, int) or depth < 4:
            raise ValueError(f"depth must be an int >= 4, not {depth!r}")
        self.depth = depth
        super().__init__({
            "candidates": In(stream.Signature(RxKeepPair)),
            "verdicts": In(stream.Signature(RxKeepPair)),
            "keep": Out(stream.Signature(RxKeepPair)),
        })

    def elaborate(self, platform):
        m = Module()
        d = self.depth
        q = Signal(d)                          # waiting verdicts, the oldest in bit 0
        n = Signal(range(d + 1))               # how many
        cand = self.candidates.p
        need0 = cand.keep[0]
        need1 = cand.second & cand.keep[1]
        need = Signal(2)
        m.d.comb += need.eq(need0 + need1)
        out_free = Signal()
        m.d.comb += out_free.eq(~self.keep.valid | self.keep.ready)
        take = Signal()
        m.d.comb += [take.eq(self.candidates.valid & out_free & (n >= need)),
                     self.candidates.ready.eq(take)]
        with m.If(self.keep.valid & self.keep.ready):
            m.d.sync += self.keep.valid.eq(0)
        with m.If(take):
            m.d.sync += [self.keep.valid.eq(1), self.keep.p.second.eq(cand.second),
                         self.keep.p.keep.eq(Cat(need0 & q[0], need1 & Mux(need0, q[1], q[0])))]

        # the queue: the verdicts used leave the front, the new ones join at the back
        pop = Signal(2)
        m.d.comb += pop.eq(Mux(take, need, 0))
        vin = self.verdicts.p
        push = Signal()
        m.d.comb += [self.verdicts.ready.eq(n <= d - 2), push.eq(self.verdicts.valid & self.verdicts.ready)]
        nin = Signal(2)
        m.d.comb += nin.eq(Mux(push, 1 + vin.second, 0))
        rest = Signal(range(d + 1))            # verdicts left after the pop
        m.d.comb += rest.eq(n - pop)
        shifted = Signal(d)
        m.d.comb += shifted.eq(q >> pop)
        nxt = Signal(d)
        for i in range(d):
            m.d.comb += nxt[i].eq(Mux(rest > i, shifted[i],
                                      Mux(rest == i, vin.keep[0], (rest + 1 == i) & vin.keep[1])))
        m.d.sync += [q.eq(nxt), n.eq(rest + nin)]
        return m
