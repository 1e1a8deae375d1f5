"""An NVSHMEM-like device API on the GPU model: warps (cocotb tasks) that run programs.

Each processing element (PE) is one GPU and its RTL NIC (a ``tb.env.NicEnv`` of a
multi-engine top level). A warp calls ``put``, ``put_nbi``, ``p``, ``p_warp``, ``get``,
``g``, ``atomic``, ``signal_op``, ``put_signal``, ``quiet``, ``fence`` and ``barrier``;
the PE posts them the way NVSHMEM's IBGDA device code does (../shared/VERBS.md):

* a warp's lanes post together: one submission of one WQE per active lane (or one
  warp-wide inline WRITE and its NOP for ``p_warp``);
* the submission reserves WQEBBs with an atomic on the QP's ``resv_head``, writes its
  WQEs, waits until every earlier submission on the QP is marked ready (in order, an atomic
  per step on ``ready_head``), marks its own, and rings the doorbell when it is the newest
  submission or its QP has gathered 32 unrung requests: under the QP's post_send lock,
  the doorbell record, a fence and the 8-byte UAR store, which reaches the NIC
  ``pcie_ns`` later (posted stores of one GPU arrive in order);
* the last WQE of every submission is signaled; each QP has its own collapsed CQ, polled
  in slot 0 (``quiet``: every QP this PE used, up to its ready head).

Every step costs the time ``spec.costs.GpuCosts`` gives it. Through ``path="ibrc"`` or
``"ibrc_mt"`` the same calls go to a CPU proxy (``tb/proxy.py``) instead, which posts on
the same QPs of the same engine.

Symmetric memory: every PE has the same heap at ``SYM_BASE`` (``Job.alloc`` returns an
offset valid on all), registered under ``SYM_KEY`` for remote write, read and atomics.
"""
from collections import defaultdict
from dataclasses import dataclass, field

import cocotb
from cocotb.triggers import Event, Lock, Timer

from spec import costs as C
from spec import formats as F
from spec import params as P
from spec.formats import CQE64, Access, CqeOp, unpack
from tb.gpu import Qp, be32

SYM_BASE = 0x4_0000_0000
SYM_BYTES = 1 << 28
SYM_KEY = (0x0C << 8) | 0x5D
PD = 3
LANES = 32
DB_BATCH = 32                   # NVSHMEM rings at least every 32 requests of a QP
NVSHMEM_WQEBBS = 2              # NVSHMEM's largest WQE: the masked atomics' 2 WQEBBs
                                # (NVSHMEM_IBGDA_NUM_REQUESTS_IN_BATCH)
SCRATCH_BYTES = 256             # NVSHMEM's scratch slot per outstanding fetching operation


def cycles(ns):
    """Whole cycles of ``ns`` (at least one when ns > 0)."""
    return 0 if ns <= 0 else max(1, round(ns / P.CLOCK_PERIOD_NS))


async def spend(ns):
    """Let ``ns`` pass (rounded to whole cycles; one timer, not a wait per edge)."""
    n = cycles(ns)
    if n:
        await Timer(n * P.CLOCK_PERIOD_NS, "ns")


class NvshmemError(Exception):
    """An error CQE (NVSHMEM treats REQ_ERR as fatal) or a wait that timed out."""


@dataclass
class Breakdown:
    """Where a PE's posting time went (ns summed over submissions)."""
    reserve: float = 0.0
    write: float = 0.0
    ready_wait: float = 0.0
    ready: float = 0.0
    doorbell: float = 0.0
    submissions: int = 0
    doorbells: int = 0
    wqes: int = 0


@dataclass(eq=False)
class SharedQp:
    """NVSHMEM's per-QP device state (``resv_head``, ``ready_head``, the post_send lock)
    around a ``tb.gpu.Qp``; ``peer`` is the remote PE."""
    qp: object
    peer: int
    ready: int = 0                  # ready_head, WQEBBs
    rung: int = 0                   # the head the last doorbell carried
    unrung: int = 0                 # requests ready since that doorbell
    last_index: int = -1            # 16-bit index of the newest ready WQE (signaled)
    cons: int = 0                   # WQEBBs known complete (from the CQ)
    ends: dict = field(default_factory=dict)        # WQE index -> WQEBB count after it
    ready_event: Event = field(default_factory=Event)
    lock: Lock = field(default_factory=Lock)
    cq_counter: int | None = None   # wqe_counter last seen in slot 0


class Pe:
    """One PE: a GPU (its warps post) and the NIC it drives.

    Parameters
    ----------
    job : the :class:`Job`. index : PE number. nic : its ``tb.env.NicEnv``.
    """
    def __init__(self, job, index, nic):
        self.job, self.index, self.nic = job, index, nic
        self.costs = job.gpu_costs
        self.qps = defaultdict(list)            # peer -> [SharedQp]
        self.used = set()                       # SharedQp this PE posted on (quiet's list)
        self.breakdown = Breakdown()
        self.proxy = None
        self.barrier_round = 0
        self._db_queue = []                     # posted UAR stores in flight: (due cycle, qpn, data)
        self._db_wake = Event()
        self._db_task = None

    # ---- memory ---------------------------------------------------------------------
    def addr(self, off):
        return SYM_BASE + off

    def read(self, off, n):
        return self.nic.mem.read(SYM_BASE + off, n)

    def write(self, off, data):
        self.nic.mem.write(SYM_BASE + off, bytes(data))

    def read_u64(self, off):
        return int.from_bytes(self.read(off, 8), "little")

    def now(self):
        return self.nic.counter.now

    # ---- QP choice ----------------------------------------------------------------------
    def qp_for(self, warp, peer):
        """NVSHMEM maps a warp's operations to one of the QPs to ``peer`` by its id."""
        if peer == self.index or peer not in self.qps:
            raise ValueError(f"PE {self.index} has no QP to PE {peer!r}")
        qs = self.qps[peer]
        return qs[warp % len(qs)]

    # ---- the posted-store queue: MMIO doorbells reach the NIC pcie_ns after issue, in order ----
    def _post_doorbell(self, qpn, data8, delay_ns=None):
        """A posted UAR store: it reaches the NIC ``delay_ns`` (default ``pcie_ns``) later,
        after every store posted before it."""
        delay = self.costs.pcie_ns if delay_ns is None else delay_ns
        self._db_queue.append((self.now() + cycles(delay), qpn, data8))
        self._db_wake.set()
        if self._db_task is None:
            self._db_task = cocotb.start_soon(self._deliver_doorbells())

    async def _deliver_doorbells(self):
        while True:
            if not self._db_queue:
                self._db_wake.clear()
                await self._db_wake.wait()
                continue
            due, qpn, data8 = self._db_queue[0]
            if due > self.now():
                await Timer((due - self.now()) * P.CLOCK_PERIOD_NS, "ns")
            self._db_queue.pop(0)
            await self.nic.gpu.doorbell(qpn, data8)

    # ---- submission (IBGDA) -------------------------------------------------------------
    async def submit(self, sq, builds, nwqebbs):
        """Post one submission on ``sq``: ``builds`` holds one callable a lane (or a
        request), ``build(qp, signaled)`` writing its WQEs and returning them, ``nwqebbs``
        in all; only the last lane's last WQE is signaled. Returns the WQEs. Through a
        proxy path each build is one request to the CPU instead (each signaled)."""
        self.used.add(sq)
        if self.proxy is not None:
            for build in builds:
                await self.proxy.request(self, sq, build)
            return []
        c, b = self.costs, self.breakdown
        t0 = self.now()
        await spend(c.atomic_ns)                       # atomicAdd on resv_head
        await self._room(sq, nwqebbs)                  # no wait from its last check to the reservation
        qp = sq.qp
        base = qp.pi
        wqes, width = [], 0
        for i, build in enumerate(builds):
            lane = build(qp, i == len(builds) - 1)
            width = max(width, sum(w.nwqebbs for w in lane))
            wqes += lane
        end = qp.pi
        assert end - base == nwqebbs, (end - base, nwqebbs)
        t1 = self.now()
        await spend(c.wqe_write_ns * width)            # the lanes write their WQEs at once
        t2 = self.now()
        while sq.ready != base:                        # earlier submissions first
            await sq.ready_event.wait()
        t3 = self.now()
        await spend(c.atomic_ns)                       # the CAS that marks ours ready
        sq.ready = end
        sq.unrung += len(builds)
        sq.last_index = wqes[-1].index
        for w in wqes:
            sq.ends[w.index] = w.index + w.nwqebbs
        ev, sq.ready_event = sq.ready_event, Event()
        ev.set()
        t4 = self.now()
        if qp.pi == end or sq.unrung >= self.job.db_batch:   # newest, or a batch gathered (or is one)
            await self._ring(sq)
        t5 = self.now()
        ns = P.CLOCK_PERIOD_NS
        b.reserve += (t1 - t0) * ns
        b.write += (t2 - t1) * ns
        b.ready_wait += (t3 - t2) * ns
        b.ready += (t4 - t3) * ns
        b.doorbell += (t5 - t4) * ns
        b.submissions += 1
        b.wqes += len(wqes)
        return wqes

    async def _ring(self, sq):
        c = self.costs
        async with sq.lock:
            await spend(c.atomic_ns)                   # the post_send lock
            if sq.ready == sq.rung:
                return
            pi = sq.ready
            sq.rung, sq.unrung = pi, 0
            self.nic.mem.write(sq.qp.dbr_addr, be32(pi & 0xFFFF))
            await spend(c.store_ns + c.fence_ns)
            self._post_doorbell(sq.qp.qpn, be32((pi & 0xFFFF) << 8) + be32(sq.qp.qpn << 8))
            await spend(c.mmio_issue_ns)
            self.breakdown.doorbells += 1

    async def _room(self, sq, n):
        """Wait (polling the QP's CQ) until ``n`` WQEBBs are free in its ring. The caller
        reserves them at once after this returns (no await in between), so no other
        warp can take them first."""
        while sq.qp.pi + n - sq.cons > sq.qp.depth:
            self.poll_cq(sq)
            if sq.qp.pi + n - sq.cons <= sq.qp.depth:
                return
            await spend(self.costs.poll_ns)

    def poll_cq(self, sq):
        """Read slot 0 of the QP's collapsed CQ once; advance ``cons``; raise on an error."""
        raw = self.nic.mem.read(sq.qp.cq.base, 64)
        f = unpack(CQE64, raw)
        op = f["op_own"] >> 4
        if op == CqeOp.INVALID:
            return None
        if op in (CqeOp.REQ_ERR, CqeOp.RESP_ERR):
            raise NvshmemError(f"PE {self.index} QP {sq.qp.qpn}: error CQE, syndrome {f['syndrome']:#x} "
                               f"at WQE {f['wqe_counter']:#x}")
        k = f["wqe_counter"]
        if k != sq.cq_counter:
            sq.cq_counter = k
            end = sq.ends.get(k, k + 1)
            # unwrap the 16-bit index against the producer index
            sq.cons = sq.qp.pi - ((sq.qp.pi - end) & 0xFFFF)
        return k

    def done(self, sq):
        """True when the newest ready WQE of ``sq`` has completed."""
        if self.proxy is not None:
            return self.proxy.done(sq)
        if sq.last_index < 0:
            return True
        k = self.poll_cq(sq)
        return k is not None and (k - sq.last_index) & 0xFFFF < 0x8000

    # ---- the device API ---------------------------------------------------------------------
    async def p(self, warp, peer, offs, values, width=8):
        """nvshmem_p from the warp's lanes: lane i stores ``values[i]`` (``width`` bytes) at
        ``offs[i]`` of ``peer``, each an inline WRITE (NVSHMEM inlines up to 12 bytes)."""
        if len(offs) != len(values) or not 1 <= len(offs) <= LANES:
            raise ValueError(f"p takes 1..{LANES} lanes of (offset, value)")
        addr = self.job.addr

        def lane(o, d):
            return lambda qp, sig: [qp.post_write(addr(peer, o), SYM_KEY, inline=d, signaled=sig)]
        return await self.submit(self.qp_for(warp, peer),
                                 [lane(o, int(v).to_bytes(width, "little")) for o, v in zip(offs, values)], len(offs))

    async def p_warp(self, warp, peer, off, values, width=8):
        """Warp-wide p: 32 values of ``width`` bytes in one unsignaled inline WRITE plus a
        signaled NOP (one submission of 2, 2, 3 or 5 WQEBBs and the NOP's one)."""
        n = -(-(1 + 1 + -(-(4 + LANES * width) // 16)) // 4) + 1
        return await self.submit(self.qp_for(warp, peer), [
            lambda qp, sig: list(qp.put_warp_p(self.job.addr(peer, off), SYM_KEY, values, width))], n)

    async def put_nbi(self, warp, peer, lanes):
        """nvshmem_put_nbi from the warp's lanes: ``lanes`` = [(dst_off, src_off, nbytes)],
        each an RDMA WRITE of the local symmetric buffer into ``peer``'s."""
        if not 1 <= len(lanes) <= LANES:
            raise ValueError(f"put_nbi takes 1..{LANES} lanes")

        def lane(d, s_, n):
            return lambda qp, sig: [qp.post_write(self.job.addr(peer, d), SYM_KEY, local_addr=self.addr(s_), length=n,
                                                  lkey=SYM_KEY, signaled=sig)]
        return await self.submit(self.qp_for(warp, peer), [lane(*x) for x in lanes], len(lanes))

    async def put(self, warp, peer, dst, src, nbytes):
        """nvshmem_put: put_nbi, then quiet."""
        await self.put_nbi(warp, peer, [(dst, src, nbytes)])
        await self.quiet(warp)

    async def get_nbi(self, warp, peer, lanes):
        """nvshmem_get_nbi: lanes of (dst_off here, src_off at peer, nbytes), RDMA READs."""
        def lane(d, s_, n):
            return lambda qp, sig: [qp.post_read(self.job.addr(peer, s_), SYM_KEY, self.addr(d), n, lkey=SYM_KEY,
                                                 signaled=sig)]
        return await self.submit(self.qp_for(warp, peer), [lane(*x) for x in lanes], len(lanes))

    async def get(self, warp, peer, dst, src, nbytes):
        """nvshmem_get: get_nbi, then quiet."""
        await self.get_nbi(warp, peer, [(dst, src, nbytes)])
        await self.quiet(warp)

    async def g(self, warp, peer, src):
        """nvshmem_g: an 8-byte READ into a scratch slot; returns the value."""
        slot = self.job.scratch(self.index)
        await self.get(warp, peer, slot, src, 8)
        return self.read_u64(slot)

    async def atomic(self, warp, peer, op, off, value=0, compare=0, nbytes=8):
        """An NVSHMEM atomic (``tb.gpu.Qp.NVSHMEM_AMO``) on ``peer``'s word at ``off``;
        the fetching ones (and compare_swap, swap) quiet and return the original value."""
        slot = self.job.scratch(self.index)
        # the 8-byte masked compare-swap forms take 2 WQEBBs and a NOP (tb.gpu.Qp.nvshmem_amo)
        two = nbytes == 8 and Qp.NVSHMEM_AMO[op][0] == "CS" and op != "compare_swap"
        await self.submit(self.qp_for(warp, peer), [
            lambda qp, sig: qp.nvshmem_amo(op, nbytes, self.job.addr(peer, off), SYM_KEY, value, compare,
                                           local_addr=self.addr(slot), lkey=SYM_KEY)], 3 if two else 1)
        if op.startswith("fetch") or op in ("compare_swap", "swap"):
            await self.quiet(warp)
            return int.from_bytes(self.read(slot, nbytes), "little")
        return None

    async def signal_op(self, warp, peer, sig_off, value, sig_op="add"):
        """nvshmemx_signal_op: an 8-byte signal add (masked fetch-add) or set (masked
        compare-swap and its NOP)."""
        slot = self.job.scratch(self.index)
        return await self.submit(self.qp_for(warp, peer), [
            lambda qp, sig: qp.signal_op(self.job.addr(peer, sig_off), SYM_KEY, value, sig_op,
                                         scratch=self.addr(slot), lkey=SYM_KEY)], 1 if sig_op == "add" else 3)

    async def put_signal(self, warp, peer, dst, src, nbytes, sig_off, value, sig_op="add"):
        """nvshmem_put_signal_nbi: the data WRITE, then the signal behind it on the same QP
        (one submission; one request through a proxy)."""
        slot = self.job.scratch(self.index)

        def build(qp, sig):
            put = qp.post_write(self.job.addr(peer, dst), SYM_KEY, local_addr=self.addr(src), length=nbytes,
                                lkey=SYM_KEY, signaled=False)
            return [put] + qp.signal_op(self.job.addr(peer, sig_off), SYM_KEY, value, sig_op,
                                        scratch=self.addr(slot), lkey=SYM_KEY)
        return await self.submit(self.qp_for(warp, peer), [build], 2 if sig_op == "add" else 4)

    async def quiet(self, warp=0, timeout_ns=20_000_000):
        """nvshmem_quiet: poll every QP this PE posted on until its ready WQEs completed."""
        end = self.now() + cycles(timeout_ns)
        for sq in sorted(self.used, key=lambda s: s.qp.qpn):
            while not self.done(sq):
                if self.now() > end:
                    raise NvshmemError(f"PE {self.index}: quiet timed out on QP {sq.qp.qpn}")
                await spend(self.costs.poll_ns)

    async def fence(self, warp=0):
        """nvshmem_fence: a quiet when more than one QP is in use (VERBS.md section 2)."""
        if len(self.used) > 1:
            await self.quiet(warp)

    async def wait_until(self, off, value, timeout_ns=20_000_000):
        """nvshmem_signal_wait_until(off, NVSHMEM_CMP_GE, value): poll the local word."""
        end = self.now() + cycles(timeout_ns)
        while self.read_u64(off) < value:
            if self.now() > end:
                raise NvshmemError(f"PE {self.index}: waited for word {off:#x} >= {value}, "
                                   f"it is {self.read_u64(off)}")
            await spend(self.costs.poll_ns)
        return self.now()

    async def barrier(self, warp=0):
        """nvshmem_barrier_all from one warp of each PE: quiet, a signal add on every other
        PE's barrier word, then wait until this PE's word counts every peer's."""
        await self.quiet(warp)
        self.barrier_round += 1
        for peer in self.job.peers(self.index):
            await self.signal_op(warp, peer, self.job.barrier_off, 1, "add")
        await self.wait_until(self.job.barrier_off, self.barrier_round * (self.job.npes - 1))
        await self.quiet(warp)


class Job:
    """A job of ``npes`` PEs on the NICs of a ``tb.pair_env.NicNetEnv``, each pair of PEs
    joined by ``qps_per_peer`` RC QPs (NVSHMEM creates 2 per peer by default).

    Parameters
    ----------
    env : a started ``NicNetEnv`` (``NicPairEnv``, ``NicSwitchEnv``).
    path : "ibgda", "ibrc" (one proxy thread) or "ibrc_mt" (``spec.costs.PROXY_MT``).
    gpu_costs, proxy_costs : ``spec.costs`` records (defaults: ``GPU`` and the path's proxy).
    qps_per_peer : RC QPs between each pair of PEs.
    log_depth : log2 of each send queue, in WQEBBs (NVSHMEM: 1024).
    db_batch : requests after which a submission rings even when it is not the newest
        (NVSHMEM_IBGDA_NUM_REQUESTS_IN_BATCH, 32 by default; a power of two).
    weight : the engine's scheduler weight of every QP (a turn of weight x 128 WQEBBs).
    max_wqebbs : the QPs' largest WQE, in WQEBBs (QP_MAX_WQEBBS: what a turn cut by the
        quantum reads past the cut). NVSHMEM's largest form is 2 (the masked atomics); the
        warp-wide p's inline WRITE is 5, fetched again when a cut falls in it, unless the
        job says 5.
    timeout : the QPs' ACK timeout in cycles (default ``tb.control``'s 2^20, about 2 ms, as
        a real stack's: switch queues that hold tens of us must not fire it).
    """
    def __init__(self, env, *, path="ibgda", gpu_costs=C.GPU, proxy_costs=None, qps_per_peer=2, log_depth=10,
                 mtu=4096, ack_every=8, timeout=None, db_batch=DB_BATCH, weight=1, max_wqebbs=NVSHMEM_WQEBBS):
        if db_batch < 1 or db_batch & (db_batch - 1) or db_batch > 1 << log_depth:
            raise ValueError(f"db_batch must be a power of two up to the QP depth, not {db_batch!r}")
        if not 1 <= max_wqebbs <= F.MAX_WQEBBS:
            raise ValueError(f"max_wqebbs must be 1..{F.MAX_WQEBBS}, not {max_wqebbs!r}")
        self.db_batch, self.weight, self.max_wqebbs = db_batch, weight, max_wqebbs
        if path not in C.PATHS:
            raise ValueError(f"path must be one of {C.PATHS}, not {path!r}")
        self.env, self.path, self.gpu_costs = env, path, gpu_costs
        self.proxy_costs = proxy_costs or (C.proxy_costs(path) if path != "ibgda" else None)
        self.npes = len(env.nics)
        max_q = (env.nics[0].num_qps - 1) // self.npes
        if not 1 <= qps_per_peer <= max_q:
            raise ValueError(f"qps_per_peer must be 1..{max_q} for {self.npes} PEs, not {qps_per_peer!r}")
        self.qps_per_peer, self.log_depth, self.mtu, self.ack_every, self.timeout = \
            qps_per_peer, log_depth, mtu, ack_every, timeout
        self.pes = [Pe(self, i, nic) for i, nic in enumerate(env.nics)]
        self._heap = 0
        self._scratch = defaultdict(int)
        self.barrier_off = self.alloc(64)
        self.scratch_off = self.alloc(SCRATCH_BYTES * 64)

    def peers(self, i):
        return [j for j in range(self.npes) if j != i]

    def addr(self, pe, off):
        """``off`` of the symmetric heap on PE ``pe`` (the same address on every PE)."""
        if not 0 <= off < SYM_BYTES:
            raise ValueError(f"symmetric offset {off:#x} out of the heap")
        return SYM_BASE + off

    def alloc(self, n, align=64):
        """nvshmem_malloc: an offset of ``n`` bytes valid on every PE."""
        off = (self._heap + align - 1) & ~(align - 1)
        if off + n > SYM_BYTES:
            raise ValueError(f"symmetric heap full ({SYM_BYTES} bytes)")
        self._heap = off + n
        return off

    def scratch(self, pe):
        """A scratch slot for a fetching operation's result (round robin over 64)."""
        k = self._scratch[pe]
        self._scratch[pe] = (k + 1) % 64
        return self.scratch_off + k * SCRATCH_BYTES

    def qpn(self, pe, peer, k):
        """The QP number on ``pe`` of its ``k``-th QP to ``peer``."""
        return 1 + peer * self.qps_per_peer + k

    async def start(self):
        """Register the symmetric heaps, create every QP and its collapsed CQ, start the proxies."""
        for pe in self.pes:
            await pe.nic.ctl.register_mr(SYM_KEY, SYM_BASE, SYM_BYTES, Access.LOCAL_WRITE | Access.REMOTE_WRITE
                                         | Access.REMOTE_READ | Access.REMOTE_ATOMIC, PD)
        for i in range(self.npes):
            for j in range(i + 1, self.npes):
                for k in range(self.qps_per_peer):
                    qa, qb = self.qpn(i, j, k), self.qpn(j, i, k)
                    cq_a = await self.pes[i].nic.cq(qa, 0, collapsed=True)
                    cq_b = await self.pes[j].nic.cq(qb, 0, collapsed=True)
                    a, b = await self.env.connect(i, qa, j, qb, cq_a=cq_a, cq_b=cq_b, mtu=self.mtu, pd=PD,
                                                  ack_every=self.ack_every, log_depth=self.log_depth,
                                                  weight=self.weight, max_wqebbs=self.max_wqebbs,
                                                  **({"timeout": self.timeout} if self.timeout else {}))
                    self.pes[i].qps[j].append(SharedQp(a, j))
                    self.pes[j].qps[i].append(SharedQp(b, i))
        if self.proxy_costs is not None:
            from tb.proxy import Proxy
            for pe in self.pes:
                pe.proxy = Proxy(pe, self.proxy_costs)
                pe.proxy.start()
        return self

    def run(self, programs):
        """Start ``programs`` [(pe, warp, coroutine function of (pe, warp))] as cocotb tasks."""
        return [cocotb.start_soon(fn(self.pes[pe], warp)) for pe, warp, fn in programs]
