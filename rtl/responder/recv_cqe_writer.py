"""Receive CQE writer: the responder's completions (RESP_SEND, RESP_SEND_IMM, RESP_WR_IMM,
RESP_ERR) as mlx5 CQE64s into each QP's receive CQ, one a cycle, each once the writes
before it have landed."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from spec import formats as F
from spec.params import AXI_ID_RECV_CQE_WRITE
from rtl.common.axi import AxiWriteSignature
from rtl.common.contexts import CqConfig, CqEntry, cq_bits
from rtl.common.cqe_ring import Cqe64, cqe_beat, cqe_place, cqe_write_const
from rtl.common.headers import be
from rtl.responder.responder import RecvCqe

__all__ = ["RecvCqeWriter"]

_CREDIT_BITS = 16


class RecvCqeWriter(wiring.Component):
    """Writes one CQE64 per receive completion, up to one a cycle.

    The responder queues each completion (``cqes``, in decision order) and puts a CQE
    fence in the write order at the same place; ``landed`` strobes once per such fence
    whose writes before it all have their write responses (``RxWriteIssuer.fence_done``
    with ``fence_cqe``). A completion is written only when a strobe has come for it, so
    its CQE never becomes visible before the payload it reports (the put-with-signal rule
    of the send side). Strobes that come before their completion are counted.

    CQE k of a CQ (its producer count here) goes where ``cqe_place`` says, as the send
    side's (``CqeWriter``); ``sop_drop_qpn`` is the
    local QPN (no WQE opcode: a receive), ``srqn_uidx`` the QP's user index, ``imm`` the
    ImmDt as on the wire, ``op_own`` bit 1 the SE bit. The CQ contexts and producer counts
    are a RAM of this block's: a CQ takes either send completions (``CqeWriter``) or
    receive ones, not both. Pipeline: the CQ's row is read when a completion is taken; the
    next cycle the CQE goes to the AW/W registers and the count back to the RAM (a
    transparent read port: back-to-back CQEs of one CQ see each other's counts).

    Parameters
    ----------
    num_cqs : int
        CQs (a power of two >= 2).

    Members
    -------
    cqes : In(stream.Signature(RecvCqe))
        Receive completions in order (``cqn`` the QP's receive CQ).
    landed : In(1)
        One strobe per completion whose writes before it have landed.
    commit : In(stream.Signature({cqn, cfg}))
        A CQ create (context, count 0); always taken.
    dma : Out(AxiWriteSignature)
        AWID ``AXI_ID_RECV_CQE_WRITE``, one 64-byte write per CQE; B is not waited for.
    written, errors : Out(1)
        Strobes for the counters (a CQE written; a RESP_ERR one).
    """
    def __init__(self, *, num_cqs, data_width=1024, id_width=4):
        if not isinstance(num_cqs, int) or num_cqs < 2 or num_cqs & (num_cqs - 1):
            raise ValueError(f"num_cqs must be a power of two >= 2, not {num_cqs!r}")
        if data_width % (8 * F.CQE_SIZE):
            raise ValueError(f"data_width must hold whole CQEs, not {data_width!r}")
        self.num_cqs, self.data_width = num_cqs, data_width
        commit = data.StructLayout({"cqn": unsigned(cq_bits(num_cqs)), "cfg": CqConfig})
        super().__init__({
            "cqes": In(stream.Signature(RecvCqe)),
            "landed": In(1),
            "commit": In(stream.Signature(commit)),
            "dma": Out(AxiWriteSignature(addr_width=64, data_width=data_width, id_width=id_width)),
            "written": Out(1), "errors": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        dma = self.dma
        cb = cq_bits(self.num_cqs)
        m.submodules.ram = ram = Memory(shape=CqEntry, depth=self.num_cqs, init=[])
        wr, wr_commit = ram.write_port(), ram.write_port()
        rd = ram.read_port(transparent_for=(wr, wr_commit))
        fresh = Signal(CqEntry)
        m.d.comb += [fresh.cfg.eq(self.commit.p.cfg), fresh.count.eq(0),
                     self.commit.ready.eq(1), wr_commit.en.eq(self.commit.valid),
                     wr_commit.addr.eq(self.commit.p.cqn), wr_commit.data.eq(fresh)]

        # strobes not yet matched by a completion (the strobe of this cycle included)
        credits = Signal(_CREDIT_BITS)
        take = Signal()
        m.d.sync += credits.eq(credits + self.landed - take)

        s1_valid = Signal()
        s1 = Signal(RecvCqe)
        s1_go = Signal()
        out_free = Signal()
        m.d.comb += [
            out_free.eq((~dma.awvalid | dma.awready) & (~dma.wvalid | dma.wready)),
            s1_go.eq(s1_valid & out_free),
            take.eq(self.cqes.valid & ((credits != 0) | self.landed) & (~s1_valid | s1_go)),
            self.cqes.ready.eq(take),
            rd.addr.eq(self.cqes.p.cqn[:cb]), rd.en.eq(take),
        ]
        with m.If(take):
            m.d.sync += [s1_valid.eq(1), s1.eq(self.cqes.p)]
        with m.Elif(s1_go):
            m.d.sync += s1_valid.eq(0)

        entry = rd.data
        addr, owner = Signal(64), Signal()
        m.d.comb += Cat(addr, owner).eq(Cat(*cqe_place(entry)))
        cqe = Signal(Cqe64)
        m.d.comb += [
            cqe.byte_cnt.eq(be(s1.byte_cnt, 4)),
            cqe.imm.eq(be(s1.imm, 4)),
            cqe.syndrome.eq(s1.syndrome),
            cqe.sop_drop_qpn.eq(be(s1.qpn, 4)),
            cqe.srqn_uidx.eq(be(s1.user_index, 4)),
            cqe.wqe_counter.eq(be(s1.index, 2)),
            cqe.op_own.eq(Cat(owner, s1.se, C(0, 2), s1.opcode)),
        ]
        new = Signal(CqEntry)
        m.d.comb += [new.eq(entry), new.count.eq(entry.count + 1),
                     wr.en.eq(s1_go), wr.addr.eq(s1.cqn[:cb]), wr.data.eq(new)]

        wdata, wstrb = cqe_beat(cqe, addr, self.data_width)
        with m.If(dma.awvalid & dma.awready):
            m.d.sync += dma.awvalid.eq(0)
        with m.If(dma.wvalid & dma.wready):
            m.d.sync += dma.wvalid.eq(0)
        with m.If(s1_go):
            m.d.sync += [dma.awvalid.eq(1), dma.wvalid.eq(1), dma.awaddr.eq(addr),
                         dma.wdata.eq(wdata), dma.wstrb.eq(wstrb)]
        m.d.comb += [
            *cqe_write_const(dma, AXI_ID_RECV_CQE_WRITE),
            self.written.eq(s1_go), self.errors.eq(s1_go & (s1.opcode == F.CqeOp.RESP_ERR)),
        ]
        return m
