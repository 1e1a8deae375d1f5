"""``IbgdaNic``: the transmit engine, blocks wired along the data flow.

    UAR writes -> DoorbellDecoder -> QpTable (RR queue) -> WqeFetch -> WqeParser
      -> PayloadFetch -> PacketBuilder -> IcrcInserter -> MAC TX (AXI-Stream)
      -> (last beat of a completing message) -> CqeWriter -> CQE in GPU memory
"""
from amaranth.hdl import *
from amaranth.lib import wiring

from spec import formats as F
from spec import params as P
from rtl.common.axi import (AxiLiteSignature, AxiWriteSignature, AxiReadSignature, AxiSignature, AxiStreamSignature,
                  flat_members, connect_flat)
from rtl.responder.ack_addresser import AckAddresser
from rtl.responder.ack_builder import AckBuilder
from rtl.requester.ack_mailbox import AckMailbox
from rtl.common.axi_write_arbiter import AxiWriteArbiter
from rtl.requester.completion_tracker import CompletionTracker
from rtl.host.control_registers import ControlRegisters, COUNTERS
from rtl.port.icrc_checker import IcrcChecker
from rtl.port.rx_adapter import MacRxAdapter
from rtl.common.records import AckRecord, Completion, DoorbellEvent
from rtl.common.stream import Pair, StreamFifo
from rtl.responder.responder import Responder, RX_VERDICT_NAMES
from rtl.common.rx_beat import RxBeat, RxSegmentBeat
from rtl.port.header_parser import RxHeaderParser
from rtl.port.dispatch import RxDispatch
from rtl.common.rx_packet import RX_DROP_NAMES
from rtl.responder.resegmenter import RxResegmenter
from rtl.responder.payload_writer import RxPayloadWriter, RxWriteCommand
from rtl.responder.write_sorter import RxWriteOrder, RxWriteSorter
from rtl.responder.write_issuer import RxWriteIssuer
from rtl.port.tx_mux import TxMux
from rtl.host.doorbell_decoder import DoorbellDecoder
from rtl.requester.qp_table import QpTable, FetchJob
from rtl.requester.wqe_fetch import WqeFetch
from rtl.requester.wqe_parser import WqeParser
from rtl.requester.payload_fetch import PayloadFetch
from rtl.requester.packet_builder import PacketBuilder
from rtl.port.icrc_inserter import IcrcInserter
from rtl.requester.cqe_writer import CqeWriter
from rtl.requester.message import Message
from rtl.common.tx_beat import SEGMENT as SEG

__all__ = ["IbgdaNic"]


class IbgdaNic(wiring.Component):
    """The RDMA engine of a 400 Gb/s RoCEv2 NIC driven by GPUs (transmit path).

    Parameters
    ----------
    num_qps, num_cqs : int
        Sizes of the QP and CQ tables (RAMs).
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
    m_axi_*     AXI4 master: payload reads, CQE writes and received payload writes to GPU memory.
    m_axi_wqe_* AXI4 master (read channels): WQE reads from the send queues in GPU memory.
    m_axi_rx_*  AXI4 master (write channels): received payload writes, beside ``m_axi``'s.
    m_axis_tx_* AXI4-Stream master: frames to the MAC.
    s_axis_rx_* AXI4-Stream slave: frames from the MAC (32-byte frame starts, ``tuser`` 8 bits).
    """
    def __init__(self, *, num_qps=P.NUM_QPS, num_cqs=P.NUM_CQS, quantum=P.QUANTUM_WQEBBS,
                 wqe_buffer=P.WQE_BUFFER_WQEBBS, payload_buffer=P.PAYLOAD_BUFFER_BEATS):
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
        m.submodules.csr = csr = ControlRegisters(num_qps=nq, num_cqs=nc, pd_bits=P.PD_BITS)
        m.submodules.doorbell = db = DoorbellDecoder(num_qps=nq)
        m.submodules.db_fifo = db_fifo = StreamFifo(DoorbellEvent(nq), 16)
        m.submodules.qp_table = qpt = QpTable(num_qps=nq, num_cqs=nc, quantum=self.quantum,
                                              max_weight=P.MAX_WEIGHT)
        mb = qpt.max_burst
        m.submodules.job_fifo = job_fifo = StreamFifo(FetchJob(nq, nc, mb), 4)
        m.submodules.wqe_fetch = wf = WqeFetch(num_qps=nq, num_cqs=nc, max_burst=mb, max_run=P.WQE_MAX_RUN,
                                               buffer_depth=self.wqe_buffer)
        m.submodules.burst_fifo = burst_fifo = StreamFifo(FetchJob(nq, nc, mb), P.BURST_QUEUE_DEPTH)
        m.submodules.bf_fifo = bf_fifo = StreamFifo(8 * 64, 4)          # BlueFlame WQEBBs
        m.submodules.wqe_parser = wp = WqeParser(num_qps=nq, num_cqs=nc, max_burst=mb)
        m.submodules.inline_fifo = inline_fifo = StreamFifo(8 * P.DATA_BYTES, P.INLINE_QUEUE_BEATS)
        m.submodules.payload_fetch = pf = PayloadFetch(num_qps=nq, num_cqs=nc, buffer_beats=self.payload_buffer)
        m.submodules.msg_fifo = msg_fifo = StreamFifo(Message(nq, nc), P.MESSAGE_QUEUE_DEPTH)
        m.submodules.builder = pb = PacketBuilder(num_qps=nq, num_cqs=nc)
        m.submodules.icrc = icrc = IcrcInserter(num_qps=nq, num_cqs=nc)
        m.submodules.cpl_fifo = cpl_fifo = StreamFifo(Completion(nq, nc), 16)
        m.submodules.cqe_writer = cw = CqeWriter(num_qps=nq, num_cqs=nc)
        m.submodules.tx_mux = txm = TxMux(num_qps=nq, num_cqs=nc)
        m.submodules.cpl_tracker = trk = CompletionTracker(num_qps=nq, num_cqs=nc, depth=P.RC_COMPLETIONS_PER_QP)
        m.submodules.ack_mailbox = ack_mailbox = AckMailbox(num_qps=nq)
        # Receive path.
        m.submodules.mac_rx = rxa = MacRxAdapter()
        m.submodules.icrc_check = ick = IcrcChecker()
        m.submodules.rx_parser = rxp = RxHeaderParser()
        m.submodules.rx_beat_fifo = rx_beats = StreamFifo(RxBeat(), P.RX_BEAT_BUFFER)
        m.submodules.rx_dispatch = rxd = RxDispatch()
        m.submodules.rx_resegmenter = rxs = RxResegmenter()
        m.submodules.responder = rsp = Responder(num_qps=nq, num_mrs=P.NUM_MRS, pd_bits=P.PD_BITS)
        # the responder's payload commands, one or two per cycle; the sorter sends those
        # with payload in the segment stream to the writer (one per cycle) and every write
        # in order to the issuer, which puts up to two per cycle on m_axi and m_axi_rx
        m.submodules.rx_cmd_fifo = rx_cmds = StreamFifo(Pair(RxWriteCommand), 16)
        m.submodules.rx_write_sorter = rx_sort = RxWriteSorter()
        m.submodules.rx_order_fifo = rx_orders = StreamFifo(Pair(RxWriteOrder), 16)
        m.submodules.rx_write_issuer = rx_issue = RxWriteIssuer()
        # a registered queue between the resegmenter and the payload writer: without it the
        # resegmenter's (and so the beat buffer's) ready would hang on the writer's
        m.submodules.rx_seg_fifo = rx_segs = StreamFifo(RxSegmentBeat(), 4)
        m.submodules.rx_writer = rpw = RxPayloadWriter()
        # the responder's ACK/NAKs, one or two per cycle (two go out in one beat); they wait
        # here while MAC TX sends a data frame
        m.submodules.ack_fifo = ack_fifo = StreamFifo(Pair(AckRecord), 16)
        m.submodules.ack_addresser = ack_addr = AckAddresser(num_qps=nq)
        m.submodules.ack_builder = ackb = AckBuilder(num_qps=nq, num_cqs=nc)
        m.submodules.dma_write = wr_arb = AxiWriteArbiter(ids=(0, 2))

        # External ports.
        connect_flat(m, self, "s_axil", csr.bus)
        connect_flat(m, self, "s_axi_db", db.bus)
        connect_flat(m, self, "m_axi", pf.dma)
        connect_flat(m, self, "m_axi", wr_arb.bus)
        connect_flat(m, self, "m_axi_rx", rx_issue.p1)
        connect_flat(m, self, "m_axi_wqe", wf.dma)
        connect_flat(m, self, "s_axis_rx", rxa.i)

        # Control path: commits become one-entry streams.
        m.d.comb += [
            # A create goes to the QP table and the parser (PSN, consumer index) together:
            # the parser's ready does not depend on valid, the table's does.
            qpt.commit.valid.eq(csr.qp_commit & ((wp.commit.ready & rsp.commit.ready & trk.commit.ready)
                                                 | ~csr.qp_commit_reset)),
            qpt.commit.p.qpn.eq(csr.qp_num), qpt.commit.p.cfg.eq(csr.qp_cfg),
            qpt.commit.p.reset.eq(csr.qp_commit_reset),
            wp.commit.valid.eq(csr.qp_commit & csr.qp_commit_reset & qpt.commit.ready & rsp.commit.ready
                               & trk.commit.ready),
            trk.commit.valid.eq(csr.qp_commit & csr.qp_commit_reset & qpt.commit.ready & rsp.commit.ready
                                & wp.commit.ready),
            trk.commit.p.qpn.eq(csr.qp_num), trk.commit.p.start_psn.eq(csr.qp_start_psn),
            trk.commit.p.timeout.eq(csr.qp_timeout), trk.commit.p.retry_cnt.eq(csr.qp_retry_cnt),
            wp.commit.p.qpn.eq(csr.qp_num), wp.commit.p.psn.eq(csr.qp_start_psn),
            csr.qp_commit_ack.eq(qpt.commit.ready),
            cw.commit.valid.eq(csr.cq_commit), cw.commit.p.cqn.eq(csr.cq_num), cw.commit.p.cfg.eq(csr.cq_cfg),
            csr.cq_commit_ack.eq(cw.commit.ready),
            pb.port_mac.eq(csr.port_mac), pb.port_ip.eq(csr.port_ip),
            ackb.port_mac.eq(csr.port_mac), ackb.port_ip.eq(csr.port_ip),
            rxp.port_mac.eq(csr.port_mac), rxp.port_ip.eq(csr.port_ip),
            # A create also sets up the QP's receive side (QP_MODIFY leaves it alone).
            rsp.commit.valid.eq(csr.qp_commit & csr.qp_commit_reset & qpt.commit.ready & wp.commit.ready
                                & trk.commit.ready),
            rsp.commit.p.qpn.eq(csr.qp_num), rsp.commit.p.epsn.eq(csr.qp_rq_psn),
            rsp.commit.p.cfg.state.eq(csr.qp_cfg.state), rsp.commit.p.cfg.pd.eq(csr.qp_pd),
            rsp.commit.p.cfg.ack_every.eq(csr.qp_ack_every), rsp.commit.p.cfg.mtu.eq(csr.qp_cfg.mtu),
            ack_addr.commit.valid.eq(rsp.commit.valid & rsp.commit.ready),
            ack_addr.commit.p.qpn.eq(csr.qp_num), ack_addr.commit.p.addr.remote_qpn.eq(csr.qp_cfg.remote_qpn),
            ack_addr.commit.p.addr.dmac.eq(csr.qp_cfg.dmac), ack_addr.commit.p.addr.dip.eq(csr.qp_cfg.dip),
            rsp.mr_commit.valid.eq(csr.mr_commit),
            rsp.mr_commit.p.index.eq(csr.mr.index), rsp.mr_commit.p.region.valid.eq(csr.mr_valid),
            rsp.mr_commit.p.region.key.eq(csr.mr.key), rsp.mr_commit.p.region.base.eq(csr.mr.base),
            rsp.mr_commit.p.region.length.eq(csr.mr.length), rsp.mr_commit.p.region.access.eq(csr.mr.access),
            rsp.mr_commit.p.region.pd.eq(csr.mr.pd),
            csr.mr_commit_ack.eq(rsp.mr_commit.ready),
        ]

        # Data flow.
        wiring.connect(m, db.events, db_fifo.i)
        wiring.connect(m, db_fifo.o, qpt.doorbells)
        wiring.connect(m, qpt.jobs, job_fifo.i)
        wiring.connect(m, job_fifo.o, wf.jobs)
        wiring.connect(m, wf.bursts, burst_fifo.i)
        wiring.connect(m, burst_fifo.o, wp.bursts)
        wiring.connect(m, wf.wqebbs, wp.wqebbs)
        wiring.connect(m, qpt.bf_wqebbs, bf_fifo.i)
        wiring.connect(m, bf_fifo.o, wp.bf_wqebbs)
        wiring.connect(m, wp.updates, qpt.updates)
        wiring.connect(m, wp.messages, pf.messages_in)
        wiring.connect(m, wp.inline, inline_fifo.i)
        wiring.connect(m, inline_fifo.o, pb.inline)
        wiring.connect(m, pf.messages_out, msg_fifo.i)
        wiring.connect(m, msg_fifo.o, pb.messages)
        wiring.connect(m, pf.payload, pb.payload)
        wiring.connect(m, pb.frames, txm.data)
        wiring.connect(m, ackb.frames, txm.acks)
        wiring.connect(m, txm.o, icrc.i)
        wiring.connect(m, cw.dma, wr_arb.a)
        wiring.connect(m, rpw.dma, rx_issue.writer)
        wiring.connect(m, rx_issue.p0, wr_arb.b)
        # Receive: MAC -> ICRC check -> headers -> dispatch: frame drops counted, ACKs to
        # the requester side, WRITE requests to the responder. The beats wait in a buffer;
        # the resegmenter passes on the WRITE frames' beats, which wait in the payload
        # writer until the responder's command for their frame says write or discard.
        wiring.connect(m, rxa.o, ick.i)
        wiring.connect(m, ick.o, rxp.i)
        wiring.connect(m, rxp.o, rx_beats.i)
        wiring.connect(m, rx_beats.o, rxs.beats)
        wiring.connect(m, rxp.packets, rxd.packets)
        wiring.connect(m, rxd.keep, rxs.keep)
        wiring.connect(m, rxs.o, rx_segs.i)
        wiring.connect(m, rx_segs.o, rpw.beats)
        wiring.connect(m, rxd.requests, rsp.packets)
        wiring.connect(m, rsp.commands, rx_cmds.i)
        wiring.connect(m, rx_cmds.o, rx_sort.i)
        wiring.connect(m, rx_sort.commands, rpw.commands)
        wiring.connect(m, rx_sort.orders, rx_orders.i)
        wiring.connect(m, rx_orders.o, rx_issue.orders)
        wiring.connect(m, rsp.responses, ack_fifo.i)
        wiring.connect(m, ack_fifo.o, ack_addr.i)
        wiring.connect(m, ack_addr.o, ackb.requests)
        wiring.connect(m, rxd.acks, ack_mailbox.i)
        wiring.connect(m, ack_mailbox.o, trk.acks)
        wiring.connect(m, trk.retransmit, wp.retransmit)
        # RC completions wait in the tracker for the ACK that covers them
        wiring.connect(m, cpl_fifo.o, trk.sent)
        m.d.comb += trk.packets.eq(pb.sent)          # the ACK timer runs while packets wait
        wiring.connect(m, trk.completions, cw.completions)

        # MAC TX: frame beats go out; marker beats (frame = 0) are absorbed here.
        # The last beat of a completing message hands its completion to the CQE writer,
        # so a CQE is written only once the message's last packet has left.
        beat = icrc.o.p
        wants_cpl = Signal()
        m.d.comb += wants_cpl.eq(beat.last & beat.cpl_valid)
        ready = Signal()
        hi_lanes = Signal(range(SEG + 1))   # on a last beat: the lanes from 64 of the frame starting there
        m.d.comb += hi_lanes.eq(Mux(beat.sop_hi, Mux(beat.end_hi, beat.flen_hi[:7], SEG), 0))
        m.d.comb += [
            ready.eq((~beat.frame | self.m_axis_tx_tready) & (~wants_cpl | cpl_fifo.i.ready)),
            icrc.o.ready.eq(ready),
            self.m_axis_tx_tvalid.eq(icrc.o.valid & beat.frame & (~wants_cpl | cpl_fifo.i.ready)),
            self.m_axis_tx_tdata.eq(beat.data),
            self.m_axis_tx_tkeep.eq(Mux(beat.last,
                                        (Const((1 << P.DATA_BYTES) - 1, P.DATA_BYTES)
                                         >> (P.DATA_BYTES - beat.nbytes).as_unsigned())
                                        | ((Const((1 << SEG) - 1, P.DATA_BYTES)
                                            >> (SEG - hi_lanes).as_unsigned()) << SEG)[:P.DATA_BYTES],
                                        Const((1 << P.DATA_BYTES) - 1, P.DATA_BYTES))),
            self.m_axis_tx_tlast.eq(beat.last),
            self.m_axis_tx_tuser.eq(Cat(beat.sop_hi, beat.sop_hi & beat.end_hi)),
            cpl_fifo.i.valid.eq(icrc.o.valid & ready & wants_cpl),
            cpl_fifo.i.p.eq(beat.cpl),
        ]

        # Counters.
        # data frames only (ACK/NAK frames have their own counters): counted as the builder
        # hands over each frame's last beat
        sent = pb.frames.valid & pb.frames.ready & pb.frames.p.frame & pb.frames.p.last
        wqe_done = Signal()
        m.d.comb += wqe_done.eq(wp.messages.valid & wp.messages.ready)
        incs = {"doorbells": db.accepted, "doorbells_dropped": db.dropped | qpt.db_dropped,
                "wqes": wqe_done, "packets": sent, "cqes": cw.written, "error_cqes": cw.errors}
        # Frame-level drops and ACKs are counted at the dispatch (up to two a cycle), the
        # verdicts on WRITE requests at the responder.
        for v, name in RX_VERDICT_NAMES.items():
            incs[f"rx_{name}"] = ((rsp.verdict_valid[0] & (rsp.verdict[0] == v))
                                  + (rsp.verdict_valid[1] & (rsp.verdict[1] == v)))
        for v, name in RX_DROP_NAMES.items():
            if name is not None:
                incs[f"rx_{name}"] = incs.get(f"rx_{name}", 0) + rxd.dropped[v.value - 1]
        incs["rx_ack_received"] = incs["rx_ack_received"] + rxd.acks_received
        # ACK/NAKs sent, up to two a cycle
        resp_sent = Signal()
        resp = rsp.responses.p
        m.d.comb += resp_sent.eq(rsp.responses.valid & rsp.responses.ready)
        lanes = [resp_sent, resp_sent & resp.second]
        incs["acks_sent"] = sum(lanes[k] & (resp.p[k].syndrome == F.Aeth.ACK) for k in range(2))
        incs["naks_sent"] = sum(lanes[k] & (resp.p[k].syndrome != F.Aeth.ACK) for k in range(2))
        incs.update({"naks_received": trk.naks, "retransmits": trk.retransmits, "timeouts": trk.timeouts,
                     "retry_exceeded": trk.retry_exceeded,
                     "acks_merged": ack_mailbox.merged})
        for i, name in enumerate(COUNTERS):
            m.d.comb += csr.counter_inc[i].eq(incs[name])
        return m
