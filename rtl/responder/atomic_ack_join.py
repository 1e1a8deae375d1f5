"""Atomic ACK join: the AtomicUnit's results put into the responder's answers, in order."""
from amaranth.hdl import *
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from rtl.common.stream import Pair
from rtl.responder.atomic_unit import AtomicResult
from rtl.responder.responder import ResponderAck

__all__ = ["AtomicAckJoin"]


class AtomicAckJoin(wiring.Component):
    """Fills each ATOMIC ACK the responder owes with its atomic's result.

    The responder queues its answers in packet order, an atomic's (``atomic`` = 1) as a
    place holder; the ``AtomicUnit`` answers the atomics in the same order, later (after
    the word's read from GPU memory). So the QP's ACKs keep their order with its ATOMIC
    ACKs (IBTA: responses in PSN order), and the n-th place holder takes the n-th result:
    its MSN and original value, or, for a retried atomic the unit has no record of
    (``found`` = 0), nothing: the answer is dropped, as ``model.responder`` drops it.

    An ATOMIC ACK (70 bytes) does not fit half a beat as an ACK does, so it leaves alone
    in its transfer, and so does a READ's place holder (``read``: its responses go in
    there later, ``ResponseMerge``); a pair of two plain ACKs passes as it is. One transfer a cycle, a
    registered output.

    Parameters
    ----------
    num_qps : int

    Members
    -------
    i : In(stream.Signature(Pair(ResponderAck)))
        The responder's answers, one or two a transfer.
    results : In(stream.Signature(AtomicResult(num_qps)))
        The atomics' results, in request order.
    o : Out(stream.Signature(Pair(ResponderAck)))
        The answers, an ATOMIC ACK alone in its transfer with ``msn`` and ``orig`` filled.
    """
    def __init__(self, *, num_qps):
        self.num_qps = num_qps
        super().__init__({
            "i": In(stream.Signature(Pair(ResponderAck))),
            "results": In(stream.Signature(AtomicResult(num_qps))),
            "o": Out(stream.Signature(Pair(ResponderAck))),
        })

    def elaborate(self, platform):
        m = Module()
        i, o, res = self.i, self.o, self.results
        half = Signal()                  # p[0] of the head transfer is done: p[1] is next
        cur = Signal(ResponderAck)
        m.d.comb += cur.eq(Mux(half, i.p.p[1], i.p.p[0]))
        rest = Signal()                  # another record follows cur in the transfer
        m.d.comb += rest.eq(~half & i.p.second)
        # the whole transfer at once: no place holder in it
        whole = Signal()
        m.d.comb += whole.eq(~half & ~i.p.p[0].atomic & ~i.p.p[0].read
                             & ~(i.p.second & (i.p.p[1].atomic | i.p.p[1].read)))
        free = Signal()
        m.d.comb += free.eq(~o.valid | o.ready)
        with m.If(o.valid & o.ready):
            m.d.sync += o.valid.eq(0)
        step = Signal()                  # cur (or the whole transfer) goes this cycle
        m.d.comb += step.eq(i.valid & free & (~cur.atomic | res.valid))
        m.d.comb += [res.ready.eq(i.valid & free & cur.atomic)]
        filled = Signal(ResponderAck)
        m.d.comb += [filled.eq(cur), filled.msn.eq(res.p.msn), filled.orig.eq(res.p.orig)]
        with m.If(step):
            with m.If(whole):
                m.d.sync += [o.valid.eq(1), o.p.eq(i.p)]
            with m.Else():
                m.d.sync += [o.valid.eq(~cur.atomic | res.p.found), o.p.second.eq(0),
                             o.p.p[0].eq(Mux(cur.atomic, filled, cur)), o.p.p[1].eq(0)]
        done = Signal()
        m.d.comb += [done.eq(step & (whole | ~rest)), i.ready.eq(done)]
        with m.If(done):
            m.d.sync += half.eq(0)
        with m.Elif(step):
            m.d.sync += half.eq(1)
        return m
