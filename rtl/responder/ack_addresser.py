"""ACK addresser: the requester's address added to each ACK/NAK the responder sends."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from rtl.responder.ack_builder import AckRequest
from rtl.common.contexts import qp_bits
from rtl.responder.responder import ResponderAck
from rtl.common.stream import Pair

__all__ = ["AckAddresser", "AckAddress"]


# Where a QP's ACKs go: the requester's MAC, IPv4 address and QP number.
AckAddress = data.StructLayout({"dmac": unsigned(48), "dip": unsigned(32), "remote_qpn": unsigned(24)})


class AckAddresser(wiring.Component):
    """Turns the responder's ACK/NAK records into ACK requests for the ACK builder.

    The responder decides with its QP context; where its ACKs go is needed only once
    an ACK is built, so it lives here, in a RAM of one ``AckAddress`` per QP written when
    a QP is created, with a read port per lane. One or two records per cycle: the cycle
    that takes them reads the RAM, the next presents the requests (a register stage; the
    RAM outputs hold while the output waits).

    Parameters
    ----------
    num_qps : int
        QPs in the table (a power of two >= 2).

    Members
    -------
    commit : In(stream.Signature({qpn, addr: AckAddress}))
        Set a QP's address (always ready).
    i : In(stream.Signature(Pair(ResponderAck)))
        ACK/NAKs to send, one or two per transfer; ``qpn`` is the local QP.
    o : Out(stream.Signature(Pair(AckRequest(num_qps))))
        The same transfers: ``src_qpn`` = ``qpn``; ``dmac``, ``dip``, ``dest_qp`` from the
        table.
    """
    def __init__(self, *, num_qps):
        if not isinstance(num_qps, int) or num_qps < 2 or num_qps & (num_qps - 1):
            raise ValueError(f"num_qps must be a power of two >= 2, not {num_qps!r}")
        self.num_qps = num_qps
        super().__init__({
            "commit": In(stream.Signature(data.StructLayout({"qpn": unsigned(qp_bits(num_qps)),
                                                             "addr": AckAddress}))),
            "i": In(stream.Signature(Pair(ResponderAck))),
            "o": Out(stream.Signature(Pair(AckRequest(num_qps)))),
        })

    def elaborate(self, platform):
        m = Module()
        qb = qp_bits(self.num_qps)
        m.submodules.ram = ram = Memory(shape=AckAddress, depth=self.num_qps, init=[])
        wr = ram.write_port()
        rd = [ram.read_port(transparent_for=(wr,)) for _ in range(2)]
        m.d.comb += [wr.en.eq(self.commit.valid), wr.addr.eq(self.commit.p.qpn), wr.data.eq(self.commit.p.addr),
                     self.commit.ready.eq(1)]

        recs = Signal(Pair(ResponderAck))
        m.d.comb += self.i.ready.eq(~self.o.valid | self.o.ready)
        for k in range(2):
            m.d.comb += [rd[k].addr.eq(self.i.p.p[k].qpn[:qb]), rd[k].en.eq(self.i.ready)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [self.o.valid.eq(1), recs.eq(self.i.p)]
        m.d.comb += self.o.p.second.eq(recs.second)
        for k in range(2):
            o, rec, a = self.o.p.p[k], recs.p[k], rd[k].data
            m.d.comb += [
                o.dmac.eq(a.dmac), o.dip.eq(a.dip), o.dest_qp.eq(a.remote_qpn),
                o.src_qpn.eq(rec.qpn[:qb]), o.psn.eq(rec.psn), o.syndrome.eq(rec.syndrome), o.msn.eq(rec.msn),
                o.atomic.eq(rec.atomic), o.orig.eq(rec.orig), o.read.eq(rec.read), o.counted.eq(rec.counted),
            ]
        return m
