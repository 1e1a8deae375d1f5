"""CPU control path: the AXI4-Lite register file (map in docs/interfaces.md)."""
from amaranth.hdl import *
from amaranth.lib import wiring, data
from amaranth.lib.wiring import In, Out

from rtl.common.axi import AxiLiteSignature
from rtl.common.contexts import QpConfig, CqConfig, qp_bits, cq_bits


def counter_address(name):
    """CSR address of counter ``name``."""
    for base, names in ((0x040, TX_COUNTERS), (RX_COUNTER_BASE, RX_COUNTERS), (REQ_COUNTER_BASE, REQ_COUNTERS)):
        if name in names:
            return base + 4 * names.index(name)
    raise KeyError(name)


def MrStage(pd_bits):
    """The staged memory region of the MR_* registers."""
    return data.StructLayout({
        "index": unsigned(24), "key": unsigned(32), "base": unsigned(64), "length": unsigned(64),
        "access": unsigned(4), "pd": unsigned(pd_bits),
    })

__all__ = ["ControlRegisters", "COUNTERS", "TX_COUNTERS", "RX_COUNTERS", "RX_COUNTER_BASE", "REQ_COUNTERS",
           "REQ_COUNTER_BASE", "counter_address", "ID_VALUE",
           "MrStage"]

ID_VALUE = 0x49424741       # "IBGA"
# Counter names in register order from 0x040 (transmit) and 0x080 (receive: one per
# rtl.responder.RxVerdict, then ACKs and NAKs sent, then frames not addressed to the
# port: RxDrop.BAD_ADDRESS, the one frame-level drop added since).
TX_COUNTERS = ("doorbells", "doorbells_dropped", "wqes", "packets", "cqes", "error_cqes")
RX_COUNTERS = ("rx_accepted", "rx_ack_received", "rx_bad_length", "rx_not_roce", "rx_bad_ip_checksum",
               "rx_bad_icrc", "rx_bad_pkey", "rx_bad_opcode", "rx_qp_not_ready", "rx_psn_duplicate",
               "rx_psn_out_of_order", "rx_access_error", "rx_invalid_request", "acks_sent", "naks_sent",
               "rx_bad_address")
# Requester reliability (0x0C0): NAKs received, go-back-N retransmissions, ACK timeouts,
# QPs that ran out of retries, received ACKs folded into another of their QP (AckMailbox).
REQ_COUNTERS = ("naks_received", "retransmits", "timeouts", "retry_exceeded", "acks_merged")
COUNTERS = TX_COUNTERS + RX_COUNTERS + REQ_COUNTERS
RX_COUNTER_BASE = 0x080
REQ_COUNTER_BASE = 0x0C0


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
        ``qp_commit_reset`` (QP_COMMIT, create) the QP's indices are reset and its PSN
        is ``qp_start_psn``; without (QP_MODIFY) only the configuration changes.
    cq_commit : Out(1)
        Likewise for CQ ``cq_num`` with ``cq_cfg``.
    qp_rq_psn, qp_pd, qp_ack_every : Out
        The receive side of the QP a create (QP_COMMIT) writes: the first expected PSN,
        the protection domain and the ACK coalescing count.
    qp_timeout, qp_retry_cnt : Out
        The QP's ACK timeout (cycles) and retry count (go-back-N).
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
            "qp_commit": Out(1), "qp_commit_reset": Out(1), "qp_commit_ack": In(1),
            "cq_num": Out(cq_bits(num_cqs)), "cq_cfg": Out(CqConfig),
            "cq_commit": Out(1), "cq_commit_ack": In(1),
            "qp_rq_psn": Out(24), "qp_pd": Out(pd_bits), "qp_ack_every": Out(8),
            "qp_timeout": Out(32), "qp_retry_cnt": Out(3),
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

        # Registers: address -> (signal, bit slice) for writes; reads return the same.
        rw = {
            0x010: self.port_mac[:32], 0x014: self.port_mac[32:48], 0x018: self.port_ip,
            0x100: self.qp_num,
            0x104: qp.sq_base[:32], 0x108: qp.sq_base[32:],
            0x10C: qp.log_depth, 0x110: qp.cqn, 0x114: qp.remote_qpn,
            0x118: self.qp_start_psn, 0x11C: qp.dmac[:32], 0x120: qp.dmac[32:],
            0x124: qp.dip, 0x128: qp.mtu, 0x12C: qp.state, 0x134: qp.weight,
            0x13C: self.qp_rq_psn, 0x140: self.qp_pd, 0x144: self.qp_ack_every, 0x148: qp.uc,
            0x14C: self.qp_timeout, 0x150: self.qp_retry_cnt,
            0x300: self.mr.index, 0x304: self.mr.key, 0x308: self.mr.base[:32], 0x30C: self.mr.base[32:],
            0x310: self.mr.length[:32], 0x314: self.mr.length[32:], 0x318: self.mr.access, 0x31C: self.mr.pd,
            0x200: self.cq_num, 0x204: cq.base[:32], 0x208: cq.base[32:],
            0x20C: cq.log_depth, 0x210: cq.collapsed,
        }
        ro = {0x000: Const(ID_VALUE, 32),
              0x004: Cat(Const(self.num_qps, 16), Const(self.num_cqs, 16))}
        for name, c in zip(COUNTERS, counters):
            ro[counter_address(name)] = c

        # Write: take AW and W together, answer B.
        with m.If(self.qp_commit_ack):
            m.d.sync += self.qp_commit.eq(0)
        with m.If(self.cq_commit_ack):
            m.d.sync += self.cq_commit.eq(0)
        with m.If(self.mr_commit_ack):
            m.d.sync += self.mr_commit.eq(0)
        busy = Signal()
        m.d.comb += busy.eq(self.qp_commit | self.cq_commit | self.mr_commit)
        do_write = Signal()
        m.d.comb += [
            do_write.eq(bus.awvalid & bus.wvalid & ~bus.bvalid & ~busy),
            bus.awready.eq(do_write), bus.wready.eq(do_write),
        ]
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += bus.bvalid.eq(0)
        with m.If(do_write):
            m.d.sync += [bus.bvalid.eq(1), bus.bresp.eq(0)]
            addr = bus.awaddr & 0xFFFC
            with m.Switch(addr):
                for a, reg in rw.items():
                    with m.Case(a):
                        m.d.sync += reg.eq(bus.wdata[:len(reg)])
                with m.Case(0x130):
                    m.d.sync += [self.qp_commit.eq(1), self.qp_commit_reset.eq(1)]
                with m.Case(0x138):
                    m.d.sync += [self.qp_commit.eq(1), self.qp_commit_reset.eq(0)]
                with m.Case(0x214):
                    m.d.sync += self.cq_commit.eq(1)
                with m.Case(0x320):
                    m.d.sync += [self.mr_commit.eq(1), self.mr_valid.eq(1)]
                with m.Case(0x324):
                    m.d.sync += [self.mr_commit.eq(1), self.mr_valid.eq(0)]
                with m.Default():
                    m.d.sync += bus.bresp.eq(0b10)          # SLVERR: no such register

        # Read: one cycle.
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)
        m.d.comb += bus.arready.eq(~bus.rvalid)
        with m.If(bus.arvalid & ~bus.rvalid):
            m.d.sync += [bus.rvalid.eq(1), bus.rresp.eq(0), bus.rdata.eq(0)]
            with m.Switch(bus.araddr & 0xFFFC):
                for a, reg in {**rw, **ro}.items():
                    with m.Case(a):
                        m.d.sync += bus.rdata.eq(reg)
                with m.Default():
                    m.d.sync += bus.rresp.eq(0b10)
        return m
