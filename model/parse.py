"""RC frames of the golden model: check and decode one RoCEv2 RC frame, build WRITE and ACK/NAK frames.

Event-level, pure Python and deterministic (see ``model/responder.py`` and
``model/requester.py`` for the transport rules that use these frames).

Contents:
    CqeSyndrome                 mlx5 CQE error syndromes (rdma-core; spec.formats.Syndrome)
    Aeth                        AETH syndromes (SPEC section 5; spec.formats.Aeth)
    DROP_REASONS                why a responder drops a frame
    WRITE_OPCODES               the six RDMA WRITE opcodes
    ParsedFrame, parse_frame    checks and decodes one RoCEv2 RC frame
    build_rc_packet             WRITE packets incl. the *_IMM opcodes and an AckReq override
    build_response              ACK / NAK frame (BTH + AETH)
"""

from dataclasses import dataclass

from spec import formats as F
from spec.formats import (
    AETH, AETH_LEN, BTH, BTH_LEN, DEFAULT_PKEY, ETH, ETHERTYPE_IPV4, ICRC_LEN, IPV4, IPV4_LEN,
    IP_PROTO_UDP, IPV4_VER_IHL, OFF_BTH, OFF_EXT, OFF_IP, OFF_UDP, Op, RETH, RETH_LEN,
    ROCEV2_UDP_PORT, UDP, pack, unpack,
)
from spec.formats import DROP_REASONS, ETH_MIN_FRAME, IMMDT_LEN, MKEY_VARIANT_BITS, MSN_MASK, PSN_HALF, PSN_MASK
from model.frames import build_packet, ip_bytes, mac_bytes
from model.icrc import icrc, ipv4_checksum

__all__ = [
    "CqeSyndrome", "Aeth", "DROP_REASONS", "IMMDT_LEN", "ETH_MIN_FRAME", "PSN_HALF", "MSN_MASK", "WRITE_OPCODES",
    "MR_INDEX_SHIFT", "ParsedFrame", "parse_frame", "build_rc_packet", "build_response", "SEND_OPCODES",
]

CqeSyndrome = F.Syndrome               # mlx5 CQE syndromes, defined once in spec/formats.py
Aeth = F.Aeth                          # AETH syndromes, defined once in spec/formats.py


# IMMDT_LEN, ETH_MIN_FRAME, PSN_HALF, MSN_MASK and DROP_REASONS (why a responder drops a
# frame, in the order the checks run: spec.formats.RX_VERDICTS) are spec.formats'. An unknown
# destination QP counts as qp_not_ready: a QP number without a context is a QP in RESET.

_EXT = F.EXT_HEADERS                   # opcode -> (RETH, ImmDt, AETH) present
WRITE_OPCODES = frozenset(F.WRITE_OPS)
_FIRST_OPCODES = frozenset(F.FIRST_OPS)
_LAST_OPCODES = frozenset(F.LAST_OPS)
_IMM_BASE = {Op.WRITE_LAST_IMM: Op.WRITE_LAST, Op.WRITE_ONLY_IMM: Op.WRITE_ONLY}
# SEND opcodes (the two-sided verbs): parsed only when the caller names them in ``opcodes``
# (the engine's receive port takes them only with two-sided verbs); (RETH, ImmDt, AETH).
_SEND_EXT = {Op.SEND_FIRST: (False, False, False), Op.SEND_MIDDLE: (False, False, False),
             Op.SEND_LAST: (False, False, False), Op.SEND_LAST_IMM: (False, True, False),
             Op.SEND_ONLY: (False, False, False), Op.SEND_ONLY_IMM: (False, True, False)}
SEND_OPCODES = frozenset(_SEND_EXT)
_NAK_NAMES = {0: "psn_seq", 1: "invalid_request", 2: "remote_access", 3: "remote_op"}
_NAK_SYNDROMES = {1: CqeSyndrome.REMOTE_INVAL_REQ_ERR, 2: CqeSyndrome.REMOTE_ACCESS_ERR,
                  3: CqeSyndrome.REMOTE_OP_ERR}
MR_INDEX_SHIFT = MKEY_VARIANT_BITS     # mlx5 keys: index << 8 | variant byte (spec.formats)


def _psn_ok(v, name="psn"):
    if not isinstance(v, int) or not 0 <= v <= PSN_MASK:
        raise ValueError(f"{name} must be a 24-bit int, got {v!r}")



# ---- frames ----------------------------------------------------------------------------
@dataclass
class ParsedFrame:
    """The transport fields of a frame that passed every header check.

    Members:
        opcode, padcnt, pkey, dqpn, ackreq (bool), psn, se (bool: the SE bit): BTH.
        reth: ``(va, rkey, dma_len)`` or None; imm: ImmDt (int) or None;
        aeth: ``(syndrome, msn)`` or None.
        payload: payload bytes (pad bytes and ICRC removed).
        smac, sip: the Ethernet source MAC (6 bytes) and IPv4 source address (4 bytes).
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
    smac: bytes = b""
    sip: bytes = b""
    atomic: object = None      # an atomic request's AtomicETH or MaskedAtomicETH fields (dict)
    orig: object = None        # an ATOMIC ACKNOWLEDGE's original value
    se: bool = False           # BTH SE (solicited event)

    def from_peer(self, ctx):
        """True when the frame comes from QP context ``ctx``'s peer (its ``dmac`` and ``dip``)."""
        return self.smac == mac_bytes(ctx.dmac) and self.sip == ip_bytes(ctx.dip)


def parse_frame(frame, opcodes=None, port=None):
    """Check and decode one RoCEv2 frame (Ethernet header through ICRC, no FCS).

    Parameters:
        frame: the frame bytes.
        opcodes: BTH opcodes the caller accepts (default: every opcode this model knows:
            RDMA WRITE FIRST/MIDDLE/LAST/ONLY with and without immediate, ACK and ATOMIC
            ACKNOWLEDGE: what the engine's receive port takes). READ, atomic and SEND
            opcodes are parsed only when named here.
        port: the receiving ``model.frames.Port``: a frame whose destination MAC or IPv4
            address is not the port's is dropped (bad_address); None: not checked.

    Returns ``(ParsedFrame, None)`` or ``(None, reason)``, reason one of the first seven
    of ``DROP_REASONS``. Checks in order: long enough for Ethernet+IPv4+UDP+BTH+ICRC;
    IPv4 with a 20-byte header (else not_roce); IPv4 header checksum; protocol UDP, no
    fragment, destination port 4791 (else not_roce); destination MAC and IPv4 address
    the port's (bad_address); IPv4 total length and UDP length
    against the frame length (a 60-byte frame may carry Ethernet padding behind a shorter
    IP packet: the padding is removed first); ICRC; P_Key 0xFFFF; BTH TVer 0 (else bad_version); known opcode; frame long enough for
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
    if b["flags"] & 0x0F:
        return None, "bad_version"         # BTH TVer (flags bits 3:0) must be 0
    op = b["opcode"]
    allowed = _EXT if opcodes is None else opcodes
    if op in _REMOTE_EXT and op in allowed:
        return _parse_remote_op(f, n, b, op)
    if (op not in _EXT and op not in _SEND_EXT) or op not in allowed:
        return None, "bad_opcode"
    # (the AtomicAckETH opcode is a _REMOTE_EXT one)
    has_reth, has_imm, has_aeth = (_EXT[op] if op in _EXT else _SEND_EXT[op])[:3]
    padcnt = (b["flags"] >> 4) & 3
    pos = OFF_EXT
    ext = RETH_LEN * has_reth + IMMDT_LEN * has_imm + AETH_LEN * has_aeth
    end = n - ICRC_LEN - padcnt
    if pos + ext > end or (has_aeth and pos + ext != end):
        return None, "bad_length"
    p = ParsedFrame(opcode=op, padcnt=padcnt, pkey=b["pkey"], dqpn=b["dqpn"], ackreq=bool(b["ackreq"] & 0x80),
                    psn=b["psn"], smac=f[6:12], sip=f[OFF_IP + 12:OFF_IP + 16], se=bool(b["flags"] & F.BTH_SE))
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


# READ and atomics (model/read_atomic.py builds them; the engine's receive path does not
# take them yet, so ``parse_frame`` parses them only when the caller names them in
# ``opcodes``): opcode -> (extension headers before the payload, payload allowed).
_REMOTE_EXT = {
    Op.READ_REQUEST: ((F.RETH,), False),
    Op.READ_RESP_FIRST: ((F.AETH,), True), Op.READ_RESP_MIDDLE: ((), True),
    Op.READ_RESP_LAST: ((F.AETH,), True), Op.READ_RESP_ONLY: ((F.AETH,), True),
    Op.ATOMIC_ACK: ((F.AETH, F.ATOMIC_ACK_ETH), False),
    Op.COMPARE_SWAP: ((F.ATOMIC_ETH,), False), Op.FETCH_ADD: ((F.ATOMIC_ETH,), False),
    Op.MASKED_COMPARE_SWAP: ((F.MASKED_ATOMIC_ETH,), False), Op.MASKED_FETCH_ADD: ((F.MASKED_ATOMIC_ETH,), False),
}
REMOTE_OPCODES = frozenset(_REMOTE_EXT)
ATOMIC_OPCODES = frozenset((Op.COMPARE_SWAP, Op.FETCH_ADD, Op.MASKED_COMPARE_SWAP, Op.MASKED_FETCH_ADD))


def _table_len(table):
    return max(off + width for _, off, width in table)


def _parse_remote_op(f, n, b, op):
    """The rest of ``parse_frame`` for a READ or atomic opcode: headers exactly as
    ``_REMOTE_EXT`` says (a request or ATOMIC ACK carries nothing after them)."""
    tables, payload_ok = _REMOTE_EXT[op]
    padcnt = (b["flags"] >> 4) & 3
    pos = OFF_EXT
    ext = sum(_table_len(t) for t in tables)
    end = n - ICRC_LEN - padcnt
    if pos + ext > end or (not payload_ok and pos + ext != end):
        return None, "bad_length"
    p = ParsedFrame(opcode=op, padcnt=padcnt, pkey=b["pkey"], dqpn=b["dqpn"], ackreq=bool(b["ackreq"] & 0x80),
                    psn=b["psn"], smac=f[6:12], sip=f[OFF_IP + 12:OFF_IP + 16])
    for t in tables:
        v = unpack(t, f, pos)
        if t is F.RETH:
            p.reth = (v["va"], v["rkey"], v["dma_len"])
        elif t is F.AETH:
            p.aeth = (v["syndrome"], v["msn"])
        elif t is F.ATOMIC_ACK_ETH:
            p.orig = v["orig"]
        else:
            p.atomic = v
        pos += _table_len(t)
    p.payload = f[pos:end]
    return p, None


def _patch_bth(frame, **fields):
    """``frame`` with BTH fields replaced and the ICRC recomputed (IP/UDP are untouched)."""
    f = bytearray(frame[:-ICRC_LEN])
    pack(BTH, f, OFF_BTH, **fields)
    return bytes(f) + icrc(f)


def build_rc_packet(qp, port, opcode, psn, payload=b"", reth=None, imm=None, ackreq=None, pad=True):
    """One RC RDMA WRITE frame, any of the six WRITE opcodes.

    Parameters:
        qp, port: as ``model.frames.build_packet``.
        opcode: ``Op.WRITE_*`` (FIRST, MIDDLE, LAST, LAST_IMM, ONLY, ONLY_IMM).
        psn: 24-bit PSN.
        payload: payload bytes.
        reth: ``(va, rkey, dma_len)``, exactly for FIRST/ONLY/ONLY_IMM.
        imm: 32-bit immediate, exactly for LAST_IMM/ONLY_IMM.
        ackreq: None keeps build_packet's rule (AckReq on LAST/ONLY); True/False forces it.
        pad: the IBTA pad (``build_rc_frame``); False builds the frame a peer that does not
            pad would send.

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
    f = build_packet(qp, port, _IMM_BASE.get(opcode, opcode), psn, body, reth, pad=pad)
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
