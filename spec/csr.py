"""The control register map (``s_axil``, AXI4-Lite, 32-bit registers) and the counters.

One table for all three users: ``rtl/host/control_registers.py`` builds its address
decoder from it, ``tb/control.py`` takes its addresses from it and
``docs/interfaces.md`` ("CSR map") lists the same rows (tests/model/test_csr_map.py
holds the document to this table).

Each register is ``Reg(name, addr, access, width, meaning)``: ``access`` is RO (read
only), RW (written and read back) or WO (an action on any write; reads answer SLVERR);
``width`` is the number of low bits the register holds in the default build
(spec/params.py; the rest read as 0), 0 for a WO register. Each counter is
``Counter(name, addr, meaning)``: a 32-bit RO register that wraps.
"""
from collections import namedtuple

from spec.formats import DOORBELL_DROPS, RESPONSE_DROPS, RX_VERDICTS, RX_VERDICT_NAMES
from spec.params import NUM_CQS, NUM_QPS, PD_BITS

__all__ = ["Reg", "Counter", "RO", "RW", "WO", "ID_VALUE", "REGISTERS", "TX_COUNTERS", "RX_COUNTERS",
           "REQ_COUNTERS", "CHECK_COUNTERS", "COUNTERS", "COUNTER_NAMES", "ALL", "ADDR", "reg", "counter_address"]

RO, RW, WO = "RO", "RW", "WO"
ID_VALUE = 0x49424741              # the ID register: "IBGA"

Reg = namedtuple("Reg", "name addr access width meaning")
Counter = namedtuple("Counter", "name addr meaning")

_QP_BITS = max(1, (NUM_QPS - 1).bit_length())
_CQ_BITS = max(1, (NUM_CQS - 1).bit_length())

REGISTERS = (
    Reg("ID", 0x000, RO, 32, '0x49424741 ("IBGA")'),
    Reg("PARAMS", 0x004, RO, 32, "[15:0] number of QPs, [31:16] number of CQs"),
    Reg("PORT_MAC_LO", 0x010, RW, 32, "source MAC bytes 2..5 (MAC = 0xAABBCCDDEEFF: LO = 0xCCDDEEFF)"),
    Reg("PORT_MAC_HI", 0x014, RW, 16, "[15:0] source MAC bytes 0..1 (0xAABB)"),
    Reg("PORT_IP", 0x018, RW, 32, "source IPv4 address (0xC0A80001 = 192.168.0.1)"),
    Reg("QP_NUM", 0x100, RW, _QP_BITS, "QP the next QP commit writes"),
    Reg("QP_SQ_BASE_LO", 0x104, RW, 32, "send-queue base address [31:0] (64-byte aligned)"),
    Reg("QP_SQ_BASE_HI", 0x108, RW, 32, "send-queue base address [63:32]"),
    Reg("QP_SQ_LOG_DEPTH", 0x10C, RW, 4, "log2 of SQ depth in WQEBBs (0..15)"),
    Reg("QP_CQN", 0x110, RW, _CQ_BITS, "CQ that receives this QP's send completions"),
    Reg("QP_REMOTE_QPN", 0x114, RW, 24, "destination QPN (24 bits)"),
    Reg("QP_START_PSN", 0x118, RW, 24, "first PSN (24 bits)"),
    Reg("QP_DMAC_LO", 0x11C, RW, 32, "destination MAC bytes 2..5, same split as PORT_MAC"),
    Reg("QP_DMAC_HI", 0x120, RW, 16, "destination MAC bytes 0..1"),
    Reg("QP_DIP", 0x124, RW, 32, "destination IPv4"),
    Reg("QP_MTU", 0x128, RW, 3, "path MTU as ibv_mtu: 1=256 .. 5=4096"),
    Reg("QP_STATE", 0x12C, RW, 3, "ibv_qp_state: 0 RESET .. 3 RTS .. 6 ERR; only RTS sends; in ERR every "
        "WQE completes with WR_FLUSH_ERR"),
    Reg("QP_COMMIT", 0x130, WO, 0, "any write: create: store the staged context into QP_NUM, reset its "
        "producer/consumer indices to 0 and its PSN to QP_START_PSN"),
    Reg("QP_WEIGHT", 0x134, RW, 4, "scheduler weight 1..15 (0 counts as 1): a turn of the QP is up to "
        "weight x 128 WQEBBs"),
    Reg("QP_MODIFY", 0x138, WO, 0, "any write: move QP QP_NUM to QP_STATE as verbs allows "
        "(spec.formats.qp_modify_action; another transition: SLVERR, nothing changes): to RESET, RESET->INIT "
        "and INIT->RTR start the QP afresh from the staged context; RTR->RTS the send side (QP_START_PSN); "
        "to ERR flushes every outstanding and later WQE; in the same state only the configuration changes"),
    Reg("QP_RQ_PSN", 0x13C, RW, 24, "receive side: first expected PSN (the peer's start PSN)"),
    Reg("QP_PD", 0x140, RW, PD_BITS, "protection domain of the QP (24 bits): memory keys must belong to it"),
    Reg("QP_ACK_EVERY", 0x144, RW, 8, "ACK coalescing: one ACK per this many accepted packets (0 counts as "
        "1); AckReq and a message's last packet are always acknowledged"),
    Reg("QP_SERVICE", 0x148, RW, 1, "0: RC (a WQE completes when acknowledged), 1: UC (when sent)"),
    Reg("QP_TIMEOUT", 0x14C, RW, 32, "RC ACK timeout in core cycles (the timer runs while completions wait)"),
    Reg("QP_RETRY", 0x150, RW, 3, "RC retry count 0..7: timer retransmissions before the QP gives up"),
    Reg("QP_USER_INDEX", 0x154, RW, 24, "user index its CQEs carry in srqn_uidx [23:0] (CQE version 1; "
        "taken by a create)"),
    Reg("QP_MAX_RD_ATOMIC", 0x158, RW, 5, "READs and atomics in flight at most, 1..16 (ibv_qp_attr.max_rd_atomic, "
        "the peer's responder resources; 0 and over 16 count as 16): one more, and every WQE after it, waits"),
    Reg("QP_MAX_DEST_RD_ATOMIC", 0x15C, RW, 5, "receive side: READs and atomics the QP answers at once, 1..16 "
        "(ibv_qp_attr.max_dest_rd_atomic, its responder resources; 0 and over 16 count as 16): a new one "
        "beyond them, before one of them is answered, is NAKed invalid request and the QP goes to ERR"),
    Reg("QP_MAX_WQEBBS", 0x160, RW, 5, "largest WQE the QP posts, 1..16 WQEBBs (0 and over 16 count as 16; "
        "mlx5 sizes it at create from max_inline_data and max_send_sge): a turn cut by the quantum reads this "
        "many minus one WQEBBs past the cut so its last WQE is whole; a larger WQE across a cut is fetched "
        "again with the next turn"),
    Reg("QP_RNR_RETRY", 0x164, RW, 3, "RC RNR retry count 0..7 (ibv_qp_attr.rnr_retry; 7: without limit): "
        "resends after an RNR NAK, each after the NAK's timer, before the WQE fails with RNR_RETRY_EXC_ERR"),
    Reg("QP_RQ_BASE_LO", 0x168, RW, 32, "receive side: receive-queue base address [31:0] (aligned to the "
        "stride; mlx5 ring of receive WQEs, model/recv_queue.py)"),
    Reg("QP_RQ_BASE_HI", 0x16C, RW, 32, "receive-queue base address [63:32]"),
    Reg("QP_RQ_LOG_SIZE", 0x170, RW, 4, "log2 of the receive WQEs in the ring (0..15)"),
    Reg("QP_RQ_LOG_STRIDE", 0x174, RW, 4, "log2 of the bytes of one receive WQE (4..9: one to 32 data "
        "segments, of which the engine takes the first RECV_MAX_SGE); 0: the QP has no receive queue (every "
        "SEND and WRITE with immediate gets an RNR NAK)"),
    Reg("QP_DBR_LO", 0x178, RW, 32, "doorbell record address [31:0] (4-byte aligned): the engine reads the "
        "receive counter BE32(head & 0xffff) at + DBR_RECV_OFFSET"),
    Reg("QP_DBR_HI", 0x17C, RW, 32, "doorbell record address [63:32]"),
    Reg("QP_RCQN", 0x180, RW, _CQ_BITS, "CQ that receives this QP's receive completions (RESP_SEND, "
        "RESP_SEND_IMM, RESP_WR_IMM, RESP_ERR); a CQ takes either send or receive completions, not both"),
    Reg("QP_MIN_RNR_TIMER", 0x184, RW, 5, "receive side: the RNR NAK's timer code 0..31 (ibv_qp_attr."
        "min_rnr_timer, IBTA's table spec.formats.RNR_TIMER_NS) sent when no receive WQE is posted"),
    Reg("CQ_NUM", 0x200, RW, _CQ_BITS, "CQ the next CQ commit writes"),
    Reg("CQ_BASE_LO", 0x204, RW, 32, "CQ buffer base address [31:0] (64-byte aligned)"),
    Reg("CQ_BASE_HI", 0x208, RW, 32, "CQ buffer base address [63:32]"),
    Reg("CQ_LOG_DEPTH", 0x20C, RW, 4, "log2 of the number of CQEs (0..15)"),
    Reg("CQ_FLAGS", 0x210, RW, 1, "bit 0: collapsed (every CQE in slot 0)"),
    Reg("CQ_COMMIT", 0x214, WO, 0, "any write: store the staged CQ context, reset its producer count to 0"),
    Reg("MR_INDEX", 0x300, RW, 24, "memory-region slot (the key's index, `key >> 8`)"),
    Reg("MR_KEY", 0x304, RW, 32, "the whole 32-bit key (index and variant byte)"),
    Reg("MR_BASE_LO", 0x308, RW, 32, "region start address [31:0]"),
    Reg("MR_BASE_HI", 0x30C, RW, 32, "region start address [63:32]"),
    Reg("MR_LEN_LO", 0x310, RW, 32, "region length in bytes [31:0]"),
    Reg("MR_LEN_HI", 0x314, RW, 32, "region length in bytes [63:32]"),
    Reg("MR_ACCESS", 0x318, RW, 4, "ibv_access_flags: 0x1 local write, 0x2 remote write, 0x4 remote read, "
        "0x8 remote atomic"),
    Reg("MR_PD", 0x31C, RW, PD_BITS, "protection domain of the region"),
    Reg("MR_COMMIT", 0x320, WO, 0, "any write: register the staged region in slot MR_INDEX"),
    Reg("MR_DEREG", 0x324, WO, 0, "any write: invalidate slot MR_INDEX"),
)


def _block(base, rows):
    return tuple(Counter(name, base + 4 * i, meaning) for i, (name, meaning) in enumerate(rows))


# Transmit counters (0x040).
TX_COUNTERS = _block(0x040, (
    ("doorbells", "doorbells applied (the QP's producer index set)"),
    ("doorbells_dropped", "doorbells dropped (the sum of the db_<reason> counters)"),
    ("wqes", "WQEs executed"),
    ("packets", "data packets sent (ACK/NAK frames have their own counters)"),
    ("cqes", "CQEs written"),
    ("error_cqes", "error CQEs written"),
))
# Receive counters (0x080): one per received frame's verdict (spec.formats.RX_VERDICTS,
# rx_<verdict>, in its order), with ACKs and NAKs sent after the verdicts of
# rtl.responder.RxVerdict and before "bad_address", the one frame-level drop added since.
# The verdicts added after "bad_address" (the block is full) are in CHECK_COUNTERS.
_RX = [(f"rx_{name}", f"received frames: {meaning}") for name, _, meaning in RX_VERDICTS]
_LATER = ("wrong_peer", "bad_version")
_RX_FIRST = [r for r in _RX if r[0][3:] not in _LATER]
_N_RX_VERDICT = [r[0] for r in _RX_FIRST].index("rx_bad_address")
RX_COUNTERS = _block(0x080, _RX_FIRST[:_N_RX_VERDICT] + [("acks_sent", "ACKs sent"), ("naks_sent", "NAKs sent")]
                     + _RX_FIRST[_N_RX_VERDICT:])
# Requester reliability counters (0x0C0).
REQ_COUNTERS = _block(0x0C0, (
    ("naks_received", "NAKs received"),
    ("retransmits", "go-back-N retransmissions (not counting failure walks)"),
    ("timeouts", "ACK timeouts"),
    ("retry_exceeded", "QPs out of retries"),
    ("acks_merged", "received ACK/NAKs folded into another of the same QP in AckMailbox (two of one QP from "
     "one beat, or a record waiting for the tracker)"),
    ("rnr_naks_received", "RNR NAKs received (the peer had no receive WQE: resent after the NAK's timer)"),
))
# Checks on what arrives from outside (0x400): the later receive verdicts, the
# responses the requester drops (spec.formats.RESPONSE_DROPS), the doorbells dropped
# (spec.formats.DOORBELL_DROPS).
CHECK_COUNTERS = _block(0x400, [r for r in _RX if r[0][3:] in _LATER]
                        + [(f"resp_{name}", f"responses dropped: {meaning}") for name, meaning in RESPONSE_DROPS]
                        + [(f"db_{name}", f"doorbells dropped: {meaning}") for name, meaning in DOORBELL_DROPS]
                        + [("acks_coalesced", "re-ACKs not sent: identical to the last ACK queued, while the ACK "
                            "queue was backlogged (16 or more queued) (acks_sent + acks_coalesced = ACKs owed)"),
                           ("qp_modify_rejected", "QP_MODIFY writes refused: not a transition verbs allows "
                            "(answered SLVERR)"),
                           ("rnr_naks_sent", "RNR NAKs sent (a request that needed a receive WQE found none "
                            "posted; not counted in the rx_<verdict> counters; in naks_sent)")])
COUNTERS = TX_COUNTERS + RX_COUNTERS + REQ_COUNTERS + CHECK_COUNTERS
COUNTER_NAMES = tuple(c.name for c in COUNTERS)

# Every register and counter as Reg rows, by address.
ALL = tuple(sorted(REGISTERS + tuple(Reg(c.name, c.addr, RO, 32, c.meaning) for c in COUNTERS),
                   key=lambda r: r.addr))
ADDR = {r.name: r.addr for r in ALL}           # name -> address
_BY_NAME = {r.name: r for r in ALL}

assert len(ADDR) == len(ALL) and len({r.addr for r in ALL}) == len(ALL), "CSR names and addresses unique"
assert all(r.addr % 4 == 0 for r in ALL)


def reg(name):
    """The ``Reg`` row of register or counter ``name``."""
    return _BY_NAME[name]


def counter_address(name):
    """CSR address of counter ``name``."""
    for c in COUNTERS:
        if c.name == name:
            return c.addr
    raise KeyError(name)
