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
    sq_slot_address            address of WQEBB n of a send queue

All layouts, offsets and constants come from ``spec.formats`` / ``spec.params``.
"""

from dataclasses import dataclass
import ipaddress

from spec.formats import (
    BTH, CTRL_SEG, DATA_SEG, DEFAULT_PKEY, DS_UNIT, ETH, ETH_LEN, ETHERTYPE_IPV4,
    FM_CE_SE_CQ_UPDATE, HDR_LEN_NO_RETH, HDR_LEN_RETH, ICRC_LEN, INLINE_FLAG, IP_PROTO_UDP,
    IPV4, IPV4_FLAGS_DF, IPV4_LEN, IPV4_TTL, IPV4_VER_IHL, MAX_WQEBBS, OFF_BTH, OFF_EXT,
    OFF_IP, OFF_UDP, Op, PSN_MASK, QpState, RADDR_SEG, RETH, RETH_LEN, ROCE_SPORT_BASE, ROCEV2_UDP_PORT, UDP,
    WQEBB, WqeOp, get_field, mtu_code, pack, unpack,
)
from model.icrc import icrc, ipv4_checksum

__all__ = [
    "Port", "QpContext", "mac_bytes", "ip_bytes", "split_message", "build_packet", "build_rc_frame",
    "build_write_frames", "frame_len", "Wqe", "parse_wqe", "build_ctrl", "build_write_wqe",
    "build_nop_wqe", "sq_slot_address", "PSN_MASK", "BTH_ACKREQ",
]

# PSN_MASK: spec.formats' (re-exported)
BTH_ACKREQ = 0x80                  # BTH byte 8: AckReq bit
_RETH_OPCODES = (Op.WRITE_FIRST, Op.WRITE_ONLY)
_ACKREQ_OPCODES = (Op.WRITE_LAST, Op.WRITE_ONLY)
_WRITE_OPCODES = (Op.WRITE_FIRST, Op.WRITE_MIDDLE, Op.WRITE_LAST, Op.WRITE_ONLY)


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

    def __post_init__(self):
        for name in ("qpn", "remote_qpn", "start_psn", "user_index"):
            v = getattr(self, name)
            if not 0 <= v <= PSN_MASK:
                raise ValueError(f"QpContext.{name} must fit in 24 bits, got {v:#x}")
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
    """Captured frame length (no FCS, ICRC included) of a WRITE packet."""
    hdr = HDR_LEN_RETH if bth_opcode in _RETH_OPCODES else HDR_LEN_NO_RETH
    return hdr + payload_len + ICRC_LEN


def build_packet(qp, port, bth_opcode, psn, payload, reth=None):
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
    return build_rc_frame(qp, port, bth_opcode, psn, ext, payload, ackreq=bth_opcode in _ACKREQ_OPCODES)


def build_rc_frame(qp, port, bth_opcode, psn, ext=b"", payload=b"", *, ackreq=False):
    """One RoCEv2 frame of any BTH opcode (without FCS, with ICRC): Ethernet, IPv4, UDP,
    BTH (``ackreq`` sets its AckReq bit), the extension headers ``ext`` as given, the
    payload. ``qp`` gives dmac, dip, remote_qpn and qpn (UDP source port), ``port``
    smac and sip."""
    if not 0 <= bth_opcode <= 0xFF:
        raise ValueError(f"bth_opcode must be a byte, got {bth_opcode!r}")
    payload = bytes(payload)
    hdr = OFF_EXT + len(ext)
    total = hdr + len(payload) + ICRC_LEN
    f = bytearray(OFF_EXT)
    pack(ETH, f, 0, dmac=int.from_bytes(mac_bytes(qp.dmac), "big"),
         smac=int.from_bytes(mac_bytes(port.smac), "big"), ethertype=ETHERTYPE_IPV4)
    pack(IPV4, f, OFF_IP, ver_ihl=IPV4_VER_IHL, tos=0, total_len=total - ETH_LEN, ident=0,
         flags_frag=IPV4_FLAGS_DF, ttl=IPV4_TTL, proto=IP_PROTO_UDP, checksum=0,
         sip=int.from_bytes(ip_bytes(port.sip), "big"), dip=int.from_bytes(ip_bytes(qp.dip), "big"))
    pack(IPV4, f, OFF_IP, checksum=ipv4_checksum(f[OFF_IP:OFF_IP + IPV4_LEN]))
    pack(UDP, f, OFF_UDP, sport=ROCE_SPORT_BASE | (qp.qpn & 0x3FFF), dport=ROCEV2_UDP_PORT,
         length=total - OFF_UDP, checksum=0)
    pack(BTH, f, OFF_BTH, opcode=bth_opcode, flags=0, pkey=DEFAULT_PKEY, fecn_becn=0,
         dqpn=qp.remote_qpn, ackreq=BTH_ACKREQ if ackreq else 0, psn=psn & PSN_MASK)
    f += bytes(ext) + payload
    return bytes(f) + icrc(f)


def build_write_frames(qp, port, raddr, rkey, payload, psn_start):
    """All frames of one RDMA WRITE message, in send order.

    Parameters:
        qp: QpContext (uses mtu, dmac, dip, remote_qpn, qpn).
        port: Port.
        raddr: remote virtual address (RETH.va of FIRST/ONLY).
        rkey: remote key (RETH.rkey).
        payload: the whole message (bytes); its length is RETH.dma_len.
        psn_start: PSN of the first packet; later packets take the next PSNs mod 2^24.

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
        frames.append(build_packet(qp, port, op, (psn_start + i) & PSN_MASK, payload[off:off + n], reth))
    return frames


# ---- WQEs --------------------------------------------------------------------------
@dataclass
class Wqe:
    """A decoded mlx5 send WQE.

    Fields:
        opcode, opmod, index (ctrl bits [23:8]), qpn, ds, fm_ce_se, signature, imm: control segment.
        raddr, rkey: remote address segment (WRITE only, else 0).
        kind: "pointer" (data segment), "inline", "none" (WRITE with ds=2, no data) or None.
        addr, lkey: pointer segment fields (0 otherwise).
        length: message length in bytes (byte_count, or inline length).
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

    @property
    def valid(self):
        """True when the engine executes the WQE (no error CQE)."""
        return self.error is None

    @property
    def cq_update(self):
        """True when the WQE requests a CQE (fm_ce_se & CQ_UPDATE)."""
        return bool(self.fm_ce_se & FM_CE_SE_CQ_UPDATE)

    @property
    def num_wqebbs(self):
        """WQEBBs the WQE occupies: ceil(ds / 4), at least 1."""
        return max(1, -(-self.ds // (WQEBB // DS_UNIT)))


def parse_wqe(wqe_bytes):
    """Decode one WQE from its bytes.

    Parameters:
        wqe_bytes: the WQE's bytes, already linearised if it wraps the ring
            (at least the 16-byte control segment, and at least ds*16 bytes for
            an RDMA WRITE with a plausible ds).

    Returns a ``Wqe``. Malformed WQEs (ds 0 or beyond MAX_WQEBBS WQEBBs for any
    opcode; an opcode other than NOP/RDMA_WRITE; a WRITE with ds < 2, more than one
    data segment or inline data overrunning ds) are returned with ``error`` set, not
    raised: the engine reports them with an error CQE. A NOP of any ds 1..63 is valid,
    and a DUMP of ds 2 with a pointer data segment (``kind`` "dump"). ValueError is raised only when the bytes
    given are too short to decode.
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
    if w.opcode != WqeOp.RDMA_WRITE:
        w.error = f"unsupported opcode {w.opcode:#04x}"
        return w
    if w.ds < 2:
        w.error = f"RDMA_WRITE with ds={w.ds} < 2 (needs ctrl + raddr segments)"
        return w
    if len(b) < w.ds * DS_UNIT:
        raise ValueError(f"WQE with ds={w.ds} needs {w.ds * DS_UNIT} bytes, got {len(b)}")
    r = unpack(RADDR_SEG, b, DS_UNIT)
    w.raddr, w.rkey = r["raddr"], r["rkey"]
    if w.ds == 2:
        w.kind = "none"
        return w
    seg = 2 * DS_UNIT
    bc_off, bc_w = get_field(DATA_SEG, "byte_count")
    bc = int.from_bytes(b[seg + bc_off:seg + bc_off + bc_w], "big")
    if bc & INLINE_FLAG:
        n = bc & ~INLINE_FLAG & 0xFFFFFFFF
        units = -(-(bc_w + n) // DS_UNIT)
        w.kind, w.length = "inline", n
        if 2 + units > w.ds:
            w.error = f"inline length {n} needs ds={2 + units}, WQE has ds={w.ds}"
        elif 2 + units < w.ds:
            w.error = f"more than one data segment (inline needs ds={2 + units}, WQE has ds={w.ds})"
        else:
            w.inline_data = b[seg + bc_w:seg + bc_w + n]
        return w
    d = unpack(DATA_SEG, b, seg)
    w.kind, w.length, w.lkey, w.addr = "pointer", d["byte_count"], d["lkey"], d["addr"]
    if w.ds != 3:
        w.error = f"more than one data segment (ds={w.ds})"
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


def build_write_wqe(index, qpn, raddr, rkey, *, addr=None, lkey=0, length=None, inline=None,
                    cq_update=True, fm_ce_se=None):
    """Encode an RDMA_WRITE WQE (ctrl + raddr + one pointer or inline segment).

    Parameters:
        index, qpn: control-segment fields.
        raddr, rkey: remote address segment.
        addr, lkey, length: pointer data segment (give ``addr`` and ``length``), or
        inline: the inline bytes (then ``addr``/``length`` must be None).
        cq_update: set CQ_UPDATE in fm_ce_se (ignored if ``fm_ce_se`` is given).

    Returns the WQE bytes padded to whole WQEBBs.
    """
    if (inline is None) == (addr is None):
        raise ValueError("give exactly one of addr= (pointer segment) or inline=")
    fm = fm_ce_se if fm_ce_se is not None else (FM_CE_SE_CQ_UPDATE if cq_update else 0)
    if inline is not None:
        inline = bytes(inline)
        seg = (len(inline) | INLINE_FLAG).to_bytes(4, "big") + inline
        seg += b"\x00" * (-len(seg) % DS_UNIT)
    else:
        if length is None:
            raise ValueError("pointer segment needs length=")
        s = bytearray(DS_UNIT)
        pack(DATA_SEG, s, 0, byte_count=length, lkey=lkey, addr=addr)
        seg = bytes(s)
    ds = 2 + len(seg) // DS_UNIT
    r = bytearray(DS_UNIT)
    pack(RADDR_SEG, r, 0, raddr=raddr, rkey=rkey)
    return _pad_wqebb(build_ctrl(WqeOp.RDMA_WRITE, index, qpn, ds, fm) + bytes(r) + seg)


def build_nop_wqe(index, qpn, cq_update=True):
    """Encode a NOP WQE (ds=1, one WQEBB)."""
    return _pad_wqebb(build_ctrl(WqeOp.NOP, index, qpn, 1, FM_CE_SE_CQ_UPDATE if cq_update else 0))
