"""Send side of the RC golden model: ``RcRequester`` (WQEs to packets, go-back-N, CQEs).

Event-level, not cycle-accurate, pure Python and deterministic. The cycle model
(``model/cycle_model.py``) stays the timing reference of the transmit path.

Contents:
    ib_timeout_ns               IB local ACK timeout code to ns
    TxPacket, ResponseOutcome, RequesterCounters
    RcRequester                 send path: WQEs to packets, outstanding metadata, go-back-N, CQEs

Decisions (the RTL must follow them; the tests hold the model to them):
    - Requester timer: armed when a packet goes out with none outstanding, restarted on
      every ACK that acknowledges new packets and on every retransmission; a timeout, or a
      PSN-sequence NAK, goes back to the oldest unacknowledged PSN (after the NAK's
      implicit acknowledgment that is the NAK's PSN) and resends every outstanding packet.
      Both use the QP's retry counter, which an ACK with progress resets (IBA retry rules);
      retry ``retry_cnt + 1`` fails the WQE with TRANSPORT_RETRY_EXC_ERR. A second NAK for
      the same PSN without progress in between is ignored (a duplicated NAK frame), also
      after a timeout: only an acknowledgment of something new clears it.
    - A response changes nothing unless it belongs (``on_response``): the QP, its state,
      its peer, the AETH kind and the PSN window are checked first.
    - On an error the failing WQE gets REQ_ERR with its syndrome, whether signalled or not,
      the QP goes to ERR and every later WQE (also those posted afterwards) completes with
      REQ_ERR / WR_FLUSH_ERR, as verbs flushes every outstanding work request.
    - Two-sided verbs (``two_sided=True``): SEND, SEND_IMM and RDMA_WRITE_IMM WQEs and
      gather lists are sent as ``model.frames.build_message_frames`` builds them (the
      payload of a gather list is the concatenation of its segments, read again for a
      retransmission); they complete as WRITEs do (REQ, byte_cnt = length, the WQE's
      opcode in sop_drop_qpn [31:24]).
    - RNR NAK (AETH 0x20 | timer code): like any NAK it first acknowledges every packet
      before its PSN (and completes what that finishes); then, unless the QP's RNR retries
      are used up, the QP waits ``spec.formats.RNR_TIMER_NS[code]`` (the ACK timer is off
      meanwhile) and then resends every outstanding packet from the NAK's PSN (go-back-N),
      restarting the ACK timer; this is not a transport retry (``retry_cnt`` untouched).
      Each RNR NAK takes one of ``ctx.rnr_retry`` retries (7 = RNR_RETRY_FOREVER: never
      used up, as verbs define); an RNR NAK that finds none left fails the WQE at its PSN
      with RNR_RETRY_EXC_ERR and flushes the rest. Any acknowledgment of something new
      gives back both retry budgets (rxe ``reset_retry_counters``). While the QP waits, a
      second RNR NAK or a PSN-sequence NAK for the PSN it waits on is dropped as
      ``duplicate_nak`` (Linux rxe answers the packet after an RNR-NAKed one with a
      PSN-sequence NAK; the resend after the wait repairs both).
"""

from collections import Counter, deque
from dataclasses import dataclass, field, replace

from spec.formats import RNR_RETRY_FOREVER, RNR_TIMER_NS, CqeOp, Op, QpModify, QpState, WqeOp, qp_modify_action
from model.cqe import CqContext, CqModel
from model.read_atomic import (build_atomic_request, build_masked_atomic_request, build_read_request,
                               parse_remote_wqe)
from model.frames import (PSN_MASK, REQUEST_IMM_OPCODES, REQUEST_LAST_OPCODES, REQUEST_RETH_OPCODES, Port,
                          QpContext, build_message_frames, build_request_packet, message_packets, parse_wqe,
                          read_gather, split_message)
from model.parse import MSN_MASK, PSN_HALF, Aeth, CqeSyndrome, _NAK_NAMES, _NAK_SYNDROMES, parse_frame

__all__ = ["TxPacket", "ResponseOutcome", "RequesterCounters", "RcRequester", "ib_timeout_ns",
           "DEFAULT_TIMEOUT_NS", "DEFAULT_RETRY_CNT"]


_REMOTE_WQE_OPS = (WqeOp.RDMA_READ, WqeOp.ATOMIC_FA, WqeOp.ATOMIC_CS, WqeOp.ATOMIC_MASKED_FA, WqeOp.ATOMIC_MASKED_CS)
_RESPONSE_OPS = (Op.ACK, Op.ATOMIC_ACK, Op.READ_RESP_FIRST, Op.READ_RESP_MIDDLE, Op.READ_RESP_LAST, Op.READ_RESP_ONLY)


def ib_timeout_ns(code):
    """IB local ACK timeout ``code`` (1..31) in ns: 4.096 us x 2^code (0 = infinite, refused)."""
    if not isinstance(code, int) or not 1 <= code <= 31:
        raise ValueError(f"IB timeout code must be 1..31, got {code!r}")
    return 4096 << code


DEFAULT_TIMEOUT_NS = ib_timeout_ns(14)   # about 67 ms, the common rdma-core/NVSHMEM setting
DEFAULT_RETRY_CNT = 7


@dataclass
class TxPacket:
    """A frame the requester puts on the wire.

    Members: qpn (sending QP), psn, opcode, wqe_index, frame (bytes), retransmit (bool).
    """
    qpn: int
    psn: int
    opcode: int
    wqe_index: int
    frame: bytes
    retransmit: bool = False


@dataclass
class ResponseOutcome:
    """What the requester did with one response frame.

    Members:
        kind: "ack", "nak_psn_seq", "nak_<name>", "rnr" or None when dropped.
        reason: None, or why the frame was dropped: a frame-level reason ("bad_icrc", ...)
            or one of ``spec.formats.RESPONSE_DROP_NAMES``.
        retransmit: TxPackets to send now (go-back-N).
        cqes: CqeRecords written while handling it.
        writes: ``[(addr, bytes)]`` written to the requester's GPU memory (a READ
            response's payload, an atomic's original value), before those CQEs.
    """
    kind: object = None
    reason: object = None
    retransmit: list = field(default_factory=list)
    cqes: list = field(default_factory=list)
    writes: list = field(default_factory=list)


@dataclass
class RequesterCounters:
    """Counters of an RcRequester.

    Members:
        posted_wqes, dropped_posts (QP not RTS/ERR);
        packets_sent (first transmissions), retransmitted_packets, go_back_n (restarts),
        timeouts, payload_reread_bytes (pointer payload read again for retransmissions);
        acks_received, naks_received (Counter: psn_seq, invalid_request, remote_access,
        remote_op, rnr, ...; a dropped NAK is not counted), stale_responses (ACK/NAK of
        an acknowledged PSN), duplicate_naks, dropped_responses (Counter by reason: every
        response dropped, frame-level or ``spec.formats.RESPONSE_DROP_NAMES``);
        msn_mismatches (AETH.MSN differing from the messages acknowledged), retry_exceeded;
        rnr_resends (go-backs after an RNR wait), rnr_retry_exceeded;
        cqes, error_cqes, flushed_wqes.
    """
    posted_wqes: int = 0
    dropped_posts: int = 0
    packets_sent: int = 0
    retransmitted_packets: int = 0
    go_back_n: int = 0
    timeouts: int = 0
    payload_reread_bytes: int = 0
    acks_received: int = 0
    naks_received: Counter = field(default_factory=Counter)
    stale_responses: int = 0
    duplicate_naks: int = 0
    dropped_responses: Counter = field(default_factory=Counter)
    msn_mismatches: int = 0
    retry_exceeded: int = 0
    data_responses: int = 0    # READ RESPONSEs and ATOMIC ACKs taken
    implied_naks: int = 0      # go-backs for a READ response or ATOMIC ACK that never came
    bad_responses: int = 0     # a response that does not fit the outstanding request
    cqes: int = 0
    error_cqes: int = 0
    flushed_wqes: int = 0
    rnr_resends: int = 0
    rnr_retry_exceeded: int = 0


@dataclass
class _ReqWqe:
    """Metadata of a WQE not yet completed (the WQE itself stays in the SQ until then)."""
    index: int
    kind: str                  # "write", "nop", "error"
    signalled: bool
    length: int = 0
    raddr: int = 0
    rkey: int = 0
    src: object = None         # "pointer", "inline", "none"
    addr: int = 0
    inline: bytes = b""
    pending: int = 0           # packets not yet acknowledged
    opcode: int = 0            # the WQE's ctrl opcode (its CQE's sop_drop_qpn [31:24])
    remote: object = None      # a READ's or atomic's fields (model.read_atomic.parse_remote_wqe)
    sent: bool = True          # False while held back behind the READ/atomic limit
    segments: tuple = ()       # a pointer payload's gather list ((addr, length, lkey), ...)
    imm: object = None         # SEND_IMM / WRITE_IMM: the immediate
    se: bool = False           # the WQE asked for a solicited event


_ENDS = (Op.READ_RESP_LAST, Op.READ_RESP_ONLY)
_BEGINS = (Op.READ_RESP_FIRST, Op.READ_RESP_ONLY)


def _response_fits(got, want):
    """A READ RESPONSE of opcode ``got`` where the READ's split puts ``want``: it ends the
    READ exactly where the split does (LAST/ONLY at its last PSN, FIRST/MIDDLE before), and
    at the READ's first PSN it begins one (FIRST/ONLY); past the first PSN a FIRST or ONLY
    fits too, as a READ asked again from inside (go-back-N) is answered from its PSN as a
    new one (IBTA 9.4.6: its responses begin with FIRST or ONLY). A late MIDDLE or LAST of
    the first request at that PSN fits as well: both carry the same bytes."""
    if (got in _ENDS) != (want in _ENDS):
        return False
    return got in _BEGINS if want in _BEGINS else True


@dataclass
class _ReqPkt:
    """An unacknowledged packet, as metadata: the frame is rebuilt to retransmit it."""
    wqe: _ReqWqe
    psn: int
    opcode: int
    offset: int
    length: int


@dataclass
class _ReqQp:
    ctx: QpContext
    timeout: int
    retry_cnt: int
    state: int
    next_psn: int
    outstanding: deque = field(default_factory=deque)   # _ReqPkt, PSN order
    wqes: deque = field(default_factory=deque)          # _ReqWqe, post order
    retries: int = 0
    deadline: object = None
    blocked: bool = False      # an invalid WQE is queued: nothing after it is sent
    last_nak_psn: object = None
    msn_acked: int = 0         # WRITE messages fully acknowledged
    ci: int = 0                # consumer index: the next WQE's position (WQEBBs, mod 2^16) = its CQE's wqe_counter
    ctl_state: int = None      # the state the control path last set (a failure moves ``state`` only)
    max_rd_atomic: int = 16    # READs and atomics outstanding at most (the responder's resources)
    held: deque = field(default_factory=deque)          # _ReqWqe not yet sent (behind that limit), in order
    rnr_retries: int = 0       # RNR NAKs since the last progress
    rnr_wait: bool = False     # waiting out an RNR NAK's timer (``deadline`` is its end)

    @property
    def una(self):
        return self.outstanding[0].psn if self.outstanding else self.next_psn


class RcRequester:
    """Send side of the RC transport for RDMA WRITE and NOP WQEs, READ and atomics
    (``remote_ops``), SEND / SEND_IMM / RDMA_WRITE_IMM and gather lists (``two_sided``)
    (golden model).

    Parameters:
        port: the requester's ``model.frames.Port``.
        cqs: {cqn: ``model.cqe.CqContext``}.
        read_memory: callable(addr, n) -> bytes: GPU memory read for pointer payloads,
            at post time and again for every retransmission.
        remote_ops, write_memory: READ and atomics (their results land through write_memory).
        two_sided: take SEND, SEND_IMM, RDMA_WRITE_IMM and gather lists (module docstring).
        max_gather: with ``two_sided``, pointer segments a data WQE may have (None: any).
        A QP's RNR retry budget is its context's ``rnr_retry``.

    Members:
        port, read_memory.
        qps: {qpn: per-QP state} (``qp_info`` gives a read-only view).
        cqs: {cqn: ``model.cqe.CqModel``} with the CQEs written (``records``, ``buffer()``).
        completions: every CqeRecord in write order.
        counters: RequesterCounters.

    WQEs are decoded by ``model.frames.parse_wqe``; first transmissions are
    ``build_write_frames``' frames (identical to ``EngineModel``'s), retransmissions are
    rebuilt from the outstanding metadata with the payload read again, so they are
    byte-identical to the first ones. A WRITE completes when its last packet is
    acknowledged (REQ CQE if signalled, byte_cnt = length); a NOP when every earlier WQE
    has; an invalid WQE (``parse_wqe`` error) stops sending, and when it reaches the head
    it completes with REQ_ERR / LOCAL_QP_OP_ERR and the QP goes to ERR (as ``EngineModel``).
    """

    def __init__(self, port, cqs, read_memory, *, remote_ops=False, write_memory=None, two_sided=False,
                 max_gather=None):
        if not isinstance(port, Port):
            raise ValueError("port must be a model.frames.Port")
        if remote_ops and not callable(write_memory):
            raise ValueError("remote_ops needs write_memory(addr, bytes): READ data and atomic results land there")
        self.remote_ops, self.write_memory = remote_ops, write_memory
        self.two_sided, self.max_gather = bool(two_sided), max_gather
        for cqn, ctx in cqs.items():
            if not isinstance(ctx, CqContext) or ctx.cqn != cqn:
                raise ValueError(f"cqs[{cqn}] must be a CqContext with cqn={cqn}")
        if not callable(read_memory):
            raise ValueError("read_memory must be callable(addr, n) -> bytes")
        self.port = port
        self.read_memory = read_memory
        self.cqs = {cqn: CqModel(ctx) for cqn, ctx in cqs.items()}
        self.qps = {}
        self.completions = []
        self.counters = RequesterCounters()

    def add_qp(self, ctx, timeout_ns=DEFAULT_TIMEOUT_NS, retry_cnt=DEFAULT_RETRY_CNT, max_rd_atomic=16):
        """Create a requester QP.

        Parameters:
            ctx: QpContext (qpn, remote_qpn, dmac, dip, start_psn, mtu, cqn, state).
            timeout_ns: local ACK timeout in ns (> 0; ``ib_timeout_ns`` converts IB codes).
            retry_cnt: transport retries before TRANSPORT_RETRY_EXC_ERR (0..7, as IB).
            max_rd_atomic: READs and atomics in flight at most (1..255; the peer's
                responder resources: it remembers that many for their duplicates); a
                READ or atomic beyond it, and every WQE after it, waits until one completes.
        """
        if not isinstance(ctx, QpContext):
            raise ValueError("ctx must be a model.frames.QpContext")
        if ctx.qpn in self.qps:
            raise ValueError(f"requester QP {ctx.qpn:#x} already exists")
        if ctx.cqn not in self.cqs:
            raise ValueError(f"QP {ctx.qpn:#x} completes to CQ {ctx.cqn}, which is not in cqs")
        if not isinstance(timeout_ns, int) or timeout_ns <= 0:
            raise ValueError(f"timeout_ns must be an int > 0, got {timeout_ns!r}")
        if not isinstance(retry_cnt, int) or not 0 <= retry_cnt <= 7:
            raise ValueError(f"retry_cnt must be 0..7, got {retry_cnt!r}")
        if not isinstance(max_rd_atomic, int) or not 1 <= max_rd_atomic <= 255:
            raise ValueError(f"max_rd_atomic must be 1..255, got {max_rd_atomic!r}")
        self.qps[ctx.qpn] = _ReqQp(ctx=ctx, timeout=timeout_ns, retry_cnt=retry_cnt, state=ctx.state,
                                   next_psn=ctx.start_psn, ctl_state=ctx.state, max_rd_atomic=max_rd_atomic)

    def _qp(self, qpn):
        if qpn not in self.qps:
            raise ValueError(f"unknown requester QP {qpn!r}")
        return self.qps[qpn]

    def qp_info(self, qpn):
        """Dict of QP ``qpn``: state, next_psn, una (oldest unacknowledged PSN), outstanding
        (number of packets), wqes (not completed), retries, deadline."""
        q = self._qp(qpn)
        return dict(state=q.state, next_psn=q.next_psn, una=q.una, outstanding=len(q.outstanding),
                    wqes=len(q.wqes), retries=q.retries, deadline=q.deadline, rnr_retries=q.rnr_retries,
                    rnr_wait=q.rnr_wait)

    def idle(self):
        """True when no QP in RTS has a WQE waiting for completion."""
        return all(not q.wqes for q in self.qps.values() if q.state == QpState.RTS)

    def next_deadline(self):
        """Earliest ACK-timer deadline over all QPs (ns), or None."""
        ds = [q.deadline for q in self.qps.values() if q.deadline is not None]
        return min(ds) if ds else None

    # -- completions
    def _cqe(self, q, opcode, w, byte_cnt=0, syndrome=0):
        """The CQE of WQE ``w`` (a _ReqWqe, or the parsed Wqe of a post flushed at once)."""
        rec = self.cqs[q.ctx.cqn].push(opcode, q.ctx.qpn, w.index, byte_cnt, syndrome, wqe_opcode=w.opcode,
                                       user_index=q.ctx.user_index)
        self.completions.append(rec)
        self.counters.cqes += 1
        self.counters.error_cqes += opcode == CqeOp.REQ_ERR
        return rec

    def _fail(self, q, syndrome, out):
        """Head WQE completes with ``syndrome``, the QP goes to ERR, the rest is flushed."""
        w = q.wqes.popleft()
        out.append(self._cqe(q, CqeOp.REQ_ERR, w, 0, syndrome))
        q.state = QpState.ERR
        q.outstanding.clear()
        q.held.clear()
        q.deadline = None
        while q.wqes:
            self.counters.flushed_wqes += 1
            out.append(self._cqe(q, CqeOp.REQ_ERR, q.wqes.popleft(), 0, CqeSyndrome.WR_FLUSH_ERR))

    def _advance(self, q, out):
        """Complete WQEs at the head in order while they are fully acknowledged."""
        while q.wqes and q.state == QpState.RTS:
            w = q.wqes[0]
            if w.kind == "error":
                self._fail(q, CqeSyndrome.LOCAL_QP_OP_ERR, out)
                return
            if w.pending or not w.sent:
                return
            q.wqes.popleft()
            if w.kind in ("write", "read", "atomic"):
                q.msn_acked = (q.msn_acked + 1) & MSN_MASK
            if w.signalled:
                out.append(self._cqe(q, CqeOp.REQ, w, w.length))

    def _ack_through(self, q, psn, now, out):
        """Acknowledge every outstanding packet up to ``psn`` (must be outstanding or una-1)."""
        k = ((psn - q.una) & PSN_MASK) + 1 if q.outstanding else 0
        if k > len(q.outstanding):
            k = 0
        for _ in range(k):
            q.outstanding.popleft().wqe.pending -= 1
        if k:
            # Forward progress: the retry budgets and the timer start afresh (an RNR wait
            # keeps its end while packets are left to resend)
            q.retries = q.rnr_retries = 0
            q.last_nak_psn = None
            if not (q.rnr_wait and q.outstanding):
                q.rnr_wait = False
                q.deadline = now + q.timeout if q.outstanding else None
        self._advance(q, out)

    # -- sending
    def _payload(self, w, off, n, reread):
        if w.src == "pointer" and n:
            data = read_gather(self.read_memory, w.segments, off, n)
            if reread:
                self.counters.payload_reread_bytes += n
            return data
        return w.inline[off:off + n]

    def post(self, qpn, wqe_bytes, now=0):
        """Post one WQE to QP ``qpn`` at time ``now`` (ns); returns the TxPackets to send.

        A QP in ERR completes the WQE at once with REQ_ERR / WR_FLUSH_ERR; a QP in any
        other state but RTS drops it (as ``EngineModel``; counted in dropped_posts).
        """
        q = self._qp(qpn)
        w = parse_wqe(wqe_bytes, self.two_sided, self.max_gather)
        w.index, q.ci = q.ci, (q.ci + w.num_wqebbs) & 0xFFFF     # mlx5 reports the position, not the field
        self.counters.posted_wqes += 1
        if q.state == QpState.ERR:
            self.counters.flushed_wqes += 1
            self._cqe(q, CqeOp.REQ_ERR, w, 0, CqeSyndrome.WR_FLUSH_ERR)
            return []
        if q.state != QpState.RTS:
            self.counters.dropped_posts += 1
            return []
        out = []
        rw = None
        if self.remote_ops and not w.valid and w.opcode in _REMOTE_WQE_OPS and w.ds:
            rw = parse_remote_wqe(wqe_bytes)
            if rw["kind"] is not None:
                return self._post_remote(q, w, rw, now)
        if not w.valid:
            q.blocked = True
            q.wqes.append(_ReqWqe(w.index, "error", True, opcode=w.opcode))
            self._advance(q, out)
            return []
        if w.opcode in (WqeOp.NOP, WqeOp.DUMP):   # parse_wqe accepts NOP, DUMP and RDMA_WRITE
            # a DUMP (a local read) completes as a NOP: after every WQE before it
            q.wqes.append(_ReqWqe(w.index, "nop", w.cq_update, opcode=w.opcode))
            if not q.blocked:
                self._advance(q, out)
            return []
        # a data WQE (WRITE; two-sided: WRITE_IMM, SEND, SEND_IMM): its message's packets
        rec = _ReqWqe(w.index, "write", w.cq_update, w.length, w.raddr, w.rkey, w.kind, w.addr, w.inline_data,
                      opcode=w.opcode, segments=w.segments,
                      imm=w.imm if w.opcode in (WqeOp.SEND_IMM, WqeOp.RDMA_WRITE_IMM) else None, se=w.solicited)
        return self._enqueue(q, rec, now)

    def _enqueue(self, q, rec, now):
        """A WRITE, READ or atomic joins the QP's WQEs; it is sent now unless it must wait
        (behind an invalid WQE: never, it is flushed; behind the READ/atomic limit: when a
        READ or atomic completes)."""
        q.wqes.append(rec)
        if q.blocked:          # behind an invalid WQE: never sent, flushed when it fails
            return []
        if q.held or (rec.kind in ("read", "atomic") and self._remote_in_flight(q) >= q.max_rd_atomic):
            rec.sent = False
            q.held.append(rec)
            return []
        return self._send(q, rec, now)

    @staticmethod
    def _remote_in_flight(q):
        return sum(1 for w in q.wqes if w.kind in ("read", "atomic") and w.sent)

    def _release(self, q, now):
        """Send held WQEs, in order, while the READ/atomic limit allows."""
        tx = []
        while q.held and q.state == QpState.RTS:
            rec = q.held[0]
            if rec.kind in ("read", "atomic") and self._remote_in_flight(q) >= q.max_rd_atomic:
                break
            q.held.popleft()
            rec.sent = True
            tx += self._send(q, rec, now)
        return tx

    def _send(self, q, rec, now):
        if rec.kind in ("read", "atomic"):
            return self._send_remote(q, rec, now)
        qpn = q.ctx.qpn
        payload = self._payload(rec, 0, rec.length, False)
        psn0 = q.next_psn
        frames = build_message_frames(q.ctx, self.port, rec.opcode, payload, psn0, raddr=rec.raddr, rkey=rec.rkey,
                                      imm=rec.imm, se=rec.se)
        tx = []
        for i, ((op, off, n), f) in enumerate(zip(message_packets(rec.opcode, rec.length, q.ctx.mtu), frames)):
            psn = (psn0 + i) & PSN_MASK
            q.outstanding.append(_ReqPkt(rec, psn, op, off, n))
            tx.append(TxPacket(qpn, psn, op, rec.index, f))
        rec.pending = len(frames)
        q.next_psn = (psn0 + len(frames)) & PSN_MASK
        if q.deadline is None:
            q.deadline = now + q.timeout
        self.counters.packets_sent += len(tx)
        return tx

    def _post_remote(self, q, w, rw, now):
        """A READ or atomic WQE (``parse_remote_wqe``'s fields)."""
        if rw["kind"] == "read":
            rec = _ReqWqe(w.index, "read", w.cq_update, rw["length"], rw["raddr"], rw["rkey"], "pointer", rw["addr"],
                          opcode=w.opcode, remote=rw)
        else:
            rec = _ReqWqe(w.index, "atomic", w.cq_update, rw["nbytes"], rw["raddr"], rw["rkey"], "atomic", rw["addr"],
                          opcode=w.opcode, remote=rw)
        return self._enqueue(q, rec, now)

    def _send_remote(self, q, rec, now):
        """A READ's or atomic's request packet; the PSNs its responses will carry wait as
        outstanding packets (a READ of n MTUs takes n)."""
        if rec.kind == "read":
            ops = {Op.WRITE_FIRST: Op.READ_RESP_FIRST, Op.WRITE_MIDDLE: Op.READ_RESP_MIDDLE,
                   Op.WRITE_LAST: Op.READ_RESP_LAST, Op.WRITE_ONLY: Op.READ_RESP_ONLY}
            parts = [(ops[op], off, n) for op, off, n in split_message(rec.length, q.ctx.mtu)]
        else:
            parts = [(Op.ATOMIC_ACK, 0, rec.length)]
        psn0 = q.next_psn
        for i, (op, off, n) in enumerate(parts):
            q.outstanding.append(_ReqPkt(rec, (psn0 + i) & PSN_MASK, op, off, n))
        rec.pending = len(parts)
        q.next_psn = (psn0 + len(parts)) & PSN_MASK
        if q.deadline is None:
            q.deadline = now + q.timeout
        self.counters.packets_sent += 1
        return [self._remote_request(q, rec, psn0, 0)]

    def _remote_request(self, q, rec, psn, off, retransmit=False):
        """The request packet of READ or atomic ``rec`` at ``psn`` (a READ resumed ``off``
        bytes in asks for the rest)."""
        rw = rec.remote
        if rec.kind == "read":
            frame = build_read_request(q.ctx, self.port, rec.raddr + off, rec.rkey, rec.length - off, psn)
            op = Op.READ_REQUEST
        elif rw["op"] in (Op.FETCH_ADD, Op.COMPARE_SWAP):
            swap_add, compare = rw["operands"]
            frame = build_atomic_request(q.ctx, self.port, rw["op"], rec.raddr, rec.rkey, swap_add,
                                         compare if rw["op"] == Op.COMPARE_SWAP else 0, psn, aligned=False)
            op = rw["op"]
        else:
            frame = build_masked_atomic_request(q.ctx, self.port, rw["op"], rec.raddr, rec.rkey, rw["operands"],
                                                rw["nbytes"], psn, aligned=False)
            op = rw["op"]
        return TxPacket(q.ctx.qpn, psn, op, rec.index, frame, retransmit)

    def _rebuild(self, q, m):
        if m.wqe.kind in ("read", "atomic"):
            # only the first outstanding packet of a READ asks again (for the rest of it)
            first = next(x for x in q.outstanding if x.wqe is m.wqe)
            return self._remote_request(q, m.wqe, m.psn, m.offset, True) if first is m else None
        w = m.wqe
        # the same packet as the first time: RETH, ImmDt and SE where that one had them
        frame = build_request_packet(
            q.ctx, self.port, m.opcode, m.psn, self._payload(w, m.offset, m.length, True),
            reth=(w.raddr, w.rkey, w.length) if m.opcode in REQUEST_RETH_OPCODES else None,
            imm=w.imm if m.opcode in REQUEST_IMM_OPCODES else None,
            se=w.se and w.opcode != WqeOp.RDMA_WRITE and m.opcode in REQUEST_LAST_OPCODES)
        return TxPacket(q.ctx.qpn, m.psn, m.opcode, w.index, frame, True)

    def _retry(self, q, now, out):
        """Go-back-N from the oldest unacknowledged PSN, or fail when retries are used up."""
        q.retries += 1
        if q.retries > q.retry_cnt:
            self.counters.retry_exceeded += 1
            self._fail(q, CqeSyndrome.TRANSPORT_RETRY_EXC_ERR, out)
            return []
        return self._resend(q, now)

    def _resend(self, q, now):
        """Every outstanding packet again, from the oldest unacknowledged PSN; the ACK timer restarts."""
        tx = [t for t in (self._rebuild(q, m) for m in q.outstanding) if t is not None]
        self.counters.go_back_n += 1
        self.counters.retransmitted_packets += len(tx)
        q.rnr_wait = False
        q.deadline = now + q.timeout
        return tx

    def _rnr(self, q, code, now, res):
        """An RNR NAK for the oldest unacknowledged PSN: wait, or fail when the QP's RNR
        retries are used up (rnr_retry 7: never)."""
        if q.state != QpState.RTS:          # what the NAK acknowledged failed the QP first
            return res
        limit = q.ctx.rnr_retry
        if limit != RNR_RETRY_FOREVER and q.rnr_retries >= limit:
            self.counters.rnr_retry_exceeded += 1
            self._fail(q, CqeSyndrome.RNR_RETRY_EXC_ERR, res.cqes)
            return res
        if limit != RNR_RETRY_FOREVER:
            q.rnr_retries += 1
        q.rnr_wait = True
        q.deadline = now + RNR_TIMER_NS[code]
        return res

    def on_timeout(self, now):
        """Fire every timer due at ``now`` (ns): an ACK timeout (a transport retry) or
        the end of an RNR wait (the resend). Returns (TxPackets, CqeRecords)."""
        tx, cqes = [], []
        for qpn in sorted(self.qps):
            q = self.qps[qpn]
            if q.deadline is None or q.deadline > now or q.state != QpState.RTS:
                continue
            if q.rnr_wait:
                self.counters.rnr_resends += 1
                tx += self._resend(q, now)
                continue
            self.counters.timeouts += 1
            tx += self._retry(q, now, cqes)
        return tx, cqes

    def modify(self, qpn, state, start_psn=None):
        """Move QP ``qpn`` to ``state`` through the control path (QP_MODIFY), as
        ``spec.formats.qp_modify_action`` says for the state the control path last set:
        refused (returns None, nothing changes), the send side started afresh (PSN
        ``start_psn``, default the QP's), a flush (to ERR: the WQE of the first
        unacknowledged PSN and every later one complete with WR_FLUSH_ERR, signaled or
        not, and so does every WQE posted later), or only the state. Outside RTS the QP
        takes no response (``qp_state``). Returns the CqeRecords the move produced."""
        if state not in range(QpState.ERR + 1):
            raise ValueError(f"unknown QP state {state!r}")
        q = self._qp(qpn)
        action = qp_modify_action(q.ctl_state, state)
        if action == QpModify.REJECT:
            return None
        out = []
        if action in (QpModify.CREATE, QpModify.SEND_RESET):
            ctx = replace(q.ctx, state=state, start_psn=q.ctx.start_psn if start_psn is None else start_psn)
            self.qps[qpn] = _ReqQp(ctx=ctx, timeout=q.timeout, retry_cnt=q.retry_cnt, state=state,
                                   next_psn=ctx.start_psn, ctl_state=state)
            return out
        q.ctl_state = state
        if action == QpModify.FLUSH and q.state != QpState.ERR:
            if q.wqes:
                self._fail(q, CqeSyndrome.WR_FLUSH_ERR, out)
            q.state = QpState.ERR
            q.outstanding.clear()
            q.deadline = None
        elif action == QpModify.CONFIG and q.state != QpState.ERR:
            q.state = state
        return out

    def _drop_response(self, res, reason):
        self.counters.dropped_responses[reason] += 1
        res.reason = reason
        return res

    def on_response(self, frame, now):
        """Handle one response frame received at ``now`` (ns) (``_on_response``), then
        send what a completed READ or atomic lets go (``ResponseOutcome.retransmit``
        holds those packets too: everything to send now)."""
        res = self._on_response(frame, now)
        for q in self.qps.values():
            if q.held:
                res.retransmit += self._release(q, now)
        return res

    def _on_response(self, frame, now):
        """Handle one ACK/NAK frame received at ``now`` (ns); returns a ResponseOutcome.

        A response changes the QP only when it belongs (``spec.formats.RESPONSE_DROPS``,
        checked in that order): its destination QPN is a QP of this requester (all 24
        bits); the QP is in RTS; it comes from the QP's peer (source IPv4 and MAC address
        the context's ``dip`` and ``dmac``); its AETH is not of the reserved kind; its PSN
        is not after the last PSN sent (``psn_ahead``) and not already acknowledged
        (``stale``: an ACK that acknowledges nothing new, a NAK of an acknowledged PSN);
        a PSN-sequence NAK is not a repeat of the last one with no progress in between
        (``duplicate_nak``). Anything else is dropped, counted in
        ``counters.dropped_responses`` by reason, and changes nothing.

        ACK: acknowledges every outstanding packet through its PSN. NAK: acknowledges every
        packet before its PSN, then PSN sequence error -> go-back-N from that PSN; invalid
        request / remote access / remote operational error -> REQ_ERR with 0x12 / 0x13 /
        0x14 (another code: BAD_RESP_ERR 0x10), QP to ERR, the rest flushed. RNR NAK:
        acknowledges every packet before its PSN, then the RNR wait or failure (module
        docstring).
        """
        c = self.counters
        res = ResponseOutcome()
        p, reason = parse_frame(frame, _RESPONSE_OPS if self.remote_ops else (Op.ACK,), self.port)
        if p is None:
            return self._drop_response(res, reason)
        q = self.qps.get(p.dqpn)
        if q is None:
            return self._drop_response(res, "unknown_qp")
        if q.state != QpState.RTS:
            return self._drop_response(res, "qp_state")
        if not p.from_peer(q.ctx):
            return self._drop_response(res, "wrong_peer")
        syndrome, msn = p.aeth if p.aeth is not None else (Aeth.ACK, None)    # (a READ RESPONSE MIDDLE)
        cls = syndrome >> 5
        if cls == Aeth.KIND_RESERVED or syndrome & 0x80 or (p.opcode != Op.ACK and cls != Aeth.KIND_ACK):
            return self._drop_response(res, "bad_aeth")           # (bit 7 is reserved too)
        # The window: PSNs sent and not yet acknowledged, (acked, last sent].
        last = (q.next_psn - 1) & PSN_MASK
        acked = (q.una - 1) & PSN_MASK
        if ((last - p.psn) & PSN_MASK) >= PSN_HALF:
            return self._drop_response(res, "psn_ahead")
        if ((acked - p.psn) & PSN_MASK) < PSN_HALF:
            c.stale_responses += 1
            return self._drop_response(res, "stale")
        if p.opcode != Op.ACK:
            return self._data_response(q, p, now, res)
        if cls == Aeth.KIND_ACK:
            c.acks_received += 1
            res.kind = "ack"
            # an ACK beyond a READ or atomic whose response has not come: that response
            # was lost (a responder answers in PSN order): an implied NAK at its PSN
            if self._stops_at_response(q, p.psn, now, res):
                return self._implied_nak(q, now, res)
            self._ack_through(q, p.psn, now, res.cqes)
            self._check_msn(q, msn)
            return res
        if cls == Aeth.KIND_RNR:
            if q.rnr_wait and p.psn == q.una:          # the same RNR NAK again while waiting
                c.duplicate_naks += 1
                return self._drop_response(res, "duplicate_nak")
            c.naks_received["rnr"] += 1
            res.kind = "rnr"
            # every packet before its PSN is acknowledged (a READ's or atomic's only by
            # its response: one missing there was lost, go back to it)
            if p.psn != q.una and self._stops_at_response(q, (p.psn - 1) & PSN_MASK, now, res):
                return self._implied_nak(q, now, res)
            if p.psn != q.una:
                self._ack_through(q, (p.psn - 1) & PSN_MASK, now, res.cqes)
            self._check_msn(q, msn)
            return self._rnr(q, syndrome & 0x1F, now, res)
        code = syndrome & 0x1F
        name = _NAK_NAMES.get(code, f"nak_code_{code}")
        if code == 0 and p.psn == q.una and (q.last_nak_psn == p.psn or q.rnr_wait):
            c.duplicate_naks += 1
            return self._drop_response(res, "duplicate_nak")
        c.naks_received[name] += 1
        res.kind = "nak_" + name
        # A NAK acknowledges every packet before its PSN (but a READ's or atomic's packets
        # only by their responses: one still missing there was lost, go back to it)
        if p.psn != q.una and self._stops_at_response(q, (p.psn - 1) & PSN_MASK, now, res):
            if code != 0:
                # the responder failed later on: the READ or atomic cannot be answered now
                self._fail(q, _NAK_SYNDROMES.get(code, CqeSyndrome.BAD_RESP_ERR), res.cqes)
                return res
            return self._implied_nak(q, now, res)
        if p.psn != q.una:
            self._ack_through(q, (p.psn - 1) & PSN_MASK, now, res.cqes)
        self._check_msn(q, msn)
        if code == 0:
            q.last_nak_psn = p.psn
            res.retransmit = self._retry(q, now, res.cqes)
            return res
        self._fail(q, _NAK_SYNDROMES.get(code, CqeSyndrome.BAD_RESP_ERR), res.cqes)
        return res

    def _stops_at_response(self, q, upto, now, res):
        """Acknowledge up to ``upto`` as an ACK or NAK does, but not past a READ or atomic
        packet still waiting for its response: stop before it and say so (True)."""
        gap = next((m for m in q.outstanding if m.wqe.kind in ("read", "atomic")), None)
        if gap is None or ((upto - gap.psn) & PSN_MASK) >= PSN_HALF:
            return False
        if gap is not q.outstanding[0]:
            self._ack_through(q, (gap.psn - 1) & PSN_MASK, now, res.cqes)
        return True

    def _implied_nak(self, q, now, res):
        """A response is missing before the one received: go back to the first
        outstanding PSN, once per PSN (as a repeated sequence NAK is ignored)."""
        if q.last_nak_psn == q.una:
            self.counters.duplicate_naks += 1
            return self._drop_response(res, "duplicate_nak")
        self.counters.implied_naks += 1
        res.kind = "implied_nak"
        q.last_nak_psn = q.una
        res.retransmit = self._retry(q, now, res.cqes)
        return res

    def _data_response(self, q, p, now, res):
        """A READ RESPONSE or ATOMIC ACKNOWLEDGE inside the window: the next one expected
        is written to local memory and acknowledges its packet (a READ completes with
        its last response, an atomic with its ACK); one further ahead means the ones
        between were lost (implied NAK); one that does not fit what is outstanding at
        its PSN fails the QP (BAD_RESP_ERR)."""
        # WRITEs before the first READ or atomic waiting are acknowledged by it (a
        # responder answers in PSN order); that one is then the head
        if not self._stops_at_response(q, p.psn, now, res):
            fits = False                    # a response to a PSN that asked for none
        elif p.psn != q.una:
            return self._implied_nak(q, now, res)
        else:
            fits = None
        head = q.outstanding[0] if q.outstanding else None
        atomic_ack = p.opcode == Op.ATOMIC_ACK
        if fits is None:
            fits = (head.wqe.kind == "atomic") if atomic_ack else (
                head.wqe.kind == "read" and _response_fits(p.opcode, head.opcode) and len(p.payload) == head.length)
        if not fits:
            self.counters.bad_responses += 1
            res.kind = "bad_response"
            self._fail(q, CqeSyndrome.BAD_RESP_ERR, res.cqes)
            return res
        w = head.wqe
        if atomic_ack:
            # The original value as NVSHMEM reads it back (3.4's ibgda_device.cuh): a 4-byte
            # one big-endian (it byte-swaps it), an 8-byte one in host order (mlx5's
            # atomic_req_8B_endianness_mode, which NVSHMEM checks at set-up)
            v = p.orig & ((1 << 8 * w.length) - 1)
            res.writes.append((w.addr, v.to_bytes(w.length, "big" if w.length == 4 else "little")))
        elif head.length:
            res.writes.append((w.addr + head.offset, p.payload))
        for addr, data in res.writes:
            self.write_memory(addr, data)
        self.counters.data_responses += 1
        res.kind = "atomic_ack" if atomic_ack else "read_response"
        self._ack_through(q, p.psn, now, res.cqes)
        if p.aeth is not None:
            self._check_msn(q, p.aeth[1])
        return res

    def _check_msn(self, q, msn):
        if q.state == QpState.RTS and msn != q.msn_acked:
            self.counters.msn_mismatches += 1

