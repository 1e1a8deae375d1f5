"""Receive dispatch: each received frame's descriptor to the block that handles its kind."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, fifo, stream
from amaranth.lib.wiring import In, Out

from spec.formats import Aeth, Op
from .responder import ReceivedAck
from .rx_packet import Pair, RxDrop, RxPacket, RxPacketPair
from .rx_resegmenter import RxKeepPair

__all__ = ["RxDispatch", "PairSplitter"]

PSN_BITS = 24
PSN_HALF = 1 << (PSN_BITS - 1)


class PairSplitter(wiring.Component):
    """A queue of one-or-two-entry transfers, read out one entry per cycle.

    Parameters
    ----------
    shape : the entry's shape.
    depth : int
        Transfers held (each one or two entries).

    Members
    -------
    i : In(stream.Signature({second, p[2]}))
        ``p[0]``, then ``p[1]`` when ``second`` = 1.
    o : Out(stream.Signature(shape))
        The entries in order.
    """
    def __init__(self, shape, depth):
        if not isinstance(depth, int) or depth < 2:
            raise ValueError(f"depth must be an integer >= 2, not {depth!r}")
        self._shape, self._depth = shape, depth
        super().__init__({"i": In(stream.Signature(Pair(shape))), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        layout = Pair(self._shape)
        m.submodules.fifo = q = fifo.SyncFIFOBuffered(width=layout.size, depth=self._depth)
        head = Signal(layout)
        half = Signal()                 # p[0] of the head has left; p[1] is next
        m.d.comb += [
            q.w_data.eq(self.i.p), q.w_en.eq(self.i.valid), self.i.ready.eq(q.w_rdy),
            head.eq(q.r_data),
            self.o.valid.eq(q.r_rdy), self.o.p.eq(Mux(half, head.p[1], head.p[0])),
        ]
        with m.If(self.o.valid & self.o.ready):
            with m.If(head.second & ~half):
                m.d.sync += half.eq(1)
            with m.Else():
                m.d.comb += q.r_en.eq(1)
                m.d.sync += half.eq(0)
        return m


class RxDispatch(wiring.Component):
    """Sends each received frame's descriptor where its kind is handled, two per cycle.

    The header parser describes up to two frames per beat (32-byte frame starts keep
    every frame size at line rate); no single block after it has to take two per cycle:

    - a frame dropped at frame level (``drop`` not NONE) is counted here and goes no
      further;
    - an ACK/NAK goes to ``acks`` for the requester side. Two ACKs (not NAKs) of one QP
      from one beat become one, the newer (an ACK says all that an older one of the QP
      says; ``acks_merged`` counts the folded one), so an ACK flood of one QP needs one
      entry per beat;
    - a WRITE request goes to ``requests`` for the responder; only such frames have
      payload, so the frames the payload writer sees are exactly these: ``keep`` says
      so per frame, for the resegmenter, in the parser's pairs.

    The ACKs and requests wait in pair queues read one per cycle; a frame of those kinds
    costs at least 62 (ACK) or 58 bytes (WRITE) on the wire, so their rates stay within
    one per cycle except for the shortest WRITE and ACK floods, which the queues absorb
    up to their depth. A pair is taken when every queue has room.

    Parameters
    ----------
    depth : int
        Pairs each of the request and ACK queues holds.
    keep_depth : int
        Pairs of keep bits buffered (frames the resegmenter has not reached yet).

    Members
    -------
    packets : In(stream.Signature(RxPacketPair()))
        The parser's descriptors.
    requests : Out(stream.Signature(RxPacket()))
        WRITE requests (drop NONE, not an ACK), in frame order.
    acks : Out(stream.Signature(ReceivedAck))
        Received ACK/NAKs, in frame order.
    keep : Out(stream.Signature(RxKeepPair))
        Per parser pair: which of its frames are requests.
    dropped : Out(ArrayLayout(2, 6))
        Entry ``v - 1`` per ``RxDrop`` value v (1..6): frames dropped for that reason this
        cycle (0..2).
    acks_received : Out(2)
        ACK/NAK frames taken this cycle.
    acks_merged : Out(1)
        Strobe: two ACKs of a beat became one.
    """
    def __init__(self, *, depth=8, keep_depth=32):
        for name, v in (("depth", depth), ("keep_depth", keep_depth)):
            if not isinstance(v, int) or v < 2:
                raise ValueError(f"{name} must be an integer >= 2, not {v!r}")
        self._depth, self._keep_depth = depth, keep_depth
        super().__init__({
            "packets": In(stream.Signature(RxPacketPair())),
            "requests": Out(stream.Signature(RxPacket())),
            "acks": Out(stream.Signature(ReceivedAck)),
            "keep": Out(stream.Signature(RxKeepPair)),
            "dropped": Out(data.ArrayLayout(unsigned(2), len(RxDrop) - 1)),
            "acks_received": Out(2),
            "acks_merged": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.req_q = req_q = PairSplitter(RxPacket(), self._depth)
        m.submodules.ack_q = ack_q = PairSplitter(ReceivedAck, self._depth)
        m.submodules.keep_q = keep_q = fifo.SyncFIFOBuffered(width=RxKeepPair.size, depth=self._keep_depth)
        wiring.connect(m, wiring.flipped(self.requests), req_q.o)
        wiring.connect(m, wiring.flipped(self.acks), ack_q.o)

        pair = self.packets.p
        valid = [C(1, 1), pair.second]
        d = [pair.p[0], pair.p[1]]
        is_req = [Signal(name=f"is_req{i}") for i in range(2)]
        is_ack = [Signal(name=f"is_ack{i}") for i in range(2)]
        acks = [Signal(ReceivedAck, name=f"ack{i}") for i in range(2)]
        for i in range(2):
            ok = valid[i] & (d[i].drop == RxDrop.NONE)
            m.d.comb += [
                is_ack[i].eq(ok & (d[i].opcode == Op.ACK)), is_req[i].eq(ok & (d[i].opcode != Op.ACK)),
                acks[i].qpn.eq(d[i].dqpn), acks[i].psn.eq(d[i].psn),
                acks[i].syndrome.eq(d[i].aeth.syndrome), acks[i].msn.eq(d[i].aeth.msn),
            ]

        take = Signal()
        m.d.comb += [
            self.packets.ready.eq(req_q.i.ready & ack_q.i.ready & keep_q.w_rdy),
            take.eq(self.packets.valid & self.packets.ready),
        ]

        # Requests: the one or two of the pair, packed to the front.
        m.d.comb += [
            req_q.i.valid.eq(take & (is_req[0] | is_req[1])),
            req_q.i.p.second.eq(is_req[0] & is_req[1]),
            req_q.i.p.p[0].eq(Mux(is_req[0], d[0], d[1])),
            req_q.i.p.p[1].eq(d[1]),
        ]

        # ACKs: likewise, two plain ACKs of one QP folded into the newer.
        fold = Signal()
        newer = Signal()
        m.d.comb += [
            fold.eq(is_ack[0] & is_ack[1] & (acks[0].qpn == acks[1].qpn)
                    & (acks[0].syndrome[5:7] == Aeth.KIND_ACK) & (acks[1].syndrome[5:7] == Aeth.KIND_ACK)),
            newer.eq((acks[1].psn - acks[0].psn)[:PSN_BITS] < PSN_HALF),
            ack_q.i.valid.eq(take & (is_ack[0] | is_ack[1])),
            ack_q.i.p.second.eq(is_ack[0] & is_ack[1] & ~fold),
            ack_q.i.p.p[1].eq(acks[1]),
            self.acks_merged.eq(take & fold),
        ]
        with m.If(fold):
            m.d.comb += ack_q.i.p.p[0].eq(Mux(newer, acks[1], acks[0]))
        with m.Else():
            m.d.comb += ack_q.i.p.p[0].eq(Mux(is_ack[0], acks[0], acks[1]))

        keep = Signal(RxKeepPair)
        m.d.comb += [
            keep.second.eq(pair.second), keep.keep.eq(Cat(is_req[0], is_req[1])),
            keep_q.w_data.eq(keep), keep_q.w_en.eq(take),
            self.keep.valid.eq(keep_q.r_rdy), self.keep.p.eq(keep_q.r_data), keep_q.r_en.eq(self.keep.ready),
        ]

        # Counters.
        with m.If(take):
            m.d.comb += self.acks_received.eq(is_ack[0] + is_ack[1])
            for v in RxDrop:
                if v != RxDrop.NONE:
                    m.d.comb += self.dropped[v.value - 1].eq(
                        (valid[0] & (d[0].drop == v)) + (valid[1] & (d[1].drop == v)))
        return m
