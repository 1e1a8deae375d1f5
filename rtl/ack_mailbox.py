"""ACK mailbox: one waiting ACK/NAK record per QP, so received ACKs never wait."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from spec.formats import Aeth
from .contexts import qp_bits
from .responder import ReceivedAck

__all__ = ["AckMailbox"]

PSN_BITS = 24
PSN_HALF = 1 << (PSN_BITS - 1)


def _replaces(m, new, old):
    """1 when ``new``, arriving while ``old`` of its QP waits, says more than ``old``.

    An ACK acknowledges its PSN, a NAK every PSN before its own: of two records the one
    whose acknowledged PSN is newer (serial arithmetic mod 2^24) says all the other
    does; on a tie the NAK, which also asks for the retransmission. A fatal NAK fails
    the QP: once one waits nothing else matters, and a new one replaces anything (it
    acknowledges what the waiting one did). An RNR NAK (or a reserved kind) does not
    move the tracker at all, so it never replaces a record and is replaced by any."""
    def classify(r):
        kind = r.syndrome[5:7]
        nak = kind == Aeth.KIND_NAK
        implied = Signal(PSN_BITS)
        m.d.comb += implied.eq(Mux(nak, (r.psn - 1)[:PSN_BITS], r.psn))
        return nak, nak & (r.syndrome != Aeth.NAK_PSN_SEQ), ~nak & (kind != Aeth.KIND_ACK), implied
    n_nak, n_fatal, n_inert, n_imp = classify(new)
    o_nak, o_fatal, o_inert, o_imp = classify(old)
    diff = (n_imp - o_imp)[:PSN_BITS]
    newer = (diff != 0) & (diff < PSN_HALF)
    tie_nak = (diff == 0) & n_nak & ~o_nak
    return ~o_fatal & (n_fatal | (~n_inert & (o_inert | newer | tie_nak)))


class AckMailbox(wiring.Component):
    """Between the responder's received ACK/NAKs and the completion tracker: per QP one
    waiting record, into which the QP's later ACK/NAKs fold, so the input is never held.

    The receive path delivers up to one ACK/NAK per cycle; the tracker spends about 3.5
    cycles on one. Of two records of a QP the tracker needs only the one that says more
    (see ``_replaces``: the newer acknowledged PSN, a NAK on a tie, a fatal NAK over
    anything, an RNR NAK never), so a QP needs at most one waiting record, and the QPs
    that have one need a place in line: a FIFO of QPNs in order of first arrival, each QP
    at most once, so ``num_qps`` entries never overflow. Both live in RAM (a slot per QP:
    busy bit and record; the FIFO's QPNs), not in per-QP flip-flops.

    An input is taken every cycle (``i.ready`` is constant 1, also during reset: the
    slot RAM starts empty by its init value, which a reset does not restore — like the
    other QP tables). Cycle t takes it and reads its QP's slot; cycle t+1 decides: no
    record waits — store it and push the QPN; one waits — the one that says more stays
    in the slot and ``merged`` pulses for the other. ``o`` presents the slot of the QP
    at the head of the FIFO (read each cycle, transparent to this cycle's writes, so a
    record that folds into the presented one changes ``o.p`` while ``o.valid`` waits for
    ``o.ready``; the tracker takes ``o.p`` at the transfer); when it leaves the slot is
    cleared. A record that arrives in the cycle its QP's record leaves finds the slot
    empty: it is stored and the QPN pushed again (the departing record is not
    changed under the transfer). With the output ready, a record leaves two cycles after
    it was taken, and the order of the QPs is the order of their first arrival.

    Members
    -------
    i : In(stream.Signature(ReceivedAck))
        ACK/NAK frames received; ``i.ready`` is always 1. The QP is ``qpn[:qp_bits]``.
    o : Out(stream.Signature(ReceivedAck))
        To the completion tracker.
    merged : Out(1)
        Strobe: a record did not leave on its own (dropped or replaced), one cycle after
        its successor was taken.
    """
    def __init__(self, num_qps):
        if not isinstance(num_qps, int) or num_qps < 2 or num_qps & (num_qps - 1):
            raise ValueError(f"num_qps must be a power of two >= 2, not {num_qps!r}")
        self.num_qps = num_qps
        super().__init__({
            "i": In(stream.Signature(ReceivedAck)),
            "o": Out(stream.Signature(ReceivedAck)),
            "merged": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        qb = qp_bits(self.num_qps)
        i, o = self.i, self.o
        slot_layout = data.StructLayout({"busy": 1, "rec": ReceivedAck})
        m.submodules.slots = slots = Memory(shape=slot_layout, depth=self.num_qps, init=[])
        # two writers (the input's store, the output's clear), two readers (the input's
        # QP, the head QP); both readers see the writes of the cycle they read in, so
        # what they return is the slot as it is when its data is used (no forwarding)
        in_wr, clr_wr = slots.write_port(), slots.write_port()
        in_rd = slots.read_port(transparent_for=(in_wr, clr_wr))
        out_rd = slots.read_port(transparent_for=(in_wr, clr_wr))
        m.submodules.order = order = Memory(shape=unsigned(qb), depth=self.num_qps, init=[])
        f_wr = order.write_port()
        f_rd = order.read_port(transparent_for=(f_wr,))

        # Stage 1: the input (always taken) and its QP's slot read.
        m.d.comb += [i.ready.eq(1), in_rd.addr.eq(i.p.qpn[:qb])]
        s1_valid = Signal()
        s1 = Signal(ReceivedAck)
        m.d.sync += [s1_valid.eq(i.valid), s1.eq(i.p)]
        s1_qp = s1.qpn[:qb]

        # The output: the head QP's slot.
        head_valid = Signal()
        head_qp = Signal(qb)
        leaving = Signal()
        m.d.comb += [o.valid.eq(head_valid), o.p.eq(out_rd.data.rec), leaving.eq(head_valid & o.ready)]

        # Stage 2: decide. A record leaving now is gone for the arriving one (so the
        # transfer and the fold never touch the same record).
        waiting = Signal()
        push = Signal()
        m.d.comb += waiting.eq(in_rd.data.busy & ~(leaving & (head_qp == s1_qp)))
        replaces = _replaces(m, s1, in_rd.data.rec)
        m.d.comb += [in_wr.addr.eq(s1_qp), in_wr.data.busy.eq(1), in_wr.data.rec.eq(s1)]
        with m.If(s1_valid):
            with m.If(~waiting):
                m.d.comb += [push.eq(1), in_wr.en.eq(1)]
            with m.Else():
                m.d.comb += [self.merged.eq(1), in_wr.en.eq(replaces)]
        # (when the arriving record is of the leaving QP it is stored there: no clear)
        m.d.comb += [clr_wr.addr.eq(head_qp), clr_wr.data.eq(0),
                     clr_wr.en.eq(leaving & ~(s1_valid & (s1_qp == head_qp)))]

        # The FIFO of QPNs behind the head. Its read port reads the next front each
        # cycle; a QPN pushed into an empty FIFO while the head is free becomes the head
        # at once, so a record leaves two cycles after it was taken.
        wr_ptr, rd_ptr = Signal(qb + 1), Signal(qb + 1)
        nonempty = Signal()
        m.d.comb += nonempty.eq(wr_ptr != rd_ptr)
        next_valid, next_qp = Signal(), Signal(qb)
        pop, enq = Signal(), Signal()
        m.d.comb += [next_valid.eq(head_valid), next_qp.eq(head_qp)]
        with m.If(~head_valid | o.ready):
            with m.If(nonempty):
                m.d.comb += [next_valid.eq(1), next_qp.eq(f_rd.data), pop.eq(1), enq.eq(push)]
            with m.Else():
                m.d.comb += [next_valid.eq(push), next_qp.eq(s1_qp)]
        with m.Else():
            m.d.comb += enq.eq(push)
        rd_next = Signal(qb + 1)
        m.d.comb += [
            rd_next.eq(rd_ptr + pop),
            f_rd.addr.eq(rd_next[:qb]),
            f_wr.en.eq(enq), f_wr.addr.eq(wr_ptr[:qb]), f_wr.data.eq(s1_qp),
            out_rd.addr.eq(next_qp),          # the slot the output shows next cycle
        ]
        m.d.sync += [rd_ptr.eq(rd_next), wr_ptr.eq(wr_ptr + enq),
                     head_valid.eq(next_valid), head_qp.eq(next_qp)]
        return m
