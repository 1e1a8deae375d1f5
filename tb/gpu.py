"""GPU-side model: posts mlx5 WQEs and rings doorbells as NVSHMEM IBGDA / rdma-core do.

SPEC sections 2-4. The GPU writes WQEs, doorbell records and reads CQEs
directly in :class:`~tb.memory.DmaMemory` (instant, no bus traffic); only the
UAR doorbell stores go over the DUT's ``s_axi_db`` port.
"""

import logging
from dataclasses import dataclass

import cocotb
from cocotb.triggers import Lock, RisingEdge
from cocotbext.axi import AxiMasterWrite, AxiWriteBus

from spec.formats import (ATOMIC_FORMS, ATOMIC_SEG, CQE64, CQE_SIZE, CTRL_SEG, DATA_SEG, DS_UNIT, FENCE_FENCE, FM_CE_SE_CQ_UPDATE, INLINE_FLAG,
                          MAX_WQEBBS, OPMOD_EXT_ATOMIC_4B, OPMOD_EXT_ATOMIC_8B, RADDR_SEG, UAR_DB_OFFSET,
                          UAR_DB_OFFSET_ALT, UAR_PAGE_SHIFT, WQEBB, CqeOp, QpState, WqeOp, pack, unpack)
from spec.params import DB_DATA_BYTES

from model.frames import build_data_wqe, read_gather
from model.recv_queue import RecvPoster, RecvQueue

from .clock import ClockCycles, CycleCounter
from .memory import sig_high

HEAP_BASE = 0x1_0000_0000
WQEBB_DS = WQEBB // DS_UNIT       # 4 ds units per WQEBB
MAX_DS = 0x3F                     # ds is a 6-bit field
WRITE_CYCLE_SEARCH = 4096         # how many recent AXI writes to search for a CQE's store


def _check(name, value, lo, hi):
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo:#x}, {hi:#x}], not {value!r}")


def default_user_index(qpn):
    """The user index the testbench gives QP ``qpn`` (24 bits, never 0, differs per QP)."""
    return 0x5A0000 ^ (qpn & 0xFFFF) ^ 0x1


def be32(v):
    return (v & 0xFFFF_FFFF).to_bytes(4, "big")


# ---- records ------------------------------------------------------------------------
@dataclass
class Cqe:
    """A CQE read from GPU memory.

    Fields: opcode, owner, qpn, wqe_counter, byte_cnt, imm, syndrome,
    vendor_err_synd, raw (64 bytes), index (CQE number k for a ring CQ,
    count of changes seen for a collapsed CQ), seen_cycle (poll that found
    it), write_cycle (W handshake cycle of the AXI write that stored it, or
    None when not found in mem.writes).
    """
    opcode: int
    owner: int
    qpn: int
    wqe_counter: int
    byte_cnt: int
    imm: int
    syndrome: int
    vendor_err_synd: int
    raw: bytes
    index: int
    seen_cycle: int
    write_cycle: int | None = None
    wqe_opcode: int = 0                 # sop_drop_qpn [31:24]: the completed WQE's opcode
    user_index: int = 0                 # srqn_uidx [23:0]

    @property
    def is_error(self):
        return self.opcode in (CqeOp.REQ_ERR, CqeOp.RESP_ERR)

    @classmethod
    def parse(cls, raw, index=0, seen_cycle=0):
        f = unpack(CQE64, raw)
        return cls(opcode=f["op_own"] >> 4, owner=f["op_own"] & 1, qpn=f["sop_drop_qpn"] & 0xFF_FFFF,
                   wqe_counter=f["wqe_counter"], byte_cnt=f["byte_cnt"], imm=f["imm"], syndrome=f["syndrome"],
                   vendor_err_synd=f["vendor_err_synd"], raw=bytes(raw), index=index, seen_cycle=seen_cycle,
                   wqe_opcode=f["sop_drop_qpn"] >> 24, user_index=f["srqn_uidx"] & 0xFF_FFFF)


@dataclass
class PostedWqe:
    """A WQE the GPU wrote into a send queue.

    Fields: qpn; index (16-bit WQE index in the ctrl segment); slot (first
    WQEBB in the ring); wqe (bytes written, nwqebbs*64, zero padded); ds;
    nwqebbs; signaled; opcode; raddr; rkey; payload (bytes read from GPU memory
    at post time, or the inline bytes); length; inline; local_addr; lkey;
    post_cycle; db_cycle (W handshake cycle of the first doorbell covering it);
    segments (a gather list's ``(addr, length, lkey)`` each, in order; () otherwise:
    ``local_addr``, ``length`` and ``lkey`` are then its first segment's and its total).
    """
    qpn: int
    index: int
    slot: int
    wqe: bytes
    ds: int
    nwqebbs: int
    signaled: bool
    opcode: int
    raddr: int
    rkey: int
    payload: bytes
    length: int
    inline: bool
    local_addr: int | None
    lkey: int
    post_cycle: int
    db_cycle: int | None = None
    segments: tuple = ()


@dataclass
class Doorbell:
    """One UAR store: qpn (page), offset, data (its first 8 bytes), cycle (its last W
    handshake), bf (a 64-byte BlueFlame store carrying the WQE)."""
    qpn: int
    offset: int
    data: bytes
    cycle: int
    bf: bool = False


# ---- GPU ---------------------------------------------------------------------------
class GpuModel:
    """GPU memory allocator, doorbell writer and factory for :class:`Qp` / :class:`Cq`.

    Parameters:
        dut: DUT handle with ``s_axi_db_aw*/w*/b*``, ``clk``, ``rst``.
        mem: :class:`~tb.memory.DmaMemory` holding GPU memory.
        ctl: :class:`~tb.control.NicControl` used to create QPs and CQs.
        counter: shared :class:`~tb.clock.CycleCounter` (default: mem.counter).
        heap_base: first address the bump allocator hands out.
        poll_interval: cycles between CQ polls.
        prefix: doorbell AXI signal prefix.
    """

    def __init__(self, dut, mem, ctl, counter=None, *, heap_base=HEAP_BASE, poll_interval=16, prefix="s_axi_db"):
        if poll_interval < 1:
            raise ValueError(f"poll_interval must be >= 1 cycle, not {poll_interval}")
        self.dut = dut
        self.clk = dut.clk
        self.mem = mem
        self.ctl = ctl
        self.counter = counter or getattr(mem, "counter", None) or CycleCounter(dut.clk)
        self.poll_interval = poll_interval
        self.log = dut._log.getChild("gpu")
        bus = AxiWriteBus.from_prefix(dut, prefix)
        self._w = bus.w
        self.db_master = AxiMasterWrite(bus, dut.clk, dut.rst)
        self.db_master.log.setLevel(logging.WARNING)   # cocotbext logs every write at INFO
        self._db_lock = Lock()
        self._heap = heap_base
        self.doorbells = []             # Doorbell per UAR store, in order
        self.qps = {}
        self.cqs = {}

    # ---- memory -----------------------------------------------------------------
    def alloc(self, size, align=64):
        """Reserve ``size`` bytes of GPU memory aligned to ``align`` (a power of two)."""
        if size <= 0:
            raise ValueError(f"alloc size must be positive, not {size}")
        if align <= 0 or align & (align - 1):
            raise ValueError(f"alignment must be a power of two, not {align}")
        addr = (self._heap + align - 1) & ~(align - 1)
        self._heap = addr + size
        return addr

    def write(self, addr, data):
        self.mem.write(addr, data)

    def read(self, addr, n):
        return self.mem.read(addr, n)

    # ---- objects ------------------------------------------------------------------
    async def create_cq(self, cqn, log_depth, collapsed=False):
        """Allocate a CQ buffer (memset 0xFF) and create it in the NIC."""
        cq = Cq(self, cqn, log_depth, collapsed)
        await self.ctl.create_cq(cqn, cq.base, log_depth, collapsed)
        self.cqs[cqn] = cq
        return cq

    async def create_qp(self, qpn, log_depth, cq, *, remote_qpn, dmac, dip, start_psn=0, mtu_code=5,
                        state=QpState.RTS, weight=1, user_index=None, recv=None, rcq=None, **receive):
        """Allocate an SQ (zeroed) and a doorbell record and create the QP in the NIC.

        ``user_index``: the user index its CQEs carry (default ``default_user_index(qpn)``,
        not 0, so every CQE check covers the field). ``recv``: ``(log_size, log_stride)`` of
        a receive queue allocated here (zeroed ring, its own doorbell record; ``Qp.rq``,
        ``Qp.post_recv``), ``rcq`` the :class:`Cq` of its receive completions. ``receive``:
        the receive side's ``rq_psn``, ``pd``, ``ack_every``, ``min_rnr_timer``
        (NicControl.create_qp)."""
        qp = Qp(self, qpn, log_depth, cq)
        qp.user_index = default_user_index(qpn) if user_index is None else user_index
        if recv is not None:
            log_size, log_stride = recv
            size = 1 << (log_size + log_stride)
            base = self.alloc(size, align=max(1 << log_stride, 64))
            self.write(base, bytes(size))
            dbr = self.alloc(8, align=8)
            self.write(dbr, bytes(8))
            qp.rq = RecvQueue(base=base, log_size=log_size, log_stride=log_stride, dbr=dbr)
            qp.rq_poster = RecvPoster(qp.rq, self)
            receive.update(rq=qp.rq, rcqn=(rcq or cq).cqn)
        qp.rcq = rcq
        await self.ctl.create_qp(qpn, qp.sq_base, log_depth, cq.cqn, remote_qpn, start_psn, dmac, dip,
                                 mtu_code, state, weight, user_index=qp.user_index, **receive)
        qp.weight = weight
        qp.max_wqebbs = receive.get("max_wqebbs", MAX_WQEBBS)
        self.qps[qpn] = qp
        return qp

    # ---- doorbells --------------------------------------------------------------------
    async def doorbell(self, qpn, data8, offset=UAR_DB_OFFSET):
        """Store 8 bytes to the UAR page of ``qpn`` at ``offset``; return the W handshake cycle.

        Stores are serialised (one in flight) so each W handshake is matched to its store.
        """
        _check("qpn", qpn, 0, (1 << (32 - UAR_PAGE_SHIFT)) - 1)
        _check("offset", offset, 0, (1 << UAR_PAGE_SHIFT) - DB_DATA_BYTES)
        data8 = bytes(data8)
        if len(data8) != DB_DATA_BYTES:
            raise ValueError(f"a doorbell is {DB_DATA_BYTES} bytes, not {len(data8)}")
        return await self._store(qpn, offset, data8)

    async def blueflame(self, qpn, wqe64, offset=UAR_DB_OFFSET):
        """BlueFlame: store a whole one-WQEBB WQE (64 bytes, one AXI burst of 8 beats) to the
        BlueFlame register of ``qpn``; return the cycle of the last W handshake."""
        _check("qpn", qpn, 0, (1 << (32 - UAR_PAGE_SHIFT)) - 1)
        if offset not in (UAR_DB_OFFSET, UAR_DB_OFFSET_ALT):
            raise ValueError(f"BlueFlame registers are at {UAR_DB_OFFSET:#x} and {UAR_DB_OFFSET_ALT:#x}")
        wqe64 = bytes(wqe64)
        if len(wqe64) != WQEBB:
            raise ValueError(f"a BlueFlame store is one WQEBB ({WQEBB} bytes), not {len(wqe64)}")
        return await self._store(qpn, offset, wqe64, bf=True)

    async def _store(self, qpn, offset, data, bf=False):
        # Stores are serialised (one in flight) so each W handshake is matched to its store.
        async with self._db_lock:
            watch = cocotb.start_soon(self._watch_w(len(data) // DB_DATA_BYTES))
            await self.db_master.write((qpn << UAR_PAGE_SHIFT) | offset, data)
            cycle = await watch
        self.doorbells.append(Doorbell(qpn, offset, data[:DB_DATA_BYTES], cycle, bf))
        return cycle

    async def _watch_w(self, beats=1):
        """Cycle of the ``beats``-th next W handshake on the doorbell port."""
        edge = RisingEdge(self.clk)
        while True:
            await edge
            if sig_high(self._w.wvalid) and sig_high(self._w.wready):
                beats -= 1
                if beats == 0:
                    return self.counter.now - 1


class Cq:
    """Completion queue in GPU memory (CQE64 ring or collapsed single slot).

    Parameters:
        gpu: owning :class:`GpuModel`. cqn: CQ number. log_depth: log2 CQEs.
        collapsed: every CQE goes to slot 0 (NVSHMEM style).
    """

    def __init__(self, gpu, cqn, log_depth, collapsed=False):
        _check("log_depth", log_depth, 0, 15)
        self.gpu = gpu
        self.cqn = cqn
        self.log_depth = log_depth
        self.depth = 1 << log_depth
        self.collapsed = collapsed
        self.base = gpu.alloc(self.depth * CQE_SIZE, align=CQE_SIZE)
        gpu.write(self.base, b"\xff" * (self.depth * CQE_SIZE))
        self.ci = 0                     # next CQE number (ring) / changes seen (collapsed)
        self.cqes = []                  # every CQE returned by poll*
        self._last_counter = None       # collapsed: wqe_counter last returned

    def slot_addr(self, k):
        return self.base if self.collapsed else self.base + (k & (self.depth - 1)) * CQE_SIZE

    def _write_cycle(self, addr, raw):
        """W handshake cycle of the newest AXI write that stored ``raw`` at ``addr``."""
        writes = self.gpu.mem.writes
        for w in reversed(writes[-WRITE_CYCLE_SEARCH:]):
            if w.end_cycle is not None and w.covers(addr, CQE_SIZE):
                off = addr - w.addr
                if w.data[off:off + CQE_SIZE] == raw:
                    return w.end_cycle
        return None

    def _read(self, k):
        addr = self.slot_addr(k)
        raw = self.gpu.read(addr, CQE_SIZE)
        return addr, raw

    def _take(self, addr, raw, index):
        cqe = Cqe.parse(raw, index, self.gpu.counter.now)
        cqe.write_cycle = self._write_cycle(addr, raw)
        self.cqes.append(cqe)
        return cqe

    def try_poll(self):
        """Return the next CQE if software owns it now, else None (no waiting)."""
        if self.collapsed:
            addr, raw = self._read(0)
            f = unpack(CQE64, raw)
            if f["op_own"] >> 4 == CqeOp.INVALID or f["wqe_counter"] == self._last_counter:
                return None
            self._last_counter = f["wqe_counter"]
        else:
            addr, raw = self._read(self.ci)
            op_own = raw[CQE_SIZE - 1]
            if op_own >> 4 == CqeOp.INVALID or (op_own & 1) != (self.ci >> self.log_depth) & 1:
                return None
        cqe = self._take(addr, raw, self.ci)
        self.ci += 1
        return cqe

    async def poll(self, n=1, timeout_cycles=10_000):
        """Wait for the next ``n`` CQEs (ring: owner-bit rule; collapsed: each wqe_counter change).

        A collapsed CQ can overwrite slot 0 between polls, so prefer
        :meth:`poll_counter` there. Raises TimeoutError saying how many came.
        """
        out = []
        end = self.gpu.counter.now + timeout_cycles
        while True:
            while len(out) < n:
                cqe = self.try_poll()
                if cqe is None:
                    break
                out.append(cqe)
            if len(out) >= n:
                return out
            if self.gpu.counter.now >= end:
                raise TimeoutError(f"CQ {self.cqn}: waited {timeout_cycles} cycles for {n} CQEs, got {len(out)} "
                                   f"(next CQE {self.ci}, slot {self.slot_addr(self.ci):#x})")
            await ClockCycles(self.gpu.clk, self.gpu.poll_interval)

    async def poll_counter(self, expected_wqe_counter, timeout_cycles=10_000):
        """Wait until slot 0 holds a valid CQE whose wqe_counter reached ``expected_wqe_counter``.

        "Reached" is modulo 2^16 (counter - expected in [0, 0x8000)). Also
        returns early on an error CQE. Raises TimeoutError with the slot's state.
        """
        _check("expected_wqe_counter", expected_wqe_counter, 0, 0xFFFF)
        end = self.gpu.counter.now + timeout_cycles
        while True:
            addr, raw = self._read(0)
            f = unpack(CQE64, raw)
            op = f["op_own"] >> 4
            if op != CqeOp.INVALID:
                reached = (f["wqe_counter"] - expected_wqe_counter) & 0xFFFF < 0x8000
                if reached or op in (CqeOp.REQ_ERR, CqeOp.RESP_ERR):
                    if f["wqe_counter"] != self._last_counter:
                        self._last_counter = f["wqe_counter"]
                        self.ci += 1
                    return self._take(addr, raw, self.ci)
            if self.gpu.counter.now >= end:
                state = "invalid" if op == CqeOp.INVALID else f"opcode {op} wqe_counter {f['wqe_counter']:#x}"
                raise TimeoutError(f"CQ {self.cqn}: waited {timeout_cycles} cycles for wqe_counter "
                                   f"{expected_wqe_counter:#x}; slot 0 is {state}")
            await ClockCycles(self.gpu.clk, self.gpu.poll_interval)


class Qp:
    """Send queue of an RC QP in GPU memory plus its doorbell record.

    Parameters:
        gpu: owning :class:`GpuModel`. qpn: QP number. log_depth: log2 SQ
        depth in WQEBBs. cq: the send :class:`Cq`.
    """

    def __init__(self, gpu, qpn, log_depth, cq):
        _check("qpn", qpn, 0, 2**24 - 1)
        _check("log_depth", log_depth, 0, 15)
        self.gpu = gpu
        self.qpn = qpn
        self.log_depth = log_depth
        self.depth = 1 << log_depth
        self.cq = cq
        self.sq_base = gpu.alloc(self.depth * WQEBB, align=WQEBB)
        gpu.write(self.sq_base, bytes(self.depth * WQEBB))
        self.dbr_addr = gpu.alloc(4, align=8)
        gpu.write(self.dbr_addr, bytes(4))
        self.pi = 0                     # producer index in WQEBBs (unbounded; & 0xffff on the wire)
        self.user_index = 0             # as created (Gpu.create_qp)
        self.posted = []                # PostedWqe, in post order
        self._unrung = 0                # posted[_unrung:] have no doorbell yet
        self._bf_toggle = 0
        self.modifies = []              # (len(posted) then, state, start_psn): QP_MODIFYs the NIC took
        self.rq = None                  # model.recv_queue.RecvQueue (GpuModel.create_qp's ``recv``)
        self.rq_poster = None
        self.rcq = None

    def restart(self):
        """The send queue starts afresh (after a QP_MODIFY that resets the send side, as
        rdma-core resets its producer index when a QP goes to RESET): the next WQE is at
        index 0. What was posted before stays in ``posted`` (the model replays it)."""
        self.pi = 0

    # ---- WQE building ------------------------------------------------------------------
    def _ctrl(self, opcode, ds, signaled, imm=0, opmod=0, fence=0):
        ctrl = bytearray(16)
        pack(CTRL_SEG, ctrl, 0, opmod_idx_opcode=(opmod << 24) | ((self.pi & 0xFFFF) << 8) | opcode,
             qpn_ds=(self.qpn << 8) | ds, fm_ce_se=(FM_CE_SE_CQ_UPDATE if signaled else 0) | fence, imm=imm)
        return ctrl

    def _post(self, segs, opcode, signaled, **rec):
        """Prefix the ctrl segment, write the WQE WQEBB by WQEBB, record it, advance pi."""
        body = b"".join(segs)
        ds = 1 + len(body) // DS_UNIT
        nwqebbs = -(-ds // WQEBB_DS)
        if nwqebbs > MAX_WQEBBS or ds > MAX_DS:
            raise ValueError(f"WQE of {ds} ds units needs {nwqebbs} WQEBBs; at most {MAX_WQEBBS} allowed")
        if nwqebbs > self.depth:
            raise ValueError(f"WQE of {nwqebbs} WQEBBs does not fit an SQ of {self.depth}")
        wqe = bytes(self._ctrl(opcode, ds, signaled, rec.pop("imm", 0), rec.pop("opmod", 0),
                               rec.pop("fence", 0))) + body
        wqe += bytes(nwqebbs * WQEBB - len(wqe))
        for i in range(nwqebbs):        # wraps at the ring end WQEBB by WQEBB
            slot = (self.pi + i) & (self.depth - 1)
            self.gpu.write(self.sq_base + slot * WQEBB, wqe[i * WQEBB:(i + 1) * WQEBB])
        p = PostedWqe(qpn=self.qpn, index=self.pi & 0xFFFF, slot=self.pi & (self.depth - 1), wqe=wqe, ds=ds,
                      nwqebbs=nwqebbs, signaled=bool(signaled), opcode=opcode,
                      post_cycle=self.gpu.counter.now, **rec)
        self.posted.append(p)
        self.pi += nwqebbs
        return p

    def _gather(self, opcode, segments, lkey, signaled, imm, raddr=0, rkey=0):
        """Post a data WQE whose data is a gather list: ``segments`` ``(addr, length[,
        lkey])`` each (``lkey`` by default), its segments' bytes (and a WRITE's remote
        address segment) as ``model.frames.build_data_wqe`` lays them out."""
        segs = []
        for i, sg in enumerate(segments):
            if not isinstance(sg, (tuple, list)) or len(sg) not in (2, 3):
                raise ValueError(f"segment {i} must be (addr, length) or (addr, length, lkey), not {sg!r}")
            _check(f"segment {i} addr", sg[0], 0, 2**64 - 1), _check(f"segment {i} length", sg[1], 0, 2**31 - 1)
            segs.append((sg[0], sg[1], sg[2] if len(sg) == 3 else lkey))
        wqe = build_data_wqe(opcode if opcode in (WqeOp.RDMA_WRITE, WqeOp.RDMA_WRITE_IMM, WqeOp.SEND,
                                                  WqeOp.SEND_IMM) else WqeOp.RDMA_WRITE,
                             0, self.qpn, raddr=raddr, rkey=rkey, segments=segs)
        ds = unpack(CTRL_SEG, wqe)["qpn_ds"] & 0x3F
        total = sum(n for _, n, _ in segs)
        payload = read_gather(self.gpu.read, segs) if total < 2**31 else b""
        first = segs[0] if segs else (None, 0, 0)
        return self._post([wqe[DS_UNIT:ds * DS_UNIT]], opcode, signaled, raddr=raddr, rkey=rkey, payload=payload,
                          length=total, imm=imm, local_addr=first[0], lkey=first[2], inline=False,
                          segments=tuple(segs))

    def post_write(self, raddr, rkey, *, local_addr=None, length=None, lkey=0x100, inline=None, signaled=True,
                   opcode=WqeOp.RDMA_WRITE, imm=0, segments=None):
        """Post ctrl + raddr + (data pointer | inline | gather list) segments; return the
        :class:`PostedWqe`.

        Parameters:
            raddr, rkey: remote address (64-bit) and key (32-bit).
            local_addr, length, lkey: pointer segment source (payload read now).
            inline: bytes to carry inline instead of a pointer segment.
            segments: a gather list instead, ``[(addr, length[, lkey]), ...]`` (``lkey`` by
            default): the message is their concatenation (payload read now).
            signaled: set CQ_UPDATE. opcode: ctrl opcode (any 8-bit value, for
            error tests). imm: immediate (ctrl bytes 12-15).
        """
        _check("raddr", raddr, 0, 2**64 - 1)
        _check("rkey", rkey, 0, 2**32 - 1)
        _check("opcode", opcode, 0, 0xFF)
        _check("imm", imm, 0, 2**32 - 1)
        if segments is not None:
            if inline is not None or local_addr is not None or length is not None:
                raise ValueError("give segments= or inline= or local_addr/length, one of them")
            return self._gather(opcode, segments, lkey, signaled, imm, raddr, rkey)
        raddr_seg = self._seg(RADDR_SEG, raddr=raddr, rkey=rkey)
        if inline is not None:
            if local_addr is not None or length is not None:
                raise ValueError("give either inline data or local_addr/length, not both")
            payload = bytes(inline)
            seg = be32(len(payload) | INLINE_FLAG) + payload
            seg += bytes(-len(seg) % DS_UNIT)
            rec = dict(local_addr=None, lkey=0, inline=True)
        else:
            if local_addr is None or length is None:
                raise ValueError("a pointer WQE needs local_addr and length (or pass inline=)")
            _check("length", length, 0, 2**31 - 1)
            seg = self._data_seg(local_addr, length, lkey)
            payload = self.gpu.read(local_addr, length)
            rec = dict(local_addr=local_addr, lkey=lkey, inline=False)
        return self._post([bytes(raddr_seg), bytes(seg)], opcode, signaled, raddr=raddr, rkey=rkey,
                          payload=payload, length=len(payload), imm=imm, **rec)

    def post_send(self, *, local_addr=None, length=None, lkey=0x100, inline=None, imm=None, signaled=True,
                  segments=None):
        """Post a SEND (``imm`` None) or SEND_IMM: ctrl + (data pointer | inline | gather
        list | nothing) segments, no remote-address segment; return the :class:`PostedWqe`.

        Parameters:
            local_addr, length, lkey: pointer segment source (payload read now); neither
            given and no ``inline``: a 0-byte SEND (ctrl only, ds 1).
            inline: bytes to carry inline instead of a pointer segment.
            segments: a gather list instead, ``[(addr, length[, lkey]), ...]`` (``lkey`` by
            default): the message is their concatenation.
            imm: the immediate (ctrl bytes 12-15, big-endian as on the wire).
        """
        if imm is not None:
            _check("imm", imm, 0, 2**32 - 1)
        opcode = WqeOp.SEND if imm is None else WqeOp.SEND_IMM
        if segments is not None:
            if inline is not None or local_addr is not None or length is not None:
                raise ValueError("give segments= or inline= or local_addr/length, one of them")
            return self._gather(opcode, segments, lkey, signaled, imm or 0)
        if inline is not None:
            if local_addr is not None or length is not None:
                raise ValueError("give either inline data or local_addr/length, not both")
            payload = bytes(inline)
            seg = be32(len(payload) | INLINE_FLAG) + payload
            segs = [seg + bytes(-len(seg) % DS_UNIT)]
            rec = dict(local_addr=None, lkey=0, inline=True)
        elif local_addr is None and length is None:
            payload, segs, rec = b"", [], dict(local_addr=None, lkey=0, inline=False)
        else:
            if local_addr is None or length is None:
                raise ValueError("a pointer SEND needs local_addr and length (or pass inline=)")
            _check("length", length, 0, 2**31 - 1)
            segs = [self._data_seg(local_addr, length, lkey)]
            payload = self.gpu.read(local_addr, length)
            rec = dict(local_addr=local_addr, lkey=lkey, inline=False)
        return self._post(segs, opcode, signaled, raddr=0, rkey=0, payload=payload, length=len(payload),
                          imm=imm or 0, **rec)

    # ---- READ, atomics and NVSHMEM's / DeepEP's WQE forms (../shared/VERBS.md, section 1) ----
    def _seg(self, table, **values):
        b = bytearray(max(off + w for _, off, w in table))
        pack(table, b, 0, **values)
        return bytes(b)

    def _data_seg(self, local_addr, length, lkey):
        _check("local_addr", local_addr, 0, 2**64 - 1)
        _check("lkey", lkey, 0, 2**32 - 1)
        return self._seg(DATA_SEG, byte_count=length, lkey=lkey, addr=local_addr)

    def post_read(self, raddr, rkey, local_addr, length, *, lkey=0x100, signaled=True):
        """NVSHMEM's get / g: RDMA READ, ctrl + raddr + data (ds 3), the data landing at
        ``local_addr``."""
        _check("raddr", raddr, 0, 2**64 - 1), _check("rkey", rkey, 0, 2**32 - 1)
        _check("length", length, 0, 2**31 - 1)
        return self._post([self._seg(RADDR_SEG, raddr=raddr, rkey=rkey), self._data_seg(local_addr, length, lkey)],
                          WqeOp.RDMA_READ, signaled, raddr=raddr, rkey=rkey, payload=b"", length=length,
                          local_addr=local_addr, lkey=lkey, inline=False)

    def post_atomic(self, opcode, raddr, rkey, swap_add, compare=0, *, local_addr, lkey=0x100, signaled=True):
        """An 8-byte IBTA atomic, ATOMIC_FA or ATOMIC_CS: ctrl + raddr + atomic (16) + data (8
        bytes: where the original value lands), ds 4."""
        if opcode not in (WqeOp.ATOMIC_FA, WqeOp.ATOMIC_CS):
            raise ValueError(f"opcode must be ATOMIC_FA or ATOMIC_CS, not {opcode!r}")
        _check("raddr", raddr, 0, 2**64 - 1), _check("rkey", rkey, 0, 2**32 - 1)
        _check("swap_add", swap_add, 0, 2**64 - 1), _check("compare", compare, 0, 2**64 - 1)
        segs = [self._seg(RADDR_SEG, raddr=raddr, rkey=rkey), self._seg(ATOMIC_SEG, swap_add=swap_add, compare=compare),
                self._data_seg(local_addr, 8, lkey)]
        return self._post(segs, opcode, signaled, raddr=raddr, rkey=rkey, payload=b"", length=8,
                          local_addr=local_addr, lkey=lkey, inline=False)

    def post_masked_atomic(self, opcode, nbytes, raddr, rkey, operands, *, local_addr, lkey=0x100, signaled=True):
        """mlx5's extended atomics as NVSHMEM and DeepEP post them: ATOMIC_MASKED_FA with
        ``operands`` {add, field_boundary} or ATOMIC_MASKED_CS with {swap, compare,
        swap_mask, compare_mask}; ``nbytes`` 4 (opmod 0x08) or 8 (0x09). ds 4 (1 WQEBB),
        but ds 5 (2 WQEBBs) for the 8-byte compare-swap's 32-byte segment."""
        opmod = {4: OPMOD_EXT_ATOMIC_4B, 8: OPMOD_EXT_ATOMIC_8B}.get(nbytes)
        if opcode not in (WqeOp.ATOMIC_MASKED_FA, WqeOp.ATOMIC_MASKED_CS) or opmod is None:
            raise ValueError(f"a masked atomic is ATOMIC_MASKED_FA/CS of 4 or 8 bytes, not {opcode!r}/{nbytes!r}")
        _, _, table, _ = ATOMIC_FORMS[opcode, opmod]     # the form table the parser and model read
        names = [n for n, _, _ in table if n != "rsvd"]
        if set(operands) != set(names):
            raise ValueError(f"operands must be {names}, got {sorted(operands)}")
        for k, v in operands.items():
            _check(k, v, 0, 2 ** (8 * nbytes) - 1)
        _check("raddr", raddr, 0, 2**64 - 1), _check("rkey", rkey, 0, 2**32 - 1)
        segs = [self._seg(RADDR_SEG, raddr=raddr, rkey=rkey), self._seg(table, **operands),
                self._data_seg(local_addr, nbytes, lkey)]
        return self._post(segs, opcode, signaled, raddr=raddr, rkey=rkey, payload=b"", length=nbytes,
                          local_addr=local_addr, lkey=lkey, inline=False, opmod=opmod)

    def amo_nonfetch_add(self, raddr, rkey, value, *, scratch, lkey=0x100):
        """DeepEP's signal: a 4-byte masked fetch-add (boundary 0), CQ_UPDATE set, the
        original value landing in a scratch slot."""
        return self.post_masked_atomic(WqeOp.ATOMIC_MASKED_FA, 4, raddr, rkey,
                                       {"add": value & 0xFFFF_FFFF, "field_boundary": 0}, local_addr=scratch,
                                       lkey=lkey)

    # NVSHMEM's atomics as its IBGDA device code posts them on an RC QP (NVSHMEM 3.4's
    # ibgda_write_atomic_wqe; table in ../shared/VERBS.md section 1): op -> (masked form,
    # operands from the value v and compare c; n = the size's all-ones)
    _AMO_FORMS = {
        "inc": ("FA", lambda v, c, n: {"add": 1, "field_boundary": 0}),
        "add": ("FA", lambda v, c, n: {"add": v, "field_boundary": 0}),
        "xor": ("FA", lambda v, c, n: {"add": v, "field_boundary": n}),
        "fetch": ("FA", lambda v, c, n: {"add": 0, "field_boundary": 0}),
        "set": ("CS", lambda v, c, n: {"swap": v, "compare": 0, "swap_mask": n, "compare_mask": 0}),
        "and": ("CS", lambda v, c, n: {"swap": v, "compare": 0, "swap_mask": ~v & n, "compare_mask": 0}),
        "or": ("CS", lambda v, c, n: {"swap": v, "compare": 0, "swap_mask": v, "compare_mask": 0}),
        "compare_swap": ("CS", lambda v, c, n: {"swap": v, "compare": c, "swap_mask": n, "compare_mask": n}),
    }
    # the ops NVSHMEM posts alike (the fetching and signal forms of the ones above)
    NVSHMEM_AMO = dict(_AMO_FORMS, fetch_inc=_AMO_FORMS["inc"], signal_add=_AMO_FORMS["add"],
                       fetch_add=_AMO_FORMS["add"], fetch_xor=_AMO_FORMS["xor"], swap=_AMO_FORMS["set"],
                       signal=_AMO_FORMS["set"], signal_set=_AMO_FORMS["set"], fetch_and=_AMO_FORMS["and"],
                       fetch_or=_AMO_FORMS["or"])

    def nvshmem_amo(self, op, nbytes, raddr, rkey, value=0, compare=0, *, local_addr, lkey=0x100):
        """One NVSHMEM atomic (``op`` a key of ``NVSHMEM_AMO``: inc, add, fetch_add,
        compare_swap, set, swap, and, or, xor, fetch, the signal forms; ``nbytes`` 4 or 8)
        as NVSHMEM posts it on an RC QP: the 8-byte fetch_add and compare_swap as IBTA's
        ATOMIC_FA / ATOMIC_CS, every other as the masked form of its size; the original
        value lands at ``local_addr`` (NVSHMEM's scratch slot for the non-fetching ones).
        Signaled (CQ_UPDATE) unless a NOP must follow: the 8-byte masked compare-swap
        takes 2 WQEBBs, so NVSHMEM closes it with a signaled NOP (its CQE's wqe_counter is
        then the NOP's). Returns the WQEs posted."""
        if op not in self.NVSHMEM_AMO or nbytes not in (4, 8):
            raise ValueError(f"an NVSHMEM atomic is one of {sorted(self.NVSHMEM_AMO)} on 4 or 8 bytes, "
                             f"not {op!r} / {nbytes!r}")
        mask = (1 << 8 * nbytes) - 1
        _check("value", value, 0, mask), _check("compare", compare, 0, mask)
        if nbytes == 8 and op == "fetch_add":
            return [self.post_atomic(WqeOp.ATOMIC_FA, raddr, rkey, value, local_addr=local_addr, lkey=lkey)]
        if nbytes == 8 and op == "compare_swap":
            return [self.post_atomic(WqeOp.ATOMIC_CS, raddr, rkey, value, compare, local_addr=local_addr, lkey=lkey)]
        form, operands = self.NVSHMEM_AMO[op]
        opcode = WqeOp.ATOMIC_MASKED_FA if form == "FA" else WqeOp.ATOMIC_MASKED_CS
        two = form == "CS" and nbytes == 8
        w = self.post_masked_atomic(opcode, nbytes, raddr, rkey, operands(value, compare, mask),
                                    local_addr=local_addr, lkey=lkey, signaled=not two)
        return [w, self.post_nop()] if two else [w]

    def signal_op(self, sig_addr, rkey, value, sig_op, *, scratch, lkey=0x100):
        """nvshmemx_signal_op: the 8-byte signal, ``sig_op`` "set" (a masked compare-swap
        and its NOP) or "add" (an 8-byte masked fetch-add, not IBTA's FETCH_ADD)."""
        if sig_op not in ("set", "add"):
            raise ValueError(f"sig_op must be 'set' or 'add', not {sig_op!r}")
        return self.nvshmem_amo("signal_set" if sig_op == "set" else "signal_add", 8, sig_addr, rkey, value,
                                local_addr=scratch, lkey=lkey)

    def put_signal(self, raddr, rkey, local_addr, length, sig_addr, value, sig_op, *, scratch, lkey=0x100):
        """nvshmem_put_signal_nbi: the data as an unsignaled RDMA WRITE, then the signal
        (``signal_op``) behind it on the same QP, no fence: the responder's ordering rule
        keeps the signal from landing before the data. Returns the WQEs posted."""
        put = self.post_write(raddr, rkey, local_addr=local_addr, length=length, lkey=lkey, signaled=False)
        return [put] + self.signal_op(sig_addr, rkey, value, sig_op, scratch=scratch, lkey=lkey)

    def post_dump(self, local_addr, *, lkey=0x100):
        """NVSHMEM's consistency point (quiet with consistency): DUMP, ctrl + data (1 byte
        of a local buffer), ds 2, fence 0x40 and CQ_UPDATE."""
        return self._post([self._data_seg(local_addr, 1, lkey)], WqeOp.DUMP, True, raddr=0, rkey=0,
                          payload=b"", length=1, local_addr=local_addr, lkey=lkey, inline=False, fence=FENCE_FENCE)

    def put_warp_p(self, raddr, rkey, values, width):
        """NVSHMEM's warp-wide p: 32 values of ``width`` bytes (1, 2, 4, 8) in one unsignaled
        inline WRITE (ds 5 / 7 / 11 / 19), then a signaled NOP; returns both."""
        if width not in (1, 2, 4, 8) or len(values) != 32:
            raise ValueError("a warp-wide p is 32 values of 1, 2, 4 or 8 bytes")
        data = b"".join(int(v).to_bytes(width, "little") for v in values)   # as they lie in GPU memory
        return self.post_write(raddr, rkey, inline=data, signaled=False), self.post_nop()

    def post_raw(self, opcode, ds, body=b"", *, signaled=True, index=None):
        """Post a WQE exactly as given, well-formed or not (malformed-WQE tests): a ctrl
        segment with ``opcode``, ``ds`` (0..63, not checked against ``body``) and ``index``
        (default the position), then ``body``, zero padded to ``max(1, ceil(ds / 4))``
        WQEBBs (the ring space the ds field claims)."""
        _check("opcode", opcode, 0, 0xFF)
        _check("ds", ds, 0, 63)
        nwqebbs = max(1, -(-ds // WQEBB_DS))
        if nwqebbs > self.depth:
            raise ValueError(f"a WQE of {nwqebbs} WQEBBs does not fit an SQ of {self.depth}")
        ctrl = self._ctrl(opcode, ds, signaled)
        if index is not None:
            _check("index", index, 0, 0xFFFF)
            ctrl[1:3] = index.to_bytes(2, "big")
        wqe = (bytes(ctrl) + bytes(body))[:nwqebbs * WQEBB]
        wqe += bytes(nwqebbs * WQEBB - len(wqe))
        for i in range(nwqebbs):
            slot = (self.pi + i) & (self.depth - 1)
            self.gpu.write(self.sq_base + slot * WQEBB, wqe[i * WQEBB:(i + 1) * WQEBB])
        p = PostedWqe(qpn=self.qpn, index=self.pi & 0xFFFF, slot=self.pi & (self.depth - 1), wqe=wqe, ds=ds,
                      nwqebbs=nwqebbs, signaled=bool(signaled), opcode=opcode, raddr=0, rkey=0, payload=b"",
                      length=0, inline=False, local_addr=None, lkey=0, post_cycle=self.gpu.counter.now)
        self.posted.append(p)
        self.pi += nwqebbs
        return p

    def post_nop(self, signaled=True):
        """Post a NOP (ctrl segment only, ds = 1)."""
        return self._post([], WqeOp.NOP, signaled, raddr=0, rkey=0, payload=b"", length=0,
                          inline=False, local_addr=None, lkey=0)

    # ---- doorbells ------------------------------------------------------------------------
    def post_recv(self, *scatter_lists):
        """Post receive WQEs as rdma-core's ``mlx5_post_recv`` does: one WQE per scatter list
        (``(addr, length)`` or ``(addr, length, lkey)`` entries; model.recv_queue's builders
        make the bytes), then the doorbell record's receive counter once. Returns the WQE
        numbers (their CQEs' wqe_counter is ``n & 0xffff``)."""
        if self.rq_poster is None:
            raise ValueError(f"QP {self.qpn:#x} has no receive queue (create it with recv=)")
        return self.rq_poster.post(*scatter_lists)

    def write_dbr(self):
        """Doorbell record: BE32(pi & 0xffff)."""
        self.gpu.write(self.dbr_addr, be32(self.pi & 0xFFFF))

    async def _ring(self, data8, offset=UAR_DB_OFFSET, upto=None):
        self.write_dbr()
        cycle = await self.gpu.doorbell(self.qpn, data8, offset)
        upto = len(self.posted) if upto is None else upto
        for p in self.posted[self._unrung:upto]:
            p.db_cycle = cycle
        self._unrung = max(self._unrung, upto)
        return cycle

    async def ring_nvshmem(self, upto=None):
        """NVSHMEM form: {BE32(pi << 8), BE32(qpn << 8)}; returns the W handshake cycle.

        ``upto``: ring for the first ``upto`` posted WQEs only (a batch posted ahead).
        """
        if upto is None:
            return await self._ring(be32((self.pi & 0xFFFF) << 8) + be32(self.qpn << 8))
        _check("upto", upto, 1, len(self.posted))
        pi = (self.posted[upto - 1].index + self.posted[upto - 1].nwqebbs) & 0xFFFF
        return await self._ring(be32(pi << 8) + be32(self.qpn << 8), upto=upto)

    async def ring_rdma_core(self, alternate=False):
        """rdma-core form: the first 8 bytes of the last posted WQE's ctrl segment.

        ``alternate=True`` alternates between the two BlueFlame registers
        (0x800/0x900) per ring, as mlx5 does.
        """
        if not self.posted:
            raise ValueError(f"QP {self.qpn}: nothing posted to ring for")
        offset = UAR_DB_OFFSET
        if alternate:
            offset = (UAR_DB_OFFSET, UAR_DB_OFFSET_ALT)[self._bf_toggle]
            self._bf_toggle ^= 1
        return await self._ring(self.posted[-1].wqe[:8], offset)

    async def ring_blueflame(self):
        """BlueFlame: write the doorbell record, then store the last posted WQE (one WQEBB)
        into the BlueFlame register, alternating 0x800/0x900 as mlx5 does."""
        if not self.posted:
            raise ValueError(f"QP {self.qpn}: nothing posted to ring for")
        w = self.posted[-1]
        if w.nwqebbs != 1:
            raise ValueError(f"BlueFlame carries one-WQEBB WQEs; this one has {w.nwqebbs}")
        offset = (UAR_DB_OFFSET, UAR_DB_OFFSET_ALT)[self._bf_toggle]
        self._bf_toggle ^= 1
        self.write_dbr()
        cycle = await self.gpu.blueflame(self.qpn, w.wqe[:WQEBB], offset)
        for p in self.posted[self._unrung:]:
            p.db_cycle = cycle
        self._unrung = len(self.posted)
        return cycle

    async def ring_raw(self, data8, offset=UAR_DB_OFFSET):
        """Store arbitrary 8 bytes to this QP's doorbell (malformed doorbell tests).

        Does not touch the doorbell record or the posts' db_cycle.
        """
        return await self.gpu.doorbell(self.qpn, data8, offset)
