"""Golden model of RDMA READ and atomics on the wire, and of the atomics' arithmetic.

The wire forms are IBTA's (RC): READ REQUEST with a RETH; READ RESPONSE FIRST / MIDDLE /
LAST / ONLY, one PSN each from the request's, an AETH on FIRST, LAST and ONLY; COMPARE_SWAP
and FETCH_ADD with an AtomicETH, answered by ATOMIC ACKNOWLEDGE (AETH + AtomicAckETH). The
masked and 4-byte atomics NVSHMEM and DeepEP post have no IBTA form: this engine carries
them with the manufacturer-specific opcodes ``Op.MASKED_COMPARE_SWAP`` /
``Op.MASKED_FETCH_ADD`` and a ``MASKED_ATOMIC_ETH`` (docs/interfaces.md, "Atomics on the
wire"), answered by the standard ATOMIC ACKNOWLEDGE; a standard peer NAKs them as invalid
requests.

Contents:
    fetch_add, compare_swap                 IBTA 8-byte atomics: (new value, original)
    masked_fetch_add, masked_compare_swap   mlx5's extended forms, 4 or 8 bytes
    build_read_request, build_read_responses
    build_atomic_request, build_masked_atomic_request, build_atomic_ack
"""

from spec.formats import (
    AETH, AETH_LEN, ATOMIC_ACK_ETH, ATOMIC_ACK_ETH_LEN, ATOMIC_ETH, ATOMIC_ETH_LEN, Aeth,
    MASKED_ATOMIC_ETH, MASKED_ATOMIC_ETH_LEN, MSN_MASK, Op, PSN_MASK, RETH, RETH_LEN, pack,
)
from model.frames import build_rc_frame, split_message

__all__ = ["fetch_add", "compare_swap", "masked_fetch_add", "masked_compare_swap", "build_read_request",
           "build_read_responses", "build_atomic_request", "build_masked_atomic_request", "build_atomic_ack",
           "READ_RESPONSE_OPS"]

_SIZES = {4: 2, 8: 3}                 # operand bytes -> log_size of the MaskedAtomicETH


def _word(value, nbytes, name):
    if nbytes not in _SIZES:
        raise ValueError(f"atomic operands are 4 or 8 bytes, not {nbytes!r}")
    if not 0 <= value < 1 << (8 * nbytes):
        raise ValueError(f"{name} must fit in {nbytes} bytes, got {value:#x}")
    return value


def fetch_add(orig, add):
    """IBTA FETCH_ADD on a u64: returns ``(new, orig)``."""
    _word(orig, 8, "orig"), _word(add, 8, "add")
    return (orig + add) & (1 << 64) - 1, orig


def compare_swap(orig, swap, compare):
    """IBTA COMPARE_SWAP on a u64: ``swap`` is stored when ``orig == compare``; returns
    ``(new, orig)``."""
    _word(orig, 8, "orig"), _word(swap, 8, "swap"), _word(compare, 8, "compare")
    return (swap if orig == compare else orig), orig


def masked_fetch_add(orig, add, boundary, nbytes=8):
    """mlx5 masked fetch-add: the word is split into fields, a set bit of ``boundary``
    marking the most significant bit of a field; each field adds on its own (a carry out
    of a boundary bit is lost). ``boundary`` 0: one plain add; all ones: bitwise XOR
    (NVSHMEM's xor). Returns ``(new, orig)``."""
    for name, v in (("orig", orig), ("add", add), ("boundary", boundary)):
        _word(v, nbytes, name)
    new, carry = 0, 0
    for i in range(8 * nbytes):
        s = (orig >> i & 1) + (add >> i & 1) + carry
        new |= (s & 1) << i
        carry = 0 if boundary >> i & 1 else s >> 1
    return new, orig


def masked_compare_swap(orig, swap, compare, swap_mask, compare_mask, nbytes=8):
    """mlx5 masked compare-swap: when ``orig`` equals ``compare`` in the bits of
    ``compare_mask``, the bits of ``swap_mask`` take ``swap``'s. ``compare_mask`` 0 always
    swaps (set, swap; and / or are built from the masks). Returns ``(new, orig)``."""
    for name, v in (("orig", orig), ("swap", swap), ("compare", compare), ("swap_mask", swap_mask),
                    ("compare_mask", compare_mask)):
        _word(v, nbytes, name)
    if (orig ^ compare) & compare_mask:
        return orig, orig
    return (orig & ~swap_mask | swap & swap_mask) & (1 << 8 * nbytes) - 1, orig


def _check_u(value, bits, name):
    if not 0 <= value < 1 << bits:
        raise ValueError(f"{name} must fit in {bits} bits, got {value!r}")


def build_read_request(qp, port, raddr, rkey, length, psn):
    """The READ REQUEST of a READ of ``length`` bytes at ``raddr`` / ``rkey`` (RETH; AckReq
    set, as a request that expects a response)."""
    _check_u(raddr, 64, "raddr"), _check_u(rkey, 32, "rkey"), _check_u(length, 31, "length")
    e = bytearray(RETH_LEN)
    pack(RETH, e, 0, va=raddr, rkey=rkey, dma_len=length)
    return build_rc_frame(qp, port, Op.READ_REQUEST, psn, bytes(e), ackreq=True)


READ_RESPONSE_OPS = {"FIRST": Op.READ_RESP_FIRST, "MIDDLE": Op.READ_RESP_MIDDLE, "LAST": Op.READ_RESP_LAST,
                     "ONLY": Op.READ_RESP_ONLY}


def build_read_responses(qp, port, data, psn, msn, mtu=None):
    """The responder's READ RESPONSE frames for a READ REQUEST of PSN ``psn``: ``data``
    split at the MTU (``qp.mtu`` unless given), one PSN each from ``psn``; FIRST, LAST and
    ONLY carry an AETH (ACK syndrome, ``msn``), MIDDLE none (IBTA 9.4.6). A READ of 0
    bytes is one ONLY without payload. ``qp`` is the responder's QP (its peer's address)."""
    _check_u(msn, 24, "msn")
    mtu = qp.mtu if mtu is None else mtu
    aeth = bytearray(AETH_LEN)
    pack(AETH, aeth, 0, syndrome=Aeth.ACK, msn=msn & MSN_MASK)
    frames = []
    for i, (op, off, n) in enumerate(split_message(len(data), mtu)):
        kind = {Op.WRITE_FIRST: "FIRST", Op.WRITE_MIDDLE: "MIDDLE", Op.WRITE_LAST: "LAST",
                Op.WRITE_ONLY: "ONLY"}[op]
        ext = b"" if kind == "MIDDLE" else bytes(aeth)
        frames.append(build_rc_frame(qp, port, READ_RESPONSE_OPS[kind], (psn + i) & PSN_MASK, ext,
                                     data[off:off + n]))
    return frames


def build_atomic_request(qp, port, opcode, raddr, rkey, swap_add, compare, psn, *, aligned=True):
    """An IBTA COMPARE_SWAP or FETCH_ADD (AtomicETH; ``compare`` is 0 for FETCH_ADD);
    ``raddr`` must be 8-byte aligned (unless ``aligned`` is False: a requester sends what
    the WQE says, the responder NAKs it)."""
    if opcode not in (Op.COMPARE_SWAP, Op.FETCH_ADD):
        raise ValueError(f"opcode must be COMPARE_SWAP or FETCH_ADD, got {opcode!r}")
    _check_u(raddr, 64, "raddr"), _check_u(rkey, 32, "rkey")
    if aligned and raddr % 8:
        raise ValueError(f"an IBTA atomic's address is 8-byte aligned, got {raddr:#x}")
    e = bytearray(ATOMIC_ETH_LEN)
    pack(ATOMIC_ETH, e, 0, va=raddr, rkey=rkey, swap_add=_word(swap_add, 8, "swap_add"),
         compare=_word(compare, 8, "compare"))
    return build_rc_frame(qp, port, opcode, psn, bytes(e), ackreq=True)


def build_masked_atomic_request(qp, port, opcode, raddr, rkey, operands, nbytes, psn, *, aligned=True):
    """This engine's masked atomic: ``Op.MASKED_COMPARE_SWAP`` with ``operands`` (swap,
    compare, swap_mask, compare_mask) or ``Op.MASKED_FETCH_ADD`` with (add,
    field_boundary); ``nbytes`` 4 or 8, ``raddr`` aligned to it."""
    want = {Op.MASKED_COMPARE_SWAP: 4, Op.MASKED_FETCH_ADD: 2}
    if opcode not in want:
        raise ValueError(f"opcode must be MASKED_COMPARE_SWAP or MASKED_FETCH_ADD, got {opcode!r}")
    if len(operands) != want[opcode]:
        raise ValueError(f"opcode {opcode:#x} takes {want[opcode]} operands, got {len(operands)}")
    _check_u(raddr, 64, "raddr"), _check_u(rkey, 32, "rkey")
    ops = [_word(v, nbytes, f"operand {i}") for i, v in enumerate(operands)] + [0] * (4 - len(operands))
    if aligned and raddr % nbytes:
        raise ValueError(f"a {nbytes}-byte atomic's address is {nbytes}-byte aligned, got {raddr:#x}")
    e = bytearray(MASKED_ATOMIC_ETH_LEN)
    pack(MASKED_ATOMIC_ETH, e, 0, va=raddr, rkey=rkey, log_size=_SIZES[nbytes], rsvd=0,
         op0=ops[0], op1=ops[1], op2=ops[2], op3=ops[3])
    return build_rc_frame(qp, port, opcode, psn, bytes(e), ackreq=True)


def build_atomic_ack(qp, port, psn, msn, orig):
    """ATOMIC ACKNOWLEDGE of the atomic of PSN ``psn``: AETH (ACK, ``msn``) and the
    original value (a 4-byte atomic's in the low half)."""
    _check_u(msn, 24, "msn"), _check_u(orig, 64, "orig")
    e = bytearray(AETH_LEN + ATOMIC_ACK_ETH_LEN)
    pack(AETH, e, 0, syndrome=Aeth.ACK, msn=msn)
    pack(ATOMIC_ACK_ETH, e, AETH_LEN, orig=orig)
    return build_rc_frame(qp, port, Op.ATOMIC_ACK, psn, bytes(e))


def parse_remote_wqe(wqe_bytes):
    """Decode an RDMA READ or atomic WQE as NVSHMEM and DeepEP post them (VERBS.md section
    1): a dict with ``kind`` "read" (raddr, rkey, length, addr, lkey) or "atomic" (op:
    the wire opcode, nbytes, raddr, rkey, operands, addr), or ``kind`` None and ``error``
    for another form of these opcodes. (``model.frames.parse_wqe`` does not take them: the
    engine does not execute them yet.)"""
    from spec.formats import ATOMIC_FORMS, ATOMIC_SEG, CTRL_SEG, DATA_SEG, DS_UNIT, INLINE_FLAG, RADDR_SEG, WqeOp, unpack
    b = bytes(wqe_bytes)
    c = unpack(CTRL_SEG, b, 0)
    opcode, opmod, ds = c["opmod_idx_opcode"] & 0xFF, c["opmod_idx_opcode"] >> 24, c["qpn_ds"] & 0x3F
    out = {"kind": None, "opcode": opcode}
    if len(b) < ds * DS_UNIT:
        raise ValueError(f"WQE with ds={ds} needs {ds * DS_UNIT} bytes, got {len(b)}")
    r = unpack(RADDR_SEG, b, DS_UNIT) if ds >= 2 else None
    if opcode == WqeOp.RDMA_READ:
        if ds != 3:
            return {**out, "error": f"RDMA_READ with ds={ds} (ctrl + raddr + data is 3)"}
        d = unpack(DATA_SEG, b, 2 * DS_UNIT)
        if d["byte_count"] & INLINE_FLAG:
            return {**out, "error": "RDMA_READ into an inline segment"}
        return {**out, "kind": "read", "raddr": r["raddr"], "rkey": r["rkey"], "length": d["byte_count"],
                "addr": d["addr"], "lkey": d["lkey"]}
    forms = ATOMIC_FORMS
    if (opcode, opmod) not in forms:
        return {**out, "error": f"opcode {opcode:#04x} with opmod {opmod:#04x}"}
    wire, nbytes, table, want_ds = forms[opcode, opmod]
    if ds != want_ds:
        return {**out, "error": f"atomic {opcode:#04x}/{opmod:#04x} with ds={ds} (needs {want_ds})"}
    a = unpack(table, b, 2 * DS_UNIT)
    d = unpack(DATA_SEG, b, (want_ds - 1) * DS_UNIT)
    if d["byte_count"] & INLINE_FLAG:
        return {**out, "error": "an atomic's data segment is inline"}
    if table is ATOMIC_SEG:
        operands = (a["swap_add"], a["compare"])
    elif wire == Op.MASKED_FETCH_ADD:
        operands = (a["add"], a["field_boundary"])
    else:
        operands = (a["swap"], a["compare"], a["swap_mask"], a["compare_mask"])
    return {**out, "kind": "atomic", "op": wire, "nbytes": nbytes, "raddr": r["raddr"], "rkey": r["rkey"],
            "operands": operands, "addr": d["addr"], "lkey": d["lkey"]}
