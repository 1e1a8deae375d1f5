"""CPU control path: the AXI4-Lite register file (map in docs/interfaces.md)."""
from amaranth.hdl import *
from amaranth.lib import wiring, data
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from rtl.common.axi import AxiLiteSignature, Resp
from rtl.common.contexts import QpConfig, CqConfig, qp_bits, cq_bits
from spec import csr
from spec.csr import ID_VALUE, counter_address
from spec.formats import QpModify, qp_modify_action


def MrStage(pd_bits):
    """The staged memory region of the MR_* registers."""
    return data.StructLayout({
        "index": unsigned(24), "key": unsigned(32), "base": unsigned(64), "length": unsigned(64),
        "access": unsigned(4), "pd": unsigned(pd_bits),
    })

__all__ = ["ControlRegisters", "COUNTERS", "counter_address", "ID_VALUE", "MrStage"]

# The register map and the counters are spec/csr.py's: COUNTERS are the counter names in
# register order (0x040 transmit, 0x080 receive, 0x0C0 requester reliability).
COUNTERS = csr.COUNTER_NAMES


class ControlRegisters(wiring.Component):
    """AXI4-Lite slave holding the port identity, the QP/CQ staging registers and counters.

    Parameters
    ----------
    num_qps, num_cqs : int
        Sizes of the QP and CQ tables (reported in PARAMS, bound QP_NUM and CQ_NUM).

    Members
    -------
    bus : In(AxiLiteSignature)
        The control path.
    port_mac, port_ip : Out
        Source MAC and IPv4 address of this port.
    qp_commit : Out(1)
        Write ``qp_cfg`` into QP ``qp_num``; held until ``qp_commit_ack``. With
        ``qp_commit_reset`` the send side starts afresh (indices 0, PSN ``qp_start_psn``),
        with ``qp_commit_rx_reset`` the receive side (expected PSN ``qp_rq_psn``); without
        either only the configuration and state change. ``qp_flush``: the QP moves to ERR
        (every outstanding and later WQE completes with WR_FLUSH_ERR). QP_COMMIT (create)
        resets both sides; QP_MODIFY does what ``spec.formats.qp_modify_action`` says for
        the QP's state (kept here in a RAM) and the staged one, and answers SLVERR without
        a commit for a transition verbs does not allow (``modify_rejected``, a strobe).
    cq_commit : Out(1)
        Likewise for CQ ``cq_num`` with ``cq_cfg``.
    qp_rq_psn, qp_pd, qp_ack_every, qp_max_dest_rd_atomic : Out
        The receive side of the QP a create (QP_COMMIT) writes: the first expected PSN,
        the protection domain, the ACK coalescing count and the responder resources.
    qp_timeout, qp_retry_cnt, qp_rnr_retry : Out
        The QP's ACK timeout (cycles), retry count (go-back-N) and RNR retry count.
    qp_rq_base, qp_rq_log_size, qp_rq_log_stride, qp_dbr, qp_rcqn, qp_min_rnr_timer : Out
        The QP's receive queue as a create takes it (``RecvQueue``: ring base, log2 of its
        WQEs and of their bytes, 0 = no receive queue; the doorbell record), the CQ of its
        receive completions and the timer code of its RNR NAKs.
    mr : Out(MrStage), mr_commit : Out(1), mr_valid : Out(1)
        Register (``mr_valid`` = 1) or deregister the staged region; held until
        ``mr_commit_ack``.
    counter_inc : In(ArrayLayout(2, len(COUNTERS)))
        Per counter of ``COUNTERS``, the count of its events this cycle (0..3: the
        receive path may drop or take two frames in one cycle).
    """
    def __init__(self, *, num_qps, num_cqs, pd_bits=24):
        self.num_qps, self.num_cqs = num_qps, num_cqs
        super().__init__({
            "bus": In(AxiLiteSignature(addr_width=16, data_width=32)),
            "port_mac": Out(48), "port_ip": Out(32),
            "qp_num": Out(qp_bits(num_qps)), "qp_cfg": Out(QpConfig(num_cqs)),
            "qp_start_psn": Out(24),
            "qp_commit": Out(1), "qp_commit_reset": Out(1), "qp_commit_rx_reset": Out(1), "qp_flush": Out(1),
            "qp_commit_ack": In(1), "modify_rejected": Out(1),
            "cq_num": Out(cq_bits(num_cqs)), "cq_cfg": Out(CqConfig),
            "cq_commit": Out(1), "cq_commit_ack": In(1),
            "qp_rq_psn": Out(24), "qp_pd": Out(pd_bits), "qp_ack_every": Out(8),
            "qp_max_dest_rd_atomic": Out(5),
            "qp_timeout": Out(32), "qp_retry_cnt": Out(3), "qp_rnr_retry": Out(3), "qp_user_index": Out(24),
            "qp_rq_base": Out(64), "qp_rq_log_size": Out(4), "qp_rq_log_stride": Out(4), "qp_dbr": Out(64),
            "qp_rcqn": Out(cq_bits(num_cqs)), "qp_min_rnr_timer": Out(5),
            "mr": Out(MrStage(pd_bits)), "mr_commit": Out(1), "mr_valid": Out(1), "mr_commit_ack": In(1),
            "counter_inc": In(data.ArrayLayout(unsigned(2), len(COUNTERS))),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        qp, cq = self.qp_cfg, self.cq_cfg
        counters = [Signal(32, name=f"cnt_{n}") for n in COUNTERS]
        for i, c in enumerate(counters):
            m.d.sync += c.eq(c + self.counter_inc[i])

        # Registers: name -> (signal, bit slice) for writes; reads return the same.
        rw = {
            "PORT_MAC_LO": self.port_mac[:32], "PORT_MAC_HI": self.port_mac[32:48], "PORT_IP": self.port_ip,
            "QP_NUM": self.qp_num,
            "QP_SQ_BASE_LO": qp.sq_base[:32], "QP_SQ_BASE_HI": qp.sq_base[32:],
            "QP_SQ_LOG_DEPTH": qp.log_depth, "QP_CQN": qp.cqn, "QP_REMOTE_QPN": qp.remote_qpn,
            "QP_START_PSN": self.qp_start_psn, "QP_DMAC_LO": qp.dmac[:32], "QP_DMAC_HI": qp.dmac[32:],
            "QP_DIP": qp.dip, "QP_MTU": qp.mtu, "QP_STATE": qp.state, "QP_WEIGHT": qp.weight,
            "QP_RQ_PSN": self.qp_rq_psn, "QP_PD": self.qp_pd, "QP_ACK_EVERY": self.qp_ack_every,
            "QP_SERVICE": qp.uc, "QP_TIMEOUT": self.qp_timeout, "QP_RETRY": self.qp_retry_cnt, "QP_RNR_RETRY": self.qp_rnr_retry,
            "QP_USER_INDEX": self.qp_user_index, "QP_MAX_RD_ATOMIC": qp.max_rd_atomic,
            "QP_MAX_WQEBBS": qp.max_wqebbs,
            "QP_MAX_DEST_RD_ATOMIC": self.qp_max_dest_rd_atomic,
            "QP_RQ_BASE_LO": self.qp_rq_base[:32], "QP_RQ_BASE_HI": self.qp_rq_base[32:],
            "QP_RQ_LOG_SIZE": self.qp_rq_log_size, "QP_RQ_LOG_STRIDE": self.qp_rq_log_stride,
            "QP_DBR_LO": self.qp_dbr[:32], "QP_DBR_HI": self.qp_dbr[32:], "QP_RCQN": self.qp_rcqn,
            "QP_MIN_RNR_TIMER": self.qp_min_rnr_timer,
            "MR_INDEX": self.mr.index, "MR_KEY": self.mr.key, "MR_BASE_LO": self.mr.base[:32],
            "MR_BASE_HI": self.mr.base[32:], "MR_LEN_LO": self.mr.length[:32], "MR_LEN_HI": self.mr.length[32:],
            "MR_ACCESS": self.mr.access, "MR_PD": self.mr.pd,
            "CQ_NUM": self.cq_num, "CQ_BASE_LO": cq.base[:32], "CQ_BASE_HI": cq.base[32:],
            "CQ_LOG_DEPTH": cq.log_depth, "CQ_FLAGS": cq.collapsed,
        }
        ro = {"ID": Const(ID_VALUE, 32),
              "PARAMS": Cat(Const(self.num_qps, 16), Const(self.num_cqs, 16))}
        ro.update(zip(COUNTERS, counters))
        do_write = Signal()
        # Each QP's state as the last commit set it, for QP_MODIFY's transition check (read
        # at QP_NUM: a register write is at least two cycles after the one before)
        m.submodules.qp_states = states = Memory(shape=unsigned(3), depth=self.num_qps, init=[])
        st_wr = states.write_port()
        st_rd = states.read_port(transparent_for=(st_wr,))
        m.d.comb += [st_rd.addr.eq(self.qp_num), st_wr.addr.eq(self.qp_num), st_wr.data.eq(qp.state),
                     st_wr.en.eq(self.qp_commit & self.qp_commit_ack)]
        action = Signal(3)
        with m.Switch(Cat(qp.state, st_rd.data)):
            for cur in range(8):
                for new in range(8):
                    with m.Case(new | cur << 3):
                        m.d.comb += action.eq(qp_modify_action(cur, new))
        modify = [self.qp_commit.eq(action != QpModify.REJECT),
                  self.qp_commit_reset.eq((action == QpModify.CREATE) | (action == QpModify.SEND_RESET)),
                  self.qp_commit_rx_reset.eq(action == QpModify.CREATE),
                  self.qp_flush.eq(action == QpModify.FLUSH),
                  bus.bresp.eq(Mux(action == QpModify.REJECT, Resp.SLVERR, Resp.OKAY))]
        m.d.comb += self.modify_rejected.eq(do_write & ((bus.awaddr & 0xFFFC) == csr.ADDR["QP_MODIFY"])
                                            & (action == QpModify.REJECT))

        # Write-only registers: the action of a write.
        wo = {
            "QP_COMMIT": [self.qp_commit.eq(1), self.qp_commit_reset.eq(1), self.qp_commit_rx_reset.eq(1),
                          self.qp_flush.eq(0)],
            "QP_MODIFY": modify,
            "CQ_COMMIT": self.cq_commit.eq(1),
            "MR_COMMIT": [self.mr_commit.eq(1), self.mr_valid.eq(1)],
            "MR_DEREG": [self.mr_commit.eq(1), self.mr_valid.eq(0)],
        }
        for regs, access in ((rw, csr.RW), (ro, csr.RO), (wo, csr.WO)):
            assert {r.name for r in csr.ALL if r.access == access} == set(regs), access
        self.widths = {name: len(reg) for name, reg in rw.items()}     # held bits, for the map test

        # Write: take AW and W together, answer B.
        with m.If(self.qp_commit_ack):
            m.d.sync += self.qp_commit.eq(0)
        with m.If(self.cq_commit_ack):
            m.d.sync += self.cq_commit.eq(0)
        with m.If(self.mr_commit_ack):
            m.d.sync += self.mr_commit.eq(0)
        busy = Signal()
        m.d.comb += busy.eq(self.qp_commit | self.cq_commit | self.mr_commit)
        # A write's response waits until the commit it starts is done, so that software
        # (the GPU's doorbells) never uses a QP, CQ or MR whose commit is still held (by
        # a block not ready yet, e.g. the RecvQueue's walk of its rows after reset).
        b_held = Signal()
        m.d.comb += [
            do_write.eq(bus.awvalid & bus.wvalid & ~b_held & ~busy),
            bus.awready.eq(do_write), bus.wready.eq(do_write),
            bus.bvalid.eq(b_held & ~busy),
        ]
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += b_held.eq(0)
        with m.If(do_write):
            m.d.sync += [b_held.eq(1), bus.bresp.eq(Resp.OKAY)]
            addr = bus.awaddr & 0xFFFC
            with m.Switch(addr):
                for name, reg in rw.items():
                    with m.Case(csr.ADDR[name]):
                        m.d.sync += reg.eq(bus.wdata[:len(reg)])
                for name, act in wo.items():
                    with m.Case(csr.ADDR[name]):
                        m.d.sync += act
                with m.Default():
                    m.d.sync += bus.bresp.eq(Resp.SLVERR)     # no such register

        # Read: one cycle.
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)
        m.d.comb += bus.arready.eq(~bus.rvalid)
        with m.If(bus.arvalid & ~bus.rvalid):
            m.d.sync += [bus.rvalid.eq(1), bus.rresp.eq(Resp.OKAY), bus.rdata.eq(0)]
            with m.Switch(bus.araddr & 0xFFFC):
                for name, reg in {**rw, **ro}.items():
                    with m.Case(csr.ADDR[name]):
                        m.d.sync += bus.rdata.eq(reg)
                with m.Default():
                    m.d.sync += bus.rresp.eq(Resp.SLVERR)
        return m
