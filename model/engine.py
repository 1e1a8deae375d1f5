"""Transaction-level golden model of the IBGDA transmit engine.

``EngineModel`` executes WQEs in the order given (one global order = the model's
send order) and predicts, per QP, the frames in order with their PSNs, and, per
CQ, the CQEs and the CQ buffer. Frame order across QPs depends on the RTL
scheduler, so compare per QP (``EngineResult.frames[qpn]``) or as a multiset
(``EngineResult.frame_multiset()``). When several QPs share a CQ, rebuild the
expected CQ for the interleaving actually observed with ``EngineModel.cq_for_order``.

Rules modelled (see the brief / SPEC):
    - A CQE's wqe_counter is the WQE's position in the send queue (the engine's consumer
      index, in WQEBBs mod 2^16), as mlx5 reports it; the ctrl segment's index is not read.
    - NOP: no packet; CQE (REQ, byte_cnt 0) if CQ_UPDATE. DUMP (ds 2, one pointer data
      segment): a local read of its data segment, no packet, then a CQE as a NOP's.
    - RDMA_WRITE (one pointer or inline segment, or none with ds=2): packets per
      ``model.frames.split_message``, consecutive PSNs (24-bit wrap) from the QP's
      start_psn; CQE (REQ, byte_cnt = length) after the last packet if CQ_UPDATE.
    - With ``two_sided``: SEND, SEND_IMM and RDMA_WRITE_IMM, and gather lists of any data
      WQE, the same way (``model.frames.build_message_frames``: SEND FIRST/MIDDLE/LAST/ONLY,
      the *_IMM forms with the ctrl's immediate, SE on the last packet when the WQE asks
      for a solicited event; the payload of a gather list is its segments one after the
      other). What the peer does with them (receive WQEs, RNR) is ``model.link.simulate``'s
      with an ``RcRequester`` / ``RcResponder`` pair: this model sends every WQE once.
    - Anything else (``parse_wqe`` error): error CQE (REQ_ERR, LOCAL_QP_OP_ERR)
      regardless of CQ_UPDATE, nothing sent, the QP enters ERR: every later WQE of
      that QP completes with REQ_ERR / WR_FLUSH_ERR, signaled or not, and sends nothing
      (verbs flushes every work request of a QP in error).
    - A QP whose context state is not RTS (set through the control path) drops its
      WQEs: the engine takes no doorbell for it; but a QP in ERR completes each with
      REQ_ERR / WR_FLUSH_ERR (``modify``: QP_MODIFY as ``spec.formats.qp_modify_action``).
"""

from collections import Counter
from dataclasses import dataclass, field, replace

from spec.formats import CqeOp, QpModify, QpState, Syndrome, WqeOp, qp_modify_action
from spec.params import wire_bytes
from model.cqe import CqContext, CqModel
from model.frames import PSN_MASK, Port, QpContext, build_message_frames, message_packets, parse_wqe

__all__ = ["FrameRecord", "WqeResult", "Totals", "EngineResult", "EngineModel"]


@dataclass
class FrameRecord:
    """One predicted frame: sending QP, PSN, BTH opcode, WQE index and the frame bytes."""
    qpn: int
    psn: int
    bth_opcode: int
    wqe_index: int
    frame: bytes


@dataclass
class WqeResult:
    """Outcome of one posted WQE.

    status: "sent" (WRITE executed), "nop", "error" (error CQE written, QP now in
    ERR), "flushed" (WR_FLUSH_ERR CQE: a WQE failed before it) or "dropped" (the QP's
    context is not RTS).
    """
    qpn: int
    wqe: object
    status: str
    frames: list = field(default_factory=list)
    cqe: object = None


@dataclass
class Totals:
    """Aggregate counts of a run.

    messages: RDMA WRITE messages sent; payload_bytes: their total length;
    packets / frame_bytes: frames and captured bytes (no FCS);
    wire_bytes: sum of ``spec.params.wire_bytes`` per frame;
    wqes_executed: NOP + WRITE WQEs executed without error;
    cqes / error_cqes: CQEs written (all) and those with REQ_ERR;
    flushed_wqes: WQEs completed with WR_FLUSH_ERR (posted after a WQE failed).
    """
    messages: int = 0
    payload_bytes: int = 0
    packets: int = 0
    frame_bytes: int = 0
    wire_bytes: int = 0
    wqes_executed: int = 0
    cqes: int = 0
    error_cqes: int = 0
    flushed_wqes: int = 0


@dataclass
class EngineResult:
    """Predictions of a run.

    frames: {qpn: [FrameRecord, ...]} in send order per QP.
    cqes: {cqn: [CqeRecord, ...]} in model order (post order).
    cq_buffers: {cqn: bytes} predicted CQ buffer contents (initially 0xFF).
    qp_error: {qpn: bool} QP in ERR state at the end.
    next_psn: {qpn: int} PSN the next packet of each QP would carry.
    totals: Totals.
    """
    frames: dict
    cqes: dict
    cq_buffers: dict
    qp_error: dict
    next_psn: dict
    totals: Totals

    def frame_bytes(self, qpn):
        """The frames (bytes) of one QP in order."""
        return [r.frame for r in self.frames.get(qpn, [])]

    def frame_multiset(self):
        """collections.Counter of all frames (bytes), independent of cross-QP order."""
        return Counter(r.frame for recs in self.frames.values() for r in recs)

    def all_frames(self):
        """Every FrameRecord, QP by QP (not a wire order)."""
        return [r for qpn in sorted(self.frames) for r in self.frames[qpn]]


class EngineModel:
    """Golden model of the engine.

    Parameters:
        port: ``model.frames.Port`` (smac, sip).
        qps: {qpn: QpContext}; the model works on copies.
        cqs: {cqn: CqContext}.
        read_memory: callable(addr, n) -> bytes, the GPU memory read by pointer segments.
        two_sided: execute SEND, SEND_IMM, RDMA_WRITE_IMM and gather lists (module docstring).
        max_gather: with ``two_sided``, pointer segments a data WQE may have (None: any).
    """

    def __init__(self, port, qps, cqs, read_memory, *, two_sided=False, max_gather=None):
        if not isinstance(port, Port):
            raise ValueError("port must be a model.frames.Port")
        for qpn, ctx in qps.items():
            if not isinstance(ctx, QpContext) or ctx.qpn != qpn:
                raise ValueError(f"qps[{qpn}] must be a QpContext with qpn={qpn}")
        for cqn, ctx in cqs.items():
            if not isinstance(ctx, CqContext) or ctx.cqn != cqn:
                raise ValueError(f"cqs[{cqn}] must be a CqContext with cqn={cqn}")
        if not callable(read_memory):
            raise ValueError("read_memory must be callable(addr, n) -> bytes")
        self.port = port
        self.two_sided, self.max_gather = bool(two_sided), max_gather
        self.qps = {qpn: replace(ctx) for qpn, ctx in qps.items()}
        self.cq_ctx = dict(cqs)
        self.cqs = {cqn: CqModel(ctx) for cqn, ctx in cqs.items()}
        self.read_memory = read_memory
        self.next_psn = {qpn: ctx.start_psn for qpn, ctx in self.qps.items()}
        # Each QP's consumer index: the position (in WQEBBs, mod 2^16) of its next WQE.
        # A CQE's wqe_counter is this position, not the ctrl segment's wqe_index field:
        # mlx5 reports its own send-queue counter (NVSHMEM's ibgda_poll_cq reads
        # wqe_counter as "the HW consumer index"); the two are equal when software fills
        # the field as rdma-core and NVSHMEM do.
        self.ci = {qpn: 0 for qpn in self.qps}
        self.qp_error = {qpn: ctx.state == QpState.ERR for qpn, ctx in self.qps.items()}
        # a WQE failed, or the QP is in ERR: the rest is flushed
        self.failed = {qpn: ctx.state == QpState.ERR for qpn, ctx in self.qps.items()}
        self.ctl_state = {qpn: ctx.state for qpn, ctx in self.qps.items()}   # as the control path last set it
        self.frames = {qpn: [] for qpn in self.qps}
        self.results = []
        self.totals = Totals()
        # per-QP CQE requests in order: (opcode, wqe_counter, byte_cnt, syndrome)
        self._cqe_requests = {qpn: [] for qpn in self.qps}

    def _cq(self, qp):
        if qp.cqn not in self.cqs:
            raise ValueError(f"QP {qp.qpn} completes to CQ {qp.cqn}, which is not in cqs")
        return self.cqs[qp.cqn]

    def _complete(self, qp, opcode, index, byte_cnt, syndrome, wqe):
        rec = self._cq(qp).push(opcode, qp.qpn, index, byte_cnt, syndrome, wqe_opcode=wqe.opcode,
                                user_index=qp.user_index)
        self._cqe_requests[qp.qpn].append((opcode, index, byte_cnt, syndrome, wqe.opcode))
        self.totals.cqes += 1
        self.totals.error_cqes += opcode == CqeOp.REQ_ERR
        return rec

    def post(self, qpn, wqe_bytes):
        """Execute one WQE of QP ``qpn`` now (after everything posted before).

        Parameters:
            qpn: QP the WQE was posted to (must be in ``qps``).
            wqe_bytes: the raw WQE bytes (see ``model.frames.parse_wqe``).

        Returns a WqeResult.
        """
        if qpn not in self.qps:
            raise ValueError(f"unknown QP {qpn}")
        qp = self.qps[qpn]
        wqe = parse_wqe(wqe_bytes, self.two_sided, self.max_gather)
        pos = self.ci[qpn]
        self.ci[qpn] = (pos + wqe.num_wqebbs) & 0xFFFF
        if self.failed[qpn]:
            self.totals.flushed_wqes += 1
            cqe = self._complete(qp, CqeOp.REQ_ERR, pos, 0, Syndrome.WR_FLUSH_ERR, wqe)
            res = WqeResult(qpn, wqe, "flushed", cqe=cqe)
        elif self.qp_error[qpn] or qp.state != QpState.RTS:
            res = WqeResult(qpn, wqe, "dropped")
        elif not wqe.valid:
            self.qp_error[qpn] = self.failed[qpn] = True
            qp.state = QpState.ERR
            cqe = self._complete(qp, CqeOp.REQ_ERR, pos, 0, Syndrome.LOCAL_QP_OP_ERR, wqe)
            res = WqeResult(qpn, wqe, "error", cqe=cqe)
        elif wqe.opcode in (WqeOp.NOP, WqeOp.DUMP):
            # a DUMP's local read has no effect on memory: it completes as a NOP does
            # (after everything before it, on RC after its ACK), byte count 0
            self.totals.wqes_executed += 1
            cqe = self._complete(qp, CqeOp.REQ, pos, 0, 0, wqe) if wqe.cq_update else None
            res = WqeResult(qpn, wqe, "nop", cqe=cqe)
        else:  # a data WQE: RDMA_WRITE (two-sided: RDMA_WRITE_IMM, SEND, SEND_IMM)
            payload = b"" if wqe.length == 0 else wqe.payload(self.read_memory)
            psn0 = self.next_psn[qpn]
            imm = wqe.imm if wqe.opcode in (WqeOp.SEND_IMM, WqeOp.RDMA_WRITE_IMM) else None
            raw = build_message_frames(qp, self.port, wqe.opcode, payload, psn0, raddr=wqe.raddr, rkey=wqe.rkey,
                                       imm=imm, se=wqe.solicited)
            ops = message_packets(wqe.opcode, len(payload), qp.mtu)
            recs = [FrameRecord(qpn, (psn0 + i) & PSN_MASK, op, pos, f)
                    for i, ((op, _, _), f) in enumerate(zip(ops, raw))]
            self.next_psn[qpn] = (psn0 + len(raw)) & PSN_MASK
            self.frames[qpn].extend(recs)
            t = self.totals
            t.messages += 1
            t.payload_bytes += len(payload)
            t.packets += len(raw)
            t.frame_bytes += sum(len(f) for f in raw)
            t.wire_bytes += sum(wire_bytes(len(f)) for f in raw)
            t.wqes_executed += 1
            cqe = self._complete(qp, CqeOp.REQ, pos, len(payload), 0, wqe) if wqe.cq_update else None
            res = WqeResult(qpn, wqe, "sent", recs, cqe)
        self.results.append(res)
        return res

    def modify(self, qpn, state, start_psn=None):
        """QP_MODIFY of ``qpn`` to ``state`` after everything posted so far (the send side
        only: this model completes each WQE when it is posted). Returns False when the
        engine refuses it (``qp_modify_action`` REJECT), else True."""
        if qpn not in self.qps:
            raise ValueError(f"unknown QP {qpn}")
        action = qp_modify_action(self.ctl_state[qpn], state)
        if action == QpModify.REJECT:
            return False
        self.ctl_state[qpn] = state
        qp = self.qps[qpn]
        if action in (QpModify.CREATE, QpModify.SEND_RESET):
            if start_psn is not None:
                qp.start_psn = start_psn
            self.next_psn[qpn], self.ci[qpn] = qp.start_psn, 0
            self.qp_error[qpn] = self.failed[qpn] = state == QpState.ERR
            qp.state = state
        elif action == QpModify.FLUSH:
            self.qp_error[qpn] = self.failed[qpn] = True
            qp.state = QpState.ERR
        elif not self.failed[qpn]:
            qp.state = state
        return True

    def run(self, posts):
        """Execute ``posts``, an ordered iterable of ``(qpn, wqe_bytes)``; returns ``result()``."""
        for qpn, wqe_bytes in posts:
            self.post(qpn, wqe_bytes)
        return self.result()

    def result(self):
        """EngineResult of everything posted so far."""
        return EngineResult(
            frames={q: list(v) for q, v in self.frames.items()},
            cqes={c: list(m.records) for c, m in self.cqs.items()},
            cq_buffers={c: m.buffer() for c, m in self.cqs.items()},
            qp_error=dict(self.qp_error),
            next_psn=dict(self.next_psn),
            totals=replace(self.totals),
        )

    def cq_for_order(self, cqn, qpn_order):
        """Expected CQ for an observed interleaving of QPs sharing CQ ``cqn``.

        Parameters:
            cqn: the CQ.
            qpn_order: the QPN of each CQE in the order the CQEs were written
                (e.g. the order of the QPs' last packets on the wire). Each QP's
                own CQEs keep the model's per-QP order.

        Returns a fresh CqModel holding the CQEs pushed in that order (its
        ``records`` and ``buffer()`` are the prediction). ValueError if the
        per-QP counts do not match the model's.
        """
        if cqn not in self.cq_ctx:
            raise ValueError(f"unknown CQ {cqn}")
        qpns = [q for q, ctx in self.qps.items() if ctx.cqn == cqn]
        want = Counter({q: len(self._cqe_requests[q]) for q in qpns if self._cqe_requests[q]})
        got = Counter(qpn_order)
        if want != got:
            raise ValueError(f"CQ {cqn}: CQE count per QP in qpn_order {dict(got)} != model {dict(want)}")
        cq = CqModel(self.cq_ctx[cqn])
        pos = {q: 0 for q in qpns}
        for q in qpn_order:
            opcode, index, byte_cnt, syndrome, wqe_opcode = self._cqe_requests[q][pos[q]]
            pos[q] += 1
            cq.push(opcode, q, index, byte_cnt, syndrome, wqe_opcode=wqe_opcode, user_index=self.qps[q].user_index)
        return cq
