"""ACK coalescer: a re-ACK identical to one still waiting to be sent is not queued twice."""
from amaranth.hdl import *
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from spec.formats import Aeth
from rtl.common.stream import Pair
from rtl.responder.responder import ResponderAck

__all__ = ["AckCoalescer"]


class AckCoalescer(wiring.Component):
    """Between the responder's ACK/NAK pairs and their queue to MAC TX.

    Every duplicate request is answered by an ACK of the last accepted PSN; a flood of
    duplicates (1.02 a cycle at line rate for 0-byte WRITEs) while MAC TX sends a data
    frame (42 cycles for 4 KiB) owes more ACKs than the queue holds. Those ACKs are all
    the same record (QP, PSN, syndrome, MSN): the same frame, which tells the requester
    nothing the first one does not. So when the queue is full, or holds a backlog
    (``backlog``: the queue is deep, for the answers waiting behind an atomic, and a
    flood of re-ACKs need not fill it), and therefore still holds the last record
    queued, not yet sent, a pair whose records are all ACKs equal to that one is taken
    and dropped (``coalesced``) instead of holding the responder, and so MAC RX, back.
    Otherwise nothing is dropped: each record is queued as it comes (so without
    back-pressure the ACK frames are the model's one for one).

    Purely combinational but for the last record queued (``i.ready`` is ``o.ready``, or
    1 when the pair is dropped: an 80-bit compare of registers).

    Members
    -------
    i : In(stream.Signature(Pair(ResponderAck)))
        From the responder, one or two records a transfer.
    o : Out(stream.Signature(Pair(ResponderAck)))
        To the ACK queue.
    coalesced : Out(2)
        Records dropped this cycle (0..2).
    backlog : In(1)
        The queue holds so many records that a re-ACK may be dropped with room left.
    """
    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(Pair(ResponderAck))),
            "o": Out(stream.Signature(Pair(ResponderAck))),
            "coalesced": Out(2),
            "backlog": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        tail = Signal(ResponderAck)         # the last record queued
        tail_valid = Signal()
        present = [C(1, 1), i.p.second]
        same = Signal()
        # (an ATOMIC ACK's place holder is never dropped: each one takes one atomic's result)
        m.d.comb += same.eq(tail_valid & (tail.syndrome == Aeth.ACK) & ~tail.atomic & ~tail.read
                            & (i.p.p[0].as_value() == tail.as_value())
                            & (~i.p.second | (i.p.p[1].as_value() == tail.as_value())))
        drop = Signal()
        m.d.comb += [
            drop.eq(i.valid & (~o.ready | self.backlog) & same),
            o.valid.eq(i.valid & ~drop), o.p.eq(i.p),
            i.ready.eq(o.ready | drop),
            self.coalesced.eq(Mux(drop, 1 + i.p.second, 0)),
        ]
        with m.If(o.valid & o.ready):
            m.d.sync += [tail.eq(Mux(i.p.second, i.p.p[1], i.p.p[0])), tail_valid.eq(1)]
        return m
