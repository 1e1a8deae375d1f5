"""The message descriptor that flows from the WQE parser to the packet builder."""
from amaranth.hdl import Mux, unsigned
from amaranth.lib import data, enum

from rtl.common.contexts import QpConfig, qp_bits

__all__ = ["MessageKind", "Message", "GatherSegment", "GATHER_MORE", "first_segment_length"]

# Segments of a gather list a message carries beyond its first (``addr``): the requester's
# WQE parser takes up to spec.params.REQUESTER_GATHER pointer segments per data WQE
GATHER_MORE = 3

# One further segment of a gather list: its address and byte count (never 0: the parser
# drops empty segments; below 2^31, as the message)
GatherSegment = data.StructLayout({"addr": unsigned(64), "len": unsigned(31)})


def first_segment_length(msg):
    """Bytes of a message's first segment (from ``addr``): ``length`` for a message of one
    segment (``nseg`` 0, every message but a gather list's), else ``seg_len``."""
    return Mux(msg.nseg == 0, msg.length, msg.seg_len)


class MessageKind(enum.Enum, shape=3):
    WRITE = 0      # RDMA WRITE, WRITE with immediate or SEND (``send``, ``has_imm``): packets, then a CQE if signaled
    NOP = 1        # no packets, a CQE if signaled
    ERROR = 2      # malformed or unsupported WQE: no packets, an error CQE, QP to error
    DUMP = 3       # NVSHMEM's consistency point: a local read of its data segment, no packets, a CQE if signaled
    ATOMIC = 4     # an atomic request (its operands in the WQE's first beat, on ``inline``); the original
                   # value is written to ``addr`` when its ATOMIC ACK arrives, before the CQE
    READ_RESPONSE = 5  # the responder's answer to a READ REQUEST: ``length`` bytes read at ``addr``, sent
                   # as READ RESPONSE packets from ``psn`` with ``rkey`` as the AETH's MSN (no CQE)
    READ = 6       # an RDMA READ: one READ REQUEST (RETH) from ``psn``; its responses (one PSN each,
                   # ceil(length / MTU)) land at ``addr`` and complete it, with its CQE, at the last one


def Message(num_qps, num_cqs):
    return data.StructLayout({
        "qpn":      unsigned(qp_bits(num_qps)),
        "cfg":      QpConfig(num_cqs),
        "kind":     MessageKind,
        "signaled": unsigned(1),
        "index":    unsigned(16),     # WQE index = CQE wqe_counter
        "raddr":    unsigned(64),
        "rkey":     unsigned(32),
        "length":   unsigned(32),
        "inline":   unsigned(1),      # payload from the WQE itself (inline segment)
        "addr":     unsigned(64),     # payload address in GPU memory (data segment)
        "psn":      unsigned(24),     # PSN of the first packet
        "resume":   unsigned(1),      # a retransmission from inside the WQE: no FIRST packet
        "next_index": unsigned(16),   # WQE index after this WQE (the requester's restart point)
        "syndrome": unsigned(8),      # ERROR: the CQE syndrome (spec.formats.Syndrome)
        "opcode":   unsigned(8),      # the WQE's ctrl opcode (its CQE's sop_drop_qpn [31:24])
        "wire_op":  unsigned(8),      # ATOMIC: the BTH opcode (spec.formats.Op)
        "size8":    unsigned(1),      # ATOMIC: 8-byte operands (else 4)
        "send":     unsigned(1),      # WRITE kind: a SEND (SEND opcodes, no RETH; the WQE's ctrl + data)
        "has_imm":  unsigned(1),      # WRITE kind: the last packet carries an ImmDt (SEND_IMM, RDMA_WRITE_IMM)
        "imm":      unsigned(32),     # its immediate: ctrl bytes 12..15 as they are in memory (= wire order)
        "se":       unsigned(1),      # WRITE kind: solicited event (ctrl fm_ce_se SOLICITED): BTH SE on the
                                      # last packet of a SEND or a WRITE with immediate
        # WRITE kind from a gather list: the payload is the first segment (``seg_len`` bytes
        # from ``addr``) then ``nseg`` more (``segs``, in order), none of them empty; ``length``
        # is their total. ``nseg`` 0 (every other message, the responder's too): one segment,
        # ``length`` bytes from ``addr``. (Addresses and counts only: 318 bits of the
        # 512-deep message queue's width.)
        "nseg":     unsigned(2),
        "seg_len":  unsigned(31),
        "segs":     data.ArrayLayout(GatherSegment, GATHER_MORE),
    })


