"""Independent RoCEv2 frame checker built on scapy (not on model/).

    check_frame(frame) -> dict     parse with scapy, verify checksums/ICRC/lengths
    diff_frames(actual, expected)  readable description of the first difference
    diff_cqe(actual, expected)     same for 64-byte CQEs
    field_at(offset, frame)        name of the header field a frame offset falls in

The ICRC is recomputed by ``scapy.contrib.roce.BTH.compute_icrc`` and the IPv4
checksum by scapy's own IP build, so a bug in ``model.icrc`` cannot hide a bug
in the RTL. scapy has no RETH layer; a minimal one is defined here and bound
after BTH for the RC RDMA WRITE FIRST / ONLY opcodes.
"""

from scapy.compat import raw
from scapy.contrib.roce import BTH
from scapy.fields import IntField, XIntField, XLongField
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, bind_layers

from spec.formats import (
    BTH as BTH_TABLE, CQE64, CQE_SIZE, ETH, ETH_LEN, ETHERTYPE_IPV4, ICRC_LEN, IP_PROTO_UDP,
    IPV4, IPV4_LEN, OFF_BTH, OFF_EXT, OFF_IP, OFF_UDP, Op, RETH as RETH_TABLE, RETH_LEN,
    ROCEV2_UDP_PORT, UDP as UDP_TABLE, UDP_LEN, BTH_LEN,
)

__all__ = ["RETH", "check_frame", "diff_frames", "diff_cqe", "field_at"]


class RETH(Packet):
    """RDMA Extended Transport Header (16 bytes): VA, R_Key, DMA length."""
    name = "RETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), IntField("dlen", 0)]


_RETH_OPCODES = (Op.WRITE_FIRST, Op.WRITE_ONLY)
for _op in _RETH_OPCODES:
    bind_layers(BTH, RETH, opcode=_op)
bind_layers(UDP, BTH, dport=ROCEV2_UDP_PORT)


def _fail(msg):
    raise AssertionError(f"bad RoCEv2 frame: {msg}")


def check_frame(frame):
    """Parse and verify one captured RoCEv2 frame (no FCS, ICRC included).

    Parameters:
        frame: the frame bytes.

    Checks: Ethernet type IPv4; IPv4 version/IHL 4/5, protocol UDP, total
    length = frame length - 14, header checksum (recomputed by scapy); UDP dport
    4791, UDP length = frame length - 34; a BTH follows; a RETH for WRITE
    FIRST/ONLY; ICRC (recomputed by scapy.contrib.roce). Raises AssertionError
    describing the first problem.

    Returns a dict: dmac, smac (str), sip, dip (str), ip_len, ttl, tos, ident,
    flags_frag, sport, dport, udp_len, udp_chksum, opcode, solicited, migreq,
    padcount, tver, pkey, fecn, becn, dqpn, ackreq (0/1), psn, va, rkey,
    dma_len (None without RETH), payload (bytes, the pad removed: PadCnt zero bytes,
    checked), icrc (the 4 bytes).
    """
    frame = bytes(frame)
    n = len(frame)
    min_len = OFF_BTH + BTH_LEN + ICRC_LEN
    if n < min_len:
        _fail(f"{n} bytes, shorter than Ethernet+IPv4+UDP+BTH+ICRC ({min_len})")
    pkt = Ether(frame)
    if pkt.type != ETHERTYPE_IPV4 or IP not in pkt:
        _fail(f"ethertype {pkt.type:#06x}, expected IPv4 {ETHERTYPE_IPV4:#06x}")
    ip = pkt[IP]
    if ip.version != 4 or ip.ihl != IPV4_LEN // 4:
        _fail(f"IPv4 version/IHL {ip.version}/{ip.ihl}, expected 4/5")
    if ip.proto != IP_PROTO_UDP:
        _fail(f"IP protocol {ip.proto}, expected UDP ({IP_PROTO_UDP})")
    if ip.len != n - ETH_LEN:
        _fail(f"IPv4 total length {ip.len} != frame length - {ETH_LEN} = {n - ETH_LEN}")
    hdr = ip.copy()
    hdr.remove_payload()
    del hdr.chksum
    good = IP(raw(hdr)).chksum
    if ip.chksum != good:
        _fail(f"IPv4 header checksum {ip.chksum:#06x}, scapy computes {good:#06x}")
    if UDP not in pkt:
        _fail("no UDP header")
    udp = pkt[UDP]
    if udp.dport != ROCEV2_UDP_PORT:
        _fail(f"UDP dport {udp.dport}, expected {ROCEV2_UDP_PORT}")
    if udp.len != n - OFF_UDP:
        _fail(f"UDP length {udp.len} != frame length - {OFF_UDP} = {n - OFF_UDP}")
    if BTH not in pkt:
        _fail("no BTH after UDP")
    bth = pkt[BTH]
    has_reth = bth.opcode in _RETH_OPCODES
    if has_reth and n < OFF_EXT + RETH_LEN + ICRC_LEN:
        _fail(f"opcode {bth.opcode:#04x} needs a RETH but the frame has only {n} bytes")
    if has_reth and RETH not in pkt:
        _fail(f"opcode {bth.opcode:#04x} without a RETH")
    hdr_end = OFF_EXT + (RETH_LEN if has_reth else 0)
    pad = bth.padcount
    if hdr_end + pad > n - ICRC_LEN:
        _fail(f"PadCnt {pad} larger than the {n - ICRC_LEN - hdr_end} bytes behind the headers")
    if any(frame[n - ICRC_LEN - pad:n - ICRC_LEN]):
        _fail(f"pad bytes {frame[n - ICRC_LEN - pad:n - ICRC_LEN].hex()} are not zero")
    payload = frame[hdr_end:n - ICRC_LEN - pad]
    icrc_got = frame[n - ICRC_LEN:]
    # Recompute the ICRC with scapy: rebuild the dissected packet with icrc unset.
    rebuilt = pkt.copy()
    rebuilt[BTH].icrc = None
    rb = raw(rebuilt)
    if rb[:-ICRC_LEN] != frame[:-ICRC_LEN]:
        _fail("scapy rebuild of the headers differs from the frame (cannot verify ICRC)")
    icrc_want = rb[-ICRC_LEN:]
    if icrc_got != icrc_want:
        _fail(f"ICRC {icrc_got.hex()} (bytes on the wire), scapy computes {icrc_want.hex()}")
    out = dict(
        frame_len=n, dmac=pkt.dst, smac=pkt.src, sip=ip.src, dip=ip.dst, ip_len=ip.len, ttl=ip.ttl,
        tos=ip.tos, ident=ip.id, flags_frag=int.from_bytes(frame[OFF_IP + 6:OFF_IP + 8], "big"),
        sport=udp.sport, dport=udp.dport, udp_len=udp.len, udp_chksum=udp.chksum,
        opcode=bth.opcode, solicited=bth.solicited, migreq=bth.migreq, padcount=bth.padcount,
        tver=bth.version, pkey=bth.pkey, fecn=bth.fecn, becn=bth.becn, dqpn=bth.dqpn,
        ackreq=bth.ackreq, psn=bth.psn, va=None, rkey=None, dma_len=None,
        payload=payload, icrc=icrc_got,
    )
    if has_reth:
        r = pkt[RETH]
        out.update(va=r.va, rkey=r.rkey, dma_len=r.dlen)
    return out


def _has_reth(frame):
    return len(frame) > OFF_BTH and frame[OFF_BTH] in _RETH_OPCODES


def field_at(offset, frame):
    """Name of the field at byte ``offset`` of ``frame`` (e.g. "IPV4.checksum",
    "BTH.psn", "payload[12]", "ICRC[1]"), using the spec.formats tables."""
    n = len(frame)
    if offset >= n:
        return "past end"
    if offset >= n - ICRC_LEN and offset >= OFF_BTH + BTH_LEN:
        return f"ICRC[{offset - (n - ICRC_LEN)}]"
    layers = [("ETH", ETH, 0, ETH_LEN), ("IPV4", IPV4, OFF_IP, IPV4_LEN),
              ("UDP", UDP_TABLE, OFF_UDP, UDP_LEN), ("BTH", BTH_TABLE, OFF_BTH, BTH_LEN)]
    hdr_end = OFF_EXT
    if _has_reth(frame):
        layers.append(("RETH", RETH_TABLE, OFF_EXT, RETH_LEN))
        hdr_end += RETH_LEN
    for lname, table, base, size in layers:
        if base <= offset < base + size:
            for fname, off, width in table:
                if base + off <= offset < base + off + width:
                    return f"{lname}.{fname}"
            return f"{lname}+{offset - base}"
    return f"payload[{offset - hdr_end}]"


def diff_frames(actual, expected):
    """Describe how ``actual`` differs from ``expected`` ("" if equal).

    Names the first differing byte offset and the field it falls in (fields from
    the expected frame's layout), the field's bytes in both, the number of
    differing bytes and any length difference.
    """
    a, e = bytes(actual), bytes(expected)
    if a == e:
        return ""
    diffs = [i for i in range(min(len(a), len(e))) if a[i] != e[i]]
    parts = []
    if len(a) != len(e):
        parts.append(f"length {len(a)} != expected {len(e)}")
    if diffs:
        i = diffs[0]
        name = field_at(i, e)
        lo, hi = max(0, i - 4), i + 4
        parts.append(f"first difference at byte {i} ({name}): actual {a[i]:#04x} expected {e[i]:#04x}; "
                     f"bytes {lo}..{hi - 1}: actual {a[lo:hi].hex()} expected {e[lo:hi].hex()}; "
                     f"{len(diffs)} differing byte(s) in the common length")
        fields = []
        for j in diffs:
            f = field_at(j, e)
            if f not in fields:
                fields.append(f)
            if len(fields) == 8:
                break
        parts.append("fields differing: " + ", ".join(fields))
    elif len(a) != len(e):
        parts.append(f"one is a prefix of the other; extra bytes start at {min(len(a), len(e))}")
    return "; ".join(parts)


def diff_cqe(actual, expected):
    """Describe how a 64-byte CQE differs from the expected one ("" if equal)."""
    a, e = bytes(actual), bytes(expected)
    if len(a) != CQE_SIZE or len(e) != CQE_SIZE:
        return f"CQE lengths {len(a)} / {len(e)}, expected {CQE_SIZE}"
    out = []
    for i in range(CQE_SIZE):
        if a[i] != e[i]:
            name = next((n for n, off, w in CQE64 if off <= i < off + w), f"byte {i}")
            out.append(f"@{i} ({name}): actual {a[i]:#04x} expected {e[i]:#04x}")
    return "; ".join(out)
