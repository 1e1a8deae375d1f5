"""ACK merger: received ACKs of one QP that wait for the completion tracker become one."""
from amaranth.hdl import *
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from spec.formats import Aeth
from .responder import ReceivedAck

__all__ = ["AckMerger"]

PSN_BITS = 24
PSN_HALF = 1 << (PSN_BITS - 1)


class AckMerger(wiring.Component):
    """One-entry buffer between the responder's received ACK/NAKs and the completion
    tracker that folds an ACK into the waiting one of the same QP.

    An ACK acknowledges its PSN and every PSN before it, so of two ACKs of one QP the
    newer (serial arithmetic mod 2^24) says all the older does: the tracker needs only
    that one. The tracker spends several cycles on an ACK; at the small-message rate a
    responder acknowledges a message per cycle, and the ACKs of a QP's turn come in a
    row. While the entry waits for the tracker, an ACK of the same QP replaces its PSN
    (when newer) instead of waiting behind it. A NAK or an ACK of another QP waits for
    the entry to leave; NAKs are never merged, and the order of the ACK/NAKs of a QP is
    kept. When the tracker keeps up, every ACK passes, one cycle later.

    Members
    -------
    i : In(stream.Signature(ReceivedAck))
    o : Out(stream.Signature(ReceivedAck))
    merged : Out(1)
        Strobe: an ACK was folded into the waiting one.
    """
    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(ReceivedAck)),
            "o": Out(stream.Signature(ReceivedAck)),
            "merged": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        leaving = Signal()
        m.d.comb += leaving.eq(o.valid & o.ready)
        merge = Signal()
        m.d.comb += merge.eq(o.valid & ~o.ready & (i.p.syndrome[5:7] == Aeth.KIND_ACK)
                             & (o.p.syndrome[5:7] == Aeth.KIND_ACK) & (i.p.qpn == o.p.qpn))
        m.d.comb += i.ready.eq(~o.valid | o.ready | merge)
        newer = Signal()
        m.d.comb += newer.eq((i.p.psn - o.p.psn)[:PSN_BITS] < PSN_HALF)
        with m.If(leaving):
            m.d.sync += o.valid.eq(0)
        with m.If(i.valid & i.ready):
            with m.If(merge):
                m.d.comb += self.merged.eq(1)
                with m.If(newer):
                    m.d.sync += [o.p.psn.eq(i.p.psn), o.p.msn.eq(i.p.msn)]
            with m.Else():
                m.d.sync += [o.valid.eq(1), o.p.eq(i.p)]
        return m
