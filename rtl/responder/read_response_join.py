"""READ response join: a received READ RESPONSE's payload command gets the requester's verdict."""
from amaranth.hdl import *
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from rtl.common.records import ReadVerdict
from rtl.common.stream import Pair
from rtl.responder.payload_writer import RxWriteCommand

__all__ = ["ReadResponseJoin"]


class ReadResponseJoin(wiring.Component):
    """Between the responder's payload commands and the write sorter: a READ RESPONSE
    received by this NIC's requester side reaches the responder as a request (its payload
    arrives with the other frames' in the segment stream) and gets a placeholder command
    (``read_response``); what to do with it is the requester's ``ResponseChecker``'s
    verdict, which comes on ``verdicts`` in the same order (one pair per pair of commands
    with READ RESPONSEs: both come from the same received frames).

    A command with ``read_response`` takes the next verdict: written at its ``addr``, or
    discarded. A verdict with ``notify`` (the READ's last response) adds a fence command
    behind it (``fence_local``): the write issuer strobes when every write before it has
    landed, which the requester's result writer waits for before the READ completes. So a
    pair of commands leaves as one pair, or as two when fences are added (the sorter takes
    one pair a cycle). Other commands pass unchanged.

    Members
    -------
    i : In(stream.Signature(Pair(RxWriteCommand)))
    verdicts : In(stream.Signature(Pair(ReadVerdict)))
    o : Out(stream.Signature(Pair(RxWriteCommand)))
        Registered.
    """
    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(Pair(RxWriteCommand))),
            "verdicts": In(stream.Signature(Pair(ReadVerdict))),
            "o": Out(stream.Signature(Pair(RxWriteCommand))),
        })

    def elaborate(self, platform):
        m = Module()
        pair = self.i.p
        present = [C(1, 1), pair.second]
        rr = [present[k] & pair.p[k].read_response for k in range(2)]
        v1 = Signal(ReadVerdict)     # lane 1's: the pair's second verdict when lane 0 took the first
        m.d.comb += v1.eq(Mux(rr[0], self.verdicts.p.p[1], self.verdicts.p.p[0]))
        v = [self.verdicts.p.p[0], v1]
        cmd, fence, notify = [], [], []
        for k in range(2):
            c = Signal(RxWriteCommand, name=f"cmd{k}")
            m.d.comb += c.eq(pair.p[k])
            with m.If(rr[k]):
                m.d.comb += [c.write.eq(v[k].write), c.addr.eq(v[k].addr)]
            f = Signal(RxWriteCommand, name=f"fence{k}")
            m.d.comb += [f.inline.eq(1), f.fence.eq(1), f.fence_local.eq(1), f.qp.eq(pair.p[k].qp)]
            cmd.append(c)
            fence.append(f)
            notify.append(rr[k] & v[k].notify)
        # The sequence c0 [f0] [c1] [f1], two a cycle.
        items = [cmd[0], Mux(notify[0], fence[0], cmd[1]), Mux(notify[0], cmd[1], fence[1]), fence[1]]
        there = [C(1, 1), notify[0] | pair.second, Mux(notify[0], pair.second, notify[1]),
                 notify[0] & notify[1]]
        phase = Signal()             # 1: the pair's second half is next
        need = Signal()
        m.d.comb += need.eq(rr[0] | rr[1])
        o = self.o
        free = Signal()
        m.d.comb += free.eq(~o.valid | o.ready)
        with m.If(o.valid & o.ready):
            m.d.sync += o.valid.eq(0)
        go = Signal()
        m.d.comb += go.eq(self.i.valid & free & (~need | self.verdicts.valid))
        two = Signal()               # the pair needs a second cycle
        m.d.comb += two.eq(there[2])
        with m.If(go):
            with m.If(phase):
                m.d.sync += [o.valid.eq(1), o.p.p[0].eq(items[2]), o.p.p[1].eq(items[3]), o.p.second.eq(there[3]),
                             phase.eq(0)]
                m.d.comb += [self.i.ready.eq(1), self.verdicts.ready.eq(need)]
            with m.Else():
                m.d.sync += [o.valid.eq(1), o.p.p[0].eq(items[0]), o.p.p[1].eq(items[1]), o.p.second.eq(there[1])]
                with m.If(two):
                    m.d.sync += phase.eq(1)
                with m.Else():
                    m.d.comb += [self.i.ready.eq(1), self.verdicts.ready.eq(need)]
        return m
