"""Receive dispatch: each received frame's descriptor to the block that handles its kind."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, fifo, stream
from amaranth.lib.wiring import In, Out

from spec.formats import Op
from .responder import ReceivedAck
from .rx_packet import Pair, RxDrop, RxPacket, RxPacketPair
from .rx_resegmenter import RxKeepPair

__all__ = ["RxDispatch", "PairSplitter"]



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
    - an ACK/NAK goes to ``acks`` for the requester side, the one or two of a pair
      together (the ACK mailbox takes two per cycle);
    - a WRITE request goes to ``requests`` for the responder; only such frames have
      payload, so the frames the payload writer sees are exactly these: ``keep`` says
      so per frame, for the resegmenter, in the parser's pairs.

    The requests wait in a pair queue read one per cycle; a WRITE frame costs at least
    98 bytes of wire time, so their rate stays within one per cycle except for the
    floods of WRITEs with 0 or 1 payload bytes (1.02 and 1.01 per cycle), which the queue
    absorbs up to its depth. The ACKs wait in pairs. A pair is taken when every queue
    has room.

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
    acks : Out(stream.Signature(Pair(ReceivedAck)))
        Received ACK/NAKs, the one or two of a beat, in frame order.
    keep : Out(stream.Signature(RxKeepPair))
        Per parser pair: which of its frames are requests.
    dropped : Out(ArrayLayout(2, 6))
        Entry ``v - 1`` per ``RxDrop`` value v (1..6): frames dropped for that reason this
        cycle (0..2).
    acks_received : Out(2)
        ACK/NAK frames taken this cycle.
    """
    def __init__(self, *, depth=8, keep_depth=32):
        for name, v in (("depth", depth), ("keep_depth", keep_depth)):
            if not isinstance(v, int) or v < 2:
                raise ValueError(f"{name} must be an integer >= 2, not {v!r}")
        self._depth, self._keep_depth = depth, keep_depth
        super().__init__({
            "packets": In(stream.Signature(RxPacketPair())),
            "requests": Out(stream.Signature(RxPacket())),
            "acks": Out(stream.Signature(Pair(ReceivedAck))),
            "keep": Out(stream.Signature(RxKeepPair)),
            "dropped": Out(data.ArrayLayout(unsigned(2), len(RxDrop) - 1)),
            "acks_received": Out(2),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.req_q = req_q = PairSplitter(RxPacket(), self._depth)
        ack_layout = Pair(ReceivedAck)
        m.submodules.ack_q = ack_q = fifo.SyncFIFOBuffered(width=ack_layout.size, depth=self._depth)
        m.submodules.keep_q = keep_q = fifo.SyncFIFOBuffered(width=RxKeepPair.size, depth=self._keep_depth)
        wiring.connect(m, wiring.flipped(self.requests), req_q.o)
        m.d.comb += [self.acks.valid.eq(ack_q.r_rdy), self.acks.p.eq(ack_q.r_data),
                     ack_q.r_en.eq(self.acks.ready)]

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
            self.packets.ready.eq(req_q.i.ready & ack_q.w_rdy & keep_q.w_rdy),
            take.eq(self.packets.valid & self.packets.ready),
        ]

        # Requests: the one or two of the pair, packed to the front.
        m.d.comb += [
            req_q.i.valid.eq(take & (is_req[0] | is_req[1])),
            req_q.i.p.second.eq(is_req[0] & is_req[1]),
            req_q.i.p.p[0].eq(Mux(is_req[0], d[0], d[1])),
            req_q.i.p.p[1].eq(d[1]),
        ]

        # ACKs: likewise.
        ack_pair = Signal(ack_layout)
        m.d.comb += [
            ack_pair.second.eq(is_ack[0] & is_ack[1]),
            ack_pair.p[0].eq(Mux(is_ack[0], acks[0], acks[1])),
            ack_pair.p[1].eq(acks[1]),
            ack_q.w_data.eq(ack_pair), ack_q.w_en.eq(take & (is_ack[0] | is_ack[1])),
        ]

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
