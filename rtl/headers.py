"""RoCEv2 header layouts for the gateware, built from the tables in ``spec.formats``.

Each header is a ``lib.data.StructLayout`` whose fields are byte arrays in wire
order, so a header's bits are the frame's bytes with byte 0 in bits [7:0] (the
AXI-Stream lane order). ``be()`` turns a number into its big-endian byte array.
"""
from amaranth.hdl import Cat, Const, Value, unsigned
from amaranth.lib import data

from spec import formats as F

__all__ = ["header_layout", "be", "EthHeader", "Ipv4Header", "UdpHeader", "BthHeader", "RethHeader",
           "RoceWriteHeader", "ipv4_checksum"]


def header_layout(table):
    """StructLayout of byte arrays from a ``(name, offset, width)`` table (gaps kept as padding)."""
    fields, pos = {}, 0
    for name, off, width in sorted(table, key=lambda f: f[1]):
        if off != pos:
            fields[f"_pad{pos}"] = unsigned(8 * (off - pos))
        fields[name] = data.ArrayLayout(unsigned(8), width)
        pos = off + width
    return data.StructLayout(fields)


def be(value, nbytes):
    """Big-endian byte array of ``value``: byte 0 (bits [7:0]) is the most significant."""
    if isinstance(value, int):
        value = Const(value, 8 * nbytes)
    value = Value.cast(value).as_unsigned()
    if len(value) < 8 * nbytes:
        value = Cat(value, Const(0, 8 * nbytes - len(value)))
    return Cat(*(value.word_select(nbytes - 1 - i, 8) for i in range(nbytes)))


EthHeader = header_layout(F.ETH)
Ipv4Header = header_layout(F.IPV4)
UdpHeader = header_layout(F.UDP)
BthHeader = header_layout(F.BTH)
RethHeader = header_layout(F.RETH)

# The headers of a WRITE FIRST/ONLY packet in frame order (70 bytes); MIDDLE and
# LAST packets use the first 54 bytes.
RoceWriteHeader = data.StructLayout({
    "eth": EthHeader, "ip": Ipv4Header, "udp": UdpHeader, "bth": BthHeader, "reth": RethHeader,
})
assert RoceWriteHeader.size == 8 * F.HDR_LEN_RETH


def ipv4_checksum(header_bytes):
    """Ones'-complement header checksum of a 20-byte IPv4 header (checksum field zero)."""
    words = [Cat(header_bytes.word_select(2 * i + 1, 8), header_bytes.word_select(2 * i, 8))
             for i in range(10)]
    total = sum(w.as_unsigned() for w in words)          # fits in 20 bits
    folded = total[:16] + total[16:]
    folded = (folded[:16] + folded[16:])[:16]
    return ~folded & 0xFFFF
