"""Receive write sorter: the responder's payload commands, split between the payload
writer (payload in the segment stream) and the write issuer's in-order list of writes."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.wiring import In, Out

from spec.params import AXI_PAGE, AXI_PAGE_SHIFT
from rtl.common.rx_packet import INLINE_MAX
from rtl.common.records import RxKeepPair
from rtl.common.stream import Pair, pack_pair
from rtl.responder.payload_writer import QP_TAG_BITS, RxWriteCommand, BEAT_SHIFT as LINE_SHIFT

__all__ = ["RxWriteOrder", "RxWriteSorter"]


RxWriteOrder = data.StructLayout({
    "inline": unsigned(1),      # 1: the write below; 0: the payload writer's next burst(s)
    "bursts": unsigned(2),      # payload writer: its bursts for this write (2: across 4 KiB)
    "line":   unsigned(64 - LINE_SHIFT),   # inline: the 128-byte line written
    "lane":   unsigned(LINE_SHIFT),        # inline: the first byte's lane in it
    "length": unsigned(3),      # inline: 1..INLINE_MAX bytes
    "data":   unsigned(8 * INLINE_MAX),    # inline: the bytes, first in bits 7..0
    "qp":     unsigned(QP_TAG_BITS),       # the QP's tag: a QP's writes land in order
    "fence":  unsigned(1),      # no write: an atomic or READ, which reads memory once the writes before it landed
    "fence_read": unsigned(1),  # with fence: a READ's (else an atomic's)
    "fence_local": unsigned(1), # with fence: a READ of this NIC's requester completes (its bytes landed)
    "fence_cqe": unsigned(1),   # with fence: a receive completion (its CQE is written once it is done)
})
RxWriteOrder.__doc__ = """One write to GPU memory, in the order the responder accepted them
(see :class:`rtl.responder.write_issuer.RxWriteIssuer`)."""


class RxWriteSorter(wiring.Component):
    """Splits the responder's payload commands between the payload writer and the list of
    writes the write issuer puts on the DMA ports, keeping their order, and says of each
    frame in the segment stream whether the writer takes it.

    A command with ``inline`` = 1 carries its payload (at most 4 bytes in one 128-byte
    line; the header parser took it from the header window and kept the frame out of
    the segment stream): it becomes an inline order when accepted (``write`` = 1) and
    is dropped otherwise; with ``fence`` (an atomic) it becomes a fence order. Every
    other command is of a frame in the segment stream: its verdict (``write``) goes on
    ``verdicts``, once per frame (on its last piece), for the resegmenter, which passes
    only the frames written; the accepted ones go to the payload writer, which so sees
    each frame it writes once (a piece of one: once per piece), and also become orders
    that stand for the writer's one or two AXI bursts. A discarded frame (a duplicate,
    one behind a gap, one answered by an RNR NAK) so costs the writer and the
    resegmenter nothing: a flood of them runs at the line rate whatever their size.

    A command with ``cqe`` (a receive completion) is followed by a CQE fence order
    (``fence_cqe``), after its write if it has one. A pair with such a command goes one lane
    a cycle (each lane's up to two orders in one transfer).

    One pair is taken per cycle, or two cycles for a pair of two writer commands (the
    writer takes one per cycle) or with a receive completion; a pair's verdicts go out in
    its first cycle. All outputs are registered.

    Members
    -------
    i : In(stream.Signature(Pair(RxWriteCommand)))
        The responder's commands, one or two per transfer, in frame order.
    commands : Out(stream.Signature(RxWriteCommand))
        To the payload writer: the accepted commands of the segment stream.
    orders : Out(stream.Signature(Pair(RxWriteOrder)))
        The writes, in order, one or two per transfer.
    verdicts : Out(stream.Signature(RxKeepPair))
        Per frame of the segment stream, in frame order, one or two per transfer (packed
        to the front): 1 when the writer takes it.
    """
    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(Pair(RxWriteCommand))),
            "commands": Out(stream.Signature(RxWriteCommand)),
            "orders": Out(stream.Signature(Pair(RxWriteOrder))),
            "verdicts": Out(stream.Signature(RxKeepPair)),
        })

    def elaborate(self, platform):
        m = Module()
        pair = self.i.p
        present = [C(1, 1), pair.second]
        c = [pair.p[0], pair.p[1]]
        seg = [present[k] & ~c[k].inline for k in range(2)]
        # (a frame of the segment stream: its verdict on its last piece; the writer takes it if written)
        ends = [seg[k] & ~c[k].more for k in range(2)]
        wseg = [seg[k] & c[k].write for k in range(2)]
        verdict = Signal(RxKeepPair)
        m.d.comb += [verdict.second.eq(ends[0] & ends[1]),
                     verdict.keep.eq(Cat(Mux(ends[0], c[0].write, c[1].write), c[1].write))]
        does = [present[k] & ((c[k].write & (c[k].inline | (c[k].length != 0))) | c[k].fence) for k in range(2)]
        orders = []
        for k in range(2):
            o = Signal(RxWriteOrder, name=f"order{k}")
            in_page = Signal(14, name=f"in_page{k}")
            m.d.comb += [
                in_page.eq(c[k].addr[:AXI_PAGE_SHIFT] + c[k].length),
                o.inline.eq(c[k].inline & ~c[k].fence), o.fence.eq(c[k].fence), o.fence_read.eq(c[k].fence_read),
                o.fence_local.eq(c[k].fence_local),
                o.bursts.eq(Mux(c[k].fence, 0, Mux(in_page > AXI_PAGE, 2, 1))),
                o.line.eq(c[k].addr[LINE_SHIFT:]), o.lane.eq(c[k].addr[:LINE_SHIFT]),
                o.length.eq(c[k].length[:3]), o.data.eq(c[k].data), o.qp.eq(c[k].qp),
            ]
            orders.append(o)
        # per lane: its write order (if any) then its CQE fence (if any), packed to the front
        cq = [present[k] & c[k].cqe for k in range(2)]
        any_cqe = Signal()
        m.d.comb += any_cqe.eq(cq[0] | cq[1])
        lane_pairs = []
        for k in range(2):
            f = Signal(RxWriteOrder, name=f"cqe_fence{k}")
            m.d.comb += [f.fence.eq(1), f.fence_cqe.eq(1), f.qp.eq(c[k].qp)]
            lp = Signal.like(self.orders.p, name=f"lane_orders{k}")
            m.d.comb += pack_pair(lp, [does[k], cq[k]], [orders[k], f])
            lane_pairs.append(lp)

        half = Signal()                  # p[0] went to the writer; p[1] is next
        cmd_free, ord_free, ver_free = Signal(), Signal(), Signal()
        m.d.comb += [cmd_free.eq(~self.commands.valid | self.commands.ready),
                     ord_free.eq(~self.orders.valid | self.orders.ready),
                     ver_free.eq(~self.verdicts.valid | self.verdicts.ready | ~(ends[0] | ends[1]))]
        with m.If(self.commands.valid & self.commands.ready):
            m.d.sync += self.commands.valid.eq(0)
        with m.If(self.orders.valid & self.orders.ready):
            m.d.sync += self.orders.valid.eq(0)
        with m.If(self.verdicts.valid & self.verdicts.ready):
            m.d.sync += self.verdicts.valid.eq(0)

        go = Signal()
        # a pair's verdicts go out in its first cycle (a pair without one leaves a waiting one be)
        with m.If(go & ~half & (ends[0] | ends[1])):
            m.d.sync += [self.verdicts.valid.eq(1), self.verdicts.p.eq(verdict)]
        with m.If(half & any_cqe):
            # lane 1 of a pair with a receive completion
            m.d.comb += [go.eq(self.i.valid & cmd_free & ord_free), self.i.ready.eq(go)]
            with m.If(go):
                m.d.sync += [self.commands.valid.eq(wseg[1]), self.commands.p.eq(c[1]), half.eq(0),
                             self.orders.valid.eq(does[1] | cq[1]), self.orders.p.eq(lane_pairs[1])]
        with m.Elif(half):
            m.d.comb += [go.eq(self.i.valid & cmd_free), self.i.ready.eq(go)]
            with m.If(go):
                m.d.sync += [self.commands.valid.eq(1), self.commands.p.eq(c[1]), half.eq(0)]
        with m.Elif(any_cqe):
            # lane 0 of a pair with a receive completion (the whole pair when it is alone)
            m.d.comb += go.eq(self.i.valid & cmd_free & ord_free & ver_free)
            with m.If(go):
                m.d.sync += [self.commands.valid.eq(wseg[0]), self.commands.p.eq(c[0]),
                             self.orders.valid.eq(does[0] | cq[0]), self.orders.p.eq(lane_pairs[0])]
                with m.If(pair.second):
                    m.d.sync += half.eq(1)
                with m.Else():
                    m.d.comb += self.i.ready.eq(1)
        with m.Else():
            m.d.comb += go.eq(self.i.valid & cmd_free & ord_free & ver_free)
            with m.If(go):
                m.d.sync += [
                    self.commands.valid.eq(wseg[0] | wseg[1]), self.commands.p.eq(Mux(wseg[0], c[0], c[1])),
                    self.orders.valid.eq(does[0] | does[1]), *pack_pair(self.orders.p, does, orders),
                ]
                with m.If(wseg[0] & wseg[1]):
                    m.d.sync += half.eq(1)
                with m.Else():
                    m.d.comb += self.i.ready.eq(1)
        return m
