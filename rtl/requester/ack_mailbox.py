"""ACK mailbox: one waiting ACK/NAK record per QP, so received ACKs never wait."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from spec.formats import Aeth, PSN_BITS, PSN_HALF
from rtl.common.contexts import qp_bits
from rtl.common.records import AckRecord
from rtl.common.stream import Pair

__all__ = ["AckMailbox"]



_CLASS = data.StructLayout({"nak": 1, "fatal": 1, "inert": 1, "implied": PSN_BITS})


def _classify(m, r):
    """A record's class (``_CLASS``): a NAK (RNR too), a fatal NAK, inert (a reserved kind),
    and the PSN it acknowledges up to (a NAK's PSN - 1)."""
    c = Signal(_CLASS)
    kind = r.syndrome[5:7]
    nak = (kind == Aeth.KIND_NAK) | (kind == Aeth.KIND_RNR)
    m.d.comb += [c.nak.eq(nak), c.fatal.eq((kind == Aeth.KIND_NAK) & (r.syndrome != Aeth.NAK_PSN_SEQ)),
                 c.inert.eq(~nak & (kind != Aeth.KIND_ACK)),
                 c.implied.eq(Mux(nak, (r.psn - 1)[:PSN_BITS], r.psn))]
    return c


def _replaces(m, new, old, new_class=None):
    """1 when ``new``, arriving while ``old`` of its QP waits, says more than ``old``.

    An ACK acknowledges its PSN, a NAK every PSN before its own: of two records the one
    whose acknowledged PSN is newer (serial arithmetic mod 2^24) says all the other
    does; on a tie the NAK, which also asks for the retransmission. A fatal NAK fails
    the QP: once one waits nothing else matters, and a new one replaces anything (it
    acknowledges what the waiting one did). An RNR NAK is a NAK here (it acknowledges the
    PSNs before its own and asks for a resend, after its timer); a reserved kind does not
    move the tracker at all, so it never replaces a record and is replaced by any.
    ``new_class``: ``new``'s ``_classify``, when it was registered beforehand."""
    nc = _classify(m, new) if new_class is None else new_class
    oc = _classify(m, old)
    n_nak, n_fatal, n_inert, n_imp = nc.nak, nc.fatal, nc.inert, nc.implied
    o_nak, o_fatal, o_inert, o_imp = oc.nak, oc.fatal, oc.inert, oc.implied
    diff = (n_imp - o_imp)[:PSN_BITS]
    newer = (diff != 0) & (diff < PSN_HALF)
    tie_nak = (diff == 0) & n_nak & ~o_nak
    return ~o_fatal & (n_fatal | (~n_inert & (o_inert | newer | tie_nak)))


class AckMailbox(wiring.Component):
    """Between the receive dispatch's ACK/NAKs and the completion tracker: per QP one
    waiting record, into which the QP's later ACK/NAKs fold, so the input is never held.

    The receive path delivers up to two ACK/NAKs per cycle (two 62-byte ACK frames can
    end in one beat: at line rate they come 1.16 per cycle); the tracker spends about
    3.5 cycles on one. Of two records of a QP the tracker needs only the one that says
    more (see ``_replaces``: the newer acknowledged PSN, a NAK on a tie, a fatal NAK over
    anything, an RNR NAK never), so a QP needs at most one waiting record, and the QPs
    that have one need a place in line: a FIFO of QPNs in order of first arrival, each QP
    at most once, so ``num_qps`` entries never overflow. Both live in RAM (a slot per QP:
    busy bit and record; the FIFO's QPNs), not in per-QP flip-flops.

    An input pair is taken every cycle (``i.ready`` is constant 1, also during reset:
    the slot RAM starts empty by its init value, which a reset does not restore — like
    the other QP tables). Cycle t takes it and reads the slots of its one or two QPs;
    cycle t+1 decides. Two records of one QP in a pair fold first (``p[1]`` is the
    newer; folded in cycle t, into the register, with each lane's class, so that the
    decision of t+1 has one comparison, not two in a chain), so the lanes then hold
    different QPs and touch different slots. Per lane: no
    record waits — store it and push the QPN (lane 0's first); one waits — the one that
    says more stays in the slot and the other counts in ``merged``. ``o`` presents the
    slot of the QP at the head of the FIFO (read each cycle, transparent to this cycle's
    writes, so a record that folds into the presented one changes ``o.p`` while
    ``o.valid`` waits for ``o.ready``; the tracker takes ``o.p`` at the transfer); when
    it leaves the slot is cleared. A record that arrives in the cycle its QP's record
    leaves finds the slot empty: it is stored and the QPN pushed again (the departing
    record is not changed under the transfer). With the output ready, a record leaves
    two cycles after it was taken (lane 1's of a pair of two QPs one cycle later), and
    the order of the QPs is the order of their first arrival.

    The slot RAM has three write ports (two lanes, the clear) and three read ports (two
    lanes, the head): the price of taking two QPs' ACKs in one cycle, on a table of one
    record (~60 bits) per QP.

    Members
    -------
    i : In(stream.Signature(Pair(AckRecord)))
        ACK/NAK frames received, one or two per transfer in frame order; ``i.ready`` is
        always 1. The QP is ``qpn[:qp_bits]``.
    o : Out(stream.Signature(AckRecord))
        To the completion tracker.
    merged : Out(2)
        Records that did not leave on their own (dropped or replaced) this cycle, one
        cycle after their successor was taken.
    """
    def __init__(self, num_qps):
        if not isinstance(num_qps, int) or num_qps < 2 or num_qps & (num_qps - 1):
            raise ValueError(f"num_qps must be a power of two >= 2, not {num_qps!r}")
        self.num_qps = num_qps
        super().__init__({
            "i": In(stream.Signature(Pair(AckRecord))),
            "o": Out(stream.Signature(AckRecord)),
            "merged": Out(2),
        })

    def elaborate(self, platform):
        m = Module()
        qb = qp_bits(self.num_qps)
        i, o = self.i, self.o
        slot_layout = data.StructLayout({"busy": 1, "rec": AckRecord})
        m.submodules.slots = slots = Memory(shape=slot_layout, depth=self.num_qps, init=[])
        # writers: the lanes' stores and the output's clear; readers: the lanes' QPs and
        # the head QP. Every reader sees the writes of the cycle it reads in, so what it
        # returns is the slot as it is when its data is used (no forwarding).
        in_wr = [slots.write_port() for _ in range(2)]
        clr_wr = slots.write_port()
        in_rd = [slots.read_port(transparent_for=(*in_wr, clr_wr)) for _ in range(2)]
        out_rd = slots.read_port(transparent_for=(*in_wr, clr_wr))
        m.submodules.order = order = Memory(shape=unsigned(qb), depth=self.num_qps, init=[])
        f_wr = [order.write_port() for _ in range(2)]
        f_rd = order.read_port(transparent_for=f_wr)

        # Stage 1: the input (always taken) and its QPs' slot reads; two records of one QP
        # fold into the one that says more (lane 0), and each lane's record is classified.
        m.d.comb += i.ready.eq(1)
        s1_valid = Signal(2)
        same = Signal()
        lane = [Signal(AckRecord, name=f"lane{k}") for k in range(2)]
        lane_class = [Signal(_CLASS, name=f"lane_class{k}") for k in range(2)]
        ip = i.p.p
        in_same = Signal()
        m.d.comb += in_same.eq(i.p.second & (ip[0].qpn[:qb] == ip[1].qpn[:qb]))
        in_lane0 = Signal(AckRecord)
        m.d.comb += in_lane0.eq(Mux(in_same & _replaces(m, ip[1], ip[0]), ip[1], ip[0]))
        m.d.sync += [s1_valid.eq(Mux(i.valid, Cat(1, i.p.second), 0)), same.eq(i.valid & in_same),
                     lane[0].eq(in_lane0), lane[1].eq(ip[1]),
                     lane_class[0].eq(_classify(m, in_lane0)), lane_class[1].eq(_classify(m, ip[1]))]
        for k in range(2):
            m.d.comb += in_rd[k].addr.eq(ip[k].qpn[:qb])

        # Stage 2a: the lanes (a pair of one QP is one record, lane 0).
        lane_valid = Signal(2)
        lane_qp = [lane[k].qpn[:qb] for k in range(2)]
        m.d.comb += lane_valid.eq(Cat(s1_valid[0], s1_valid[1] & ~same))

        # The output: the head QP's slot.
        head_valid = Signal()
        head_qp = Signal(qb)
        leaving = Signal()
        m.d.comb += [o.valid.eq(head_valid), o.p.eq(out_rd.data.rec), leaving.eq(head_valid & o.ready)]

        # Stage 2b: decide per lane. A record leaving now is gone for the arriving one (so
        # the transfer and the fold never touch the same record).
        push = Signal(2)
        folded = Signal(2)
        for k in range(2):
            waiting = Signal(name=f"waiting{k}")
            m.d.comb += waiting.eq(in_rd[k].data.busy & ~(leaving & (head_qp == lane_qp[k])))
            replaces = _replaces(m, lane[k], in_rd[k].data.rec, lane_class[k])
            m.d.comb += [in_wr[k].addr.eq(lane_qp[k]), in_wr[k].data.busy.eq(1), in_wr[k].data.rec.eq(lane[k])]
            with m.If(lane_valid[k]):
                with m.If(~waiting):
                    m.d.comb += [push[k].eq(1), in_wr[k].en.eq(1)]
                with m.Else():
                    m.d.comb += [folded[k].eq(1), in_wr[k].en.eq(replaces)]
        m.d.comb += self.merged.eq(same + folded[0] + folded[1])
        # (when an arriving record is of the leaving QP it is stored there: no clear)
        arriving_head = Cat(*[lane_valid[k] & (lane_qp[k] == head_qp) for k in range(2)]).any()
        m.d.comb += [clr_wr.addr.eq(head_qp), clr_wr.data.eq(0), clr_wr.en.eq(leaving & ~arriving_head)]

        # The FIFO of QPNs behind the head. Its read port reads the next front each
        # cycle; a QPN pushed into an empty FIFO while the head is free becomes the head
        # at once, so a record leaves two cycles after it was taken. The pushes of a
        # cycle, lane 0's first, go to consecutive places.
        first_qp = Signal(qb)           # the first QPN pushed this cycle
        m.d.comb += first_qp.eq(Mux(push[0], lane_qp[0], lane_qp[1]))
        wr_ptr, rd_ptr = Signal(qb + 1), Signal(qb + 1)
        nonempty = Signal()
        m.d.comb += nonempty.eq(wr_ptr != rd_ptr)
        next_valid, next_qp = Signal(), Signal(qb)
        pop = Signal()
        enq = Signal(2)                 # which lanes' QPNs go into the FIFO
        m.d.comb += [next_valid.eq(head_valid), next_qp.eq(head_qp), enq.eq(push)]
        with m.If(~head_valid | o.ready):
            with m.If(nonempty):
                m.d.comb += [next_valid.eq(1), next_qp.eq(f_rd.data), pop.eq(1)]
            with m.Else():
                # the first push becomes the head, a second one goes into the FIFO
                m.d.comb += [next_valid.eq(push.any()), next_qp.eq(first_qp), enq.eq(Mux(push.all(), 0b10, 0))]
        rd_next = Signal(qb + 1)
        m.d.comb += [
            rd_next.eq(rd_ptr + pop),
            f_rd.addr.eq(rd_next[:qb]),
            f_wr[0].en.eq(enq[0]), f_wr[0].addr.eq(wr_ptr[:qb]), f_wr[0].data.eq(lane_qp[0]),
            f_wr[1].en.eq(enq[1]), f_wr[1].addr.eq((wr_ptr + enq[0])[:qb]), f_wr[1].data.eq(lane_qp[1]),
            out_rd.addr.eq(next_qp),          # the slot the output shows next cycle
        ]
        m.d.sync += [rd_ptr.eq(rd_next), wr_ptr.eq(wr_ptr + enq[0] + enq[1]),
                     head_valid.eq(next_valid), head_qp.eq(next_qp)]
        return m
