"""Wire and memory formats (see ../shared/SPEC.md sections 2-5).

Every header is a table of ``(name, byte_offset, byte_width)``; all fields are
big-endian as on the wire or in mlx5 memory. The RTL builds its
``lib.data`` layouts from these tables, the golden model packs bytes from them
and the testbenches unpack with them, so one table fixes all three.
"""

# ---- Ethernet / IPv4 / UDP / RoCEv2 -------------------------------------------
ETH = (("dmac", 0, 6), ("smac", 6, 6), ("ethertype", 12, 2))
IPV4 = (("ver_ihl", 0, 1), ("tos", 1, 1), ("total_len", 2, 2), ("ident", 4, 2),
        ("flags_frag", 6, 2), ("ttl", 8, 1), ("proto", 9, 1), ("checksum", 10, 2),
        ("sip", 12, 4), ("dip", 16, 4))
UDP = (("sport", 0, 2), ("dport", 2, 2), ("length", 4, 2), ("checksum", 6, 2))
BTH = (("opcode", 0, 1), ("flags", 1, 1), ("pkey", 2, 2), ("fecn_becn", 4, 1),
       ("dqpn", 5, 3), ("ackreq", 8, 1), ("psn", 9, 3))
RETH = (("va", 0, 8), ("rkey", 8, 4), ("dma_len", 12, 4))
AETH = (("syndrome", 0, 1), ("msn", 1, 3))
# IBTA AtomicETH (COMPARE_SWAP, FETCH_ADD) and AtomicAckETH (ATOMIC ACKNOWLEDGE)
ATOMIC_ETH = (("va", 0, 8), ("rkey", 8, 4), ("swap_add", 12, 8), ("compare", 20, 8))
ATOMIC_ACK_ETH = (("orig", 0, 8),)
# MaskedAtomicETH (MASKED_COMPARE_SWAP, MASKED_FETCH_ADD; this engine's format): log2 of
# the operand size (2: 4 bytes, 3: 8 bytes), then four 8-byte operands, a 4-byte operand
# in the low half of its field. Compare-swap: swap, compare, swap_mask, compare_mask;
# fetch-add: add, field_boundary, 0, 0 (mlx5's ext_cs / ext_fa segments, in that order).
MASKED_ATOMIC_ETH = (("va", 0, 8), ("rkey", 8, 4), ("log_size", 12, 1), ("rsvd", 13, 3),
                     ("op0", 16, 8), ("op1", 24, 8), ("op2", 32, 8), ("op3", 40, 8))
ATOMIC_ETH_LEN, ATOMIC_ACK_ETH_LEN, MASKED_ATOMIC_ETH_LEN = 28, 8, 48

ETH_LEN, IPV4_LEN, UDP_LEN, BTH_LEN, RETH_LEN, AETH_LEN, ICRC_LEN, FCS_LEN = 14, 20, 8, 12, 16, 4, 4, 4
ETHERTYPE_IPV4 = 0x0800
IP_PROTO_UDP = 17
ROCEV2_UDP_PORT = 4791
IPV4_VER_IHL = 0x45
IPV4_FLAGS_DF = 0x4000
IPV4_TTL = 64
DEFAULT_PKEY = 0xFFFF
ROCE_SPORT_BASE = 0xC000          # UDP source port = base | (src QPN & 0x3fff): flow entropy

# Offsets of the headers inside a RoCEv2 frame.
OFF_IP = ETH_LEN
OFF_UDP = OFF_IP + IPV4_LEN
OFF_BTH = OFF_UDP + UDP_LEN
OFF_EXT = OFF_BTH + BTH_LEN       # first extension header (RETH for WRITE FIRST/ONLY)
HDR_LEN_RETH = OFF_EXT + RETH_LEN  # 70: WRITE FIRST / ONLY
HDR_LEN_NO_RETH = OFF_EXT          # 54: WRITE MIDDLE / LAST

# ICRC: bytes of the frame replaced by all ones before the CRC (SPEC section 5),
# as (frame offset, width): IPv4 TOS, TTL, header checksum, UDP checksum, BTH byte 4.
ICRC_MASKED = ((OFF_IP + 1, 1), (OFF_IP + 8, 1), (OFF_IP + 10, 2), (OFF_UDP + 6, 2), (OFF_BTH + 4, 1))
# The CRC runs over 8 bytes of 0xFF then the frame from the IP header on; the
# 8 bytes in front of the IP header are the source MAC and the ethertype, so
# "the frame from byte 6 with bytes 6-13 forced to 0xFF" is the same message.
ICRC_START = OFF_IP - 8

# BTH opcodes (RC)
class Op:
    SEND_FIRST, SEND_MIDDLE, SEND_LAST, SEND_LAST_IMM, SEND_ONLY, SEND_ONLY_IMM = 0x00, 0x01, 0x02, 0x03, 0x04, 0x05
    WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_LAST_IMM, WRITE_ONLY, WRITE_ONLY_IMM = 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B
    READ_REQUEST = 0x0C
    READ_RESP_FIRST, READ_RESP_MIDDLE, READ_RESP_LAST, READ_RESP_ONLY = 0x0D, 0x0E, 0x0F, 0x10
    ACK = 0x11
    ATOMIC_ACK = 0x12                  # AETH + AtomicAckETH
    COMPARE_SWAP, FETCH_ADD = 0x13, 0x14                        # IBTA 8-byte atomics: AtomicETH
    # This engine's masked and 4-byte atomics (no IBTA wire format exists): opcodes of the
    # manufacturer-specific range (transport bits 7:5 = 110) with MaskedAtomicETH,
    # answered by a standard ATOMIC ACKNOWLEDGE (docs/interfaces.md, "Atomics on the wire").
    MASKED_COMPARE_SWAP, MASKED_FETCH_ADD = 0xC0, 0xC1

PSN_BITS = 24                      # BTH PSN and AETH MSN width
PSN_MASK = (1 << PSN_BITS) - 1
PSN_HALF = 1 << (PSN_BITS - 1)     # a PSN less than this behind another is older (IBTA 9.7.2)
MSN_MASK = PSN_MASK                # AETH MSN: 24 bits too
IMMDT_LEN = 4                      # ImmDt extension header (SPEC section 5)
ETH_MIN_FRAME = 60                 # shortest Ethernet frame without FCS; shorter ones are padded up to it
# BTH flags byte: SE [7], MigReq [6], PadCnt [5:4], TVer [3:0]. PadCnt: the zero bytes after
# the payload of a message's last packet that make it a multiple of 4 (IBTA 9.2: a packet's
# payload, with its pad, is a whole number of 4-byte words).
BTH_PADCNT_SHIFT = 4
BTH_SE = 0x80


def pad_count(payload_len):
    """IBTA pad bytes after ``payload_len`` payload bytes (0..3)."""
    return -payload_len & 3

# Opcode classes of the RC opcodes the engine knows, each in ascending opcode order.
WRITE_OPS = (Op.WRITE_FIRST, Op.WRITE_MIDDLE, Op.WRITE_LAST, Op.WRITE_LAST_IMM, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM)
FIRST_OPS = (Op.WRITE_FIRST, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM)                       # start a message
LAST_OPS = (Op.WRITE_LAST, Op.WRITE_LAST_IMM, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM)      # end a message
RETH_OPS = FIRST_OPS                                       # carry a RETH (the message's first packet)
IMM_OPS = (Op.WRITE_LAST_IMM, Op.WRITE_ONLY_IMM)           # carry an ImmDt
READ_RESPONSE_OPS = (Op.READ_RESP_FIRST, Op.READ_RESP_MIDDLE, Op.READ_RESP_LAST, Op.READ_RESP_ONLY)
# carry an AETH: the responses (a READ RESPONSE MIDDLE has none); only a READ RESPONSE carries payload
AETH_OPS = (Op.READ_RESP_FIRST, Op.READ_RESP_LAST, Op.READ_RESP_ONLY, Op.ACK, Op.ATOMIC_ACK)
ATOMIC_ACK_ETH_OPS = (Op.ATOMIC_ACK,)                      # carry an AtomicAckETH behind the AETH
ATOMIC_ETH_OPS = (Op.COMPARE_SWAP, Op.FETCH_ADD)           # IBTA atomic requests: AtomicETH
MASKED_ATOMIC_ETH_OPS = (Op.MASKED_COMPARE_SWAP, Op.MASKED_FETCH_ADD)   # this engine's: MaskedAtomicETH
ATOMIC_OPS = ATOMIC_ETH_OPS + MASKED_ATOMIC_ETH_OPS        # every atomic request the responder executes
READ_REQUEST_OPS = (Op.READ_REQUEST,)                      # a RETH and nothing after it
KNOWN_OPS = WRITE_OPS + (Op.READ_REQUEST,) + READ_RESPONSE_OPS + (Op.ACK, Op.ATOMIC_ACK) + ATOMIC_OPS
# (every opcode the receive port parses)
# opcode -> (RETH, ImmDt, AETH, AtomicAckETH, AtomicETH, MaskedAtomicETH) present, for the
# opcodes of KNOWN_OPS
EXT_HEADERS = {op: (op in RETH_OPS or op in READ_REQUEST_OPS, op in IMM_OPS, op in AETH_OPS, op in ATOMIC_ACK_ETH_OPS,
                    op in ATOMIC_ETH_OPS, op in MASKED_ATOMIC_ETH_OPS) for op in KNOWN_OPS}

# ---- receive verdicts --------------------------------------------------------------
# What becomes of a received frame: ``(name, stage, meaning)`` in receive-counter order
# (spec/csr.py: counter ``rx_<name>``). ``stage``: "frame" = a frame-level drop of the
# header parser (rtl RxDrop 1.., in the order the checks run), "qp" = a drop the responder
# decides from the QP's state (rtl RxVerdict, in the order the checks run), None = taken.
# rtl.responder.RxVerdict holds every verdict before "bad_address", the one frame-level
# drop added after the others.
RX_VERDICTS = (
    ("accepted", None, "accepted"),
    ("ack_received", None, "ACK/NAK received"),
    ("bad_length", "frame", "bad length"),
    ("not_roce", "frame", "not RoCE"),
    ("bad_ip_checksum", "frame", "bad IPv4 checksum"),
    ("bad_icrc", "frame", "bad ICRC"),
    ("bad_pkey", "frame", "bad P_Key"),
    ("bad_opcode", "frame", "bad opcode"),
    ("qp_not_ready", "qp", "QP not ready"),
    ("psn_duplicate", "qp", "PSN duplicate"),
    ("psn_out_of_order", "qp", "PSN out of order"),
    ("access_error", "qp", "access error"),
    ("invalid_request", "qp", "invalid request"),
    ("wrong_peer", "qp", "wrong peer (a request whose source IPv4 or MAC address is not the QP's peer's)"),
    ("bad_address", "frame", "bad address (a RoCEv2 frame whose destination MAC or IPv4 address is not "
     "PORT_MAC/PORT_IP)"),
    ("bad_version", "frame", "bad transport version (BTH TVer not 0: IBTA header validation)"),
)
RX_VERDICT_NAMES = tuple(n for n, _, _ in RX_VERDICTS)
RX_FRAME_DROPS = tuple(n for n, s, _ in RX_VERDICTS if s == "frame")   # RxDrop 1.. in check order
RX_QP_DROPS = tuple(n for n, s, _ in RX_VERDICTS if s == "qp")
# Why a responder drops a frame (model.parse.parse_frame, then
# model.responder.RcResponder.receive, say in which order they check).
DROP_REASONS = RX_FRAME_DROPS + RX_QP_DROPS

# ---- responses the requester drops -------------------------------------------------
# An ACK/NAK that passed the frame-level checks changes requester state only when it
# belongs; anything else is dropped and counted (counter ``resp_<name>``), in the order
# the checks run (rtl/requester/response_checker.py, model.requester.RcRequester.on_response).
RESPONSE_DROPS = (
    ("unknown_qp", "destination QPN (all 24 bits) names no QP of this NIC"),
    ("not_rc", "the QP is not RC (a UC QP takes no responses)"),
    ("qp_state", "the QP is not in RTS, or has failed"),
    ("wrong_peer", "source IPv4 or MAC address not the QP's peer's"),
    ("bad_aeth", "AETH of the reserved kind (syndrome bits 6:5 = 2, or bit 7 set)"),
    ("psn_ahead", "PSN after the last PSN the QP has sent"),
    ("stale", "PSN already acknowledged (a NAK of an acknowledged PSN, an ACK that acknowledges nothing new)"),
    ("duplicate_nak", "a PSN-sequence NAK repeated with no progress in between"),
)
RESPONSE_DROP_NAMES = tuple(n for n, _ in RESPONSE_DROPS)

# ---- doorbells the engine drops ------------------------------------------------------
# Counter ``db_<name>`` each; ``doorbells_dropped`` is their sum, and a doorbell is
# counted either there or in ``doorbells`` (applied), exactly once.
DOORBELL_DROPS = (
    ("bad_write", "UAR write not a doorbell: offset, partial strobes, QPN not the page's, page beyond the "
     "QP table, burst length, BlueFlame WQE of more than one WQEBB"),
    ("qp_not_rts", "the QP is not in RTS (nor in ERR, whose WQEs are fetched and flushed)"),
    ("stale", "producer index behind the QP's (mod 2^16): it would replay the ring"),
    ("over_depth", "producer index more than the send-queue depth past the fetch index"),
)
DOORBELL_DROP_NAMES = tuple(n for n, _ in DOORBELL_DROPS)

# ---- mlx5 send queue ------------------------------------------------------------
WQEBB = 64
DS_UNIT = 16
MAX_WQEBBS = 16                    # largest WQE: ds 63 (the 6-bit field's limit), 1 KiB, 972 B inline
CTRL_SEG = (("opmod_idx_opcode", 0, 4), ("qpn_ds", 4, 4), ("signature", 8, 1),
            ("rsvd", 9, 2), ("fm_ce_se", 11, 1), ("imm", 12, 4))
RADDR_SEG = (("raddr", 0, 8), ("rkey", 8, 4), ("rsvd", 12, 4))
DATA_SEG = (("byte_count", 0, 4), ("lkey", 4, 4), ("addr", 8, 8))
INLINE_FLAG = 0x80000000
# An inline WRITE's payload starts after the control and remote-address segments and the
# inline segment's 4-byte byte count: byte 36 of the WQE.
WQE_INLINE_OFFSET = DS_UNIT + DS_UNIT + 4     # 36: ctrl (16) + raddr (16) + inline byte count (4)
SEND_INLINE_OFFSET = DS_UNIT + 4              # 20: a SEND's: ctrl (16) + inline byte count (4)
FM_CE_SE_CQ_UPDATE = 0x08
FM_CE_SE_SOLICITED = 0x02

# ---- mlx5 receive queue (rdma-core providers/mlx5/qp.c, mlx5_post_recv) ----------------
# A ring of receive WQEs of ``1 << log_stride`` bytes (a power of two, >= 16), each a list of
# 16-byte data segments (DATA_SEG: byte_count, lkey, addr; all big-endian). A WQE with fewer
# segments than fit ends at one whose lkey is INVALID_LKEY (byte_count 0). The consumer
# learns the producer's head from the QP's doorbell record: BE32(head & 0xffff) at offset
# DBR_RECV_OFFSET (the send counter is at DBR_SEND_OFFSET).
RECV_DATA_SEG = DATA_SEG
INVALID_LKEY = 0x100               # MLX5_INVALID_LKEY: ends a receive WQE's scatter list
DBR_RECV_OFFSET = 0                # MLX5_RCV_DBR
DBR_SEND_OFFSET = 4                # MLX5_SND_DBR

class WqeOp:
    NOP, RDMA_WRITE, RDMA_WRITE_IMM, SEND, SEND_IMM = 0x00, 0x08, 0x09, 0x0A, 0x0B
    RDMA_READ, ATOMIC_CS, ATOMIC_FA, ATOMIC_MASKED_CS, ATOMIC_MASKED_FA = 0x10, 0x11, 0x12, 0x14, 0x15
    DUMP = 0x23                        # NVSHMEM's consistency point: a local read, then its CQE


# Atomic WQE segments (../shared/VERBS.md section 1): the IBTA atomic segment, and mlx5's
# extended (masked) ones, 4-byte (opmod 0x08) and 8-byte (opmod 0x09).
ATOMIC_SEG = (("swap_add", 0, 8), ("compare", 8, 8))
EXT_FA32_SEG = (("add", 0, 4), ("field_boundary", 4, 4), ("rsvd", 8, 8))
EXT_CS32_SEG = (("swap", 0, 4), ("compare", 4, 4), ("swap_mask", 8, 4), ("compare_mask", 12, 4))
EXT_FA64_SEG = (("add", 0, 8), ("field_boundary", 8, 8))
EXT_CS64_SEG = (("swap", 0, 8), ("compare", 8, 8), ("swap_mask", 16, 8), ("compare_mask", 24, 8))
OPMOD_EXT_ATOMIC_4B, OPMOD_EXT_ATOMIC_8B = 0x08, 0x09
# The atomic WQE forms: (WQE opcode, opmod) -> (BTH opcode, operand bytes, operand segment,
# ds). The requester's WqeParser and the golden model both read this table.
ATOMIC_FORMS = {
    (WqeOp.ATOMIC_FA, 0): (Op.FETCH_ADD, 8, ATOMIC_SEG, 4),
    (WqeOp.ATOMIC_CS, 0): (Op.COMPARE_SWAP, 8, ATOMIC_SEG, 4),
    (WqeOp.ATOMIC_MASKED_FA, OPMOD_EXT_ATOMIC_4B): (Op.MASKED_FETCH_ADD, 4, EXT_FA32_SEG, 4),
    (WqeOp.ATOMIC_MASKED_FA, OPMOD_EXT_ATOMIC_8B): (Op.MASKED_FETCH_ADD, 8, EXT_FA64_SEG, 4),
    (WqeOp.ATOMIC_MASKED_CS, OPMOD_EXT_ATOMIC_4B): (Op.MASKED_COMPARE_SWAP, 4, EXT_CS32_SEG, 4),
    (WqeOp.ATOMIC_MASKED_CS, OPMOD_EXT_ATOMIC_8B): (Op.MASKED_COMPARE_SWAP, 8, EXT_CS64_SEG, 5),
}
# ctrl fm_ce_se [7:5]: the fence modes (mlx5 MLX5_FENCE_MODE_*)
FENCE_INITIATOR_SMALL, FENCE_FENCE, FENCE_STRONG_ORDERING, FENCE_SMALL_AND_FENCE = 0x20, 0x40, 0x60, 0x80

# ---- doorbells -------------------------------------------------------------------
UAR_PAGE_SHIFT = 12               # one 4 KiB UAR page per QP: page number = QPN
UAR_DB_OFFSET = 0x800             # doorbell register (BlueFlame register 0)
UAR_DB_OFFSET_ALT = 0x900         # second BlueFlame register (alternates per post)
DS_PER_WQEBB = WQEBB // DS_UNIT   # 4


def doorbell_limit(index, ds):
    """The producer index a doorbell sets (``index``: ctrl WQE index, ``ds``: its DS count).

    Every WQEBB before ``index + ceil(ds / 4)`` (mod 2^16) becomes ready: rdma-core rings
    with the last WQE's ctrl words, NVSHMEM with the next free index and ds = 0. The RTL
    computes it as ``index + ((ds + 3) >> 2)`` (rtl/host/doorbell_decoder.py).
    """
    return (index + (ds + DS_PER_WQEBB - 1) // DS_PER_WQEBB) & 0xFFFF

# ---- mlx5 CQE64 ---------------------------------------------------------------
CQE_SIZE = 64
# srqn_uidx [23:0]: the QP's user index (CQE version 1, which NVSHMEM requires); sop_drop_qpn:
# [31:24] the completed WQE's opcode (libmlx5 reads it as the requester CQE's opcode; the
# error CQE's s_wqe_opcode_qpn has it in the same place), [23:0] the QPN.
CQE64 = (("srqn_uidx", 32, 4), ("imm", 36, 4), ("byte_cnt", 44, 4), ("vendor_err_synd", 54, 1), ("syndrome", 55, 1),
         ("sop_drop_qpn", 56, 4), ("wqe_counter", 60, 2), ("signature", 62, 1), ("op_own", 63, 1))

class CqeOp:
    REQ, RESP_WR_IMM, RESP_SEND, RESP_SEND_IMM, REQ_ERR, RESP_ERR, INVALID = 0, 1, 2, 3, 13, 14, 15

class Syndrome:
    """mlx5 CQE error syndromes (``syndrome`` byte @55 of an error CQE).

    Source: rdma-core ``providers/mlx5/mlx5dv.h``, enum ``MLX5_CQE_SYNDROME_*``; the
    verbs status each maps to (``mlx5_handle_error_cqe``) is in the comment.
    """
    LOCAL_LENGTH_ERR = 0x01          # IBV_WC_LOC_LEN_ERR
    LOCAL_QP_OP_ERR = 0x02           # IBV_WC_LOC_QP_OP_ERR
    LOCAL_PROT_ERR = 0x04            # IBV_WC_LOC_PROT_ERR
    WR_FLUSH_ERR = 0x05              # IBV_WC_WR_FLUSH_ERR
    MW_BIND_ERR = 0x06               # IBV_WC_MW_BIND_ERR
    BAD_RESP_ERR = 0x10              # IBV_WC_BAD_RESP_ERR
    LOCAL_ACCESS_ERR = 0x11          # IBV_WC_LOC_ACCESS_ERR
    REMOTE_INVAL_REQ_ERR = 0x12      # IBV_WC_REM_INV_REQ_ERR
    REMOTE_ACCESS_ERR = 0x13         # IBV_WC_REM_ACCESS_ERR
    REMOTE_OP_ERR = 0x14             # IBV_WC_REM_OP_ERR
    TRANSPORT_RETRY_EXC_ERR = 0x15   # IBV_WC_RETRY_EXC_ERR
    RNR_RETRY_EXC_ERR = 0x16         # IBV_WC_RNR_RETRY_EXC_ERR
    REMOTE_ABORTED_ERR = 0x22        # IBV_WC_REM_ABORT_ERR


class Aeth:
    """AETH syndrome byte (SPEC section 5; InfiniBand AETH syndrome encoding).

    Bits [6:5]: 00 ACK (bits [4:0] credit count), 01 RNR NAK (timer), 11 NAK (code).
    An ACK carries credit count 0x1F, "invalid": credits count receive WQEs, which a
    WRITE does not consume (0x00 would tell the requester it has none).
    """
    ACK = 0x1F
    RNR_NAK = 0x20
    NAK_PSN_SEQ = 0x60                # PSN sequence error; BTH.PSN = the expected PSN
    NAK_INVALID_REQ = 0x61
    NAK_REMOTE_ACCESS = 0x62
    NAK_REMOTE_OP = 0x63
    KIND_ACK, KIND_RNR, KIND_RESERVED, KIND_NAK = 0, 1, 2, 3   # syndrome >> 5


# IBTA's RNR NAK timer field (AETH syndrome bits [4:0], ibv_qp_attr.min_rnr_timer): code ->
# the time the requester waits before it sends again, in nanoseconds (code 0 is the longest,
# 655.36 ms). rdma-core's ibv_modify_qp(3) man page lists the same table.
RNR_TIMER_NS = (655_360_000, 10_000, 20_000, 30_000, 40_000, 60_000, 80_000, 120_000, 160_000, 240_000,
                320_000, 480_000, 640_000, 960_000, 1_280_000, 1_920_000, 2_560_000, 3_840_000, 5_120_000,
                7_680_000, 10_240_000, 15_360_000, 20_480_000, 30_720_000, 40_960_000, 61_440_000, 81_920_000,
                122_880_000, 163_840_000, 245_760_000, 327_680_000, 491_520_000)
RNR_RETRY_FOREVER = 7              # ibv_qp_attr.rnr_retry 7: retry without limit


MKEY_VARIANT_BITS = 8              # mlx5 memory keys: index << 8 | variant byte (the slot is key >> 8)


class Access:                      # ibv_access_flags: rights of a memory region
    LOCAL_WRITE = 0x1
    REMOTE_WRITE = 0x2
    REMOTE_READ = 0x4
    REMOTE_ATOMIC = 0x8


class MrCheck:                     # outcome of a memory-key check (responder side)
    OK = 0
    BAD_KEY = 1                    # no valid region under this key
    PD = 2                         # region of another protection domain
    RIGHTS = 3                     # region lacks the access asked for
    BOUNDS = 4                     # [addr, addr + length) not inside the region


# ---- QP states (ibv_qp_state) and path MTU (ibv_mtu) ---------------------------------
class QpState:
    RESET, INIT, RTR, RTS, SQD, SQE, ERR = range(7)

# QP_MODIFY: the transitions ibv_modify_qp allows (the kernel's ib_modify_qp_is_ok; SQD
# and SQE, which the engine does not implement, are never a target), and what each does.
QP_TRANSITIONS = {
    QpState.RESET: (QpState.RESET, QpState.INIT),
    QpState.INIT: (QpState.RESET, QpState.INIT, QpState.RTR, QpState.ERR),
    QpState.RTR: (QpState.RESET, QpState.RTS, QpState.ERR),
    QpState.RTS: (QpState.RESET, QpState.RTS, QpState.ERR),
    QpState.SQD: (QpState.RESET, QpState.ERR),     # only a create (QP_COMMIT) reaches these
    QpState.SQE: (QpState.RESET, QpState.ERR),
    QpState.ERR: (QpState.RESET, QpState.ERR),
}


class QpModify:
    """What a QP_MODIFY from one state to another does (``qp_modify_action``)."""
    REJECT = 0        # not a transition verbs allows: SLVERR, nothing changes (qp_modify_rejected)
    CREATE = 1        # both sides start afresh from the staged context (indices 0, staged PSNs)
    SEND_RESET = 2    # RTR -> RTS: the send side starts afresh (staged QP_START_PSN), the receive side keeps its state
    FLUSH = 3         # to ERR: every outstanding and later WQE completes with WR_FLUSH_ERR
    CONFIG = 4        # same state: the staged configuration (weight) only


def qp_modify_action(cur, new):
    """The ``QpModify`` action of a QP_MODIFY from state ``cur`` to ``new`` (ibv_qp_state).

    Before RTS a QP has sent nothing and (before RTR) taken nothing, so the engine moves
    it forward by starting afresh from the staged registers: RESET -> INIT and INIT -> RTR
    take QP_RQ_PSN (verbs sets rq_psn at RTR) and RTR -> RTS takes QP_START_PSN (sq_psn
    at RTS)."""
    if new not in QP_TRANSITIONS.get(cur, ()):
        return QpModify.REJECT
    if new == QpState.RESET or (cur, new) in ((QpState.RESET, QpState.INIT), (QpState.INIT, QpState.RTR)):
        return QpModify.CREATE
    if (cur, new) == (QpState.RTR, QpState.RTS):
        return QpModify.SEND_RESET
    if new == QpState.ERR and cur != QpState.ERR:
        return QpModify.FLUSH
    return QpModify.CONFIG


def mtu_bytes(code):
    """ibv_mtu enum (1=256 .. 5=4096) to bytes."""
    if not 1 <= code <= 5:
        raise ValueError(f"path MTU code must be 1 (256 B) .. 5 (4096 B), not {code}")
    return 128 << code

def mtu_code(nbytes):
    for c in range(1, 6):
        if mtu_bytes(c) == nbytes:
            return c
    raise ValueError(f"path MTU must be 256, 512, 1024, 2048 or 4096 bytes, not {nbytes}")


def get_field(table, name):
    for n, off, width in table:
        if n == name:
            return off, width
    raise KeyError(name)


def pack(table, buf, base, **values):
    """Write big-endian fields of ``table`` into ``buf`` at ``base``."""
    for name, value in values.items():
        off, width = get_field(table, name)
        buf[base + off:base + off + width] = int(value).to_bytes(width, "big")


def read_field(table, name, buf, base=0):
    """Field ``name`` of ``table`` from ``buf`` at ``base``, as an int (big-endian)."""
    off, width = get_field(table, name)
    return int.from_bytes(bytes(buf[base + off:base + off + width]), "big")


def unpack(table, buf, base=0):
    """Read every field of ``table`` from ``buf`` at ``base`` as a dict of ints."""
    return {n: int.from_bytes(bytes(buf[base + o:base + o + w]), "big") for n, o, w in table}
