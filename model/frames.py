"""Golden model of WQE decoding and RoCEv2 RDMA WRITE frame building.

Contents:
    Port, QpContext            plain dataclasses for the port and per-QP context
    mac_bytes, ip_bytes        address normalisation helpers
    split_message              message length -> (BTH opcode, offset, length) per packet
    build_packet               one Ethernet/IPv4/UDP/BTH[/RETH]/payload/ICRC frame
    build_write_frames         every frame of one RDMA WRITE message
    frame_len                  expected frame length for a packet
    Wqe, parse_wqe             decode raw mlx5 WQE bytes (SPEC section 2)
    build_ctrl, build_write_wqe, build_nop_wqe   encode WQEs (for tests and testbenches)
    build_send_wqe, build_write_imm_wqe, build_data_wqe   SEND / SEND_IMM / WRITE_IMM WQEs, gather lists
    sq_slot_address            address of WQEBB n of a send queue
    message_packets            a data WQE's message -> (BTH opcode, offset, length) per packet
    build_request_packet       one SEND / WRITE request packet of any of the 12 opcodes
    build_message_frames       every frame of one SEND / SEND_IMM / WRITE / WRITE_IMM message
    read_gather                bytes of a gather list (the concatenation of its segments)

Decisions of the two-sided verbs (``two_sided=True``; the RTL must follow them):
    - Data WQEs (mlx5 forms, rdma-core ``mlx5_post_send``): RDMA_WRITE and RDMA_WRITE_IMM
      are ctrl + raddr + data; SEND and SEND_IMM are ctrl + data, no raddr segment. The
      data is either one inline segment that fills the rest of ds exactly, or 0..n pointer
      segments (a gather list: the message is the concatenation of the segments, in
      order; a segment of byte_count 0 adds nothing; the total must stay below 2^31,
      IBTA's largest message). An inline segment after a pointer segment is malformed.
      ds = 2 (WRITE) or 1 (SEND) is a message of 0 bytes. Without ``two_sided`` only
      RDMA_WRITE with at most one data segment is executed (the engine's RTL today).
    - The immediate of SEND_IMM / RDMA_WRITE_IMM is ctrl bytes 12-15 (rdma-core stores
      the big-endian imm_data there): the ImmDt on the wire carries those 4 bytes as they
      are (``Wqe.imm`` is their big-endian value).
    - Packets: split at the MTU as WRITEs are (``split_message``). SEND: SEND ONLY, or
      FIRST / MIDDLE ... / LAST, no RETH; SEND_IMM: ONLY_IMM or LAST_IMM carry the ImmDt
      right after the BTH. WRITE_IMM: WRITE ONLY_IMM (RETH, then ImmDt) or FIRST (RETH) /
      MIDDLE / LAST_IMM (ImmDt). AckReq on every message's last packet (LAST/ONLY, with or
      without immediate). The ctrl's SOLICITED bit (fm_ce_se 0x02) sets the BTH SE bit on
      the last packet of a SEND, SEND_IMM or WRITE_IMM (IBTA: SE only on a message's last
      packet; a plain WRITE completes nothing at the responder, so never). Every frame is
      ``build_rc_frame``'s (its IBTA pad included).

All layouts, offsets and constants come from ``spec.formats`` / ``spec.params``.
"""

from dataclasses import dataclass
import ipaddress

from spec.formats import (
    BTH, BTH_PADCNT_SHIFT, CTRL_SEG, DATA_SEG, DEFAULT_PKEY, DS_UNIT, ETH, ETH_LEN, ETHERTYPE_IPV4,
    FM_CE_SE_CQ_UPDATE, HDR_LEN_NO_RETH, HDR_LEN_RETH, ICRC_LEN, INLINE_FLAG, IP_PROTO_UDP,
    IPV4, IPV4_FLAGS_DF, IPV4_LEN, IPV4_TTL, IPV4_VER_IHL, MAX_WQEBBS, OFF_BTH, OFF_EXT,
    OFF_IP, OFF_UDP, Op, PSN_MASK, QpState, RADDR_SEG, RETH, RETH_LEN, ROCE_SPORT_BASE, ROCEV2_UDP_PORT, UDP,
    WQEBB, WqeOp, get_field, mtu_code, pack, pad_count, unpack,
)
from model.icrc import icrc, ipv4_checksum
from spec.formats import BTH_SE, FM_CE_SE_SOLICITED, IMMDT_LEN, RNR_RETRY_FOREVER
from model.recv_queue import RecvQueue

__all__ = [
    "Port", "QpContext", "mac_bytes", "ip_bytes", "split_message", "build_packet", "build_rc_frame",
    "build_write_frames", "frame_len", "Wqe", "parse_wqe", "build_ctrl", "build_write_wqe",
    "build_nop_wqe", "sq_slot_address", "PSN_MASK", "BTH_ACKREQ", "build_send_wqe", "build_write_imm_wqe",
    "build_data_wqe", "message_packets", "build_request_packet", "build_message_frames", "read_gather",
    "DATA_WQE_OPS", "SEND_OPCODES", "REQUEST_RETH_OPCODES", "REQUEST_IMM_OPCODES", "REQUEST_LAST_OPCODES",
]

# PSN_MASK: spec.formats' (re-exported)
BTH_ACKREQ = 0x80                  # BTH byte 8: AckReq bit
_RETH_OPCODES = (Op.WRITE_FIRST, Op.WRITE_ONLY)
_ACKREQ_OPCODES = (Op.WRITE_LAST, Op.WRITE_ONLY)
_WRITE_OPCODES = (Op.WRITE_FIRST, Op.WRITE_MIDDLE, Op.WRITE_LAST, Op.WRITE_ONLY)
# The two-sided request opcodes and their headers (IBTA RC; spec.formats.Op)
SEND_OPCODES = (Op.SEND_FIRST, Op.SEND_MIDDLE, Op.SEND_LAST, Op.SEND_LAST_IMM, Op.SEND_ONLY, Op.SEND_ONLY_IMM)
REQUEST_RETH_OPCODES = (Op.WRITE_FIRST, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM)
REQUEST_IMM_OPCODES = (Op.WRITE_LAST_IMM, Op.WRITE_ONLY_IMM, Op.SEND_LAST_IMM, Op.SEND_ONLY_IMM)
REQUEST_LAST_OPCODES = (Op.WRITE_LAST, Op.WRITE_LAST_IMM, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM,
                        Op.SEND_LAST, Op.SEND_LAST_IMM, Op.SEND_ONLY, Op.SEND_ONLY_IMM)
# The WQE opcodes that carry a message (two_sided: all four; else RDMA_WRITE only)
DATA_WQE_OPS = (WqeOp.RDMA_WRITE, WqeOp.RDMA_WRITE_IMM, WqeOp.SEND, WqeOp.SEND_IMM)
_RADDR_WQE_OPS = (WqeOp.RDMA_WRITE, WqeOp.RDMA_WRITE_IMM)
# split_message's packet kinds (named by the WRITE opcodes) -> the BTH opcode per WQE opcode
_PACKET_OPS = {
    WqeOp.RDMA_WRITE: {Op.WRITE_FIRST: Op.WRITE_FIRST, Op.WRITE_MIDDLE: Op.WRITE_MIDDLE,
                       Op.WRITE_LAST: Op.WRITE_LAST, Op.WRITE_ONLY: Op.WRITE_ONLY},
    WqeOp.RDMA_WRITE_IMM: {Op.WRITE_FIRST: Op.WRITE_FIRST, Op.WRITE_MIDDLE: Op.WRITE_MIDDLE,
                           Op.WRITE_LAST: Op.WRITE_LAST_IMM, Op.WRITE_ONLY: Op.WRITE_ONLY_IMM},
    WqeOp.SEND: {Op.WRITE_FIRST: Op.SEND_FIRST, Op.WRITE_MIDDLE: Op.SEND_MIDDLE,
                 Op.WRITE_LAST: Op.SEND_LAST, Op.WRITE_ONLY: Op.SEND_ONLY},
    WqeOp.SEND_IMM: {Op.WRITE_FIRST: Op.SEND_FIRST, Op.WRITE_MIDDLE: Op.SEND_MIDDLE,
                     Op.WRITE_LAST: Op.SEND_LAST_IMM, Op.WRITE_ONLY: Op.SEND_ONLY_IMM},
}


# ---- addresses ---------------------------------------------------------------------
def mac_bytes(mac):
    """6 bytes of a MAC address.

    Parameters:
        mac: 48-bit int (0xAABBCCDDEEFF = aa:bb:cc:dd:ee:ff), 6 bytes, or a
            string "aa:bb:cc:dd:ee:ff".
    """
    if isinstance(mac, str):
        parts = mac.replace("-", ":").split(":")
        if len(parts) != 6:
            raise ValueError(f"MAC string must have 6 octets: {mac!r}")
        return bytes(int(p, 16) for p in parts)
    if isinstance(mac, (bytes, bytearray)):
        if len(mac) != 6:
            raise ValueError(f"MAC must be 6 bytes, got {len(mac)}")
        return bytes(mac)
    if isinstance(mac, int) and 0 <= mac < 1 << 48:
        return mac.to_bytes(6, "big")
    raise ValueError(f"bad MAC address {mac!r}")


def ip_bytes(ip):
    """4 bytes of an IPv4 address.

    Parameters:
        ip: 32-bit int (0xC0A80001 = 192.168.0.1), 4 bytes, or a dotted string.
    """
    if isinstance(ip, str):
        return ipaddress.IPv4Address(ip).packed
    if isinstance(ip, (bytes, bytearray)):
        if len(ip) != 4:
            raise ValueError(f"IPv4 address must be 4 bytes, got {len(ip)}")
        return bytes(ip)
    if isinstance(ip, int) and 0 <= ip < 1 << 32:
        return ip.to_bytes(4, "big")
    raise ValueError(f"bad IPv4 address {ip!r}")


# ---- contexts ----------------------------------------------------------------------
@dataclass
class Port:
    """Port context.

    Parameters:
        smac: source MAC (int, 6 bytes or string; see ``mac_bytes``).
        sip: source IPv4 (int, 4 bytes or dotted string; see ``ip_bytes``).
    """
    smac: object
    sip: object

    def __post_init__(self):
        mac_bytes(self.smac)
        ip_bytes(self.sip)


@dataclass
class QpContext:
    """Per-QP context, as written through the CSR QP_* registers.

    Parameters:
        qpn: local QP number (24 bits); also the UDP source-port entropy.
        remote_qpn: destination QPN written to BTH.dqpn (24 bits).
        dmac: destination MAC; dip: destination IPv4 (see ``mac_bytes``/``ip_bytes``).
        sq_base: send-queue base address (64-byte aligned).
        log_depth: log2 of the SQ depth in WQEBBs (0..15).
        cqn: CQ receiving this QP's send completions.
        start_psn: PSN of the first packet (24 bits).
        mtu: path MTU in bytes (256, 512, 1024, 2048 or 4096).
        state: ``spec.formats.QpState`` value; only RTS sends.
        user_index: 24-bit user index its CQEs carry in srqn_uidx (QP_USER_INDEX).
        rq: its receive queue (``model.recv_queue.RecvQueue``), or None: a QP without one
            has no receive WQE ever posted (every SEND and WRITE with immediate it gets is
            answered by an RNR NAK).
        rcqn: CQ receiving this QP's receive completions (may equal ``cqn``).
        min_rnr_timer: IBTA RNR timer code (0..31) its RNR NAKs carry
            (``spec.formats.RNR_TIMER_NS``; ibv_qp_attr.min_rnr_timer).
        rnr_retry: how often its requester resends after an RNR NAK before it fails the
            WQE with RNR_RETRY_EXC_ERR (0..7; 7 = without limit, RNR_RETRY_FOREVER).
    """
    qpn: int
    remote_qpn: int
    dmac: object
    dip: object
    sq_base: int = 0
    log_depth: int = 10
    cqn: int = 0
    start_psn: int = 0
    mtu: int = 4096
    state: int = QpState.RTS
    user_index: int = 0
    rq: object = None
    rcqn: int = 0
    min_rnr_timer: int = 1
    rnr_retry: int = RNR_RETRY_FOREVER

    def __post_init__(self):
        for name in ("qpn", "remote_qpn", "start_psn", "user_index"):
            v = getattr(self, name)
            if not 0 <= v <= PSN_MASK:
                raise ValueError(f"QpContext.{name} must fit in 24 bits, got {v:#x}")
        if self.rq is not None and not isinstance(self.rq, RecvQueue):
            raise ValueError(f"QpContext.rq must be a model.recv_queue.RecvQueue or None, got {self.rq!r}")
        if isinstance(self.rcqn, bool) or not isinstance(self.rcqn, int) or self.rcqn < 0:
            raise ValueError(f"QpContext.rcqn must be an int >= 0, got {self.rcqn!r}")
        if isinstance(self.min_rnr_timer, bool) or not isinstance(self.min_rnr_timer, int) \
                or not 0 <= self.min_rnr_timer <= 31:
            raise ValueError(f"QpContext.min_rnr_timer must be an RNR timer code 0..31, got {self.min_rnr_timer!r}")
        if isinstance(self.rnr_retry, bool) or not isinstance(self.rnr_retry, int) or not 0 <= self.rnr_retry <= 7:
            raise ValueError(f"QpContext.rnr_retry must be 0..7 (7: without limit), got {self.rnr_retry!r}")
        mtu_code(self.mtu)            # raises ValueError on a bad MTU
        if not 0 <= self.log_depth <= 15:
            raise ValueError(f"QpContext.log_depth must be 0..15, got {self.log_depth}")
        if self.sq_base % WQEBB:
            raise ValueError(f"QpContext.sq_base must be {WQEBB}-byte aligned, got {self.sq_base:#x}")
        mac_bytes(self.dmac)
        ip_bytes(self.dip)

    @property
    def depth(self):
        """SQ depth in WQEBBs."""
        return 1 << self.log_depth


def sq_slot_address(qp, n):
    """Address of WQEBB ``n`` (free-running index) of ``qp``'s send queue."""
    return qp.sq_base + ((n & (qp.depth - 1)) * WQEBB)


# ---- packets -----------------------------------------------------------------------
def split_message(length, mtu):
    """Packetisation of an RDMA WRITE message.

    Parameters:
        length: message length in bytes (>= 0).
        mtu: path MTU in bytes.

    Returns a list of ``(bth_opcode, payload_offset, payload_len)``: one WRITE
    ONLY for 0..mtu bytes, else FIRST (mtu), MIDDLE (mtu) ..., LAST (rest, 1..mtu).
    """
    if length < 0:
        raise ValueError(f"message length must be >= 0, got {length}")
    mtu_code(mtu)
    if length <= mtu:
        return [(Op.WRITE_ONLY, 0, length)]
    n = -(-length // mtu)
    out = [(Op.WRITE_FIRST, 0, mtu)]
    out += [(Op.WRITE_MIDDLE, i * mtu, mtu) for i in range(1, n - 1)]
    out.append((Op.WRITE_LAST, (n - 1) * mtu, length - (n - 1) * mtu))
    return out


def frame_len(bth_opcode, payload_len):
    """Captured frame length (no FCS, ICRC included) of a WRITE packet: its payload padded
    to a multiple of 4 bytes (IBTA PadCnt)."""
    hdr = HDR_LEN_RETH if bth_opcode in _RETH_OPCODES else HDR_LEN_NO_RETH
    return hdr + payload_len + pad_count(payload_len) + ICRC_LEN


def build_packet(qp, port, bth_opcode, psn, payload, reth=None, *, pad=True):
    """Build one RoCEv2 RC RDMA WRITE frame (without FCS, with ICRC).

    Parameters:
        qp: QpContext (dmac, dip, remote_qpn, qpn for the UDP source port).
        port: Port (smac, sip).
        bth_opcode: one of Op.WRITE_FIRST/MIDDLE/LAST/ONLY.
        psn: packet sequence number (taken mod 2^24).
        payload: payload bytes.
        reth: ``(va, rkey, dma_len)``; required for FIRST and ONLY, forbidden otherwise.

    Returns the frame bytes.
    """
    if bth_opcode not in _WRITE_OPCODES:
        raise ValueError(f"bth_opcode must be an RC RDMA WRITE opcode, got {bth_opcode:#x}")
    if (bth_opcode in _RETH_OPCODES) != (reth is not None):
        raise ValueError(f"opcode {bth_opcode:#x}: RETH must be given exactly for WRITE FIRST/ONLY")
    ext = b""
    if reth is not None:
        e = bytearray(RETH_LEN)
        pack(RETH, e, 0, va=reth[0], rkey=reth[1], dma_len=reth[2])
        ext = bytes(e)
    return build_rc_frame(qp, port, bth_opcode, psn, ext, payload, ackreq=bth_opcode in _ACKREQ_OPCODES, pad=pad)


def build_rc_frame(qp, port, bth_opcode, psn, ext=b"", payload=b"", *, ackreq=False, pad=True):
    """One RoCEv2 frame of any BTH opcode (without FCS, with ICRC): Ethernet, IPv4, UDP,
    BTH (``ackreq`` sets its AckReq bit), the extension headers ``ext`` as given, the
    payload and its IBTA pad (zero bytes up to a multiple of 4, counted in the BTH's
    PadCnt; rxe rejects a request whose payload is not padded so; ``pad=False`` leaves it
    out, as a peer that does not pad would, for receive tests of every frame size). ``qp``
    gives dmac, dip, remote_qpn and qpn (UDP source port), ``port`` smac and sip."""
    if not 0 <= bth_opcode <= 0xFF:
        raise ValueError(f"bth_opcode must be a byte, got {bth_opcode!r}")
    payload = bytes(payload)
    pad = pad_count(len(payload)) if pad else 0
    hdr = OFF_EXT + len(ext)
    total = hdr + len(payload) + pad + ICRC_LEN
    f = bytearray(OFF_EXT)
    pack(ETH, f, 0, dmac=int.from_bytes(mac_bytes(qp.dmac), "big"),
         smac=int.from_bytes(mac_bytes(port.smac), "big"), ethertype=ETHERTYPE_IPV4)
    pack(IPV4, f, OFF_IP, ver_ihl=IPV4_VER_IHL, tos=0, total_len=total - ETH_LEN, ident=0,
         flags_frag=IPV4_FLAGS_DF, ttl=IPV4_TTL, proto=IP_PROTO_UDP, checksum=0,
         sip=int.from_bytes(ip_bytes(port.sip), "big"), dip=int.from_bytes(ip_bytes(qp.dip), "big"))
    pack(IPV4, f, OFF_IP, checksum=ipv4_checksum(f[OFF_IP:OFF_IP + IPV4_LEN]))
    pack(UDP, f, OFF_UDP, sport=ROCE_SPORT_BASE | (qp.qpn & 0x3FFF), dport=ROCEV2_UDP_PORT,
         length=total - OFF_UDP, checksum=0)
    pack(BTH, f, OFF_BTH, opcode=bth_opcode, flags=pad << BTH_PADCNT_SHIFT, pkey=DEFAULT_PKEY, fecn_becn=0,
         dqpn=qp.remote_qpn, ackreq=BTH_ACKREQ if ackreq else 0, psn=psn & PSN_MASK)
    f += bytes(ext) + payload + bytes(pad)
    return bytes(f) + icrc(f)


def build_write_frames(qp, port, raddr, rkey, payload, psn_start, *, pad=True):
    """All frames of one RDMA WRITE message, in send order.

    Parameters:
        qp: QpContext (uses mtu, dmac, dip, remote_qpn, qpn).
        port: Port.
        raddr: remote virtual address (RETH.va of FIRST/ONLY).
        rkey: remote key (RETH.rkey).
        payload: the whole message (bytes); its length is RETH.dma_len.
        psn_start: PSN of the first packet; later packets take the next PSNs mod 2^24.
        pad: the IBTA pad on the last packet (``build_rc_frame``).

    Returns a list of frame bytes (a zero-length message gives one WRITE ONLY).
    """
    payload = bytes(payload)
    if not 0 <= raddr < 1 << 64:
        raise ValueError(f"raddr must be a u64, got {raddr:#x}")
    if not 0 <= rkey < 1 << 32:
        raise ValueError(f"rkey must be a u32, got {rkey:#x}")
    if len(payload) >= 1 << 32:
        raise ValueError("message longer than 2^32 - 1 bytes")
    frames = []
    for i, (op, off, n) in enumerate(split_message(len(payload), qp.mtu)):
        reth = (raddr, rkey, len(payload)) if op in _RETH_OPCODES else None
        frames.append(build_packet(qp, port, op, (psn_start + i) & PSN_MASK, payload[off:off + n], reth, pad=pad))
    return frames


# ---- two-sided and immediate messages -----------------------------------------------------
def message_packets(wqe_opcode, length, mtu):
    """Packetisation of the message of a data WQE (``DATA_WQE_OPS``).

    Returns ``[(bth_opcode, payload_offset, payload_len)]``: ``split_message``'s split with
    the opcodes of ``wqe_opcode`` (SEND FIRST/MIDDLE/LAST/ONLY, the *_IMM forms on the
    last packet of SEND_IMM and RDMA_WRITE_IMM).
    """
    if wqe_opcode not in _PACKET_OPS:
        raise ValueError(f"wqe_opcode must be one of RDMA_WRITE, RDMA_WRITE_IMM, SEND, SEND_IMM, got {wqe_opcode!r}")
    ops = _PACKET_OPS[wqe_opcode]
    return [(ops[op], off, n) for op, off, n in split_message(length, mtu)]


def _with_se(frame):
    """``frame`` with the BTH SE bit set and its ICRC made again (the flags byte is
    covered by the ICRC; PadCnt and TVer are kept)."""
    f = bytearray(frame[:-ICRC_LEN])
    f[OFF_BTH + 1] |= BTH_SE
    return bytes(f) + icrc(f)


def build_request_packet(qp, port, bth_opcode, psn, payload, *, reth=None, imm=None, se=False):
    """One SEND or RDMA WRITE request packet, any of the 12 opcodes (with or without
    immediate), through ``build_rc_frame`` (so its pad and headers are the model's one form).

    Parameters:
        qp, port: as ``build_packet``.
        bth_opcode: ``Op.SEND_*`` or ``Op.WRITE_*``.
        psn: PSN (taken mod 2^24); payload: the packet's payload bytes.
        reth: ``(va, rkey, dma_len)``, exactly for WRITE FIRST / ONLY / ONLY_IMM.
        imm: the 32-bit immediate, exactly for the *_IMM opcodes (sent big-endian).
        se: set the BTH SE (solicited event) bit; only on a message's last packet.

    Extension headers in IBTA order: RETH, then ImmDt. AckReq is set on every last
    packet (``REQUEST_LAST_OPCODES``). For the four plain WRITE opcodes this is exactly
    ``build_packet``'s frame.
    """
    if bth_opcode not in SEND_OPCODES and bth_opcode not in (Op.WRITE_FIRST, Op.WRITE_MIDDLE, Op.WRITE_LAST,
                                                                Op.WRITE_LAST_IMM, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM):
        raise ValueError(f"bth_opcode must be an RC SEND or RDMA WRITE opcode, got {bth_opcode!r}")
    if (bth_opcode in REQUEST_RETH_OPCODES) != (reth is not None):
        raise ValueError(f"opcode {bth_opcode:#04x}: RETH must be given exactly for WRITE FIRST/ONLY/ONLY_IMM")
    if (bth_opcode in REQUEST_IMM_OPCODES) != (imm is not None):
        raise ValueError(f"opcode {bth_opcode:#04x}: imm must be given exactly for the *_IMM opcodes")
    last = bth_opcode in REQUEST_LAST_OPCODES
    if se and not last:
        raise ValueError(f"opcode {bth_opcode:#04x}: the SE bit goes on a message's last packet only")
    ext = bytearray()
    if reth is not None:
        va, rkey, dma_len = reth
        if not (0 <= va < 1 << 64 and 0 <= rkey < 1 << 32 and 0 <= dma_len < 1 << 32):
            raise ValueError(f"RETH fields out of range: {reth!r}")
        e = bytearray(RETH_LEN)
        pack(RETH, e, 0, va=va, rkey=rkey, dma_len=dma_len)
        ext += e
    if imm is not None:
        if isinstance(imm, bool) or not isinstance(imm, int) or not 0 <= imm < 1 << 32:
            raise ValueError(f"imm must be a u32, got {imm!r}")
        ext += imm.to_bytes(IMMDT_LEN, "big")
    f = build_rc_frame(qp, port, bth_opcode, psn, bytes(ext), payload, ackreq=last)
    return _with_se(f) if se else f


def build_message_frames(qp, port, wqe_opcode, payload, psn_start, *, raddr=0, rkey=0, imm=None, se=False):
    """All frames of one message of a data WQE, in send order.

    Parameters:
        qp: QpContext (mtu, dmac, dip, remote_qpn, qpn); port: Port.
        wqe_opcode: RDMA_WRITE, RDMA_WRITE_IMM, SEND or SEND_IMM (``spec.formats.WqeOp``).
        payload: the whole message (bytes, shorter than 2^31).
        psn_start: PSN of the first packet; later packets take the next PSNs mod 2^24.
        raddr, rkey: the RETH's VA and R_Key (WRITE and WRITE_IMM).
        imm: the immediate (SEND_IMM and WRITE_IMM; required there, refused elsewhere).
        se: the WQE asked for a solicited event (ctrl SOLICITED): the last packet of a
            SEND, SEND_IMM or WRITE_IMM carries the BTH SE bit (a plain WRITE never).

    Returns a list of frame bytes; for RDMA_WRITE exactly ``build_write_frames``'.
    """
    payload = bytes(payload)
    if len(payload) >= 1 << 31:
        raise ValueError("message longer than 2^31 - 1 bytes")
    has_imm = wqe_opcode in (WqeOp.SEND_IMM, WqeOp.RDMA_WRITE_IMM)
    if has_imm != (imm is not None):
        raise ValueError(f"WQE opcode {wqe_opcode!r}: imm must be given exactly for SEND_IMM and RDMA_WRITE_IMM")
    se = bool(se) and wqe_opcode != WqeOp.RDMA_WRITE
    frames = []
    for i, (op, off, n) in enumerate(message_packets(wqe_opcode, len(payload), qp.mtu)):
        last = op in REQUEST_LAST_OPCODES
        frames.append(build_request_packet(
            qp, port, op, (psn_start + i) & PSN_MASK, payload[off:off + n],
            reth=(raddr, rkey, len(payload)) if op in REQUEST_RETH_OPCODES else None,
            imm=imm if op in REQUEST_IMM_OPCODES else None, se=se and last))
    return frames


def read_gather(read_memory, segments, offset=0, length=None):
    """Bytes ``[offset, offset + length)`` of a gather list's message.

    Parameters:
        read_memory: callable(addr, n) -> bytes.
        segments: ``[(addr, length, lkey)]`` (``Wqe.segments``): the message is their
            concatenation in order.
        offset, length: the part wanted (default: all from ``offset``).

    Reads only the segments that part touches (a retransmission reads its packet again).
    """
    total = sum(n for _, n, _ in segments)
    length = total - offset if length is None else length
    if offset < 0 or length < 0 or offset + length > total:
        raise ValueError(f"bytes [{offset}, {offset + length}) outside a gather list of {total} bytes")
    out = bytearray()
    pos = 0
    for addr, n, _ in segments:
        lo, hi = max(offset, pos), min(offset + length, pos + n)
        if lo < hi:
            data = bytes(read_memory(addr + lo - pos, hi - lo))
            if len(data) != hi - lo:
                raise ValueError(f"read_memory({addr + lo - pos:#x}, {hi - lo}) returned {len(data)} bytes")
            out += data
        pos += n
    return bytes(out)


# ---- WQEs --------------------------------------------------------------------------
@dataclass
class Wqe:
    """A decoded mlx5 send WQE.

    Fields:
        opcode, opmod, index (ctrl bits [23:8]), qpn, ds, fm_ce_se, signature, imm: control segment.
        raddr, rkey: remote address segment (WRITE and WRITE_IMM only, else 0).
        kind: "pointer" (data segments), "inline", "none" (a message of 0 bytes: WRITE
            with ds=2, SEND with ds=1) or None.
        segments: the pointer segments, ``((addr, length, lkey), ...)`` in order (a
            gather list); () otherwise.
        addr, lkey: the first pointer segment's fields (0 otherwise).
        length: message length in bytes (the sum of the pointer segments' byte_count, or
            the inline length).
        inline_data: inline bytes (b"" otherwise).
        error: None if the engine executes it, else a reason string (error CQE).
    """
    opcode: int
    opmod: int
    index: int
    qpn: int
    ds: int
    fm_ce_se: int
    signature: int = 0
    imm: int = 0
    raddr: int = 0
    rkey: int = 0
    kind: object = None
    addr: int = 0
    lkey: int = 0
    length: int = 0
    inline_data: bytes = b""
    error: object = None
    segments: tuple = ()

    @property
    def valid(self):
        """True when the engine executes the WQE (no error CQE)."""
        return self.error is None

    @property
    def cq_update(self):
        """True when the WQE requests a CQE (fm_ce_se & CQ_UPDATE)."""
        return bool(self.fm_ce_se & FM_CE_SE_CQ_UPDATE)

    @property
    def solicited(self):
        """True when the WQE asks for a solicited event (fm_ce_se & SOLICITED)."""
        return bool(self.fm_ce_se & FM_CE_SE_SOLICITED)

    @property
    def num_wqebbs(self):
        """WQEBBs the WQE occupies: ceil(ds / 4), at least 1."""
        return max(1, -(-self.ds // (WQEBB // DS_UNIT)))

    def payload(self, read_memory, offset=0, length=None):
        """Bytes ``[offset, offset + length)`` of the message (default all): inline
        bytes, or the gather list read with ``read_memory`` (``read_gather``)."""
        if self.kind == "pointer":
            return read_gather(read_memory, self.segments, offset, length)
        data = self.inline_data
        length = len(data) - offset if length is None else length
        return data[offset:offset + length]


_OP_NAMES = {WqeOp.RDMA_WRITE: "RDMA_WRITE", WqeOp.RDMA_WRITE_IMM: "RDMA_WRITE_IMM", WqeOp.SEND: "SEND",
             WqeOp.SEND_IMM: "SEND_IMM"}


def parse_wqe(wqe_bytes, two_sided=False, max_gather=None):
    """Decode one WQE from its bytes.

    Parameters:
        wqe_bytes: the WQE's bytes, already linearised if it wraps the ring
            (at least the 16-byte control segment, and at least ds*16 bytes for
            a data WQE with a plausible ds).
        two_sided: take SEND, SEND_IMM and RDMA_WRITE_IMM and gather lists of several
            pointer segments (see the module's decisions); without it only NOP, DUMP
            and RDMA_WRITE with at most one data segment are valid.
        max_gather: with ``two_sided``, the most pointer segments a data WQE may have
            (None: any); one with more is malformed (``spec.params.REQUESTER_GATHER``: what
            the engine's requester takes).

    Returns a ``Wqe``. Malformed WQEs (ds 0 or beyond MAX_WQEBBS WQEBBs for any
    opcode; an opcode the engine does not execute; a WRITE with ds < 2, inline data
    overrunning or not filling ds, an inline segment after a pointer segment) are
    returned with ``error`` set, not raised: the engine reports them with an error CQE.
    A NOP of any ds 1..63 is valid, and a DUMP of ds 2 with a pointer data segment
    (``kind`` "dump"). ValueError is raised only when the bytes given are too short to
    decode.
    """
    b = bytes(wqe_bytes)
    if len(b) < DS_UNIT:
        raise ValueError(f"WQE needs at least the {DS_UNIT}-byte control segment, got {len(b)} bytes")
    c = unpack(CTRL_SEG, b, 0)
    w = Wqe(opcode=c["opmod_idx_opcode"] & 0xFF, opmod=c["opmod_idx_opcode"] >> 24,
            index=(c["opmod_idx_opcode"] >> 8) & 0xFFFF, qpn=c["qpn_ds"] >> 8,
            ds=c["qpn_ds"] & 0x3F, fm_ce_se=c["fm_ce_se"], signature=c["signature"], imm=c["imm"])
    max_ds = MAX_WQEBBS * WQEBB // DS_UNIT
    if w.ds == 0:
        w.error = "ds=0: a WQE holds at least its control segment"
        return w
    if w.ds > max_ds:
        w.error = f"ds={w.ds} exceeds {MAX_WQEBBS} WQEBBs ({max_ds})"
        return w
    if w.opcode == WqeOp.NOP:
        return w
    if w.opcode == WqeOp.DUMP:
        # NVSHMEM's consistency point: ctrl + one data segment (a local read, no packet)
        if w.ds != 2:
            w.error = f"DUMP with ds={w.ds} (ctrl + one data segment is ds=2)"
            return w
        if len(b) < 2 * DS_UNIT:
            raise ValueError(f"WQE with ds=2 needs {2 * DS_UNIT} bytes, got {len(b)}")
        d = unpack(DATA_SEG, b, DS_UNIT)
        if d["byte_count"] & INLINE_FLAG:
            w.error = "DUMP with an inline segment (it reads local memory through a pointer)"
            return w
        w.kind, w.length, w.lkey, w.addr = "dump", d["byte_count"], d["lkey"], d["addr"]
        return w
    if w.opcode not in (DATA_WQE_OPS if two_sided else (WqeOp.RDMA_WRITE,)):
        w.error = f"unsupported opcode {w.opcode:#04x}"
        return w
    name = _OP_NAMES[w.opcode]
    first = 2 if w.opcode in _RADDR_WQE_OPS else 1          # data segments start here (in DS units)
    if w.ds < first:
        w.error = f"{name} with ds={w.ds} < 2 (needs ctrl + raddr segments)"
        return w
    if len(b) < w.ds * DS_UNIT:
        raise ValueError(f"WQE with ds={w.ds} needs {w.ds * DS_UNIT} bytes, got {len(b)}")
    if first == 2:
        r = unpack(RADDR_SEG, b, DS_UNIT)
        w.raddr, w.rkey = r["raddr"], r["rkey"]
    if w.ds == first:
        w.kind = "none"
        return w
    seg = first * DS_UNIT
    bc_off, bc_w = get_field(DATA_SEG, "byte_count")
    bc = int.from_bytes(b[seg + bc_off:seg + bc_off + bc_w], "big")
    if bc & INLINE_FLAG:
        n = bc & ~INLINE_FLAG & 0xFFFFFFFF
        units = -(-(bc_w + n) // DS_UNIT)
        w.kind, w.length = "inline", n
        if first + units > w.ds:
            w.error = f"inline length {n} needs ds={first + units}, WQE has ds={w.ds}"
        elif first + units < w.ds:
            w.error = f"more than one data segment (inline needs ds={first + units}, WQE has ds={w.ds})"
        else:
            w.inline_data = b[seg + bc_w:seg + bc_w + n]
        return w
    segs = []
    for k in range(first, w.ds):
        d = unpack(DATA_SEG, b, k * DS_UNIT)
        if d["byte_count"] & INLINE_FLAG:
            w.error = f"an inline segment after a pointer segment (segment {k - first})"
            return w
        segs.append((d["addr"], d["byte_count"], d["lkey"]))
    w.kind, w.segments = "pointer", tuple(segs)
    w.addr, w.length, w.lkey = segs[0][0], sum(n for _, n, _ in segs), segs[0][2]
    if not two_sided and w.ds != 3:
        w.error = f"more than one data segment (ds={w.ds})"
    elif max_gather is not None and len(segs) > max_gather:
        w.error = f"{len(segs)} data segments, more than the {max_gather} taken"
    elif w.length >= 1 << 31:
        w.error = f"gather list of {w.length} bytes (a message is shorter than 2^31)"
    return w


def build_ctrl(opcode, index, qpn, ds, fm_ce_se=FM_CE_SE_CQ_UPDATE, opmod=0, imm=0, signature=0):
    """16-byte mlx5 control segment.

    Parameters:
        opcode: WQE opcode (``WqeOp``); index: WQE index (16 bits); qpn: 24 bits;
        ds: size in 16-byte units (6 bits); fm_ce_se, opmod, imm, signature: raw fields.
    """
    if not 0 <= index <= 0xFFFF:
        raise ValueError(f"WQE index must fit in 16 bits, got {index}")
    if not 0 <= qpn <= PSN_MASK:
        raise ValueError(f"qpn must fit in 24 bits, got {qpn:#x}")
    if not 0 <= ds <= 0x3F:
        raise ValueError(f"ds must fit in 6 bits, got {ds}")
    b = bytearray(DS_UNIT)
    pack(CTRL_SEG, b, 0, opmod_idx_opcode=(opmod << 24) | (index << 8) | opcode,
         qpn_ds=(qpn << 8) | ds, signature=signature, fm_ce_se=fm_ce_se, imm=imm)
    return bytes(b)


def _pad_wqebb(b):
    return bytes(b) + b"\x00" * (-len(b) % WQEBB)


def _data_segments(segments=None, inline=None):
    """The data part of a WQE: one inline segment (padded to 16 bytes) or pointer
    segments, ``segments`` being ``(addr, length)`` or ``(addr, length, lkey)`` each."""
    if inline is not None and segments is not None:
        raise ValueError("give segments= (pointer segments) or inline=, not both")
    if inline is not None:
        inline = bytes(inline)
        if len(inline) >= INLINE_FLAG:
            raise ValueError("inline data too long")
        seg = (len(inline) | INLINE_FLAG).to_bytes(4, "big") + inline
        return seg + b"\x00" * (-len(seg) % DS_UNIT)
    out = bytearray()
    for i, s in enumerate(segments or ()):
        if not (isinstance(s, (tuple, list)) and len(s) in (2, 3)):
            raise ValueError(f"segment {i} must be (addr, length) or (addr, length, lkey), got {s!r}")
        addr, length, lkey = s[0], s[1], (s[2] if len(s) == 3 else 0)
        if not (0 <= addr < 1 << 64 and 0 <= length < INLINE_FLAG and 0 <= lkey < 1 << 32):
            raise ValueError(f"segment {i} fields out of range: {s!r}")
        d = bytearray(DS_UNIT)
        pack(DATA_SEG, d, 0, byte_count=length, lkey=lkey, addr=addr)
        out += d
    return bytes(out)


def build_data_wqe(opcode, index, qpn, *, raddr=0, rkey=0, segments=None, inline=None, imm=0, cq_update=True,
                   solicited=False, fm_ce_se=None):
    """Encode a data WQE of any of ``DATA_WQE_OPS`` (mlx5 forms, see the module's decisions).

    Parameters:
        opcode: RDMA_WRITE, RDMA_WRITE_IMM (ctrl + raddr + data), SEND, SEND_IMM (ctrl + data).
        index, qpn: control-segment fields.
        raddr, rkey: remote address segment (the WRITE forms only).
        segments: the gather list, ``(addr, length)`` or ``(addr, length, lkey)`` each (in
            order; none: a message of 0 bytes), or
        inline: the inline bytes.
        imm: ctrl bytes 12-15 as a big-endian u32 (the *_IMM opcodes carry it on the wire).
        cq_update, solicited: fm_ce_se CQ_UPDATE and SOLICITED (ignored if ``fm_ce_se`` is given).

    Returns the WQE bytes padded to whole WQEBBs (ds at most 63).
    """
    if opcode not in DATA_WQE_OPS:
        raise ValueError(f"opcode must be one of RDMA_WRITE, RDMA_WRITE_IMM, SEND, SEND_IMM, got {opcode!r}")
    if not 0 <= imm < 1 << 32:
        raise ValueError(f"imm must be a u32, got {imm!r}")
    fm = fm_ce_se if fm_ce_se is not None else \
        (FM_CE_SE_CQ_UPDATE if cq_update else 0) | (FM_CE_SE_SOLICITED if solicited else 0)
    body = b""
    if opcode in _RADDR_WQE_OPS:
        if not (0 <= raddr < 1 << 64 and 0 <= rkey < 1 << 32):
            raise ValueError(f"raddr / rkey out of range: {raddr!r}, {rkey!r}")
        r = bytearray(DS_UNIT)
        pack(RADDR_SEG, r, 0, raddr=raddr, rkey=rkey)
        body = bytes(r)
    elif raddr or rkey:
        raise ValueError("a SEND has no remote address segment: raddr / rkey must be 0")
    body += _data_segments(segments, inline)
    ds = 1 + len(body) // DS_UNIT
    if ds > MAX_WQEBBS * WQEBB // DS_UNIT:
        raise ValueError(f"WQE of ds={ds} exceeds {MAX_WQEBBS} WQEBBs")
    return _pad_wqebb(build_ctrl(opcode, index, qpn, ds, fm, imm=imm) + body)


def build_write_wqe(index, qpn, raddr, rkey, *, addr=None, lkey=0, length=None, inline=None,
                    cq_update=True, fm_ce_se=None, segments=None):
    """Encode an RDMA_WRITE WQE (ctrl + raddr + one pointer or inline segment, or a
    gather list of several pointer segments).

    Parameters:
        index, qpn: control-segment fields.
        raddr, rkey: remote address segment.
        addr, lkey, length: pointer data segment (give ``addr`` and ``length``), or
        inline: the inline bytes (then ``addr``/``length`` must be None), or
        segments: a gather list (``build_data_wqe``; needs ``two_sided`` to execute when
            it has more than one segment).
        cq_update: set CQ_UPDATE in fm_ce_se (ignored if ``fm_ce_se`` is given).

    Returns the WQE bytes padded to whole WQEBBs.
    """
    if segments is not None:
        if inline is not None or addr is not None:
            raise ValueError("give exactly one of addr=, inline= or segments=")
        return build_data_wqe(WqeOp.RDMA_WRITE, index, qpn, raddr=raddr, rkey=rkey, segments=segments,
                              cq_update=cq_update, fm_ce_se=fm_ce_se)
    if (inline is None) == (addr is None):
        raise ValueError("give exactly one of addr= (pointer segment) or inline=")
    if inline is None and length is None:
        raise ValueError("pointer segment needs length=")
    return build_data_wqe(WqeOp.RDMA_WRITE, index, qpn, raddr=raddr, rkey=rkey,
                          segments=None if inline is not None else [(addr, length, lkey)], inline=inline,
                          cq_update=cq_update, fm_ce_se=fm_ce_se)


def build_send_wqe(index, qpn, *, segments=None, inline=None, imm=None, cq_update=True, solicited=False,
                   fm_ce_se=None):
    """Encode a SEND (``imm`` None) or SEND_IMM WQE: ctrl + a gather list of pointer
    segments (``(addr, length)`` or ``(addr, length, lkey)``; none: 0 bytes) or one inline
    segment; no remote-address segment. See ``build_data_wqe``."""
    return build_data_wqe(WqeOp.SEND if imm is None else WqeOp.SEND_IMM, index, qpn, segments=segments,
                          inline=inline, imm=0 if imm is None else imm, cq_update=cq_update, solicited=solicited,
                          fm_ce_se=fm_ce_se)


def build_write_imm_wqe(index, qpn, raddr, rkey, imm, *, segments=None, inline=None, cq_update=True,
                        solicited=False, fm_ce_se=None):
    """Encode an RDMA_WRITE_IMM WQE: ctrl (imm in bytes 12-15) + raddr + a gather list or
    one inline segment. See ``build_data_wqe``."""
    return build_data_wqe(WqeOp.RDMA_WRITE_IMM, index, qpn, raddr=raddr, rkey=rkey, segments=segments,
                          inline=inline, imm=imm, cq_update=cq_update, solicited=solicited, fm_ce_se=fm_ce_se)


def build_nop_wqe(index, qpn, cq_update=True):
    """Encode a NOP WQE (ds=1, one WQEBB)."""
    return _pad_wqebb(build_ctrl(WqeOp.NOP, index, qpn, 1, FM_CE_SE_CQ_UPDATE if cq_update else 0))
