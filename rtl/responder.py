"""RC responder: per-QP PSN check, memory-key check and ACK/NAK decisions for received
RDMA WRITE requests (``RxDispatch`` takes frame-level drops and received ACK/NAKs)."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, enum, stream
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from spec import formats as F
from spec.formats import Aeth, MrCheck, Op, QpState
from .ack_builder import AckRequest
from .contexts import qp_bits
from .mr_table import MemoryRegionTable, MrEntry
from .rx_packet import RxPacket
from .rx_payload_writer import RxWriteCommand

__all__ = ["Responder", "ResponderConfig", "ResponderEntry", "RxVerdict", "RX_VERDICT_NAMES", "ReceivedAck"]

PSN_BITS = 24


class RxVerdict(enum.Enum, shape=4):
    """What became of one received frame (one counter each).

    The names of all the receive counters; the ``Responder`` itself only gives
    ACCEPTED and the QP-level verdicts (QP_NOT_READY and after): ``RxDispatch`` counts
    ACKs received and the frame-level drops (BAD_LENGTH..BAD_OPCODE)."""
    ACCEPTED = 0            # a WRITE packet executed
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


# model.rc names (``DROP_REASONS`` and its counters) of each verdict.
RX_VERDICT_NAMES = {
    RxVerdict.ACCEPTED: "accepted", RxVerdict.ACK_RECEIVED: "ack_received",
    RxVerdict.BAD_LENGTH: "bad_length", RxVerdict.NOT_ROCE: "not_roce",
    RxVerdict.BAD_IP_CHECKSUM: "bad_ip_checksum", RxVerdict.BAD_ICRC: "bad_icrc",
    RxVerdict.BAD_PKEY: "bad_pkey", RxVerdict.BAD_OPCODE: "bad_opcode",
    RxVerdict.QP_NOT_READY: "qp_not_ready", RxVerdict.PSN_DUPLICATE: "psn_duplicate",
    RxVerdict.PSN_OUT_OF_ORDER: "psn_out_of_order", RxVerdict.ACCESS_ERROR: "access_error",
    RxVerdict.INVALID_REQUEST: "invalid_request",
}

def ResponderConfig(pd_bits):
    """What the CPU writes for a QP's receive side (with the QP's create)."""
    return data.StructLayout({
        "state":      unsigned(3),      # ibv_qp_state: RTR and RTS accept packets
        "pd":         unsigned(pd_bits),
        "ack_every":  unsigned(8),      # ACK coalescing: one ACK per this many packets (0 counts as 1)
        "mtu":        unsigned(3),      # ibv_mtu code 1..5
        "remote_qpn": unsigned(24),     # the requester's QP: destination of ACKs
        "dmac":       unsigned(48),
        "dip":        unsigned(32),
    })


ResponderDynamic = data.StructLayout({
    "epsn":     unsigned(PSN_BITS),     # expected PSN
    "msn":      unsigned(24),           # messages completed
    "unacked":  unsigned(8),            # accepted packets not yet covered by an ACK
    "nak_sent": unsigned(1),            # a PSN-sequence NAK went out for the current gap
    "in_msg":   unsigned(1),            # between a FIRST and its LAST
    "msg_va":   unsigned(64),           # the message's RETH address and length,
    "msg_len":  unsigned(32),           # and the bytes received so far
    "msg_off":  unsigned(32),
})


def ResponderEntry(pd_bits):
    return data.StructLayout({"cfg": ResponderConfig(pd_bits), "dyn": ResponderDynamic})


# A received ACK/NAK frame, as ``RxDispatch`` passes it to the requester side.
ReceivedAck = data.StructLayout({
    "qpn": unsigned(24), "psn": unsigned(PSN_BITS), "syndrome": unsigned(8), "msn": unsigned(24),
})



class Responder(wiring.Component):
    """The receive side of the RC transport for RDMA WRITE requests, one packet per cycle.

    It sees only the WRITE requests that passed the frame-level checks: ``RxDispatch``
    counts the frames dropped at frame level and passes received ACK/NAKs to the
    requester side. Every request's descriptor gets exactly one payload command (write
    or discard), so the payload writer stays in step with the request frames' beats; a
    request may also produce an ACK/NAK to send. The rules are those of ``model/rc.py``
    (``RcResponder.receive``, for the frames that pass its frame-level checks):

    - a QP accepts packets in RTR or RTS;
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

    Pipeline: the QP context is read from RAM when a descriptor is taken (stage B), the
    key check runs in the memory-key table (stage C), the decision and the context
    write are in stage C. A packet of the same QP as the one decided just before it
    takes that one's new context from a bypass register, so back-to-back packets of
    one QP go at one per cycle.

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
    packets : In(stream.Signature(RxPacket()))
        Descriptors of the received WRITE requests, in order: only ``drop`` = NONE and
        opcode WRITE FIRST/MIDDLE/LAST/LAST_IMM/ONLY/ONLY_IMM (``RxDispatch.requests``);
        other frames are not checked for here and must not be sent.
    commit : In(stream.Signature(...))
        ``qpn`` and ``cfg`` (``ResponderConfig``), ``epsn``: create a QP's receive side
        (its dynamic state is reset). Taken only while no packet is in flight.
    mr_commit : In(stream.Signature(...))
        Register or deregister a memory region (``MemoryRegionTable.commit``).
    commands : Out(stream.Signature(RxWriteCommand))
        One per packet: write its payload at an address, or discard it.
    responses : Out(stream.Signature(AckRequest(num_qps)))
        ACKs and NAKs to send.
    verdict_valid : Out(1), verdict : Out(RxVerdict)
        One strobe per packet with what became of it (for the counters): ACCEPTED or
        a QP-level verdict (QP_NOT_READY, PSN_DUPLICATE, PSN_OUT_OF_ORDER,
        ACCESS_ERROR, INVALID_REQUEST).
    """
    def __init__(self, *, num_qps, num_mrs=1024, pd_bits=24):
        if not isinstance(num_qps, int) or num_qps < 2 or num_qps & (num_qps - 1):
            raise ValueError(f"num_qps must be a power of two >= 2, not {num_qps!r}")
        if not isinstance(pd_bits, int) or not 1 <= pd_bits <= 32:
            raise ValueError(f"pd_bits must be 1..32, not {pd_bits!r}")
        self.num_qps, self.num_mrs, self.pd_bits = num_qps, num_mrs, pd_bits
        self._mrt = MemoryRegionTable(num_mrs=num_mrs, pd_bits=pd_bits, tag_bits=1)
        super().__init__({
            "packets": In(stream.Signature(RxPacket())),
            "commit": In(stream.Signature(data.StructLayout({
                "qpn": unsigned(qp_bits(num_qps)), "cfg": ResponderConfig(pd_bits), "epsn": unsigned(PSN_BITS)}))),
            "mr_commit": In(stream.Signature(data.StructLayout({
                "index": unsigned((num_mrs - 1).bit_length()), "region": MrEntry(pd_bits)}))),
            "commands": Out(stream.Signature(RxWriteCommand)),
            "responses": Out(stream.Signature(AckRequest(num_qps))),
            "verdict_valid": Out(1),
            "verdict": Out(RxVerdict),
        })

    def elaborate(self, platform):
        m = Module()
        qb = qp_bits(self.num_qps)
        entry_layout = ResponderEntry(self.pd_bits)
        m.submodules.mrt = mrt = self._mrt
        wiring.connect(m, wiring.flipped(self.mr_commit), mrt.commit)
        m.submodules.ctx = ram = Memory(shape=entry_layout, depth=self.num_qps, init=[])
        wr = ram.write_port()
        rd = ram.read_port(transparent_for=(wr,))

        # Stage B: the descriptor whose context the RAM has read.
        b_pkt = Signal(RxPacket())
        b_full = Signal()
        # Stage C: in step with the key check held in the memory-key table.
        c_pkt = Signal(RxPacket())
        c_ctx = Signal(entry_layout)
        # The context written by the last decision (bypass for the next packet).
        last_qpn = Signal(qb)
        last_ctx = Signal(entry_layout)
        last_valid = Signal()

        c_go = Signal()                 # stage C decides and leaves this cycle
        b_go = Signal()                 # stage B moves into the key check
        take = Signal()
        m.d.comb += [
            b_go.eq(b_full & mrt.requests.ready),
            self.packets.ready.eq(~b_full | b_go),
            take.eq(self.packets.valid & self.packets.ready),
            rd.addr.eq(self.packets.p.dqpn[:qb]),
            rd.en.eq(self.packets.ready),
        ]
        with m.If(take):
            m.d.sync += [b_pkt.eq(self.packets.p), b_full.eq(1)]
        with m.Elif(b_go):
            m.d.sync += b_full.eq(0)

        # The key check: only FIRST/ONLY (the WRITEs with a RETH); MIDDLE/LAST ask for
        # length 0, which the table answers OK.
        m.d.comb += [
            mrt.requests.valid.eq(b_full),
            mrt.requests.p.key.eq(b_pkt.reth.rkey),
            mrt.requests.p.addr.eq(b_pkt.reth.va),
            mrt.requests.p.length.eq(Mux(b_pkt.has_reth, b_pkt.reth.dma_len, 0)),
            mrt.requests.p.access.eq(F.Access.REMOTE_WRITE),
            mrt.requests.p.pd.eq(rd.data.cfg.pd),
        ]
        with m.If(b_go):
            m.d.sync += [c_pkt.eq(b_pkt), c_ctx.eq(rd.data)]

        # ---- stage C: decide ------------------------------------------------------------
        p = c_pkt
        ctx = Signal(entry_layout)
        m.d.comb += ctx.eq(Mux(last_valid & (last_qpn == p.dqpn[:qb]), last_ctx, c_ctx))
        cfg, dyn = ctx.cfg, ctx.dyn
        status = mrt.results.p.status

        new = Signal(entry_layout)
        m.d.comb += new.eq(ctx)
        verdict = Signal(RxVerdict)
        write = Signal()
        respond = Signal()
        resp_psn = Signal(PSN_BITS)
        resp_syn = Signal(8)
        fatal_syn = Signal(8)
        fatal = Signal()

        is_first = Signal()
        is_last = Signal()
        m.d.comb += [
            is_first.eq((p.opcode == Op.WRITE_FIRST) | (p.opcode == Op.WRITE_ONLY) | (p.opcode == Op.WRITE_ONLY_IMM)),
            is_last.eq((p.opcode == Op.WRITE_LAST) | (p.opcode == Op.WRITE_LAST_IMM)
                       | (p.opcode == Op.WRITE_ONLY) | (p.opcode == Op.WRITE_ONLY_IMM)),
        ]
        ready_state = Signal()
        m.d.comb += ready_state.eq((cfg.state == QpState.RTR) | (cfg.state == QpState.RTS))
        # PSN distance, mod 2^24: 0 expected, >= 2^23 behind (duplicate), else a gap.
        dist = Signal(PSN_BITS)
        m.d.comb += dist.eq(p.psn - dyn.epsn)
        mtu = Signal(13)
        m.d.comb += mtu.eq(Const(128, 13) << cfg.mtu)          # ibv_mtu code n: 128 << n bytes
        va = Signal(64)
        total = Signal(32)
        off = Signal(32)
        with m.If(is_first):
            m.d.comb += [va.eq(p.reth.va), total.eq(p.reth.dma_len), off.eq(0)]
        with m.Else():
            m.d.comb += [va.eq(dyn.msg_va), total.eq(dyn.msg_len), off.eq(dyn.msg_off)]
        n = p.payload_len
        end = Signal(33)
        m.d.comb += end.eq(off + n)
        len_ok = Signal()
        with m.If(is_last):
            m.d.comb += len_ok.eq((n <= mtu) & (end == total))
        with m.Else():
            m.d.comb += len_ok.eq((n == mtu) & (end < total))
        unacked = Signal(9)
        m.d.comb += unacked.eq(dyn.unacked + 1)
        every = Signal(8)
        m.d.comb += every.eq(Mux(cfg.ack_every == 0, 1, cfg.ack_every))

        with m.If(~ready_state | (p.dqpn >= self.num_qps)):
            m.d.comb += verdict.eq(RxVerdict.QP_NOT_READY)
        with m.Elif(dist[PSN_BITS - 1]):
            m.d.comb += [verdict.eq(RxVerdict.PSN_DUPLICATE), new.dyn.unacked.eq(0),
                         respond.eq(1), resp_psn.eq(dyn.epsn - 1), resp_syn.eq(Aeth.ACK)]
        with m.Elif(dist != 0):
            m.d.comb += verdict.eq(RxVerdict.PSN_OUT_OF_ORDER)
            with m.If(~dyn.nak_sent):
                m.d.comb += [new.dyn.nak_sent.eq(1), new.dyn.unacked.eq(0),
                             respond.eq(1), resp_psn.eq(dyn.epsn), resp_syn.eq(Aeth.NAK_PSN_SEQ)]
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

        # Outputs: registered, so no valid depends on a ready; the decision waits until
        # every output this packet needs has room.
        cmd, resp = self.commands, self.responses
        out_ready = Signal()
        m.d.comb += [
            out_ready.eq((~cmd.valid | cmd.ready) & (~resp.valid | resp.ready)),
            mrt.results.ready.eq(out_ready),
            c_go.eq(mrt.results.valid & out_ready),
            self.verdict_valid.eq(c_go), self.verdict.eq(verdict),
        ]
        for s_ in (cmd, resp):
            with m.If(s_.valid & s_.ready):
                m.d.sync += s_.valid.eq(0)
        with m.If(c_go):
            m.d.sync += [
                cmd.valid.eq(1), cmd.p.write.eq(write), cmd.p.addr.eq(va + off),
                cmd.p.offset.eq(p.payload_offset), cmd.p.length.eq(n),
                resp.valid.eq(respond),
                resp.p.dmac.eq(cfg.dmac), resp.p.dip.eq(cfg.dip), resp.p.dest_qp.eq(cfg.remote_qpn),
                resp.p.src_qpn.eq(p.dqpn), resp.p.psn.eq(resp_psn), resp.p.syndrome.eq(resp_syn),
                resp.p.msn.eq(new.dyn.msn),
            ]

        # Context write: the decision, or a QP create from the control path.
        pipe_empty = Signal()
        m.d.comb += [pipe_empty.eq(~b_full & ~mrt.results.valid & ~self.packets.valid),
                     self.commit.ready.eq(pipe_empty)]
        with m.If(c_go & (p.dqpn < self.num_qps)):
            m.d.comb += [wr.en.eq(1), wr.addr.eq(p.dqpn[:qb]), wr.data.eq(new)]
            m.d.sync += [last_valid.eq(1), last_qpn.eq(p.dqpn[:qb]), last_ctx.eq(new)]
        with m.Elif(self.commit.valid & self.commit.ready):
            fresh = Signal(entry_layout)
            # every bit assigned: bits a process never drives come out undriven (X in Icarus)
            m.d.comb += [fresh.eq(0), fresh.cfg.eq(self.commit.p.cfg), fresh.dyn.epsn.eq(self.commit.p.epsn)]
            m.d.comb += [wr.en.eq(1), wr.addr.eq(self.commit.p.qpn), wr.data.eq(fresh)]
            m.d.sync += last_valid.eq(0)
        return m
