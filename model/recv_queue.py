"""Golden model of an mlx5 receive queue in GPU (or host) memory.

The layout is the one rdma-core's mlx5 provider writes (``providers/mlx5/qp.c``,
``mlx5_post_recv``), with every constant from ``spec.formats``:

    - The queue is a ring of ``1 << log_size`` receive WQEs of ``1 << log_stride`` bytes
      each (a power of two, at least one 16-byte segment): WQE ``n`` (a free-running
      count) lives at ``base + ((n & (size - 1)) << log_stride)``.
    - A receive WQE is a list of 16-byte data segments (``RECV_DATA_SEG``: byte_count u32,
      lkey u32, addr u64, big-endian), one per scatter entry, in scatter order. A WQE
      with fewer entries than fit in its stride ends at a segment whose lkey is
      ``INVALID_LKEY`` (byte_count 0, addr 0); a WQE that is full has no terminator.
      rdma-core leaves out scatter entries of length 0, so a written WQE never holds one;
      the parser keeps one if it finds it (it holds no bytes).
    - The producer (the GPU model or the CPU) writes the WQE, then the QP's doorbell
      record: BE32(head & 0xffff) at ``dbr + DBR_RECV_OFFSET``, ``head`` being the number
      of WQEs posted so far. The consumer (the engine's responder) learns from that
      counter how many WQEs are posted: those between its own consumer count and the
      counter (mod 2^16). No doorbell register is written for a receive queue.

Contents:
    RecvQueue          description of one receive queue (base, log_size, log_stride, dbr)
    build_recv_wqe     the bytes of one receive WQE from its scatter list
    parse_recv_wqe     a receive WQE's bytes back to its scatter list
    recv_wqe_writes    the memory writes that post receive WQEs (WQEs, then the counter)
    RecvPoster         a producer that posts into a memory object (``write(addr, bytes)``)
    posted_count       how many WQEs a doorbell-record counter says are posted past a consumer count
"""

from dataclasses import dataclass

from spec.formats import DBR_RECV_OFFSET, DS_UNIT, INVALID_LKEY, RECV_DATA_SEG, pack, unpack

__all__ = ["RecvQueue", "build_recv_wqe", "parse_recv_wqe", "recv_wqe_writes", "RecvPoster", "posted_count",
           "RECV_COUNTER_MASK"]

RECV_COUNTER_MASK = 0xFFFF         # the doorbell record and a CQE's wqe_counter carry 16 bits of the count
_SEG = DS_UNIT                     # a receive data segment is one 16-byte unit


def _u(value, bits, name):
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << bits:
        raise ValueError(f"{name} must be an int of {bits} bits, got {value!r}")
    return value


@dataclass(frozen=True)
class RecvQueue:
    """One receive queue as the QP's creator lays it out.

    Parameters:
        base: address of WQE slot 0 (aligned to the stride).
        log_size: log2 of the number of WQEs (0..15: the 16-bit counter must not wrap
            inside the ring).
        log_stride: log2 of the bytes of one WQE (4..10: one to 64 data segments).
        dbr: address of the QP's doorbell record (4-byte aligned); the receive counter is
            at ``dbr + DBR_RECV_OFFSET``.

    Members: size (WQEs), stride (bytes), max_segments (data segments a WQE holds),
    counter_address, slot_address(n).
    """
    base: int
    log_size: int
    log_stride: int
    dbr: int

    def __post_init__(self):
        _u(self.base, 64, "RecvQueue.base")
        _u(self.dbr, 64, "RecvQueue.dbr")
        if isinstance(self.log_size, bool) or not isinstance(self.log_size, int) or not 0 <= self.log_size <= 15:
            raise ValueError(f"RecvQueue.log_size must be 0..15, got {self.log_size!r}")
        if isinstance(self.log_stride, bool) or not isinstance(self.log_stride, int) \
                or not 4 <= self.log_stride <= 10:
            raise ValueError(f"RecvQueue.log_stride must be 4..10 (16 B .. 1 KiB), got {self.log_stride!r}")
        if self.base % self.stride:
            raise ValueError(f"RecvQueue.base must be aligned to the stride ({self.stride} B), got {self.base:#x}")
        if self.dbr % 4:
            raise ValueError(f"RecvQueue.dbr must be 4-byte aligned, got {self.dbr:#x}")

    @property
    def size(self):
        """Number of WQE slots."""
        return 1 << self.log_size

    @property
    def stride(self):
        """Bytes of one WQE."""
        return 1 << self.log_stride

    @property
    def max_segments(self):
        """Data segments one WQE holds."""
        return self.stride // _SEG

    @property
    def counter_address(self):
        """Address of the receive counter in the doorbell record."""
        return self.dbr + DBR_RECV_OFFSET

    def slot_address(self, n):
        """Address of WQE ``n`` (a free-running count: only ``n mod size`` matters)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"WQE number must be an int >= 0, got {n!r}")
        return self.base + ((n & (self.size - 1)) << self.log_stride)


def _segments(segments):
    out = []
    for i, s in enumerate(segments):
        if not (isinstance(s, (tuple, list)) and len(s) in (2, 3)):
            raise ValueError(f"scatter entry {i} must be (addr, length) or (addr, length, lkey), got {s!r}")
        addr, length = s[0], s[1]
        lkey = s[2] if len(s) == 3 else 0
        _u(addr, 64, f"scatter entry {i} addr")
        _u(length, 31, f"scatter entry {i} length")
        _u(lkey, 32, f"scatter entry {i} lkey")
        if lkey == INVALID_LKEY:
            raise ValueError(f"scatter entry {i}: lkey {INVALID_LKEY:#x} is the terminator's (INVALID_LKEY)")
        out.append((addr, length, lkey))
    return out


def build_recv_wqe(segments, log_stride):
    """The bytes of one receive WQE (``1 << log_stride`` of them).

    Parameters:
        segments: the scatter list, ``(addr, length)`` or ``(addr, length, lkey)`` each
            (lkey default 0; INVALID_LKEY is refused: it is the terminator's). Entries of
            length 0 are written as given (rdma-core would leave them out).
        log_stride: log2 of the WQE size (4..10).

    One RECV_DATA_SEG per entry; when fewer entries than fit, a terminator follows (lkey
    INVALID_LKEY, byte_count 0, addr 0) and the rest of the WQE is zero.
    """
    if isinstance(log_stride, bool) or not isinstance(log_stride, int) or not 4 <= log_stride <= 10:
        raise ValueError(f"log_stride must be 4..10, got {log_stride!r}")
    segs = _segments(segments)
    room = (1 << log_stride) // _SEG
    if len(segs) > room:
        raise ValueError(f"{len(segs)} scatter entries do not fit a {1 << log_stride}-byte WQE ({room} at most)")
    b = bytearray(1 << log_stride)
    for i, (addr, length, lkey) in enumerate(segs):
        pack(RECV_DATA_SEG, b, i * _SEG, byte_count=length, lkey=lkey, addr=addr)
    if len(segs) < room:
        pack(RECV_DATA_SEG, b, len(segs) * _SEG, byte_count=0, lkey=INVALID_LKEY, addr=0)
    return bytes(b)


def parse_recv_wqe(wqe_bytes):
    """A receive WQE's scatter list: ``[(addr, length, lkey)]`` in order.

    Reads 16-byte segments until one whose lkey is INVALID_LKEY (not part of the list)
    or the end of the bytes given (a whole WQE: a multiple of 16 bytes). ``length`` is
    the segment's byte_count (0: a segment that holds no bytes)."""
    b = bytes(wqe_bytes)
    if not b or len(b) % _SEG:
        raise ValueError(f"a receive WQE is a non-empty multiple of {_SEG} bytes, got {len(b)}")
    out = []
    for off in range(0, len(b), _SEG):
        d = unpack(RECV_DATA_SEG, b, off)
        if d["lkey"] == INVALID_LKEY:
            break
        out.append((d["addr"], d["byte_count"], d["lkey"]))
    return out


def posted_count(counter, consumed):
    """WQEs posted and not yet consumed: the doorbell-record ``counter`` (its 16 bits)
    minus the consumer's count ``consumed``, mod 2^16."""
    return ((counter & RECV_COUNTER_MASK) - consumed) & RECV_COUNTER_MASK


def recv_wqe_writes(rq, head, wqes):
    """The memory writes that post receive WQEs ``head``, ``head + 1``, ... of ``rq``.

    Parameters:
        rq: RecvQueue.
        head: WQEs posted before these (the producer's free-running count, >= 0).
        wqes: scatter lists, one per WQE (see ``build_recv_wqe``).

    Returns ``(writes, new_head)``: ``writes`` is ``[(addr, bytes)]``, every WQE first and
    then the doorbell record's counter BE32(new_head & 0xffff), in that order (a consumer
    that sees the counter must find the WQEs written). Refuses to post more WQEs than
    the ring holds in one call.
    """
    if not isinstance(rq, RecvQueue):
        raise ValueError("rq must be a model.recv_queue.RecvQueue")
    if isinstance(head, bool) or not isinstance(head, int) or head < 0:
        raise ValueError(f"head must be an int >= 0, got {head!r}")
    wqes = list(wqes)
    if len(wqes) > rq.size:
        raise ValueError(f"{len(wqes)} WQEs do not fit a ring of {rq.size}")
    writes = [(rq.slot_address(head + i), build_recv_wqe(s, rq.log_stride)) for i, s in enumerate(wqes)]
    new_head = head + len(wqes)
    writes.append((rq.counter_address, (new_head & RECV_COUNTER_MASK).to_bytes(4, "big")))
    return writes, new_head


class RecvPoster:
    """Producer side of one receive queue: posts WQEs into memory.

    Parameters:
        rq: RecvQueue.
        memory: object with ``write(addr, bytes)`` (``model.memory.SparseMemory``, the
            testbench's GPU memory).
        head: WQEs posted before (default 0).

    Members: rq, memory, head (WQEs posted so far, free-running).

    The poster does not know what the consumer has taken: posting more than the ring
    holds beyond the consumer overwrites WQEs not yet consumed, as a careless producer
    would; the caller keeps its posts within the ring.
    """

    def __init__(self, rq, memory, head=0):
        if not isinstance(rq, RecvQueue):
            raise ValueError("rq must be a model.recv_queue.RecvQueue")
        if not callable(getattr(memory, "write", None)):
            raise ValueError("memory must have write(addr, bytes)")
        if isinstance(head, bool) or not isinstance(head, int) or head < 0:
            raise ValueError(f"head must be an int >= 0, got {head!r}")
        self.rq, self.memory, self.head = rq, memory, head

    def post(self, *wqes):
        """Post one WQE per scatter list given, then ring the doorbell record once;
        returns the WQE numbers posted (their wqe_counter is ``n & 0xffff``)."""
        writes, new_head = recv_wqe_writes(self.rq, self.head, wqes)
        for addr, data in writes:
            self.memory.write(addr, data)
        first, self.head = self.head, new_head
        return list(range(first, new_head))
