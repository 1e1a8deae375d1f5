"""GPU memory model: an AXI4 slave on the DUT's DMA master ports (``m_axi``, ``m_axi_wqe``).

Timing convention: see :mod:`tb.clock` (a handshake "in cycle c" means valid
and ready were both high during cycle c).
"""

import random
from collections import deque
from dataclasses import dataclass, field

from cocotbext.axi import AxiBus, AxiReadBus, AxiWriteBus

from model.memory import PAGE, SparseMemory
from spec.params import DATA_BYTES, DMA_BYTES_PER_CYCLE, DMA_READ_LATENCY_CYCLES

from .clock import IDLE_FOREVER, CycleCounter, EdgeModel

AXI_BURST_INCR = 1
AXI_MAX_ID = 16          # 4-bit ids (interfaces.md)
AXI_MAX_LEN = 255        # arlen/awlen: beats - 1


class AxiProtocolError(Exception):
    """The DUT broke an AXI rule the memory model relies on."""


def sig_uint(sig):
    """Integer value of a signal; X/Z bits read as 0. Read as the simulator's bit string
    (cocotb's ``.value`` builds a LogicArray from the same string: most of a read's cost)."""
    v = sig._handle.get_signal_val_binstr()
    try:
        return int(v, 2)
    except ValueError:
        return int(v.lower().replace("x", "0").replace("z", "0"), 2)


def sig_high(sig):
    """True when a 1-bit signal is 1 (X/Z count as low)."""
    return sig._handle.get_signal_val_binstr() == "1"


@dataclass
class AxiAccess:
    """One AXI burst seen by :class:`DmaMemory`.

    Fields: ``id``; ``addr`` (first byte address); ``length`` (bytes covered,
    from addr to the end of the last beat's container); ``beats``; ``size``
    (bytes per beat); ``start_cycle`` (AR/AW handshake); ``end_cycle`` (last
    R/W handshake, None while in flight); ``data`` (writes only: the bytes of
    [addr, addr+length) right after the write landed).
    """
    id: int
    addr: int
    length: int
    beats: int
    size: int
    start_cycle: int
    end_cycle: int | None = None
    data: bytes | None = None
    port: str = ""
    staged: list = field(default_factory=list)   # visible_at_b: (addr, bytes) stored when the B is handed over
    written: list = field(default_factory=list)  # (addr, n) of every strobed byte run it wrote
    suspects: list = field(default_factory=list)  # bursts of another port in flight over its lines

    def overlaps(self, other):
        """True when the two bursts share a byte."""
        return self.addr < other.addr + other.length and other.addr < self.addr + self.length

    def covers(self, addr, n=1):
        """True when [addr, addr+n) lies inside this burst."""
        return self.addr <= addr and addr + n <= self.addr + self.length


class _Burst:
    """A burst in progress: address arithmetic of AXI INCR bursts."""

    __slots__ = ("rec", "beat", "ready_cycle")

    def __init__(self, rec, ready_cycle=0):
        self.rec = rec
        self.beat = 0
        self.ready_cycle = ready_cycle

    def beat_addr(self):
        r = self.rec
        if self.beat == 0:
            return r.addr
        return (r.addr & ~(r.size - 1)) + self.beat * r.size

    @property
    def last(self):
        return self.beat == self.rec.beats - 1


class DmaMemory(EdgeModel):
    """AXI4 slave model of GPU memory.

    Parameters:
        dut: DUT handle; signals ``<prefix>_ar*/r*/aw*/w*/b*``, ``clk``, ``rst``.
        counter: shared :class:`~tb.clock.CycleCounter` (one is made if None).
        read_latency: cycles from the AR handshake (cycle c) to the earliest
            cycle the first data beat is valid (c + read_latency); >= 1.
        read_bytes_per_cycle: read bandwidth, 1..128 bytes per cycle; each
            beat costs a full bus width (64 -> one beat every 2 cycles).
        prefix: AXI signal prefix of the full (read and write) port.
        read_prefixes: prefixes of further read-only ports on the same memory; each has
            its own R channel, latency and bandwidth, and AR order is kept per port.
        write_prefixes: prefixes of further write-only ports on the same memory. Writes
            of one port land in AW order; across ports the order is undefined, so a
            burst whose bytes overlap a burst in flight (AW accepted, B not yet handed
            over) on another port is a protocol error.
        strict: raise :class:`AxiProtocolError` on protocol errors (else only
            count them in ``protocol_errors`` and log).
        b_latency: cycles from wlast to bvalid: an int (default 1), or ``(lo, hi)``: a
            random latency per burst in [lo, hi] (``seed``), each port's B still in AW
            order (one id per port).
        visible_at_b: a write lands in memory when its B is handed over, not with its
            W beats, so reads and the GPU see only completed writes (with random
            ``b_latency``, writes on two ports land in an order no AW order fixes).

    All reads are accepted at once (arready stays high) and answered in AR
    order per port; writes are accepted at once, B follows ``b_latency`` cycles after
    wlast (on each write port).
    Narrow beats carry the whole 128-byte line containing the beat address,
    so every lane holds the byte at its own address.
    """

    def __init__(self, dut, counter=None, *, read_latency=DMA_READ_LATENCY_CYCLES,
                 read_bytes_per_cycle=DMA_BYTES_PER_CYCLE, prefix="m_axi", read_prefixes=(),
                 write_prefixes=(), strict=True, b_latency=1, visible_at_b=False, seed=0):
        if int(read_latency) != read_latency or read_latency < 1:
            raise ValueError(f"read_latency must be an integer >= 1 cycle, not {read_latency}")
        if not 0 < read_bytes_per_cycle <= DATA_BYTES:
            raise ValueError(f"read_bytes_per_cycle must be in (0, {DATA_BYTES}], not {read_bytes_per_cycle}")
        self.dut = dut
        self.clk = dut.clk
        self.rst = getattr(dut, "rst", None)
        self.counter = counter if counter is not None else CycleCounter(dut.clk)
        self.read_latency = int(read_latency)
        self.read_bytes_per_cycle = read_bytes_per_cycle
        self.strict = strict
        self.log = dut._log.getChild("dma_mem")
        lo, hi = (b_latency, b_latency) if isinstance(b_latency, int) else tuple(b_latency)
        if not 1 <= lo <= hi:
            raise ValueError(f"b_latency must be >= 1 (or a range lo <= hi), not {b_latency!r}")
        self._b_rnd = random.Random(seed)
        self.b_latency = lambda: self._b_rnd.randint(lo, hi)
        self.visible_at_b = visible_at_b

        self.mem = SparseMemory()
        self.bus = AxiBus.from_prefix(dut, prefix)
        self.bus_bytes = len(self.bus.read.r.rdata) // 8
        self.ports = [_ReadPort(self, prefix, self.bus.read)]
        self.ports += [_ReadPort(self, p, AxiReadBus.from_prefix(dut, p)) for p in read_prefixes]
        self.write_ports = [_WritePort(self, prefix, self.bus.write)]
        self.write_ports += [_WritePort(self, p, AxiWriteBus.from_prefix(dut, p)) for p in write_prefixes]

        self.reads = []                 # AxiAccess per AR, in AR order
        self.writes = []                # AxiAccess per AW, in AW order
        self.stored = []                # (addr, n) of every run of bytes a write stored (its strobes)
        self.protocol_errors = 0
        self.crossings_4k = 0           # bursts crossing a 4 KiB boundary (AXI violation, not fatal)
        self._last_edge = None          # the edge handled last
        self._attach(self.counter)

    # ---- backing store ---------------------------------------------------------
    def write(self, addr, data):
        """Store bytes at ``addr`` (instant, no bus traffic)."""
        self.mem.write(addr, data)

    def read(self, addr, n):
        """Return ``n`` bytes at ``addr`` (instant; unwritten bytes are 0)."""
        return self.mem.read(addr, n)

    @property
    def max_reads_in_flight(self):
        """Most reads in flight at once on any one port."""
        return max(p.max_in_flight for p in self.ports)

    def writes_covering(self, addr, n=1):
        """Completed write bursts that covered [addr, addr+n), oldest first."""
        return [w for w in self.writes if w.end_cycle is not None and w.covers(addr, n)]

    # ---- per-cycle behaviour -----------------------------------------------------
    def _error(self, msg):
        self.protocol_errors += 1
        self.log.error(msg)
        if self.strict:
            raise AxiProtocolError(msg)

    def _new_access(self, kind, aid, addr, alen, asize, aburst, cycle):
        if aid >= AXI_MAX_ID:
            raise AxiProtocolError(f"{kind} id {aid} >= {AXI_MAX_ID} (addr {addr:#x}, cycle {cycle})")
        if alen > AXI_MAX_LEN:
            raise AxiProtocolError(f"{kind} len {alen} > {AXI_MAX_LEN} (addr {addr:#x}, cycle {cycle})")
        size = 1 << asize
        if size > self.bus_bytes:
            raise AxiProtocolError(f"{kind} size {size} B exceeds the {self.bus_bytes}-byte bus (addr {addr:#x})")
        if aburst != AXI_BURST_INCR:
            raise AxiProtocolError(f"{kind} burst type {aburst} unsupported, only INCR (1) (addr {addr:#x})")
        beats = alen + 1
        length = (addr & ~(size - 1)) + beats * size - addr
        if addr // PAGE != (addr + length - 1) // PAGE:
            # AXI forbids it; served anyway, counted so a test can assert on it
            self.crossings_4k += 1
            if self.crossings_4k == 1:
                self.log.warning(f"{kind} burst {addr:#x}+{length} crosses a 4 KiB boundary (cycle {cycle})")
        return AxiAccess(id=aid, addr=addr, length=length, beats=beats, size=size, start_cycle=cycle)

    def _reset(self):
        for p in self.ports:
            p.reset()
        for p in self.write_ports:
            p.reset()

    def edge(self, now):
        """Edge ``now``: sample cycle ``now - 1``'s handshakes, drive cycle ``now``."""
        last = self._last_edge
        if last is not None and now - last > 1:
            for p in self.ports:            # the read credit the slept edges earned
                p.credit = min(p.credit + (now - last - 1) * self.read_bytes_per_cycle, self.bus_bytes)
        self._last_edge = now
        c = now - 1                     # cycle the sampled values belong to
        if self.rst is not None and sig_high(self.rst):
            self._reset()
            self.stay_awake()
            return
        for p in self.ports:
            p.step(c, now)
        for p in self.write_ports:
            p.step(c)
        for p in self.write_ports:      # after every AW of cycle c was checked against it
            p.retire()
        self._sleep(now)

    def _sleep(self, now):
        """With no valid high at this edge (as the ports' steps sampled them) and no R beat
        or B driven, sleep until a valid rises, the reset, or the edge of the next due R
        beat or B (:class:`~tb.clock.EdgeModel`)."""
        due = IDLE_FOREVER
        watch = []
        for p in self.ports:
            if p.r_on or p.ar_seen:
                return self.stay_awake()
            if p.rq:
                due = min(due, p.rq[0].ready_cycle)
            watch.append(p.ar.arvalid)
        for p in self.write_ports:
            if p.b_on or p.aw_seen or p.w_seen:
                return self.stay_awake()
            if p.bq:
                due = min(due, p.bq[0][1])
            watch += [p.aw.awvalid, p.w.wvalid]
        if self.rst is not None:
            watch.append(self.rst)
        self.may_sleep(now, due, watch)


class _WritePort:
    """The AW, W and B channels of one AXI write port of :class:`DmaMemory`."""

    def __init__(self, owner, prefix, bus):
        self.owner, self.prefix = owner, prefix
        self.aw, self.w, self.b = bus.aw, bus.w, bus.b
        self.bresp = getattr(self.b, "bresp", None)
        self.wstrb = getattr(self.w, "wstrb", None)
        self.awq = deque()              # accepted AWs waiting for W beats
        self.wq = deque()               # W beats (data, strb, last, cycle) waiting for an AW
        self.bq = deque()               # ids of B responses to send
        self.in_flight = deque()        # AxiAccess from AW until its B is handed over
        self.b_taken = False            # the oldest one's B was handed over this cycle
        self.b_on = False
        for sig, v in ((self.aw.awready, 1), (self.w.wready, 1), (self.b.bvalid, 0)):
            sig.value = v

    def reset(self):
        self.awq.clear()
        self.wq.clear()
        self.bq.clear()
        self.in_flight.clear()
        self.b_taken = False
        if self.b_on:
            self.b.bvalid.value = 0
            self.b_on = False

    def step(self, c):
        """Sample cycle ``c``'s handshakes, land complete W beats, drive the next B."""
        o, aw, w, b = self.owner, self.aw, self.w, self.b
        full = (1 << o.bus_bytes) - 1
        b_free = not self.b_on
        if self.b_on and sig_high(b.bready):
            _, _, done = self.bq.popleft()
            if o.visible_at_b:           # the write lands now
                for a, d in done.staged:
                    o.mem.write(a, d)
                done.data = o.mem.read(done.addr, done.length)
            self.b_taken = True
            b_free = True
        self.aw_seen = sig_high(aw.awvalid)
        if self.aw_seen:
            rec = o._new_access("write", sig_uint(aw.awid), sig_uint(aw.awaddr), sig_uint(aw.awlen),
                                sig_uint(aw.awsize), sig_uint(aw.awburst), c)
            rec.port = self.prefix
            # a burst over lines another port has in flight: their order is undefined where
            # both write a byte (their strobes say which, once their beats have come)
            for other in o.write_ports:
                if other is not self:
                    for f in other.in_flight:
                        if rec.overlaps(f):
                            rec.suspects.append(f)
                            f.suspects.append(rec)
            o.writes.append(rec)
            self.awq.append(_Burst(rec))
            self.in_flight.append(rec)
        self.w_seen = sig_high(w.wvalid)
        if self.w_seen:
            strb = sig_uint(self.wstrb) if self.wstrb is not None else full
            data = sig_uint(w.wdata) if strb else 0
            self.wq.append((data, strb, sig_high(w.wlast), c))
        while self.awq and self.wq:
            self._apply_w_beat(*self.wq.popleft())
        if b_free and self.bq and self.bq[0][1] <= c + 1:
            b.bid.value = self.bq[0][0]
            if self.bresp is not None:
                self.bresp.value = 0
            b.bvalid.value = 1
            self.b_on = True
        elif b_free and self.b_on:
            b.bvalid.value = 0
            self.b_on = False

    def retire(self):
        """The burst whose B was handed over this cycle is no longer in flight."""
        if self.b_taken:
            done = self.in_flight.popleft()
            if not done.suspects:
                done.written = []           # only a suspect pair's bytes are compared
            self.b_taken = False

    def _apply_w_beat(self, data, strb, last, cycle):
        o = self.owner
        bst = self.awq[0]
        rec = bst.rec
        if last != bst.last:
            o._error(f"write id {rec.id} addr {rec.addr:#x} on {self.prefix}: wlast={int(last)} on beat "
                     f"{bst.beat} of {rec.beats} (cycle {cycle})")
        store = rec.staged.append if o.visible_at_b else (lambda a_d: o.mem.write(*a_d))
        if strb:
            line = bst.beat_addr() & ~(o.bus_bytes - 1)
            raw = data.to_bytes(o.bus_bytes, "little")
            if strb == (1 << o.bus_bytes) - 1:
                store((line, raw))
                o.stored.append((line, o.bus_bytes))
                rec.written.append((line, o.bus_bytes))
            else:
                lane = 0
                while strb:
                    if strb & 1:
                        run = (~strb & (strb + 1)).bit_length() - 1  # length of the run of ones
                        store((line + lane, raw[lane:lane + run]))
                        o.stored.append((line + lane, run))
                        rec.written.append((line + lane, run))
                        strb >>= run
                        lane += run
                    else:
                        skip = (strb & -strb).bit_length() - 1
                        strb >>= skip
                        lane += skip
        if bst.last or last:
            self.awq.popleft()
            rec.end_cycle = max(cycle, rec.start_cycle)
            for f in rec.suspects:          # (checked again when the other one ends)
                both = [(a, n, b, m) for a, n in rec.written for b, m in f.written if a < b + m and b < a + n]
                if both:
                    a, n, b, m = both[0]
                    o._error(f"write {rec.addr:#x}+{rec.length} on {self.prefix} and {f.addr:#x}+{f.length} on "
                             f"{f.port} were in flight at once and both wrote byte {max(a, b):#x}: their order "
                             f"is undefined (cycle {cycle})")
                    f.suspects.remove(rec)      # one error a pair
                    break
            if not o.visible_at_b:
                rec.data = o.mem.read(rec.addr, rec.length)
            # B goes out b_latency cycles after wlast (1: at the next edge), in AW order
            ready = max(rec.end_cycle + o.b_latency(), self.bq[-1][1] if self.bq else 0)
            self.bq.append((rec.id, ready, rec))
        else:
            bst.beat += 1


class _ReadPort:
    """The AR and R channels of one AXI read port of :class:`DmaMemory`."""

    def __init__(self, owner, prefix, bus):
        self.owner = owner
        self.ar, self.r = bus.ar, bus.r
        self.rresp = getattr(self.r, "rresp", None)
        width = len(self.r.rdata) // 8
        if width != DATA_BYTES:
            raise ValueError(f"{prefix}_rdata is {width} bytes wide, expected {DATA_BYTES}")
        self.rq = deque()               # reads waiting for / sending data
        self.r_on = False               # rvalid driven this cycle
        self.credit = 0
        self.max_in_flight = 0
        self.ar.arready.value = 1
        self.r.rvalid.value = 0

    def reset(self):
        self.rq.clear()
        self.credit = 0
        if self.r_on:
            self.r.rvalid.value = 0
            self.r_on = False

    def step(self, c, now):
        """Sample cycle ``c``'s handshakes and drive cycle ``now``'s R beat."""
        o, ar, r = self.owner, self.ar, self.r
        r_free = not self.r_on
        if self.r_on and sig_high(r.rready):
            bst = self.rq[0]
            if bst.last:
                bst.rec.end_cycle = c
                self.rq.popleft()
            else:
                bst.beat += 1
            r_free = True
        self.ar_seen = sig_high(ar.arvalid)
        if self.ar_seen:
            rec = o._new_access("read", sig_uint(ar.arid), sig_uint(ar.araddr), sig_uint(ar.arlen),
                                sig_uint(ar.arsize), sig_uint(ar.arburst), c)
            o.reads.append(rec)
            self.rq.append(_Burst(rec, c + o.read_latency))
            self.max_in_flight = max(self.max_in_flight, len(self.rq))
        # bandwidth: a beat needs a full bus width of credit; the cap stops idle bursts
        self.credit = min(self.credit + o.read_bytes_per_cycle, o.bus_bytes)
        if r_free and self.rq and self.rq[0].ready_cycle <= now and self.credit >= o.bus_bytes:
            self.credit -= o.bus_bytes
            bst = self.rq[0]
            line = bst.beat_addr() & ~(o.bus_bytes - 1)
            r.rdata.value = int.from_bytes(o.mem.read(line, o.bus_bytes), "little")
            r.rid.value = bst.rec.id
            r.rlast.value = int(bst.last)
            if self.rresp is not None:
                self.rresp.value = 0
            r.rvalid.value = 1
            self.r_on = True
        elif r_free and self.r_on:
            r.rvalid.value = 0
            self.r_on = False
