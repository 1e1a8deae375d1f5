"""Transmit multiplexer: the responder's frames into the data frame stream, at frame boundaries only."""
from amaranth.hdl import *
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from rtl.common.tx_beat import TxBeat

__all__ = ["TxMux"]


class TxMux(wiring.Component):
    """Merges the responder's frames (ACK/NAKs, ATOMIC ACKs, READ responses) into the
    packet builder's beat stream.

    The output switches only at a boundary of the stream it is on: after a beat with
    ``last`` = 1 and ``sop_hi`` = 0, after one with ``last``, ``sop_hi`` and ``end_hi`` = 1
    (the frame at lane 64 ends in it too: the ACK builder's two ACKs in one beat), or after
    a marker beat (``frame`` = 0, a single beat that carries a completion). Never inside a
    frame, and never between a beat with ``sop_hi`` = 1 and ``end_hi`` = 0 (a frame starts
    at lane 64 and goes on) and the beat that continues that frame.
    At a boundary of the data stream a waiting responder frame goes first: ACKs are short
    and their latency bounds the peer's retransmission timer.

    The path is combinational; the only state is registered: whether a data frame is
    open, and whether a data beat is on the output without having been taken (it stays
    there, so the output never changes under a stalled ``valid``; an ACK that arrives
    meanwhile waits for the next boundary). With ``acks.valid`` low the output is the
    ``data`` stream itself, cycle for cycle: no added latency.

    Parameters
    ----------
    num_qps, num_cqs : the engine's QP and CQ counts (the ``TxBeat`` widths).

    Members
    -------
    data : In(stream.Signature(TxBeat(num_qps, num_cqs)))
        From the packet builder.
    acks : In(stream.Signature(TxBeat(num_qps, num_cqs)))
        From the responder: ACK frames of one beat, READ responses of several.
    o : Out(stream.Signature(TxBeat(num_qps, num_cqs)))
        To the ICRC inserter.
    """
    def __init__(self, *, num_qps, num_cqs):
        for name, value in (("num_qps", num_qps), ("num_cqs", num_cqs)):
            if not isinstance(value, int) or isinstance(value, bool) or not 2 <= value <= 1 << 24:
                raise ValueError(f"{name} must be an int in 2..2**24, not {value!r}")
        self.num_qps, self.num_cqs = num_qps, num_cqs
        layout = TxBeat(num_qps, num_cqs)
        super().__init__({
            "data": In(stream.Signature(layout)),
            "acks": In(stream.Signature(layout)),
            "o": Out(stream.Signature(layout)),
        })

    def elaborate(self, platform):
        m = Module()
        beat = self.data.p

        frame_open = Signal()        # the last data beat out left a frame open
        ack_open = Signal()          # the last responder beat out left a frame open
        data_offered = Signal()      # a data beat was on the output last cycle and not taken
        use_acks = Signal()
        m.d.comb += use_acks.eq(ack_open | (~frame_open & ~data_offered & self.acks.valid))

        with m.If(~use_acks):
            m.d.comb += [self.o.valid.eq(self.data.valid), self.o.p.eq(self.data.p),
                         self.data.ready.eq(self.o.ready)]
        with m.Else():
            m.d.comb += [self.o.valid.eq(self.acks.valid), self.o.p.eq(self.acks.p),
                         self.acks.ready.eq(self.o.ready)]

        # open after a beat that does not end its frame, or that starts one at lane 64
        # which does not end in it too (``end_hi``: two ACK frames in one beat close both)
        def opens(b):
            return b.frame & ((b.sop_hi & ~b.end_hi) | ~b.last)
        with m.If(self.data.valid & self.data.ready):
            m.d.sync += frame_open.eq(opens(beat))
        ab = self.acks.p
        with m.If(self.acks.valid & self.acks.ready):
            m.d.sync += ack_open.eq(opens(ab))
        m.d.sync += data_offered.eq(~use_acks & self.data.valid & ~self.o.ready)
        return m
