"""RoCEv2 header layouts for the gateware, built from the tables in ``spec.formats``.

Each header is a ``lib.data.StructLayout`` whose fields are byte arrays in wire
order, so a header's bits are the frame's bytes with byte 0 in bits [7:0] (the
AXI-Stream lane order). ``be()`` turns a number into its big-endian byte array,
``from_be()`` reads the number a big-endian byte field holds.
"""
from amaranth.hdl import Cat, Const, Signal, Value, unsigned
from amaranth.lib import data

from spec import formats as F

__all__ = ["header_layout", "be", "from_be", "EthHeader", "Ipv4Header", "UdpHeader", "BthHeader", "RethHeader",
           "AethHeader", "RoceWriteHeader", "RoceAckHeader", "ipv4_checksum", "drive_roce_headers"]


def header_layout(table):
    """StructLayout of byte arrays from a ``(name, offset, width)`` table (gaps kept as padding)."""
    fields, pos = {}, 0
    for name, off, width in sorted(table, key=lambda f: f[1]):
        if off != pos:
            fields[f"_pad{pos}"] = unsigned(8 * (off - pos))
        fields[name] = data.ArrayLayout(unsigned(8), width)
        pos = off + width
    return data.StructLayout(fields)


def from_be(field, offset=0, nbytes=None):
    """The number held big-endian in bytes ``offset .. offset + nbytes - 1`` of ``field``.

    ``field`` is a byte-ordered value (byte 0 in bits [7:0], the wire's first byte, the
    most significant of the number); ``nbytes`` defaults to the bytes from ``offset`` to
    the end of ``field``, and ``(offset, nbytes)`` is what ``spec.formats.get_field``
    gives. The byte reversal is its own inverse: see :func:`be` for the other way.
    """
    v = Value.cast(field)
    if nbytes is None:
        nbytes = len(v) // 8 - offset
    return Cat(*(v.word_select(offset + nbytes - 1 - i, 8) for i in range(nbytes)))


def be(value, nbytes):
    """Big-endian byte array of ``value``: byte 0 (bits [7:0]) is the most significant.

    Unlike :func:`from_be`, ``value`` is a number: an ``int`` or any value, taken as
    unsigned, zero-extended (or cut) to ``nbytes`` bytes.
    """
    if isinstance(value, int):
        value = Const(value, 8 * nbytes)
    value = Value.cast(value).as_unsigned()
    if len(value) < 8 * nbytes:
        value = Cat(value, Const(0, 8 * nbytes - len(value)))
    return from_be(value, 0, nbytes)


EthHeader = header_layout(F.ETH)
Ipv4Header = header_layout(F.IPV4)
UdpHeader = header_layout(F.UDP)
BthHeader = header_layout(F.BTH)
RethHeader = header_layout(F.RETH)
AethHeader = header_layout(F.AETH)

# The headers of a WRITE FIRST/ONLY packet in frame order (70 bytes); MIDDLE and
# LAST packets use the first 54 bytes.
RoceWriteHeader = data.StructLayout({
    "eth": EthHeader, "ip": Ipv4Header, "udp": UdpHeader, "bth": BthHeader, "reth": RethHeader,
})
assert RoceWriteHeader.size == 8 * F.HDR_LEN_RETH

# The headers of an ACK/NAK (opcode ACKNOWLEDGE) in frame order (58 bytes; 62 with the ICRC).
RoceAckHeader = data.StructLayout({
    "eth": EthHeader, "ip": Ipv4Header, "udp": UdpHeader, "bth": BthHeader, "aeth": AethHeader,
})
assert RoceAckHeader.size == 8 * (F.OFF_EXT + F.AETH_LEN)


def ipv4_checksum(header_bytes):
    """Ones'-complement header checksum of a 20-byte IPv4 header (checksum field zero)."""
    words = [Cat(header_bytes.word_select(2 * i + 1, 8), header_bytes.word_select(2 * i, 8))
             for i in range(10)]
    total = sum(w.as_unsigned() for w in words)          # fits in 20 bits
    folded = total[:16] + total[16:]
    folded = (folded[:16] + folded[16:])[:16]
    return ~folded & 0xFFFF


def drive_roce_headers(m, hdr, *, dmac, smac, sip, dip, flen, src_qpn, opcode, dqpn, ackreq, psn, flags=0):
    """Drive the Ethernet/IPv4/UDP/BTH headers of a RoCEv2 frame (``m.d.comb`` statements).

    The one header rule of the transmit side (the golden model's is
    ``model.frames.build_packet``): IPv4 with DF, TTL 64, ident 0 and its header
    checksum, UDP to 4791 with checksum 0 and source port ``ROCE_SPORT_BASE |
    (src_qpn & 0x3FFF)``, BTH with P_Key 0xFFFF and FECN/BECN 0.

    Parameters
    ----------
    m : Module
    hdr : View with the fields ``eth``, ``ip``, ``udp``, ``bth`` (e.g. of ``RoceWriteHeader``
        or ``RoceAckHeader``); the caller drives the rest (RETH, AETH).
    dmac, smac, sip, dip : addresses as numbers (48 and 32 bits).
    flen : frame length in bytes, ICRC included, FCS not (IPv4 total length and UDP length).
    src_qpn : local QP number (UDP source-port entropy).
    opcode, dqpn, psn : BTH fields.
    ackreq : BTH byte 8 (0x80: AckReq).
    flags : BTH byte 1 (SE, MigReq, PadCnt << ``F.BTH_PADCNT_SHIFT``, TVer 0); 0 for frames
        without payload.
    """
    ip = Signal.like(hdr.ip)     # the IP header with a zero checksum field
    m.d.comb += [
        hdr.eth.dmac.eq(be(dmac, 6)), hdr.eth.smac.eq(be(smac, 6)),
        hdr.eth.ethertype.eq(be(F.ETHERTYPE_IPV4, 2)),
        ip.ver_ihl.eq(be(F.IPV4_VER_IHL, 1)), ip.tos.eq(0), ip.total_len.eq(be(flen - F.ETH_LEN, 2)),
        ip.ident.eq(0), ip.flags_frag.eq(be(F.IPV4_FLAGS_DF, 2)), ip.ttl.eq(be(F.IPV4_TTL, 1)),
        ip.proto.eq(be(F.IP_PROTO_UDP, 1)), ip.sip.eq(be(sip, 4)), ip.dip.eq(be(dip, 4)),
        hdr.udp.sport.eq(be(F.ROCE_SPORT_BASE | (src_qpn & 0x3FFF), 2)),
        hdr.udp.dport.eq(be(F.ROCEV2_UDP_PORT, 2)), hdr.udp.length.eq(be(flen - F.OFF_UDP, 2)),
        hdr.udp.checksum.eq(0),
        hdr.bth.opcode.eq(opcode), hdr.bth.flags.eq(flags), hdr.bth.pkey.eq(be(F.DEFAULT_PKEY, 2)),
        hdr.bth.fecn_becn.eq(0), hdr.bth.dqpn.eq(be(dqpn, 3)),
        hdr.bth.ackreq.eq(ackreq), hdr.bth.psn.eq(be(psn, 3)),
    ]
    m.d.comb += [hdr.ip.eq(ip), hdr.ip.checksum.eq(be(ipv4_checksum(ip.as_value()), 2))]
