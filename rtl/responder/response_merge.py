"""Response merge: each READ's response frames put where its place holder is among the
responder's ACK frames."""
from amaranth.hdl import *
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from rtl.common.contexts import qp_bits
from rtl.common.tx_beat import TxBeat

__all__ = ["ResponseMerge"]


class ResponseMerge(wiring.Component):
    """The responder's frames in the order of its answers (IBTA: responses in PSN order).

    The ACK builder's stream holds a marker beat (``frame`` = 0) where a READ's responses
    belong; the READ responses come, READ after READ, from the responder's packet builder,
    whose payload was read ahead. At a marker the merge takes the marker and passes READ
    response beats until that READ's last one (``cpl_valid``: the builder marks each
    READ's last beat so, and never starts the next READ in it), then ACK frames again. So a
    later ACK of the QP never overtakes a READ's responses, which the requester would take
    as an implied NAK. The marker is taken with its READ's first beat, so one-beat READs
    pass one a cycle. Combinational (the path of whichever input is on).

    Members
    -------
    acks : In(stream.Signature(TxBeat))
        ACK/NAK and ATOMIC ACK frames, and READ markers (``AckBuilder``).
    reads : In(stream.Signature(TxBeat))
        READ response frames (``PacketBuilder(merge_messages=False)``).
    o : Out(stream.Signature(TxBeat))
        The frames in answer order, no markers, ``cpl_valid`` and ``answer`` clear.
    answered : Out(1), answered_qpn : Out
        An answer of a new READ or atomic leaves (a marker taken with its READ's first beat,
        an ATOMIC ACK beat with ``answer``), of QP ``answered_qpn``: for the responder's
        count of the QP's resources (``Responder.answered``).
    """
    def __init__(self, *, num_qps, num_cqs):
        layout = TxBeat(num_qps, num_cqs)
        super().__init__({
            "acks": In(stream.Signature(layout)),
            "reads": In(stream.Signature(layout)),
            "o": Out(stream.Signature(layout)),
            "answered": Out(1), "answered_qpn": Out(qp_bits(num_qps)),
        })

    def elaborate(self, platform):
        m = Module()
        acks, reads, o = self.acks, self.reads, self.o
        in_read = Signal()           # between a marker and its READ's last response beat
        with m.If(in_read):
            m.d.comb += [o.valid.eq(reads.valid), o.p.eq(reads.p), o.p.cpl_valid.eq(0), o.p.cpl.eq(0), o.p.answer.eq(0),
                         reads.ready.eq(o.ready)]
            with m.If(reads.valid & o.ready & reads.p.last & reads.p.cpl_valid):
                m.d.sync += in_read.eq(0)
        with m.Elif(acks.valid & ~acks.p.frame):
            # a marker: its READ's first beat goes in the marker's cycle (an 8-byte READ's
            # one-beat response a cycle), and the marker is taken with it
            m.d.comb += [o.valid.eq(reads.valid), o.p.eq(reads.p), o.p.cpl_valid.eq(0), o.p.cpl.eq(0), o.p.answer.eq(0),
                         reads.ready.eq(o.ready), acks.ready.eq(reads.valid & o.ready)]
            with m.If(reads.valid & o.ready & ~(reads.p.last & reads.p.cpl_valid)):
                m.d.sync += in_read.eq(1)
        with m.Else():
            m.d.comb += [o.valid.eq(acks.valid), o.p.eq(acks.p), o.p.answer.eq(0), o.p.cpl.eq(0),
                         acks.ready.eq(o.ready)]
        m.d.comb += [self.answered.eq(acks.valid & acks.ready & acks.p.answer), self.answered_qpn.eq(acks.p.cpl.qpn)]
        return m
