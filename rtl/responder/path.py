"""``ResponderPath``: the responder, wired along its data flow.

    requests (from the port) -> RecvFlush (flush requests of QPs gone to ERR) -> RecvGate (receive WQEs: RecvQueue) -> Responder -> payload commands -> ReadResponseJoin (READ RESPONSEs
      received: the requester's verdicts) -> RxScatterSplit (a SEND packet over receive
      segments: a command per piece) -> RxWriteSorter
      -> RxWriteIssuer -> m_axi / m_axi_rx        (payload beats: RxResegmenter
      -> RxPayloadWriter -> issuer)
    Responder -> answers -> AckCoalescer -> AtomicAckJoin -> AckAddresser -> AckBuilder
      -> frames (to the port)
    Responder -> atomics -> AtomicUnit (after RxWriteIssuer's fence) <-> AtomicDma
      -> m_axi reads, m_axi_rx writes; results -> AtomicAckJoin
    Responder -> READs -> ReadResponseSource (after the fence) -> PayloadFetch (m_axi reads)
      -> PacketBuilder -> ResponseMerge (into the ACK frames, at each READ's place) -> frames
    Responder -> receive completions -> RecvCqeWriter (after RxWriteIssuer's CQE fence) -> m_axi_rx
"""
from amaranth.hdl import *
from rtl.common.contexts import qp_bits
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from spec import formats as F
from spec import params as P
from rtl.common.passthrough import WiringLevel
from rtl.common.records import AckRecord, RxKeepPair
from rtl.common.rx_beat import RxSegmentBeat
from rtl.common.stream import Pair, PairSplitter, StreamFifo
from rtl.responder.ack_addresser import AckAddresser
from rtl.responder.atomic_ack_join import AtomicAckJoin
from rtl.responder.atomic_dma import AtomicDma
from rtl.responder.atomic_unit import AtomicRequest, AtomicUnit
from rtl.responder.ack_coalescer import AckCoalescer
from rtl.responder.ack_builder import AckBuilder
from rtl.requester.message import Message
from rtl.requester.packet_builder import PacketBuilder
from rtl.requester.payload_fetch import PayloadFetch
from rtl.responder.payload_writer import RxPayloadWriter, RxWriteCommand
from rtl.responder.read_response_join import ReadResponseJoin
from rtl.responder.read_response_source import ReadResponseSource
from rtl.responder.recv_cqe_writer import RecvCqeWriter
from rtl.responder.recv_flush import RecvFlush
from rtl.responder.recv_gate import RecvGate
from rtl.responder.recv_queue import RecvCreate, RecvQueue
from rtl.responder.response_merge import ResponseMerge
from rtl.responder.keep_join import RxKeepJoin
from rtl.responder.resegmenter import RxResegmenter
from rtl.responder.scatter_split import RxScatterSplit
from rtl.responder.responder import ReadJob, RecvCqe, Responder, ResponderAck
from rtl.responder.write_issuer import RxWriteIssuer
from rtl.responder.write_sorter import RxWriteOrder, RxWriteSorter

__all__ = ["ResponderPath"]

# Payload commands (pairs) between the responder and the sorter. The payload writer takes a
# frame's command only when it reaches the frame's beats, so the commands of every frame whose
# beats still wait in the port's beat buffer (at most one pair per beat: the frames that end in
# it) and in the segment queue wait here. Behind a long frame (a 4096-byte MTU is 33 beats, and
# its first beat waits for its verdict at its end) small frames keep coming at about one a cycle
# (8-byte WRITEs: 82 bytes, 1.06 cycles each, the writer has 6% to spare), so a queue shorter
# than the beat buffer fills with the buffer half empty and holds MAC RX back.
COMMAND_QUEUE = P.RX_BEAT_BUFFER + 16
ORDER_QUEUE = 16            # write orders (pairs) between the sorter and the issuer
# The sorter's verdicts (frames of the segment stream: written or not) wait here for the
# resegmenter, and the writer's commands for their frames' beats: the sorter runs ahead of
# the writer by the orders waiting (ORDER_QUEUE pairs), so these need little more.
VERDICT_QUEUE = 16
WRITER_COMMAND_QUEUE = 2 * ORDER_QUEUE + 8
SEGMENT_QUEUE = 4           # payload beats between the resegmenter and the payload writer
# ACK/NAKs (pairs) waiting while MAC TX sends a data frame, behind an ATOMIC ACK whose
# atomic waits for the writes before it to land and for its word's read (at 200 M atomics/s,
# 0.4 a cycle, and 1 us of read latency, some 200 of them), and READ place holders, each
# waiting for its payload's read: 8-byte READs at about one a cycle and 1 us of read latency
# keep some 550 queued (256 held 8-byte READs over 64 QPs to 338 M/s; 1024: 407 M/s).
ACK_QUEUE = 1024
ACK_BACKLOG = 16            # records queued beyond which an identical re-ACK is coalesced
ATOMIC_QUEUE = 128          # atomics waiting for the writes before them to land (fence)
ATOMIC_WORDS = 256          # the atomic unit's cached words: misses in flight to different words
ATOMIC_DEPTH = 256          # atomics waiting in order in the unit (for their words)
# READs: waiting for the writes before them to land; then their payload is read ahead of the
# builder. 8-byte READs at the request wire limit (about one a cycle) with 1 us of read
# latency keep some 500 READs' reads in flight (a beat each) and their messages queued; a
# 64 KiB READ keeps 50 KB (400 beats) in flight at the wire rate. So 512 of each.
READ_QUEUE = 128
READ_BUFFER_BEATS = 512
READ_MESSAGE_QUEUE = 512
# Receive completions wait here for the writes before them to land (a write response's
# latency at up to one a cycle); the gate holds the packets whose receive WQE is on its way.
RECV_CQE_QUEUE = 64
RECV_GATE_DEPTH = 16


class ResponderPath(WiringLevel):
    """Received requests checked and executed, payload written, ACK/NAKs built (pure wiring).

    Parameters
    ----------
    num_qps, num_cqs : int
        As :class:`~rtl.top.IbgdaNic`.

    Members
    -------
    requests : In(stream.Signature(RxPacketPair))
        RC requests that passed the frame-level checks, one or two a cycle.
    beats : In(stream.Signature(RxBeat))
        Every received frame's beats, from the port's beat buffer.
    keep : In(stream.Signature(RxKeepPair))
        Which of those frames carry payload in the segment stream (the dispatch's candidates;
        the write sorter's verdicts decide which the resegmenter passes on: RxKeepJoin).
    commit, modify, mr_commit : In(stream.Signature(...))
        A QP create's receive side; a QP_MODIFY's state; a memory region (the
        responder's key tables).
    peer_commit : In(stream.Signature(...))
        The QP's peer (QPN, MAC, IPv4) for its ACKs; taken with ``commit``.
    port_mac, port_ip : In
        The port's own addresses (ACK frame headers).
    dma : Out(AxiWriteSignature)
        Payload writes on ``m_axi`` (shared with the CQE writer).
    dma_rx : Out(AxiWriteSignature)
        Payload writes on the second port ``m_axi_rx``.
    atomic_rd, atomic_wr : Out(AxiReadSignature), Out(AxiWriteSignature)
        The atomic unit's word reads (on ``m_axi``) and write-throughs (on ``m_axi_rx``).
    read_verdicts : In(stream.Signature(Pair(ReadVerdict)))
        The requester's verdicts on the READ RESPONSEs received (``ReadResponseJoin``).
    read_landed : Out(1)
        A READ of this NIC's requester completed: its bytes have landed (a strobe each).
    read_dma : Out(AxiReadSignature)
        READ payload reads (on ``m_axi``, ARID ``AXI_ID_READ_RESPONSE``).
    recv_create : In(stream.Signature(RecvCreate))
        A QP create's receive queue (``RecvQueue.create``).
    recv_ready : Out(1)
        The RecvQueue is ready after reset (``RecvQueue.ready``): QP creates wait for it.
    recv_dma : Out(AxiReadSignature)
        The receive queues' doorbell-record and WQE reads (ARID ``AXI_ID_RECV_QUEUE``).
    cq_commit : In(stream.Signature(...))
        A CQ create, for the receive CQE writer (always taken).
    recv_cqe_dma : Out(AxiWriteSignature)
        Receive CQEs (AWID ``AXI_ID_RECV_CQE_WRITE``).
    recv_cqes, recv_errors : Out(1)
        A receive CQE written (a RESP_ERR one).
    frames : Out(stream.Signature(TxBeat))
        ACK/NAK, ATOMIC ACK and READ RESPONSE frames for MAC TX, in answer order.
    verdict_valid, verdict : Out
        The responder's verdict on each of up to two requests a cycle (counters).
    acks_sent, naks_sent : Out(2)
        ACK and NAK records queued for MAC TX this cycle (0..2 each).
    acks_coalesced : Out(2)
        Re-ACKs dropped as identical to the last one queued (``AckCoalescer``).
    rnr_naks : Out(2)
        RNR NAKs the responder decided this cycle (0..2; also in ``naks_sent``).
    """
    def __init__(self, *, num_qps, num_cqs):
        nq, nc = num_qps, num_cqs
        self._blocks = {
            "rx_resegmenter": RxResegmenter(),
            "responder": Responder(num_qps=nq, num_mrs=P.NUM_MRS, pd_bits=P.PD_BITS),
            # the responder's payload commands, one or two per cycle; the sorter sends those
            # with payload in the segment stream to the writer (one per cycle) and every write
            # in order to the issuer, which puts up to two per cycle on m_axi and m_axi_rx
            "rx_cmd_fifo": StreamFifo(Pair(RxWriteCommand), COMMAND_QUEUE),
            # a READ RESPONSE this NIC received: its payload's fate is the requester's
            "read_join": ReadResponseJoin(),
            # a SEND packet whose payload runs over receive segments: one command per piece
            "scatter_split": RxScatterSplit(),
            "rx_write_sorter": RxWriteSorter(),
            # the resegmenter passes on only the frames the writer writes (RxKeepJoin): a
            # discarded frame costs neither a cycle
            "rx_verdict_fifo": StreamFifo(RxKeepPair, VERDICT_QUEUE),
            "rx_keep_join": RxKeepJoin(),
            "rx_writer_cmd_fifo": StreamFifo(RxWriteCommand, WRITER_COMMAND_QUEUE),
            "rx_order_fifo": StreamFifo(Pair(RxWriteOrder), ORDER_QUEUE),
            "rx_write_issuer": RxWriteIssuer(),
            # a registered queue between the resegmenter and the payload writer: without it the
            # resegmenter's (and so the beat buffer's) ready would hang on the writer's
            "rx_seg_fifo": StreamFifo(RxSegmentBeat(), SEGMENT_QUEUE),
            "rx_writer": RxPayloadWriter(),
            # the responder's ACK/NAKs, one or two per cycle (two go out in one beat); they wait
            # here while MAC TX sends a data frame
            # (a re-ACK identical to the last one queued is dropped while the queue is full)
            "ack_coalescer": AckCoalescer(),
            "ack_fifo": StreamFifo(Pair(ResponderAck), ACK_QUEUE),
            # atomics: in order into the unit once the writes before them have landed;
            # their results fill the ATOMIC ACKs the responder queued in its answers
            "atomic_split": PairSplitter(AtomicRequest(nq)),
            "atomic_fifo": StreamFifo(AtomicRequest(nq), ATOMIC_QUEUE),
            "atomic_unit": AtomicUnit(num_qps=nq, entries=ATOMIC_WORDS, depth=ATOMIC_DEPTH),
            "atomic_dma": AtomicDma(reads=ATOMIC_WORDS),
            "atomic_ack_join": AtomicAckJoin(num_qps=nq),
            "ack_addresser": AckAddresser(num_qps=nq),
            "ack_builder": AckBuilder(num_qps=nq, num_cqs=nc),
            # READs: in order to the response source once the writes before them have
            # landed; their payload read and their frames built as the requester's are,
            # each READ's frames put at its place among the ACKs
            "read_split": PairSplitter(ReadJob(nq)),
            "read_fifo": StreamFifo(ReadJob(nq), READ_QUEUE),
            "read_source": ReadResponseSource(num_qps=nq, num_cqs=nc, credits=READ_QUEUE + 4),
            "read_fetch": PayloadFetch(num_qps=nq, num_cqs=nc, buffer_beats=READ_BUFFER_BEATS,
                                       max_burst_beats=P.PAYLOAD_MAX_BURST_BEATS, arid=P.AXI_ID_READ_RESPONSE),
            "read_msg_fifo": StreamFifo(Message(nq, nc), READ_MESSAGE_QUEUE),
            # (back to back: a READ RESPONSE frame starts only with all its payload in the
            # buffer, and its beats never wait on a held tail; MAC TX must not underrun)
            "read_builder": PacketBuilder(num_qps=nq, num_cqs=nc, merge_messages=False, back_to_back=True,
                                          buffer_beats=READ_BUFFER_BEATS),
            "response_merge": ResponseMerge(num_qps=nq, num_cqs=nc),
            # two-sided verbs: each request that consumes a receive WQE gets it here
            "recv_queue": RecvQueue(num_qps=nq, max_sge=P.RECV_MAX_SGE, depth=P.RECV_PREFETCH, pool=P.RECV_POOL,
                                    max_reads=P.RECV_MAX_READS, axi_id=P.AXI_ID_RECV_QUEUE,
                                    id_width=P.AXI_ID_WIDTH),
            # (a create waits here: the RecvQueue takes it between its own operations, and the
            # top's QP commit needs a ready that does not depend on its valid)
            "recv_create_fifo": StreamFifo(RecvCreate(nq), 4),   # (2: a 1-deep inner FIFO, 0-bit pointers)
            "recv_gate": RecvGate(num_qps=nq, max_sge=P.RECV_MAX_SGE, depth=RECV_GATE_DEPTH,
                                  cache_age=P.RECV_EMPTY_CACHE_AGE),
            # a QP gone to ERR (fatal error, QP_MODIFY): its receive WQEs flushed in order, by
            # flush requests that go the packets' way through the gate and the responder
            "recv_flush": RecvFlush(num_qps=nq),
            "recv_error_split": PairSplitter(unsigned(qp_bits(nq))),
            "recv_cqe_split": PairSplitter(RecvCqe),
            "recv_cqe_fifo": StreamFifo(RecvCqe, RECV_CQE_QUEUE),
            "recv_cqe_writer": RecvCqeWriter(num_cqs=nc),
        }
        b = self._blocks
        self._ports = [
            (b["rx_resegmenter"], {"beats": "beats"}),
            (b["rx_keep_join"], {"keep": "candidates"}),
            (b["recv_flush"], {"requests": "i"}),
            (b["recv_create_fifo"], {"recv_create": "i"}),
            (b["recv_queue"], {"recv_dma": "m_axi"}),
            (b["recv_cqe_writer"], {"cq_commit": "commit", "recv_cqe_dma": "dma", "recv_cqes": "written",
                                    "recv_errors": "errors"}),
            (b["responder"], {"commit": "commit", "modify": "modify",
                              "mr_commit": "mr_commit", "verdict_valid": "verdict_valid", "verdict": "verdict",
                              "rnr_naks": "rnr_naks"}),
            (b["ack_addresser"], {"peer_commit": "commit"}),
            (b["ack_builder"], {"port_mac": "port_mac", "port_ip": "port_ip"}),
            (b["response_merge"], {"frames": "o"}),
            (b["read_fetch"], {"read_dma": "dma"}),
            (b["rx_write_issuer"], {"dma": "p0", "dma_rx": "p1"}),
            (b["read_join"], {"read_verdicts": "verdicts"}),
            (b["atomic_dma"], {"atomic_rd": "rd", "atomic_wr": "wr"}),
        ]
        super().__init__(self._blocks, self._ports, {"acks_sent": Out(2), "naks_sent": Out(2),
                                                     "acks_coalesced": Out(2), "read_landed": Out(1),
                                                     "recv_ready": Out(1)})

    def elaborate(self, platform):
        m = self.wire()
        b = self._blocks
        rsp, rpw = b["responder"], b["rx_writer"]
        wiring.connect(m, b["rx_resegmenter"].o, b["rx_seg_fifo"].i)
        wiring.connect(m, b["rx_seg_fifo"].o, rpw.beats)
        gate, rq, fl = b["recv_gate"], b["recv_queue"], b["recv_flush"]
        wiring.connect(m, fl.o, gate.i)
        wiring.connect(m, rsp.errors, b["recv_error_split"].i)
        wiring.connect(m, b["recv_error_split"].o, fl.errors)
        m.d.comb += [fl.modify.valid.eq(rsp.modify.valid), fl.modify.p.eq(rsp.modify.p),
                     fl.flushed.eq(rsp.flushed), fl.more.eq(rsp.flush_more)]
        wiring.connect(m, b["recv_create_fifo"].o, rq.create)
        # (the gate keeps its own bit per QP of whether it has a receive queue)
        m.d.comb += [gate.create_valid.eq(b["recv_create_fifo"].o.valid & rq.create.ready),
                     gate.create.eq(b["recv_create_fifo"].o.p)]
        m.d.comb += self.recv_ready.eq(rq.ready)
        wiring.connect(m, gate.query, rq.query)
        wiring.connect(m, rq.answer, gate.answer)
        wiring.connect(m, gate.consume, rq.consume)
        wiring.connect(m, rq.wqe, gate.wqe)
        # the responder's decisions back to the RecvQueue (commits, numbering corrections)
        # and its lookups of the WQE a packet must use when it holds another
        wiring.connect(m, rsp.sync, rq.sync)
        wiring.connect(m, rsp.lookup, rq.lookup)
        wiring.connect(m, rq.found, rsp.found)
        m.d.comb += rsp.sync_idle.eq(rq.sync_idle)
        m.d.comb += [rsp.packets.valid.eq(gate.o.valid), rsp.packets.p.eq(gate.o.p.pair), rsp.rwqe.eq(gate.o.p.wqe),
                     gate.o.ready.eq(rsp.packets.ready)]
        wiring.connect(m, rsp.cqes, b["recv_cqe_split"].i)
        wiring.connect(m, b["recv_cqe_split"].o, b["recv_cqe_fifo"].i)
        wiring.connect(m, b["recv_cqe_fifo"].o, b["recv_cqe_writer"].cqes)
        wiring.connect(m, rsp.commands, b["rx_cmd_fifo"].i)
        wiring.connect(m, b["rx_cmd_fifo"].o, b["read_join"].i)
        wiring.connect(m, b["read_join"].o, b["scatter_split"].i)
        wiring.connect(m, b["scatter_split"].o, b["rx_write_sorter"].i)
        wiring.connect(m, b["rx_write_sorter"].commands, b["rx_writer_cmd_fifo"].i)
        wiring.connect(m, b["rx_writer_cmd_fifo"].o, rpw.commands)
        wiring.connect(m, b["rx_write_sorter"].verdicts, b["rx_verdict_fifo"].i)
        wiring.connect(m, b["rx_verdict_fifo"].o, b["rx_keep_join"].verdicts)
        wiring.connect(m, b["rx_keep_join"].keep, b["rx_resegmenter"].keep)
        wiring.connect(m, b["rx_write_sorter"].orders, b["rx_order_fifo"].i)
        wiring.connect(m, b["rx_order_fifo"].o, b["rx_write_issuer"].orders)
        wiring.connect(m, rpw.dma, b["rx_write_issuer"].writer)
        wiring.connect(m, rsp.responses, b["ack_coalescer"].i)
        wiring.connect(m, b["ack_coalescer"].o, b["ack_fifo"].i)
        m.d.comb += b["ack_coalescer"].backlog.eq(b["ack_fifo"].level >= ACK_BACKLOG)
        wiring.connect(m, b["ack_fifo"].o, b["atomic_ack_join"].i)
        wiring.connect(m, b["atomic_ack_join"].o, b["ack_addresser"].i)
        au = b["atomic_unit"]
        wiring.connect(m, rsp.atomics, b["atomic_split"].i)
        wiring.connect(m, b["atomic_split"].o, b["atomic_fifo"].i)
        wiring.connect(m, b["atomic_fifo"].o, au.requests)
        wiring.connect(m, au.results, b["atomic_ack_join"].results)
        wiring.connect(m, au.rd_req, b["atomic_dma"].rd_req)
        wiring.connect(m, b["atomic_dma"].rd_resp, au.rd_resp)
        wiring.connect(m, au.wr_req, b["atomic_dma"].wr_req)
        # (a create is always taken: the unit's commit is ready but in the cycle after one,
        # and creates come many cycles apart over the control path)
        wi = b["rx_write_issuer"]
        m.d.comb += [au.wr_done.eq(b["atomic_dma"].wr_done),
                     au.landed.eq(wi.fence_done & ~wi.fence_read & ~wi.fence_local & ~wi.fence_cqe),
                     b["recv_cqe_writer"].landed.eq(wi.fence_done & wi.fence_cqe),
                     self.read_landed.eq(wi.fence_done & wi.fence_local),
                     au.commit.valid.eq(self.commit.valid), au.commit.p.qpn.eq(self.commit.p.qpn)]
        wiring.connect(m, b["ack_addresser"].o, b["ack_builder"].requests)
        # READs
        rs, rb = b["read_source"], b["read_builder"]
        wiring.connect(m, rsp.reads, b["read_split"].i)
        wiring.connect(m, b["read_split"].o, b["read_fifo"].i)
        wiring.connect(m, b["read_fifo"].o, rs.jobs)
        m.d.comb += [rs.landed.eq(wi.fence_done & wi.fence_read & ~wi.fence_local),
                     rs.commit.valid.eq(self.peer_commit.valid), rs.commit.p.eq(self.peer_commit.p)]
        wiring.connect(m, rs.messages, b["read_fetch"].messages_in)
        wiring.connect(m, b["read_fetch"].messages_out, b["read_msg_fifo"].i)
        wiring.connect(m, b["read_msg_fifo"].o, rb.messages)
        wiring.connect(m, b["read_fetch"].payload, rb.payload)
        m.d.comb += rb.payload_level.eq(b["read_fetch"].level)
        m.d.comb += [rb.port_mac.eq(self.port_mac), rb.port_ip.eq(self.port_ip), rb.inline.valid.eq(0)]
        wiring.connect(m, b["ack_builder"].frames, b["response_merge"].acks)
        wiring.connect(m, rb.frames, b["response_merge"].reads)
        m.d.comb += [rsp.answered.eq(b["response_merge"].answered),
                     rsp.answered_qpn.eq(b["response_merge"].answered_qpn)]
        # ACK/NAKs sent, up to two a cycle (queued: the coalesced ones are counted apart)
        resp_sent = Signal()
        queued = b["atomic_ack_join"].o      # (after the join: a retried atomic without a record gets no answer)
        resp = queued.p
        m.d.comb += [resp_sent.eq(queued.valid & queued.ready), self.acks_coalesced.eq(b["ack_coalescer"].coalesced)]
        lanes = [resp_sent, resp_sent & resp.second]
        m.d.comb += [
            # (a READ's place holder is no ACK: its responses are counted as frames)
            self.acks_sent.eq(sum(lanes[k] & (resp.p[k].syndrome == F.Aeth.ACK) & ~resp.p[k].read for k in range(2))),
            self.naks_sent.eq(sum(lanes[k] & (resp.p[k].syndrome != F.Aeth.ACK) for k in range(2))),
        ]
        return m
