"""READ response source: the responder's READ jobs, once their fences have landed, as
messages for the responder's own payload fetch and packet builder."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from rtl.common.contexts import qp_bits
from rtl.requester.message import Message, MessageKind
from rtl.responder.ack_addresser import AckAddress
from rtl.responder.responder import ReadJob

__all__ = ["ReadResponseSource"]


class ReadResponseSource(wiring.Component):
    """Turns each READ job into a READ_RESPONSE message once its memory may be read.

    A READ reads GPU memory only after every write the responder accepted before it has
    landed (put-with-signal: a READ after a WRITE of its QP sees the WRITE). The write
    issuer strobes ``landed`` once per READ fence, in order; each strobe is a credit for
    one job. The message goes where the requester's payload fetch and packet builder
    take theirs (a second pair of them in the responder): they read the payload in
    bursts ahead of the builder and split it at the MTU.

    Where a QP's responses go (the requester's MAC, IPv4 address and QP number) is a RAM
    of one ``AckAddress`` per QP, written with the QP's create as the ``AckAddresser``'s is.
    The cycle that takes a job reads it; the next presents the message (a register stage).

    Parameters
    ----------
    num_qps, num_cqs : int
        As the engine's (the ``Message`` widths).
    credits : int
        Landed fences counted ahead of their jobs (at most the fences the write issuer
        holds).

    Members
    -------
    commit : In(stream.Signature({qpn, addr: AckAddress}))
        Set a QP's peer (always ready).
    jobs : In(stream.Signature(ReadJob(num_qps)))
        The READs, in the order of their fences.
    landed : In(1)
        A READ's fence has landed (one strobe per READ, in order).
    messages : Out(stream.Signature(Message(num_qps, num_cqs)))
        Kind READ_RESPONSE, ``addr`` = ``va``, ``rkey`` = the MSN, ``signaled`` set (the
        last beat of its responses carries a completion marker, for ``ResponseMerge``).
    """
    def __init__(self, *, num_qps, num_cqs, credits=256):
        if not isinstance(num_qps, int) or num_qps < 2 or num_qps & (num_qps - 1):
            raise ValueError(f"num_qps must be a power of two >= 2, not {num_qps!r}")
        if not isinstance(credits, int) or credits < 1:
            raise ValueError(f"credits must be an int >= 1, not {credits!r}")
        self.num_qps, self.num_cqs, self.credits = num_qps, num_cqs, credits
        super().__init__({
            "commit": In(stream.Signature(data.StructLayout({"qpn": unsigned(qp_bits(num_qps)),
                                                             "addr": AckAddress}))),
            "jobs": In(stream.Signature(ReadJob(num_qps))),
            "landed": In(1),
            "messages": Out(stream.Signature(Message(num_qps, num_cqs))),
        })

    def elaborate(self, platform):
        m = Module()
        qb = qp_bits(self.num_qps)
        m.submodules.ram = ram = Memory(shape=AckAddress, depth=self.num_qps, init=[])
        wr = ram.write_port()
        rd = ram.read_port(transparent_for=(wr,))
        m.d.comb += [wr.en.eq(self.commit.valid), wr.addr.eq(self.commit.p.qpn), wr.data.eq(self.commit.p.addr),
                     self.commit.ready.eq(1)]

        credit = Signal(range(self.credits + 1))
        take = Signal()
        m.d.comb += [self.jobs.ready.eq((credit != 0) & (~self.messages.valid | self.messages.ready)),
                     take.eq(self.jobs.valid & self.jobs.ready),
                     rd.addr.eq(self.jobs.p.qpn[:qb]), rd.en.eq(self.jobs.ready)]
        m.d.sync += credit.eq(credit + self.landed - take)

        job = Signal(ReadJob(self.num_qps))
        with m.If(self.messages.valid & self.messages.ready):
            m.d.sync += self.messages.valid.eq(0)
        with m.If(take):
            m.d.sync += [self.messages.valid.eq(1), job.eq(self.jobs.p)]
        msg = self.messages.p
        m.d.comb += [
            msg.eq(0),
            msg.qpn.eq(job.qpn), msg.kind.eq(MessageKind.READ_RESPONSE), msg.signaled.eq(1),
            msg.cfg.dmac.eq(rd.data.dmac), msg.cfg.dip.eq(rd.data.dip), msg.cfg.remote_qpn.eq(rd.data.remote_qpn),
            msg.cfg.mtu.eq(job.mtu), msg.addr.eq(job.va), msg.length.eq(job.length), msg.psn.eq(job.psn),
            msg.rkey.eq(job.msn),
        ]
        return m
