"""Records that cross from one role to another (host, requester, responder, port).

A record that only one role uses lives with that role's blocks; one that two roles
exchange lives here, so no role imports another's internals.
"""
from amaranth.hdl import unsigned
from amaranth.lib import data

from spec import formats as F
from rtl.common.contexts import qp_bits, cq_bits

__all__ = ["AckRecord", "Response", "ReadVerdict", "Completion", "PacketNote", "DoorbellEvent", "RxKeepPair"]


# An ACK/NAK as one QP sees it (``qpn`` is the local QP): a received one, as ``RxDispatch``
# passes it to the requester side, or one the responder sends (``AckAddresser`` adds the
# requester's address).
AckRecord = data.StructLayout({
    "qpn": unsigned(24), "psn": unsigned(F.PSN_BITS), "syndrome": unsigned(8), "msn": unsigned(24),
})

# A received ACK/NAK as the receive dispatch hands it to the requester side: the
# ``AckRecord`` fields (``qpn`` all 24 bits of BTH.DestQP) and where it came from, which
# ``ResponseChecker`` holds against the QP's peer.
# ``atomic``: an ATOMIC ACKNOWLEDGE, ``orig`` its original value. ``read``: a READ RESPONSE,
# ``rop`` which (opcode - READ_RESP_FIRST: FIRST, MIDDLE, LAST, ONLY; a MIDDLE has no AETH,
# its syndrome reads as ACK), ``length`` its payload bytes (the frame also went to the
# responder, whose payload command for it waits for the checker's verdict).
Response = data.StructLayout({
    "qpn": unsigned(24), "psn": unsigned(F.PSN_BITS), "syndrome": unsigned(8), "msn": unsigned(24),
    "smac": unsigned(48), "sip": unsigned(32), "atomic": unsigned(1), "orig": unsigned(64),
    "read": unsigned(1), "rop": unsigned(2), "length": unsigned(13),
})

# What becomes of a received READ RESPONSE's payload, as the requester's ``ResponseChecker``
# tells the responder's ``ReadResponseJoin`` (one per READ RESPONSE, in frame order): written
# at ``addr`` or discarded; ``notify``: it is its READ's last response (a fence behind it
# tells the requester when the READ's bytes have landed).
ReadVerdict = data.StructLayout({"write": unsigned(1), "addr": unsigned(64), "notify": unsigned(1)})


def Completion(num_qps, num_cqs):
    """What the CQE writer needs, carried alongside a message's last beat."""
    return data.StructLayout({
        "qpn": unsigned(qp_bits(num_qps)), "cqn": unsigned(cq_bits(num_cqs)),
        "index": unsigned(16), "byte_cnt": unsigned(32), "error": unsigned(1),
        "psn": unsigned(24),      # PSN of the message's last packet (no packets: the PSN before)
        "uc": unsigned(1),        # UC QP: complete when sent, not when acknowledged
        "next_index": unsigned(16),  # WQE index after this WQE
        "syndrome": unsigned(8),     # error: the CQE syndrome
        "opcode": unsigned(8),       # the WQE's ctrl opcode (sop_drop_qpn [31:24])
    })


def PacketNote(num_qps):
    """A strobe per RC request packet built (its PSN), for the requester's ACK timer:
    the timer runs while a QP has packets no ACK has covered, signaled or not."""
    return data.StructLayout({"valid": unsigned(1), "qpn": unsigned(qp_bits(num_qps)), "psn": unsigned(24)})


def DoorbellEvent(num_qps):
    """A doorbell: every WQEBB of ``qpn`` before ``limit`` is posted. ``bf``: it came as a
    BlueFlame write and ``wqebb`` is the WQE itself (one WQEBB)."""
    return data.StructLayout({"qpn": unsigned(qp_bits(num_qps)), "limit": unsigned(16),
                              "bf": unsigned(1), "wqebb": unsigned(8 * F.WQEBB)})


RxKeepPair = data.StructLayout({"second": unsigned(1), "keep": unsigned(2)})
RxKeepPair.__doc__ = """Keep bits of the frames that end in one beat: ``keep[0]`` for the first,
``keep[1]`` for the second when ``second`` is 1 (the pairs of the header parser's descriptors)."""
