"""RC responder: per-QP PSN check, memory-key check and ACK/NAK decisions for received
RDMA WRITE, READ and atomic requests (``RxDispatch`` takes frame-level drops and received
ACK/NAKs)."""
import functools
import operator

from amaranth.hdl import *
from amaranth.lib import wiring, data, enum, stream
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from spec import formats as F
from spec import params as P
from spec.formats import Aeth, MrCheck, QpState, PSN_BITS
from rtl.common.contexts import qp_bits
from rtl.common.records import AckRecord
from rtl.responder.mr_table import MemoryRegionTable, MrEntry
from rtl.common.rx_packet import RxPacket
from rtl.common.stream import Pair, pack_pair
from rtl.responder.atomic_unit import AtomicOp, AtomicRequest
from rtl.responder.payload_writer import RxWriteCommand
from rtl.responder.recv_gate import FLUSH_HELD, FLUSH_NEXT, GateWqe, SEND_OPS, gate_wqe, is_rwr
from rtl.responder.recv_queue import RecvLookup, RecvSync, RecvWqe

__all__ = ["Responder", "ResponderAck", "ReadJob", "RecvCqe", "ResponderConfig", "ResponderEntry", "RxVerdict",
           "RX_VERDICT_NAMES"]

# An answer the responder owes: an ACK/NAK (``AckRecord``'s fields) or, with ``atomic``,
# the ATOMIC ACKNOWLEDGE of the atomic of PSN ``psn``, whose MSN and original value the
# ``AtomicUnit`` supplies later (``AtomicAckJoin``: ``msn`` and ``orig`` are filled there),
# or, with ``read``, the place of a READ's responses (``ResponseMerge`` puts them there).
ResponderAck = data.StructLayout({
    "qpn": unsigned(24), "psn": unsigned(PSN_BITS), "syndrome": unsigned(8), "msn": unsigned(24),
    "atomic": unsigned(1), "orig": unsigned(64), "read": unsigned(1),
    "counted": unsigned(1),     # a new READ's or atomic's: it holds one of the QP's responder resources
})


def ReadJob(num_qps):
    """A READ REQUEST the responder executes (new, or a duplicate executed again): read
    ``length`` bytes at ``va`` and send them from PSN ``psn`` with the AETH MSN ``msn``, at
    the QP's path MTU (ibv_mtu code ``mtu``)."""
    return data.StructLayout({
        "qpn": unsigned(qp_bits(num_qps)), "psn": unsigned(PSN_BITS), "va": unsigned(64),
        "length": unsigned(32), "msn": unsigned(24), "mtu": unsigned(3),
    })


# A receive completion the responder decided (``RecvCqeWriter`` writes it once the writes
# before it have landed): a message's last packet accepted (RESP_SEND, RESP_SEND_IMM,
# RESP_WR_IMM with its byte count, immediate and SE bit), or the receive WQE a fatal error
# ends (RESP_ERR with its syndrome). ``cqn`` and ``user_index`` are the QP's.
RecvCqe = data.StructLayout({
    "qpn": unsigned(24), "cqn": unsigned(16), "user_index": unsigned(24), "opcode": unsigned(4),
    "syndrome": unsigned(8), "index": unsigned(16), "byte_cnt": unsigned(32), "imm": unsigned(32), "se": unsigned(1),
})

# Packets that start and end a message, WRITEs and SENDs (model.responder's _FIRST_ALL, _LAST_ALL)
_FIRST_ALL = F.FIRST_OPS + (F.Op.SEND_FIRST, F.Op.SEND_ONLY, F.Op.SEND_ONLY_IMM)
_LAST_ALL = F.LAST_OPS + (F.Op.SEND_LAST, F.Op.SEND_LAST_IMM, F.Op.SEND_ONLY, F.Op.SEND_ONLY_IMM)

# BTH opcode -> the AtomicUnit's operation
_ATOMIC_OP = {F.Op.FETCH_ADD: AtomicOp.FETCH_ADD, F.Op.COMPARE_SWAP: AtomicOp.COMPARE_SWAP,
              F.Op.MASKED_FETCH_ADD: AtomicOp.MASKED_FETCH_ADD, F.Op.MASKED_COMPARE_SWAP: AtomicOp.MASKED_COMPARE_SWAP}
assert set(_ATOMIC_OP) == set(F.ATOMIC_OPS)



class RxVerdict(enum.Enum, shape=4):
    """What became of one received frame (one counter each).

    The names of all the receive counters; the ``Responder`` itself only gives
    ACCEPTED and the QP-level verdicts (QP_NOT_READY and after): ``RxDispatch`` counts
    ACKs received and the frame-level drops (BAD_LENGTH..BAD_OPCODE)."""
    ACCEPTED = 0            # a WRITE packet, a READ or an atomic executed
    ACK_RECEIVED = 1        # an ACK/NAK for this NIC's requester side
    BAD_LENGTH = 2
    NOT_ROCE = 3
    BAD_IP_CHECKSUM = 4
    BAD_ICRC = 5
    BAD_PKEY = 6
    BAD_OPCODE = 7
    QP_NOT_READY = 8
    PSN_DUPLICATE = 9
    PSN_OUT_OF_ORDER = 10
    ACCESS_ERROR = 11
    INVALID_REQUEST = 12
    WRONG_PEER = 13         # a request whose source IPv4 or MAC address is not the QP's peer's


# spec.formats.RX_VERDICTS names (``DROP_REASONS`` and the counters rx_<name>) of each
# verdict: the verdicts are that table's first rows, in its order.
RX_VERDICT_NAMES = {v: v.name.lower() for v in RxVerdict}
assert [(v.value, n) for v, n in RX_VERDICT_NAMES.items()] == list(enumerate(F.RX_VERDICT_NAMES[:len(RxVerdict)]))


def _is_read_response(p):
    return (p.opcode >= F.Op.READ_RESP_FIRST) & (p.opcode <= F.Op.READ_RESP_ONLY)


def _any(terms):
    """``t0 | t1 | ...`` (left to right)."""
    return functools.reduce(operator.or_, terms)


# Counts of READs and atomics taken and answered, per QP, mod 2^6: their difference, the
# ones holding a responder resource, is at most 16; the upper half of the range means
# more answers than takes (answers of the QP's previous life, counted after its create).
RESOURCE_COUNT_BITS = 6


def ResponderConfig(pd_bits):
    """What the CPU writes for a QP's receive side (with the QP's create)."""
    return data.StructLayout({
        "state":      unsigned(3),      # ibv_qp_state: RTR and RTS accept packets
        "pd":         unsigned(pd_bits),
        "ack_every":  unsigned(8),      # ACK coalescing: one ACK per this many packets (0 counts as 1)
        "mtu":        unsigned(3),      # ibv_mtu code 1..5
        "peer_mac":   unsigned(48),     # the requester: requests from another source are dropped
        "peer_ip":    unsigned(32),
        "max_dest_rd_atomic": unsigned(5),  # responder resources: READs and atomics answered at once (0, > 16: 16)
        "min_rnr_timer": unsigned(5),   # the RNR NAK's timer code
        "rcqn":       unsigned(16),     # the CQ of its receive completions
        "user_index": unsigned(24),     # its CQEs' srqn_uidx
    })       # (where ACKs go is the ``AckAddresser``'s)


def ResponderDynamic(max_sge):
    return data.StructLayout({
    "epsn":     unsigned(PSN_BITS),     # expected PSN
    "msn":      unsigned(24),           # messages completed
    "unacked":  unsigned(8),            # accepted packets not yet covered by an ACK
    "nak_sent": unsigned(1),            # a PSN-sequence NAK went out for the current gap
    "in_msg":   unsigned(1),            # between a FIRST and its LAST
    "msg_va":   unsigned(64),           # the message's RETH address and length,
    "msg_len":  unsigned(32),           # and the bytes received so far
    "msg_off":  unsigned(32),
    "taken":    unsigned(RESOURCE_COUNT_BITS),  # new READs and atomics accepted (mod 2^6): less the
                                                # answers sent (``answered``), those holding a resource
    # two-sided verbs: the message in progress is a SEND; its receive WQE and the bytes it
    # took; the receive WQEs used (committed) and the RecvQueue's numbering generation
    "msg_send": unsigned(1),
    "cur":      GateWqe(max_sge),
    "recv":     unsigned(32),
    "rq_ci":    unsigned(16),
    "rq_gen":   unsigned(1),
    })


def ResponderEntry(pd_bits, max_sge=1):
    return data.StructLayout({"cfg": ResponderConfig(pd_bits), "dyn": ResponderDynamic(max_sge)})


class Responder(wiring.Component):
    """The receive side of the RC transport for RDMA WRITE, READ and atomic requests, two
    packets per cycle.

    It sees only the requests that passed the frame-level checks: ``RxDispatch``
    counts the frames dropped at frame level and passes received ACK/NAKs to the
    requester side. Every request with payload gets exactly one payload command (write
    or discard), so the payload writer stays in step with the frames it sees (those
    with payload); a request may also produce an ACK/NAK to send. The rules are those of
    ``model/responder.py`` (``RcResponder.receive``, for the frames that pass its frame-level
    checks):

    - a QP accepts packets in RTR or RTS (its own state and the one the control path last
      set: a QP_MODIFY to ERR stops it), from its peer only (source IPv4 and MAC address);
    - PSN: the expected PSN is executed; a duplicate (less than 2^23 behind) is not
      executed again and is answered with an ACK of the last accepted PSN; a gap gets
      one PSN-sequence NAK (the expected PSN), later packets are dropped silently until
      the expected PSN arrives;
    - opcode sequence: FIRST/ONLY outside a message, MIDDLE/LAST inside one, else an
      invalid-request NAK;
    - FIRST/ONLY: the RETH range is checked against the memory-key table (key, PD,
      REMOTE_WRITE, bounds); a violation sends a remote-access-error NAK with the
      packet's PSN, writes nothing and moves the QP to the error state;
    - lengths: FIRST/MIDDLE carry exactly one MTU, LAST/ONLY at most one, and the
      message exactly the RETH length: so no packet writes outside the checked range;
    - ACKs are coalesced: one per ``ack_every`` accepted packets, and always on AckReq
      and on a message's last packet, with the PSN of that packet and the MSN.

    Two per cycle: the dispatch hands over the one or two requests that ended in one
    beat as a pair (WRITEs of 0 and 1 payload bytes arrive 1.02 and 1.01 per cycle at
    line rate). Pipeline: both lanes' QP contexts are read from RAM (two read ports) when
    a pair is taken (stage B); the key checks run in two memory-key tables, one per lane
    (stage C); the decisions and the context writes (two write ports) are in stage C.
    Lane 1 decides on lane 0's new context when both are of one QP (a chained decision:
    the second depends on the first's PSN and message state), and then only lane 1's
    context is written. A pair whose QPs were decided in the pair just before takes
    their new contexts from bypass registers, so back-to-back pairs go at one per cycle.

    Two-sided verbs (``model.responder``'s decisions): SEND FIRST/MIDDLE/LAST/ONLY(_IMM)
    and WRITE with immediate. A packet that consumes a receive WQE (``RWR_OPS``) comes with
    a WQE the ``RecvGate`` took speculatively (``rwqe``: its number, and the WQE when it is
    on chip). After the PSN and opcode-sequence checks it uses the QP's next WQE, number
    ``rq_ci`` (the model's consumer count): the one it holds if that is its number, else
    the stage waits while it asks the ``RecvQueue`` for it (``lookup`` / ``found``); with
    none posted it gets an RNR NAK (AETH 0x20 | the QP's ``min_rnr_timer``, its PSN, the
    MSN; the next packet ahead of it gets the gap's PSN-sequence NAK). Every such packet's
    decision goes to the ``RecvQueue`` as a ``sync`` record: the committed count, and when
    the numbers handed on after this packet's are off (it did not use its WQE, or used
    another), a correction of the queue's numbering (once per generation ``rq_gen``: the
    packets already numbered in the old one are corrected by the same move). A SEND's payload goes to the WQE's segments from where the message's last packet
    ended (``recv``); one that does not fit is NAKed invalid request, the WQE completes with
    LOCAL_LENGTH_ERR and the QP goes to ERR. A message's last packet, and a fatal error
    with a WQE held, give a receive completion (``cqes``) and a CQE fence among the payload
    commands (``cqe``): the CQE is written once the writes before it have landed.

    Parameters
    ----------
    num_qps : int
        QPs in the context RAM (a power of two >= 2).
    num_mrs : int
        Regions in the memory-key table.
    pd_bits : int
        Width of protection-domain numbers.
    max_sge : int
        Data segments of a receive WQE (as the ``RecvGate``).

    Members
    -------
    packets : In(stream.Signature(Pair(RxPacket())))
        Descriptors of the received requests, one or two per transfer, in order:
        only ``drop`` = NONE and an RDMA WRITE, READ REQUEST or atomic opcode
        (``RxDispatch.requests``); other frames are not checked for here and must not be
        sent.
    commit : In(stream.Signature(...))
        ``qpn`` and ``cfg`` (``ResponderConfig``), ``epsn``: create a QP's receive side
        (its dynamic state is reset). Taken in any cycle: packets read before it are
        decided on the QP's old context, but do not write it back.
    modify : In(stream.Signature(...))
        ``qpn``, ``state``: the control path moves a QP (QP_MODIFY); always taken. A request
        whose context is read after it (taken by ``packets`` from the next cycle on) sees it.
    mr_commit : In(stream.Signature(...))
        Register or deregister a memory region (``MemoryRegionTable.commit``).
    commands : Out(stream.Signature(Pair(RxWriteCommand)))
        One per packet with payload (``payload_len`` > 0), in packet order: write its
        payload at an address, or discard it.
    responses : Out(stream.Signature(Pair(ResponderAck)))
        ACKs and NAKs to send, and the places of ATOMIC ACKs and READ responses, one or two
        per transfer in packet order; ``qpn`` is the local QP (``AckAddresser`` adds where
        it goes).
    atomics : Out(stream.Signature(Pair(AtomicRequest)))
        Atomics to execute (new) or answer from their record (duplicate), in order.
    rwqe : In(ArrayLayout(GateWqe(max_sge), 2))
        With ``packets``: each lane's receive WQE (``RecvGate``); 0 without one.
    sync : Out(stream.Signature(Pair(RecvSync(num_qps))))
        Per decided packet that held a WQE number: the QP's committed count and a correction
        of the ``RecvQueue``'s numbering, in decision order.
    sync_idle : In(1)
        The ``RecvQueue`` has applied every sync (a lookup waits for it).
    lookup : Out(stream.Signature(RecvLookup(num_qps))), found : In(stream.Signature(RecvWqe(num_qps, max_sge)))
        The QP's next committed WQE, asked while the decision waits for it.
    cqes : Out(stream.Signature(Pair(RecvCqe)))
        Receive completions, in decision order (each with a ``cqe`` fence on ``commands``).
    reads : Out(stream.Signature(Pair(ReadJob)))
        READs to answer (new, or a duplicate again), in order; each is also a fence
        command on ``commands`` (``fence_read``).
    answered : In(1), answered_qpn : In(qp_bits(num_qps))
        A strobe per answer of a new READ or atomic that has left (``ResponseMerge``:
        the READ's first response beat, the ATOMIC ACK), and its QP: the resource it held
        is free again.
    errors : Out(stream.Signature(Pair(unsigned(qp_bits(num_qps)))))
        QPs a fatal error moved to ERR (their receive WQEs are to be flushed: ``RecvFlush``).
    flushed : Out(1), flush_more : Out(1)
        A ``RecvFlush`` request decided (strobe); it completed a receive WQE (WR_FLUSH_ERR).
    rnr_naks : Out(2)
        RNR NAKs decided this cycle (0..2).
    verdict_valid : Out(2), verdict : Out(ArrayLayout(RxVerdict, 2))
        Per lane, one strobe per packet with what became of it (for the counters):
        ACCEPTED or a QP-level verdict (QP_NOT_READY, PSN_DUPLICATE, PSN_OUT_OF_ORDER,
        ACCESS_ERROR, INVALID_REQUEST). Lane 0 is the earlier packet.
    """
    def __init__(self, *, num_qps, num_mrs=1024, pd_bits=24, max_sge=P.RECV_MAX_SGE):
        if not isinstance(num_qps, int) or num_qps < 2 or num_qps & (num_qps - 1):
            raise ValueError(f"num_qps must be a power of two >= 2, not {num_qps!r}")
        if not isinstance(pd_bits, int) or not 1 <= pd_bits <= 32:
            raise ValueError(f"pd_bits must be 1..32, not {pd_bits!r}")
        if not isinstance(max_sge, int) or not 1 <= max_sge <= 7:
            raise ValueError(f"max_sge must be 1..7, not {max_sge!r}")
        self.num_qps, self.num_mrs, self.pd_bits, self.max_sge = num_qps, num_mrs, pd_bits, max_sge
        # one key check per lane: the table's RAM twice, written together
        self._mrts = [MemoryRegionTable(num_mrs=num_mrs, pd_bits=pd_bits, tag_bits=1) for _ in range(2)]
        super().__init__({
            "packets": In(stream.Signature(Pair(RxPacket()))),
            "commit": In(stream.Signature(data.StructLayout({
                "qpn": unsigned(qp_bits(num_qps)), "cfg": ResponderConfig(pd_bits), "epsn": unsigned(PSN_BITS)}))),
            "modify": In(stream.Signature(data.StructLayout({
                "qpn": unsigned(qp_bits(num_qps)), "state": unsigned(3)}))),
            "mr_commit": In(stream.Signature(data.StructLayout({
                "index": unsigned((num_mrs - 1).bit_length()), "region": MrEntry(pd_bits)}))),
            "commands": Out(stream.Signature(Pair(RxWriteCommand))),
            "responses": Out(stream.Signature(Pair(ResponderAck))),
            "atomics": Out(stream.Signature(Pair(AtomicRequest(num_qps)))),
            "reads": Out(stream.Signature(Pair(ReadJob(num_qps)))),
            "rwqe": In(data.ArrayLayout(GateWqe(max_sge), 2)),
            "sync": Out(stream.Signature(Pair(RecvSync(num_qps)))),
            "sync_idle": In(1),
            "lookup": Out(stream.Signature(RecvLookup(num_qps))),
            "found": In(stream.Signature(RecvWqe(num_qps, max_sge))),
            "cqes": Out(stream.Signature(Pair(RecvCqe))),
            "errors": Out(stream.Signature(Pair(unsigned(qp_bits(num_qps))))),
            "flushed": Out(1), "flush_more": Out(1),
            "rnr_naks": Out(2),
            "answered": In(1), "answered_qpn": In(qp_bits(num_qps)),
            "verdict_valid": Out(2),
            "verdict": Out(data.ArrayLayout(RxVerdict, 2)),
        })

    def _decide(self, m, k, p, ctx, status, ctl_state, npkts, answered, att, ovr_valid, ovr):
        """Lane ``k``'s decision on packet ``p`` with QP context ``ctx``, key-check
        ``status``, the state the control path last set (``ctl_state``), for a READ
        REQUEST its response packets (``npkts``), the QP's count of READs and atomics
        answered (``answered``), the receive WQE the gate gave it (``att``) and the one a
        lookup found (``ovr``, when ``ovr_valid``): the new context and what to do (a dict
        of Signals)."""
        entry_layout = ResponderEntry(self.pd_bits, self.max_sge)
        cfg, dyn = ctx.cfg, ctx.dyn

        def sig(name, shape=1):
            return Signal(shape, name=f"{name}{k}")
        new = sig("new", entry_layout)
        m.d.comb += new.eq(ctx)
        verdict, write, respond = sig("verdict", RxVerdict), sig("write"), sig("respond")
        resp_psn, resp_syn, fatal_syn, fatal = sig("resp_psn", PSN_BITS), sig("resp_syn", 8), sig("fatal_syn", 8), sig("fatal")
        is_first, is_last = sig("is_first"), sig("is_last")
        m.d.comb += [
            is_first.eq(_any(p.opcode == op for op in _FIRST_ALL)),
            is_last.eq(_any(p.opcode == op for op in _LAST_ALL)),
        ]
        # two-sided verbs: a SEND; a packet that consumes a receive WQE; the WQE it takes
        # (the QP's spare first, then its own) and the one its message fills
        send, rwr, have, took, rnr = sig("send"), sig("rwr"), sig("have"), sig("took"), sig("rnr")
        len_err, need = sig("len_err"), sig("need")
        wl = GateWqe(self.max_sge)
        taken, wq = sig("taken", wl), sig("wq", wl)
        # the WQE used is number rq_ci: the one the packet holds when that is its number, else
        # the one a lookup found (the decision waits for it: ``need``)
        att_eq, att_eq1 = sig("att_eq"), sig("att_eq1")
        m.d.comb += [att_eq.eq(att.index == dyn.rq_ci), att_eq1.eq(att.index + 1 == dyn.rq_ci)]
        m.d.comb += [
            send.eq(_any(p.opcode == op for op in SEND_OPS)), rwr.eq(is_rwr(p.opcode)),
            taken.eq(Mux(ovr_valid, ovr, att)),
            have.eq(Mux(ovr_valid, ovr.valid, att.valid & att_eq)),
            wq.eq(Mux(is_first, taken, dyn.cur)),
        ]
        cqe, cqe_op, cqe_syn = sig("cqe"), sig("cqe_op", 4), sig("cqe_syn", 8)
        cqe_index, cqe_bytes = sig("cqe_index", 16), sig("cqe_bytes", 32)
        # a SEND's bytes so far, its length rule (rxe check_length) and whether it fits
        soff, send_end = sig("soff", 32), sig("send_end", 33)
        cap = wq.end[self.max_sge - 1]
        send_len_ok, fits = sig("send_len_ok"), sig("fits")
        m.d.comb += [
            soff.eq(Mux(is_first, 0, dyn.recv)), send_end.eq(soff + p.payload_len),
            send_len_ok.eq(Mux(is_last, (p.payload_len <= Const(128, 13) << cfg.mtu)
                               & ((p.payload_len != 0) | is_first),
                               p.payload_len == Const(128, 13) << cfg.mtu)),
            fits.eq(send_end <= cap),
        ]
        # where the payload goes: from the first segment that ends past the message's bytes so
        # far, at that offset in it (the command's piece), on into the segments after it from
        # their starts (``extra``: the pieces a packet over a segment boundary has there, 0
        # bytes in a segment that starts at or before ``soff`` or past the packet's end;
        # RxScatterSplit makes them commands of their own)
        send_addr, send_room = sig("send_addr", 64), sig("send_room", 32)
        for j in reversed(range(self.max_sge)):
            start = wq.end[j - 1] if j else C(0, 32)
            with m.If(soff < wq.end[j]):
                m.d.comb += [send_addr.eq(wq.addr[j] + (soff - start)), send_room.eq(wq.end[j] - soff)]
        wlen = sig("wlen", 13)
        m.d.comb += wlen.eq(Mux(send & (send_room < p.payload_len), send_room, p.payload_len))
        extra = []
        for j in range(1, self.max_sge):
            stop, xlen = sig(f"x{j}_stop", 33), sig(f"x{j}_len", 13)
            m.d.comb += stop.eq(Mux(send_end < wq.end[j], send_end, wq.end[j]))
            with m.If((wq.end[j - 1] > soff) & (stop > wq.end[j - 1])):
                m.d.comb += xlen.eq(stop - wq.end[j - 1])
            extra.append((wq.addr[j], xlen))
        # an atomic: its size (log 2 or 3 bytes, IBTA's always 3) and alignment
        atomic, atomic_dup, size_ok = sig("atomic"), sig("atomic_dup"), sig("size_ok")
        m.d.comb += size_ok.eq(((p.atomic.log_size == 3) & (p.reth.va[:3] == 0))
                               | ((p.atomic.log_size == 2) & (p.reth.va[:2] == 0)))
        read, read_dup = sig("read"), sig("read_dup")    # a READ executed (new, or again)
        read_req = sig("read_req")
        m.d.comb += read_req.eq(p.opcode == F.Op.READ_REQUEST)
        ready_state = sig("ready_state")
        m.d.comb += ready_state.eq(((cfg.state == QpState.RTR) | (cfg.state == QpState.RTS))
                                   & ((ctl_state == QpState.RTR) | (ctl_state == QpState.RTS)))
        # PSN distance, mod 2^24: 0 expected, >= 2^23 behind (duplicate), else a gap.
        dist = sig("dist", PSN_BITS)
        m.d.comb += dist.eq(p.psn - dyn.epsn)
        mtu = sig("mtu", 13)
        m.d.comb += mtu.eq(Const(128, 13) << cfg.mtu)          # ibv_mtu code n: 128 << n bytes
        va, total, off = sig("va", 64), sig("total", 32), sig("off", 32)
        with m.If(is_first):
            m.d.comb += [va.eq(p.reth.va), total.eq(p.reth.dma_len), off.eq(0)]
        with m.Else():
            m.d.comb += [va.eq(dyn.msg_va), total.eq(dyn.msg_len), off.eq(dyn.msg_off)]
        n = p.payload_len
        end = sig("end", 33)
        m.d.comb += end.eq(off + n)
        len_ok = sig("len_ok")
        with m.If(is_last):
            m.d.comb += len_ok.eq((n <= mtu) & (end == total))
        with m.Else():
            m.d.comb += len_ok.eq((n == mtu) & (end < total))
        unacked = sig("unacked", 9)
        m.d.comb += unacked.eq(dyn.unacked + 1)
        every = sig("every", 8)
        m.d.comb += every.eq(Mux(cfg.ack_every == 0, 1, cfg.ack_every))
        # responder resources: the new READs and atomics not yet answered, against the QP's
        # count (an answer counted late only makes the count higher; a count in the upper
        # half is answers of the QP's previous life: none held)
        held, limit, full = sig("held", RESOURCE_COUNT_BITS), sig("limit", 5), sig("full")
        m.d.comb += [
            held.eq(dyn.taken - answered),
            limit.eq(Mux((cfg.max_dest_rd_atomic == 0) | (cfg.max_dest_rd_atomic > P.MAX_DEST_RD_ATOMIC),
                         P.MAX_DEST_RD_ATOMIC, cfg.max_dest_rd_atomic)),
            full.eq(~held[-1] & (held >= limit)),
        ]

        is_flush, err_state = sig("is_flush"), sig("err_state")
        m.d.comb += [is_flush.eq((p.opcode == FLUSH_HELD) | (p.opcode == FLUSH_NEXT)),
                     err_state.eq((cfg.state == QpState.ERR) | (ctl_state == QpState.ERR))]
        with m.If(is_flush):
            pass        # a RecvFlush request: below
        with m.Elif(_is_read_response(p)):
            pass        # the requester's: its payload command's verdict is the ResponseChecker's
        with m.Elif(~ready_state | (p.dqpn >= self.num_qps)):
            m.d.comb += verdict.eq(RxVerdict.QP_NOT_READY)
        with m.Elif((p.sip != cfg.peer_ip) | (p.smac != cfg.peer_mac)):
            m.d.comb += verdict.eq(RxVerdict.WRONG_PEER)
        with m.Elif(dist[PSN_BITS - 1] & p.has_atomic):
            # a retried atomic: answered from the AtomicUnit's replay record (or not at all
            # when it has none), never executed again
            m.d.comb += [verdict.eq(RxVerdict.PSN_DUPLICATE), atomic_dup.eq(1), respond.eq(1),
                         resp_psn.eq(p.psn), resp_syn.eq(Aeth.ACK)]
        with m.Elif(dist[PSN_BITS - 1] & read_req & (status != MrCheck.OK)):
            m.d.comb += [verdict.eq(RxVerdict.ACCESS_ERROR), fatal.eq(1), fatal_syn.eq(Aeth.NAK_REMOTE_ACCESS)]
        with m.Elif(dist[PSN_BITS - 1] & read_req):
            # a retried READ: executed again from its own PSN (its key checked again), with
            # the current MSN; nothing else changes (a READ changes no memory)
            m.d.comb += [verdict.eq(RxVerdict.PSN_DUPLICATE), read_dup.eq(1), respond.eq(1),
                         resp_psn.eq(p.psn), resp_syn.eq(Aeth.ACK)]
        with m.Elif(dist[PSN_BITS - 1]):
            m.d.comb += [verdict.eq(RxVerdict.PSN_DUPLICATE), new.dyn.unacked.eq(0),
                         respond.eq(1), resp_psn.eq(dyn.epsn - 1), resp_syn.eq(Aeth.ACK)]
        with m.Elif(dist != 0):
            m.d.comb += verdict.eq(RxVerdict.PSN_OUT_OF_ORDER)
            with m.If(~dyn.nak_sent):
                m.d.comb += [new.dyn.nak_sent.eq(1), new.dyn.unacked.eq(0),
                             respond.eq(1), resp_psn.eq(dyn.epsn), resp_syn.eq(Aeth.NAK_PSN_SEQ)]
        with m.Elif(read_req & dyn.in_msg):
            m.d.comb += [verdict.eq(RxVerdict.INVALID_REQUEST), fatal.eq(1), fatal_syn.eq(Aeth.NAK_INVALID_REQ)]
        with m.Elif(read_req & (status != MrCheck.OK)):
            m.d.comb += [verdict.eq(RxVerdict.ACCESS_ERROR), fatal.eq(1), fatal_syn.eq(Aeth.NAK_REMOTE_ACCESS)]
        with m.Elif(read_req & full):
            # beyond the responder resources (IBTA: an invalid request)
            m.d.comb += [verdict.eq(RxVerdict.INVALID_REQUEST), fatal.eq(1), fatal_syn.eq(Aeth.NAK_INVALID_REQ)]
        with m.Elif(read_req):
            # its responses (one PSN each) answer every earlier packet
            m.d.comb += [
                new.dyn.taken.eq(dyn.taken + 1),
                verdict.eq(RxVerdict.ACCEPTED), read.eq(1), respond.eq(1), resp_psn.eq(p.psn),
                resp_syn.eq(Aeth.ACK), new.dyn.nak_sent.eq(0), new.dyn.epsn.eq(dyn.epsn + npkts),
                new.dyn.msn.eq(dyn.msn + 1), new.dyn.unacked.eq(0),
            ]
        with m.Elif(p.has_atomic & (dyn.in_msg | ~size_ok)):
            m.d.comb += [verdict.eq(RxVerdict.INVALID_REQUEST), fatal.eq(1), fatal_syn.eq(Aeth.NAK_INVALID_REQ)]
        with m.Elif(p.has_atomic & (status != MrCheck.OK)):
            m.d.comb += [verdict.eq(RxVerdict.ACCESS_ERROR), fatal.eq(1), fatal_syn.eq(Aeth.NAK_REMOTE_ACCESS)]
        with m.Elif(p.has_atomic & full):
            m.d.comb += [verdict.eq(RxVerdict.INVALID_REQUEST), fatal.eq(1), fatal_syn.eq(Aeth.NAK_INVALID_REQ)]
        with m.Elif(p.has_atomic):
            # executed once, by the AtomicUnit; its ATOMIC ACK answers every earlier packet
            m.d.comb += [
                new.dyn.taken.eq(dyn.taken + 1),
                verdict.eq(RxVerdict.ACCEPTED), atomic.eq(1), respond.eq(1), resp_psn.eq(p.psn),
                resp_syn.eq(Aeth.ACK), new.dyn.nak_sent.eq(0), new.dyn.epsn.eq(dyn.epsn + 1),
                new.dyn.msn.eq(dyn.msn + 1), new.dyn.unacked.eq(0),
            ]
        with m.Elif((is_first == dyn.in_msg) | (dyn.in_msg & (dyn.msg_send != send))):
            # FIRST/ONLY inside a message, MIDDLE/LAST outside one or of the other kind
            m.d.comb += [verdict.eq(RxVerdict.INVALID_REQUEST), fatal.eq(1), fatal_syn.eq(Aeth.NAK_INVALID_REQ)]
        with m.Elif(rwr & ~have):
            # no receive WQE: RNR NAK at the packet's PSN; like a sequence NAK it
            # acknowledges every earlier PSN; unlike one it is not the gap's NAK: the next
            # packet ahead gets that (rxe's check_psn, model.responder). Unless the WQE the
            # packet holds is only not the right one: then the lookup decides. A QP without
            # a receive queue (``norq``, the RecvQueue's word with the number) never has one:
            # no lookup (a flood of SENDs to it is RNR NAKed two a cycle, not one in four);
            # nor does a packet whose record says its WQE, number rq_ci, is not posted (``empty``).
            m.d.comb += [need.eq(~ovr_valid & ~att.norq & ~(att.empty & att_eq)),
                         rnr.eq(1), new.dyn.nak_sent.eq(0), new.dyn.unacked.eq(0), respond.eq(1),
                         resp_psn.eq(p.psn), resp_syn.eq(Aeth.RNR_NAK | cfg.min_rnr_timer)]
        with m.Elif(~send & is_first & (status != MrCheck.OK)):
            m.d.comb += [took.eq(rwr), verdict.eq(RxVerdict.ACCESS_ERROR), fatal.eq(1),
                         fatal_syn.eq(Aeth.NAK_REMOTE_ACCESS)]
        with m.Elif(Mux(send, ~send_len_ok, ~len_ok)):
            m.d.comb += [took.eq(rwr), verdict.eq(RxVerdict.INVALID_REQUEST), fatal.eq(1),
                         fatal_syn.eq(Aeth.NAK_INVALID_REQ)]
        with m.Elif(send & ~fits):
            # more than the receive WQE holds: nothing written, the WQE fails LOCAL_LENGTH_ERR
            m.d.comb += [took.eq(rwr), len_err.eq(1), verdict.eq(RxVerdict.INVALID_REQUEST), fatal.eq(1),
                         fatal_syn.eq(Aeth.NAK_INVALID_REQ)]
        with m.Elif(send):
            m.d.comb += [
                took.eq(rwr), verdict.eq(RxVerdict.ACCEPTED), write.eq(n != 0),
                new.dyn.nak_sent.eq(0), new.dyn.epsn.eq(dyn.epsn + 1), new.dyn.in_msg.eq(~is_last),
                new.dyn.msg_send.eq(~is_last), new.dyn.cur.eq(wq), new.dyn.recv.eq(send_end),
                new.dyn.unacked.eq(unacked),
            ]
            with m.If(is_last):
                m.d.comb += [new.dyn.msn.eq(dyn.msn + 1), cqe.eq(1), cqe_index.eq(wq.index), cqe_bytes.eq(send_end),
                             cqe_op.eq(Mux(p.has_imm, F.CqeOp.RESP_SEND_IMM, F.CqeOp.RESP_SEND))]
            with m.If(p.ackreq | is_last | (unacked >= every)):
                m.d.comb += [new.dyn.unacked.eq(0), respond.eq(1), resp_psn.eq(p.psn), resp_syn.eq(Aeth.ACK)]
        with m.Else():
            m.d.comb += [
                verdict.eq(RxVerdict.ACCEPTED), write.eq(n != 0),
                new.dyn.nak_sent.eq(0), new.dyn.epsn.eq(dyn.epsn + 1), new.dyn.in_msg.eq(~is_last),
                new.dyn.msg_va.eq(va), new.dyn.msg_len.eq(total), new.dyn.msg_off.eq(end),
                new.dyn.unacked.eq(unacked), new.dyn.msg_send.eq(0), took.eq(rwr),
            ]
            with m.If(is_last):
                m.d.comb += new.dyn.msn.eq(dyn.msn + 1)
            with m.If(rwr):         # a WRITE with immediate completes the WQE it took
                m.d.comb += [cqe.eq(1), cqe_index.eq(taken.index), cqe_bytes.eq(total),
                             cqe_op.eq(F.CqeOp.RESP_WR_IMM)]
            with m.If(p.ackreq | is_last | (unacked >= every)):
                m.d.comb += [new.dyn.unacked.eq(0), respond.eq(1), resp_psn.eq(p.psn), resp_syn.eq(Aeth.ACK)]
        with m.If(fatal):
            # Class C error: NAK with the offending PSN, nothing executed, QP to error; the
            # receive WQE the message holds completes in error.
            m.d.comb += [new.cfg.state.eq(QpState.ERR), new.dyn.in_msg.eq(0),
                         respond.eq(1), resp_psn.eq(p.psn), resp_syn.eq(fatal_syn)]
            with m.If(took | (dyn.in_msg & dyn.msg_send)):
                m.d.comb += [cqe.eq(1), cqe_op.eq(F.CqeOp.RESP_ERR), cqe_bytes.eq(0),
                             cqe_index.eq(Mux(took, taken.index, dyn.cur.index)),
                             cqe_syn.eq(Mux(len_err, F.Syndrome.LOCAL_LENGTH_ERR,
                                            Mux(fatal_syn == Aeth.NAK_REMOTE_ACCESS, F.Syndrome.REMOTE_ACCESS_ERR,
                                                F.Syndrome.REMOTE_INVAL_REQ_ERR)))]
        # A QP in ERR: its receive WQEs complete with WR_FLUSH_ERR in order (RecvFlush): a flush
        # request completes the WQE of the SEND in progress, else (a FLUSH_NEXT) the QP's next
        # WQE (number rq_ci, looked up when the one it holds is not that one).
        flush_cur, flush_w = sig("flush_cur"), sig("flush_w")
        m.d.comb += [
            flush_cur.eq(is_flush & err_state & dyn.in_msg & dyn.msg_send),
            flush_w.eq((p.opcode == FLUSH_NEXT) & err_state & have & ~flush_cur),
        ]
        with m.If((p.opcode == FLUSH_NEXT) & err_state & ~have & ~flush_cur):
            m.d.comb += need.eq(~ovr_valid)
        with m.If(flush_cur):
            m.d.comb += new.dyn.in_msg.eq(0)
        with m.If(flush_cur | flush_w):
            m.d.comb += [cqe.eq(1), cqe_op.eq(F.CqeOp.RESP_ERR), cqe_bytes.eq(0), cqe_syn.eq(F.Syndrome.WR_FLUSH_ERR),
                         cqe_index.eq(Mux(flush_cur, dyn.cur.index, taken.index))]
        # The receive WQE count, and the sync to the RecvQueue: the packets numbered after
        # this one hold numbers off by ``delta`` unless this one used its own number (or,
        # not using one, held the number before the next one's); a correction goes once per
        # generation (those numbered before it are off by the same amount).
        used = sig("used")
        m.d.comb += used.eq(took | flush_w)
        aligned, correct = sig("aligned"), sig("correct")
        m.d.comb += [
            new.dyn.rq_ci.eq(dyn.rq_ci + used),
            # (an empty record did not move the numbering: aligned when unused and its own)
            aligned.eq(Mux(att.empty, ~used & att_eq, Mux(used, att_eq, att_eq1))),
            # (a QP without a receive queue: its numbers mean nothing, no sync at all)
            # (nor one the gate gave from its cache of empty records: it holds no number)
            correct.eq(rwr & ~att.norq & ~att.cached & (att.gen == dyn.rq_gen) & ~aligned),
            new.dyn.rq_gen.eq(dyn.rq_gen ^ correct),
        ]
        sync = sig("sync", RecvSync(self.num_qps))
        m.d.comb += [sync.qpn.eq(p.dqpn), sync.committed.eq(new.dyn.rq_ci), sync.index.eq(att.index),
                     sync.correct.eq(correct), sync.empty.eq(att.empty)]
        addr = sig("addr", 64)
        m.d.comb += addr.eq(Mux(send, send_addr, va + off))
        return {"new": new, "verdict": verdict, "write": write, "respond": respond,
                "psn": resp_psn, "syndrome": resp_syn, "addr": addr, "rnr": rnr, "wlen": wlen, "extra": extra,
                "send": send, "flush": is_flush, "flush_more": flush_cur | flush_w, "fatal": fatal,
                "need": need, "rwr": rwr, "sync": sync, "has_sync": rwr & (used | correct),
                "cqe": cqe, "cqe_op": cqe_op, "cqe_syn": cqe_syn, "cqe_index": cqe_index, "cqe_bytes": cqe_bytes,
                "atomic": atomic, "atomic_dup": atomic_dup, "read": read | read_dup, "counted": read | atomic}

    def elaborate(self, platform):
        m = Module()
        qb = qp_bits(self.num_qps)
        entry_layout = ResponderEntry(self.pd_bits, self.max_sge)
        mrts = self._mrts
        for k, mrt in enumerate(mrts):
            m.submodules[f"mrt{k}"] = mrt
            m.d.comb += [mrt.commit.valid.eq(self.mr_commit.valid), mrt.commit.p.eq(self.mr_commit.p)]
        m.d.comb += self.mr_commit.ready.eq(mrts[0].commit.ready & mrts[1].commit.ready)
        m.submodules.ctx = ram = Memory(shape=entry_layout, depth=self.num_qps, init=[])
        wr = [ram.write_port() for _ in range(2)]
        wr_new = ram.write_port()       # a create, in any cycle
        rd = [ram.read_port(transparent_for=(*wr, wr_new)) for _ in range(2)]
        # The state the control path set (create, QP_MODIFY), beside the context so that a
        # modify never races a decision's context write.
        m.submodules.ctl_state = ctl_ram = Memory(shape=unsigned(3), depth=self.num_qps, init=[])
        ctl_wr = ctl_ram.write_port()
        ctl_rd = [ctl_ram.read_port(transparent_for=(ctl_wr,)) for _ in range(2)]
        c_ctl = Signal(data.ArrayLayout(unsigned(3), 2))
        # Each QP's count of READs and atomics answered (``answered``), beside the context:
        # a read-modify-write a strobe (the read port is transparent, so strobes of one QP
        # in consecutive cycles add up), cleared by a create.
        m.submodules.answers = ans_ram = Memory(shape=unsigned(RESOURCE_COUNT_BITS), depth=self.num_qps, init=[])
        ans_wr, ans_clear = ans_ram.write_port(), ans_ram.write_port()
        ans_rmw = ans_ram.read_port(transparent_for=(ans_wr, ans_clear))
        ans_rd = [ans_ram.read_port(transparent_for=(ans_wr, ans_clear)) for _ in range(2)]
        ans_qpn, ans_go = Signal(qb), Signal()
        m.d.comb += [ans_rmw.addr.eq(self.answered_qpn), ans_rmw.en.eq(1),
                     ans_wr.addr.eq(ans_qpn), ans_wr.data.eq(ans_rmw.data + 1), ans_wr.en.eq(ans_go)]
        m.d.sync += [ans_qpn.eq(self.answered_qpn), ans_go.eq(self.answered)]
        c_ans = Signal(data.ArrayLayout(unsigned(RESOURCE_COUNT_BITS), 2))
        create = Signal()
        m.d.comb += [self.commit.ready.eq(1), create.eq(self.commit.valid), self.modify.ready.eq(1),
                     ctl_wr.en.eq(create | self.modify.valid),
                     ctl_wr.addr.eq(Mux(create, self.commit.p.qpn, self.modify.p.qpn)),
                     ctl_wr.data.eq(Mux(create, self.commit.p.cfg.state, self.modify.p.state))]

        # Stage B: the pair whose contexts the RAM has read.
        b_pair = Signal(Pair(RxPacket()))
        b_wqe = Signal.like(self.rwqe)
        c_wqe = Signal.like(self.rwqe)
        b_full = Signal()
        # Stage C: in step with the key checks held in the memory-key tables.
        c_pair = Signal(Pair(RxPacket()))
        c_ctx = Signal(data.ArrayLayout(entry_layout, 2))
        # The contexts written by the last pair's decisions (bypass for the next pair);
        # lane 1's is the newer.
        last_qpn = Signal(data.ArrayLayout(unsigned(qb), 2))
        last_ctx = Signal(data.ArrayLayout(entry_layout, 2))
        last_valid = Signal(2)
        # A create is taken in any cycle (the control path never waits on received traffic).
        # Lanes of pairs in stage B or C whose context was read before it are of the QP's
        # old life: they are decided on it, but their context writes are dropped (``kill``).
        b_kill, c_kill = Signal(2), Signal(2)
        new_qp = self.commit.p.qpn

        def created(pair):
            return Cat(*[create & (pair.p[k].dqpn[:qb] == new_qp) for k in range(2)])

        c_go = Signal()                 # stage C decides and leaves this cycle
        b_go = Signal()                 # stage B moves into the key checks
        take = Signal()
        m.d.comb += [
            b_go.eq(b_full & mrts[0].requests.ready),
            self.packets.ready.eq(~b_full | b_go),
            take.eq(self.packets.valid & self.packets.ready),
        ]
        for k in range(2):
            m.d.comb += [rd[k].addr.eq(self.packets.p.p[k].dqpn[:qb]), rd[k].en.eq(self.packets.ready),
                         ans_rd[k].addr.eq(self.packets.p.p[k].dqpn[:qb]), ans_rd[k].en.eq(self.packets.ready),
                         ctl_rd[k].addr.eq(self.packets.p.p[k].dqpn[:qb]), ctl_rd[k].en.eq(self.packets.ready)]
        with m.If(take):
            m.d.sync += [b_pair.eq(self.packets.p), b_wqe.eq(self.rwqe), b_full.eq(1), b_kill.eq(0)]   # read now: sees a create
        with m.Elif(b_go):
            m.d.sync += b_full.eq(0)
        with m.Else():
            m.d.sync += b_kill.eq(b_kill | created(b_pair))

        # The key checks, in lockstep (same valid and ready, so the same occupancy): only
        # FIRST/ONLY (the WRITEs with a RETH); MIDDLE/LAST, and an absent lane 1, ask for
        # length 0, which the table answers OK.
        for k, mrt in enumerate(mrts):
            bp = b_pair.p[k]
            present = 1 if k == 0 else b_pair.second
            m.d.comb += [
                mrt.requests.valid.eq(b_full),
                mrt.requests.p.key.eq(bp.reth.rkey),
                mrt.requests.p.addr.eq(bp.reth.va),
                mrt.requests.p.length.eq(Mux(present & bp.has_reth, bp.reth.dma_len,
                                             Mux(present & bp.has_atomic, C(1, 4) << bp.atomic.log_size[:2], 0))),
                mrt.requests.p.access.eq(Mux(bp.has_atomic, F.Access.REMOTE_ATOMIC,
                                             Mux(bp.opcode == F.Op.READ_REQUEST, F.Access.REMOTE_READ,
                                                 F.Access.REMOTE_WRITE))),
                mrt.requests.p.pd.eq(rd[k].data.cfg.pd),
            ]
        # A READ REQUEST's response packets, ceil(length / MTU) and at least one (the MTU
        # does not change but by a create, so the context read here holds it)
        c_npkts = Signal(data.ArrayLayout(unsigned(PSN_BITS), 2))
        b_npkts = []
        for k in range(2):
            n_ = Signal(PSN_BITS, name=f"b_npkts{k}")
            less = Signal(32, name=f"b_len1_{k}")
            m.d.comb += less.eq(b_pair.p[k].reth.dma_len - 1)
            with m.Switch(rd[k].data.cfg.mtu):
                for code in range(1, 6):
                    with m.Case(code):
                        m.d.comb += n_.eq((less >> (7 + code)) + 1)
                with m.Default():
                    m.d.comb += n_.eq((less >> 12) + 1)
            with m.If(b_pair.p[k].reth.dma_len == 0):
                m.d.comb += n_.eq(1)
            b_npkts.append(n_)
        with m.If(b_go):
            m.d.sync += [c_npkts[0].eq(b_npkts[0]), c_npkts[1].eq(b_npkts[1]),
                         c_pair.eq(b_pair), c_wqe.eq(b_wqe), c_kill.eq(b_kill | created(b_pair)),
                         c_ctx[0].eq(rd[0].data), c_ctx[1].eq(rd[1].data),
                         c_ctl[0].eq(ctl_rd[0].data), c_ctl[1].eq(ctl_rd[1].data),
                         c_ans[0].eq(ans_rd[0].data), c_ans[1].eq(ans_rd[1].data)]

        # ---- stage C: decide -------------------------------------------------------------
        p = [c_pair.p[0], c_pair.p[1]]
        present = [C(1, 1), c_pair.second]
        qp = [p[k].dqpn[:qb] for k in range(2)]
        in_table = [p[k].dqpn < self.num_qps for k in range(2)]
        same = Signal()
        m.d.comb += same.eq(c_pair.second & (p[0].dqpn == p[1].dqpn))
        ctx = [Signal(entry_layout, name=f"ctx{k}") for k in range(2)]
        bypassed = []
        for k in range(2):
            b = Signal(entry_layout, name=f"bypassed{k}")
            m.d.comb += b.eq(Mux(last_valid[1] & (last_qpn[1] == qp[k]), last_ctx[1],
                                 Mux(last_valid[0] & (last_qpn[0] == qp[k]), last_ctx[0], c_ctx[k])))
            bypassed.append(b)
        m.d.comb += ctx[0].eq(bypassed[0])
        # A lane whose decision needs the QP's next receive WQE and does not hold it waits
        # (the whole stage: the lanes decide together) while the RecvQueue looks it up; the
        # WQE found stays with the lane until the pair leaves.
        ovr_valid = Signal(2)
        ovr = Signal(data.ArrayLayout(GateWqe(self.max_sge), 2))
        d0 = self._decide(m, 0, p[0], ctx[0], mrts[0].results.p.status, c_ctl[0], c_npkts[0], c_ans[0], c_wqe[0],
                          ovr_valid[0], ovr[0])
        m.d.comb += ctx[1].eq(Mux(same, d0["new"], bypassed[1]))       # chained on lane 0
        w1 = Signal(GateWqe(self.max_sge))
        m.d.comb += w1.eq(Mux(present[1], c_wqe[1], 0))
        d1 = self._decide(m, 1, p[1], ctx[1], mrts[1].results.p.status, c_ctl[1], c_npkts[1], c_ans[1], w1,
                          ovr_valid[1], ovr[1])
        dec = [d0, d1]
        need = [present[k] & dec[k]["need"] for k in range(2)]
        need_any = Signal()
        m.d.comb += need_any.eq(mrts[0].results.valid & (need[0] | need[1]))
        lk_busy = Signal()              # a lookup asked, its answer not yet here
        lk_lane = Signal()
        lane = ~need[0]                 # lane 0 first: lane 1's decision is chained on it
        m.d.comb += [
            # only once the RecvQueue applied every sync before (its committed count is the
            # responder's: the WQE asked for has its slot)
            self.lookup.valid.eq(need_any & ~lk_busy & self.sync_idle),
            self.lookup.p.qpn.eq(Mux(lane, qp[1], qp[0])),
            self.lookup.p.index.eq(Mux(lane, ctx[1].dyn.rq_ci, ctx[0].dyn.rq_ci)),
            self.found.ready.eq(lk_busy),
        ]
        with m.If(self.lookup.valid & self.lookup.ready):
            m.d.sync += [lk_busy.eq(1), lk_lane.eq(lane)]
        found = gate_wqe(m, self.found.p, self.max_sge, name="found")
        with m.If(self.found.valid & self.found.ready):
            m.d.sync += lk_busy.eq(0)
            with m.If(lk_lane):
                m.d.sync += [ovr[1].eq(found), ovr_valid[1].eq(1)]
            with m.Else():
                m.d.sync += [ovr[0].eq(found), ovr_valid[0].eq(1)]
        with m.If(c_go):
            m.d.sync += ovr_valid.eq(0)

        # Outputs: registered, so no valid depends on a ready; the pair decides when every
        # output has room. Payload commands and responses are packed to the front.
        cmd, resp, ato, rds, cqs, errs = self.commands, self.responses, self.atomics, self.reads, self.cqes, self.errors
        syn = self.sync
        out_ready = Signal()
        m.d.comb += [
            out_ready.eq((~cmd.valid | cmd.ready) & (~resp.valid | resp.ready) & (~ato.valid | ato.ready)
                         & (~rds.valid | rds.ready) & (~cqs.valid | cqs.ready) & (~errs.valid | errs.ready)
                         & (~syn.valid | syn.ready) & ~need_any),
            mrts[0].results.ready.eq(out_ready), mrts[1].results.ready.eq(out_ready),
            c_go.eq(mrts[0].results.valid & out_ready),
        ]
        for k in range(2):
            m.d.comb += [self.verdict_valid[k].eq(c_go & present[k] & ~_is_read_response(p[k]) & ~dec[k]["rnr"]
                                                  & ~dec[k]["flush"]),
                         self.verdict[k].eq(dec[k]["verdict"])]
        # RNR NAKs (no verdict counter: rnr_naks_sent), 0..2 a cycle
        m.d.comb += self.rnr_naks.eq(sum(c_go & present[k] & dec[k]["rnr"] for k in range(2)))
        # the responder's answer to a flush request (RecvFlush: one in flight, alone in its pair)
        m.d.comb += [self.flushed.eq(c_go & _any(present[k] & dec[k]["flush"] for k in range(2))),
                     self.flush_more.eq(_any(present[k] & dec[k]["flush"] & dec[k]["flush_more"] for k in range(2)))]
        # a QP a fatal error moved to ERR: its receive WQEs are flushed (RecvFlush)
        to_err = [present[k] & dec[k]["fatal"] for k in range(2)]
        for s_ in (cmd, resp, ato, rds, cqs, errs, syn):
            with m.If(s_.valid & s_.ready):
                m.d.sync += s_.valid.eq(0)
        # An atomic (new or retried) goes to the AtomicUnit, and a fence to the write path:
        # the AtomicUnit reads its word only once every write before it has landed.
        # A READ (new or again) likewise, to the READ response source: its payload is read
        # once every write before it has landed.
        to_unit = [present[k] & (dec[k]["atomic"] | dec[k]["atomic_dup"]) for k in range(2)]
        to_read = [present[k] & dec[k]["read"] for k in range(2)]
        fenced = [to_unit[k] | to_read[k] for k in range(2)]
        # (every READ RESPONSE gets one: its verdict, and its READ's completion, join it later)
        rresp = [present[k] & _is_read_response(p[k]) for k in range(2)]
        # a receive completion: a CQE fence after the packet's write (or alone)
        has_cqe = [present[k] & dec[k]["cqe"] for k in range(2)]
        has_cmd = [present[k] & ((p[k].payload_len != 0) | fenced[k] | rresp[k] | dec[k]["cqe"]) for k in range(2)]
        has_resp = [present[k] & dec[k]["respond"] for k in range(2)]
        has_sync = [present[k] & dec[k]["has_sync"] for k in range(2)]
        cmds, resps, atos, jobs, cqes = [], [], [], [], []
        for k in range(2):
            c_ = Signal(RxWriteCommand, name=f"cmd{k}")
            m.d.comb += [c_.write.eq(dec[k]["write"]), c_.addr.eq(dec[k]["addr"]),
                         c_.offset.eq(p[k].payload_offset), c_.length.eq(dec[k]["wlen"]),
                         c_.inline.eq(p[k].inline | fenced[k] | (rresp[k] & (p[k].payload_len == 0))
                                      | (dec[k]["cqe"] & (p[k].payload_len == 0))),
                         c_.cqe.eq(dec[k]["cqe"]),
                         *[c_.extra[j].addr.eq(a) for j, (a, _) in enumerate(dec[k]["extra"])],
                         *[c_.extra[j].length.eq(Mux(dec[k]["write"] & dec[k]["send"], n_, 0))
                           for j, (_, n_) in enumerate(dec[k]["extra"])],
                         c_.fence.eq(fenced[k]), c_.fence_read.eq(to_read[k]), c_.read_response.eq(rresp[k]),
                         c_.data.eq(p[k].inline_data), c_.qp.eq(p[k].dqpn)]
            r_ = Signal(ResponderAck, name=f"resp{k}")
            m.d.comb += [r_.qpn.eq(p[k].dqpn), r_.psn.eq(dec[k]["psn"]), r_.syndrome.eq(dec[k]["syndrome"]),
                         r_.msn.eq(dec[k]["new"].dyn.msn), r_.atomic.eq(to_unit[k]), r_.read.eq(to_read[k]),
                         r_.counted.eq(dec[k]["counted"])]
            j_ = Signal(ReadJob(self.num_qps), name=f"read{k}")
            m.d.comb += [j_.qpn.eq(p[k].dqpn[:qb]), j_.psn.eq(p[k].psn), j_.va.eq(p[k].reth.va),
                         j_.length.eq(p[k].reth.dma_len), j_.msn.eq(dec[k]["new"].dyn.msn), j_.mtu.eq(ctx[k].cfg.mtu)]
            a_ = Signal(AtomicRequest(self.num_qps), name=f"atomic{k}")
            m.d.comb += [a_.qpn.eq(p[k].dqpn[:qb]), a_.psn.eq(p[k].psn), a_.duplicate.eq(dec[k]["atomic_dup"]),
                         a_.wide.eq(p[k].atomic.log_size == 3), a_.va.eq(p[k].reth.va),
                         a_.msn.eq(dec[k]["new"].dyn.msn),
                         a_.op0.eq(p[k].atomic.ops[0]), a_.op1.eq(p[k].atomic.ops[1]),
                         a_.op2.eq(p[k].atomic.ops[2]), a_.op3.eq(p[k].atomic.ops[3])]
            with m.Switch(p[k].opcode):
                for op, aop in _ATOMIC_OP.items():
                    with m.Case(op):
                        m.d.comb += a_.op.eq(aop)
            q_ = Signal(RecvCqe, name=f"cqe{k}")
            m.d.comb += [q_.qpn.eq(p[k].dqpn), q_.cqn.eq(ctx[k].cfg.rcqn), q_.user_index.eq(ctx[k].cfg.user_index),
                         q_.opcode.eq(dec[k]["cqe_op"]), q_.syndrome.eq(dec[k]["cqe_syn"]),
                         q_.index.eq(dec[k]["cqe_index"]), q_.byte_cnt.eq(dec[k]["cqe_bytes"]),
                         q_.imm.eq(Mux(dec[k]["cqe_op"] == F.CqeOp.RESP_ERR, 0, p[k].imm)), q_.se.eq(p[k].se & (dec[k]["cqe_op"] != F.CqeOp.RESP_ERR))]
            cqes.append(q_)
            cmds.append(c_)
            resps.append(r_)
            atos.append(a_)
            jobs.append(j_)
        with m.If(c_go):
            m.d.sync += [cmd.valid.eq(has_cmd[0] | has_cmd[1]), *pack_pair(cmd.p, has_cmd, cmds),
                         resp.valid.eq(has_resp[0] | has_resp[1]), *pack_pair(resp.p, has_resp, resps),
                         ato.valid.eq(to_unit[0] | to_unit[1]), *pack_pair(ato.p, to_unit, atos),
                         rds.valid.eq(to_read[0] | to_read[1]), *pack_pair(rds.p, to_read, jobs),
                         cqs.valid.eq(has_cqe[0] | has_cqe[1]), *pack_pair(cqs.p, has_cqe, cqes),
                         errs.valid.eq(to_err[0] | to_err[1]), *pack_pair(errs.p, to_err, qp),
                         syn.valid.eq(has_sync[0] | has_sync[1]),
                         *pack_pair(syn.p, has_sync, [dec[k]["sync"] for k in range(2)])]

        # Context writes: the decisions (lane 0's only when lane 1 is of another QP; none of
        # a lane read before a create of its QP), and a QP create from the control path.
        with m.If(~c_go):
            m.d.sync += c_kill.eq(c_kill | created(c_pair))
        kill = Signal(2)
        m.d.comb += kill.eq(c_kill | created(c_pair))
        writes = [c_go & in_table[0] & ~same & ~kill[0], c_go & present[1] & in_table[1] & ~kill[1]]
        for k in range(2):
            m.d.comb += [wr[k].addr.eq(qp[k]), wr[k].data.eq(dec[k]["new"])]
            with m.If(writes[k]):
                m.d.comb += wr[k].en.eq(1)
        with m.If(c_go):
            m.d.sync += [last_valid.eq(Cat(*writes)), last_qpn[0].eq(qp[0]), last_qpn[1].eq(qp[1]),
                         last_ctx[0].eq(dec[0]["new"]), last_ctx[1].eq(dec[1]["new"])]
        with m.Elif(create):
            m.d.sync += last_valid.eq(last_valid & ~Cat(*[last_qpn[k] == new_qp for k in range(2)]))
        fresh = Signal(entry_layout)
        # every bit assigned: bits a process never drives come out undriven (X in Icarus)
        m.d.comb += [fresh.eq(0), fresh.cfg.eq(self.commit.p.cfg), fresh.dyn.epsn.eq(self.commit.p.epsn),
                     wr_new.en.eq(create), wr_new.addr.eq(new_qp), wr_new.data.eq(fresh),
                     ans_clear.en.eq(create), ans_clear.addr.eq(new_qp), ans_clear.data.eq(0)]
        return m
