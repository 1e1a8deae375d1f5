"""Receive gate: the receive WQE of each request that consumes one, looked up in the
``RecvQueue`` before the ``Responder`` decides."""
from amaranth.hdl import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from spec import formats as F
from rtl.common.contexts import qp_bits
from rtl.common.rx_packet import RxPacket
from rtl.common.stream import Pair, StreamFifo
from rtl.responder.recv_queue import RecvAnswer, RecvConsume, RecvCreate, RecvQuery, RecvWqe

__all__ = ["RecvGate", "GateWqe", "GatedPair", "gate_wqe", "RWR_OPS", "SEND_OPS", "FLUSH_HELD", "FLUSH_NEXT", "is_rwr"]

# The packets that consume a receive WQE (rxe's RXE_RWR_MASK, model.responder.RWR_OPCODES)
RWR_OPS = (F.Op.SEND_FIRST, F.Op.SEND_ONLY, F.Op.SEND_ONLY_IMM, F.Op.WRITE_ONLY_IMM, F.Op.WRITE_LAST_IMM)
SEND_OPS = (F.Op.SEND_FIRST, F.Op.SEND_MIDDLE, F.Op.SEND_LAST, F.Op.SEND_LAST_IMM, F.Op.SEND_ONLY,
            F.Op.SEND_ONLY_IMM)
# The RecvFlush's requests (never from the wire: transport bits 111 are no RC opcode, and
# RxDispatch passes RC requests only): complete the WQE a QP holds in the responder
# (FLUSH_HELD), or its next one, which the gate asks the RecvQueue for as for a packet
# that consumes one (FLUSH_NEXT).
FLUSH_HELD = 0xE0 | F.Op.SEND_MIDDLE
FLUSH_NEXT = 0xE0 | F.Op.SEND_ONLY


def is_rwr(opcode):
    """The packet of BTH opcode ``opcode`` (a Value) consumes a receive WQE (or is a
    flush request for the QP's next one)."""
    out = C(0, 1)
    for op in RWR_OPS + (FLUSH_NEXT,):
        out = out | (opcode == op)
    return out


def GateWqe(max_sge):
    """A receive WQE as the responder keeps it: its counter (``index``), each data
    segment's address and the running sum of the segment lengths up to and including it
    (``end``; the segments past the WQE's last end where it does), and its capacity
    (``end`` of the last). ``valid``: the WQE is there (else only ``index`` and ``gen``,
    the number the ``RecvQueue`` gave the packet, count). ``norq``: the QP has no receive
    queue (an RNR NAK needs no lookup). ``empty``: WQE ``index`` was not posted when the
    record was handed on, and the numbering did not move (``RecvWqe.empty``). ``cached``:
    the gate gave the packet the QP's last empty record without a query: it holds no number
    of its own, so its decision sends no correction."""
    return data.StructLayout({
        "valid": unsigned(1), "index": unsigned(16), "gen": unsigned(1), "norq": unsigned(1),
        "empty": unsigned(1), "cached": unsigned(1),
        "addr": data.ArrayLayout(unsigned(64), max_sge), "end": data.ArrayLayout(unsigned(32), max_sge),
    })


def gate_wqe(m, w, max_sge, name="gw"):
    """A ``GateWqe`` Signal from a ``RecvWqe`` view ``w``: the segment ends summed."""
    gw = Signal(GateWqe(max_sge), name=name)
    run = C(0, 32)
    m.d.comb += [gw.valid.eq(w.valid), gw.index.eq(w.index), gw.gen.eq(w.gen), gw.norq.eq(w.norq),
                 gw.empty.eq(w.empty)]
    for j in range(max_sge):
        here = Signal(32, name=f"{name}_end{j}")
        m.d.comb += here.eq(run + Mux(j < w.nsge, w.sge[j].length, 0))
        m.d.comb += [gw.addr[j].eq(w.sge[j].addr), gw.end[j].eq(here)]
        run = here
    return gw


def GatedPair(max_sge):
    """A request pair with the receive WQE each lane took from the ``RecvQueue``."""
    return data.StructLayout({"pair": Pair(RxPacket()), "wqe": data.ArrayLayout(GateWqe(max_sge), 2)})


class RecvGate(wiring.Component):
    """Gives each request that consumes a receive WQE (``RWR_OPS``) the QP's next receive
    WQE, or says that none is posted, before the responder decides on it.

    The responder checks the PSN and the opcode sequence before the receive WQE (RNR), as
    ``model.responder`` does, so it does not know yet whether the packet takes the WQE.
    The gate takes one anyway, speculatively: a query to the ``RecvQueue`` per such packet,
    in packet order, each consumed (``ok`` = 1) at once, whatever the answer, and the
    record the queue hands on (the WQE number, its generation, and the WQE itself when it
    is posted and on chip) attached to the packet. The responder uses it only if it is the
    QP's next committed WQE; otherwise it looks that one up and tells the queue to correct
    its numbering (``RecvQueue``, "speculative hand-on, committed use").

    A QP without a receive queue never has a WQE: the gate keeps a bit per QP (a RAM
    written with each ``create`` the ``RecvQueue`` takes, read as a pair enters) and
    gives such a QP's packets a record that says so (``norq``) without a query, so that
    they cost the gate nothing and a flood of them (each RNR NAKed) runs at the line rate.
    (After a reset the RAM keeps its bits: a QP not created since is asked of the
    ``RecvQueue``, whose own rows say it has none.)

    A QP whose receive queue has nothing posted: the gate keeps the last empty record the
    queue handed on (its QP, number and generation) for ``cache_age`` cycles, and gives the
    QP's packets that enter meanwhile that record (``cached``) without a query, so that a
    flood of SENDs to it (each RNR NAKed) runs at the line rate, two a cycle, not one query
    a cycle. The record says WQE ``index`` was not posted a few cycles before: the
    responder RNR NAKs the packet when its committed count is ``index`` and looks the WQE
    up otherwise (a WQE posted meanwhile and used by a packet before it); it sends no
    correction for it. A record of the QP that is not empty, or its create, ends it.

    Pipeline: a pair is registered as it enters (its QPs' bits read); then it is taken when
    its queries (one a cycle: a pair of two such packets takes two cycles) are issued and
    the pair queue has room; answers go to a queue of
    bits and their consumes to the ``RecvQueue``; WQEs come back in consume order into a
    queue. The output stage takes the head pair's lanes one a cycle when they need a WQE
    (a lane that needs none costs nothing), so up to one such packet a cycle leaves. The
    queues cover the prefetched case (a few cycles from query to WQE); a WQE read from
    memory holds the gate for its round trip.

    Parameters
    ----------
    num_qps : int
        QPs (as the ``RecvQueue``).
    max_sge : int
        Data segments of a receive WQE (as the ``RecvQueue``).
    depth : int
        Pairs waiting for their answers and WQEs (and answers and WQEs waiting for their pair).
    cache_age : int
        Cycles a QP's last empty record serves its packets without a query (0: never).

    Members
    -------
    i : In(stream.Signature(Pair(RxPacket())))
        The requests, as ``RxDispatch.requests`` gives them.
    o : Out(stream.Signature(GatedPair(max_sge)))
        The same pairs, in order, each lane with its WQE (``wqe[k].valid`` = 0: none
        posted, or the packet consumes none).
    query, answer, consume, wqe :
        The ``RecvQueue``'s ports, flipped.
    create_valid, create : In(1), In(RecvCreate(num_qps))
        A create the ``RecvQueue`` takes this cycle (``enable``: the QP has a receive queue).
    """
    def __init__(self, *, num_qps, max_sge, depth=16, cache_age=64):
        if not isinstance(num_qps, int) or num_qps < 2 or num_qps & (num_qps - 1):
            raise ValueError(f"num_qps must be a power of two >= 2, not {num_qps!r}")
        if not isinstance(max_sge, int) or not 1 <= max_sge <= 7:
            raise ValueError(f"max_sge must be 1..7, not {max_sge!r}")
        if not isinstance(depth, int) or depth < 2:
            raise ValueError(f"depth must be an int >= 2, not {depth!r}")
        if not isinstance(cache_age, int) or not 0 <= cache_age <= 1024:
            raise ValueError(f"cache_age must be an int 0..1024, not {cache_age!r}")
        self.num_qps, self.max_sge, self.depth, self.cache_age = num_qps, max_sge, depth, cache_age
        super().__init__({
            "i": In(stream.Signature(Pair(RxPacket()))),
            "o": Out(stream.Signature(GatedPair(max_sge))),
            "query": Out(stream.Signature(RecvQuery(num_qps))),
            "answer": In(stream.Signature(RecvAnswer(num_qps))),
            "consume": Out(stream.Signature(RecvConsume(num_qps))),
            "wqe": In(stream.Signature(RecvWqe(num_qps, max_sge))),
            "create_valid": In(1),
            "create": In(RecvCreate(num_qps)),
        })

    def elaborate(self, platform):
        m = Module()
        qb = qp_bits(self.num_qps)
        # (each queued pair with the lanes that consume a WQE of a QP without a receive queue)
        # (and the lanes given the cached empty record, with its number and generation)
        m.submodules.pairs = pairs = StreamFifo(data.StructLayout({"pair": Pair(RxPacket()), "norq": unsigned(2),
                                                                   "short": unsigned(2), "cidx": unsigned(16),
                                                                   "cgen": unsigned(1)}),
                                                self.depth)
        m.submodules.avail = avail = StreamFifo(unsigned(1), 2 * self.depth)
        # room for every WQE its pairs asked for (2 per queued pair and the one asking), so the
        # RecvQueue never waits on the gate (its lookups for the responder would wait behind)
        m.submodules.wqes = wqes = StreamFifo(GateWqe(self.max_sge), 2 * self.depth + 2)

        # ---- a bit per QP: it has a receive queue; read as a pair enters the stage below ----
        m.submodules.has_rq = has_rq = Memory(shape=unsigned(1), depth=self.num_qps, init=[])
        wp = has_rq.write_port()
        m.d.comb += [wp.addr.eq(self.create.qpn), wp.data.eq(self.create.enable), wp.en.eq(self.create_valid)]
        rps = [has_rq.read_port(transparent_for=(wp,)) for _ in range(2)]
        st_valid = Signal()
        pin = Signal.like(self.i.p, name="stage")
        st_take = Signal()              # the stage's pair goes on (below)
        accept = Signal()
        m.d.comb += [self.i.ready.eq(~st_valid | st_take), accept.eq(self.i.valid & self.i.ready)]
        for k in range(2):
            m.d.comb += [rps[k].addr.eq(self.i.p.p[k].dqpn[:qb]), rps[k].en.eq(accept)]

        # ---- the last empty record (its QP's packets take it without a query for a while) ----
        c_valid = Signal()
        c_qpn = Signal(qb)
        c_index = Signal(16)
        c_gen = Signal()
        c_age = Signal(range(self.cache_age + 1))
        c_asked = Signal()              # a lane of the QP asked again as the record aged
        st_short = Signal(2)            # the stage's lanes that take it (decided as the pair enters)
        st_cidx = Signal(16)
        st_cgen = Signal()
        hit = Signal(2)
        for k in range(2):
            p = self.i.p.p[k]
            m.d.comb += hit[k].eq(c_valid & (p.dqpn[:qb] == c_qpn) & is_rwr(p.opcode) & (p.opcode != FLUSH_NEXT)
                                  & (self.i.p.second if k else 1))
        # in its last 16 cycles the first lane of its QP asks the queue again (the others still
        # take it), so that a new empty record comes before it ages out
        renew = Signal()
        m.d.comb += renew.eq((c_age < 16) & ~c_asked & (hit != 0))
        with m.If(accept):
            m.d.sync += [pin.eq(self.i.p), st_valid.eq(1), st_cidx.eq(c_index), st_cgen.eq(c_gen),
                         st_short.eq(Mux(renew, Mux(hit[0], Cat(0, hit[1]), 0), hit))]
            with m.If(renew):
                m.d.sync += c_asked.eq(1)
        with m.Elif(st_take):
            m.d.sync += st_valid.eq(0)
        wq = self.wqe
        with m.If(c_age != 0):
            m.d.sync += c_age.eq(c_age - 1)
        with m.Else():
            m.d.sync += c_valid.eq(0)
        if self.cache_age:
            with m.If(wq.valid & wq.ready & wq.p.empty & ~wq.p.norq):
                m.d.sync += [c_valid.eq(1), c_qpn.eq(wq.p.qpn), c_index.eq(wq.p.index), c_gen.eq(wq.p.gen),
                             c_age.eq(self.cache_age - 1), c_asked.eq(0)]
            with m.Elif(wq.valid & wq.ready & (wq.p.qpn == c_qpn)):
                m.d.sync += c_valid.eq(0)
            with m.If(self.create_valid & (self.create.qpn == c_qpn)):
                m.d.sync += c_valid.eq(0)

        # ---- in: one query a cycle (lane 0, then lane 1), the pair queued with the last ----
        rwr = [is_rwr(pin.p[0].opcode), pin.second & is_rwr(pin.p[1].opcode)]
        short = [rps[k].data & st_short[k] for k in range(2)]     # (st_short: a lane that consumes one)
        need = [rwr[k] & rps[k].data & ~st_short[k] for k in range(2)]
        half = Signal()                 # lane 0's query went out; lane 1's is next
        lane1 = Signal()
        m.d.comb += lane1.eq(half | ~need[0])
        qpn = Mux(lane1, pin.p[1].dqpn, pin.p[0].dqpn)
        asking = Signal()
        m.d.comb += [asking.eq(st_valid & pairs.i.ready & (need[0] & ~half | need[1])),
                     self.query.valid.eq(asking), self.query.p.qpn.eq(qpn[:qb])]
        asked = asking & self.query.ready
        # the pair goes when its last query does (or at once with none)
        last = Signal()
        m.d.comb += last.eq(Mux(need[1], lane1 & asked, Mux(need[0], asked, 1)))
        m.d.comb += [pairs.i.valid.eq(st_valid & last), pairs.i.p.pair.eq(pin),
                     pairs.i.p.norq.eq(Cat(rwr[0] & ~rps[0].data, rwr[1] & ~rps[1].data)),
                     pairs.i.p.short.eq(Cat(*short)), pairs.i.p.cidx.eq(st_cidx), pairs.i.p.cgen.eq(st_cgen),
                     st_take.eq(pairs.i.ready & last)]
        with m.If(st_valid & st_take):
            m.d.sync += half.eq(0)
        with m.Elif(asked & need[0] & need[1] & ~half):
            m.d.sync += half.eq(1)

        # ---- answers: every one consumed at once (the WQE record says what there is) --------
        a = self.answer
        m.d.comb += [
            self.consume.valid.eq(a.valid & avail.i.ready),
            self.consume.p.qpn.eq(a.p.qpn), self.consume.p.ok.eq(1),
            avail.i.valid.eq(a.valid & self.consume.ready),
            avail.i.p.eq(1),
            a.ready.eq(avail.i.valid & avail.i.ready),
        ]

        # ---- WQEs: the segment ends summed as they arrive ------------------------------------
        gw = gate_wqe(m, self.wqe.p, self.max_sge)
        m.d.comb += [wqes.i.valid.eq(self.wqe.valid), wqes.i.p.eq(gw), self.wqe.ready.eq(wqes.i.ready)]

        # ---- out: the head pair's lanes take their answers (and WQEs) one a cycle -----------
        hp, hnorq, hshort = pairs.o.p.pair, pairs.o.p.norq, pairs.o.p.short
        hneed = [is_rwr(hp.p[0].opcode) & ~hnorq[0] & ~hshort[0], hp.second & is_rwr(hp.p[1].opcode) & ~hnorq[1]
                 & ~hshort[1]]
        got = Signal(2)                  # lanes of the head pair already served
        held = Signal(data.ArrayLayout(GateWqe(self.max_sge), 2))
        out_free = Signal()
        m.d.comb += out_free.eq(~self.o.valid | self.o.ready)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        # the lane served this cycle: the first one needing a WQE not yet served
        k1 = Signal()
        m.d.comb += k1.eq(~hneed[0] | got[0])
        pending = Signal()
        m.d.comb += pending.eq(Mux(k1, hneed[1] & ~got[1], 1))
        # its answer and, if available, its WQE are there
        ready_now = Signal()
        m.d.comb += ready_now.eq(avail.o.valid & (~avail.o.p | wqes.o.valid))
        serve = Signal()
        m.d.comb += serve.eq(pairs.o.valid & pending & ready_now)
        cur = Signal(GateWqe(self.max_sge))
        m.d.comb += cur.eq(wqes.o.p)
        m.d.comb += [avail.o.ready.eq(serve), wqes.o.ready.eq(serve & avail.o.p)]
        # the pair leaves once its last lane needing a WQE is served (in that cycle)
        done_after = Signal()
        m.d.comb += done_after.eq(Mux(pending, Mux(k1, 1, ~hneed[1]) & serve, 1))
        go = Signal()
        m.d.comb += [go.eq(pairs.o.valid & out_free & done_after), pairs.o.ready.eq(go)]
        with m.If(serve & ~go):
            with m.If(k1):
                m.d.sync += [held[1].eq(cur), got[1].eq(1)]
            with m.Else():
                m.d.sync += [held[0].eq(cur), got[0].eq(1)]
        with m.If(go):
            m.d.sync += [got.eq(0), self.o.valid.eq(1), self.o.p.pair.eq(hp)]
            for k in range(2):
                lane_now = serve & ((k1 if k else ~k1))
                m.d.sync += self.o.p.wqe[k].eq(Mux(lane_now, cur, Mux(got[k], held[k], 0)))
                with m.If(hnorq[k]):
                    m.d.sync += [self.o.p.wqe[k].eq(0), self.o.p.wqe[k].norq.eq(1)]
                with m.If(hshort[k]):
                    m.d.sync += [self.o.p.wqe[k].eq(0), self.o.p.wqe[k].index.eq(pairs.o.p.cidx),
                                 self.o.p.wqe[k].gen.eq(pairs.o.p.cgen), self.o.p.wqe[k].empty.eq(1),
                                 self.o.p.wqe[k].cached.eq(1)]
        return m
