"""CQE writer: mlx5 CQE64 writeback into ring or collapsed CQs in GPU memory."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from spec import formats as F
from spec.params import AXI_ID_CQE_WRITE
from rtl.common.axi import AxiWriteSignature
from rtl.common.contexts import CqConfig, CqEntry, cq_bits, qp_bits
from rtl.common.cqe_ring import Cqe64, cqe_beat, cqe_place, cqe_write_const
from rtl.common.headers import be
from rtl.common.records import Completion

__all__ = ["CqeWriter"]


class CqeWriter(wiring.Component):
    """Writes one CQE64 per completion.

    CQE number k of a CQ (its producer count) goes where ``cqe_place`` says (a ring or
    a collapsed CQ, the owner bit flipping on every wrap). The CQ contexts and
    producer counts live in a RAM; the CPU's commit takes priority. A CQE carries, as
    libmlx5 reads it, the completed WQE's opcode in sop_drop_qpn [31:24] and the QP's
    user index (set at QP create) in srqn_uidx [23:0], from a RAM of one per QP.

    Members
    -------
    completions : In(stream.Signature(Completion))
    commit : In(stream.Signature({cqn, cfg}))
    uidx_commit : In(stream.Signature({qpn, user_index}))
        A QP create's user index; always ready (its own RAM write port).
    dma : Out(AxiWriteSignature)      AWID 0, one 64-byte write per CQE.
    written, errors : Out(1)          strobes for the counters.
    """
    def __init__(self, *, num_qps, num_cqs, data_width=1024, id_width=4):
        if num_cqs < 2:
            raise ValueError(f"num_cqs must be at least 2, not {num_cqs}")
        self.num_cqs, self.data_width = num_cqs, data_width
        self.num_qps = num_qps
        commit = data.StructLayout({"cqn": unsigned(cq_bits(num_cqs)), "cfg": CqConfig})
        uidx = data.StructLayout({"qpn": unsigned(qp_bits(num_qps)), "user_index": unsigned(24)})
        super().__init__({
            "completions": In(stream.Signature(Completion(num_qps, num_cqs))),
            "commit": In(stream.Signature(commit)),
            "uidx_commit": In(stream.Signature(uidx)),
            "dma": Out(AxiWriteSignature(addr_width=64, data_width=data_width, id_width=id_width)),
            "written": Out(1), "errors": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        dma = self.dma
        m.submodules.ram = ram = Memory(shape=CqEntry, depth=self.num_cqs, init=[])
        rd, wr = ram.read_port(), ram.write_port()
        m.d.comb += rd.en.eq(0)          # read ports default to always enabled; hold the data instead
        m.submodules.uidx = uidx_ram = Memory(shape=24, depth=self.num_qps, init=[])
        u_rd, u_wr = uidx_ram.read_port(), uidx_ram.write_port()
        m.d.comb += [u_rd.en.eq(0), self.uidx_commit.ready.eq(1),
                     u_wr.en.eq(self.uidx_commit.valid), u_wr.addr.eq(self.uidx_commit.p.qpn),
                     u_wr.data.eq(self.uidx_commit.p.user_index)]
        cpl = Signal.like(self.completions.p)
        entry = Signal(CqEntry)
        m.d.comb += entry.eq(rd.data)

        addr, owner = Signal(64), Signal()
        m.d.comb += Cat(addr, owner).eq(Cat(*cqe_place(entry)))

        cqe = Signal(Cqe64)
        opcode = Mux(cpl.error, F.CqeOp.REQ_ERR, F.CqeOp.REQ)
        m.d.comb += [
            cqe.byte_cnt.eq(be(Mux(cpl.error, 0, cpl.byte_cnt), 4)),
            cqe.syndrome.eq(Mux(cpl.error, cpl.syndrome, 0)),
            cqe.sop_drop_qpn.eq(be(Cat(cpl.qpn, C(0, 24 - len(cpl.qpn)), cpl.opcode), 4)),
            cqe.srqn_uidx.eq(be(u_rd.data, 4)),
            cqe.wqe_counter.eq(be(cpl.index, 2)),
            cqe.op_own.eq(Cat(owner, C(0, 3), opcode.as_unsigned()[:4])),
        ]
        wdata, wstrb = cqe_beat(cqe, addr, self.data_width)
        m.d.comb += [*cqe_write_const(dma, AXI_ID_CQE_WRITE), dma.awaddr.eq(addr),
                     dma.wdata.eq(wdata), dma.wstrb.eq(wstrb)]
        aw_done, w_done = Signal(), Signal()
        new = Signal(CqEntry)
        m.d.comb += [wr.data.eq(new), new.eq(entry)]
        wr_addr = Signal.like(wr.addr)
        m.d.comb += wr.addr.eq(wr_addr)
        commit_p = Signal.like(self.commit.p)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.commit.valid):
                    m.d.comb += self.commit.ready.eq(1)
                    m.d.sync += commit_p.eq(self.commit.p)
                    m.next = "COMMIT"
                with m.Elif(self.completions.valid):
                    m.d.comb += [self.completions.ready.eq(1), rd.addr.eq(self.completions.p.cqn), rd.en.eq(1),
                                 u_rd.addr.eq(self.completions.p.qpn), u_rd.en.eq(1)]
                    m.d.sync += [cpl.eq(self.completions.p), wr_addr.eq(self.completions.p.cqn),
                                 aw_done.eq(0), w_done.eq(0)]
                    m.next = "WRITE"
            with m.State("COMMIT"):
                m.d.comb += [wr.addr.eq(commit_p.cqn), new.cfg.eq(commit_p.cfg), new.count.eq(0), wr.en.eq(1)]
                m.next = "IDLE"
            with m.State("WRITE"):
                m.d.comb += [dma.awvalid.eq(~aw_done), dma.wvalid.eq(~w_done)]
                aw_now = aw_done | dma.awready
                w_now = w_done | dma.wready
                m.d.sync += [aw_done.eq(aw_now), w_done.eq(w_now)]
                with m.If(aw_now & w_now):
                    m.d.comb += [new.count.eq(entry.count + 1), wr.en.eq(1),
                                 self.written.eq(1), self.errors.eq(cpl.error)]
                    m.next = "IDLE"
        return m
