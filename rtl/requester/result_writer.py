"""Result writer: an atomic's original value to local GPU memory before its ACK moves on."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, fifo
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.lib import stream

from spec import params as P
from rtl.common.axi import AxiWriteSignature, Burst, Cache
from rtl.common.contexts import qp_bits
from rtl.common.records import AckRecord
from rtl.common.stream import Pair
from rtl.requester.response_checker import CheckedResponse
from rtl.requester.wqe_parser import RemoteOpNote, RemoteOpPop

__all__ = ["ResultWriter"]


class ResultWriter(wiring.Component):
    """Between the response checker and the ACK mailbox: a response that completes an
    atomic (``data``) writes the original value to the atomic's local address first; the
    response (an ACK of its PSN) moves on once that write's AW and W have been accepted.
    The CQE that ACK releases is written later on the same port (``m_axi``), so GPU memory
    sees the value before the CQE (writes of one port land in AW order).

    The value lands as NVSHMEM reads it back: a 4-byte one big-endian, an 8-byte one in
    host order (little-endian), as ``model.requester``. The local address and size of each
    registered atomic are kept per QP slot (the parser's ``remote`` notes); once a slot
    has been read its QP's ring head moves on (``pops``), so the parser may reuse it.

    A response that completes a READ (``read``) waits instead for ``read_landed``: one
    strobe per completed READ, in order, once every payload write of its responses (and
    all before them) has landed (the responder's write issuer, on either DMA port), so
    the CQE that ACK releases never overtakes the READ's bytes. A READ takes one cycle
    (a pair of them two), so 8-byte READs complete at the rate their responses arrive.

    Responses without data pass in order behind those with data (a queue of pairs, in
    front of which they pass straight through when it is empty). The checker may not
    wait, so ``hold`` asks it to take no pair while the queue has room for fewer than the
    two pairs in its pipeline and one more.

    Parameters
    ----------
    num_qps : int
    depth : int
        Pairs the queue holds (>= 4).

    Members
    -------
    i : In(stream.Signature(Pair(CheckedResponse)))
        From the checker (always taken: see ``hold``).
    o : Out(stream.Signature(Pair(AckRecord)))
        To the ACK mailbox (``o.ready`` must be 1).
    hold : Out(1)
    remote : In(RemoteOpNote)
    pops : Out(RemoteOpPop)
    dma : Out(AxiWriteSignature)
        Writes of the values (AWID ``AXI_ID_RESULT_WRITE``, one beat each).
    read_landed : In(1)
        A completed READ's payload has landed (a strobe per READ, in order).
    """
    def __init__(self, *, num_qps, depth=16):
        if not isinstance(num_qps, int) or num_qps < 2 or num_qps & (num_qps - 1):
            raise ValueError(f"num_qps must be a power of two >= 2, not {num_qps!r}")
        if not isinstance(depth, int) or depth < 4:
            raise ValueError(f"depth must be an integer >= 4, not {depth!r}")
        self.num_qps, self.depth = num_qps, depth
        super().__init__({
            "i": In(stream.Signature(Pair(CheckedResponse(num_qps)))),
            "o": Out(stream.Signature(Pair(AckRecord))),
            "hold": Out(1),
            "remote": In(RemoteOpNote(num_qps)),
            "pops": Out(RemoteOpPop(num_qps)),
            "dma": Out(AxiWriteSignature(addr_width=P.DMA_ADDR_WIDTH, data_width=8 * P.DATA_BYTES,
                                         id_width=P.AXI_ID_WIDTH)),
            "read_landed": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        qb = qp_bits(self.num_qps)
        nr = P.MAX_RD_ATOMIC
        sb = (nr - 1).bit_length()
        pair_layout = Pair(CheckedResponse(self.num_qps))
        m.submodules.q = q = fifo.SyncFIFOBuffered(width=pair_layout.size, depth=self.depth)
        m.d.comb += [self.hold.eq(q.level >= self.depth - 3), self.i.ready.eq(1)]

        # Where each registered atomic's value goes.
        slot_layout = data.StructLayout({"addr": unsigned(64), "size8": unsigned(1)})
        m.submodules.slots = slot_ram = Memory(shape=slot_layout, depth=self.num_qps * nr, init=[])
        sw = slot_ram.write_port()
        sr = slot_ram.read_port()
        m.d.comb += sr.en.eq(0)          # read when a write starts, held while it waits
        m.d.comb += [sw.en.eq(self.remote.valid), sw.addr.eq(Cat(self.remote.slot[:sb], self.remote.qpn)),
                     sw.data.addr.eq(self.remote.addr), sw.data.size8.eq(self.remote.size8)]

        head = Signal(pair_layout)
        m.d.comb += head.eq(q.r_data)
        has_data = [head.p[0].data, head.second & head.p[1].data]
        in_data = self.i.p.p[0].data | (self.i.p.second & self.i.p.p[1].data)
        done = Signal(2)             # data lanes of the head pair written
        lane = Signal()              # the lane being written

        def forward(pair):
            m.d.comb += [self.o.valid.eq(1), self.o.p.second.eq(pair.second)]
            for k in range(2):
                m.d.comb += self.o.p.p[k].eq(pair.p[k].ack)

        idle = Signal()
        # (level, not r_rdy: a pair just written is not at the output yet)
        with m.If(self.i.valid & idle & (q.level == 0) & ~in_data):
            forward(self.i.p)                    # nothing waits: straight through
        with m.Else():
            m.d.comb += [q.w_en.eq(self.i.valid), q.w_data.eq(self.i.p)]

        dma = self.dma
        cur = Signal(CheckedResponse(self.num_qps))
        m.d.comb += cur.eq(Mux(lane, head.p[1], head.p[0]))
        addr = sr.data.addr
        lanes = addr[:(P.DATA_BYTES - 1).bit_length()]
        value = Signal(64)           # the bytes in memory order
        with m.If(sr.data.size8):
            m.d.comb += value.eq(cur.orig)                                   # little-endian
        with m.Else():                                                       # big-endian, in both halves
            m.d.comb += value.eq(Cat(*(cur.orig.word_select(3 - j, 8) for j in range(4))).replicate(2))
        aw_done, w_done = Signal(), Signal()
        landed = Signal(8)           # READs landed, not yet taken (at most the issuer's fences)
        take_landed = Signal()
        m.d.sync += landed.eq(landed + self.read_landed - take_landed)
        m.d.comb += [
            dma.awid.eq(P.AXI_ID_RESULT_WRITE), dma.awaddr.eq(addr), dma.awlen.eq(0),
            dma.awsize.eq(Mux(sr.data.size8, 3, 2)), dma.awburst.eq(Burst.INCR),
            dma.awcache.eq(Cache.NORMAL_NON_CACHEABLE_BUFFERABLE),
            dma.wdata.eq(value.replicate(8 * P.DATA_BYTES // 64)),
            dma.wstrb.eq(Mux(sr.data.size8, 0xFF, 0x0F) << lanes), dma.wlast.eq(1), dma.bready.eq(1),
        ]
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += idle.eq(done == 0)
                todo = [has_data[k] & ~done[k] for k in range(2)]
                k = ~todo[0]                       # the lane to complete next
                nxt = Signal(CheckedResponse(self.num_qps))
                m.d.comb += nxt.eq(Mux(k, head.p[1], head.p[0]))
                with m.If(q.r_rdy):
                    with m.If(~todo[0] & ~todo[1]):
                        forward(head)
                        m.d.comb += q.r_en.eq(1)
                        m.d.sync += done.eq(0)
                    with m.Elif(nxt.read):
                        # a READ's last response, in this cycle (8-byte READs come one a
                        # cycle): once its bytes landed its slot is free, and with no other
                        # lane to complete the pair moves on at once
                        with m.If(landed != 0):
                            m.d.comb += [take_landed.eq(1), self.pops.valid.eq(1),
                                         self.pops.qpn.eq(nxt.ack.qpn[:qb]), self.pops.head.eq(nxt.slot + 1)]
                            with m.If(~k & todo[1]):
                                m.d.sync += done.eq(1)
                            with m.Else():
                                forward(head)
                                m.d.comb += q.r_en.eq(1)
                                m.d.sync += done.eq(0)
                    with m.Else():
                        m.d.comb += [sr.en.eq(1), sr.addr.eq(Cat(nxt.slot[:sb], nxt.ack.qpn[:qb]))]
                        m.d.sync += [lane.eq(k), aw_done.eq(0), w_done.eq(0)]
                        m.next = "WRITE"
            with m.State("WRITE"):
                # the slot is read: the parser may reuse it
                m.d.comb += [self.pops.valid.eq(~aw_done & ~w_done), self.pops.qpn.eq(cur.ack.qpn[:qb]),
                             self.pops.head.eq(cur.slot + 1),
                             dma.awvalid.eq(~aw_done), dma.wvalid.eq(~w_done)]
                aw_now = aw_done | dma.awready
                w_now = w_done | dma.wready
                m.d.sync += [aw_done.eq(aw_now), w_done.eq(w_now)]
                with m.If(aw_now & w_now):
                    m.d.sync += done.eq(done | Mux(lane, 2, 1))
                    m.next = "IDLE"
        return m
