"""Receive flush: the receive WQEs of a QP that went to ERR, completed with WR_FLUSH_ERR
through the responder, in order."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.wiring import In, Out

from spec.formats import QpState
from rtl.common.contexts import qp_bits
from rtl.common.rx_packet import RxPacket
from rtl.common.stream import Pair, StreamFifo
from rtl.responder.recv_gate import FLUSH_HELD, FLUSH_NEXT

__all__ = ["RecvFlush"]

MODIFY_QUEUE = 4        # QP_MODIFYs to ERR waiting for their flush
ERROR_QUEUE = 8         # QPs the responder moved to ERR, waiting for their flush


class RecvFlush(wiring.Component):
    """Flushes the receive WQEs of each QP that goes to ERR (``model.responder``'s
    ``modify`` to ERR and its fatal errors): every WQE the QP holds or has posted completes
    with RESP_ERR / WR_FLUSH_ERR, in order.

    The WQEs are where the receive path keeps them: the one a SEND in progress holds in the
    responder's context, the rest in the ``RecvQueue`` (kept there until the responder
    commits them; the doorbell record says how many are posted). So the flush goes the
    packets' way, behind them: for the QP it puts *flush requests* among the requests in
    front of the ``RecvGate`` (one at a time, a request pair of their own), each of which
    the responder answers by completing one WQE (``flushed`` with ``more``) or none
    (``more`` = 0):

    - ``FLUSH_HELD`` (no receive WQE asked for): the WQE of the SEND in progress; sent
      again while one was flushed;
    - then ``FLUSH_NEXT`` (numbered by the gate as a packet that consumes a WQE): the QP's
      next WQE (the responder's count ``rq_ci``: the one it holds, or one looked up, reading
      what the doorbell record said); sent again while one was flushed.

    Packets of the QP that reach the responder meanwhile (dropped: the QP is not ready) use
    no WQE (their numbers are corrected as any other packet's). So the WQEs complete in
    the order the model flushes them: its message's, then from its consume counter on. A
    QP_MODIFY to ERR of a QP already in ERR flushes again (what was posted since: the
    model's ``flush_receives``).

    Requests pass through combinationally (``i`` to ``o``) but while a flush request is
    offered. A flush costs a round trip through the gate and the responder per WQE
    (a doorbell-record read for the last): QPs go to ERR seldom.

    Parameters
    ----------
    num_qps : int
        QPs (as the ``Responder``).

    Members
    -------
    i : In(stream.Signature(Pair(RxPacket())))
        Requests (``RxDispatch.requests``).
    o : Out(stream.Signature(Pair(RxPacket())))
        The same, with the flush requests among them (to the ``RecvGate``).
    modify : In(stream.Signature(...))
        ``qpn``, ``state``: the control path's QP_MODIFY (as the responder's); always taken
        (a move to ERR while ``MODIFY_QUEUE`` of them wait for their flush is not flushed:
        modifies come from the CPU, far apart).
    errors : In(stream.Signature(unsigned(qp_bits(num_qps))))
        QPs a fatal error moved to ERR (the ``Responder``'s decisions).
    flushed : In(1), more : In(1)
        The responder decided a flush request (strobe); it completed a WQE.
    """
    def __init__(self, *, num_qps):
        self.num_qps = num_qps
        qb = qp_bits(num_qps)
        super().__init__({
            "i": In(stream.Signature(Pair(RxPacket()))),
            "o": Out(stream.Signature(Pair(RxPacket()))),
            "modify": In(stream.Signature(data.StructLayout({"qpn": unsigned(qb), "state": unsigned(3)}))),
            "errors": In(stream.Signature(unsigned(qb))),
            "flushed": In(1),
            "more": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        qb = qp_bits(self.num_qps)
        m.submodules.modq = modq = StreamFifo(unsigned(qb), MODIFY_QUEUE)
        m.submodules.errq = errq = StreamFifo(unsigned(qb), ERROR_QUEUE)
        m.d.comb += [self.modify.ready.eq(1),
                     modq.i.valid.eq(self.modify.valid & (self.modify.p.state == QpState.ERR)),
                     modq.i.p.eq(self.modify.p.qpn)]
        wiring.connect(m, wiring.flipped(self.errors), errq.i)

        busy = Signal()             # a QP's flush is under way
        sent = Signal()             # its flush request went: waiting for the responder's answer
        nxt = Signal()              # FLUSH_NEXT (else FLUSH_HELD)
        qpn = Signal(qb)
        with m.If(~busy):
            # a QP_MODIFY first (the CPU waits on it), then the responder's errors
            with m.If(modq.o.valid):
                m.d.comb += modq.o.ready.eq(1)
                m.d.sync += [busy.eq(1), sent.eq(0), nxt.eq(0), qpn.eq(modq.o.p)]
            with m.Elif(errq.o.valid):
                m.d.comb += errq.o.ready.eq(1)
                m.d.sync += [busy.eq(1), sent.eq(0), nxt.eq(0), qpn.eq(errq.o.p)]

        req = Signal(RxPacket())
        m.d.comb += [req.opcode.eq(Mux(nxt, FLUSH_NEXT, FLUSH_HELD)), req.dqpn.eq(qpn)]
        offer = Signal()
        m.d.comb += offer.eq(busy & ~sent)
        with m.If(offer):
            m.d.comb += [self.o.valid.eq(1), self.o.p.second.eq(0), self.o.p.p[0].eq(req)]
            with m.If(self.o.ready):
                m.d.sync += sent.eq(1)
        with m.Else():
            m.d.comb += [self.o.valid.eq(self.i.valid), self.o.p.eq(self.i.p), self.i.ready.eq(self.o.ready)]
        with m.If(busy & sent & self.flushed):
            m.d.sync += sent.eq(0)
            with m.If(~self.more & nxt):
                m.d.sync += busy.eq(0)
            with m.Elif(~self.more):
                m.d.sync += nxt.eq(1)
        return m
