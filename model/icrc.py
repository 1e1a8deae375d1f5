"""RoCEv2 invariant CRC and IPv4 header checksum (SPEC section 5).

Pure functions over bytes; offsets and the masked-field list come from
``spec.formats`` (``OFF_IP``, ``IPV4_LEN``, ``ICRC_MASKED``).
"""

import struct
import zlib

from spec.formats import ICRC_LEN, ICRC_MASKED, IPV4, IPV4_LEN, OFF_BTH, BTH_LEN, OFF_IP, get_field

__all__ = ["ipv4_checksum", "icrc", "icrc_value", "append_icrc"]


def ipv4_checksum(header20):
    """Internet checksum of a 20-byte IPv4 header.

    Parameters:
        header20: the 20 header bytes (bytes-like). The checksum field
            (bytes 10-11) is ignored, i.e. treated as zero, so the result is the
            value to store there; a received header is valid when its stored
            checksum equals ``ipv4_checksum(header)``.

    Returns the 16-bit checksum as an int.
    """
    h = bytes(header20)
    if len(h) != IPV4_LEN:
        raise ValueError(f"IPv4 header must be {IPV4_LEN} bytes (IHL 5), got {len(h)}")
    off, width = get_field(IPV4, "checksum")
    h = h[:off] + b"\x00" * width + h[off + width:]
    s = sum(struct.unpack(f"!{IPV4_LEN // 2}H", h))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def icrc_value(frame_without_icrc):
    """ICRC of a RoCEv2 frame as an int (the CRC-32 before little-endian packing).

    Parameters:
        frame_without_icrc: Ethernet frame from the destination MAC through the
            end of the payload (no ICRC, no FCS); IPv4 with a 20-byte header.

    The CRC (zlib CRC-32) runs over 8 bytes of 0xFF followed by the frame from
    the IP header on, with the fields of ``spec.formats.ICRC_MASKED`` (IPv4 TOS,
    TTL, header checksum, UDP checksum, BTH byte 4) replaced by all ones.
    """
    f = bytearray(frame_without_icrc)
    if len(f) < OFF_BTH + BTH_LEN:
        raise ValueError(f"frame of {len(f)} bytes is shorter than Ethernet+IPv4+UDP+BTH "
                         f"({OFF_BTH + BTH_LEN} bytes)")
    for off, width in ICRC_MASKED:
        f[off:off + width] = b"\xff" * width
    return zlib.crc32(b"\xff" * 8 + bytes(f[OFF_IP:])) & 0xFFFFFFFF


def icrc(frame_without_icrc):
    """The 4 ICRC bytes to append to ``frame_without_icrc`` (CRC-32, little-endian).

    Parameters:
        frame_without_icrc: see ``icrc_value``.

    Returns ``struct.pack('<I', icrc_value(frame))``.
    """
    out = struct.pack("<I", icrc_value(frame_without_icrc))
    assert len(out) == ICRC_LEN
    return out


def append_icrc(frame_without_icrc):
    """``frame_without_icrc + icrc(frame_without_icrc)`` as bytes."""
    f = bytes(frame_without_icrc)
    return f + icrc(f)
