"""The descriptor of a received frame, from the receive header parser to the responder.

:class:`RxDrop` names why a frame is dropped at frame level: the frame-level reasons of
``spec.formats.DROP_REASONS``, ``RX_FRAME_DROPS`` (``model.parse.parse_frame`` says in which order it checks them). The
QP-level reasons (QP not ready, PSN, access, invalid request) need the QP's state and
are decided later by the responder. :func:`RxPacket` is one frame's decoded headers,
as plain integers (the big-endian wire fields converted once, in the parser).
"""
from amaranth.hdl import unsigned
from amaranth.lib import data, enum

from rtl.common.stream import Pair
from spec import formats as F

__all__ = ["AtomicOperands", "INLINE_MAX", "RxDrop", "RxPacket", "RxPacketPair", "RX_DROP_NAMES"]

INLINE_MAX = 4      # payload bytes a descriptor carries (``inline``): the header window's last 4


class RxDrop(enum.Enum, shape=4):
    """Frame-level drop reason (``NONE``: the frame passed every header check)."""
    NONE = 0
    BAD_LENGTH = 1          # shorter than its headers, IPv4/UDP length against the frame, PadCnt
    NOT_ROCE = 2            # not IPv4 with a 20-byte header, UDP to port 4791, unfragmented
    BAD_IP_CHECKSUM = 3
    BAD_ICRC = 4
    BAD_PKEY = 5            # P_Key other than 0xFFFF
    BAD_OPCODE = 6          # not one of the accepted RC opcodes
    BAD_ADDRESS = 7         # RoCEv2, but the destination MAC or IPv4 address is not the port's
    BAD_VERSION = 8         # BTH TVer not 0 (IBTA header validation)


# ``spec.formats.RX_FRAME_DROPS`` names of the reasons above, in its order (None: accepted).
RX_DROP_NAMES = {d: None if d == RxDrop.NONE else d.name.lower() for d in RxDrop}
assert list(RX_DROP_NAMES.items())[0] == (RxDrop.NONE, None) and RxDrop.NONE.value == 0
assert [(d.value, n) for d, n in list(RX_DROP_NAMES.items())[1:]] == list(enumerate(F.RX_FRAME_DROPS, 1))


# An atomic request's operands (``RxPacket.atomic``).
AtomicOperands = data.StructLayout({"log_size": unsigned(8), "ops": data.ArrayLayout(unsigned(64), 4)})


def RxPacket():
    """Layout of one received frame's descriptor.

    Only ``drop`` and ``frame_len`` are meaningful for every frame; the other members
    are meaningful when ``drop`` is ``NONE`` (for a dropped frame they are decoded from
    whatever header bytes arrived, and ``payload_len`` is 0). Extension headers the
    opcode does not carry read as zero.

    Members
    -------
    drop : RxDrop
        Why the frame is dropped, or ``NONE``.
    opcode : 8 bits
        BTH opcode.
    se : 1 bit
        BTH solicited event.
    padcnt : 2 bits
        BTH pad count (pad bytes between the payload and the ICRC).
    dqpn : 24 bits
        BTH destination QP.
    ackreq : 1 bit
        BTH AckReq.
    psn : 24 bits
        BTH PSN.
    has_reth, has_imm, has_aeth : 1 bit each
        The opcode carries a RETH (WRITE FIRST/ONLY/ONLY_IMM), an ImmDt (WRITE
        LAST_IMM/ONLY_IMM), an AETH (ACK, ATOMIC ACKNOWLEDGE).
    reth : ``va`` (64 bits), ``rkey`` (32), ``dma_len`` (32)
        RETH, zero without one.
    imm : 32 bits
        ImmDt, zero without one.
    aeth : ``syndrome`` (8 bits), ``msn`` (24)
        AETH, zero without one.
    orig : 64 bits
        An ATOMIC ACKNOWLEDGE's original value (AtomicAckETH), zero otherwise.
    has_atomic : 1 bit
        An atomic request (AtomicETH or MaskedAtomicETH): its VA and R_Key are in
        ``reth.va`` and ``reth.rkey`` (``reth.dma_len`` 0), its operands in ``atomic``.
    atomic : ``log_size`` (8 bits), ``ops`` (4 x 64)
        The operand size (3: 8 bytes; 2: 4 bytes, masked forms only) and operands in the
        MaskedAtomicETH's order (IBTA's: swap_add, compare); zero for other opcodes.
    payload_offset : 8 bits
        Byte offset of the payload from the frame's first byte (54 + extension headers).
    payload_len : 16 bits
        Payload bytes (pad bytes, ICRC and Ethernet padding excluded); 0 when dropped.
    frame_len : 16 bits
        Bytes the frame occupied in the beat stream (ICRC and any Ethernet padding
        included), saturated at 65535.
    smac : 48 bits
        Ethernet source MAC (the requester the responder answers).
    sip : 32 bits
        IPv4 source address.
    inline : 1 bit
        A WRITE with a RETH and no ImmDt whose payload, 1..4 bytes, lies in the 102
        header bytes the parser sees and within one 128-byte line of its address: the
        payload travels here, not through the segment stream.
    inline_data : 32 bits
        With ``inline``: the frame's bytes 70..73 (payload byte 0 in bits 7..0).
    """
    return data.StructLayout({
        "drop":           RxDrop,
        "opcode":         unsigned(8),
        "se":             unsigned(1),
        "padcnt":         unsigned(2),
        "dqpn":           unsigned(24),
        "ackreq":         unsigned(1),
        "psn":            unsigned(24),
        "has_reth":       unsigned(1),
        "has_imm":        unsigned(1),
        "has_aeth":       unsigned(1),
        "reth":           data.StructLayout({"va": unsigned(64), "rkey": unsigned(32), "dma_len": unsigned(32)}),
        "imm":            unsigned(32),
        "aeth":           data.StructLayout({"syndrome": unsigned(8), "msn": unsigned(24)}),
        "orig":           unsigned(64),
        "has_atomic":     unsigned(1),
        "atomic":         AtomicOperands,
        "payload_offset": unsigned(8),
        "payload_len":    unsigned(16),
        "frame_len":      unsigned(16),
        "smac":           unsigned(48),
        "sip":            unsigned(32),
        "inline":         unsigned(1),
        "inline_data":    unsigned(8 * INLINE_MAX),
    })


def RxPacketPair():
    """Layout of the descriptors of the frames that end in one beat (one or two).

    Members
    -------
    second : 1 bit
        ``p[1]`` is valid too (two frames ended in the beat); ``p[0]`` always is.
    p : 2 x :func:`RxPacket`
        The descriptors in frame order.
    """
    return Pair(RxPacket())
