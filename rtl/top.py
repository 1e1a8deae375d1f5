"""``IbgdaNic``: the RDMA engine, five parts wired like a block diagram.

    host (control registers, doorbells) -> requester -> port TX -> MAC TX
    MAC RX -> port RX -> responder (payload to GPU memory, ACK/NAKs -> port TX)
                      `-> requester (ACK/NAKs: completions, go-back-N)

Each part is a wiring file of its folder (rtl/host/path.py, rtl/requester/path.py,
rtl/responder/path.py, rtl/port/path.py); this file adds what spans them: the QP commit
that several parts take together, the write channels of ``m_axi`` that the CQE writer
and the received payload share, and the counters.
"""
from amaranth.hdl import *
from amaranth.lib import wiring

from spec import params as P
from spec.formats import DOORBELL_DROP_NAMES, RESPONSE_DROP_NAMES, QpState
from rtl.common.axi import (AxiLiteSignature, AxiWriteSignature, AxiReadSignature, AxiSignature, AxiStreamSignature,
                            flat_members, connect_flat)
from rtl.common.axi_read_arbiter import AxiReadArbiter
from rtl.common.axi_write_arbiter import AxiWriteArbiter
from rtl.common.rx_packet import RX_DROP_NAMES
from rtl.host.control_registers import COUNTERS
from rtl.host.path import HostPath
from rtl.port.path import PortRx, PortTx
from rtl.requester.path import RequesterPath
from rtl.requester.qp_table import DoorbellDrop
from rtl.responder.path import ResponderPath
from rtl.responder.responder import RX_VERDICT_NAMES

__all__ = ["IbgdaNic"]


class IbgdaNic(wiring.Component):
    """The RDMA engine of a 400 Gb/s RoCEv2 NIC driven by GPUs.

    Parameters
    ----------
    num_qps, num_cqs : int
        Sizes of the QP and CQ tables (RAMs); num_cqs defaults to num_qps (a CQ per QP).
    quantum : int
        WQEBBs fetched per scheduler turn for a QP of weight 1 (weight w: w x quantum).
    wqe_buffer : int
        WQEBB buffer = WQE reads in flight.
    payload_buffer : int
        Payload buffer in 128-byte beats = payload bytes in flight / 128.

    Members (top-level ports, cocotbext-axi names; see docs/interfaces.md)
    -------
    s_axil_*    AXI4-Lite slave: control registers.
    s_axi_db_*  AXI4 slave (write channels): UAR doorbells.
    m_axi_*     AXI4 master: payload and atomic-word reads, CQE, result and received payload writes to GPU memory.
    m_axi_wqe_* AXI4 master (read channels): WQE reads from the send queues in GPU memory.
    m_axi_rx_*  AXI4 master (write channels): received payload writes beside ``m_axi``'s, and atomic write-throughs.
    m_axis_tx_* AXI4-Stream master: frames to the MAC.
    s_axis_rx_* AXI4-Stream slave: frames from the MAC (32-byte frame starts, ``tuser`` 8 bits).
    """
    def __init__(self, *, num_qps=P.NUM_QPS, num_cqs=None, quantum=P.QUANTUM_WQEBBS,
                 wqe_buffer=P.WQE_BUFFER_WQEBBS, payload_buffer=P.PAYLOAD_BUFFER_BEATS):
        if num_cqs is None:             # as many CQs as QPs (spec NUM_CQS = NUM_QPS): one per QP
            num_cqs = num_qps
        for name, value in (("num_qps", num_qps), ("num_cqs", num_cqs)):
            if not isinstance(value, int) or value < 2 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 2, not {value!r}")
        self.num_qps, self.num_cqs = num_qps, num_cqs
        self.quantum, self.wqe_buffer, self.payload_buffer = quantum, wqe_buffer, payload_buffer
        data_bits = 8 * P.DATA_BYTES
        self._sigs = {
            "s_axil": AxiLiteSignature(addr_width=P.CSR_ADDR_WIDTH, data_width=32).flip(),
            "s_axi_db": AxiWriteSignature(addr_width=P.DB_ADDR_WIDTH, data_width=64,
                                          id_width=P.AXI_ID_WIDTH).flip(),
            "m_axi": AxiSignature(addr_width=P.DMA_ADDR_WIDTH, data_width=data_bits, id_width=P.AXI_ID_WIDTH),
            # WQE reads have their own read port: sharing one 128-byte-beat R channel with the
            # payload costs half a beat per one-WQEBB WQE, more than the wire time of a
            # 129-152-byte payload (docs/architecture.md, "DMA ports")
            "m_axi_wqe": AxiReadSignature(addr_width=P.DMA_ADDR_WIDTH, data_width=data_bits,
                                          id_width=P.AXI_ID_WIDTH),
            # received payload has a second write port: WRITEs of 1 payload byte arrive
            # 1.01 per cycle at line rate, each its own burst (docs/architecture.md)
            "m_axi_rx": AxiWriteSignature(addr_width=P.DMA_ADDR_WIDTH, data_width=data_bits,
                                          id_width=P.AXI_ID_WIDTH),
            # tuser[0]: a second frame starts at lane 64 (64-byte segments, docs/interfaces.md);
            # tuser[1]: it also ends in this beat (two ACK frames in one beat)
            "m_axis_tx": AxiStreamSignature(data_width=data_bits, user_width=2),
            # tuser[q] / tuser[4 + q]: a frame starts at lane 32q / ends in quarter q
            # (32-byte frame starts: every frame size at line rate, rtl/common/rx_beat.py)
            "s_axis_rx": AxiStreamSignature(data_width=data_bits, user_width=8).flip(),
        }
        members = {}
        for prefix, sig in self._sigs.items():
            members.update(flat_members(prefix, sig))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        nq, nc = self.num_qps, self.num_cqs
        m.submodules.host = host = HostPath(num_qps=nq, num_cqs=nc)
        m.submodules.requester = req = RequesterPath(num_qps=nq, num_cqs=nc, quantum=self.quantum,
                                                     wqe_buffer=self.wqe_buffer,
                                                     payload_buffer=self.payload_buffer)
        m.submodules.responder = rsp = ResponderPath(num_qps=nq, num_cqs=nc)
        m.submodules.port_rx = prx = PortRx()
        m.submodules.port_tx = ptx = PortTx(num_qps=nq, num_cqs=nc)
        m.submodules.dma_write = wr_arb = AxiWriteArbiter(ids=(P.AXI_ID_CQE_WRITE, P.AXI_ID_RX_WRITE))
        # the CQE writer and the atomic results share the arbiter's first input (both one beat
        # a write; a result's AW goes before the AW of the CQE it precedes)
        m.submodules.cqe_write = cqe_arb = AxiWriteArbiter(ids=(P.AXI_ID_CQE_WRITE, P.AXI_ID_RESULT_WRITE))
        # the atomic unit's reads and the READ responses' share m_axi's read channels with the
        # payload fetch (half of the turns each), its write-throughs m_axi_rx with the
        # received payload's second port
        m.submodules.rsp_read = rsp_rd_arb = AxiReadArbiter(ids=(P.AXI_ID_ATOMIC_READ, P.AXI_ID_READ_RESPONSE))
        # the receive queues' reads (doorbell records, receive WQEs) beside those two
        m.submodules.recv_read = recv_rd_arb = AxiReadArbiter(
            ids=(P.AXI_ID_RECV_QUEUE, (P.AXI_ID_ATOMIC_READ, P.AXI_ID_READ_RESPONSE)))
        m.submodules.dma_read = rd_arb = AxiReadArbiter(
            ids=(P.AXI_ID_PAYLOAD_FETCH, (P.AXI_ID_RECV_QUEUE, P.AXI_ID_ATOMIC_READ, P.AXI_ID_READ_RESPONSE)))
        # m_axi_rx: the received payload's second port, and (through a second arbiter) the
        # receive CQEs and the atomic write-throughs; B of any id but the payload's goes to
        # that arbiter (``a``), which sends the atomic unit's to it
        m.submodules.rx_side_write = rx_side_arb = AxiWriteArbiter(
            ids=(P.AXI_ID_RECV_CQE_WRITE, P.AXI_ID_ATOMIC_WRITE))
        m.submodules.rx_write = rx_arb = AxiWriteArbiter(ids=(P.AXI_ID_ATOMIC_WRITE, P.AXI_ID_RX_WRITE))

        # External ports.
        connect_flat(m, self, "s_axil", host.csr_bus)
        connect_flat(m, self, "s_axi_db", host.db_bus)
        connect_flat(m, self, "m_axi", rd_arb.bus)
        connect_flat(m, self, "m_axi", wr_arb.bus)
        connect_flat(m, self, "m_axi_rx", rx_arb.bus)
        connect_flat(m, self, "m_axi_wqe", req.wqe_dma)
        connect_flat(m, self, "s_axis_rx", prx.rx)
        connect_flat(m, self, "m_axis_tx", ptx.tx)

        # Control path: commits become one-entry streams. A QP commit goes to the QP table;
        # a send-side reset (a create, or the RTR -> RTS modify) also to the parser (PSN,
        # consumer index), the tracker and the CQE writer's user index; a receive-side
        # reset (a create) to the responder, another commit there as a state change; a move
        # to ERR (flush) to the tracker (RC: a failure walk) or the parser (UC). All in the
        # same cycle: each one's valid waits for the others' ready (none of those readies
        # depends on valid but the QP table's, which therefore is in every other valid). A
        # create also waits until the RecvQueue has walked its rows after reset, and the
        # commit's write response until the commit (``ControlRegisters``): software that
        # rings a doorbell after its create's write finds the QP everywhere.
        reset, rx_reset = host.qp_commit_reset, host.qp_commit_rx_reset
        flush_rc = host.qp_flush & ~host.qp_cfg.uc
        flush_uc = host.qp_flush & host.qp_cfg.uc
        qp_ready, wp_ready = req.qp_commit.ready, req.parser_commit.ready
        trk_ready, rsp_ready = req.tracker_commit.ready, rsp.commit.ready
        others = Signal()        # every part but the QP table takes its part this cycle
        m.d.comb += others.eq((~reset | (wp_ready & trk_ready)) & (~rx_reset | (rsp_ready & rsp.recv_create.ready & rsp.recv_ready))
                              & (~flush_rc | req.tracker_flush.ready) & (~flush_uc | req.parser_flush.ready))
        go = Signal()            # the commit happens this cycle
        m.d.comb += go.eq(host.qp_commit & others & qp_ready)
        create = go & reset
        m.d.comb += [
            req.qp_commit.valid.eq(host.qp_commit & others),
            req.qp_commit.p.qpn.eq(host.qp_num), req.qp_commit.p.cfg.eq(host.qp_cfg),
            req.qp_commit.p.reset.eq(reset),
            req.parser_commit.valid.eq(create),
            req.tracker_commit.valid.eq(create),
            req.tracker_commit.p.qpn.eq(host.qp_num), req.tracker_commit.p.start_psn.eq(host.qp_start_psn),
            req.tracker_commit.p.timeout.eq(host.qp_timeout), req.tracker_commit.p.retry_cnt.eq(host.qp_retry_cnt),
            req.tracker_commit.p.rnr_retry.eq(host.qp_rnr_retry),
            req.parser_commit.p.qpn.eq(host.qp_num), req.parser_commit.p.psn.eq(host.qp_start_psn),
            req.parser_commit.p.error.eq(host.qp_cfg.state == QpState.ERR),
            req.tracker_flush.valid.eq(go & flush_rc), req.tracker_flush.p.qpn.eq(host.qp_num),
            req.parser_flush.valid.eq(go & flush_uc), req.parser_flush.p.qpn.eq(host.qp_num),
            # the CQE writer's user-index RAM is always ready: written with the create
            req.uidx_commit.valid.eq(create),
            req.uidx_commit.p.qpn.eq(host.qp_num), req.uidx_commit.p.user_index.eq(host.qp_user_index),
            host.qp_commit_ack.eq(go),
            # every commit also tells the response checker the QP's peer, service and state
            req.checker_commit.valid.eq(go),
            req.checker_commit.p.qpn.eq(host.qp_num), req.checker_commit.p.create.eq(reset),
            req.checker_commit.p.start_psn.eq(host.qp_start_psn), req.checker_commit.p.dmac.eq(host.qp_cfg.dmac),
            req.checker_commit.p.dip.eq(host.qp_cfg.dip), req.checker_commit.p.uc.eq(host.qp_cfg.uc),
            req.checker_commit.p.state.eq(host.qp_cfg.state),
            req.cq_commit.valid.eq(host.cq_commit), req.cq_commit.p.cqn.eq(host.cq_num),
            req.cq_commit.p.cfg.eq(host.cq_cfg),
            # (the receive CQE writer takes a CQ create in any cycle)
            rsp.cq_commit.valid.eq(host.cq_commit & req.cq_commit.ready),
            rsp.cq_commit.p.cqn.eq(host.cq_num), rsp.cq_commit.p.cfg.eq(host.cq_cfg),
            host.cq_commit_ack.eq(req.cq_commit.ready),
            req.port_mac.eq(host.port_mac), req.port_ip.eq(host.port_ip),
            rsp.port_mac.eq(host.port_mac), rsp.port_ip.eq(host.port_ip),
            prx.port_mac.eq(host.port_mac), prx.port_ip.eq(host.port_ip),
            # A create also sets up the QP's receive side.
            rsp.commit.valid.eq(go & rx_reset),
            rsp.commit.p.qpn.eq(host.qp_num), rsp.commit.p.epsn.eq(host.qp_rq_psn),
            rsp.commit.p.cfg.state.eq(host.qp_cfg.state), rsp.commit.p.cfg.pd.eq(host.qp_pd),
            rsp.commit.p.cfg.ack_every.eq(host.qp_ack_every), rsp.commit.p.cfg.mtu.eq(host.qp_cfg.mtu),
            rsp.commit.p.cfg.max_dest_rd_atomic.eq(host.qp_max_dest_rd_atomic),
            rsp.commit.p.cfg.min_rnr_timer.eq(host.qp_min_rnr_timer), rsp.commit.p.cfg.rcqn.eq(host.qp_rcqn),
            rsp.commit.p.cfg.user_index.eq(host.qp_user_index),
            # and its receive queue (QP_RQ_LOG_STRIDE 0: none)
            rsp.recv_create.valid.eq(go & rx_reset),
            rsp.recv_create.p.qpn.eq(host.qp_num), rsp.recv_create.p.base.eq(host.qp_rq_base),
            rsp.recv_create.p.log_size.eq(host.qp_rq_log_size), rsp.recv_create.p.log_stride.eq(host.qp_rq_log_stride),
            rsp.recv_create.p.dbr.eq(host.qp_dbr), rsp.recv_create.p.enable.eq(host.qp_rq_log_stride != 0),
            rsp.commit.p.cfg.peer_mac.eq(host.qp_cfg.dmac), rsp.commit.p.cfg.peer_ip.eq(host.qp_cfg.dip),
            # a QP_MODIFY moves the receive side's state too (a QP in ERR takes no request)
            rsp.modify.valid.eq(go & ~rx_reset),
            rsp.modify.p.qpn.eq(host.qp_num), rsp.modify.p.state.eq(host.qp_cfg.state),
            rsp.peer_commit.valid.eq(rsp.commit.valid & rsp.commit.ready),
            rsp.peer_commit.p.qpn.eq(host.qp_num), rsp.peer_commit.p.addr.remote_qpn.eq(host.qp_cfg.remote_qpn),
            rsp.peer_commit.p.addr.dmac.eq(host.qp_cfg.dmac), rsp.peer_commit.p.addr.dip.eq(host.qp_cfg.dip),
            rsp.mr_commit.valid.eq(host.mr_commit),
            rsp.mr_commit.p.index.eq(host.mr.index), rsp.mr_commit.p.region.valid.eq(host.mr_valid),
            rsp.mr_commit.p.region.key.eq(host.mr.key), rsp.mr_commit.p.region.base.eq(host.mr.base),
            rsp.mr_commit.p.region.length.eq(host.mr.length), rsp.mr_commit.p.region.access.eq(host.mr.access),
            rsp.mr_commit.p.region.pd.eq(host.mr.pd),
            host.mr_commit_ack.eq(rsp.mr_commit.ready),
        ]

        # Data flow between the parts.
        wiring.connect(m, host.doorbells, req.doorbells)
        wiring.connect(m, req.frames, ptx.data)
        wiring.connect(m, rsp.frames, ptx.acks)
        wiring.connect(m, ptx.completions, req.completions)
        wiring.connect(m, req.cqe_dma, cqe_arb.a)
        wiring.connect(m, req.result_dma, cqe_arb.b)
        wiring.connect(m, cqe_arb.bus, wr_arb.a)
        wiring.connect(m, rsp.dma, wr_arb.b)
        wiring.connect(m, req.payload_dma, rd_arb.a)
        wiring.connect(m, rsp.atomic_rd, rsp_rd_arb.a)
        wiring.connect(m, rsp.read_dma, rsp_rd_arb.b)
        wiring.connect(m, rsp_rd_arb.bus, recv_rd_arb.b)
        wiring.connect(m, recv_rd_arb.bus, rd_arb.b)
        wiring.connect(m, rsp.recv_cqe_dma, rx_side_arb.a)
        wiring.connect(m, rsp.atomic_wr, rx_side_arb.b)
        wiring.connect(m, rx_side_arb.bus, rx_arb.a)
        wiring.connect(m, rsp.dma_rx, rx_arb.b)
        wiring.connect(m, rsp.recv_dma, recv_rd_arb.a)
        # Receive: frame drops counted at the port, ACKs to the requester, requests and the
        # buffered beats to the responder.
        wiring.connect(m, prx.beats, rsp.beats)
        wiring.connect(m, prx.keep, rsp.keep)
        wiring.connect(m, prx.requests, rsp.requests)
        wiring.connect(m, prx.acks, req.acks)
        # a READ RESPONSE's payload lands through the responder's write path
        wiring.connect(m, req.read_verdicts, rsp.read_verdicts)
        m.d.comb += req.read_landed.eq(rsp.read_landed)

        # Counters.
        # A doorbell is counted once: dropped by the decoder (not a doorbell), dropped by the
        # QP table (by reason), or applied by the QP table.
        db_drop = {n: req.db_drop == DoorbellDrop[n.upper()] for n in DOORBELL_DROP_NAMES if n != "bad_write"}
        db_drop["bad_write"] = host.db_dropped
        incs = {"doorbells": req.db_accepted, "doorbells_dropped": host.db_dropped + (req.db_drop != DoorbellDrop.NONE),
                **{f"db_{n}": v for n, v in db_drop.items()},
                "wqes": req.wqes_done, "packets": req.packets_sent, "cqes": req.cqes_written + rsp.recv_cqes,
                "error_cqes": req.error_cqes + rsp.recv_errors}
        # Frame-level drops and ACKs are counted at the dispatch (up to two a cycle), the
        # verdicts on WRITE requests at the responder.
        for v, name in RX_VERDICT_NAMES.items():
            incs[f"rx_{name}"] = ((rsp.verdict_valid[0] & (rsp.verdict[0] == v))
                                  + (rsp.verdict_valid[1] & (rsp.verdict[1] == v)))
        for v, name in RX_DROP_NAMES.items():
            if name is not None:
                incs[f"rx_{name}"] = incs.get(f"rx_{name}", 0) + prx.dropped[v.value - 1]
        incs["rx_ack_received"] = incs["rx_ack_received"] + prx.acks_received
        incs["acks_sent"], incs["naks_sent"] = rsp.acks_sent, rsp.naks_sent
        incs["acks_coalesced"] = rsp.acks_coalesced
        incs["qp_modify_rejected"] = host.modify_rejected
        incs["rnr_naks_sent"] = rsp.rnr_naks
        incs.update({"naks_received": req.naks, "retransmits": req.retransmits, "timeouts": req.timeouts,
                     "retry_exceeded": req.retry_exceeded, "acks_merged": req.acks_merged,
                     "rnr_naks_received": req.rnr_naks})
        for j, name in enumerate(RESPONSE_DROP_NAMES):
            incs[f"resp_{name}"] = req.resp_dropped[j]
        for i, name in enumerate(COUNTERS):
            m.d.comb += host.counter_inc[i].eq(incs[name])
        return m
