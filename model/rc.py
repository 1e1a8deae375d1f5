"""Protocol-level golden model of the reliable connection (RC): responder, requester, lossy link.

Event-level, not cycle-accurate, pure Python and deterministic: the same inputs give the
same frames, CQEs and counters. It states what the RTL of the RC issue must do; the
cycle model (``model/cycle_model.py``) stays the timing reference of the transmit path.

Contents:
    CqeSyndrome                 mlx5 CQE error syndromes (rdma-core; spec.formats.Syndrome)
    Aeth                        AETH syndromes (SPEC section 5; spec.formats.Aeth)
    DROP_REASONS                why a responder drops a frame
    ParsedFrame, parse_frame    checks and decodes one RoCEv2 RC frame
    build_rc_packet             WRITE packets incl. the *_IMM opcodes and an AckReq override
    build_response              ACK / NAK frame (BTH + AETH)
    RcResponder                 receive path: header checks, PSN, memory-key check, ACK/NAK
    RcRequester                 send path: WQEs to packets, outstanding metadata, go-back-N, CQEs
    SparseMemory                byte memory for the responder's writes
    simulate                    two endpoints over a lossy link with an explicit fault pattern

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
    - Requester timer: armed when a packet goes out with none outstanding, restarted on
      every ACK that acknowledges new packets and on every retransmission; a timeout, or a
      PSN-sequence NAK, goes back to the oldest unacknowledged PSN (after the NAK's
      implicit acknowledgment that is the NAK's PSN) and resends every outstanding packet.
      Both use the QP's retry counter, which an ACK with progress resets (IBA retry rules);
      retry ``retry_cnt + 1`` fails the WQE with TRANSPORT_RETRY_EXC_ERR. A second NAK for
      the same PSN without progress in between is ignored (a duplicated NAK frame).
    - On an error the failing WQE gets REQ_ERR with its syndrome, whether signalled or not,
      the QP goes to ERR and every later WQE (also those posted afterwards) completes with
      REQ_ERR / WR_FLUSH_ERR, as verbs flushes every outstanding work request.
"""

from collections import Counter, deque
from dataclasses import dataclass, field
import heapq

from spec import formats as F
from spec.formats import (
    AETH, AETH_LEN, BTH, BTH_LEN, CqeOp, DEFAULT_PKEY, ETH, ETHERTYPE_IPV4, ICRC_LEN, IPV4, IPV4_LEN,
    IP_PROTO_UDP, IPV4_VER_IHL, OFF_BTH, OFF_EXT, OFF_IP, OFF_UDP, Op, QpState, RETH, RETH_LEN,
    ROCEV2_UDP_PORT, UDP, Access, MrCheck, WqeOp, pack, unpack,
)
from spec.params import WIRE_GBPS, wire_bytes
from model.cqe import CqContext, CqModel
from model.frames import (PSN_MASK, Port, QpContext, build_packet, build_write_frames, ip_bytes, mac_bytes, parse_wqe,
                          split_message)
from model.icrc import icrc, ipv4_checksum
from model.mr import MemoryRegion, check as mr_check

__all__ = [
    "CqeSyndrome", "Aeth", "DROP_REASONS", "FAULT_KINDS", "IMMDT_LEN", "WRITE_OPCODES", "ParsedFrame", "parse_frame",
    "build_rc_packet", "build_response", "RxResult", "ResponderCounters", "RcResponder",
    "TxPacket", "ResponseOutcome", "RequesterCounters", "RcRequester", "ib_timeout_ns",
    "SparseMemory", "LinkRecord", "SimResult", "simulate",
]


CqeSyndrome = F.Syndrome               # mlx5 CQE syndromes, defined once in spec/formats.py
Aeth = F.Aeth                          # AETH syndromes, defined once in spec/formats.py


IMMDT_LEN = 4                          # ImmDt extension header (SPEC section 5)
ETH_MIN_FRAME = 60                     # shortest Ethernet frame without FCS; shorter ones are padded
PSN_HALF = 1 << 23                     # PSNs less than 2^23 behind the expected one are duplicates
MSN_MASK = PSN_MASK                    # MSN is 24 bits too

# Why a responder drops a frame, in the order the checks run. An unknown destination QP
# counts as qp_not_ready: a QP number without a context is a QP in RESET.
DROP_REASONS = ("bad_length", "not_roce", "bad_ip_checksum", "bad_icrc", "bad_pkey", "bad_opcode",
                "bad_address", "qp_not_ready", "psn_duplicate", "psn_out_of_order", "access_error", "invalid_request")

# opcode -> (RETH, ImmDt, AETH) present
_EXT = {
    Op.WRITE_FIRST: (True, False, False), Op.WRITE_MIDDLE: (False, False, False),
    Op.WRITE_LAST: (False, False, False), Op.WRITE_LAST_IMM: (False, True, False),
    Op.WRITE_ONLY: (True, False, False), Op.WRITE_ONLY_IMM: (True, True, False),
    Op.ACK: (False, False, True),
}
WRITE_OPCODES = frozenset((Op.WRITE_FIRST, Op.WRITE_MIDDLE, Op.WRITE_LAST, Op.WRITE_LAST_IMM,
                           Op.WRITE_ONLY, Op.WRITE_ONLY_IMM))
_FIRST_OPCODES = frozenset((Op.WRITE_FIRST, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM))
_LAST_OPCODES = frozenset((Op.WRITE_LAST, Op.WRITE_LAST_IMM, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM))
_IMM_BASE = {Op.WRITE_LAST_IMM: Op.WRITE_LAST, Op.WRITE_ONLY_IMM: Op.WRITE_ONLY}
_NAK_NAMES = {0: "psn_seq", 1: "invalid_request", 2: "remote_access", 3: "remote_op"}
_NAK_SYNDROMES = {1: CqeSyndrome.REMOTE_INVAL_REQ_ERR, 2: CqeSyndrome.REMOTE_ACCESS_ERR,
                  3: CqeSyndrome.REMOTE_OP_ERR}
MR_INDEX_SHIFT = 8                     # mlx5 keys: index << 8 | variant byte (rtl/responder/mr_table.py)


def _psn_ok(v, name="psn"):
    if not isinstance(v, int) or not 0 <= v <= PSN_MASK:
        raise ValueError(f"{name} must be a 24-bit int, got {v!r}")


# ---- frames ----------------------------------------------------------------------------
@dataclass
class ParsedFrame:
    """The transport fields of a frame that passed every header check.

    Members:
        opcode, padcnt, pkey, dqpn, ackreq (bool), psn: BTH.
        reth: ``(va, rkey, dma_len)`` or None; imm: ImmDt (int) or None;
        aeth: ``(syndrome, msn)`` or None.
        payload: payload bytes (pad bytes and ICRC removed).
    """
    opcode: int
    padcnt: int
    pkey: int
    dqpn: int
    ackreq: bool
    psn: int
    reth: object = None
    imm: object = None
    aeth: object = None
    payload: bytes = b""


def parse_frame(frame, opcodes=None, port=None):
    """Check and decode one RoCEv2 frame (Ethernet header through ICRC, no FCS).

    Parameters:
        frame: the frame bytes.
        opcodes: BTH opcodes the caller accepts (default: every opcode this model knows:
            RDMA WRITE FIRST/MIDDLE/LAST/ONLY with and without immediate, and ACK).
        port: the receiving ``model.frames.Port``: a frame whose destination MAC or IPv4
            address is not the port's is dropped (bad_address); None: not checked.

    Returns ``(ParsedFrame, None)`` or ``(None, reason)``, reason one of the first seven
    of ``DROP_REASONS``. Checks in order: long enough for Ethernet+IPv4+UDP+BTH+ICRC;
    IPv4 with a 20-byte header (else not_roce); IPv4 header checksum; protocol UDP, no
    fragment, destination port 4791 (else not_roce); destination MAC and IPv4 address
    the port's (bad_address); IPv4 total length and UDP length
    against the frame length (a 60-byte frame may carry Ethernet padding behind a shorter
    IP packet: the padding is removed first); ICRC; P_Key 0xFFFF; known opcode; frame long enough for
    the opcode's extension headers and pad count (an ACK carries no payload).
    """
    f = bytes(frame)
    n = len(f)
    if n < OFF_BTH + BTH_LEN + ICRC_LEN:
        return None, "bad_length"
    eth = unpack(ETH, f, 0)
    ip = unpack(IPV4, f, OFF_IP)
    if eth["ethertype"] != ETHERTYPE_IPV4 or ip["ver_ihl"] != IPV4_VER_IHL:
        return None, "not_roce"
    # The checksum is checked before any IP field is trusted.
    if ip["checksum"] != ipv4_checksum(f[OFF_IP:OFF_IP + IPV4_LEN]):
        return None, "bad_ip_checksum"
    udp = unpack(UDP, f, OFF_UDP)
    if ip["proto"] != IP_PROTO_UDP or ip["flags_frag"] & 0x3FFF or udp["dport"] != ROCEV2_UDP_PORT:
        return None, "not_roce"
    if port is not None and (f[0:6] != mac_bytes(port.smac) or f[OFF_IP + 16:OFF_IP + 20] != ip_bytes(port.sip)):
        return None, "bad_address"
    if n == ETH_MIN_FRAME and ip["total_len"] < n - OFF_IP:
        # A frame shorter than Ethernet's minimum (a WRITE LAST with 1 byte is 59 bytes)
        # arrives padded to 60: the IP length says where the packet ends.
        f = f[:OFF_IP + ip["total_len"]]
        n = len(f)
        if n < OFF_BTH + BTH_LEN + ICRC_LEN:
            return None, "bad_length"
    if ip["total_len"] != n - OFF_IP or udp["length"] != n - OFF_UDP:
        return None, "bad_length"
    if f[-ICRC_LEN:] != icrc(f[:-ICRC_LEN]):
        return None, "bad_icrc"
    b = unpack(BTH, f, OFF_BTH)
    if b["pkey"] != DEFAULT_PKEY:
        return None, "bad_pkey"
    op = b["opcode"]
    allowed = _EXT if opcodes is None else opcodes
    if op not in _EXT or op not in allowed:
        return None, "bad_opcode"
    has_reth, has_imm, has_aeth = _EXT[op]
    padcnt = (b["flags"] >> 4) & 3
    pos = OFF_EXT
    ext = RETH_LEN * has_reth + IMMDT_LEN * has_imm + AETH_LEN * has_aeth
    end = n - ICRC_LEN - padcnt
    if pos + ext > end or (has_aeth and pos + ext != end):
        return None, "bad_length"
    p = ParsedFrame(opcode=op, padcnt=padcnt, pkey=b["pkey"], dqpn=b["dqpn"], ackreq=bool(b["ackreq"] & 0x80),
                    psn=b["psn"])
    if has_reth:
        r = unpack(RETH, f, pos)
        p.reth = (r["va"], r["rkey"], r["dma_len"])
        pos += RETH_LEN
    if has_imm:
        p.imm = int.from_bytes(f[pos:pos + IMMDT_LEN], "big")
        pos += IMMDT_LEN
    if has_aeth:
        a = unpack(AETH, f, pos)
        p.aeth = (a["syndrome"], a["msn"])
        pos += AETH_LEN
    p.payload = f[pos:end]
    return p, None


def _patch_bth(frame, **fields):
    """``frame`` with BTH fields replaced and the ICRC recomputed (IP/UDP are untouched)."""
    f = bytearray(frame[:-ICRC_LEN])
    pack(BTH, f, OFF_BTH, **fields)
    return bytes(f) + icrc(f)


def build_rc_packet(qp, port, opcode, psn, payload=b"", reth=None, imm=None, ackreq=None):
    """One RC RDMA WRITE frame, any of the six WRITE opcodes.

    Parameters:
        qp, port: as ``model.frames.build_packet``.
        opcode: ``Op.WRITE_*`` (FIRST, MIDDLE, LAST, LAST_IMM, ONLY, ONLY_IMM).
        psn: 24-bit PSN.
        payload: payload bytes.
        reth: ``(va, rkey, dma_len)``, exactly for FIRST/ONLY/ONLY_IMM.
        imm: 32-bit immediate, exactly for LAST_IMM/ONLY_IMM.
        ackreq: None keeps build_packet's rule (AckReq on LAST/ONLY); True/False forces it.

    The frame is ``build_packet``'s (so headers are identical by construction): the
    *_IMM forms are built as LAST/ONLY with the ImmDt in front of the payload (it follows
    the RETH on the wire) and the opcode patched.
    """
    if opcode not in WRITE_OPCODES:
        raise ValueError(f"opcode must be an RC RDMA WRITE opcode, got {opcode!r}")
    if (opcode in _IMM_BASE) != (imm is not None):
        raise ValueError(f"opcode {opcode:#04x}: imm must be given exactly for WRITE LAST_IMM/ONLY_IMM")
    if imm is not None and not 0 <= imm < 1 << 32:
        raise ValueError(f"imm must be a u32, got {imm!r}")
    _psn_ok(psn)
    body = bytes(payload) if imm is None else imm.to_bytes(IMMDT_LEN, "big") + bytes(payload)
    f = build_packet(qp, port, _IMM_BASE.get(opcode, opcode), psn, body, reth)
    patch = {}
    if opcode in _IMM_BASE:
        patch["opcode"] = opcode
    if ackreq is not None:
        patch["ackreq"] = 0x80 if ackreq else 0
    return _patch_bth(f, **patch) if patch else f


def build_response(qp, port, psn, syndrome, msn):
    """ACK / NAK frame: Ethernet/IPv4/UDP/BTH(opcode 0x11)/AETH/ICRC, 62 bytes.

    Parameters:
        qp: the responder's QpContext (dmac/dip = the requester, remote_qpn = its QPN,
            qpn = the UDP source-port entropy).
        port: the responder's Port.
        psn: BTH.PSN (see ``RcResponder``); syndrome: AETH syndrome (``Aeth``); msn: 24-bit MSN.

    Built by ``build_packet`` as a WRITE MIDDLE whose 4-byte payload is the AETH (same
    length, same IPv4/UDP headers, AckReq clear) with the opcode patched to ACK, so the
    headers come from the one frame builder of the model.
    """
    _psn_ok(psn)
    _psn_ok(msn, "msn")
    if not 0 <= syndrome <= 0xFF:
        raise ValueError(f"AETH syndrome must be a byte, got {syndrome!r}")
    aeth = bytearray(AETH_LEN)
    pack(AETH, aeth, 0, syndrome=syndrome, msn=msn)
    return _patch_bth(build_packet(qp, port, Op.WRITE_MIDDLE, psn, bytes(aeth)), opcode=Op.ACK)


# ---- responder ---------------------------------------------------------------------------
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
        imm: the immediate of a completed *_IMM message (no receive queue is modelled:
            the caller sees it here), else None.
        mr_status: ``spec.formats.MrCheck`` outcome of an access error, else None.
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


@dataclass
class ResponderCounters:
    """Counters of an RcResponder.

    Members:
        rx_frames: frames given to ``receive``; accepted: packets executed;
        messages: messages completed; bytes_written: payload bytes handed out as writes;
        imm_messages: messages with an immediate; acks_sent;
        naks_sent: Counter by response kind ("nak_psn_seq", ...);
        dropped: Counter by reason (``DROP_REASONS``).
    """
    rx_frames: int = 0
    accepted: int = 0
    messages: int = 0
    bytes_written: int = 0
    imm_messages: int = 0
    acks_sent: int = 0
    naks_sent: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)


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


class RcResponder:
    """Receive side of the RC transport for RDMA WRITE (golden model).

    Parameters:
        port: the responder's ``model.frames.Port`` (source of ACK/NAK frames).
        ack_every: default ACK coalescing count (>= 1) for QPs added without one.

    Members:
        port, ack_every.
        qps: {qpn: per-QP state} (``qp_info`` gives a read-only view).
        regions: {key index: ``model.mr.MemoryRegion``}.
        counters: ResponderCounters.

    A QP accepts packets in RTR or RTS. ``receive`` runs the checks of ``parse_frame``,
    then the QP, the PSN, the opcode sequence, the memory key (on FIRST/ONLY, for the
    whole RETH range, with ``model.mr.check`` and right REMOTE_WRITE) and the payload
    length (FIRST/MIDDLE exactly one MTU, LAST/ONLY at most one and the message exactly
    RETH.dma_len); see the module docstring for the ACK, NAK and duplicate rules.
    """

    def __init__(self, port, ack_every=1):
        if not isinstance(port, Port):
            raise ValueError("port must be a model.frames.Port")
        if not isinstance(ack_every, int) or ack_every < 1:
            raise ValueError(f"ack_every must be an int >= 1, got {ack_every!r}")
        self.port = port
        self.ack_every = ack_every
        self.qps = {}
        self.regions = {}
        self.counters = ResponderCounters()

    # -- set-up
    def add_qp(self, ctx, pd, ack_every=None):
        """Create a responder QP.

        Parameters:
            ctx: QpContext of the local QP: qpn (BTH.dqpn of incoming packets), remote_qpn,
                dmac/dip (the requester), start_psn (first expected PSN), mtu, state.
            pd: protection domain of the QP (int >= 0).
            ack_every: ACK coalescing count (>= 1); default the responder's.
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
        self.qps[ctx.qpn] = _RespQp(ctx=ctx, pd=pd, ack_every=every, epsn=ctx.start_psn, state=ctx.state)

    def set_state(self, qpn, state):
        """Move responder QP ``qpn`` to ``state`` (``spec.formats.QpState``)."""
        if state not in range(QpState.RESET, QpState.ERR + 1):
            raise ValueError(f"state must be a spec.formats.QpState value, got {state!r}")
        self._qp(qpn).state = state

    def qp_info(self, qpn):
        """Dict of QP ``qpn``'s state: epsn, msn, state, unacked, nak_sent, in_msg."""
        q = self._qp(qpn)
        return dict(epsn=q.epsn, msn=q.msn, state=q.state, unacked=q.unacked, nak_sent=q.nak_sent,
                    in_msg=q.in_msg)

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

    def _fatal(self, q, p, reason, syndrome, kind, **kw):
        # Class C error: NAK with the offending PSN, nothing executed, QP to ERR.
        q.state = QpState.ERR
        q.in_msg = False
        return self._drop(reason, p, self._respond(q, p.psn, syndrome), kind, **kw)

    def receive(self, frame):
        """Process one received frame; returns an RxResult (the caller performs its writes
        and sends its response)."""
        self.counters.rx_frames += 1
        p, reason = parse_frame(frame, WRITE_OPCODES, self.port)
        if p is None:
            return self._drop(reason)
        q = self.qps.get(p.dqpn)
        if q is None or q.state not in (QpState.RTR, QpState.RTS):
            return self._drop("qp_not_ready", p)
        d = (p.psn - q.epsn) & PSN_MASK
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
        first, last = p.opcode in _FIRST_OPCODES, p.opcode in _LAST_OPCODES
        if first == q.in_msg:  # FIRST/ONLY inside a message, or MIDDLE/LAST outside one
            return self._fatal(q, p, "invalid_request", Aeth.NAK_INVALID_REQ, "nak_invalid_request")
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
        q.in_msg = not last
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
        response = kind = None
        if p.ackreq or last or q.unacked >= q.ack_every:
            q.unacked = 0
            response, kind = self._respond(q, p.psn, Aeth.ACK), "ack"
            self._count_response(kind)
        return RxResult(True, None, p.dqpn, p.psn, p.opcode, writes, response, kind, last, imm)


# ---- requester ---------------------------------------------------------------------------
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
        reason: None, or why the frame was dropped / ignored ("bad_icrc", ..., "unknown_qp",
            "qp_not_rts", "stale", "duplicate_nak", "bad_aeth").
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
        remote_op, rnr, ...), stale_responses (ACK/NAK naming no outstanding PSN),
        duplicate_naks, dropped_responses (Counter by reason);
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
                                   next_psn=ctx.start_psn)

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
    def _cqe(self, q, opcode, index, byte_cnt=0, syndrome=0):
        rec = self.cqs[q.ctx.cqn].push(opcode, q.ctx.qpn, index, byte_cnt, syndrome)
        self.completions.append(rec)
        self.counters.cqes += 1
        self.counters.error_cqes += opcode == CqeOp.REQ_ERR
        return rec

    def _fail(self, q, syndrome, out):
        """Head WQE completes with ``syndrome``, the QP goes to ERR, the rest is flushed."""
        w = q.wqes.popleft()
        out.append(self._cqe(q, CqeOp.REQ_ERR, w.index, 0, syndrome))
        q.state = QpState.ERR
        q.outstanding.clear()
        q.deadline = None
        while q.wqes:
            self.counters.flushed_wqes += 1
            out.append(self._cqe(q, CqeOp.REQ_ERR, q.wqes.popleft().index, 0, CqeSyndrome.WR_FLUSH_ERR))

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
                out.append(self._cqe(q, CqeOp.REQ, w.index, w.length))

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
        self.counters.posted_wqes += 1
        if q.state == QpState.ERR:
            self.counters.flushed_wqes += 1
            self._cqe(q, CqeOp.REQ_ERR, w.index, 0, CqeSyndrome.WR_FLUSH_ERR)
            return []
        if q.state != QpState.RTS:
            self.counters.dropped_posts += 1
            return []
        out = []
        if not w.valid:
            q.blocked = True
            q.wqes.append(_ReqWqe(w.index, "error", True))
            self._advance(q, out)
            return []
        if w.opcode == WqeOp.NOP:   # parse_wqe accepts only NOP and RDMA_WRITE
            q.wqes.append(_ReqWqe(w.index, "nop", w.cq_update))
            if not q.blocked:
                self._advance(q, out)
            return []
        rec = _ReqWqe(w.index, "write", w.cq_update, w.length, w.raddr, w.rkey, w.kind, w.addr, w.inline_data)
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
            q.last_nak_psn = None
            tx += self._retry(q, now, cqes)
        return tx, cqes

    def on_response(self, frame, now):
        """Handle one ACK/NAK frame received at ``now`` (ns); returns a ResponseOutcome.

        ACK: acknowledges every outstanding packet through its PSN. NAK: acknowledges every
        packet before its PSN, then PSN sequence error -> go-back-N from that PSN; invalid
        request / remote access / remote operational error -> REQ_ERR with 0x12 / 0x13 /
        0x14 (another code: BAD_RESP_ERR 0x10), QP to ERR, the rest flushed. RNR NAKs are
        counted and ignored (this responder never sends one; the timer recovers). A
        response whose PSN names no outstanding packet is stale and changes nothing.
        """
        c = self.counters
        res = ResponseOutcome()
        p, reason = parse_frame(frame, (Op.ACK,), self.port)
        if p is None:
            q = None
        else:
            q = self.qps.get(p.dqpn)
            reason = "unknown_qp" if q is None else ("qp_not_rts" if q.state != QpState.RTS else None)
        if reason:
            c.dropped_responses[reason] += 1
            res.reason = reason
            return res
        syndrome, msn = p.aeth
        cls = syndrome >> 5
        # The PSN must name an outstanding packet; anything else is stale (an ACK of
        # something already acknowledged, a late or duplicated response) or bogus.
        valid = ((p.psn - q.una) & PSN_MASK) < len(q.outstanding)
        if cls == Aeth.KIND_ACK:
            c.acks_received += 1
            res.kind = "ack"
            if not valid:
                c.stale_responses += 1
                res.reason = "stale"
                return res
            self._ack_through(q, p.psn, now, res.cqes)
            self._check_msn(q, msn)
            return res
        if cls == Aeth.KIND_RNR:
            # This responder has no receive queue and never sends RNR; the timer recovers.
            c.naks_received["rnr"] += 1
            res.kind = "rnr"
            return res
        if cls != Aeth.KIND_NAK:
            c.dropped_responses["bad_aeth"] += 1
            res.reason = "bad_aeth"
            return res
        code = syndrome & 0x1F
        name = _NAK_NAMES.get(code, f"nak_code_{code}")
        c.naks_received[name] += 1
        res.kind = "nak_" + name
        if not valid:
            c.stale_responses += 1
            res.reason = "stale"
            return res
        # A NAK acknowledges every packet before its PSN.
        if p.psn != q.una:
            self._ack_through(q, (p.psn - 1) & PSN_MASK, now, res.cqes)
        self._check_msn(q, msn)
        if code == 0:
            if q.last_nak_psn == p.psn:
                c.duplicate_naks += 1
                res.reason = "duplicate_nak"
                return res
            q.last_nak_psn = p.psn
            res.retransmit = self._retry(q, now, res.cqes)
            return res
        self._fail(q, _NAK_SYNDROMES.get(code, CqeSyndrome.BAD_RESP_ERR), res.cqes)
        return res

    def _check_msn(self, q, msn):
        if q.state == QpState.RTS and msn != q.msn_acked:
            self.counters.msn_mismatches += 1


# ---- link simulation -----------------------------------------------------------------
class SparseMemory:
    """Byte-addressed memory in 4 KiB pages, zero where never written.

    Members: pages ({page number: bytearray}).
    """
    PAGE = 4096

    def __init__(self):
        self.pages = {}

    def write(self, addr, data):
        """Store ``data`` at ``addr``."""
        data = bytes(data)
        if addr < 0:
            raise ValueError(f"address must be >= 0, got {addr}")
        i = 0
        while i < len(data):
            pg, off = divmod(addr + i, self.PAGE)
            n = min(self.PAGE - off, len(data) - i)
            page = self.pages.setdefault(pg, bytearray(self.PAGE))
            page[off:off + n] = data[i:i + n]
            i += n

    def read(self, addr, n):
        """``n`` bytes from ``addr`` (zeros where never written)."""
        out = bytearray()
        while len(out) < n:
            pg, off = divmod(addr + len(out), self.PAGE)
            k = min(self.PAGE - off, n - len(out))
            page = self.pages.get(pg)
            out += page[off:off + k] if page is not None else bytes(k)
        return bytes(out)


FAULT_KINDS = ("drop", "corrupt", "duplicate", "reorder", "delay")
_BYTES_PER_NS = WIRE_GBPS // 8          # 50 bytes per ns at 400 Gb/s


@dataclass
class LinkRecord:
    """One frame put on a link.

    Members:
        direction: "req" (requester to responder) or "resp"; index: its number on that
        link (what a fault pattern names); time: start of transmission (ns); arrival: when
        it arrives without a delay or reorder fault (ns), None if dropped; frame: the bytes
        as sent (before a corruption); fault: the fault kind applied, or None.
    """
    direction: str
    index: int
    time: int
    arrival: object
    frame: bytes
    fault: object = None


@dataclass
class SimResult:
    """Outcome of ``simulate``.

    Members:
        end_time: time of the last event (ns); hung: the run hit max_events/max_time_ns or
        ended with work left; events: events processed.
        records: every LinkRecord in transmission order (both directions).
        writes: ``[(time, qpn, psn, addr, bytes)]`` performed in the responder's memory.
        faults: {"req"/"resp": Counter of the fault kinds applied}.
        memory: the responder's memory (SparseMemory or the object passed in).
        rx: every RxResult of the responder, in arrival order.
    """
    end_time: int
    hung: bool
    events: int
    records: list
    writes: list
    faults: dict
    memory: object
    rx: list


def _fault_map(faults, name):
    m = {}
    for item in faults:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ValueError(f"{name}: each fault must be (frame index, kind), got {item!r}")
        idx, kind = item
        if not isinstance(idx, int) or idx < 0:
            raise ValueError(f"{name}: frame index must be an int >= 0, got {idx!r}")
        if kind not in FAULT_KINDS:
            raise ValueError(f"{name}: fault kind must be one of {FAULT_KINDS}, got {kind!r}")
        if idx in m:
            raise ValueError(f"{name}: frame {idx} has two faults ({m[idx]}, {kind})")
        m[idx] = kind
    return m


class _Link:
    """One direction of the wire: 400 Gb/s serialisation, fixed latency, faults by index."""

    def __init__(self, direction, faults, latency, delay, window, sim):
        self.direction, self.faults, self.latency, self.delay, self.window = direction, faults, latency, delay, window
        self.sim = sim
        self.count = 0
        self.free_at = 0
        self.held = None           # (token, frame) of a "reorder" frame waiting for the next one

    def send(self, now, frame):
        idx = self.count
        self.count += 1
        start = max(now, self.free_at)
        self.free_at = start + -(-wire_bytes(len(frame)) // _BYTES_PER_NS)
        arrival = self.free_at + self.latency
        kind = self.faults.get(idx)
        rec = LinkRecord(self.direction, idx, start, None if kind == "drop" else arrival, frame, kind)
        self.sim.records.append(rec)
        if kind:
            self.sim.fault_counts[self.direction][kind] += 1
        # A held frame arrives right after the frame sent behind it: the two swap.
        if self.held is not None:
            self.sim.deliver(self.direction, arrival + 1, self.held[1])
            self.held = None
        if kind == "drop":
            return
        if kind == "corrupt":
            # Last byte before the ICRC: covered by the ICRC only, so the receiver's drop
            # reason is bad_icrc for every frame (all frames are >= 62 bytes, headers 54).
            b = bytearray(frame)
            b[-ICRC_LEN - 1] ^= 0xFF
            frame = bytes(b)
        if kind == "delay":
            arrival += self.delay
        if kind == "reorder":
            token = object()
            self.held = (token, frame)
            # No frame follows within the window: it arrives late, alone.
            self.sim.schedule(arrival + self.window, "release", (self, token))
            return
        self.sim.deliver(self.direction, arrival, frame)
        if kind == "duplicate":
            self.sim.deliver(self.direction, arrival + 1, frame)

    def release(self, token, now):
        if self.held is not None and self.held[0] is token:
            self.sim.deliver(self.direction, now, self.held[1])
            self.held = None


class _Sim:
    def __init__(self):
        self.heap = []
        self.seq = 0
        self.records = []
        self.fault_counts = {"req": Counter(), "resp": Counter()}

    def schedule(self, t, kind, data):
        heapq.heappush(self.heap, (t, self.seq, kind, data))
        self.seq += 1

    def deliver(self, direction, t, frame):
        self.schedule(t, "to_resp" if direction == "req" else "to_req", frame)


def simulate(requester, responder, posts, faults=(), response_faults=(), *, latency_ns=1000, delay_ns=None,
             reorder_window_ns=None, memory=None, max_events=1_000_000, max_time_ns=10 ** 12):
    """Run a requester and a responder back to back over a lossy link.

    Parameters:
        requester: RcRequester; responder: RcResponder (QPs paired by the contexts:
            requester ctx.remote_qpn = responder ctx.qpn and the reverse).
        posts: iterable of ``(qpn, wqe_bytes)`` (posted at time 0, in order) or
            ``(time_ns, qpn, wqe_bytes)``.
        faults: fault pattern of the requester-to-responder link, ``[(frame index, kind)]``;
            the index counts every frame put on that link (first transmissions and
            retransmissions) from 0. Kinds (``FAULT_KINDS``):
              drop       the frame never arrives;
              corrupt    the byte before the ICRC is inverted (the receiver drops it: bad_icrc);
              duplicate  a second copy arrives 1 ns after the first;
              reorder    it arrives 1 ns after the next frame of that link (or
                         reorder_window_ns late if none is sent by then);
              delay      it arrives delay_ns late.
        response_faults: the same for the responder-to-requester link (ACKs, NAKs).
        latency_ns: one-way latency of each link (after serialisation at 400 Gb/s, with
            preamble, FCS and gap: ``spec.params.wire_bytes``).
        delay_ns: extra latency of a "delay" fault (default 4 x latency_ns).
        reorder_window_ns: how long a "reorder" frame waits for a follower (default delay_ns).
        memory: object with ``write(addr, bytes)`` for the responder's writes (default a new
            SparseMemory).
        max_events, max_time_ns: stop and report ``hung`` beyond these.

    Time model: frames go out in order on each link, back to back at 400 Gb/s; the
    endpoints take no time (a response or retransmission leaves when its cause arrives);
    the requester's ACK timers fire at their deadlines (an arrival at the same instant is
    handled first). The run ends when no frame is in flight and no timer is armed.

    Returns a SimResult; counters are on the endpoints.
    """
    if not isinstance(requester, RcRequester) or not isinstance(responder, RcResponder):
        raise ValueError("simulate needs an RcRequester and an RcResponder")
    for name, v in (("latency_ns", latency_ns), ("max_events", max_events), ("max_time_ns", max_time_ns)):
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
    delay = 4 * latency_ns if delay_ns is None else delay_ns
    window = delay if reorder_window_ns is None else reorder_window_ns
    for name, v in (("delay_ns", delay), ("reorder_window_ns", window)):
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
    mem = SparseMemory() if memory is None else memory
    sim = _Sim()
    fwd = _Link("req", _fault_map(faults, "faults"), latency_ns, delay, window, sim)
    rev = _Link("resp", _fault_map(response_faults, "response_faults"), latency_ns, delay, window, sim)
    for item in posts:
        if len(item) == 2:
            t, (qpn, wqe) = 0, item
        elif len(item) == 3:
            t, qpn, wqe = item
        else:
            raise ValueError(f"a post must be (qpn, wqe_bytes) or (time_ns, qpn, wqe_bytes), got {item!r}")
        if not isinstance(t, int) or t < 0:
            raise ValueError(f"post time must be an int >= 0, got {t!r}")
        sim.schedule(t, "post", (qpn, bytes(wqe)))
    writes, rx = [], []
    now = events = 0
    hung = False
    while True:
        t_ev = sim.heap[0][0] if sim.heap else None
        t_to = requester.next_deadline()
        if t_ev is None and t_to is None:
            break
        if events >= max_events or min(t for t in (t_ev, t_to) if t is not None) > max_time_ns:
            hung = True
            break
        events += 1
        if t_ev is not None and (t_to is None or t_ev <= t_to):
            now, _, kind, data = heapq.heappop(sim.heap)
            if kind == "post":
                for pkt in requester.post(data[0], data[1], now):
                    fwd.send(now, pkt.frame)
            elif kind == "to_resp":
                r = responder.receive(data)
                rx.append(r)
                for addr, chunk in r.writes:
                    mem.write(addr, chunk)
                    writes.append((now, r.qpn, r.psn, addr, chunk))
                if r.response is not None:
                    rev.send(now, r.response)
            elif kind == "to_req":
                for pkt in requester.on_response(data, now).retransmit:
                    fwd.send(now, pkt.frame)
            else:  # release of a held "reorder" frame
                link, token = data
                link.release(token, now)
        else:
            now = t_to
            tx, _ = requester.on_timeout(now)
            for pkt in tx:
                fwd.send(now, pkt.frame)
    hung = hung or not requester.idle()
    return SimResult(end_time=now, hung=hung, events=events, records=sim.records, writes=writes,
                     faults=sim.fault_counts, memory=mem, rx=rx)
