"""Receive scatter split: a SEND packet's payload command over several receive segments,
one command per segment piece."""
from amaranth.hdl import *
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from rtl.common.stream import Pair
from rtl.responder.payload_writer import RxWriteCommand

__all__ = ["RxScatterSplit"]

EXTRA = RxWriteCommand.members["extra"].length     # pieces past a command's own (3)


class RxScatterSplit(wiring.Component):
    """Makes one payload command per piece of a received SEND packet whose payload runs over
    receive segments (``model.responder``: a packet's bytes go to as many segments as they
    span), so that the payload writer writes each piece at its own address.

    The responder gives such a packet one command: its first piece (``addr``, ``length``,
    ``offset``) and, in ``extra``, the pieces in the segments after it (each from its
    segment's start, in order; those of length 0, empty segments or past the payload, are
    skipped). They become consecutive commands of one entry each: the first piece, then each
    further one at ``offset`` moved on by the bytes before it, all but the last with
    ``more`` (the payload writer then goes over the frame's beats again for the next one)
    and only the last with the command's ``cqe`` (the receive completion's fence follows the
    packet's last write). A pair of two commands with such a packet goes one lane at a time.

    Every other pair (WRITEs, READs, atomics, SEND packets within one segment: the common
    case) passes through in the same cycle, unchanged (valid, ready and payload are
    combinational).

    Members
    -------
    i : In(stream.Signature(Pair(RxWriteCommand)))
        The responder's payload commands, one or two per transfer, in frame order.
    o : Out(stream.Signature(Pair(RxWriteCommand)))
        The same, each SEND packet over several segments as one transfer per piece.
    """
    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(Pair(RxWriteCommand))),
            "o": Out(stream.Signature(Pair(RxWriteCommand))),
        })

    def elaborate(self, platform):
        m = Module()
        pair = self.i.p
        present = [C(1, 1), pair.second]
        nz = [[pair.p[k].extra[j].length != 0 for j in range(EXTRA)] for k in range(2)]
        multi = [present[k] & ~pair.p[k].inline & pair.p[k].write & (pair.p[k].length != 0) & Cat(*nz[k]).any()
                 for k in range(2)]
        split = Signal()
        m.d.comb += split.eq(multi[0] | multi[1])

        lane = Signal()              # the lane of a split pair being sent
        step = Signal(range(EXTRA + 1))     # 0: its first piece; j: its piece extra[j - 1]
        off = Signal(13)             # the frame offset of its next piece

        c = Signal(RxWriteCommand)   # the lane's command
        m.d.comb += c.eq(Mux(lane, pair.p[1], pair.p[0]))
        c_multi = Signal()
        c_nz = Signal(EXTRA)
        m.d.comb += [c_multi.eq(Mux(lane, multi[1], multi[0])), c_nz.eq(Mux(lane, Cat(*nz[1]), Cat(*nz[0])))]
        # the pieces after this step's (extras with a length beyond index step - 1)
        later = Signal(EXTRA)
        m.d.comb += later.eq(c_nz & ~((C(1, EXTRA + 1) << step) - 1)[:EXTRA])
        nxt = Signal(range(EXTRA + 1))      # the next step: the first of them
        for j in reversed(range(EXTRA)):
            with m.If(later[j]):
                m.d.comb += nxt.eq(j + 1)
        piece = Signal(RxWriteCommand)
        e = c.extra[(step - 1)[:2]]
        m.d.comb += piece.eq(c)
        with m.If(~c_multi):
            pass                    # a lane of its own (one command), unchanged
        with m.Elif(step == 0):
            m.d.comb += [piece.more.eq(1), piece.cqe.eq(0)]
        with m.Else():
            m.d.comb += [piece.addr.eq(e.addr), piece.length.eq(e.length), piece.offset.eq(off),
                         piece.more.eq(later != 0), piece.cqe.eq(c.cqe & (later == 0))]
        lane_done = Signal()
        m.d.comb += lane_done.eq(~piece.more)

        with m.If(~split):
            m.d.comb += [self.o.valid.eq(self.i.valid), self.o.p.eq(pair), self.i.ready.eq(self.o.ready)]
        with m.Else():
            m.d.comb += [self.o.valid.eq(self.i.valid), self.o.p.second.eq(0), self.o.p.p[0].eq(piece)]
            with m.If(self.o.valid & self.o.ready):
                m.d.sync += [off.eq(piece.offset + piece.length), step.eq(nxt)]
                with m.If(lane_done):
                    m.d.sync += step.eq(0)
                    with m.If(~lane & pair.second):
                        m.d.sync += lane.eq(1)
                    with m.Else():
                        m.d.comb += self.i.ready.eq(1)
                        m.d.sync += lane.eq(0)
        return m
