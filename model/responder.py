"""Receive side of the RC golden model: ``RcResponder`` (header checks, PSN, memory key, ACK/NAK).

Event-level, not cycle-accurate, pure Python and deterministic: the same frames give the
same writes, responses and counters. Frames are checked by ``model.parse.parse_frame``.

Contents:
    RxResult, ResponderCounters
    RcResponder                 receive path: header checks, PSN, memory-key check, ACK/NAK

Decisions (the RTL must follow them; the tests hold the model to them):
    - ACK syndrome 0x1F (ACK, credit field 0b11111 = "credits invalid"). The credit field
      counts receive WQEs; this responder has no receive queue (RDMA WRITE consumes none)
      and the requester never limits itself on credits, so it advertises "no credit
      information" rather than 0x00, which an IB requester would read as zero credits.
    - ACK coalescing: the responder keeps a count of accepted packets not yet covered by
      an ACK; it sends an ACK (BTH.PSN = that packet's PSN, AETH.MSN = messages done) when
      the packet has AckReq set, is the last packet of a message (LAST/ONLY, with or
      without immediate), or the count reaches the QP's ``ack_every``. Any ACK or
      PSN-sequence NAK resets the count (both acknowledge every earlier packet).
    - Duplicates (PSN behind the expected PSN) are not executed; each one is answered by
      an ACK carrying the PSN of the last accepted packet and the current MSN, so a lost
      ACK is repaired by the requester's retransmission without state at the responder.
    - A gap (PSN ahead) sends one NAK PSN-sequence-error carrying the expected PSN; later
      packets are dropped silently until the expected PSN arrives (IBA reliable service:
      duplicates are still answered, new requests ignored until the expected PSN).
    - Remote access error and invalid request (opcode sequence, length against MTU or
      RETH length) send a NAK with the offending PSN and move the responder QP to ERR
      (IBA responder class A/C errors; Linux rxe, rxe_resp.c ``do_class_ac_error``, does so).
    - A multi-packet WRITE is checked once, on FIRST, for the whole RETH range; later
      packets write at ``RETH.va + offset`` and are held to that range.
    - READ and atomics (``remote_ops=True``, as the engine's receive path takes them;
      ``atomics=True``: atomics only; the default drops both as bad_opcode). A READ REQUEST
      (outside a message) is checked for REMOTE_READ over its whole RETH range and
      answered by READ RESPONSE frames from GPU memory (``read_memory``), one PSN each
      from its own, the MSN counting it; the expected PSN moves past them. An atomic
      (IBTA FETCH_ADD / COMPARE_SWAP on 8 bytes, the engine's masked forms on 4 or 8) is
      checked for REMOTE_ATOMIC and alignment to its size (misaligned: NAK invalid
      request, as Linux rxe), executed on memory (its write in ``writes``: the caller
      applies it before the next frame) and answered by an ATOMIC ACK with the original
      value. A duplicate READ REQUEST is executed again from its own PSN and RETH (key
      checked again, MSN the current one), whatever came before it: a READ changes no
      memory, so the responder keeps no record of READs (IBTA 9.7.5.1.2 asks it to
      re-execute; rxe looks its resource up and drops the request without one, which only
      differs for a duplicate older than its resources). The last ``responder_resources``
      atomics of a QP are remembered: a duplicate atomic is answered with the saved ATOMIC
      ACK, never executed twice; one without a record is dropped without an answer (rxe's
      class D rule), the requester's timer then resends from the start.
    - Responder resources (IBTA max_dest_rd_atomic, per QP): a new READ or atomic holds one
      until its answer (its first READ RESPONSE, its ATOMIC ACK) leaves; a new one that
      finds them all held is NAKed invalid request (the QP goes to ERR), after the key and
      alignment checks. A duplicate holds none. The engine frees a resource when the answer
      leaves it; the model, whose answers leave at once, holds them only when built with
      ``answer_at_once=False``, until the caller says the answers have left
      (``answers_sent``): a test of the rule sends its burst faster than any answer.

Decisions of the two-sided verbs (``two_sided=True``; the RTL must follow them; sources:
Linux rxe, drivers/infiniband/sw/rxe/rxe_resp.c ``check_resource``, ``execute``,
``do_complete``, ``duplicate_request`` and the RXE_RWR_MASK / RXE_COMP_MASK columns of
rxe_opcode.c; rdma-core providers/mlx5 for the memory forms):
    - The QP's receive queue is ``ctx.rq`` (``model.recv_queue.RecvQueue``); its CQEs go
      to CQ ``ctx.rcqn``. The packets that consume a receive WQE are those rxe marks
      RXE_RWR_MASK: SEND FIRST, SEND ONLY, SEND ONLY_IMM, WRITE ONLY_IMM and WRITE
      LAST_IMM (a multi-packet WRITE with immediate takes its WQE on its last packet: its
      FIRST and MIDDLE packets are WRITEs and are executed without one). SEND MIDDLE /
      LAST fill the WQE their FIRST took.
    - Order of the checks, as rxe's: PSN, opcode sequence, then the receive WQE (RNR),
      then lengths and the memory key. The consumer knows what is posted from the
      doorbell record (BE32 counter at ``rq.dbr + DBR_RECV_OFFSET``), read when a packet
      needs a WQE: one is posted when ``(counter - consumed) mod 2^16`` is not 0. The WQE
      is read (``rq.stride`` bytes at ``rq.slot_address(consumed)``) and parsed by
      ``model.recv_queue.parse_recv_wqe`` when it is taken; the model reads both at that
      moment, so an engine that prefetches WQEs must give the same answer as reading
      them then (it may fetch a WQE early only once the counter says it is posted).
    - No WQE posted: RNR NAK (AETH 0x20 | ctx.min_rnr_timer, BTH.PSN = the packet's,
      MSN the current), nothing executed, the expected PSN unchanged (rxe RESPST_ERR_RNR,
      class B). The next packet ahead of the expected PSN gets the gap's one PSN-sequence
      NAK (rxe's check_psn: an RNR NAK does not count as the gap's NAK; seen against rxe
      in tb/suites/interop.py rnr_from_rxe, docs/interoperability.md), which
      ``RcRequester`` ignores while it waits. A QP without a receive queue has none
      posted: every such packet gets an RNR NAK.
    - SEND payload is scattered in order over the WQE's segments (packet after packet,
      continuing where the last one ended; a segment of length 0 takes nothing). A packet
      that does not fit in what is left: nothing of it is written, NAK invalid request,
      the WQE completes with RESP_ERR / LOCAL_LENGTH_ERR (mlx5's verdict for a receive
      overrun: IBV_WC_LOC_LEN_ERR; rxe reports REM_INV_REQ_ERR) and the QP goes to ERR.
      Packet lengths as for WRITE: FIRST / MIDDLE exactly one MTU, LAST 1..MTU, ONLY at
      most one MTU.
    - WRITE with immediate: written at the RETH address as a WRITE is (same checks); its
      last packet takes a receive WQE (RNR if none, before the key check) that holds no
      data.
    - Completion on the message's last packet, for every message (no "signaled" for
      receives): RESP_SEND / RESP_SEND_IMM / RESP_WR_IMM, byte_cnt = bytes received (a
      WRITE with immediate: its RETH length), imm = the ImmDt as on the wire (0 without),
      SE bit = the last packet's BTH SE, qpn = the local QPN, wqe_counter = the receive
      WQE's number mod 2^16, srqn_uidx = the QP's user index, owner bit per CQ wrap
      (``model.cqe.CqModel``). The receive CQ is a ring CQ like any other; the model writes
      CQEs in completion order.
    - Any error that moves the QP to ERR (access, invalid request, length) completes the
      WQE the message holds, if any, with RESP_ERR (LOCAL_LENGTH_ERR for a scatter
      overrun, REMOTE_ACCESS_ERR for an access error, REMOTE_INVAL_REQ_ERR otherwise, as
      rxe's statuses), then every WQE the doorbell record says is posted with RESP_ERR /
      WR_FLUSH_ERR, in order; ``modify`` to ERR flushes the same way (the held WQE with
      WR_FLUSH_ERR), and ``flush_receives`` flushes those posted later while in ERR.
    - Duplicates (a retransmitted SEND, any packet of it) are not executed and consume
      no WQE: an ACK as for a duplicate WRITE (rxe ``duplicate_request``: C9-105).
"""

import copy
from collections import Counter
from dataclasses import dataclass, field, replace

from spec import formats as F
from spec.formats import Access, CqeOp, MrCheck, Op, QpState, Syndrome
from model.cqe import CqContext, CqModel
from model.frames import PSN_MASK, Port, QpContext
from model.recv_queue import parse_recv_wqe, posted_count
from model.mr import MemoryRegion, check as mr_check
from model.parse import (ATOMIC_OPCODES, MR_INDEX_SHIFT, MSN_MASK, PSN_HALF, WRITE_OPCODES, Aeth, _FIRST_OPCODES,
                         _LAST_OPCODES, SEND_OPCODES, build_response, parse_frame)
from model.read_atomic import (build_atomic_ack, build_read_responses, compare_swap, fetch_add, masked_compare_swap,
                               masked_fetch_add)

__all__ = ["RxResult", "ResponderCounters", "RcResponder", "RWR_OPCODES"]

# Packets that start a message (also for SENDs) and that end one
_FIRST_ALL = frozenset(_FIRST_OPCODES | {Op.SEND_FIRST, Op.SEND_ONLY, Op.SEND_ONLY_IMM})
_LAST_ALL = frozenset(_LAST_OPCODES | {Op.SEND_LAST, Op.SEND_LAST_IMM, Op.SEND_ONLY, Op.SEND_ONLY_IMM})
# What the requester side receives (the port parses them and RxDispatch sends them there)
_ANSWER_OPS = frozenset((Op.ACK, Op.ATOMIC_ACK) + tuple(F.READ_RESPONSE_OPS))
# Packets that consume a receive WQE (rxe's RXE_RWR_MASK)
RWR_OPCODES = frozenset((Op.SEND_FIRST, Op.SEND_ONLY, Op.SEND_ONLY_IMM, Op.WRITE_ONLY_IMM, Op.WRITE_LAST_IMM))
_RECV_CQE_OP = {Op.SEND_LAST: CqeOp.RESP_SEND, Op.SEND_ONLY: CqeOp.RESP_SEND, Op.SEND_LAST_IMM: CqeOp.RESP_SEND_IMM,
                Op.SEND_ONLY_IMM: CqeOp.RESP_SEND_IMM, Op.WRITE_LAST_IMM: CqeOp.RESP_WR_IMM,
                Op.WRITE_ONLY_IMM: CqeOp.RESP_WR_IMM}
# The syndrome of the receive WQE a message holds when a NAK moves the QP to ERR
_RECV_ERR = {"nak_remote_access": Syndrome.REMOTE_ACCESS_ERR, "nak_invalid_request": Syndrome.REMOTE_INVAL_REQ_ERR}


@dataclass
class RxResult:
    """What the responder did with one frame.

    Members:
        accepted: True when the packet was executed (in sequence, checks passed).
        reason: None if accepted, else one of ``DROP_REASONS``.
        qpn, psn, opcode: from the BTH (None when the headers did not parse).
        writes: ``[(addr, bytes)]`` to perform in GPU memory, in order (empty unless accepted).
        response: ACK/NAK frame to send, or None.
        response_kind: "ack", "nak_psn_seq", "nak_invalid_request", "nak_remote_access" or None.
        message_done: the packet ended a message (MSN advanced).
        imm: the immediate of a completed *_IMM message, else None (with two-sided verbs
            it is in the receive CQE too; without, the caller sees it only here).
        mr_status: ``spec.formats.MrCheck`` outcome of an access error, else None.
        read_responses: a READ's RESPONSE frames, in order (``response`` is None then).
        cqes: the receive CqeRecords written while handling it (two-sided verbs), in order.
    """
    accepted: bool
    reason: object = None
    qpn: object = None
    psn: object = None
    opcode: object = None
    writes: list = field(default_factory=list)
    response: object = None
    response_kind: object = None
    message_done: bool = False
    imm: object = None
    mr_status: object = None
    read_responses: list = field(default_factory=list)
    cqes: list = field(default_factory=list)

    @property
    def frames_out(self):
        """Every frame this packet is answered with, in order."""
        return ([self.response] if self.response is not None else []) + list(self.read_responses)


@dataclass
class _Resource:
    """A READ or atomic the responder remembers for duplicates (IBTA responder resources)."""
    kind: str              # "read" or "atomic"
    psn: int
    npkts: int = 1
    ack: bytes = b""       # an atomic's ATOMIC ACK, sent again for a duplicate


@dataclass
class ResponderCounters:
    """Counters of an RcResponder.

    Members:
        rx_frames: frames given to ``receive``; accepted: packets executed;
        messages: messages completed; bytes_written: payload bytes handed out as writes;
        imm_messages: messages with an immediate; acks_sent;
        naks_sent: Counter by response kind ("nak_psn_seq", ...);
        dropped: Counter by reason (``DROP_REASONS``, and "rnr": a packet answered by an
            RNR NAK; spec.formats.RX_VERDICTS has no verdict for it yet).
        rnr_naks: RNR NAKs sent; recv_wqes: receive WQEs taken; recv_cqes, recv_error_cqes:
        receive CQEs written (all, RESP_ERR); recv_flushed: receive WQEs flushed.
    """
    rx_frames: int = 0
    accepted: int = 0
    messages: int = 0
    bytes_written: int = 0
    imm_messages: int = 0
    acks_sent: int = 0
    naks_sent: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)
    rnr_naks: int = 0
    recv_wqes: int = 0
    recv_cqes: int = 0
    recv_error_cqes: int = 0
    recv_flushed: int = 0


@dataclass
class _RespQp:
    ctx: QpContext
    pd: int
    ack_every: int
    epsn: int
    state: int
    msn: int = 0
    unacked: int = 0           # accepted packets not yet covered by an ACK / PSN NAK
    nak_sent: bool = False     # a PSN-sequence NAK went out for the current gap
    in_msg: bool = False       # between FIRST and LAST
    msg_va: int = 0
    msg_len: int = 0
    msg_off: int = 0
    resources: list = field(default_factory=list)     # _Resource, oldest first
    max_dest_rd_atomic: int = 16   # responder resources: new READs and atomics unanswered at most
    unanswered: int = 0            # new READs and atomics whose answer has not left
    msg_send: bool = False         # the message in progress is a SEND (else a WRITE)
    rq_ci: int = 0                 # receive WQEs consumed (free-running)
    recv: object = None            # the receive WQE the message holds: _RecvWqe


@dataclass
class _RecvWqe:
    """A receive WQE taken by a message: its number, scatter list and bytes received."""
    n: int
    segments: list
    received: int = 0

    @property
    def capacity(self):
        return sum(length for _, length, _ in self.segments)

    def scatter(self, payload):
        """``[(addr, bytes)]`` that put ``payload`` after the bytes already received."""
        out, pos, off = [], 0, self.received
        data = memoryview(bytes(payload))
        for addr, length, _ in self.segments:
            lo, hi = max(off, pos), min(off + len(data), pos + length)
            if lo < hi:
                out.append((addr + lo - pos, bytes(data[lo - off:hi - off])))
            pos += length
        self.received += len(data)
        return out


class RcResponder:
    """Receive side of the RC transport: RDMA WRITE, READ and atomics, and with
    ``two_sided`` SENDs and receive queues (golden model).

    Parameters:
        port: the responder's ``model.frames.Port`` (source of ACK/NAK frames).
        ack_every: default ACK coalescing count (>= 1) for QPs added without one.
        remote_ops, atomics, read_memory, responder_resources, answer_at_once: READ and
            atomics (module docstring).
        two_sided: take SENDs and give WRITEs with immediate a receive WQE (module
            docstring); needs ``read_memory`` (receive queues and doorbell records are read
            from it) and ``cqs``.
        cqs: {cqn: ``model.cqe.CqContext`` or ``CqModel``}: the receive CQs (a CqModel is
            used as it is: pass ``RcRequester.cqs[n]`` when one CQ takes both sides' CQEs).

    Members:
        port, ack_every, two_sided.
        qps: {qpn: per-QP state} (``qp_info`` gives a read-only view).
        regions: {key index: ``model.mr.MemoryRegion``}.
        cqs: {cqn: ``model.cqe.CqModel``}; completions: every receive CqeRecord in write order.
        counters: ResponderCounters.

    A QP accepts packets in RTR or RTS, from its peer only (source IPv4 and MAC address
    the QP context's ``dip`` and ``dmac``). ``receive`` runs the checks of ``parse_frame``,
    then the QP's state, its peer, the PSN, the opcode sequence, the memory key (on FIRST/ONLY, for the
    whole RETH range, with ``model.mr.check`` and right REMOTE_WRITE) and the payload
    length (FIRST/MIDDLE exactly one MTU, LAST/ONLY at most one and the message exactly
    RETH.dma_len); see the module docstring for the ACK, NAK and duplicate rules.
    """

    def __init__(self, port, ack_every=1, *, remote_ops=False, atomics=False, read_memory=None,
                 responder_resources=16, answer_at_once=True, two_sided=False, cqs=None):
        if not isinstance(port, Port):
            raise ValueError("port must be a model.frames.Port")
        if not isinstance(ack_every, int) or ack_every < 1:
            raise ValueError(f"ack_every must be an int >= 1, got {ack_every!r}")
        if (remote_ops or atomics or two_sided) and not callable(read_memory):
            raise ValueError("remote_ops, atomics and two_sided need read_memory(addr, n) -> bytes")
        self.cqs = {}
        for cqn, c in (cqs or {}).items():
            if isinstance(c, CqContext) and c.cqn == cqn:
                self.cqs[cqn] = CqModel(c)
            elif isinstance(c, CqModel) and c.ctx.cqn == cqn:
                self.cqs[cqn] = c
            else:
                raise ValueError(f"cqs[{cqn}] must be a CqContext or CqModel with cqn={cqn}")
        self.completions = []
        self.two_sided = bool(two_sided)
        if not isinstance(responder_resources, int) or not 1 <= responder_resources <= 255:
            raise ValueError(f"responder_resources must be 1..255, got {responder_resources!r}")
        self.port = port
        self.ack_every = ack_every
        self.remote_ops, self.read_memory, self.responder_resources = remote_ops, read_memory, responder_resources
        self.answer_at_once = bool(answer_at_once)
        self.atomics = bool(remote_ops or atomics)
        self._opcodes = (WRITE_OPCODES | (ATOMIC_OPCODES if self.atomics else set())
                         | ({Op.READ_REQUEST} if remote_ops else set()) | (SEND_OPCODES if two_sided else set()))
        self.qps = {}
        self.regions = {}
        self.counters = ResponderCounters()

    # -- set-up
    def add_qp(self, ctx, pd, ack_every=None, max_dest_rd_atomic=None):
        """Create a responder QP.

        Parameters:
            ctx: QpContext of the local QP: qpn (BTH.dqpn of incoming packets), remote_qpn,
                dmac/dip (the requester), start_psn (first expected PSN), mtu, state.
            pd: protection domain of the QP (int >= 0).
            ack_every: ACK coalescing count (>= 1); default the responder's.
            max_dest_rd_atomic: its responder resources (1..responder_resources): the new
                READs and atomics it holds unanswered at most (see ``answers_sent``).
        """
        if not isinstance(ctx, QpContext):
            raise ValueError("ctx must be a model.frames.QpContext")
        if ctx.qpn in self.qps:
            raise ValueError(f"responder QP {ctx.qpn:#x} already exists")
        if not isinstance(pd, int) or pd < 0:
            raise ValueError(f"pd must be an int >= 0, got {pd!r}")
        every = self.ack_every if ack_every is None else ack_every
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"ack_every must be an int >= 1, got {every!r}")
        max_dest_rd_atomic = self.responder_resources if max_dest_rd_atomic is None else max_dest_rd_atomic
        if not isinstance(max_dest_rd_atomic, int) or not 1 <= max_dest_rd_atomic <= self.responder_resources:
            raise ValueError(f"max_dest_rd_atomic must be 1..{self.responder_resources}, got {max_dest_rd_atomic!r}")
        if self.two_sided and ctx.rq is not None and ctx.rcqn not in self.cqs:
            raise ValueError(f"QP {ctx.qpn:#x} completes receives to CQ {ctx.rcqn}, which is not in cqs")
        self.qps[ctx.qpn] = _RespQp(ctx=ctx, pd=pd, ack_every=every, epsn=ctx.start_psn, state=ctx.state,
                                    max_dest_rd_atomic=max_dest_rd_atomic)

    def answers_sent(self, qpn=None, count=None):
        """The answers (READ responses, ATOMIC ACKs) of every READ and atomic received so
        far on QP ``qpn`` (None: every QP) have left: their responder resources are free;
        with ``count``, only the answers of that QP's ``count`` oldest unanswered ones
        (answers leave in request order). With ``answer_at_once`` (the default) each
        answer leaves as its request is received, and no request meets the limit."""
        if count is not None and (qpn is None or not isinstance(count, int) or count < 0):
            raise ValueError(f"count needs one QP and an int >= 0, got qpn={qpn!r}, count={count!r}")
        for q in (self.qps.values() if qpn is None else [self._qp(qpn)]):
            q.unanswered = 0 if count is None else max(0, q.unanswered - count)

    def fork(self):
        """An independent copy to try frames on (a fuzzer asks whether a frame would end
        a QP before it sends it): what ``receive`` changes is copied, what it only reads
        (memory regions, the memory reader, QP contexts, remembered answers) is shared.
        A deep copy gives the same, tens of times slower."""
        new = copy.copy(self)
        new.qps = {n: replace(q, resources=list(q.resources), recv=copy.deepcopy(q.recv)) for n, q in self.qps.items()}
        new.counters = replace(self.counters, naks_sent=Counter(self.counters.naks_sent),
                               dropped=Counter(self.counters.dropped))
        new.cqs = copy.deepcopy(self.cqs)
        new.completions = list(self.completions)
        return new

    def resources_held(self, qpn):
        """How many of QP ``qpn``'s responder resources are held (new READs and atomics
        whose answers have not left; always 0 with ``answer_at_once``)."""
        return self._qp(qpn).unanswered

    def _take_resource(self, q, p):
        """A new READ or atomic takes one of ``q``'s responder resources; None, or the NAK
        (invalid request, IBTA's for too many outstanding) when they are all held."""
        if q.unanswered >= q.max_dest_rd_atomic:
            return self._fatal(q, p, "invalid_request", Aeth.NAK_INVALID_REQ, "nak_invalid_request")
        if not self.answer_at_once:
            q.unanswered += 1
        return None

    def modify(self, qpn, state):
        """Move QP ``qpn`` to ``state`` (``spec.formats.QpState``) through the control path
        (QP_MODIFY): outside RTR and RTS it takes no request, from the next frame on. A
        move to ERR flushes the QP's receive WQEs (two-sided verbs: the one a message
        holds and every one posted, RESP_ERR / WR_FLUSH_ERR). Returns the CqeRecords
        written."""
        if state not in range(QpState.ERR + 1):
            raise ValueError(f"unknown QP state {state!r}")
        q = self._qp(qpn)
        out = []
        if state == QpState.ERR and q.state != QpState.ERR:
            out = self._error_receives(q, Syndrome.WR_FLUSH_ERR)
        q.state = state
        if state == QpState.ERR:
            q.in_msg = False
        return out

    # -- receive queue
    def _read_u32(self, addr):
        data = bytes(self.read_memory(addr, 4))
        if len(data) != 4:
            raise ValueError(f"read_memory({addr:#x}, 4) returned {len(data)} bytes")
        return int.from_bytes(data, "big")

    def recv_posted(self, qpn):
        """Receive WQEs of QP ``qpn`` posted (its doorbell record, read now) and not consumed."""
        q = self._qp(qpn)
        return self._posted(q)

    def _posted(self, q):
        if q.ctx.rq is None:
            return 0
        return posted_count(self._read_u32(q.ctx.rq.counter_address), q.rq_ci)

    def _take_recv(self, q):
        """The next receive WQE, read from memory and consumed (one must be posted)."""
        rq = q.ctx.rq
        data = bytes(self.read_memory(rq.slot_address(q.rq_ci), rq.stride))
        if len(data) != rq.stride:
            raise ValueError(f"read_memory returned {len(data)} bytes of a {rq.stride}-byte receive WQE")
        q.recv = _RecvWqe(q.rq_ci, parse_recv_wqe(data))
        q.rq_ci += 1
        self.counters.recv_wqes += 1
        return q.recv

    def _recv_cqe(self, q, opcode, n, byte_cnt=0, syndrome=0, imm=0, se=False):
        rec = self.cqs[q.ctx.rcqn].push(opcode, q.ctx.qpn, n & 0xFFFF, byte_cnt, syndrome,
                                         user_index=q.ctx.user_index, imm=imm, se=int(se))
        self.completions.append(rec)
        c = self.counters
        c.recv_cqes += 1
        c.recv_error_cqes += opcode == CqeOp.RESP_ERR
        return rec

    def _error_receives(self, q, syndrome):
        """The QP goes to ERR: the WQE its message holds completes with ``syndrome``, every
        posted one with WR_FLUSH_ERR. Returns the CqeRecords."""
        if not self.two_sided or q.ctx.rq is None:
            return []
        out = []
        if q.recv is not None:
            out.append(self._recv_cqe(q, CqeOp.RESP_ERR, q.recv.n, syndrome=syndrome))
            q.recv = None
        return out + self._flush(q)

    def _flush(self, q):
        out = []
        for _ in range(self._posted(q)):
            out.append(self._recv_cqe(q, CqeOp.RESP_ERR, q.rq_ci, syndrome=Syndrome.WR_FLUSH_ERR))
            q.rq_ci += 1
            self.counters.recv_flushed += 1
        return out

    def flush_receives(self, qpn):
        """QP ``qpn`` in ERR: complete the receive WQEs posted since it was flushed last
        (RESP_ERR / WR_FLUSH_ERR; the doorbell record read now). Returns the CqeRecords."""
        q = self._qp(qpn)
        if q.state != QpState.ERR or not self.two_sided:
            return []
        return self._flush(q)

    def qp_info(self, qpn):
        """Dict of QP ``qpn``'s state: epsn, msn, state, unacked, nak_sent, in_msg, rq_ci
        (receive WQEs consumed)."""
        q = self._qp(qpn)
        return dict(epsn=q.epsn, msn=q.msn, state=q.state, unacked=q.unacked, nak_sent=q.nak_sent,
                    in_msg=q.in_msg, rq_ci=q.rq_ci)

    def register(self, region):
        """Register (or replace) a memory region; its slot is ``region.key >> 8``."""
        if not isinstance(region, MemoryRegion):
            raise ValueError("region must be a model.mr.MemoryRegion")
        if not 0 <= region.key < 1 << 32:
            raise ValueError(f"memory key must be a u32, got {region.key!r}")
        self.regions[region.key >> MR_INDEX_SHIFT] = region

    def deregister(self, key):
        """Remove the region registered under ``key``'s index."""
        self.regions.pop(key >> MR_INDEX_SHIFT, None)

    def _qp(self, qpn):
        if qpn not in self.qps:
            raise ValueError(f"unknown responder QP {qpn!r}")
        return self.qps[qpn]

    # -- receive
    def _drop(self, reason, p=None, response=None, kind=None, **kw):
        self.counters.dropped[reason] += 1
        self._count_response(kind)
        return RxResult(False, reason, p and p.dqpn, p and p.psn, p and p.opcode,
                        response=response, response_kind=kind, **kw)

    def _count_response(self, kind):
        if kind == "ack":
            self.counters.acks_sent += 1
        elif kind is not None:
            self.counters.naks_sent[kind] += 1

    def _respond(self, q, psn, syndrome):
        return build_response(q.ctx, self.port, psn, syndrome, q.msn)

    def _fatal(self, q, p, reason, syndrome, kind, recv_syndrome=None, **kw):
        # Class C error: NAK with the offending PSN, nothing executed, QP to ERR (and its
        # receive WQEs completed in error)
        q.state = QpState.ERR
        q.in_msg = False
        cqes = self._error_receives(q, recv_syndrome or _RECV_ERR.get(kind, Syndrome.REMOTE_INVAL_REQ_ERR))
        return self._drop(reason, p, self._respond(q, p.psn, syndrome), kind, cqes=cqes, **kw)

    def _rnr(self, q, p):
        # No receive WQE: RNR NAK at the packet's PSN, nothing executed. Like a sequence
        # NAK it acknowledges every earlier PSN; unlike one it is not the gap's NAK: the
        # next packet ahead gets that (as rxe).
        q.unacked = 0
        self.counters.rnr_naks += 1
        return self._drop("rnr", p, self._respond(q, p.psn, Aeth.RNR_NAK | q.ctx.min_rnr_timer), "nak_rnr")

    def receive(self, frame):
        """Process one received frame; returns an RxResult (the caller performs its writes
        and sends its response)."""
        self.counters.rx_frames += 1
        # Frame-level checks as the NIC's receive port makes them, for every opcode it
        # knows: the requester side's answers too (ACK, ATOMIC ACK, READ RESPONSEs), whose
        # length rules come before the opcode is refused here (a 118-byte ATOMIC ACK is
        # bad_length at the port, not bad_opcode: `make fuzz` seed 1)
        p, reason = parse_frame(frame, (self._opcodes | _ANSWER_OPS) if self.remote_ops or self.two_sided else None,
                                self.port)
        if p is None:
            return self._drop(reason)
        if p.opcode not in self._opcodes:
            return self._drop("bad_opcode")     # an ACK/NAK: the requester side's (RxDispatch)
        q = self.qps.get(p.dqpn)
        if q is None or q.state not in (QpState.RTR, QpState.RTS):
            return self._drop("qp_not_ready", p)
        if not p.from_peer(q.ctx):
            return self._drop("wrong_peer", p)     # an RC QP takes requests from its peer only
        d = (p.psn - q.epsn) & PSN_MASK
        if d >= PSN_HALF and p.opcode not in WRITE_OPCODES and p.opcode not in SEND_OPCODES:
            return self._duplicate_remote_op(q, p)
        if d >= PSN_HALF:
            # Duplicate: not executed again; the ACK names the last accepted PSN.
            q.unacked = 0
            return self._drop("psn_duplicate", p, self._respond(q, (q.epsn - 1) & PSN_MASK, Aeth.ACK), "ack")
        if d:
            if q.nak_sent:
                return self._drop("psn_out_of_order", p)
            q.nak_sent = True
            q.unacked = 0      # the NAK acknowledges every PSN before the expected one
            return self._drop("psn_out_of_order", p, self._respond(q, q.epsn, Aeth.NAK_PSN_SEQ), "nak_psn_seq")
        q.nak_sent = False
        send = p.opcode in SEND_OPCODES
        if p.opcode not in WRITE_OPCODES and not send:
            if q.in_msg:       # a READ or atomic between a WRITE's FIRST and LAST
                return self._fatal(q, p, "invalid_request", Aeth.NAK_INVALID_REQ, "nak_invalid_request")
            return self._read(q, p) if p.opcode == Op.READ_REQUEST else self._atomic(q, p)
        first, last = p.opcode in _FIRST_ALL, p.opcode in _LAST_ALL
        # FIRST/ONLY inside a message, MIDDLE/LAST outside one or of the other kind
        if first == q.in_msg or (q.in_msg and q.msg_send != send):
            return self._fatal(q, p, "invalid_request", Aeth.NAK_INVALID_REQ, "nak_invalid_request")
        if self.two_sided and p.opcode in RWR_OPCODES:
            if not self._posted(q):
                return self._rnr(q, p)
            self._take_recv(q)
        if send:
            return self._send_packet(q, p, first, last)
        if first:
            va, rkey, total = p.reth
            status = mr_check(self.regions.get(rkey >> MR_INDEX_SHIFT), rkey, va, total, Access.REMOTE_WRITE, q.pd)
            if status != MrCheck.OK:
                return self._fatal(q, p, "access_error", Aeth.NAK_REMOTE_ACCESS, "nak_remote_access",
                                   mr_status=status)
            off = 0
        else:
            va, total, off = q.msg_va, q.msg_len, q.msg_off
        n = len(p.payload)
        # Length rules: they also keep every write inside the range checked on FIRST.
        if last:
            ok = n <= q.ctx.mtu and off + n == total
        else:
            ok = n == q.ctx.mtu and off + n < total
        if not ok:
            return self._fatal(q, p, "invalid_request", Aeth.NAK_INVALID_REQ, "nak_invalid_request")
        writes = [(va + off, p.payload)] if n else []
        q.epsn = (q.epsn + 1) & PSN_MASK
        q.in_msg, q.msg_send = not last, False
        if last:
            q.msn = (q.msn + 1) & MSN_MASK
        else:
            q.msg_va, q.msg_len, q.msg_off = va, total, off + n
        q.unacked += 1
        c = self.counters
        c.accepted += 1
        c.bytes_written += n
        c.messages += last
        imm = p.imm if last else None
        c.imm_messages += imm is not None
        cqes = []
        if self.two_sided and p.opcode in RWR_OPCODES:      # a WRITE with immediate completes its WQE
            cqes.append(self._recv_cqe(q, _RECV_CQE_OP[p.opcode], q.recv.n, total, imm=p.imm, se=p.se))
            q.recv = None
        return self._accepted(q, p, writes, last, imm, cqes)

    def _accepted(self, q, p, writes, last, imm, cqes):
        """The ACK rule for an accepted packet, and its RxResult."""
        response = kind = None
        if p.ackreq or last or q.unacked >= q.ack_every:
            q.unacked = 0
            response, kind = self._respond(q, p.psn, Aeth.ACK), "ack"
            self._count_response(kind)
        return RxResult(True, None, p.dqpn, p.psn, p.opcode, writes, response, kind, last, imm, cqes=cqes)

    def _send_packet(self, q, p, first, last):
        """A SEND packet in sequence, its receive WQE taken (FIRST/ONLY) or held."""
        n = len(p.payload)
        # Length rules (rxe check_length): FIRST/MIDDLE one MTU, LAST 1..MTU, ONLY 0..MTU
        ok = n <= q.ctx.mtu and (n >= 1 or first) if last else n == q.ctx.mtu
        if not ok:
            return self._fatal(q, p, "invalid_request", Aeth.NAK_INVALID_REQ, "nak_invalid_request")
        r = q.recv
        if r.received + n > r.capacity:
            return self._fatal(q, p, "invalid_request", Aeth.NAK_INVALID_REQ, "nak_invalid_request",
                               recv_syndrome=Syndrome.LOCAL_LENGTH_ERR)
        writes = r.scatter(p.payload)
        q.epsn = (q.epsn + 1) & PSN_MASK
        q.in_msg, q.msg_send = not last, not last
        q.unacked += 1
        c = self.counters
        c.accepted += 1
        c.bytes_written += n
        cqes = []
        imm = None
        if last:
            q.msn = (q.msn + 1) & MSN_MASK
            c.messages += 1
            imm = p.imm
            c.imm_messages += imm is not None
            cqes.append(self._recv_cqe(q, _RECV_CQE_OP[p.opcode], r.n, r.received,
                                       imm=0 if imm is None else imm, se=p.se))
            q.recv = None
        return self._accepted(q, p, writes, last, imm, cqes)


    # -- READ and atomics
    def _remember(self, q, res):
        q.resources.append(res)
        del q.resources[:-self.responder_resources]

    def _read_check(self, q, p):
        va, rkey, n = p.reth
        return mr_check(self.regions.get(rkey >> MR_INDEX_SHIFT), rkey, va, n, Access.REMOTE_READ, q.pd)

    def _read_frames(self, q, p, msn):
        va, _, n = p.reth
        data = bytes(self.read_memory(va, n)) if n else b""
        if len(data) != n:
            raise ValueError(f"read_memory({va:#x}, {n}) returned {len(data)} bytes")
        return build_read_responses(q.ctx, self.port, data, p.psn, msn)

    def _read(self, q, p):
        status = self._read_check(q, p)
        if status != MrCheck.OK:
            return self._fatal(q, p, "access_error", Aeth.NAK_REMOTE_ACCESS, "nak_remote_access", mr_status=status)
        nak = self._take_resource(q, p)
        if nak is not None:
            return nak
        q.msn = (q.msn + 1) & MSN_MASK
        frames = self._read_frames(q, p, q.msn)
        q.epsn = (q.epsn + len(frames)) & PSN_MASK
        q.unacked = 0                  # the responses acknowledge every earlier packet
        c = self.counters
        c.accepted += 1
        c.messages += 1
        return RxResult(True, None, p.dqpn, p.psn, p.opcode, message_done=True, read_responses=frames)

    def _atomic(self, q, p):
        a = p.atomic
        masked = p.opcode in (Op.MASKED_COMPARE_SWAP, Op.MASKED_FETCH_ADD)
        size = {2: 4, 3: 8}.get(a["log_size"]) if masked else 8
        if size is None or a["va"] % size:
            return self._fatal(q, p, "invalid_request", Aeth.NAK_INVALID_REQ, "nak_invalid_request")
        status = mr_check(self.regions.get(a["rkey"] >> MR_INDEX_SHIFT), a["rkey"], a["va"], size,
                          Access.REMOTE_ATOMIC, q.pd)
        if status != MrCheck.OK:
            return self._fatal(q, p, "access_error", Aeth.NAK_REMOTE_ACCESS, "nak_remote_access", mr_status=status)
        nak = self._take_resource(q, p)
        if nak is not None:
            return nak
        orig = int.from_bytes(bytes(self.read_memory(a["va"], size)), "little")
        mask = (1 << 8 * size) - 1
        if p.opcode == Op.FETCH_ADD:
            new, _ = fetch_add(orig, a["swap_add"])
        elif p.opcode == Op.COMPARE_SWAP:
            new, _ = compare_swap(orig, a["swap_add"], a["compare"])
        elif p.opcode == Op.MASKED_FETCH_ADD:
            new, _ = masked_fetch_add(orig, a["op0"] & mask, a["op1"] & mask, size)
        else:
            new, _ = masked_compare_swap(orig, *(a[f"op{i}"] & mask for i in range(4)), size)
        q.msn = (q.msn + 1) & MSN_MASK
        q.epsn = (q.epsn + 1) & PSN_MASK
        q.unacked = 0
        ack = build_atomic_ack(q.ctx, self.port, p.psn, q.msn, orig)
        self._remember(q, _Resource("atomic", p.psn, 1, ack))
        c = self.counters
        c.accepted += 1
        c.messages += 1
        c.bytes_written += size
        self._count_response("ack")
        return RxResult(True, None, p.dqpn, p.psn, p.opcode, [(a["va"], new.to_bytes(size, "little"))], ack, "ack",
                        True)

    def _duplicate_remote_op(self, q, p):
        """A READ or atomic behind the expected PSN: executed again (READ), or answered
        again (atomic) when it is one of the QP's remembered ones, else dropped unanswered."""
        if p.opcode == Op.READ_REQUEST:
            status = self._read_check(q, p)
            if status != MrCheck.OK:
                return self._fatal(q, p, "access_error", Aeth.NAK_REMOTE_ACCESS, "nak_remote_access",
                                   mr_status=status)
            frames = self._read_frames(q, p, q.msn)
            self.counters.dropped["psn_duplicate"] += 1
            return RxResult(False, "psn_duplicate", p.dqpn, p.psn, p.opcode, read_responses=frames)
        for r in reversed(q.resources):
            if r.kind == "atomic" and p.opcode in ATOMIC_OPCODES and r.psn == p.psn:
                return self._drop("psn_duplicate", p, r.ack, "ack")
        return self._drop("psn_duplicate", p)
