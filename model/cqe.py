"""Golden model of mlx5 CQE64s and of a completion queue buffer (SPEC section 4).

Contents:
    build_cqe      64 bytes of one CQE, requester or responder (all unlisted bytes zero)
    parse_cqe      the CQE64 fields of 64 bytes as a dict
    CqContext      plain dataclass of a CQ as created through the CSRs
    CqModel        producer count, slot, owner bit and buffer contents of a CQ
"""

from dataclasses import dataclass

from spec.formats import CQE64, CQE_SIZE, pack, unpack

__all__ = ["build_cqe", "parse_cqe", "CqContext", "CqModel", "CQE_FILL"]

CQE_FILL = 0xFF                    # fresh CQ buffers are memset to 0xFF (op INVALID)


def build_cqe(opcode, qpn, wqe_counter, byte_cnt=0, owner=0, syndrome=0, vendor_err_synd=0, wqe_opcode=0,
              user_index=0, imm=0, se=0):
    """Build a 64-byte CQE.

    Parameters:
        opcode: CQE opcode (``CqeOp``: REQ / REQ_ERR for the send queue, RESP_SEND,
            RESP_SEND_IMM, RESP_WR_IMM / RESP_ERR for the receive queue), 4 bits.
        qpn: local QP number (sop_drop_qpn low 24 bits).
        wqe_counter: WQE index being completed (16 bits).
        byte_cnt: message length (0 for NOP and error CQEs).
        owner: owner bit (op_own bit 0); format bits are 0.
        syndrome, vendor_err_synd: error fields (0 for REQ).
        wqe_opcode: the completed WQE's ctrl opcode (sop_drop_qpn [31:24]).
        user_index: the QP's user index (srqn_uidx [23:0]).
        imm: a responder CQE's immediate (@36, the ImmDt's 4 bytes as on the wire), u32.
        se: op_own bit 1 (a responder CQE of a message whose last packet had BTH SE).

    Returns 64 bytes; all other bytes (including signature @62) are zero.
    """
    if not 0 <= opcode <= 0xF:
        raise ValueError(f"CQE opcode must fit in 4 bits, got {opcode}")
    if not 0 <= qpn < 1 << 24:
        raise ValueError(f"qpn must fit in 24 bits, got {qpn:#x}")
    if not 0 <= wqe_counter <= 0xFFFF:
        raise ValueError(f"wqe_counter must fit in 16 bits, got {wqe_counter}")
    if owner not in (0, 1):
        raise ValueError(f"owner must be 0 or 1, got {owner}")
    if not 0 <= wqe_opcode <= 0xFF:
        raise ValueError(f"wqe_opcode must fit in 8 bits, got {wqe_opcode}")
    if not 0 <= user_index < 1 << 24:
        raise ValueError(f"user_index must fit in 24 bits, got {user_index:#x}")
    if not 0 <= imm < 1 << 32:
        raise ValueError(f"imm must be a u32, got {imm!r}")
    if se not in (0, 1, False, True):
        raise ValueError(f"se must be 0 or 1, got {se!r}")
    b = bytearray(CQE_SIZE)
    pack(CQE64, b, 0, srqn_uidx=user_index, imm=imm, byte_cnt=byte_cnt, vendor_err_synd=vendor_err_synd,
         syndrome=syndrome, sop_drop_qpn=wqe_opcode << 24 | qpn, wqe_counter=wqe_counter, signature=0,
         op_own=(opcode << 4) | (int(se) << 1) | owner)
    return bytes(b)


def parse_cqe(cqe):
    """Fields of a 64-byte CQE: the ``spec.formats.CQE64`` table plus opcode, owner, se,
    qpn, wqe_opcode and user_index."""
    if len(cqe) != CQE_SIZE:
        raise ValueError(f"CQE must be {CQE_SIZE} bytes, got {len(cqe)}")
    d = unpack(CQE64, cqe)
    d["opcode"] = d["op_own"] >> 4
    d["owner"] = d["op_own"] & 1
    d["se"] = (d["op_own"] >> 1) & 1
    d["qpn"] = d["sop_drop_qpn"] & 0xFFFFFF
    d["wqe_opcode"] = d["sop_drop_qpn"] >> 24
    d["user_index"] = d["srqn_uidx"] & 0xFFFFFF
    return d


@dataclass
class CqContext:
    """A completion queue as committed through CQ_* CSRs.

    Parameters:
        cqn: CQ number.
        log_depth: log2 of the number of CQEs (0..15).
        base: buffer base address (64-byte aligned).
        collapsed: every CQE goes to slot 0 (NVSHMEM style).
    """
    cqn: int
    log_depth: int
    base: int = 0
    collapsed: bool = False

    def __post_init__(self):
        if not 0 <= self.log_depth <= 15:
            raise ValueError(f"CQ log_depth must be 0..15, got {self.log_depth}")
        if self.base % CQE_SIZE:
            raise ValueError(f"CQ base must be {CQE_SIZE}-byte aligned, got {self.base:#x}")


@dataclass
class CqeRecord:
    """One CQE as written: producer count ``k``, ``slot``, buffer ``address``, bytes and fields
    (``imm``: a responder CQE's immediate, else 0)."""
    cqn: int
    k: int
    slot: int
    address: int
    owner: int
    opcode: int
    qpn: int
    wqe_counter: int
    byte_cnt: int
    syndrome: int
    cqe: bytes
    imm: int = 0


class CqModel:
    """Producer side of a CQ: predicts where each CQE lands and the buffer contents.

    Parameters:
        ctx: CqContext (log_depth, base, collapsed).
        fill: byte value the buffer is initialised with (fresh buffers are 0xFF).

    Attributes:
        k: producer count (CQEs written so far, starts at 0).
        records: list of CqeRecord in write order.
    """

    def __init__(self, ctx, fill=CQE_FILL):
        if not isinstance(ctx, CqContext):
            raise ValueError("CqModel needs a CqContext")
        self.ctx = ctx
        self.k = 0
        self.records = []
        self._buf = bytearray([fill]) * (CQE_SIZE * self.depth)

    @property
    def depth(self):
        """Number of CQE slots."""
        return 1 << self.ctx.log_depth

    def slot_of(self, k):
        """Slot written by the k-th CQE: k mod depth, or 0 for a collapsed CQ."""
        return 0 if self.ctx.collapsed else k & (self.depth - 1)

    def owner_of(self, k):
        """Owner bit of the k-th CQE: (k >> log_depth) & 1 (flips per wrap)."""
        return (k >> self.ctx.log_depth) & 1

    def address_of(self, k):
        """Memory address of the k-th CQE."""
        return self.ctx.base + self.slot_of(k) * CQE_SIZE

    def push(self, opcode, qpn, wqe_counter, byte_cnt=0, syndrome=0, vendor_err_synd=0, wqe_opcode=0, user_index=0,
             imm=0, se=0):
        """Write the next CQE (arguments as ``build_cqe`` without owner); returns its CqeRecord."""
        k = self.k
        owner = self.owner_of(k)
        cqe = build_cqe(opcode, qpn, wqe_counter, byte_cnt, owner, syndrome, vendor_err_synd, wqe_opcode, user_index,
                        imm, se)
        slot = self.slot_of(k)
        self._buf[slot * CQE_SIZE:(slot + 1) * CQE_SIZE] = cqe
        rec = CqeRecord(self.ctx.cqn, k, slot, self.address_of(k), owner, opcode, qpn,
                        wqe_counter, byte_cnt, syndrome, cqe, imm)
        self.records.append(rec)
        self.k += 1
        return rec

    def buffer(self):
        """Predicted CQ buffer contents (depth * 64 bytes) after the CQEs pushed so far."""
        return bytes(self._buf)
