"""Receive queues: mlx5 receive WQEs in GPU memory, the producer count read from each QP's
doorbell record, WQEs prefetched and handed on in consume order."""
from amaranth.hdl import *
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from spec import formats as F
from spec.params import DATA_BYTES, DMA_ADDR_WIDTH
from rtl.common.axi import AxiReadSignature, Burst, Cache
from rtl.common.contexts import qp_bits
from rtl.common.stream import Pair, PairSplitter, StreamFifo

__all__ = ["RecvQueue", "RecvCreate", "RecvQuery", "RecvAnswer", "RecvConsume", "RecvSge", "RecvWqe",
           "RecvSync", "RecvLookup", "EPOCH_BITS"]

COUNT_BITS = 16          # mlx5 receive counters (the doorbell record holds head & 0xffff)
EPOCH_BITS = 8           # creates of a QP told apart (stale reads and slots of an earlier create)
SEG_BYTES = 16           # one data segment (F.RECV_DATA_SEG)
LINE_SEGS = DATA_BYTES // SEG_BYTES     # 8 segments per 128-byte beat
CHUNK = 16               # pool entries are taken and given back 16 WQEs (one chunk) at a time
_DEMAND_QUEUE = 2        # reads of one WQE for a stage that waits on it (hand-on, lookup)
_RETRY_QUEUE = 16        # QPs that want more WQEs fetched than their last op could fetch
_ANSWER_DEPTH = 8
_DBR_QUEUE = 4           # doorbell-record reads waiting for the AR channel
_JOB_QUEUE = 4
_HINT_QUEUE = 4
_SYNC_QUEUE = 8          # responder syncs waiting for their RAM write (or the fetch side)
_GIVE_QUEUE = 4          # query-count corrections waiting for the query side

RecvSge = data.StructLayout({"addr": unsigned(64), "length": unsigned(32), "lkey": unsigned(32)})


def RecvCreate(num_qps):
    return data.StructLayout({"qpn": unsigned(qp_bits(num_qps)), "base": unsigned(DMA_ADDR_WIDTH),
                              "log_size": unsigned(4), "log_stride": unsigned(4),
                              "dbr": unsigned(DMA_ADDR_WIDTH), "enable": unsigned(1)})


def RecvQuery(num_qps):
    return data.StructLayout({"qpn": unsigned(qp_bits(num_qps))})


def RecvAnswer(num_qps):
    return data.StructLayout({"qpn": unsigned(qp_bits(num_qps)), "available": unsigned(1)})


def RecvConsume(num_qps):
    return data.StructLayout({"qpn": unsigned(qp_bits(num_qps)), "ok": unsigned(1)})


def RecvWqe(num_qps, max_sge):
    return data.StructLayout({"qpn": unsigned(qp_bits(num_qps)), "index": unsigned(COUNT_BITS),
                              "valid": unsigned(1), "gen": unsigned(1),
                              "nsge": range(max_sge + 1), "sge": data.ArrayLayout(RecvSge, max_sge),
                              "bad": unsigned(1),
                              # the QP has no receive queue (none created, or created without
                              # one): nothing will ever be posted, so no lookup can find one
                              "norq": unsigned(1),
                              # (a consume's record) WQE ``index`` is not posted as the queue last
                              # read the doorbell record: the count did not move on, and a packet
                              # whose committed count is ``index`` is RNR NAKed without a lookup
                              "empty": unsigned(1)})


def RecvSync(num_qps):
    """What the responder's decision on a packet that held a receive WQE number tells the
    queue: the QP's ``committed`` count (WQEs used), the packet's number (``index``), and
    ``correct``: move the speculative count by ``committed - index - 1 + empty`` (computed
    here, not in the responder's decision path; ``empty``: the packet's record was an empty
    one, which did not move the count)."""
    return data.StructLayout({"qpn": unsigned(qp_bits(num_qps)), "committed": unsigned(COUNT_BITS),
                              "index": unsigned(COUNT_BITS), "correct": unsigned(1), "empty": unsigned(1)})


def RecvLookup(num_qps):
    return data.StructLayout({"qpn": unsigned(qp_bits(num_qps)), "index": unsigned(COUNT_BITS)})


def _lt(a, b, width=COUNT_BITS):
    """``a`` before ``b`` on counters mod ``2 ** width`` that stay within half of it."""
    return (a - b)[width - 1]


def _be(value, nbytes):
    """The big-endian number in the first ``nbytes`` little-endian lanes of ``value``."""
    return Cat(*(value.word_select(nbytes - 1 - k, 8) for k in range(nbytes)))


class RecvQueue(wiring.Component):
    """The receive queues of every QP: whether a message finds a receive WQE, and the WQE.

    mlx5 receive queue (rdma-core ``mlx5_post_recv``): a ring of ``1 << log_size`` WQEs of
    ``1 << log_stride`` bytes at ``base``, each a list of 16-byte data segments (byte count,
    lkey, address, big-endian) ended early by a segment whose lkey is ``INVALID_LKEY``. The
    producer writes WQEs, then ``BE32(head & 0xffff)`` at ``dbr + DBR_RECV_OFFSET``; no
    register is written, so the block reads the doorbell record itself.

    **Speculative hand-on, committed use.** The responder decides whether a packet uses a
    receive WQE only after its PSN and opcode checks, long after the ``RecvGate`` asked for
    the WQE. So every WQE is handed on speculatively and kept on chip until the responder
    *commits* it:

    * per QP the fetch side counts ``consumed`` (the speculative count: the WQE number the
      next consume gets), ``fetched`` and a generation bit ``gen``; ``committed`` (WQEs the
      responder used, from its ``sync`` records) is in a RAM of its own. The slots hold the
      WQEs ``committed .. fetched``; a slot is fetched again only once its WQE is committed.
    * every consume (``ok`` = 1) hands on WQE number ``consumed`` (``index``, ``gen``);
      ``valid`` = 1 iff that WQE is posted (below ``known``) and has a slot (less than
      ``depth`` past ``committed``), else the record is a number only. A posted WQE moves
      ``consumed`` on; one not posted does not (``empty``: the responder RNR NAKs the packet
      without a lookup when its committed count is ``index``, and sends no sync), so a flood
      of SENDs to a QP with nothing posted needs no correction.
    * ``sync`` (the responder, per decided packet that held a number, in decision order):
      ``committed`` is written; ``correct`` moves ``consumed`` by ``committed - index - 1``
      (the packets handed on after the decided one, number ``index``, were given numbers off
      by as much the other way: it did not use its WQE, or used another) and flips ``gen``;
      the query side's count moves too.
    * ``lookup`` / ``found``: the WQE of a given number (the responder's committed count,
      asked when the WQE a packet holds is not the one it must use); ``valid`` = 0 if it is
      not posted. Asked only while ``sync_idle``, so ``committed`` is up to date.

    The query side counts ``known`` (the head last read) and ``answered`` (queries answered
    available, plus the corrections). **Rule**: a query is answered ``available`` iff the
    doorbell record says WQE number ``answered`` is posted, read no earlier than the query
    or, while the QP is *armed*, no earlier than two read round trips before it. When
    ``known`` is already beyond ``answered`` the answer is given at once (the producer only
    moves its head forward, so a fresh read would say the same); otherwise, unless armed,
    the query waits for a read of the record issued after it, and later queries wait behind
    it (answers stay in query order), each with a background read of its own QP's record
    issued as it is taken, so that the reads of a run of QPs whose posts are not known yet
    overlap. A query's own read that finds nothing posted arms the QP: its record is read
    again, one read in flight, for as long as a query of the QP came while the last read
    was out, and a query that finds nothing known meanwhile is answered at once (an RNR
    NAK flood costs no read round trip a packet; a receive posted less than two round trips
    before a packet may be missed: an RNR NAK the requester retries). A QP without a
    receive queue (``enable`` = 0, or never created) answers 0. The answer is a hint: what
    counts is the consume's record.

    Two pipelines own the per-QP state, each one RAM row per QP written by one stage, so
    that a query and a consume are taken in the same cycle:

    * the query side (``known``, ``answered``, a background read in flight, the doorbell
      record's address): doorbell-record answers, creates, ``ok`` = 0 consumes, corrections
      and queries, one a cycle; a RAM read, then a decision that writes the row back (a
      transparent read port: the next cycle's read sees it). When an available answer
      leaves at most ``max(depth, 1)`` known WQEs unanswered and no background read of the
      QP is in flight, the record is read again in the background, so posts become known
      before a query needs them; a read's answer that moves ``known`` hints the fetch side.
    * the fetch side (``consumed``, ``fetched``, the ring): creates, corrections, lookups,
      consumes with ``ok`` = 1 and hints (a sync's commit hints too). It fetches ahead up to
      ``min(known, committed + max(depth, 1))``. The WQE being handed on holds its slot until
      it has its bytes.

    Reads: one AR at a time is chosen, doorbell records first (queries wait on them); each
    is one beat. A WQE read is a run of consecutive WQEs within one 128-byte line (up to
    ``128 >> log_stride`` WQEs; a WQE of 128 bytes or more: its first line, which holds all
    a WQE can hand on as ``max_sge`` <= 7). Fetch jobs are at most ``depth`` WQEs, so longer
    bursts would seldom form, and one beat per read takes one AR per R beat. Every read has
    a tag in a FIFO of ``max_reads`` (its credit), so R is never held back by anything but
    the R side's own WQE rate (one WQE per cycle; a line with several WQEs of one run takes
    as many cycles). R data are parsed as they arrive: segments up to the first invalid lkey
    or the end of the WQE; more than ``max_sge`` is ``bad``; each slot keeps the WQE's number
    and the QP's create epoch, which the hand-on stage compares (nothing of an earlier
    create, or an older lap of the ring, is taken for the WQE it waits on).

    Parameters
    ----------
    num_qps : int
        QPs (a power of two >= 2).
    max_sge : int
        Data segments handed on per WQE (1..7: a WQE's segments and the one after them lie
        in its first 128-byte line).
    depth : int
        Slots per QP (0, or a power of two up to 64; 0 is taken as 1): the WQEs on chip from
        the committed count on.
    data_width : int
        AXI data width (1024).
    max_reads : int
        Reads in flight at most (tag FIFO depth; 512 covers 1 us at one read a cycle).
    axi_id : int
        ARID of every read.

    Members
    -------
    create : In(stream.Signature(RecvCreate(num_qps)))
        ``qpn``, ``base``, ``log_size`` (0..15), ``log_stride`` (4..9), ``dbr`` (the doorbell
        record), ``enable``: the QP's receive queue is (re)created empty (every count 0,
        nothing fetched); ``enable`` = 0: no receive queue.
    query : In(stream.Signature(RecvQuery(num_qps)))
        Is there a receive WQE for the QP's next message?
    answer : Out(stream.Signature(RecvAnswer(num_qps)))
        ``qpn``, ``available``: one per query, in query order.
    consume : In(stream.Signature(RecvConsume(num_qps)))
        ``qpn``, ``ok``: the decision on the oldest query of the QP answered available and
        not yet consumed.
    wqe : Out(stream.Signature(RecvWqe(num_qps, max_sge)))
        One per consume with ``ok`` = 1, in consume order: ``qpn``, ``index`` (the WQE's
        counter mod 2^16), ``gen``, ``valid`` (the WQE is posted and on chip; else only the
        number counts), ``nsge`` and ``sge[0 .. nsge - 1]`` (``addr``, ``length`` =
        byte_count, ``lkey``), ``bad`` (more than ``max_sge`` segments).
    sync : In(stream.Signature(Pair(RecvSync(num_qps))))
        The responder's commits and corrections, one or two a transfer, in decision order.
    sync_idle : Out(1)
        No sync waits (a lookup sees every commit before it).
    ready : Out(1)
        The walk of the per-QP rows after reset is done (before it nothing is taken: the
        engine holds QP creates back until then).
    lookup : In(stream.Signature(RecvLookup(num_qps)))
        ``qpn``, ``index``: the WQE of that number (at or past the QP's committed count).
    found : Out(stream.Signature(RecvWqe(num_qps, max_sge)))
        One per lookup, in order (``valid`` = 0: not posted, or not within ``depth`` of the
        committed count).
    m_axi : Out(AxiReadSignature(addr_width=64, data_width=data_width))
        Doorbell-record reads (4 bytes, ``arsize`` 2) and WQE reads (one 128-byte beat).
    """
    def __init__(self, *, num_qps, max_sge=4, depth=4, pool=64, data_width=1024, max_reads=512, axi_id=0,
                 id_width=4):
        if not isinstance(num_qps, int) or num_qps < 2 or num_qps & (num_qps - 1):
            raise ValueError(f"num_qps must be a power of two >= 2, not {num_qps!r}")
        if not isinstance(max_sge, int) or not 1 <= max_sge < LINE_SEGS:
            raise ValueError(f"max_sge must be 1..{LINE_SEGS - 1} (a WQE's segments and its end marker "
                             f"in one 128-byte line), not {max_sge!r}")
        if not isinstance(depth, int) or depth < 0 or depth > 512 or depth & (depth - 1):
            raise ValueError(f"depth must be 0 or a power of two up to 512, not {depth!r}")
        if not isinstance(pool, int) or pool < 2 * CHUNK or pool & (pool - 1):
            raise ValueError(f"pool must be a power of two >= {2 * CHUNK}, not {pool!r}")
        if data_width != 8 * DATA_BYTES:
            raise ValueError(f"data_width must be {8 * DATA_BYTES} (one 128-byte line a beat), not {data_width!r}")
        if not isinstance(max_reads, int) or max_reads < 2 or max_reads & (max_reads - 1):
            raise ValueError(f"max_reads must be a power of two >= 2, not {max_reads!r}")
        if not isinstance(axi_id, int) or not 0 <= axi_id < 1 << id_width:
            raise ValueError(f"axi_id must fit {id_width} bits, not {axi_id!r}")
        self.num_qps, self.max_sge, self.depth, self.pool = num_qps, max_sge, depth, pool
        self.slots = max(depth, 1)
        # chunks a QP's window spans at most: aligned to chunks from 8 on (the window then
        # starts at the committed WQE's chunk), else the committed one's and the next
        self.map_len = self.slots // CHUNK if self.slots >= CHUNK else 2
        self.data_width, self.max_reads, self.axi_id = data_width, max_reads, axi_id
        super().__init__({
            "create": In(stream.Signature(RecvCreate(num_qps))),
            "query": In(stream.Signature(RecvQuery(num_qps))),
            "answer": Out(stream.Signature(RecvAnswer(num_qps))),
            "consume": In(stream.Signature(RecvConsume(num_qps))),
            "wqe": Out(stream.Signature(RecvWqe(num_qps, max_sge))),
            "sync": In(stream.Signature(Pair(RecvSync(num_qps)))),
            "sync_idle": Out(1), "ready": Out(1),
            "lookup": In(stream.Signature(RecvLookup(num_qps))),
            "found": Out(stream.Signature(RecvWqe(num_qps, max_sge))),
            "m_axi": Out(AxiReadSignature(addr_width=DMA_ADDR_WIDTH, data_width=data_width, id_width=id_width)),
        })

    def elaborate(self, platform):
        m = Module()
        qb = qp_bits(self.num_qps)
        S = self.slots
        wb = S.bit_length() + 1                 # small counts 0..S (and a sign)
        thr = max(self.depth, 1)                # background read below this many known-unanswered
        axi = self.m_axi
        # After reset every per-QP row is walked (one a cycle: read, then written back with
        # only its create epochs kept), since a reset leaves RAM as it was: a row of the life
        # before would count chunks held that the reset pool has free again (a create gives
        # them back: two owners), a receive queue that is no longer there (its enable), and
        # the QPs with one. Nothing is taken meanwhile (``num_qps`` + 1 cycles); the epochs
        # go on, so a pool slot written before the reset never matches a WQE after it.
        walking = Signal(init=1)
        walk = Signal(range(self.num_qps + 1))
        walk_prev = Signal(qb)
        with m.If(walking):
            m.d.sync += [walk.eq(walk + 1), walk_prev.eq(walk)]
            with m.If(walk == self.num_qps):
                m.d.sync += walking.eq(0)
        m.d.comb += self.ready.eq(~walking)
        create_valid, query_valid, consume_valid, lookup_valid = Signal(), Signal(), Signal(), Signal()
        m.d.comb += [create_valid.eq(self.create.valid & ~walking), query_valid.eq(self.query.valid & ~walking),
                     consume_valid.eq(self.consume.valid & ~walking), lookup_valid.eq(self.lookup.valid & ~walking)]

        # ---- layouts ---------------------------------------------------------------------
        # armed: a read issued after a query found nothing posted, and the record is read
        # again and again (``bg``) while queries come (``touched``: one came since the read in
        # flight was issued): a query that finds nothing known meanwhile is answered at once
        QRow = data.StructLayout({"known": unsigned(COUNT_BITS), "answered": unsigned(COUNT_BITS),
                                  "bg": unsigned(1), "armed": unsigned(1), "touched": unsigned(1),
                                  "epoch": unsigned(EPOCH_BITS), "enable": unsigned(1),
                                  "dbr": unsigned(DMA_ADDR_WIDTH)})
        CS = CHUNK.bit_length() - 1             # WQE counter bits within a chunk
        KB = COUNT_BITS - CS                    # chunk numbers (a WQE's counter >> CS)
        nch = self.pool // CHUNK                # chunks in the pool
        cb = (nch - 1).bit_length()             # chunk ids
        ML = self.map_len
        mb = (ML - 1).bit_length()
        # lo .. top - 1: the chunk numbers the QP holds (each one's pool chunk in its map);
        # starved: queued for a retry (its prefetch found no free chunk)
        FRow = data.StructLayout({"consumed": unsigned(COUNT_BITS), "fetched": unsigned(COUNT_BITS),
                                  "epoch": unsigned(EPOCH_BITS), "enable": unsigned(1), "gen": unsigned(1),
                                  "base": unsigned(DMA_ADDR_WIDTH), "log_size": unsigned(4),
                                  "log_stride": unsigned(4), "lo": unsigned(KB), "top": unsigned(KB),
                                  "starved": unsigned(1)})
        Slot = data.StructLayout({"qpn": unsigned(qb), "index": unsigned(COUNT_BITS), "epoch": unsigned(EPOCH_BITS),
                                  "nsge": range(self.max_sge + 1), "bad": unsigned(1),
                                  "sge": data.ArrayLayout(RecvSge, self.max_sge)})
        # A fetch job: WQEs x .. x + left - 1 of one QP, all in pool chunk ``chunk`` (base_hi1:
        # base[24:] + 1, for the carry); ``demand``: one WQE for a waiting stage, not kept.
        Job = data.StructLayout({"qpn": unsigned(qb), "epoch": unsigned(EPOCH_BITS), "x": unsigned(COUNT_BITS),
                                 "left": unsigned(wb), "base": unsigned(DMA_ADDR_WIDTH),
                                 "base_hi1": unsigned(DMA_ADDR_WIDTH - 24), "log_size": unsigned(4),
                                 "log_stride": unsigned(4), "chunk": unsigned(cb), "demand": unsigned(1)})
        DbrReq = data.StructLayout({"qpn": unsigned(qb), "epoch": unsigned(EPOCH_BITS), "query": unsigned(1),
                                    "addr": unsigned(DMA_ADDR_WIDTH)})
        # What a read in flight is, for its R beat: a doorbell record (its 32-bit lane) or a
        # run of n WQEs from x starting at 16-byte unit p of the line.
        Tag = data.StructLayout({"dbr": unsigned(1), "qpn": unsigned(qb), "epoch": unsigned(EPOCH_BITS),
                                 "query": unsigned(1), "word": unsigned(5), "x": unsigned(COUNT_BITS),
                                 "n": unsigned(4), "p": unsigned(3), "ushift": unsigned(3), "chunk": unsigned(cb),
                                 "demand": unsigned(1)})

        m.submodules.qram = qram = Memory(shape=QRow, depth=self.num_qps, init=[])
        m.submodules.fram = fram = Memory(shape=FRow, depth=self.num_qps, init=[])
        # the shared pool (chunk c: entries 16c .. 16c + 15, WQE x at 16c + x % 16) and each QP's
        # map of its chunks (chunk number k in element k % map_len)
        m.submodules.pool = slots = Memory(shape=Slot, depth=self.pool, init=[])
        m.submodules.cmap = cmap = Memory(shape=data.ArrayLayout(unsigned(cb), ML), depth=self.num_qps, init=[])
        m_wr = cmap.write_port()
        m_rd = cmap.read_port(transparent_for=(m_wr,))
        # the responder's committed count per QP (written by syncs and creates)
        m.submodules.cram = cram = Memory(shape=unsigned(COUNT_BITS), depth=self.num_qps, init=[])
        c_wr = cram.write_port()
        c_rd = cram.read_port(transparent_for=(c_wr,))
        q_wr = qram.write_port()
        q_rd = qram.read_port(transparent_for=(q_wr,))
        k_rd = qram.read_port(transparent_for=(q_wr,))          # the fetch side's view of `known`
        f_wr = fram.write_port()
        f_rd = fram.read_port(transparent_for=(f_wr,))
        s_wr = slots.write_port()
        s_rd = slots.read_port(transparent_for=(s_wr,))
        l_rd = slots.read_port(transparent_for=(s_wr,))         # lookups

        m.submodules.answers = answers = StreamFifo(RecvAnswer(self.num_qps), _ANSWER_DEPTH)
        m.submodules.dbr_reqs = dbr_reqs = StreamFifo(DbrReq, _DBR_QUEUE)
        m.submodules.jobs = jobs = StreamFifo(Job, _JOB_QUEUE)
        m.submodules.hints = hints = StreamFifo(unsigned(qb), _HINT_QUEUE)
        # commits that complete no chunk: an op of the QP when one is idle (a QP whose last
        # WQEs are committed gives its chunks back), dropped when full
        m.submodules.idle_hints = idle_hints = StreamFifo(unsigned(qb), _HINT_QUEUE)
        m.submodules.tags = tags = StreamFifo(Tag, self.max_reads)
        m.submodules.sync_split = sync_split = PairSplitter(RecvSync(self.num_qps))
        Give = data.StructLayout({"qpn": unsigned(qb), "delta": unsigned(COUNT_BITS)})
        m.submodules.gives = gives = StreamFifo(Give, _GIVE_QUEUE)
        wiring.connect(m, wiring.flipped(self.sync), sync_split.i)
        # queued with the correction it asks for (the packets numbered after ``index`` hold
        # numbers off by ``index + 1 - committed``)
        Sync = data.StructLayout({"qpn": unsigned(qb), "committed": unsigned(COUNT_BITS),
                                  "delta": unsigned(COUNT_BITS), "correct": unsigned(1)})
        m.submodules.syncs = syncs = StreamFifo(Sync, _SYNC_QUEUE)
        so = sync_split.o
        m.d.comb += [syncs.i.valid.eq(so.valid & ~walking), so.ready.eq(syncs.i.ready & ~walking),
                     syncs.i.p.qpn.eq(so.p.qpn),
                     syncs.i.p.committed.eq(so.p.committed), syncs.i.p.correct.eq(so.p.correct),
                     syncs.i.p.delta.eq(so.p.committed - so.p.index - 1 + so.p.empty)]
        # (levels, not output valids: an entry is in a FIFO a cycle before its output shows it)
        m.d.comb += self.sync_idle.eq(~self.sync.valid & (syncs.level == 0))
        fix_in_fs1 = Signal()
        wiring.connect(m, answers.o, wiring.flipped(self.answer))

        # ---- R side: doorbell-record beats to the query side, WQE beats into the slots ----
        tag = tags.o.p
        k = Signal(4)                           # WQEs of the head run already written
        dbr_in = Signal()                       # a doorbell-record beat, taken this cycle
        dbr_head = Signal(COUNT_BITS)
        word = axi.rdata.word_select(tag.word, 32)
        m.d.comb += [dbr_in.eq(axi.rvalid & tags.o.valid & tag.dbr), dbr_head.eq(_be(word, 4)[:COUNT_BITS])]
        wqe_beat = Signal()
        m.d.comb += wqe_beat.eq(axi.rvalid & tags.o.valid & ~tag.dbr)
        p_cur = Signal(3)
        m.d.comb += p_cur.eq(tag.p + (k << tag.ushift))
        x_cur = Signal(COUNT_BITS)
        m.d.comb += x_cur.eq(tag.x + k)
        last = Signal()
        m.d.comb += last.eq(k + 1 == tag.n)
        # segment j of the WQE at unit p_cur; it belongs to the WQE iff j < 16 << ushift bytes / 16
        segs, valid = [], []
        ok_so_far = C(1, 1)
        for j in range(self.max_sge + 1):
            unit = Signal(4, name=f"unit{j}")
            m.d.comb += unit.eq(p_cur + j)
            raw = axi.rdata.word_select(unit[:3], 8 * SEG_BYTES)
            fits = (tag.ushift >= j.bit_length() if j else C(1, 1)) & ~unit[3]
            lkey = _be(raw[32:64], 4)
            seg = Signal(RecvSge, name=f"seg{j}")
            m.d.comb += seg.eq(Cat(_be(raw[64:128], 8), _be(raw[0:32], 4), lkey))
            v = Signal(name=f"valid{j}")
            m.d.comb += v.eq(ok_so_far & fits & (lkey != F.INVALID_LKEY))
            ok_so_far = v
            segs.append(seg)
            valid.append(v)
        nsge = Signal(range(self.max_sge + 1))
        m.d.comb += nsge.eq(sum(valid[:self.max_sge]))      # valid[] is a prefix: its count
        # a prefetched WQE into its pool entry; a demanded one only to the stage waiting on it
        parsed = Signal(Slot)
        m.d.comb += [parsed.qpn.eq(tag.qpn), parsed.index.eq(x_cur), parsed.epoch.eq(tag.epoch),
                     parsed.nsge.eq(nsge), parsed.bad.eq(valid[self.max_sge])]
        for j in range(self.max_sge):
            m.d.comb += parsed.sge[j].eq(Mux(valid[j], segs[j], 0))
        byp_valid = Signal()
        m.d.comb += [
            s_wr.en.eq(wqe_beat & ~tag.demand), s_wr.addr.eq(Cat(x_cur[:CS], tag.chunk)), s_wr.data.eq(parsed),
            byp_valid.eq(wqe_beat & tag.demand),
        ]
        with m.If(wqe_beat):
            m.d.sync += k.eq(Mux(last, 0, k + 1))
        m.d.comb += [axi.rready.eq(dbr_in | (wqe_beat & last)), tags.o.ready.eq(axi.rready)]

        # ---- query side ---------------------------------------------------------------------
        # Ops, one a cycle, by priority: a doorbell-record beat (never held: R must flow),
        # create, consume ok = 0 (NACK), the query bounced while another waited, a new query.
        OP_DBR, OP_CREATE, OP_NACK, OP_QUERY, OP_GIVE = range(5)
        qs1_valid = Signal()
        qs1_op = Signal(3)
        qs1_qpn = Signal(qb)
        qs1_tag_epoch = Signal(EPOCH_BITS)
        qs1_query = Signal()                    # OP_DBR: the waiting query's read
        qs1_value = Signal(COUNT_BITS)
        qs1_create = Signal(RecvCreate(self.num_qps))
        qs1_delta = Signal(COUNT_BITS)
        waiting = Signal()                      # a query waits for its doorbell-record read
        # Queries taken while an earlier one waits (or is still to be taken again) wait in
        # ``bounced``, in order, each with a background read of its QP's record issued as it
        # goes in: the reads of a run of queries on QPs whose posts are not known yet overlap
        # rather than go one read round trip after another. At most the queries taken and
        # not answered (``pending`` <= _ANSWER_DEPTH), so it never fills.
        m.submodules.bounced = bounced = fifo.SyncFIFO(width=qb, depth=_ANSWER_DEPTH)
        nbounced = bounced.level               # (a push or a take shows the cycle after)
        qs1_replay = Signal()                   # the query in S1 comes out of ``bounced``
        pending = Signal(range(_ANSWER_DEPTH + 1))      # queries taken, not yet answered

        take_create = Signal()
        fs1_free = Signal()                     # the fetch side takes an op this cycle
        # a query taken may push a read (its S1 op after the one there now) and an answer
        dbr_room = Signal()
        ans_room = Signal()
        m.d.comb += [dbr_room.eq(dbr_reqs.level <= _DBR_QUEUE - 2),
                     ans_room.eq(answers.level + pending < _ANSWER_DEPTH)]
        qu_create_ok = ~waiting & (nbounced == 0) & ~(qs1_valid & (qs1_op == OP_QUERY))
        # a create waits for the syncs and corrections before it (the responder's decisions
        # on the QP's previous life must not count in the new one)
        settled = Signal()
        m.d.comb += take_create.eq(create_valid & ~dbr_in & qu_create_ok & fs1_free & settled)
        take_nack = Signal()
        take_give = Signal()
        take_replay = Signal()
        take_query = Signal()
        nack = consume_valid & ~self.consume.p.ok
        give = gives.o.valid & ~nack
        m.d.comb += [
            take_nack.eq(nack & ~dbr_in & ~take_create),
            take_give.eq(give & ~dbr_in & ~take_create),
            gives.o.ready.eq(take_give),
            # the head goes again once nothing before it waits (and no query in S1 may yet
            # make it wait: it would have to go back to the front)
            take_replay.eq(bounced.r_rdy & ~waiting & ~(qs1_valid & (qs1_op == OP_QUERY)) & dbr_room & ~dbr_in
                           & ~take_create & ~nack & ~give),
            bounced.r_en.eq(take_replay),
            # a new query: when none is before it, or to go into ``bounced`` behind one that waits
            take_query.eq(query_valid & ~take_replay & (waiting | (nbounced == 0)) & dbr_room & ans_room
                          & ~dbr_in & ~take_create & ~nack & ~give),
            self.create.ready.eq(take_create),
            self.query.ready.eq(take_query),
        ]
        q0_qpn = Signal(qb)
        with m.If(dbr_in):
            m.d.comb += q0_qpn.eq(tag.qpn)
        with m.Elif(take_create):
            m.d.comb += q0_qpn.eq(self.create.p.qpn)
        with m.Elif(take_nack):
            m.d.comb += q0_qpn.eq(self.consume.p.qpn)
        with m.Elif(take_give):
            m.d.comb += q0_qpn.eq(gives.o.p.qpn)
        with m.Elif(take_replay):
            m.d.comb += q0_qpn.eq(bounced.r_data)
        with m.Else():
            m.d.comb += q0_qpn.eq(self.query.p.qpn)
        m.d.comb += q_rd.addr.eq(q0_qpn)
        m.d.sync += [
            qs1_valid.eq(dbr_in | take_create | take_nack | take_give | take_replay | take_query),
            qs1_op.eq(Mux(dbr_in, OP_DBR, Mux(take_create, OP_CREATE, Mux(take_nack, OP_NACK,
                                                                           Mux(take_give, OP_GIVE, OP_QUERY))))),
            qs1_delta.eq(gives.o.p.delta),
            qs1_qpn.eq(q0_qpn), qs1_tag_epoch.eq(tag.epoch), qs1_query.eq(tag.query), qs1_value.eq(dbr_head),
            qs1_create.eq(self.create.p), qs1_replay.eq(take_replay),
        ]

        row = q_rd.data
        new = Signal(QRow)
        m.d.comb += new.eq(row)
        ans_valid = Signal()
        ans_avail = Signal()
        push_dbr = Signal()
        push_query = Signal()
        push_hint = Signal()
        avail_now = Signal()
        # counts mod 2^16, compared as signed differences: corrections may leave
        # ``answered`` past ``known`` for a while (queries of WQEs not yet posted)
        unanswered = Signal(COUNT_BITS)
        m.d.comb += unanswered.eq(row.known - row.answered)
        m.d.comb += avail_now.eq(row.enable & (unanswered != 0) & ~unanswered[-1])
        # known - answered (before this answer) <= thr: after it fewer than thr are left
        low = Signal()
        m.d.comb += low.eq((unanswered[thr.bit_length():] == 0) & (unanswered[:thr.bit_length()] <= thr))
        with m.If(qs1_valid):
            with m.Switch(qs1_op):
                with m.Case(OP_DBR):
                    match = qs1_tag_epoch == row.epoch
                    with m.If(match):
                        m.d.comb += new.known.eq(qs1_value)
                        with m.If(~qs1_query):
                            m.d.comb += new.bg.eq(0)
                        m.d.comb += push_hint.eq(row.enable & (qs1_value != row.known))
                    fresh = Signal(COUNT_BITS)
                    posted = Signal()
                    m.d.comb += [fresh.eq(qs1_value - row.answered), posted.eq((fresh != 0) & ~fresh[-1])]
                    with m.If(qs1_query):
                        m.d.comb += [ans_valid.eq(1), ans_avail.eq(row.enable & posted)]
                        # the count moves with the WQEs handed on: an empty record moves nothing
                        m.d.comb += new.answered.eq(row.answered + ans_avail)
                        m.d.sync += waiting.eq(0)
                        # nothing posted, by a read issued after the query: armed, and the
                        # record polled from now on (one read in flight) while queries come
                        with m.If(match & row.enable & ~posted):
                            # (a read already out, issued before this answer: it polls once more)
                            m.d.comb += [new.armed.eq(1), new.touched.eq(row.bg)]
                            with m.If(~row.bg):
                                with m.If(dbr_reqs.i.ready):
                                    m.d.comb += [push_dbr.eq(1), new.bg.eq(1)]
                                with m.Else():
                                    m.d.comb += new.armed.eq(0)
                    with m.Elif(match & row.armed):
                        # the poll: again while queries come, else disarmed
                        with m.If(row.touched & dbr_reqs.i.ready):
                            m.d.comb += [push_dbr.eq(1), new.bg.eq(1), new.touched.eq(0)]
                        with m.Else():
                            m.d.comb += new.armed.eq(0)
                with m.Case(OP_CREATE):
                    m.d.comb += [new.known.eq(0), new.answered.eq(0), new.bg.eq(0), new.armed.eq(0),
                                 new.touched.eq(0), new.epoch.eq(row.epoch + 1),
                                 new.enable.eq(qs1_create.enable),
                                 new.dbr.eq(qs1_create.dbr + F.DBR_RECV_OFFSET)]
                with m.Case(OP_NACK):
                    m.d.comb += new.answered.eq(row.answered - 1)
                with m.Case(OP_GIVE):
                    m.d.comb += new.answered.eq(row.answered + qs1_delta)
                with m.Case(OP_QUERY):
                    with m.If(~qs1_replay & (waiting | (nbounced != 0))):
                        m.d.comb += [bounced.w_en.eq(1), bounced.w_data.eq(qs1_qpn), new.touched.eq(row.armed)]
                        # its record read now, in the background (if there is room: else its
                        # own read when it is taken again)
                        with m.If(row.enable & ~avail_now & ~row.bg & dbr_reqs.i.ready):
                            m.d.comb += [push_dbr.eq(1), new.bg.eq(1)]
                    with m.Elif(~row.enable | avail_now | row.armed):
                        # (armed with nothing known: the last read, issued at most two read
                        # round trips ago, says none is posted; the poll in flight goes on)
                        m.d.comb += [ans_valid.eq(1), ans_avail.eq(avail_now),
                                     new.answered.eq(row.answered + avail_now), new.touched.eq(row.armed)]
                        with m.If(avail_now & low & ~row.bg & dbr_reqs.i.ready):
                            m.d.comb += [push_dbr.eq(1), new.bg.eq(1)]
                    with m.Else():
                        # room was checked when the query was taken
                        m.d.comb += [push_dbr.eq(1), push_query.eq(1)]
                        m.d.sync += waiting.eq(1)
        m.d.comb += [
            q_wr.en.eq(qs1_valid), q_wr.addr.eq(qs1_qpn), q_wr.data.eq(new),
            answers.i.valid.eq(ans_valid), answers.i.p.qpn.eq(qs1_qpn), answers.i.p.available.eq(ans_avail),
            dbr_reqs.i.valid.eq(push_dbr), dbr_reqs.i.p.qpn.eq(qs1_qpn), dbr_reqs.i.p.epoch.eq(row.epoch),
            dbr_reqs.i.p.query.eq(push_query), dbr_reqs.i.p.addr.eq(row.dbr),
        ]
        m.d.sync += pending.eq(pending + take_query - ans_valid)
        with m.If(push_hint):
            m.d.comb += [hints.i.valid.eq(1), hints.i.p.eq(qs1_qpn)]     # dropped when full: a hint only

        # ---- syncs: the responder's commits into their RAM; a correction also goes to the
        # fetch side (it moves ``consumed``), taken there with the RAM write ----------------
        sy = syncs.o.p
        take_fix = Signal()
        sync_go = Signal()
        # a commit that completes a chunk (the count reaches a multiple of 8) hints the fetch
        # side, which gives the chunk back: that hint is never dropped (the sync waits for room)
        crossing = Signal()
        m.d.comb += crossing.eq(~sy.correct & (sy.committed[:CS] == 0))
        # a create owns the RAM's write port in its cycle
        m.d.comb += sync_go.eq(syncs.o.valid & ~take_create & (~sy.correct | take_fix)
                               & (~crossing | (hints.i.ready & ~push_hint)))
        m.d.comb += [
            syncs.o.ready.eq(sync_go),
            c_wr.en.eq(take_create | sync_go),
            c_wr.addr.eq(Mux(take_create, self.create.p.qpn, sy.qpn)),
            c_wr.data.eq(Mux(take_create, 0, sy.committed)),
        ]

        # ---- chunks: never used ones first (``fresh``), then those given back -------------------
        m.submodules.freed = freed = StreamFifo(unsigned(cb), nch)
        fresh = Signal(range(nch + 1))
        free_avail = Signal()
        new_id = Signal(cb)
        m.d.comb += [free_avail.eq((fresh != nch) | freed.o.valid),
                     new_id.eq(Mux(fresh != nch, fresh, freed.o.p))]
        take_chunk = Signal()
        with m.If(take_chunk & (fresh != nch)):
            m.d.sync += fresh.eq(fresh + 1)
        m.d.comb += freed.o.ready.eq(take_chunk & (fresh == nch))
        m.submodules.retries = retries = StreamFifo(unsigned(qb), _RETRY_QUEUE)
        m.submodules.demands = demands = StreamFifo(Job, _DEMAND_QUEUE)

        # ---- fetch side: creates, corrections, lookups, consumes with ok = 1, hints, retries --
        fs1_valid = Signal()
        fs1_commit = Signal()
        m.d.comb += fs1_free.eq(~fs1_valid | fs1_commit)
        F_CREATE, F_FIX, F_LOOKUP, F_CONSUME, F_HINT, F_RETRY = range(6)
        take_lookup = Signal()
        take_consume = Signal()
        take_hint = Signal()
        take_retry_f = Signal()
        take_idle = Signal()
        # hints: a doorbell-record read that moved ``known``, and commits that complete a chunk
        hint_in = Signal()
        # (from ``CHUNK`` on the window moves a chunk at a time: only a commit that completes
        # one moves it; below, every commit does)
        m.d.comb += hint_in.eq(sync_go & ~sy.correct & (crossing if S >= CHUNK else 1))
        fix_wait = syncs.o.valid & sy.correct
        consume_ok = consume_valid & self.consume.p.ok
        m.d.comb += [
            take_fix.eq(fix_wait & fs1_free & ~take_create),
            take_lookup.eq(lookup_valid & fs1_free & ~take_create & ~fix_wait),
            # hints (a commit that completed a chunk gives it back) and retries (a QP that wants
            # more fetched, once a chunk is free) before consumes: few (one per chunk), and they
            # keep the pool turning while one QP's messages take every cycle
            take_hint.eq(hints.o.valid & fs1_free & ~take_create & ~fix_wait & ~lookup_valid),
            take_retry_f.eq(retries.o.valid & free_avail & fs1_free & ~take_create & ~fix_wait & ~lookup_valid
                            & ~hints.o.valid),
            take_consume.eq(consume_ok & fs1_free & ~take_create & ~fix_wait & ~lookup_valid & ~hints.o.valid
                            & ~(retries.o.valid & free_avail)),
            take_idle.eq(idle_hints.o.valid & fs1_free & ~take_create & ~fix_wait & ~lookup_valid
                         & ~hints.o.valid & ~(retries.o.valid & free_avail) & ~consume_ok),
            idle_hints.o.ready.eq(take_idle),
            self.consume.ready.eq(Mux(self.consume.p.ok, take_consume, take_nack)),
            self.lookup.ready.eq(take_lookup),
            hints.o.ready.eq(take_hint),
            retries.o.ready.eq(take_retry_f),
        ]
        f0_qpn = Signal(qb)
        with m.If(take_create):
            m.d.comb += f0_qpn.eq(self.create.p.qpn)
        with m.Elif(take_fix):
            m.d.comb += f0_qpn.eq(sy.qpn)
        with m.Elif(take_lookup):
            m.d.comb += f0_qpn.eq(self.lookup.p.qpn)
        with m.Elif(take_hint):
            m.d.comb += f0_qpn.eq(hints.o.p)
        with m.Elif(take_retry_f):
            m.d.comb += f0_qpn.eq(retries.o.p)
        with m.Elif(take_idle):
            m.d.comb += f0_qpn.eq(idle_hints.o.p)
        with m.Else():
            m.d.comb += f0_qpn.eq(self.consume.p.qpn)
        fs1_op = Signal(3)
        fs1_qpn = Signal(qb)
        fs1_create = Signal(RecvCreate(self.num_qps))
        fs1_delta = Signal(COUNT_BITS)
        fs1_index = Signal(COUNT_BITS)
        # the RAM outputs hold while the op waits (en low)
        m.d.comb += [f_rd.addr.eq(f0_qpn), f_rd.en.eq(fs1_free), k_rd.addr.eq(f0_qpn), k_rd.en.eq(fs1_free),
                     c_rd.addr.eq(f0_qpn), c_rd.en.eq(fs1_free), m_rd.addr.eq(f0_qpn), m_rd.en.eq(fs1_free)]
        with m.If(fs1_free):
            m.d.sync += [fs1_valid.eq(take_create | take_fix | take_lookup | take_consume | take_hint | take_retry_f
                                      | take_idle),
                         fs1_op.eq(Mux(take_create, F_CREATE, Mux(take_fix, F_FIX, Mux(take_lookup, F_LOOKUP,
                                   Mux(take_hint | take_idle, F_HINT, Mux(take_retry_f, F_RETRY, F_CONSUME)))))),
                         fs1_qpn.eq(f0_qpn), fs1_create.eq(self.create.p), fs1_delta.eq(sy.delta),
                         fs1_index.eq(self.lookup.p.index)]
        # a hint dropped when the queue is full: the next op of the QP fetches as far (a
        # commit that completes a chunk waited for room above)
        with m.If(hint_in & hints.i.ready & ~push_hint):
            m.d.comb += [hints.i.valid.eq(1), hints.i.p.eq(sy.qpn)]
        if S >= CHUNK:
            m.d.comb += [idle_hints.i.valid.eq(sync_go & ~sy.correct & ~crossing), idle_hints.i.p.eq(sy.qpn)]

        frow = f_rd.data
        known = k_rd.data.known
        committed = c_rd.data
        cmap_row = m_rd.data
        fnew = Signal(FRow)
        m.d.comb += fnew.eq(frow)
        cmap_new = Signal.like(cmap_row)
        m.d.comb += cmap_new.eq(cmap_row)

        # Chunks held: lo .. top - 1. Each op first gives back the oldest one when the
        # committed count has left it (one a cycle: the op waits while more are to go back;
        # a create gives back every one it holds).
        walked = Signal(KB)                     # chunks given back by this op so far (it waits)
        lo = Signal(KB)
        m.d.comb += lo.eq(frow.lo + walked)
        cc = Signal(KB)
        m.d.comb += cc.eq(committed[CS:])
        lo_behind = Signal()                    # lo < cc (chunk numbers mod 2^KB)
        m.d.comb += lo_behind.eq(_lt(lo, cc, KB))
        is_create = fs1_op == F_CREATE
        # (and every chunk once nothing past the committed count is fetched: an idle QP
        # holds none; a WQE handed on and not committed was fetched, so it keeps its own)
        d_fc = Signal(COUNT_BITS)
        m.d.comb += d_fc.eq(frow.fetched - committed)
        idle = Signal()
        m.d.comb += idle.eq(d_fc[-1] | (d_fc == 0))
        give = Signal()
        m.d.comb += give.eq(fs1_valid & (lo != frow.top) & (is_create | lo_behind | idle))
        lo1 = Signal(KB)
        m.d.comb += lo1.eq(lo + give)
        lo1_behind = Signal()
        m.d.comb += lo1_behind.eq(_lt(lo1, cc, KB))
        more = Signal()                         # another chunk to give back: the op waits
        m.d.comb += more.eq(give & (lo1 != frow.top) & (is_create | lo1_behind | idle))
        m.d.comb += [freed.i.valid.eq(give), freed.i.p.eq(cmap_row[lo[:mb]])]

        # The frontier: fetched, or the committed count when WQEs were used without being
        # prefetched (demanded); the window: up to ``slots`` past the committed count (from
        # the committed WQE's chunk when ``slots`` >= ``CHUNK``), and posted (``known``).
        front = Signal(COUNT_BITS)
        m.d.comb += front.eq(Mux(d_fc[-1], committed, frow.fetched))
        base_c = Signal(COUNT_BITS)
        m.d.comb += base_c.eq(Cat(C(0, CS), committed[CS:]) if S >= CHUNK else committed)
        d_fetched = Signal(wb)                  # front - base_c: 0..S
        m.d.comb += d_fetched.eq(front - base_c)
        d_known = Signal(COUNT_BITS)
        m.d.comb += d_known.eq(known - base_c)
        ahead = Signal(wb)                      # min(known - base_c, S), 0 when behind
        with m.If(d_known[-1]):
            m.d.comb += ahead.eq(0)
        with m.Elif((d_known[wb - 1:] != 0) | (d_known[:wb - 1] >= S)):
            m.d.comb += ahead.eq(S)
        with m.Else():
            m.d.comb += ahead.eq(d_known[:wb - 1])
        want = Signal(wb)
        m.d.comb += want.eq(Mux(frow.enable & (ahead > d_fetched), ahead - d_fetched, 0))
        # one job stays in one chunk
        to_chunk = Signal(CS + 1)
        m.d.comb += to_chunk.eq(CHUNK - front[:CS])
        n_room = Signal(wb)
        m.d.comb += n_room.eq(Mux(want > to_chunk, to_chunk, want))
        fk = Signal(KB)
        m.d.comb += fk.eq(front[CS:])
        # the frontier's chunk is held (the last one, partly fetched) unless none is held
        in_top = Signal()
        m.d.comb += in_top.eq((lo1 != frow.top) & (fk == (frow.top - 1)[:KB]))
        need_chunk = Signal()
        m.d.comb += need_chunk.eq((n_room != 0) & ~in_top)
        # a fair share: a QP takes a chunk while it holds fewer than the pool's chunks over the
        # QPs with a receive queue (rounded up to a power of two; at least one), so QPs idle
        # with a full window leave room for the others (with more QPs than chunks, those that
        # come late read their WQEs on demand)
        rq_qps = Signal(range(self.num_qps + 1))
        share_log = Signal(range(qb + 2))
        m.d.comb += share_log.eq(0)
        for k in range(1, qb + 2):
            with m.If((rq_qps - 1) >> (k - 1) != 0):
                m.d.comb += share_log.eq(k)
        held = Signal(KB)
        m.d.comb += held.eq(frow.top - lo1)
        share = Signal(range(nch + 1))
        m.d.comb += share.eq(C(nch, range(nch + 1)) >> share_log)
        fair = Signal()
        m.d.comb += fair.eq((held < share) | (held == 0))
        got_chunk = Signal()
        m.d.comb += got_chunk.eq(need_chunk & free_avail & ~more & fair)
        n = Signal(wb)
        m.d.comb += n.eq(Mux(~more & (in_top | got_chunk), n_room, 0))
        job_chunk = Signal(cb)
        m.d.comb += job_chunk.eq(Mux(in_top, cmap_row[fk[:mb]], new_id))
        # it wants more than this op fetches (no chunk was free, or its job ends at a chunk's
        # end): it goes to the retry queue (once), taken again when a chunk is free, so that
        # a QP fills its window between its messages and not only one chunk per message
        # (only when its share allows one more and one may come: a retry that finds a chunk
        # free and takes none is not queued again, so retries never loop)
        fair2 = Signal()
        m.d.comb += fair2.eq(held + 1 < share)
        starve = Signal()
        m.d.comb += starve.eq(~is_create & ~more & (~frow.starved | (fs1_op == F_RETRY))
                              & ((need_chunk & ~free_avail & fair)
                                 | ((n != 0) & (want > n) & Mux(got_chunk, fair2, fair))))

        # the WQE a consume (``consumed``) or a lookup names: posted and in the window (else a
        # number only), then in the pool (prefetched: its chunk held and its read issued) or
        # read on demand for the stage that waits on it
        idx = Signal(COUNT_BITS)
        m.d.comb += idx.eq(Mux(fs1_op == F_LOOKUP, fs1_index, frow.consumed))
        rel = Signal(COUNT_BITS)
        m.d.comb += rel.eq(idx - base_c)
        on_chip = Signal()
        m.d.comb += on_chip.eq(frow.enable & (rel[wb - 1:] == 0) & (rel[:wb - 1] < ahead)
                               & ~_lt(idx, committed))
        top_new = Signal(KB)
        lo_new = Signal(KB)
        front_new = Signal(COUNT_BITS)
        m.d.comb += front_new.eq(front + n)
        ik = Signal(KB)
        m.d.comb += ik.eq(idx[CS:])
        pooled = Signal()                       # its read is issued, into a chunk it holds
        m.d.comb += pooled.eq(_lt(idx, front_new) & ~_lt(ik, lo_new, KB) & _lt(ik, top_new, KB))
        idx_chunk = Signal(cb)
        m.d.comb += idx_chunk.eq(Mux(got_chunk & (ik == fk), new_id, cmap_row[ik[:mb]]))

        # a consume of a WQE not posted (as last read) hands on an empty record and does not
        # move the count, so an RNR NAKed flood needs no correction and no lookup
        d_posted = Signal(COUNT_BITS)
        posted_f = Signal()
        m.d.comb += [d_posted.eq(known - frow.consumed), posted_f.eq((d_posted != 0) & ~d_posted[-1])]
        is_consume = Signal()
        is_lookup = Signal()
        is_fix = Signal()
        m.d.comb += [is_consume.eq(fs1_valid & (fs1_op == F_CONSUME)), is_lookup.eq(fs1_valid & (fs1_op == F_LOOKUP)),
                     is_fix.eq(fs1_valid & (fs1_op == F_FIX))]
        need_job = Signal()
        m.d.comb += need_job.eq(fs1_valid & ~is_create & (n != 0))
        need_demand = Signal()
        m.d.comb += need_demand.eq((is_consume | is_lookup) & on_chip & ~pooled & ~more)
        m.d.comb += [fix_in_fs1.eq(is_fix), settled.eq(self.sync_idle & (gives.level == 0) & ~fix_in_fs1)]

        s2_valid = Signal()
        s2_leave = Signal()
        s2_free = Signal()
        m.d.comb += s2_free.eq(~s2_valid | s2_leave)
        l2_valid = Signal()
        l2_leave = Signal()
        l2_free = Signal()
        m.d.comb += l2_free.eq(~l2_valid | l2_leave)
        m.d.comb += fs1_commit.eq(fs1_valid & ~more & (~is_consume | s2_free) & (~is_lookup | l2_free)
                                  & (~is_fix | gives.i.ready) & (~need_job | jobs.i.ready)
                                  & (~need_demand | demands.i.ready))
        with m.If(fs1_commit):
            m.d.sync += [walked.eq(0),
                         ]
            with m.If(is_create):
                m.d.sync += rq_qps.eq(rq_qps + fs1_create.enable - frow.enable)
        with m.Elif(give):
            m.d.sync += walked.eq(walked + 1)
        m.d.comb += take_chunk.eq(fs1_commit & ~is_create & got_chunk)
        # the chunks held after the op: lo1 .. top - 1, and the new one; none held: from the
        # frontier's chunk on
        m.d.comb += [lo_new.eq(Mux(lo1 == frow.top, fk, lo1)),
                     top_new.eq(Mux(got_chunk, fk + 1, Mux(lo1 == frow.top, fk, frow.top)))]
        with m.If(got_chunk):
            m.d.comb += cmap_new[fk[:mb]].eq(new_id)
        with m.If(is_create):
            m.d.comb += [fnew.consumed.eq(0), fnew.fetched.eq(0), fnew.epoch.eq(frow.epoch + 1), fnew.gen.eq(0),
                         fnew.enable.eq(fs1_create.enable), fnew.base.eq(fs1_create.base),
                         fnew.log_size.eq(fs1_create.log_size), fnew.log_stride.eq(fs1_create.log_stride),
                         fnew.lo.eq(0), fnew.top.eq(0), fnew.starved.eq(0)]
        with m.Else():
            m.d.comb += [fnew.fetched.eq(front_new), fnew.lo.eq(lo_new), fnew.top.eq(top_new)]
            with m.If((fs1_op == F_CONSUME) & frow.enable & posted_f):
                m.d.comb += fnew.consumed.eq(frow.consumed + 1)
            with m.If(fs1_op == F_FIX):
                m.d.comb += [fnew.consumed.eq(frow.consumed + fs1_delta), fnew.gen.eq(~frow.gen)]
            with m.If(fs1_op == F_RETRY):
                m.d.comb += fnew.starved.eq(0)
            with m.If(starve & retries.i.ready):
                m.d.comb += fnew.starved.eq(1)
        m.d.comb += [
            f_wr.en.eq(fs1_commit), f_wr.addr.eq(fs1_qpn), f_wr.data.eq(fnew),
            m_wr.en.eq(fs1_commit), m_wr.addr.eq(fs1_qpn), m_wr.data.eq(cmap_new),
            retries.i.valid.eq(fs1_commit & ~is_create & starve), retries.i.p.eq(fs1_qpn),
            jobs.i.valid.eq(fs1_commit & need_job), jobs.i.p.qpn.eq(fs1_qpn), jobs.i.p.epoch.eq(frow.epoch),
            jobs.i.p.x.eq(front), jobs.i.p.left.eq(n), jobs.i.p.base.eq(frow.base),
            jobs.i.p.base_hi1.eq(frow.base[24:] + 1), jobs.i.p.log_size.eq(frow.log_size),
            jobs.i.p.log_stride.eq(frow.log_stride), jobs.i.p.chunk.eq(job_chunk), jobs.i.p.demand.eq(0),
            demands.i.valid.eq(fs1_commit & need_demand), demands.i.p.qpn.eq(fs1_qpn),
            demands.i.p.epoch.eq(frow.epoch), demands.i.p.x.eq(idx), demands.i.p.left.eq(1),
            demands.i.p.base.eq(frow.base), demands.i.p.base_hi1.eq(frow.base[24:] + 1),
            demands.i.p.log_size.eq(frow.log_size), demands.i.p.log_stride.eq(frow.log_stride),
            demands.i.p.demand.eq(1),
            # the query side's count moves with ``consumed``
            gives.i.valid.eq(fs1_commit & is_fix & frow.enable), gives.i.p.qpn.eq(fs1_qpn),
            gives.i.p.delta.eq(fs1_delta),
        ]

        # ---- the two waiting stages: the hand-on stage (the consumed WQE, onto ``wqe``) and the
        # lookup stage (the named WQE, onto ``found``). Each takes its WQE from its pool entry
        # once that holds it (read again each cycle), or from its demanded read on the R side;
        # a WQE not committed keeps its chunk, so it cannot leave while a stage waits on it.
        def waiting_stage(name, rd, valid, leave, load, load_index, out, gen=None, empty=None):
            qpn, index = Signal(qb, name=f"{name}_qpn"), Signal(COUNT_BITS, name=f"{name}_index")
            epoch, chunk = Signal(EPOCH_BITS, name=f"{name}_epoch"), Signal(cb, name=f"{name}_chunk")
            none = Signal(name=f"{name}_none")      # a number only: not posted, or not in the window
            norq = Signal(name=f"{name}_norq")      # the QP has no receive queue
            dem = Signal(name=f"{name}_dem")        # read on demand: taken from the R side
            have = Signal(name=f"{name}_have")      # cap holds the WQE
            cap = Signal(Slot, name=f"{name}_cap")
            m.d.comb += rd.addr.eq(Mux(load, Cat(load_index[:CS], idx_chunk), Cat(index[:CS], chunk)))

            def matches(slot):
                return (slot.qpn == qpn) & (slot.index == index) & (slot.epoch == epoch)
            arrived, byp = Signal(name=f"{name}_arrived"), Signal(name=f"{name}_byp")
            got = Signal(Slot, name=f"{name}_got")
            m.d.comb += [arrived.eq(~dem & matches(rd.data)), byp.eq(dem & byp_valid & matches(parsed)),
                         got.eq(Mux(have, cap, rd.data))]
            m.d.comb += [
                out.valid.eq(valid & (none | have | arrived)),
                out.p.qpn.eq(qpn), out.p.index.eq(index), out.p.valid.eq(~none),
                out.p.nsge.eq(Mux(none, 0, got.nsge)), out.p.bad.eq(~none & got.bad),
                out.p.norq.eq(norq),
                leave.eq(out.valid & out.ready),
            ]
            for j in range(self.max_sge):
                m.d.comb += out.p.sge[j].eq(Mux(none, 0, got.sge[j]))
            with m.If(valid & ~have & ~leave):
                with m.If(arrived):
                    m.d.sync += [cap.eq(rd.data), have.eq(1)]
                with m.Elif(byp):
                    m.d.sync += [cap.eq(parsed), have.eq(1)]
            with m.If(load):
                m.d.sync += [valid.eq(1), qpn.eq(fs1_qpn), index.eq(load_index), epoch.eq(frow.epoch),
                             none.eq(~on_chip), norq.eq(~frow.enable), dem.eq(need_demand), chunk.eq(idx_chunk),
                             have.eq(0)]
            with m.Elif(leave):
                m.d.sync += valid.eq(0)
            if gen is not None:
                held_gen = Signal(name=f"{name}_gen")
                m.d.comb += out.p.gen.eq(held_gen)
                with m.If(load):
                    m.d.sync += held_gen.eq(gen)
            if empty is not None:
                held_empty = Signal(name=f"{name}_empty")
                m.d.comb += out.p.empty.eq(held_empty)
                with m.If(load):
                    m.d.sync += held_empty.eq(empty)

        s2_load, l2_load = Signal(), Signal()
        m.d.comb += [s2_load.eq(fs1_commit & is_consume), l2_load.eq(fs1_commit & is_lookup)]
        waiting_stage("s2", s_rd, s2_valid, s2_leave, s2_load, frow.consumed, self.wqe, gen=frow.gen,
                      empty=frow.enable & ~posted_f)
        waiting_stage("l2", l_rd, l2_valid, l2_leave, l2_load, fs1_index, self.found)

        # ---- fetch runs: jobs split at the ring end and the 128-byte line ----------------------
        # P1 (address): a job, or the rest of the last one; P2 (run): its first run.
        cont_valid = Signal()
        cont = Signal(Job)
        p1 = Signal(Job)
        # a demanded WQE goes before the prefetch jobs (it is not kept, so it may pass them)
        m.d.comb += p1.eq(Mux(cont_valid, cont, Mux(demands.o.valid, demands.o.p, jobs.o.p)))
        p1_valid = cont_valid | demands.o.valid | jobs.o.valid
        size = Signal(COUNT_BITS + 1)
        m.d.comb += size.eq(1 << p1.log_size)
        slot = Signal(COUNT_BITS)
        m.d.comb += slot.eq(p1.x & (size - 1))
        to_ring = Signal(COUNT_BITS + 1)
        m.d.comb += to_ring.eq(size - slot)
        off = Signal(24)
        m.d.comb += off.eq(slot << p1.log_stride)
        low24 = Signal(25)
        m.d.comb += low24.eq(p1.base[:24] + off)

        p2_valid = Signal()
        p2 = Signal(Job)
        p2_addr = Signal(DMA_ADDR_WIDTH)
        p2_ring = Signal(4)                     # WQEs to the ring end, at most 8
        p2_take = Signal()
        p2_rest = Signal()
        p2_free = Signal()
        m.d.comb += p2_free.eq(~p2_valid | p2_take)
        p1_take = Signal()
        m.d.comb += p1_take.eq(p1_valid & p2_free & ~(p2_take & p2_rest))
        m.d.comb += [demands.o.ready.eq(p1_take & ~cont_valid),
                     jobs.o.ready.eq(p1_take & ~cont_valid & ~demands.o.valid)]
        with m.If(p1_take):
            m.d.sync += [p2.eq(p1), p2_addr.eq(Cat(low24[:24], Mux(low24[24], p1.base_hi1, p1.base[24:]))),
                         p2_ring.eq(Mux(to_ring > 8, 8, to_ring)), cont_valid.eq(0)]
        with m.If(p2_free):
            m.d.sync += p2_valid.eq(p1_take)

        p = p2_addr[4:7]                         # 16-byte unit of the first WQE in its line
        ushift = Signal(3)
        m.d.comb += ushift.eq(p2.log_stride - 4)
        to_line = Signal(4)
        m.d.comb += to_line.eq(Mux(p2.log_stride >= 7, 1, (8 - p) >> ushift))
        run = Signal(4)
        r1 = Mux(p2.left < to_line, p2.left, to_line)
        m.d.comb += run.eq(Mux(p2_ring < r1, p2_ring, r1))
        m.d.comb += p2_rest.eq(p2.left != run)
        with m.If(p2_take & p2_rest):
            m.d.sync += [cont.eq(p2), cont.x.eq(p2.x + run), cont.left.eq(p2.left - run), cont_valid.eq(1)]

        # ---- AR: one register, doorbell records first; each read's tag pushed as it loads ----
        ar_valid = Signal()
        ar_load = Signal()
        m.d.comb += ar_load.eq((~ar_valid | axi.arready) & tags.i.ready)
        take_dbr_req = Signal()
        m.d.comb += [take_dbr_req.eq(ar_load & dbr_reqs.o.valid), dbr_reqs.o.ready.eq(take_dbr_req),
                     p2_take.eq(ar_load & ~dbr_reqs.o.valid & p2_valid)]
        req = dbr_reqs.o.p
        m.d.comb += [
            tags.i.valid.eq(take_dbr_req | p2_take),
            tags.i.p.dbr.eq(take_dbr_req), tags.i.p.qpn.eq(Mux(take_dbr_req, req.qpn, p2.qpn)),
            tags.i.p.epoch.eq(Mux(take_dbr_req, req.epoch, p2.epoch)), tags.i.p.query.eq(req.query),
            tags.i.p.word.eq(req.addr[2:7]), tags.i.p.x.eq(p2.x), tags.i.p.n.eq(run), tags.i.p.p.eq(p),
            tags.i.p.ushift.eq(ushift), tags.i.p.chunk.eq(p2.chunk), tags.i.p.demand.eq(p2.demand),
        ]
        araddr = Signal(DMA_ADDR_WIDTH)
        arsize = Signal(3)
        with m.If(ar_load):
            m.d.sync += ar_valid.eq(take_dbr_req | p2_take)
            with m.If(take_dbr_req):
                m.d.sync += [araddr.eq(Cat(C(0, 2), req.addr[2:])), arsize.eq(2)]
            with m.Else():
                m.d.sync += [araddr.eq(Cat(C(0, 7), p2_addr[7:])), arsize.eq(7)]
        m.d.comb += [
            axi.arvalid.eq(ar_valid), axi.araddr.eq(araddr), axi.arsize.eq(arsize), axi.arlen.eq(0),
            axi.arid.eq(self.axi_id), axi.arburst.eq(Burst.INCR),
            axi.arcache.eq(Cache.NORMAL_NON_CACHEABLE_BUFFERABLE),
        ]
        # the walk after reset (last: it overrides the stages' RAM ports, idle meanwhile)
        with m.If(walking):
            m.d.comb += [q_rd.addr.eq(walk), f_rd.addr.eq(walk), f_rd.en.eq(1)]
            with m.If(walk != 0):
                # each row written whole, 0 but its epoch (a row signal with its epoch alone
                # assigned leaves the other bits undriven in the Verilog, not 0)
                m.d.comb += [q_wr.en.eq(1), q_wr.addr.eq(walk_prev), q_wr.data.eq(0),
                             q_wr.data.epoch.eq(q_rd.data.epoch),
                             f_wr.en.eq(1), f_wr.addr.eq(walk_prev), f_wr.data.eq(0),
                             f_wr.data.epoch.eq(f_rd.data.epoch)]
        return m
