"""Receive dispatch: each received frame's descriptor to the block that handles its kind."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, fifo, stream
from amaranth.lib.wiring import In, Out

from spec.formats import Op
from rtl.common.records import Response, RxKeepPair
from rtl.common.rx_packet import RxDrop, RxPacket, RxPacketPair
from rtl.common.stream import Pair, pack_pair

__all__ = ["RxDispatch"]



class RxDispatch(wiring.Component):
    """Sends each received frame's descriptor where its kind is handled, two per cycle.

    The header parser describes up to two frames per beat (32-byte frame starts keep
    every frame size at line rate); the blocks after it take them two at a time:

    - a frame dropped at frame level (``drop`` not NONE) is counted here and goes no
      further;
    - an ACK/NAK or ATOMIC ACKNOWLEDGE (the opcodes with an AETH) goes to ``acks`` for the requester side, the one or two of a pair
      together (the ACK mailbox takes two per cycle);
    - a READ RESPONSE goes to both: to ``acks`` for the requester's checks, and to
      ``requests``, where the responder gives it a payload command whose verdict the
      checker supplies (``ReadResponseJoin``);
    - a WRITE request goes to ``requests`` for the responder, the one or two of a pair
      together (the responder decides two per cycle: WRITEs of 0 and 1 payload bytes
      arrive 1.02 and 1.01 per cycle at line rate);
    - only a request with payload has bytes for the payload writer, so the frames the
      payload writer sees are exactly those: ``keep`` says so per frame, for the
      resegmenter, in the parser's pairs (a WRITE without payload needs no beat there).

    Each kind waits in a queue of pairs; a pair is taken when every queue has room.

    Parameters
    ----------
    depth : int
        Pairs each of the request and ACK queues holds.
    keep_depth : int
        Pairs of keep bits buffered (frames the resegmenter has not reached yet): at least
        the beats the beat buffer holds (one pair per beat in which frames end), or a
        backlog there holds the parser back with the buffer not full.

    Members
    -------
    packets : In(stream.Signature(RxPacketPair()))
        The parser's descriptors.
    requests : Out(stream.Signature(Pair(RxPacket())))
        WRITE requests (drop NONE, not an ACK), the one or two of a beat, in frame order.
    acks : Out(stream.Signature(Pair(Response)))
        Received ACK/NAKs, the one or two of a beat, in frame order, with their source
        addresses (the requester's ``ResponseChecker`` decides whether they belong).
    keep : Out(stream.Signature(RxKeepPair))
        Per parser pair: which of its frames are requests with payload.
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
            "requests": Out(stream.Signature(Pair(RxPacket()))),
            "acks": Out(stream.Signature(Pair(Response))),
            "keep": Out(stream.Signature(RxKeepPair)),
            "dropped": Out(data.ArrayLayout(unsigned(2), len(RxDrop) - 1)),
            "acks_received": Out(2),
        })

    def elaborate(self, platform):
        m = Module()
        req_layout, ack_layout = Pair(RxPacket()), Pair(Response)
        m.submodules.req_q = req_q = fifo.SyncFIFOBuffered(width=req_layout.size, depth=self._depth)
        m.submodules.ack_q = ack_q = fifo.SyncFIFOBuffered(width=ack_layout.size, depth=self._depth)
        m.submodules.keep_q = keep_q = fifo.SyncFIFOBuffered(width=RxKeepPair.size, depth=self._keep_depth)
        m.d.comb += [self.requests.valid.eq(req_q.r_rdy), self.requests.p.eq(req_q.r_data),
                     req_q.r_en.eq(self.requests.ready),
                     self.acks.valid.eq(ack_q.r_rdy), self.acks.p.eq(ack_q.r_data),
                     ack_q.r_en.eq(self.acks.ready)]

        pair = self.packets.p
        valid = [C(1, 1), pair.second]
        d = [pair.p[0], pair.p[1]]
        is_req = [Signal(name=f"is_req{i}") for i in range(2)]
        is_ack = [Signal(name=f"is_ack{i}") for i in range(2)]
        acks = [Signal(Response, name=f"ack{i}") for i in range(2)]
        for i in range(2):
            ok = valid[i] & (d[i].drop == RxDrop.NONE)
            rresp = (d[i].opcode >= Op.READ_RESP_FIRST) & (d[i].opcode <= Op.READ_RESP_ONLY)
            m.d.comb += [
                # a READ RESPONSE goes both ways: to the checker, and (for its payload) to the responder
                is_ack[i].eq(ok & ((d[i].opcode == Op.ACK) | (d[i].opcode == Op.ATOMIC_ACK) | rresp)),
                is_req[i].eq(ok & (d[i].opcode != Op.ACK) & (d[i].opcode != Op.ATOMIC_ACK)),
                acks[i].read.eq(rresp), acks[i].rop.eq(d[i].opcode - Op.READ_RESP_FIRST),
                acks[i].length.eq(d[i].payload_len),
                acks[i].atomic.eq(d[i].opcode == Op.ATOMIC_ACK), acks[i].orig.eq(d[i].orig),
                acks[i].qpn.eq(d[i].dqpn), acks[i].psn.eq(d[i].psn),
                acks[i].syndrome.eq(d[i].aeth.syndrome), acks[i].msn.eq(d[i].aeth.msn),
                acks[i].smac.eq(d[i].smac), acks[i].sip.eq(d[i].sip),
            ]

        take = Signal()
        m.d.comb += [
            self.packets.ready.eq(req_q.w_rdy & ack_q.w_rdy & keep_q.w_rdy),
            take.eq(self.packets.valid & self.packets.ready),
        ]

        # Requests and ACKs: the one or two of the pair of each kind, packed to the front.
        req_pair, ack_pair = Signal(req_layout), Signal(ack_layout)
        m.d.comb += [
            *pack_pair(req_pair, is_req, d), req_q.w_data.eq(req_pair), req_q.w_en.eq(take & (is_req[0] | is_req[1])),
            *pack_pair(ack_pair, is_ack, acks), ack_q.w_data.eq(ack_pair), ack_q.w_en.eq(take & (is_ack[0] | is_ack[1])),
        ]

        keep = Signal(RxKeepPair)
        m.d.comb += [
            keep.second.eq(pair.second), keep.keep.eq(Cat(*[is_req[i] & (d[i].payload_len != 0) & ~d[i].inline for i in range(2)])),
            keep_q.w_data.eq(keep), keep_q.w_en.eq(take),
            self.keep.valid.eq(keep_q.r_rdy), self.keep.p.eq(keep_q.r_data), keep_q.r_en.eq(self.keep.ready),
        ]

        # Counters.
        with m.If(take):
            m.d.comb += self.acks_received.eq(is_ack[0] + is_ack[1])      # (READ RESPONSEs too)
            for v in RxDrop:
                if v != RxDrop.NONE:
                    m.d.comb += self.dropped[v.value - 1].eq(
                        (valid[0] & (d[0].drop == v)) + (valid[1] & (d[1].drop == v)))
        return m
