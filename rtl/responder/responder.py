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

__all__ = ["Responder", "ResponderAck", "ReadJob", "ResponderConfig", "ResponderEntry", "RxVerdict", "RX_VERDICT_NAMES"]

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
    })       # (where ACKs go is the ``AckAddresser``'s)


ResponderDynamic = data.StructLayout({
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
})


def ResponderEntry(pd_bits):
    return data.StructLayout({"cfg": ResponderConfig(pd_bits), "dyn": ResponderDynamic})


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

    Parameters
    ----------
    num_qps : int
        QPs in the context RAM (a power of two >= 2).
    num_mrs : int
        Regions in the memory-key table.
    pd_bits : int
        Width of protection-domain numbers.

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
    reads : Out(stream.Signature(Pair(ReadJob)))
        READs to answer (new, or a duplicate again), in order; each is also a fence
        command on ``commands`` (``fence_read``).
    answered : In(1), answered_qpn : In(qp_bits(num_qps))
        A strobe per answer of a new READ or atomic that has left (``ResponseMerge``:
        the READ's first response beat, the ATOMIC ACK), and its QP: the resource it held
        is free again.
    verdict_valid : Out(2), verdict : Out(ArrayLayout(RxVerdict, 2))
        Per lane, one strobe per packet with what became of it (for the counters):
        ACCEPTED or a QP-level verdict (QP_NOT_READY, PSN_DUPLICATE, PSN_OUT_OF_ORDER,
        ACCESS_ERROR, INVALID_REQUEST). Lane 0 is the earlier packet.
    """
    def __init__(self, *, num_qps, num_mrs=1024, pd_bits=24):
        if not isinstance(num_qps, int) or num_qps < 2 or num_qps & (num_qps - 1):
            raise ValueError(f"num_qps must be a power of two >= 2, not {num_qps!r}")
        if not isinstance(pd_bits, int) or not 1 <= pd_bits <= 32:
            raise ValueError(f"pd_bits must be 1..32, not {pd_bits!r}")
        self.num_qps, self.num_mrs, self.pd_bits = num_qps, num_mrs, pd_bits
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
            "answered": In(1), "answered_qpn": In(qp_bits(num_qps)),
            "verdict_valid": Out(2),
            "verdict": Out(data.ArrayLayout(RxVerdict, 2)),
        })

    def _decide(self, m, k, p, ctx, status, ctl_state, npkts, answered):
        """Lane ``k``'s decision on packet ``p`` with QP context ``ctx``, key-check
        ``status``, the state the control path last set (``ctl_state``), for a READ
        REQUEST its response packets (``npkts``), and the QP's count of READs and atomics
        answered (``answered``): the new context and what to do (a dict of Signals)."""
        entry_layout = ResponderEntry(self.pd_bits)
        cfg, dyn = ctx.cfg, ctx.dyn

        def sig(name, shape=1):
            return Signal(shape, name=f"{name}{k}")
        new = sig("new", entry_layout)
        m.d.comb += new.eq(ctx)
        verdict, write, respond = sig("verdict", RxVerdict), sig("write"), sig("respond")
        resp_psn, resp_syn, fatal_syn, fatal = sig("resp_psn", PSN_BITS), sig("resp_syn", 8), sig("fatal_syn", 8), sig("fatal")
        is_first, is_last = sig("is_first"), sig("is_last")
        m.d.comb += [
            is_first.eq(_any(p.opcode == op for op in F.FIRST_OPS)),
            is_last.eq(_any(p.opcode == op for op in F.LAST_OPS)),
        ]
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

        with m.If(_is_read_response(p)):
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
        with m.Elif(is_first == dyn.in_msg):
            m.d.comb += [verdict.eq(RxVerdict.INVALID_REQUEST), fatal.eq(1), fatal_syn.eq(Aeth.NAK_INVALID_REQ)]
        with m.Elif(is_first & (status != MrCheck.OK)):
            m.d.comb += [verdict.eq(RxVerdict.ACCESS_ERROR), fatal.eq(1), fatal_syn.eq(Aeth.NAK_REMOTE_ACCESS)]
        with m.Elif(~len_ok):
            m.d.comb += [verdict.eq(RxVerdict.INVALID_REQUEST), fatal.eq(1), fatal_syn.eq(Aeth.NAK_INVALID_REQ)]
        with m.Else():
            m.d.comb += [
                verdict.eq(RxVerdict.ACCEPTED), write.eq(n != 0),
                new.dyn.nak_sent.eq(0), new.dyn.epsn.eq(dyn.epsn + 1), new.dyn.in_msg.eq(~is_last),
                new.dyn.msg_va.eq(va), new.dyn.msg_len.eq(total), new.dyn.msg_off.eq(end),
                new.dyn.unacked.eq(unacked),
            ]
            with m.If(is_last):
                m.d.comb += new.dyn.msn.eq(dyn.msn + 1)
            with m.If(p.ackreq | is_last | (unacked >= every)):
                m.d.comb += [new.dyn.unacked.eq(0), respond.eq(1), resp_psn.eq(p.psn), resp_syn.eq(Aeth.ACK)]
        with m.If(fatal):
            # Class C error: NAK with the offending PSN, nothing executed, QP to error.
            m.d.comb += [new.cfg.state.eq(QpState.ERR), new.dyn.in_msg.eq(0),
                         respond.eq(1), resp_psn.eq(p.psn), resp_syn.eq(fatal_syn)]
        addr = sig("addr", 64)
        m.d.comb += addr.eq(va + off)
        return {"new": new, "verdict": verdict, "write": write, "respond": respond,
                "psn": resp_psn, "syndrome": resp_syn, "addr": addr,
                "atomic": atomic, "atomic_dup": atomic_dup, "read": read | read_dup, "counted": read | atomic}

    def elaborate(self, platform):
        m = Module()
        qb = qp_bits(self.num_qps)
        entry_layout = ResponderEntry(self.pd_bits)
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
            m.d.sync += [b_pair.eq(self.packets.p), b_full.eq(1), b_kill.eq(0)]   # read now: sees a create
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
                         c_pair.eq(b_pair), c_kill.eq(b_kill | created(b_pair)),
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
        d0 = self._decide(m, 0, p[0], ctx[0], mrts[0].results.p.status, c_ctl[0], c_npkts[0], c_ans[0])
        m.d.comb += ctx[1].eq(Mux(same, d0["new"], bypassed[1]))       # chained on lane 0
        d1 = self._decide(m, 1, p[1], ctx[1], mrts[1].results.p.status, c_ctl[1], c_npkts[1], c_ans[1])
        dec = [d0, d1]

        # Outputs: registered, so no valid depends on a ready; the pair decides when every
        # output has room. Payload commands and responses are packed to the front.
        cmd, resp, ato, rds = self.commands, self.responses, self.atomics, self.reads
        out_ready = Signal()
        m.d.comb += [
            out_ready.eq((~cmd.valid | cmd.ready) & (~resp.valid | resp.ready) & (~ato.valid | ato.ready)
                         & (~rds.valid | rds.ready)),
            mrts[0].results.ready.eq(out_ready), mrts[1].results.ready.eq(out_ready),
            c_go.eq(mrts[0].results.valid & out_ready),
        ]
        for k in range(2):
            m.d.comb += [self.verdict_valid[k].eq(c_go & present[k] & ~_is_read_response(p[k])),
                         self.verdict[k].eq(dec[k]["verdict"])]
        for s_ in (cmd, resp, ato, rds):
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
        has_cmd = [present[k] & ((p[k].payload_len != 0) | fenced[k] | rresp[k]) for k in range(2)]
        has_resp = [present[k] & dec[k]["respond"] for k in range(2)]
        cmds, resps, atos, jobs = [], [], [], []
        for k in range(2):
            c_ = Signal(RxWriteCommand, name=f"cmd{k}")
            m.d.comb += [c_.write.eq(dec[k]["write"]), c_.addr.eq(dec[k]["addr"]),
                         c_.offset.eq(p[k].payload_offset), c_.length.eq(p[k].payload_len),
                         c_.inline.eq(p[k].inline | fenced[k] | (rresp[k] & (p[k].payload_len == 0))),
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
            cmds.append(c_)
            resps.append(r_)
            atos.append(a_)
            jobs.append(j_)
        with m.If(c_go):
            m.d.sync += [cmd.valid.eq(has_cmd[0] | has_cmd[1]), *pack_pair(cmd.p, has_cmd, cmds),
                         resp.valid.eq(has_resp[0] | has_resp[1]), *pack_pair(resp.p, has_resp, resps),
                         ato.valid.eq(to_unit[0] | to_unit[1]), *pack_pair(ato.p, to_unit, atos),
                         rds.valid.eq(to_read[0] | to_read[1]), *pack_pair(rds.p, to_read, jobs)]

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
