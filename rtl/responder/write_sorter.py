"""Receive write sorter: the responder's payload commands, split between the payload
writer (payload in the segment stream) and the write issuer's in-order list of writes."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.wiring import In, Out

from spec.params import AXI_PAGE, AXI_PAGE_SHIFT
from rtl.common.rx_packet import INLINE_MAX
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
})
RxWriteOrder.__doc__ = """One write to GPU memory, in the order the responder accepted them
(see :class:`rtl.responder.write_issuer.RxWriteIssuer`)."""


class RxWriteSorter(wiring.Component):
    """Splits the responder's payload commands between the payload writer and the list of
    writes the write issuer puts on the DMA ports, keeping their order.

    A command with ``inline`` = 1 carries its payload (at most 4 bytes in one 128-byte
    line; the header parser took it from the header window and kept the frame out of
    the segment stream): it becomes an inline order when accepted (``write`` = 1) and
    is dropped otherwise; with ``fence`` (an atomic) it becomes a fence order. Every
    other command goes to the payload writer, which sees
    each frame of the segment stream once; an accepted one with payload also becomes an
    order that stands for the writer's one or two AXI bursts.

    One pair is taken per cycle, or two cycles for a pair of two writer commands (the
    writer takes one per cycle). Both outputs are registered.

    Members
    -------
    i : In(stream.Signature(Pair(RxWriteCommand)))
        The responder's commands, one or two per transfer, in frame order.
    commands : Out(stream.Signature(RxWriteCommand))
        To the payload writer.
    orders : Out(stream.Signature(Pair(RxWriteOrder)))
        The writes, in order, one or two per transfer.
    """
    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(Pair(RxWriteCommand))),
            "commands": Out(stream.Signature(RxWriteCommand)),
            "orders": Out(stream.Signature(Pair(RxWriteOrder))),
        })

    def elaborate(self, platform):
        m = Module()
        pair = self.i.p
        present = [C(1, 1), pair.second]
        c = [pair.p[0], pair.p[1]]
        seg = [present[k] & ~c[k].inline for k in range(2)]
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

        half = Signal()                  # p[0] went to the writer; p[1] is next
        cmd_free, ord_free = Signal(), Signal()
        m.d.comb += [cmd_free.eq(~self.commands.valid | self.commands.ready),
                     ord_free.eq(~self.orders.valid | self.orders.ready)]
        with m.If(self.commands.valid & self.commands.ready):
            m.d.sync += self.commands.valid.eq(0)
        with m.If(self.orders.valid & self.orders.ready):
            m.d.sync += self.orders.valid.eq(0)

        go = Signal()
        with m.If(half):
            m.d.comb += [go.eq(self.i.valid & cmd_free), self.i.ready.eq(go)]
            with m.If(go):
                m.d.sync += [self.commands.valid.eq(1), self.commands.p.eq(c[1]), half.eq(0)]
        with m.Else():
            m.d.comb += go.eq(self.i.valid & cmd_free & ord_free)
            with m.If(go):
                m.d.sync += [
                    self.commands.valid.eq(seg[0] | seg[1]), self.commands.p.eq(Mux(seg[0], c[0], c[1])),
                    self.orders.valid.eq(does[0] | does[1]), *pack_pair(self.orders.p, does, orders),
                ]
                with m.If(seg[0] & seg[1]):
                    m.d.sync += half.eq(1)
                with m.Else():
                    m.d.comb += self.i.ready.eq(1)
        return m
