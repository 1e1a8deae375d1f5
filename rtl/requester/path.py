"""``RequesterPath``: the requester, wired along its data flow.

    doorbells -> QpTable (round-robin) -> WqeFetch -> WqeParser -> PayloadFetch
      -> PacketBuilder -> frames (to the port)
    completions of sent messages (from the port) -> CompletionTracker -> CqeWriter
    received ACK/NAKs (from the port) -> ResponseChecker -> ResultWriter (an atomic's value to GPU
      memory; a READ's bytes landed) -> AckMailbox -> CompletionTracker -> go-back-N
    ResponseChecker -> READ RESPONSE verdicts (to the responder's write path, which lands the bytes)
"""
from amaranth.hdl import *
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from spec import params as P
from rtl.common.passthrough import WiringLevel
from rtl.common.records import Completion
from rtl.common.stream import StreamFifo
from rtl.requester.ack_mailbox import AckMailbox
from rtl.requester.completion_tracker import CompletionTracker
from rtl.requester.cqe_writer import CqeWriter
from rtl.requester.message import Message
from rtl.requester.packet_builder import PacketBuilder
from rtl.requester.payload_fetch import PayloadFetch
from rtl.requester.response_checker import ResponseChecker
from rtl.requester.result_writer import ResultWriter
from rtl.requester.qp_table import QpTable, FetchJob
from rtl.requester.wqe_fetch import WqeFetch
from rtl.requester.wqe_parser import WqeParser

__all__ = ["RequesterPath"]

JOB_QUEUE = 4               # fetch jobs between the QP table and the WQE fetch
BLUEFLAME_QUEUE = 4         # BlueFlame WQEBBs between the QP table and the parser
COMPLETION_QUEUE = 16       # completions of sent messages waiting for the tracker


class RequesterPath(WiringLevel):
    """From doorbell to frames, and from ACKs and sent messages to CQEs (pure wiring).

    Parameters
    ----------
    num_qps, num_cqs, quantum, wqe_buffer, payload_buffer : int
        As :class:`~rtl.top.IbgdaNic`.

    Members
    -------
    doorbells : In(stream.Signature(DoorbellEvent))
        From the host.
    qp_commit, parser_commit, tracker_commit, checker_commit, uidx_commit, cq_commit : In(stream.Signature(...))
        QP and CQ contexts from the control registers: every QP commit goes to the QP
        table and the response checker, a create also to the parser (PSN, consumer
        index), the tracker and the CQE writer (user index).
    tracker_flush, parser_flush : In(stream.Signature(...))
        A QP moved to ERR: an RC one to the tracker (failure walk), a UC one to the parser.
    port_mac, port_ip : In
        The port's own addresses (frame headers).
    wqe_dma : Out(AxiReadSignature)
        WQE reads (top-level ``m_axi_wqe``).
    payload_dma : Out(AxiReadSignature)
        Payload reads (``m_axi`` read channels).
    cqe_dma : Out(AxiWriteSignature)
        CQE writes (``m_axi`` write channels, shared with the responder).
    result_dma : Out(AxiWriteSignature)
        Atomic results (``m_axi`` write channels, before the CQEs they complete).
    frames : Out(stream.Signature(TxBeat))
        Data frames (and completion markers) for MAC TX.
    completions : In(stream.Signature(Completion))
        Messages whose last beat has left MAC TX.
    acks : In(stream.Signature(Pair(Response)))
        Received ACK/NAKs, ATOMIC ACKs and READ RESPONSEs, one or two a cycle.
    read_verdicts : Out(stream.Signature(Pair(ReadVerdict)))
        What becomes of each READ RESPONSE's payload (to the responder's ``ReadResponseJoin``).
    read_landed : In(1)
        A completed READ's payload has landed (the responder's write issuer).
    db_accepted, db_drop, wqes_done, packets_sent, cqes_written, error_cqes, naks, retransmits,
    timeouts, retry_exceeded, rnr_naks, acks_merged, resp_dropped : Out
        Counter strobes (``resp_dropped``: per ``ResponseDrop`` reason).
    """
    def __init__(self, *, num_qps, num_cqs, quantum, wqe_buffer, payload_buffer):
        nq, nc = num_qps, num_cqs
        self._qpt = QpTable(num_qps=nq, num_cqs=nc, quantum=quantum, max_weight=P.MAX_WEIGHT)
        mb = self._qpt.max_burst
        self._blocks = {
            "qp_table": self._qpt,
            "job_fifo": StreamFifo(FetchJob(nq, nc, mb), JOB_QUEUE),
            "wqe_fetch": WqeFetch(num_qps=nq, num_cqs=nc, max_burst=mb, max_run=P.WQE_MAX_RUN,
                                  buffer_depth=wqe_buffer),
            "burst_fifo": StreamFifo(FetchJob(nq, nc, mb), P.BURST_QUEUE_DEPTH),
            "bf_fifo": StreamFifo(8 * 64, BLUEFLAME_QUEUE),
            "wqe_parser": WqeParser(num_qps=nq, num_cqs=nc, max_burst=mb),
            "inline_fifo": StreamFifo(8 * P.DATA_BYTES, P.INLINE_QUEUE_BEATS),
            "payload_fetch": PayloadFetch(num_qps=nq, num_cqs=nc, buffer_beats=payload_buffer),
            "msg_fifo": StreamFifo(Message(nq, nc), P.MESSAGE_QUEUE_DEPTH),
            "builder": PacketBuilder(num_qps=nq, num_cqs=nc),
            "cpl_fifo": StreamFifo(Completion(nq, nc), COMPLETION_QUEUE),
            "cqe_writer": CqeWriter(num_qps=nq, num_cqs=nc),
            "cpl_tracker": CompletionTracker(num_qps=nq, num_cqs=nc, pool=P.RC_COMPLETION_POOL),
            "response_checker": ResponseChecker(num_qps=nq),
            "result_writer": ResultWriter(num_qps=nq),
            "ack_mailbox": AckMailbox(num_qps=nq),
        }
        b = self._blocks
        self._ports = [
            (b["qp_table"], {"doorbells": "doorbells", "qp_commit": "commit", "db_accepted": "db_accepted",
                              "db_drop": "db_drop"}),
            (b["wqe_parser"], {"parser_commit": "commit", "parser_flush": "flush"}),
            (b["cpl_tracker"], {"tracker_commit": "commit", "tracker_flush": "flush", "naks": "naks", "retransmits": "retransmits",
                                "timeouts": "timeouts", "retry_exceeded": "retry_exceeded", "rnr_naks": "rnr_naks"}),
            (b["cqe_writer"], {"cq_commit": "commit", "uidx_commit": "uidx_commit", "cqe_dma": "dma", "cqes_written": "written",
                               "error_cqes": "errors"}),
            (b["builder"], {"port_mac": "port_mac", "port_ip": "port_ip", "frames": "frames"}),
            (b["wqe_fetch"], {"wqe_dma": "dma"}),
            (b["payload_fetch"], {"payload_dma": "dma"}),
            (b["cpl_fifo"], {"completions": "i"}),
            (b["response_checker"], {"acks": "i", "checker_commit": "commit", "resp_dropped": "dropped",
                                      "read_verdicts": "read_verdicts"}),
            (b["ack_mailbox"], {"acks_merged": "merged"}),
            (b["result_writer"], {"result_dma": "dma", "read_landed": "read_landed"}),
        ]
        super().__init__(self._blocks, self._ports, {"wqes_done": Out(1), "packets_sent": Out(1)})

    def elaborate(self, platform):
        m = self.wire()
        b = self._blocks
        qpt, wf, wp, pf, pb = b["qp_table"], b["wqe_fetch"], b["wqe_parser"], b["payload_fetch"], b["builder"]
        trk, cw = b["cpl_tracker"], b["cqe_writer"]
        wiring.connect(m, qpt.jobs, b["job_fifo"].i)
        wiring.connect(m, b["job_fifo"].o, wf.jobs)
        wiring.connect(m, wf.bursts, b["burst_fifo"].i)
        wiring.connect(m, b["burst_fifo"].o, wp.bursts)
        wiring.connect(m, wf.wqebbs, wp.wqebbs)
        wiring.connect(m, qpt.bf_wqebbs, b["bf_fifo"].i)
        wiring.connect(m, b["bf_fifo"].o, wp.bf_wqebbs)
        wiring.connect(m, wp.updates, qpt.updates)
        wiring.connect(m, wp.turns, qpt.turns)
        # the table's count of byte-bound bursts ahead of the parser (QpTable.turns_ahead)
        m.d.comb += qpt.bounded_taken.eq(wp.bursts.valid & wp.bursts.ready & (wp.bursts.p.byte_turn != 0))
        wiring.connect(m, wp.messages, pf.messages_in)
        wiring.connect(m, wp.inline, b["inline_fifo"].i)
        wiring.connect(m, b["inline_fifo"].o, pb.inline)
        wiring.connect(m, pf.messages_out, b["msg_fifo"].i)
        wiring.connect(m, b["msg_fifo"].o, pb.messages)
        wiring.connect(m, pf.payload, pb.payload)
        rc, rw = b["response_checker"], b["result_writer"]
        wiring.connect(m, rc.o, rw.i)
        wiring.connect(m, rw.o, b["ack_mailbox"].i)
        m.d.comb += [rc.hold.eq(rw.hold), rc.remote.eq(wp.remote), rw.remote.eq(wp.remote), wp.pops.eq(rw.pops)]
        m.d.comb += [rc.packets.eq(pb.sent), rc.failed.eq(trk.failed)]
        wiring.connect(m, b["ack_mailbox"].o, trk.acks)
        wiring.connect(m, trk.retransmit, wp.retransmit)
        # RC completions wait in the tracker for the ACK that covers them
        wiring.connect(m, b["cpl_fifo"].o, trk.sent)
        m.d.comb += trk.packets.eq(pb.sent)          # the ACK timer runs while packets wait
        wiring.connect(m, trk.completions, cw.completions)
        # data frames only (ACK/NAK frames have their own counters): counted as the builder
        # hands over each frame's last beat
        m.d.comb += [
            self.wqes_done.eq(wp.messages.valid & wp.messages.ready),
            self.packets_sent.eq(pb.frames.valid & pb.frames.ready & pb.frames.p.frame & pb.frames.p.last),
        ]
        return m
