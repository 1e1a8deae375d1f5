"""cocotb testbench of the RecvQueue block (rtl/responder/recv_queue.py), run by
tests/blocks/test_recv_queue.py on Icarus and Verilator.

The top (``recv_queue_pair``, built by the test) holds two RecvQueues of ``NUM_QPS`` QPs:
``a`` prefetches (a window of ``DEPTH_A`` WQEs a QP, a pool of 8 chunks of 16 shared by the
8 QPs: QPs wait for chunks, give them back, take them again), ``b`` does not (depth 0, a pool
of 2 chunks: most WQEs are read on demand; each WQE fetched on its
consume). Each has its own GPU memory (an in-order AXI read slave with a random latency per
read, sampling memory at the AR) and its own GPU producer and responder agents. Everything
is stepped from one coroutine, one call per clock edge: at the edge the handshakes of the
cycle before are sampled (valid and ready both high), then the next values are driven.

The responder agent plays the ``RecvGate`` and the ``Responder``: by default it consumes
(``ok`` = 1) every answer, in order, and decides on each WQE record handed on as the
responder does: it uses WQE number ``rq_ci`` (its own count) when the record is that WQE,
else looks it up (``lookup`` / ``found``, once ``sync_idle``); now and then it rejects a
record (a duplicate's: not used); each decision goes back as a ``sync`` record (the
committed count, and the correction of the numbering with its generation bit).

Checked, against what the testbench itself posted:
* answers in query order; ``available`` = 1 only if the head the GPU had written by the
  answer's cycle is beyond the WQEs used;
* every WQE record with ``valid`` = 1 and every WQE found: a WQE the GPU had published,
  its segments as posted (up to the first of INVALID_LKEY or the stride's end), ``bad``
  iff more than max_sge;
* the WQEs are used in order (by construction: ``rq_ci``), each once, and every WQE
  published is used in the end (none lost by a rejected record);
* with every record used, records are numbered in order and carry the WQE.
"""
import bisect
import random
from collections import deque

import cocotb
from cocotb.triggers import RisingEdge
from cocotb.clock import Clock

from spec import formats as F
from .clock import ClockCycles
from rtl.common.stream import Pair
from rtl.responder.recv_queue import (RecvConsume, RecvCreate, RecvQuery, RecvWqe, RecvSge, RecvAnswer, RecvSync,
                                      RecvLookup)

NUM_QPS = 8
MAX_SGE = 4
DEPTH_A = 32
PER_QP = 8           # WQEs a QP uses in the throughput test
PAGE = 4096
LINE = 128


def _fields(layout):
    return {name: (f.offset, f.width) for name, f in layout}


def pack(layout, **values):
    fields = _fields(layout)
    out = 0
    for name, value in values.items():
        off, width = fields[name]
        out |= (value & ((1 << width) - 1)) << off
    return out


def unpack(layout, value):
    return {name: (value >> off) & ((1 << width) - 1) for name, (off, width) in _fields(layout).items()}


class Memory:
    """Sparse byte store in 4 KiB pages."""
    def __init__(self):
        self.pages = {}

    def write(self, addr, data):
        for i, b in enumerate(data):
            a = addr + i
            self.pages.setdefault(a // PAGE, bytearray(PAGE))[a % PAGE] = b

    def read(self, addr, n):
        return bytes(self.pages.get((addr + i) // PAGE, bytes(PAGE))[(addr + i) % PAGE] for i in range(n))


class ReadSlave:
    """AXI4 read slave: AR always ready, data sampled at the AR handshake, R beats in AR
    order one a cycle, each at least ``latency()`` cycles after its AR."""
    def __init__(self, dut, prefix, mem, latency):
        self.s = {n: getattr(dut, f"{prefix}__m_axi__{n}") for n in
                  ("arvalid", "arready", "araddr", "arlen", "arsize", "arburst", "rvalid", "rready", "rdata",
                   "rlast", "rid", "rresp", "arid")}
        self.mem, self.latency = mem, latency
        self.q = deque()
        self.r_on = False
        self.reads = []                 # (cycle, addr, size)
        self.in_flight_max = 0
        self.s["arready"].value = 1
        self.s["rvalid"].value = 0

    def step(self, c):
        s = self.s
        if self.r_on and s["rready"].value == 1:
            self.q.popleft()
            self.r_on = False
        if s["arvalid"].value == 1:
            addr, size, alen = int(s["araddr"].value), int(s["arsize"].value), int(s["arlen"].value)
            assert alen == 0, f"a {alen + 1}-beat read"
            assert int(s["arburst"].value) == 1
            assert addr % (1 << size) == 0, f"unaligned read {addr:#x} size {1 << size}"
            assert size in (2, 7), f"arsize {size}"
            line = addr & ~(LINE - 1)
            ready = max(c + self.latency(), self.q[-1][0] if self.q else 0)
            self.q.append((ready, int.from_bytes(self.mem.read(line, LINE), "little")))
            self.reads.append((c, addr, 1 << size))
            self.in_flight_max = max(self.in_flight_max, len(self.q))
        if not self.r_on and self.q and self.q[0][0] <= c + 1:
            s["rdata"].value = self.q[0][1]
            s["rlast"].value = 1
            s["rid"].value = 0
            s["rresp"].value = 0
            s["rvalid"].value = 1
            self.r_on = True
        elif not self.r_on:
            s["rvalid"].value = 0


class Ring:
    """One incarnation of a QP's receive queue as the GPU sees it."""
    def __init__(self, base, log_size, log_stride, dbr):
        self.base, self.log_size, self.log_stride, self.dbr = base, log_size, log_stride, dbr
        self.size, self.stride = 1 << log_size, 1 << log_stride
        self.head = 0                   # WQEs written (GPU's counter)
        self.published = 0             # head written into the doorbell record
        self.history = [(-1, 0)]        # (cycle, doorbell record value) as written
        self.wqes = {}                  # counter -> list of (addr, length, lkey)
        self.answered = 0               # queries answered
        self.consumed = 0               # consumes taken
        self.handed = 0                 # records handed on
        self.used = 0                   # WQEs used (the responder's rq_ci)
        self.gen = 0                    # the responder's numbering generation
        self.reserved = 0               # answered, not yet consumed

    def head_at(self, cycle):
        """The doorbell record's value at the end of ``cycle``."""
        if self.history[-1][0] <= cycle:
            return self.history[-1][1]
        return self.history[bisect.bisect_right(self.history, (cycle, 1 << 17)) - 1][1]


class Env:
    """One RecvQueue instance, its memory, GPU and responder agents, and the reference."""
    def __init__(self, dut, prefix, rnd=None, latency=lambda: 100, max_sge=MAX_SGE):
        self.dut, self.prefix, self.rnd, self.max_sge = dut, prefix, rnd, max_sge
        self.mem = Memory()
        self.axi = ReadSlave(dut, prefix, self.mem, latency)
        g = lambda n: getattr(dut, f"{prefix}__{n}")
        self.sig = {n: g(n) for n in ("create__valid", "create__ready", "create__payload", "query__valid",
                                      "query__ready", "query__payload", "answer__valid", "answer__ready",
                                      "answer__payload", "consume__valid", "consume__ready", "consume__payload",
                                      "wqe__valid", "wqe__ready", "wqe__payload", "sync__valid", "sync__ready",
                                      "sync__payload", "sync_idle", "lookup__valid", "lookup__ready",
                                      "lookup__payload", "found__valid", "found__ready", "found__payload")}
        for n in ("create__valid", "query__valid", "consume__valid", "sync__valid", "lookup__valid"):
            self.sig[n].value = 0
        self.sig["found__ready"].value = 1
        self.auto_consume = True        # consume every answer (as the gate)
        self.reject_p = 0.0             # records the responder does not use (duplicates)
        self.records = deque()          # (qpn, record) handed on, not yet decided
        self.syncs = deque()            # sync records to send
        self.cur_sync = None
        self.lookup_state = None        # None, "wait" (sync idle), "asked"
        self.lookups = 0
        self.empties = 0                # empty records RNR NAKed without a lookup
        # an empty record may miss a post this much older than it at most: two doorbell-record
        # reads (the poll's rule), with room for the AR queue
        self.stale_window = 1400
        self.corrections = 0
        self.sig["answer__ready"].value = 1
        self.sig["wqe__ready"].value = 1
        self.rings = {}                 # qpn -> Ring (None: no receive queue)
        self.blocked = set()            # QPs whose create is queued: left alone until it is taken
        self.queries = deque()          # (qpn, cycle taken)
        self.expect = deque()           # (qpn, index, sges, bad) in consume order
        self.create_q, self.query_q, self.consume_q = deque(), deque(), deque()
        self.cur = {"create": None, "query": None, "consume": None}
        self.answers, self.rnr, self.handed, self.revealed = [], 0, [], 0
        self.answer_cycles, self.wqe_cycles, self.consume_cycles = [], [], []
        self.wqe_ready_p = 1.0
        self.next_base = 0x7F00_00FF_E000 if prefix == "a" else 0x7E00_00FF_E000   # rings cross 16 MiB
        self.next_dbr = 0x6000_0000_0040

    # ---- the GPU -------------------------------------------------------------------------
    def new_ring(self, log_size, log_stride, same_dbr_as=None):
        stride, size = 1 << log_stride, 1 << log_size
        base = -(-self.next_base // stride) * stride
        self.next_base = base + size * stride + self.rnd.choice([0, stride, 4096])
        dbr = same_dbr_as.dbr if same_dbr_as is not None else self.next_dbr
        if same_dbr_as is None:
            self.next_dbr += self.rnd.choice([4, 8, 64, 124, 132])
        return Ring(base, log_size, log_stride, dbr)

    def create(self, qpn, ring, enable=1):
        """Queue a create; the doorbell record of the new ring reads 0 from now on."""
        if ring is not None:
            self.mem.write(ring.dbr + F.DBR_RECV_OFFSET, (0).to_bytes(4, "big"))
        self.create_q.append((qpn, ring, enable))

    def post(self, qpn, sges=None, publish=True, cycle=0):
        """Write the QP's next WQE (random segments unless given); publish: write the
        doorbell record too. False when the ring is full (the producer waits)."""
        r = self.rings[qpn]
        if r.head - r.used >= r.size:  # a slot is the GPU's again once its WQE is used (its CQE)
            return False
        fit = r.stride // 16
        if sges is None:
            n = self.rnd.choice([0, 1, 1, 2, 3, 4, 4, 5, 7, fit])
            n = min(n, fit)
            sges = [(self.rnd.getrandbits(64), self.rnd.getrandbits(32),
                     self.rnd.choice([self.rnd.getrandbits(32) | 0x200, 0, 0xFFFFFFFF, 0x1FF, 0x101]))
                    for _ in range(n)]
        wqe = bytearray()
        for addr, length, lkey in sges:
            wqe += length.to_bytes(4, "big") + lkey.to_bytes(4, "big") + addr.to_bytes(8, "big")
        if len(sges) < fit:             # the end marker; the rest is left as it was (garbage)
            wqe += (0).to_bytes(4, "big") + F.INVALID_LKEY.to_bytes(4, "big") + bytes(8)
        addr = r.base + (r.head % r.size) * r.stride
        garbage = bytes(self.rnd.getrandbits(8) for _ in range(r.stride - len(wqe)))
        self.mem.write(addr, bytes(wqe) + garbage)
        r.wqes[r.head] = sges
        r.head += 1
        if publish:
            self.publish(qpn, cycle)
        return True

    def publish(self, qpn, cycle):
        r = self.rings[qpn]
        if r.published != r.head:
            r.published = r.head
            self.mem.write(r.dbr + F.DBR_RECV_OFFSET, (r.head & 0xFFFF).to_bytes(4, "big"))
            r.history.append((cycle, r.head & 0xFFFF))

    # ---- the responder ---------------------------------------------------------------------
    def outstanding(self, qpn):
        return sum(1 for q, _ in self.queries if q == qpn) + sum(1 for q in self.query_q if q == qpn) \
            + (self.cur["query"] == qpn)

    def idle(self, qpn):
        r = self.rings.get(qpn)
        return self.outstanding(qpn) == 0 and (r is None or (r.reserved == 0 and r.handed == r.consumed)) \
            and all(c[0] != qpn for c in self.consume_q) and (self.cur["consume"] or (None,))[0] != qpn \
            and all(q != qpn for q, _ in self.records) and not self.syncs and self.cur_sync is None

    # ---- one clock edge -----------------------------------------------------------------------
    def step(self, c):
        """``c``: the cycle that just ended (its handshakes are sampled now)."""
        s, now = self.sig, c + 1
        self.axi.step(c)
        # creates
        if self.cur["create"] is not None and s["create__ready"].value == 1:
            qpn, ring, enable = self.cur["create"]
            self.rings[qpn] = ring if enable else None
            self.blocked.discard(qpn)
            self.cur["create"] = None
        if self.cur["create"] is None and self.create_q:
            qpn, ring, enable = self.cur["create"] = self.create_q.popleft()
            r = ring or Ring(0, 0, 4, 0)
            s["create__payload"].value = pack(RecvCreate(NUM_QPS), qpn=qpn, base=r.base, log_size=r.log_size,
                                              log_stride=r.log_stride, dbr=r.dbr, enable=enable)
        s["create__valid"].value = int(self.cur["create"] is not None)
        # queries
        if self.cur["query"] is not None and s["query__ready"].value == 1:
            self.queries.append((self.cur["query"], c))
            self.cur["query"] = None
        # a consume with ok = 0 is never in flight with a query of its QP (which of the two
        # counts first is not part of the rule): queries wait behind it, it becomes ok = 1
        # when the QP has a query outstanding
        nack = self.cur["consume"] is not None and not self.cur["consume"][1]
        if self.cur["query"] is None and self.query_q and not (nack and self.cur["consume"][0] == self.query_q[0]):
            self.cur["query"] = self.query_q.popleft()
            s["query__payload"].value = pack(RecvQuery(NUM_QPS), qpn=self.cur["query"])
        s["query__valid"].value = int(self.cur["query"] is not None)
        # answers
        if s["answer__valid"].value == 1 and s["answer__ready"].value == 1:
            a = unpack(RecvAnswer(NUM_QPS), int(s["answer__payload"].value))
            assert self.queries, f"{self.prefix}: an answer without a query: {a}"
            qpn, taken = self.queries.popleft()
            assert a["qpn"] == qpn, f"{self.prefix}: answer for QP {a['qpn']}, expected {qpn}"
            self.check_answer(qpn, taken, c, a["available"])
            self.answer_cycles.append(c)
        # consumes
        if self.cur["consume"] is not None and s["consume__ready"].value == 1:
            qpn, ok = self.cur["consume"]
            r = self.rings.get(qpn)
            if r is None:
                self.expect.append((qpn, r))
            else:
                r.reserved -= 1
                if ok:
                    self.expect.append((qpn, r))
                    r.consumed += 1
                else:
                    r.answered -= 1
            self.consume_cycles.append(c)
            self.cur["consume"] = None
        if self.cur["consume"] is None and self.consume_q:
            qpn, ok = self.consume_q.popleft()
            ok = int(ok or self.outstanding(qpn) > 0)
            if self.rings.get(qpn) is None:
                ok = 1                  # no receive queue: nothing counted, a record of none
            self.cur["consume"] = (qpn, ok)
            s["consume__payload"].value = pack(RecvConsume(NUM_QPS), qpn=qpn, ok=ok)
        s["consume__valid"].value = int(self.cur["consume"] is not None)
        # WQEs handed on
        if s["wqe__valid"].value == 1 and s["wqe__ready"].value == 1:
            w = unpack(RecvWqe(NUM_QPS, self.max_sge), int(s["wqe__payload"].value))
            assert self.expect, f"{self.prefix}: a WQE handed on without a consume: {w}"
            qpn, r = self.expect.popleft()
            assert w["qpn"] == qpn, f"{self.prefix}: a record of QP {w['qpn']}, expected {qpn}"
            if w["valid"]:
                self.check_wqe(r, w, c, "handed on")
            if w["empty"] and r is not None:
                n = next(k for k in (r.used + d for d in range(-64, 70000)) if (k & 0xFFFF) == w["index"] and k >= 0)
                assert not 0 < (r.head_at(max(c - self.stale_window, -1)) - n) & 0xFFFF < 0x8000, \
                    f"{self.prefix} cycle {c}: empty record for WQE {w['index']}, published before cycle " \
                    f"{c - self.stale_window}"
            if r is not None:
                r.handed += 1
                self.records.append((qpn, w))
            self.handed.append(c)
            self.wqe_cycles.append(c)
        s["wqe__ready"].value = int(self.rnd.random() < self.wqe_ready_p)
        self.respond(c)

    def check_wqe(self, r, w, c, what):
        """A WQE record with its bytes: one the GPU published, as posted."""
        index = w["index"]
        n = next((k for k in (r.used + d for d in range(-64, 70000)) if (k & 0xFFFF) == index and k >= 0), None)
        assert n is not None and 0 < (r.head_at(c) - n) & 0xFFFF < 0x8000, \
            f"{self.prefix} cycle {c}: {what} WQE {index}, not published"
        sges = r.wqes[n]
        bad = len(sges) > self.max_sge
        got = [unpack(RecvSge, w["sge"] >> (128 * j)) for j in range(w["nsge"])]
        got = [(g["addr"], g["length"], g["lkey"]) for g in got]
        assert (w["bad"], got) == (int(bad), sges[:self.max_sge]), \
            f"{self.prefix} cycle {c}: {what} WQE {index}: {w['bad'], got}, expected {bad, sges[:self.max_sge]}"
        assert w["sge"] >> (128 * w["nsge"]) == 0, f"{self.prefix}: segments beyond nsge not zero"

    def respond(self, c):
        """The responder: decide on the oldest record (lookups as needed), send syncs."""
        s = self.sig
        if self.cur_sync is not None and s["sync__ready"].value == 1:
            self.cur_sync = None
        if self.cur_sync is None and self.syncs:
            self.cur_sync = self.syncs.popleft()
            s["sync__payload"].value = self.cur_sync << 1          # Pair: second = 0, p[0]
        s["sync__valid"].value = int(self.cur_sync is not None)
        found = None
        if self.lookup_state == "asked" and s["found__valid"].value == 1:
            found = unpack(RecvWqe(NUM_QPS, self.max_sge), int(s["found__payload"].value))
            self.lookup_state = None
        if s["lookup__valid"].value == 1 and s["lookup__ready"].value == 1:
            self.lookup_state = "asked"
        s["lookup__valid"].value = 0
        if not self.records:
            return
        qpn, w = self.records[0]
        r = self.rings[qpn]
        if found is not None:
            assert found["qpn"] == qpn and found["index"] == r.used & 0xFFFF, f"{self.prefix}: found {found}"
            if found["valid"]:
                self.check_wqe(r, found, c, "found")
            use = found["valid"]
        elif w["valid"] and w["index"] == r.used & 0xFFFF:
            use = True
        elif w["empty"] and w["index"] == r.used & 0xFFFF:
            use = False                 # its WQE is not posted: RNR, no lookup
            self.empties += 1
        elif self.lookup_state is None and self.rnd.random() >= self.reject_p:
            # not the WQE to use: look it up once every sync has been applied
            if self.cur_sync is None and not self.syncs and s["sync_idle"].value == 1:
                s["lookup__valid"].value = 1
                s["lookup__payload"].value = pack(RecvLookup(NUM_QPS), qpn=qpn, index=r.used & 0xFFFF)
            return
        elif self.lookup_state is not None:
            return
        else:
            use = False                 # rejected (a duplicate)
        if use and self.rnd.random() < self.reject_p:
            use = False
        self.records.popleft()
        used_before = r.used
        r.used += int(bool(use))
        if w["empty"]:                  # it did not move the numbering
            aligned = not use and w["index"] == used_before & 0xFFFF
        else:
            aligned = (w["index"] == used_before & 0xFFFF) if use else ((w["index"] + 1) & 0xFFFF == used_before & 0xFFFF)
        correct = w["gen"] == r.gen and not aligned
        self.lookups += found is not None
        if correct:
            r.gen ^= 1
            self.corrections += 1
        if use or correct:
            self.syncs.append(pack(RecvSync(NUM_QPS), qpn=qpn, committed=r.used & 0xFFFF, index=w["index"],
                                   correct=int(correct), empty=w["empty"]))

    def check_answer(self, qpn, taken, c, available):
        r = self.rings.get(qpn)
        if r is None:
            assert available == 0, f"{self.prefix}: QP {qpn} has no receive queue but answered available"
            self.answers.append((qpn, 0))
            self.rnr += 1
            if self.auto_consume:
                self.consume_q.append((qpn, 1))
            return
        if available:
            assert 0 < (r.head_at(c) - r.used) & 0xFFFF < 0x8000, \
                f"{self.prefix} cycle {c}: QP {qpn} answered available, head {r.head_at(c)} used {r.used}"
            if not 0 < (r.head_at(taken) - r.answered) & 0xFFFF < 0x8000:
                self.revealed += 1      # posted after the query was taken: a fresh read found it
        else:
            self.rnr += 1
        r.answered += int(bool(available))     # an unavailable answer numbers nothing
        r.reserved += 1
        if self.auto_consume:
            self.consume_q.append((qpn, 1))
        self.answers.append((qpn, available))


async def start(dut, seed=0):
    """Clock, reset, and the two instances' environments (every input driven)."""
    envs = {p: Env(dut, p, random.Random(seed + k)) for k, p in enumerate("ab")}
    cocotb.start_soon(Clock(dut.clk, 2, unit="ns").start())
    dut.rst.value = 1
    for _ in range(3):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    for _ in range(NUM_QPS + 2):        # the RecvQueue walks its per-QP rows after reset
        await RisingEdge(dut.clk)
    return envs


async def run_cycles(envs, counter, n, until=None):
    """Step ``envs`` for up to ``n`` edges (stop early once ``until()`` is true)."""
    clk = envs[0].dut.clk
    for _ in range(n):
        await RisingEdge(clk)
        for e in envs:
            e.step(counter[0])
        counter[0] += 1
        if until is not None and until():
            return True
    return until is None


def quiet(env):
    return not (env.query_q or env.consume_q or env.create_q or env.queries or env.expect
                or any(env.cur.values()) or env.records or env.syncs or env.cur_sync is not None
                or env.lookup_state is not None)


# ---- tests ----------------------------------------------------------------------------------

@cocotb.test()
async def random_traffic(dut):
    """Both instances: random posts (batched doorbells), queries of every QP (one never
    created, one created without a receive queue), every answer consumed, one record in
    eight rejected (a duplicate's: the numbering corrected, the WQE looked up later), wqe
    ready at random, 100-500 cycles of read latency; two QPs re-created midway (one on its
    old doorbell record). Every answer, record and WQE found checked; in the end every WQE
    published is used, in order."""
    envs = list((await start(dut, 1)).values())
    rnd = random.Random(11)
    envs[0].axi.latency = lambda: rnd.randint(100, 500)
    envs[1].axi.latency = lambda: rnd.randint(10, 60)     # b has one slot per QP: kept short
    counter = [0]
    for e in envs:
        e.wqe_ready_p = 0.8
        e.reject_p = 0.125
        e.create(6, None, enable=0)                     # 7 never created
        for qpn in range(6):
            e.create(qpn, e.new_ring(rnd.choice([0, 1, 3, 5, 6, 6]), rnd.choice([4, 5, 6, 7, 8, 9])))
        e.recreate = []
    await run_cycles(envs, counter, 20)
    for step in range(8000):
        for e in envs:
            er = e.rnd
            live = [q for q in range(NUM_QPS) if e.rings.get(q) is not None and q not in e.blocked]
            # the GPU: posts, doorbell records written now or a little later
            if er.random() < 0.2:
                q = er.choice(live)
                for _ in range(er.randint(1, 6)):
                    e.post(q, publish=er.random() < 0.7, cycle=counter[0])
            if er.random() < 0.05:
                e.publish(er.choice(live), counter[0])
            # the responder's queries (any QP but those being re-created)
            if len(e.query_q) < 2 and er.random() < 0.5:
                posted = [x for x in live if e.rings[x].head_at(counter[0]) - e.rings[x].answered > 0]
                q = er.choice(posted) if posted and er.random() < 0.9 else er.randrange(NUM_QPS)
                if q not in e.blocked and q not in e.recreate:
                    e.query_q.append(q)
            if step in (3000, 5500):
                e.recreate += [0, 1] if step == 3000 else [2]
            for q in list(e.recreate):
                # re-created once idle (QP 0 on its old doorbell record), queries held back meanwhile
                if e.idle(q):
                    old = e.rings[q]
                    e.blocked.add(q)
                    e.create(q, e.new_ring(er.choice([1, 2, 4]), er.choice([4, 6, 7]),
                                           same_dbr_as=old if q == 0 else None))
                    e.recreate.remove(q)
        await run_cycles(envs, counter, 1)
    # drain: publish everything, then query until every posted WQE is used
    for e in envs:
        e.reject_p = 0.0
        for q, r in e.rings.items():
            if r is not None:
                e.publish(q, counter[0])
    for _ in range(400):
        for e in envs:
            for q, r in e.rings.items():
                if r is not None and r.used < r.head and e.outstanding(q) == 0 and not e.records:
                    e.query_q.append(q)
        if await run_cycles(envs, counter, 50, until=lambda: all(
                quiet(e) and all(r is None or r.used == r.head for r in e.rings.values()) for e in envs)):
            break
    for e in envs:
        assert quiet(e), f"{e.prefix}: not drained: {len(e.queries)} queries, {len(e.records)} records, {counter[0]}"
        lost = {q: (r.used, r.head) for q, r in e.rings.items() if r is not None and r.used != r.head}
        assert not lost, f"{e.prefix}: WQEs posted but never used: {lost}"
        n1 = sum(a for _, a in e.answers)
        dut._log.info(f"{e.prefix}: {len(e.answers)} answers ({n1} available, {e.rnr} RNR, {e.revealed} found "
                      f"by a fresh read), {len(e.handed)} records handed on, {e.lookups} lookups, "
                      f"{e.corrections} corrections, {e.empties} empty records, {len(e.axi.reads)} reads, "
                      f"{e.axi.in_flight_max} in flight at most, {counter[0]} cycles")
    for e in envs:
        n1 = sum(a for _, a in e.answers)
        assert n1 > 100 and e.rnr > 10 and len(e.handed) > 100 and e.corrections > 10 and e.lookups > 5 \
            and e.empties > 10, \
            "too little traffic"


@cocotb.test()
async def post_seen_by_later_query(dut):
    """Nothing posted: RNR after a read of the doorbell record (an empty record, RNR
    NAKed without a lookup); the next query at once (armed: the record is polled); after a
    round trip without queries the poll stops and a query waits for a read again. One WQE
    posted: the next query finds it and it is used, the one after is RNR; three posted:
    three available, then RNR; a recreate on the old doorbell record starts from 0."""
    e, counter, ring = await _one_qp(dut, 3, 150, 3, 2, 6)

    async def ask(q):
        n = len(e.answers)
        e.query_q.append(q)
        assert await run_cycles([e], counter, 2000, until=lambda: len(e.answers) > n and quiet(e))
        return e.answers[-1][1]

    t0 = counter[0]
    assert await ask(3) == 0
    assert counter[0] - t0 >= 150, "an RNR answer without reading the doorbell record"
    t0 = counter[0]
    assert await ask(3) == 0
    assert counter[0] - t0 < 20, f"armed, answered after {counter[0] - t0} cycles"
    assert e.rings[3].used == 0 and e.lookups == 0 and e.empties == 2
    await run_cycles([e], counter, 400)         # no query while a poll read was out: disarmed
    t0 = counter[0]
    assert await ask(3) == 0
    assert counter[0] - t0 >= 150, "an RNR answer without reading the doorbell record, the poll over"
    await run_cycles([e], counter, 400)
    e.post(3, cycle=counter[0])
    assert await ask(3) == 1
    assert e.rings[3].used == 1
    assert await ask(3) == 0
    await run_cycles([e], counter, 400)
    for _ in range(3):
        e.post(3, cycle=counter[0])
    assert [await ask(3) for _ in range(4)] == [1, 1, 1, 0]
    assert e.rings[3].used == 4
    # a recreate clears everything: the old record reads 0 again
    e.create(3, e.new_ring(1, 4, same_dbr_as=ring))
    await run_cycles([e], counter, 10)
    assert await ask(3) == 0
    await run_cycles([e], counter, 400)
    e.post(3, [(0x1234, 8, 0x77)], cycle=counter[0])
    assert await ask(3) == 1
    assert e.rings[3].used == 1


@cocotb.test()
async def rnr_flood_answered_at_once(dut):
    """Queries back to back on a QP with nothing posted (150 cycles a read): the first waits
    for a read, the rest are answered one a cycle from the polled record (empty records, no
    lookup, no correction); a WQE posted midway is found within two read round trips and
    used, the queries after it RNR again. Before the poll every such query waited for a read
    of its own (about 150 cycles each)."""
    e, counter, _ = await _one_qp(dut, 5, 150, 4, 3, 5)
    n = 400
    e.query_q.extend([4] * n)
    assert await run_cycles([e], counter, 200, until=lambda: len(e.answers) >= 1)
    first = counter[0]
    posted_at = None
    while len(e.answers) < n:
        await run_cycles([e], counter, 1)
        if posted_at is None and len(e.answers) >= 100:
            posted_at = counter[0]
            e.post(4, cycle=counter[0])
        assert counter[0] - first < 3 * n, f"{len(e.answers)} of {n} answered in {counter[0] - first} cycles"
    assert await run_cycles([e], counter, 2000, until=lambda: quiet(e))
    took = e.answer_cycles[-1] - e.answer_cycles[1]
    hits = [c for (q, a), c in zip(e.answers, e.answer_cycles) if a]
    dut._log.info(f"{n - 1} queries after the first answered in {took} cycles; the post at cycle {posted_at} "
                  f"found at {hits}, {e.empties} empty records, {e.lookups} lookups, {e.corrections} corrections")
    assert took <= n + 20, f"{n - 1} queries answered in {took} cycles: not one a cycle"
    assert len(hits) == 1 and hits[0] - posted_at <= 2 * 150 + 60, f"post at {posted_at}, found at {hits}"
    assert e.rings[4].used == 1 and e.lookups == 0 and e.corrections == 0 and e.empties == n - 1


async def _one_qp(dut, seed, latency, qpn, log_size, log_stride):
    """Instance ``a`` (``seed``, ``latency`` cycles a read) with QP ``qpn`` created on a ring
    of ``1 << log_size`` WQEs of ``1 << log_stride`` bytes, 10 cycles on: (env, counter, ring)."""
    e = (await start(dut, seed))["a"]
    e.axi.latency = lambda: latency
    counter = [0]
    ring = e.new_ring(log_size, log_stride)
    e.create(qpn, ring)
    await run_cycles([e], counter, 10)
    return e, counter, ring


async def _rings_posted(e, counter, posts):
    """Every QP created on a ring of 16 WQEs of 32 bytes, then ``posts(q)`` WQEs posted on
    QP q; returns the QPs."""
    qps = list(range(NUM_QPS))
    for q in qps:
        e.create(q, e.new_ring(4, 5))
    await run_cycles([e], counter, 12)
    for q in qps:
        for _ in range(posts(q)):
            e.post(q, cycle=counter[0])
    return qps


@cocotb.test()
async def fresh_qps_overlap(dut):
    """A query each on 8 QPs whose posts are not known yet (WQEs posted on 7, none on QP 5),
    back to back, 200 cycles of read latency: the answers in query order, QP 5's RNR; the
    record reads overlap, so all are answered within three read round trips (the first
    query's read, the others' issued behind it, QP 5's own read once it is first). With
    one read after another (the queries behind a waiting one not taken) it took 8 round
    trips and more."""
    e = (await start(dut, 7))["a"]
    latency = 200
    e.axi.latency = lambda: latency
    counter = [0]
    qps = await _rings_posted(e, counter, lambda q: 0 if q == 5 else 3)
    await run_cycles([e], counter, 4)
    t0 = counter[0]
    e.query_q.extend(qps)
    assert await run_cycles([e], counter, 20 * latency, until=lambda: len(e.answers) == len(qps))
    took = e.answer_cycles[-1] - t0
    assert e.answers == [(q, int(q != 5)) for q in qps], e.answers
    dut._log.info(f"{len(qps)} queries on QPs not known yet answered in {took} cycles ({latency} a read)")
    assert took <= 3 * latency + 40, f"{len(qps)} queries took {took} cycles: their record reads did not overlap"
    assert await run_cycles([e], counter, 10 * latency, until=lambda: quiet(e))


@cocotb.test()
async def reset_mid_life(dut):
    """A reset while QPs hold chunks of the pool and WQEs are known and prefetched (instance
    ``a``: 8 QPs, 16 WQEs posted each, 6 used), then 7 QPs created again on new rings (QP 7
    not): QP 7 answers that it has no receive queue, and each re-created QP's 24 WQEs are
    used once, in order, with their own bytes. Without the walk of the per-QP rows after
    reset (RAM keeps its contents) the rows of the life before still count: QP 7 answers
    from its old ring, and the re-creates give back chunks the reset pool has free again."""
    e = (await start(dut, 9))["a"]
    e.axi.latency = lambda: 120
    counter = [0]
    for q in range(NUM_QPS):
        e.create(q, e.new_ring(5, 6))
    assert await run_cycles([e], counter, 200, until=lambda: quiet(e))
    for q in range(NUM_QPS):
        for _ in range(16):
            e.post(q, cycle=counter[0])
    e.query_q.extend(q for _ in range(6) for q in range(NUM_QPS))
    assert await run_cycles([e], counter, 20_000, until=lambda: quiet(e))
    await run_cycles([e], counter, 400)             # prefetches land, nothing in flight
    assert quiet(e) and not e.axi.q, "traffic still in flight before the reset"
    dut.rst.value = 1
    await ClockCycles(dut.clk, 3)
    dut.rst.value = 0
    await ClockCycles(dut.clk, NUM_QPS + 2)
    e = Env(dut, "a", random.Random(21), latency=lambda: 120)
    e.next_base += 0x10_0000                         # new rings and doorbell records
    e.next_dbr += 0x1000
    counter = [0]
    for q in range(NUM_QPS - 1):
        e.create(q, e.new_ring(5, 6))
    assert await run_cycles([e], counter, 200, until=lambda: quiet(e))
    e.query_q.append(NUM_QPS - 1)
    assert await run_cycles([e], counter, 2000, until=lambda: quiet(e))
    assert e.answers == [(NUM_QPS - 1, 0)], f"QP {NUM_QPS - 1} (not created since the reset): {e.answers}"
    for q in range(NUM_QPS - 1):
        for _ in range(24):
            e.post(q, cycle=counter[0])
    e.query_q.extend(q for _ in range(24) for q in range(NUM_QPS - 1))
    assert await run_cycles([e], counter, 60_000, until=lambda: quiet(e)), "hung after the reset"
    assert [e.rings[q].used for q in range(NUM_QPS - 1)] == [24] * (NUM_QPS - 1)


async def _throughput(dut, e, depth, n_per_qp, latency):
    prefix = e.prefix
    e.axi.latency = lambda: latency
    e.auto_consume = False
    counter = [0]
    qps = await _rings_posted(e, counter, lambda q: 16)
    # one query per QP: each reads its record (16 known), the hint prefetches depth WQEs
    e.query_q.extend(qps)
    assert await run_cycles([e], counter, 5000, until=lambda: len(e.answers) == len(qps) and not e.queries)
    e.consume_q.extend((q, 0) for q in qps)       # given back: their WQEs for the consumes below
    assert await run_cycles([e], counter, 100, until=lambda: quiet(e))
    await run_cycles([e], counter, 3 * latency)
    reads0 = len(e.axi.reads)
    # queries back to back: all answered from what is known
    e.query_q.extend(q for _ in range(n_per_qp - 1) for q in qps)
    n = len(e.query_q)
    t0 = counter[0]
    assert await run_cycles([e], counter, 100_000, until=lambda: not e.query_q and not e.queries and not e.cur["query"])
    q_cycles = e.answer_cycles[-1] - e.answer_cycles[-n] + 1
    assert all(a for _, a in e.answers)
    # consumes back to back
    e.consume_q.extend((q, 1) for _ in range(n_per_qp - 1) for q in qps)
    m = len(e.consume_q)
    lookups0 = e.lookups
    assert await run_cycles([e], counter, 200_000, until=lambda: quiet(e))
    c_cycles = e.wqe_cycles[-1] - e.consume_cycles[-m] + 1
    u_cycles = counter[0] - e.consume_cycles[-m]
    assert all(e.rings[q].used == n_per_qp - 1 for q in qps)
    dut._log.info(f"{prefix} (depth {depth}): {n} queries answered in {q_cycles} cycles, {m} records handed on "
                  f"in {c_cycles} cycles from the first consume, all used after {u_cycles} "
                  f"({e.lookups - lookups0} lookups, {len(e.axi.reads) - reads0} reads meanwhile)")
    return n, q_cycles, m, c_cycles, u_cycles, e.lookups - lookups0


@cocotb.test()
async def throughput(dut):
    """8 QPs, 16 WQEs posted each. After one query per QP (its record read, the WQEs known;
    given back) and time to prefetch: 56 queries back to back are answered one a cycle, and
    56 consumes back to back hand on 56 WQEs in 56 + 6 cycles with prefetch (depth 32: all
    on chip, none looked up). With one slot per QP (depth 0) a QP's next WQE is fetched
    only once the one before is committed: a read (100 cycles here) per WQE of a QP."""
    envs = await start(dut, 5)
    latency = 100
    n, qa, m, ca, ua, la = await _throughput(dut, envs["a"], DEPTH_A, PER_QP, latency)
    assert qa <= n + 4, f"{n} queries took {qa} cycles"
    assert ca <= m + 6, f"{m} prefetched WQEs took {ca} cycles"
    assert la == 0, f"{la} lookups with every WQE on chip"
    n, qb, m, cb, ub, lb = await _throughput(dut, envs["b"], 0, PER_QP, latency)
    assert qb <= n + 4
    assert ub >= (PER_QP - 2) * latency, f"with one slot per QP {m} WQEs took only {ub} cycles"
    dut._log.info(f"prefetch saves {ub - ua} cycles on {m} WQEs")


@cocotb.test()
async def counter_wrap(dut):
    """One QP, a 32-WQE ring of 16-byte WQEs, 66,000 WQEs posted in batches, queried and
    consumed: the 16-bit counters (and the doorbell record's head) wrap past 2^16."""
    e, counter, _ = await _one_qp(dut, 9, 6, 2, 5, 4)
    total = 66_000
    r = None
    while True:
        r = e.rings.get(2)
        if r is not None:
            break
        await run_cycles([e], counter, 1)
    while r.used < total:
        if r.head < total and r.head - r.used < r.size - 4:
            while r.head < total and e.post(2, [(r.head, 1, 0x1000 + (r.head & 0xFF))] if r.head % 3 else [],
                                            publish=False):
                pass
            e.publish(2, counter[0])
        if len(e.query_q) < 2 and e.outstanding(2) < 4 and r.answered - r.used < 8 and r.answered < total:
            e.query_q.append(2)
        await run_cycles([e], counter, 1)
    assert r.used == total
    dut._log.info(f"{total} WQEs in {counter[0]} cycles, {e.rnr} RNR answers")
