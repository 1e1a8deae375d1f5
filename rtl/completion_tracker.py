"""Requester completions of RC QPs: a CQE only once the responder has acknowledged the WQE."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .contexts import qp_bits
from .message import Completion
from .responder import ReceivedAck

__all__ = ["CompletionTracker"]

PSN_BITS = 24
PSN_HALF = 1 << (PSN_BITS - 1)


class CompletionTracker(wiring.Component):
    """Holds each RC QP's completions until an ACK covers their last packet.

    A completion of the transmit path (a signaled WQE whose last packet has left, a NOP,
    or a WQE that failed locally) carries the PSN of its message's last packet. A UC
    QP's completion passes at once. An RC QP's completion passes when the QP's
    acknowledged PSN has reached it: at once if it already has (a NOP behind
    acknowledged work) and nothing of the QP is waiting, else it waits in the QP's
    queue (a ring per QP in one RAM) until an ACK comes. An ACK with PSN p
    acknowledges every packet up to p (serial arithmetic mod 2^24); the tracker then
    releases the QP's waiting completions from the head while they are covered, one per
    cycle, in order. Only signaled WQEs wait here: an unsignaled WQE is completed by the
    next signaled one of its QP (mlx5 CQE semantics). NAKs are counted only for now
    (retransmission and error completions come with go-back-N).

    One sequencer serves ACKs first, then new completions; an operation reads the QP's
    state in one cycle and decides in the next. A completion for a full queue waits (the
    transmit path then stalls at its MAC port) while ACKs keep being served.

    Parameters
    ----------
    num_qps, num_cqs : int
        Table sizes.
    depth : int
        Waiting completions per QP (a power of two).

    Members
    -------
    sent : In(stream.Signature(Completion))
        Completions from the transmit path, in send order.
    acks : In(stream.Signature(ReceivedAck))
        ACK/NAK frames received for this NIC's QPs.
    commit : In(stream.Signature(...))
        ``qpn``, ``start_psn``: a QP create (queue emptied, nothing acknowledged).
    completions : Out(stream.Signature(Completion))
        To the CQE writer.
    naks : Out(1)
        Strobe per NAK received.
    """
    def __init__(self, *, num_qps, num_cqs, depth=16):
        if not isinstance(num_qps, int) or num_qps < 2 or num_qps & (num_qps - 1):
            raise ValueError(f"num_qps must be a power of two >= 2, not {num_qps!r}")
        if not isinstance(depth, int) or depth < 2 or depth & (depth - 1):
            raise ValueError(f"depth must be a power of two >= 2, not {depth!r}")
        self.num_qps, self.num_cqs, self.depth = num_qps, num_cqs, depth
        cpl = Completion(num_qps, num_cqs)
        super().__init__({
            "sent": In(stream.Signature(cpl)),
            "acks": In(stream.Signature(ReceivedAck)),
            "commit": In(stream.Signature(data.StructLayout({
                "qpn": unsigned(qp_bits(num_qps)), "start_psn": unsigned(PSN_BITS)}))),
            "completions": Out(stream.Signature(cpl)),
            "naks": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        qb, db = qp_bits(self.num_qps), (self.depth - 1).bit_length()
        cpl_layout = Completion(self.num_qps, self.num_cqs)
        state_layout = data.StructLayout({"head": unsigned(db + 1), "tail": unsigned(db + 1),
                                          "acked": unsigned(PSN_BITS)})
        m.submodules.state = st_ram = Memory(shape=state_layout, depth=self.num_qps, init=[])
        m.submodules.queue = q_ram = Memory(shape=cpl_layout, depth=self.num_qps * self.depth, init=[])
        st_wr, st_rd = st_ram.write_port(), st_ram.read_port(transparent_for=())
        q_wr, q_rd = q_ram.write_port(), q_ram.read_port(transparent_for=())

        def covered(psn, acked):
            # psn <= acked in serial arithmetic: acked - psn is "non-negative"
            return ((acked - psn)[:PSN_BITS] < PSN_HALF)

        qpn = Signal(qb)
        st = Signal(state_layout)       # the QP's state as read from RAM
        st_reg = Signal(state_layout)   # the QP's state while draining
        ack = Signal(ReceivedAck)
        cpl = Signal(cpl_layout)
        out = self.completions
        m.d.comb += [st_rd.en.eq(1), q_rd.en.eq(1)]
        with m.If(out.valid & out.ready):
            m.d.sync += out.valid.eq(0)
        out_free = Signal()
        m.d.comb += out_free.eq(~out.valid | out.ready)

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.commit.ready.eq(1)         # not dependent on valid: commits join others
                with m.If(self.commit.valid):
                    m.d.comb += [st_wr.en.eq(1), st_wr.addr.eq(self.commit.p.qpn),
                                 st_wr.data.head.eq(0), st_wr.data.tail.eq(0),
                                 st_wr.data.acked.eq(self.commit.p.start_psn - 1)]
                with m.Elif(self.acks.valid):
                    m.d.comb += [self.acks.ready.eq(1), st_rd.addr.eq(self.acks.p.qpn[:qb])]
                    m.d.sync += [ack.eq(self.acks.p), qpn.eq(self.acks.p.qpn[:qb])]
                    m.next = "ACK"
                with m.Elif(self.sent.valid & self.sent.p.uc):
                    # UC: complete when sent
                    with m.If(out_free):
                        m.d.comb += self.sent.ready.eq(1)
                        m.d.sync += [out.valid.eq(1), out.p.eq(self.sent.p)]
                with m.Elif(self.sent.valid):
                    m.d.comb += st_rd.addr.eq(self.sent.p.qpn)
                    m.d.sync += [cpl.eq(self.sent.p), qpn.eq(self.sent.p.qpn)]
                    m.next = "ENQUEUE"
            with m.State("ENQUEUE"):
                m.d.comb += st.eq(st_rd.data)
                empty = st.head == st.tail
                full = (st.tail - st.head)[:db + 1] == self.depth
                with m.If(empty & covered(cpl.psn, st.acked)):
                    # already acknowledged (a NOP behind acknowledged work): out at once
                    with m.If(out_free):
                        m.d.comb += self.sent.ready.eq(1)
                        m.d.sync += [out.valid.eq(1), out.p.eq(cpl)]
                        m.next = "IDLE"
                with m.Elif(~full):
                    m.d.comb += [self.sent.ready.eq(1),
                                 q_wr.en.eq(1), q_wr.addr.eq(Cat(st.tail[:db], qpn)), q_wr.data.eq(cpl),
                                 st_wr.en.eq(1), st_wr.addr.eq(qpn), st_wr.data.eq(st)]
                    m.d.comb += st_wr.data.tail.eq(st.tail + 1)
                    m.next = "IDLE"
                with m.Else():
                    m.next = "IDLE"          # full: try again after the ACKs waiting
            with m.State("ACK"):
                m.d.comb += st.eq(st_rd.data)
                is_ack = ack.syndrome[5:7] == 0
                m.d.comb += self.naks.eq(~is_ack & (ack.syndrome[5:7] == 3))
                newer = Signal()
                m.d.comb += newer.eq(~covered(ack.psn, st.acked))
                nxt = Signal(state_layout)
                m.d.comb += [nxt.eq(st), nxt.acked.eq(Mux(is_ack & newer, ack.psn, st.acked))]
                m.d.comb += [st_wr.en.eq(1), st_wr.addr.eq(qpn), st_wr.data.eq(nxt)]
                m.d.sync += st_reg.eq(nxt)
                # read the head entry for the drain
                m.d.comb += q_rd.addr.eq(Cat(st.head[:db], qpn))
                m.next = "DRAIN"
            with m.State("DRAIN"):
                # st_reg is the QP's state; q_rd.data the head entry
                head = q_rd.data
                new_head = Signal(db + 1)
                m.d.comb += new_head.eq(st_reg.head + 1)
                with m.If((st_reg.head == st_reg.tail) | ~covered(head.psn, st_reg.acked)):
                    m.next = "IDLE"
                with m.Elif(out_free):
                    m.d.sync += [out.valid.eq(1), out.p.eq(head), st_reg.head.eq(new_head)]
                    m.d.comb += [st_wr.en.eq(1), st_wr.addr.eq(qpn), st_wr.data.eq(st_reg),
                                 st_wr.data.head.eq(new_head),
                                 q_rd.addr.eq(Cat(new_head[:db], qpn))]
                with m.Else():
                    m.d.comb += q_rd.addr.eq(Cat(st_reg.head[:db], qpn))
        return m
