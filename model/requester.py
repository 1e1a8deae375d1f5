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
"""

from collections import Counter, deque
from dataclasses import dataclass, field, replace

from spec.formats import CqeOp, Op, QpModify, QpState, WqeOp, qp_modify_action
from model.cqe import CqContext, CqModel
from model.frames import (PSN_MASK, Port, QpContext, build_packet, build_write_frames, parse_wqe,
                          split_message)
from model.parse import MSN_MASK, PSN_HALF, Aeth, CqeSyndrome, _NAK_NAMES, _NAK_SYNDROMES, parse_frame

__all__ = ["TxPacket", "ResponseOutcome", "RequesterCounters", "RcRequester", "ib_timeout_ns",
           "DEFAULT_TIMEOUT_NS", "DEFAULT_RETRY_CNT"]


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
    """
    kind: object = None
    reason: object = None
    retransmit: list = field(default_factory=list)
    cqes: list = field(default_factory=list)


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
    cqes: int = 0
    error_cqes: int = 0
    flushed_wqes: int = 0


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

    @property
    def una(self):
        return self.outstanding[0].psn if self.outstanding else self.next_psn


class RcRequester:
    """Send side of the RC transport for RDMA WRITE and NOP WQEs (golden model).

    Parameters:
        port: the requester's ``model.frames.Port``.
        cqs: {cqn: ``model.cqe.CqContext``}.
        read_memory: callable(addr, n) -> bytes: GPU memory read for pointer payloads,
            at post time and again for every retransmission.

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

    def __init__(self, port, cqs, read_memory):
        if not isinstance(port, Port):
            raise ValueError("port must be a model.frames.Port")
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

    def add_qp(self, ctx, timeout_ns=DEFAULT_TIMEOUT_NS, retry_cnt=DEFAULT_RETRY_CNT):
        """Create a requester QP.

        Parameters:
            ctx: QpContext (qpn, remote_qpn, dmac, dip, start_psn, mtu, cqn, state).
            timeout_ns: local ACK timeout in ns (> 0; ``ib_timeout_ns`` converts IB codes).
            retry_cnt: transport retries before TRANSPORT_RETRY_EXC_ERR (0..7, as IB).
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
        self.qps[ctx.qpn] = _ReqQp(ctx=ctx, timeout=timeout_ns, retry_cnt=retry_cnt, state=ctx.state,
                                   next_psn=ctx.start_psn, ctl_state=ctx.state)

    def _qp(self, qpn):
        if qpn not in self.qps:
            raise ValueError(f"unknown requester QP {qpn!r}")
        return self.qps[qpn]

    def qp_info(self, qpn):
        """Dict of QP ``qpn``: state, next_psn, una (oldest unacknowledged PSN), outstanding
        (number of packets), wqes (not completed), retries, deadline."""
        q = self._qp(qpn)
        return dict(state=q.state, next_psn=q.next_psn, una=q.una, outstanding=len(q.outstanding),
                    wqes=len(q.wqes), retries=q.retries, deadline=q.deadline)

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
            if w.pending:
                return
            q.wqes.popleft()
            if w.kind == "write":
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
            # Forward progress: the retry budget and the timer start afresh.
            q.retries = 0
            q.last_nak_psn = None
            q.deadline = now + q.timeout if q.outstanding else None
        self._advance(q, out)

    # -- sending
    def _payload(self, w, off, n, reread):
        if w.src == "pointer" and n:
            data = bytes(self.read_memory(w.addr + off, n))
            if len(data) != n:
                raise ValueError(f"read_memory({w.addr + off:#x}, {n}) returned {len(data)} bytes")
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
        w = parse_wqe(wqe_bytes)
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
        rec = _ReqWqe(w.index, "write", w.cq_update, w.length, w.raddr, w.rkey, w.kind, w.addr, w.inline_data,
                      opcode=w.opcode)
        q.wqes.append(rec)
        if q.blocked:          # behind an invalid WQE: never sent, flushed when it fails
            return []
        payload = self._payload(rec, 0, rec.length, False)
        psn0 = q.next_psn
        frames = build_write_frames(q.ctx, self.port, rec.raddr, rec.rkey, payload, psn0)
        tx = []
        for i, ((op, off, n), f) in enumerate(zip(split_message(rec.length, q.ctx.mtu), frames)):
            psn = (psn0 + i) & PSN_MASK
            q.outstanding.append(_ReqPkt(rec, psn, op, off, n))
            tx.append(TxPacket(qpn, psn, op, rec.index, f))
        rec.pending = len(frames)
        q.next_psn = (psn0 + len(frames)) & PSN_MASK
        if q.deadline is None:
            q.deadline = now + q.timeout
        self.counters.packets_sent += len(tx)
        return tx

    def _rebuild(self, q, m):
        w = m.wqe
        reth = (w.raddr, w.rkey, w.length) if m.opcode in (Op.WRITE_FIRST, Op.WRITE_ONLY) else None
        frame = build_packet(q.ctx, self.port, m.opcode, m.psn, self._payload(w, m.offset, m.length, True), reth)
        return TxPacket(q.ctx.qpn, m.psn, m.opcode, w.index, frame, True)

    def _retry(self, q, now, out):
        """Go-back-N from the oldest unacknowledged PSN, or fail when retries are used up."""
        q.retries += 1
        if q.retries > q.retry_cnt:
            self.counters.retry_exceeded += 1
            self._fail(q, CqeSyndrome.TRANSPORT_RETRY_EXC_ERR, out)
            return []
        tx = [self._rebuild(q, m) for m in q.outstanding]
        self.counters.go_back_n += 1
        self.counters.retransmitted_packets += len(tx)
        q.deadline = now + q.timeout
        return tx

    def on_timeout(self, now):
        """Fire every ACK timer due at ``now`` (ns); returns (TxPackets, CqeRecords)."""
        tx, cqes = [], []
        for qpn in sorted(self.qps):
            q = self.qps[qpn]
            if q.deadline is None or q.deadline > now or q.state != QpState.RTS:
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
        0x14 (another code: BAD_RESP_ERR 0x10), QP to ERR, the rest flushed. RNR NAKs are
        counted and ignored (this responder never sends one; the timer recovers).
        """
        c = self.counters
        res = ResponseOutcome()
        p, reason = parse_frame(frame, (Op.ACK,), self.port)
        if p is None:
            return self._drop_response(res, reason)
        q = self.qps.get(p.dqpn)
        if q is None:
            return self._drop_response(res, "unknown_qp")
        if q.state != QpState.RTS:
            return self._drop_response(res, "qp_state")
        if not p.from_peer(q.ctx):
            return self._drop_response(res, "wrong_peer")
        syndrome, msn = p.aeth
        cls = syndrome >> 5
        if cls == Aeth.KIND_RESERVED or syndrome & 0x80:           # bit 7 is reserved too
            return self._drop_response(res, "bad_aeth")
        # The window: PSNs sent and not yet acknowledged, (acked, last sent].
        last = (q.next_psn - 1) & PSN_MASK
        acked = (q.una - 1) & PSN_MASK
        if ((last - p.psn) & PSN_MASK) >= PSN_HALF:
            return self._drop_response(res, "psn_ahead")
        if ((acked - p.psn) & PSN_MASK) < PSN_HALF:
            c.stale_responses += 1
            return self._drop_response(res, "stale")
        if cls == Aeth.KIND_ACK:
            c.acks_received += 1
            res.kind = "ack"
            self._ack_through(q, p.psn, now, res.cqes)
            self._check_msn(q, msn)
            return res
        if cls == Aeth.KIND_RNR:
            # This responder has no receive queue and never sends RNR; the timer recovers.
            c.naks_received["rnr"] += 1
            res.kind = "rnr"
            return res
        code = syndrome & 0x1F
        name = _NAK_NAMES.get(code, f"nak_code_{code}")
        if code == 0 and p.psn == q.una and q.last_nak_psn == p.psn:
            c.duplicate_naks += 1
            return self._drop_response(res, "duplicate_nak")
        c.naks_received[name] += 1
        res.kind = "nak_" + name
        # A NAK acknowledges every packet before its PSN.
        if p.psn != q.una:
            self._ack_through(q, (p.psn - 1) & PSN_MASK, now, res.cqes)
        self._check_msn(q, msn)
        if code == 0:
            q.last_nak_psn = p.psn
            res.retransmit = self._retry(q, now, res.cqes)
            return res
        self._fail(q, _NAK_SYNDROMES.get(code, CqeSyndrome.BAD_RESP_ERR), res.cqes)
        return res

    def _check_msn(self, q, msn):
        if q.state == QpState.RTS and msn != q.msn_acked:
            self.counters.msn_mismatches += 1

