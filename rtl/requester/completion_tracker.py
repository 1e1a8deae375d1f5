"""Requester side of RC: completions wait for their ACK; NAKs and timeouts trigger go-back-N."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.memory import Memory
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from spec.formats import Aeth, Syndrome, PSN_BITS, PSN_HALF, RNR_RETRY_FOREVER, RNR_TIMER_NS
from spec.params import CLOCK_MHZ
from rtl.common.contexts import qp_bits
from rtl.common.records import AckRecord, Completion, PacketNote

__all__ = ["CompletionTracker", "Retransmit"]



def Retransmit(num_qps):
    """Go back: fetch the QP's WQEs again from ``index`` (whose first PSN is ``psn``) and
    send again from PSN ``skip_to`` (the WQE parser's ``retransmit`` port). ``fail``: do
    not send; fail the WQE holding ``skip_to`` with ``syndrome`` and flush the ones after."""
    return data.StructLayout({"qpn": unsigned(qp_bits(num_qps)), "index": unsigned(16), "psn": unsigned(PSN_BITS),
                              "skip_to": unsigned(PSN_BITS), "fail": unsigned(1), "syndrome": unsigned(8)})


class CompletionTracker(wiring.Component):
    """Holds each RC QP's completions until an ACK covers them, and drives go-back-N.

    Completions: a completion of the transmit path (a signaled WQE whose last packet has
    left, a NOP, a WQE that failed locally) carries the PSN of its message's last packet
    and the index of the WQE after it. A UC QP's completion passes at once. An RC QP's
    completion waits in the QP's queue until the QP's acknowledged PSN reaches it (serial
    arithmetic mod 2^24), and leaves in order. A completion of a WQE already queued or
    released (a retransmitted WQE) is dropped.

    Queues: every QP's queue is a linked list in one shared pool of ``pool`` entries (a
    RAM of completions beside a RAM of links, free entries in a FIFO), so one QP may
    hold every entry the others do not: a QP that signals every WQE (DeepEP) waits for
    ACKs, not for a per-QP limit. A full pool holds the transmit path until ACKs free
    entries. Entries a QP can no longer release (its failure, or a create of the QP
    again) are counted ``dead`` and freed by the drain, like released ones, without
    going out; a drain releases at most 16 entries a visit (so a QP create waits for at
    most 16) and marks the QP for the scan to finish it.

    Go-back-N: the QP's restart point is the WQE after its last released completion
    (index and first PSN). A PSN-sequence NAK for PSN e acknowledges every PSN before e
    and sends a ``retransmit`` from the restart point, skipping to e. An ACK timer per
    QP runs while packets wait for their ACK, whether their WQEs are signaled or not:
    ``sent`` notes each RC packet's PSN (in a RAM of the last PSN per QP, written at
    any rate), and the timer is armed while that PSN or a waiting completion is not
    acknowledged. A scanner visits one QP per idle cycle: it arms the timer of a QP with
    unacknowledged packets (so a timer starts within one scan round of the send, never
    before it), disarms one with none, and when an armed timer has run out sends a
    retransmit skipping to the first unacknowledged PSN. After a go-back (until the
    next ACK progress) it also waits until a timeout has passed since the QP's last
    packet left, so a retransmission restarts the timer when it leaves, not when it was
    decided (the WQEs and payload are read again from GPU memory first). A completion queued while no
    timer runs arms it too. ACK progress restarts the timer (and disarms it when the
    last PSN sent is acknowledged) and clears the retry count; a timeout adds one.

    Failure: a timeout past the QP's retry count (TRANSPORT_RETRY_EXC_ERR), or a NAK
    invalid request / remote access / remote operational error (REMOTE_INVAL_REQ_ERR /
    REMOTE_ACCESS_ERR / REMOTE_OP_ERR; another NAK code: BAD_RESP_ERR) fails the QP. The
    completions covered (a NAK acknowledges every PSN before its own) are released, the
    rest of the queue is emptied, and a ``retransmit`` with ``fail`` has the WQE parser
    walk the WQEs again: the WQE holding the failing PSN leaves with the error syndrome,
    every later one, also those posted afterwards, with WR_FLUSH_ERR. From then on the
    QP's error completions pass in order and its other completions (WQEs that were in
    the transmit path) are dropped: their WQEs are flushed by the walk. ACKs, NAKs and
    the timer no longer move a failed QP. A QP create clears the failure.

    RNR (the responder had no receive WQE): an RNR NAK for PSN e acknowledges every PSN
    before e, as a NAK does, then the QP waits the NAK's timer (IBTA's table,
    ``spec.formats.RNR_TIMER_NS``, in cycles) on its ACK timer, and the scan sends a
    ``retransmit`` skipping to e when it runs out; meanwhile the ACK timeout does not run.
    Each RNR NAK without ACK progress since the last one counts against the QP's
    ``rnr_retry`` (7: no limit; progress starts the count again); the one past it fails
    the QP as a fatal NAK does, with RNR_RETRY_EXC_ERR (``failed`` strobes, as for the
    retry count).

    One sequencer serves, in this order: QP creates, then received ACK/NAKs and new
    completions (taking turns when both wait), then the timer scan. An operation reads the QP's state in one cycle and
    decides in the next; releasing completions takes one cycle each.

    Parameters
    ----------
    num_qps, num_cqs : int
        Table sizes.
    pool : int
        Waiting completions, all QPs together (a power of two).

    Members
    -------
    sent : In(stream.Signature(Completion))
        Completions from the transmit path, in send order.
    acks : In(stream.Signature(AckRecord))
        ACK/NAK frames received for this NIC's QPs.
    packets : In(PacketNote)
        The PSN of each RC request packet sent (also retransmitted ones), any cycle.
    commit : In(stream.Signature(...))
        ``qpn``, ``start_psn``, ``timeout`` (cycles), ``retry_cnt``: a QP create.
    flush : In(stream.Signature(...))
        ``qpn``: the control path moved the RC QP to ERR. Unless it has failed already,
        it fails as on a fatal NAK, with WR_FLUSH_ERR for every WQE not acknowledged: the
        failure walk skips to the first unacknowledged PSN.
    completions : Out(stream.Signature(Completion))
        To the CQE writer.
    retransmit : Out(stream.Signature(Retransmit))
        To the WQE parser.
    naks, retransmits, timeouts, retry_exceeded : Out(1)
        One strobe per event (counters).
    failed : Out(valid, qpn)
        A QP failed by its retry count (so the ``ResponseChecker`` drops its responses).
    """
    DRAIN_BUDGET = 16       # entries a drain releases or frees per visit

    def __init__(self, *, num_qps, num_cqs, pool=4096):
        if not isinstance(num_qps, int) or num_qps < 2 or num_qps & (num_qps - 1):
            raise ValueError(f"num_qps must be a power of two >= 2, not {num_qps!r}")
        if not isinstance(pool, int) or pool < 2 or pool & (pool - 1):
            raise ValueError(f"pool must be a power of two >= 2, not {pool!r}")
        self.num_qps, self.num_cqs, self.pool = num_qps, num_cqs, pool
        cpl = Completion(num_qps, num_cqs)
        super().__init__({
            "sent": In(stream.Signature(cpl)),
            "acks": In(stream.Signature(AckRecord)),
            "packets": In(PacketNote(num_qps)),
            "commit": In(stream.Signature(data.StructLayout({
                "qpn": unsigned(qp_bits(num_qps)), "start_psn": unsigned(PSN_BITS),
                "timeout": unsigned(32), "retry_cnt": unsigned(3), "rnr_retry": unsigned(3)}))),
            "flush": In(stream.Signature(data.StructLayout({"qpn": unsigned(qp_bits(num_qps))}))),
            "completions": Out(stream.Signature(cpl)),
            "retransmit": Out(stream.Signature(Retransmit(num_qps))),
            "naks": Out(1), "retransmits": Out(1), "timeouts": Out(1), "retry_exceeded": Out(1),
            "rnr_naks": Out(1),
            "failed": Out(data.StructLayout({"valid": unsigned(1), "qpn": unsigned(qp_bits(num_qps))})),
        })

    def elaborate(self, platform):
        m = Module()
        qb, pb = qp_bits(self.num_qps), (self.pool - 1).bit_length()
        cpl_layout = Completion(self.num_qps, self.num_cqs)
        state_layout = data.StructLayout({
            # the QP's list in the pool: first and last entry, entries, dead ones at the head
            "head": unsigned(pb), "tail": unsigned(pb), "count": unsigned(pb + 1), "dead": unsigned(pb + 1),
            "more": unsigned(1),                             # a drain stopped at its budget
            "acked": unsigned(PSN_BITS),                     # last acknowledged PSN
            "rs_index": unsigned(16), "rs_psn": unsigned(PSN_BITS),   # restart point
            "last_index": unsigned(16), "has_last": unsigned(1),      # last WQE queued or released
            "deadline": unsigned(32), "armed": unsigned(1), "retries": unsigned(3), "failed": unsigned(1),
            "rtx_sent": unsigned(1),                         # a go-back since the last ACK progress
            "rtx_pending": unsigned(1), "rtx_skip": unsigned(PSN_BITS),   # a retransmit not yet taken
            "rtx_fail": unsigned(1), "rtx_syn": unsigned(8),
            "timeout": unsigned(32), "retry_cnt": unsigned(3),
            "rnr_retry": unsigned(3), "rnr_count": unsigned(3),          # RNR NAKs since ACK progress
            "rnr_wait": unsigned(1), "rnr_skip": unsigned(PSN_BITS),     # waiting an RNR timer, then from there
        })
        m.submodules.state = st_ram = Memory(shape=state_layout, depth=self.num_qps, init=[])
        m.submodules.pool = q_ram = Memory(shape=cpl_layout, depth=self.pool, init=[])
        m.submodules.links = ln_ram = Memory(shape=unsigned(pb), depth=self.pool, init=[])
        st_wr, st_rd = st_ram.write_port(), st_ram.read_port(transparent_for=())
        q_wr, q_rd = q_ram.write_port(), q_ram.read_port(transparent_for=())
        ln_wr, ln_rd = ln_ram.write_port(), ln_ram.read_port(transparent_for=())
        m.d.comb += [st_rd.en.eq(1), q_rd.en.eq(1), ln_rd.en.eq(1), ln_rd.addr.eq(q_rd.addr)]
        # Free entries: those never used (``fresh`` counts them out after reset), then the
        # freed ones, from a FIFO (pushed by the drain, popped by an enqueue: never both)
        m.submodules.free = free = SyncFIFOBuffered(width=pb, depth=self.pool)
        fresh = Signal(pb + 1)
        alloc_ok = Signal()
        alloc = Signal(pb)
        m.d.comb += [alloc_ok.eq(~fresh[pb] | free.r_rdy), alloc.eq(Mux(~fresh[pb], fresh[:pb], free.r_data))]
        now = Signal(32)                                   # cycles, for the ACK timers
        m.d.sync += now.eq(now + 1)
        # The last PSN sent per QP: written by the transmit path (any cycle) and cleared by
        # a QP create (never in the same cycle for one QP: a create waits until the QP is
        # idle); read beside the state, for the ACK and the scan.
        sent_layout = data.StructLayout({"valid": unsigned(1), "psn": unsigned(PSN_BITS), "time": unsigned(32)})
        m.submodules.sent_psn = sent_ram = Memory(shape=sent_layout, depth=self.num_qps, init=[])
        sp_wr, sp_clr, sp_rd = sent_ram.write_port(), sent_ram.write_port(), sent_ram.read_port(transparent_for=())
        m.d.comb += [sp_rd.en.eq(1), sp_rd.addr.eq(st_rd.addr),
                     sp_wr.en.eq(self.packets.valid), sp_wr.addr.eq(self.packets.qpn),
                     sp_wr.data.valid.eq(1), sp_wr.data.psn.eq(self.packets.psn), sp_wr.data.time.eq(now)]
        last_sent = Signal(sent_layout)
        m.d.comb += last_sent.eq(sp_rd.data)


        def covered(psn, acked):
            # psn <= acked in serial arithmetic
            return (acked - psn)[:PSN_BITS] < PSN_HALF

        qpn = Signal(qb)
        st = Signal(state_layout)       # the QP's state as read from RAM
        st_reg = Signal(state_layout)   # the QP's state while releasing / retransmitting
        ack = Signal(AckRecord)
        cpl = Signal(cpl_layout)
        scan = Signal(qb)               # the timer scanner's next QP
        sent_first = Signal()           # ACKs and completions take turns when both wait
        nak_rtx = Signal()              # after the release: a PSN-sequence NAK sends again
        nak_fail = Signal()             # after the release: a fatal NAK fails the QP
        rtx_from = Signal(PSN_BITS)
        rtx_fail = Signal()             # the retransmit to send is a failure walk ...
        rtx_syn = Signal(8)             # ... with this syndrome
        rtx = self.retransmit
        with m.If(rtx.valid & rtx.ready):
            m.d.sync += rtx.valid.eq(0)
        rtx_free = Signal()
        m.d.comb += rtx_free.eq(~rtx.valid | rtx.ready)

        # Two output registers: UC completions pass through their own, whatever the
        # sequencer does (so a UC QP's CQE timing is the transmit path's alone); RC ones
        # leave through the sequencer's. The UC one goes first when both are full.
        out = stream.Signature(cpl_layout).create(path=("rc_out",))   # the sequencer's
        uc_out = stream.Signature(cpl_layout).create(path=("uc_out",))
        cmp = self.completions
        m.d.comb += [
            cmp.valid.eq(uc_out.valid | out.valid),
            cmp.p.eq(Mux(uc_out.valid, uc_out.p.as_value(), out.p.as_value())),
            uc_out.ready.eq(cmp.ready), out.ready.eq(cmp.ready & ~uc_out.valid),
        ]
        for s_ in (out, uc_out):
            with m.If(s_.valid & s_.ready):
                m.d.sync += s_.valid.eq(0)
        out_free = Signal()
        uc_free = Signal()
        m.d.comb += [out_free.eq(~out.valid | out.ready), uc_free.eq(~uc_out.valid | uc_out.ready)]
        sent_rc_ready = Signal()          # the sequencer takes the RC completion at the head
        m.d.comb += self.sent.ready.eq(Mux(self.sent.p.uc, uc_free, sent_rc_ready))
        with m.If(self.sent.valid & self.sent.p.uc & uc_free):
            m.d.sync += [uc_out.valid.eq(1), uc_out.p.eq(self.sent.p)]

        commit = Signal.like(self.commit.p)
        budget = Signal(range(self.DRAIN_BUDGET + 1))   # entries the drain may still take

        def write_state(value):
            m.d.comb += [st_wr.en.eq(1), st_wr.addr.eq(qpn), st_wr.data.eq(value)]

        with m.FSM():
            with m.State("IDLE"):
                # (not dependent on valid: commits join others)
                m.d.comb += [self.commit.ready.eq(1), self.flush.ready.eq(1)]
                with m.If(self.commit.valid):
                    m.d.comb += st_rd.addr.eq(self.commit.p.qpn)
                    m.d.sync += [commit.eq(self.commit.p), qpn.eq(self.commit.p.qpn)]
                    m.next = "COMMIT"
                with m.Elif(self.flush.valid):
                    m.d.comb += st_rd.addr.eq(self.flush.p.qpn)
                    m.d.sync += qpn.eq(self.flush.p.qpn)
                    m.next = "FLUSH"
                with m.Elif(self.acks.valid & ~(sent_first & self.sent.valid & ~self.sent.p.uc)):
                    m.d.comb += [self.acks.ready.eq(1), st_rd.addr.eq(self.acks.p.qpn[:qb])]
                    m.d.sync += [ack.eq(self.acks.p), qpn.eq(self.acks.p.qpn[:qb]), sent_first.eq(1)]
                    m.next = "ACK"
                with m.Elif(self.sent.valid & ~self.sent.p.uc):
                    # (a full queue sends it back here: the ACKs that free it go next)
                    m.d.comb += st_rd.addr.eq(self.sent.p.qpn)
                    m.d.sync += [cpl.eq(self.sent.p), qpn.eq(self.sent.p.qpn), sent_first.eq(0)]
                    m.next = "ENQUEUE"
                with m.Else():
                    m.d.comb += st_rd.addr.eq(scan)
                    m.d.sync += [qpn.eq(scan), scan.eq(scan + 1)]
                    m.next = "SCAN"

            with m.State("COMMIT"):
                # a fresh QP: its list stays, every entry in it dead (the drain frees them)
                m.d.comb += st.eq(st_rd.data)
                c = commit
                m.d.comb += [st_wr.en.eq(1), st_wr.addr.eq(c.qpn), st_wr.data.eq(0),
                             st_wr.data.head.eq(st.head), st_wr.data.tail.eq(st.tail),
                             st_wr.data.count.eq(st.count), st_wr.data.dead.eq(st.count),
                             st_wr.data.acked.eq(c.start_psn - 1), st_wr.data.rs_psn.eq(c.start_psn),
                             st_wr.data.timeout.eq(c.timeout), st_wr.data.retry_cnt.eq(c.retry_cnt),
                             st_wr.data.rnr_retry.eq(c.rnr_retry),
                             sp_clr.en.eq(1), sp_clr.addr.eq(c.qpn), sp_clr.data.eq(0)]
                m.next = "IDLE"

            with m.State("FLUSH"):
                # moved to ERR: a failure walk from the restart point, the WQE holding the
                # first unacknowledged PSN and all after it with WR_FLUSH_ERR; the waiting
                # completions are dead (their WQEs are flushed by the walk)
                m.d.comb += st.eq(st_rd.data)
                m.next = "IDLE"
                with m.If(~st.failed):
                    m.d.comb += [self.failed.valid.eq(1), self.failed.qpn.eq(qpn)]
                    m.d.sync += [st_reg.eq(st), st_reg.failed.eq(1), st_reg.dead.eq(st.count), st_reg.more.eq(0),
                                 rtx_from.eq(st.acked + 1), rtx_fail.eq(1), rtx_syn.eq(Syndrome.WR_FLUSH_ERR)]
                    m.next = "RETX"

            with m.State("ENQUEUE"):
                m.d.comb += st.eq(st_rd.data)
                empty = st.count == st.dead                  # nothing live waits
                full = ~alloc_ok
                seen = st.has_last & ((cpl.index - st.last_index)[15] | (cpl.index == st.last_index))
                nxt = Signal(state_layout)
                m.d.comb += [nxt.eq(st), nxt.last_index.eq(cpl.index), nxt.has_last.eq(1)]
                with m.If(st.failed):
                    # the failure walk's error CQEs go out in order; a completion of a WQE
                    # that was in the transmit path is dropped (the walk flushes its WQE)
                    with m.If(~cpl.error):
                        m.d.comb += sent_rc_ready.eq(1)
                        m.next = "IDLE"
                    with m.Elif(out_free):
                        m.d.comb += sent_rc_ready.eq(1)
                        m.d.sync += [out.valid.eq(1), out.p.eq(cpl)]
                        m.next = "IDLE"
                with m.Elif(seen):
                    # a retransmitted WQE's second completion
                    m.d.comb += sent_rc_ready.eq(1)
                    m.next = "IDLE"
                with m.Elif(empty & covered(cpl.psn, st.acked)):
                    # already acknowledged (a NOP behind acknowledged work): out at once
                    with m.If(out_free):
                        m.d.comb += [sent_rc_ready.eq(1), nxt.rs_index.eq(cpl.next_index),
                                     nxt.rs_psn.eq(cpl.psn + 1)]
                        write_state(nxt)
                        m.d.sync += [out.valid.eq(1), out.p.eq(cpl)]
                        m.next = "IDLE"
                with m.Elif(~full):
                    m.d.comb += [sent_rc_ready.eq(1),
                                 q_wr.en.eq(1), q_wr.addr.eq(alloc), q_wr.data.eq(cpl),
                                 ln_wr.en.eq(st.count != 0), ln_wr.addr.eq(st.tail), ln_wr.data.eq(alloc),
                                 nxt.tail.eq(alloc), nxt.count.eq(st.count + 1),
                                 free.r_en.eq(fresh[pb])]
                    with m.If(st.count == 0):
                        m.d.comb += nxt.head.eq(alloc)
                    with m.If(~fresh[pb]):
                        m.d.sync += fresh.eq(fresh + 1)
                    with m.If(~st.armed):
                        m.d.comb += [nxt.deadline.eq(now + st.timeout), nxt.armed.eq(1)]   # the timer starts
                    write_state(nxt)
                    m.next = "IDLE"
                with m.Else():
                    m.next = "IDLE"          # full: try again after the ACKs waiting

            with m.State("ACK"):
                m.d.comb += st.eq(st_rd.data)
                kind = ack.syndrome[5:7]
                is_ack = kind == Aeth.KIND_ACK
                is_seq_nak = ack.syndrome == Aeth.NAK_PSN_SEQ
                is_nak = kind == Aeth.KIND_NAK
                is_fatal = is_nak & ~is_seq_nak
                is_rnr = kind == Aeth.KIND_RNR
                m.d.comb += self.naks.eq(is_nak)
                # an ACK acknowledges its PSN; a NAK (RNR too) every PSN before its PSN
                upto = Signal(PSN_BITS)
                m.d.comb += upto.eq(Mux(is_nak | is_rnr, ack.psn - 1, ack.psn))
                newer = Signal()
                m.d.comb += newer.eq((is_ack | is_nak | is_rnr) & ~covered(upto, st.acked) & ~st.failed)
                nxt = Signal(state_layout)
                m.d.comb += nxt.eq(st)
                left = Signal()                       # packets sent and still not acknowledged
                m.d.comb += left.eq(last_sent.valid & ~covered(last_sent.psn, upto))
                with m.If(newer):
                    # progress: the timer starts afresh, or stops when every PSN sent is
                    # acknowledged (a packet sent just now re-arms it at the scan); an RNR
                    # wait keeps its end while packets are left to resend
                    m.d.comb += [nxt.acked.eq(upto), nxt.retries.eq(0), nxt.armed.eq(left), nxt.rtx_sent.eq(0),
                                 nxt.rnr_count.eq(0)]
                    with m.If(~(st.rnr_wait & left)):
                        m.d.comb += [nxt.deadline.eq(now + st.timeout), nxt.rnr_wait.eq(0)]
                # while an RNR NAK's timer runs, that NAK again, or a sequence NAK at its PSN
                # (the responder saw what followed it), changes nothing
                waited = Signal()
                m.d.comb += waited.eq(st.rnr_wait & (ack.psn == st.rnr_skip) & (is_rnr | is_seq_nak))
                m.d.comb += self.rnr_naks.eq(is_rnr & ~waited & ~st.failed)
                # RNR: wait the NAK's timer (cycles from IBTA's table), then go back to its PSN;
                # one past the QP's rnr_retry fails it (7: never)
                rnr_cycles = Array(Const(ns * CLOCK_MHZ // 1000, 32) for ns in RNR_TIMER_NS)
                rnr_now = Signal()                    # an RNR NAK for the QP's next unacknowledged PSN
                m.d.comb += rnr_now.eq(is_rnr & ~st.failed & ~covered(ack.psn, st.acked) & ~waited)
                rnr_used = Signal(3)
                m.d.comb += rnr_used.eq(Mux(newer, 0, st.rnr_count))
                rnr_fail = Signal()
                m.d.comb += rnr_fail.eq(rnr_now & (st.rnr_retry != RNR_RETRY_FOREVER) & (rnr_used >= st.rnr_retry))
                with m.If(rnr_now & ~rnr_fail):
                    m.d.comb += [nxt.rnr_wait.eq(1), nxt.rnr_skip.eq(ack.psn), nxt.armed.eq(1),
                                 nxt.deadline.eq(now + rnr_cycles[ack.syndrome[:5]]),
                                 nxt.rnr_count.eq(rnr_used + (st.rnr_retry != RNR_RETRY_FOREVER))]
                with m.If(rnr_fail):
                    m.d.comb += [self.failed.valid.eq(1), self.failed.qpn.eq(qpn)]
                write_state(nxt)
                fatal_syn = Signal(8)
                with m.Switch(ack.syndrome):
                    with m.Case(Aeth.NAK_INVALID_REQ):
                        m.d.comb += fatal_syn.eq(Syndrome.REMOTE_INVAL_REQ_ERR)
                    with m.Case(Aeth.NAK_REMOTE_ACCESS):
                        m.d.comb += fatal_syn.eq(Syndrome.REMOTE_ACCESS_ERR)
                    with m.Case(Aeth.NAK_REMOTE_OP):
                        m.d.comb += fatal_syn.eq(Syndrome.REMOTE_OP_ERR)
                    with m.Default():
                        m.d.comb += fatal_syn.eq(Syndrome.BAD_RESP_ERR)
                m.d.sync += [st_reg.eq(nxt), nak_rtx.eq(is_seq_nak & ~st.failed & ~waited),
                             nak_fail.eq((is_fatal & ~st.failed) | rnr_fail),
                             rtx_from.eq(ack.psn), rtx_fail.eq(is_fatal | rnr_fail),
                             rtx_syn.eq(Mux(is_rnr, Syndrome.RNR_RETRY_EXC_ERR, fatal_syn))]
                m.d.comb += q_rd.addr.eq(st.head)
                m.d.sync += budget.eq(self.DRAIN_BUDGET)
                m.next = "DRAIN"

            with m.State("DRAIN"):
                # st_reg is the QP's state; q_rd.data the head entry, ln_rd.data its link.
                # Dead entries are freed first; then live ones go out while an ACK covers
                # them. A go-back or failure drains all it covers (they are rare), other
                # visits at most DRAIN_BUDGET entries.
                head = q_rd.data
                upd = Signal(state_layout)
                m.d.comb += [upd.eq(st_reg), upd.head.eq(ln_rd.data), upd.count.eq(st_reg.count - 1)]
                dead = st_reg.dead != 0
                live = (st_reg.count != 0) & covered(head.psn, st_reg.acked)
                spent = (budget == 0) & ~nak_rtx & ~nak_fail
                with m.If(~(dead | live) | spent):
                    m.next = "IDLE"
                    m.d.comb += [upd.eq(st_reg), upd.more.eq(spent)]
                    write_state(upd)
                    with m.If(nak_rtx):
                        m.next = "RETX"
                    with m.If(nak_fail):
                        # the rest of the queue is flushed by the failure walk; its entries
                        # are freed by later drains
                        m.d.sync += [st_reg.failed.eq(1), st_reg.dead.eq(st_reg.count), st_reg.more.eq(0)]
                        m.next = "RETX"
                with m.Elif(dead | out_free):
                    with m.If(dead):
                        m.d.comb += upd.dead.eq(st_reg.dead - 1)
                    with m.Else():
                        m.d.comb += [upd.rs_index.eq(head.next_index), upd.rs_psn.eq(head.psn + 1)]
                        m.d.sync += [out.valid.eq(1), out.p.eq(head)]
                    m.d.comb += [free.w_en.eq(1), free.w_data.eq(st_reg.head)]
                    m.d.sync += [st_reg.eq(upd), budget.eq(budget - (budget != 0))]
                    write_state(upd)
                    m.d.comb += q_rd.addr.eq(ln_rd.data)
                with m.Else():
                    m.d.comb += q_rd.addr.eq(st_reg.head)

            with m.State("SCAN"):
                m.d.comb += st.eq(st_rd.data)
                waiting = Signal()              # completions or packets wait for an ACK
                late = Signal()                 # ... and the armed timer ran out (mod 2^32)
                m.d.comb += [
                    waiting.eq(~st.failed & ((st.count != st.dead)
                                             | (last_sent.valid & ~covered(last_sent.psn, st.acked)))),
                    # (after a go-back, also a timeout after the QP's last packet sent: a
                    # retransmission restarts the timer when it leaves, which is well after
                    # the decision when the WQEs and payload are read again from GPU memory)
                    late.eq(waiting & st.armed & ~st.rnr_wait & ~(now - st.deadline)[31]
                            & ~(st.rtx_sent & last_sent.valid & (now - (last_sent.time + st.timeout)[:32])[31])),
                ]
                with m.If(st.rtx_pending):
                    # a retransmission the parser could not take when it was decided
                    m.d.sync += [st_reg.eq(st), rtx_from.eq(st.rtx_skip), rtx_fail.eq(st.rtx_fail),
                                 rtx_syn.eq(st.rtx_syn)]
                    m.next = "RETX"
                with m.Elif(st.more | (st.dead != 0)):
                    # finish a drain cut at its budget; free the entries of a failed or
                    # created QP
                    m.d.comb += q_rd.addr.eq(st.head)
                    m.d.sync += [st_reg.eq(st), budget.eq(self.DRAIN_BUDGET), nak_rtx.eq(0), nak_fail.eq(0)]
                    m.next = "DRAIN"
                with m.Elif(st.rnr_wait & ~st.failed & ~(now - st.deadline)[31]):
                    # an RNR NAK's timer ran out: go back to its PSN (the ACK timer runs again)
                    nxt = Signal(state_layout)
                    m.d.comb += [nxt.eq(st), nxt.rnr_wait.eq(0), nxt.deadline.eq(now + st.timeout)]
                    m.d.sync += [st_reg.eq(nxt), rtx_from.eq(st.rnr_skip), rtx_fail.eq(0)]
                    m.next = "RETX"
                with m.Elif(late):
                    nxt = Signal(state_layout)
                    m.d.comb += [nxt.eq(st), nxt.retries.eq(st.retries + 1), nxt.deadline.eq(now + st.timeout)]
                    m.d.comb += self.timeouts.eq(1)
                    m.d.sync += [st_reg.eq(nxt), rtx_from.eq(st.acked + 1),
                                 rtx_fail.eq(st.retries >= st.retry_cnt), rtx_syn.eq(Syndrome.TRANSPORT_RETRY_EXC_ERR)]
                    with m.If(st.retries >= st.retry_cnt):
                        # out of retries: fail the WQE of the first unacknowledged PSN
                        m.d.comb += [self.retry_exceeded.eq(1), self.failed.valid.eq(1), self.failed.qpn.eq(qpn)]
                        m.d.sync += [st_reg.failed.eq(1), st_reg.dead.eq(st.count), st_reg.more.eq(0)]
                    m.next = "RETX"
                with m.Else():
                    with m.If(waiting != st.armed):
                        # arm the timer of a QP with packets waiting, disarm an idle one
                        nxt = Signal(state_layout)
                        m.d.comb += [nxt.eq(st), nxt.armed.eq(waiting), nxt.deadline.eq(now + st.timeout)]
                        write_state(nxt)
                    m.next = "IDLE"

            with m.State("RETX"):
                # Never wait here: the parser may be held up by the transmit path, which
                # waits on the completions this sequencer takes. A retransmission the
                # parser cannot take now is left pending in the QP's state for the scan.
                upd = Signal(state_layout)
                m.d.comb += [upd.eq(st_reg), upd.rtx_pending.eq(~rtx_free), upd.rtx_skip.eq(rtx_from),
                             upd.rtx_fail.eq(rtx_fail), upd.rtx_syn.eq(rtx_syn),
                             upd.rtx_sent.eq(st_reg.rtx_sent | (rtx_free & ~rtx_fail))]
                write_state(upd)
                with m.If(rtx_free):
                    m.d.comb += self.retransmits.eq(~rtx_fail)
                    m.d.sync += [rtx.valid.eq(1), rtx.p.qpn.eq(qpn), rtx.p.index.eq(st_reg.rs_index),
                                 rtx.p.psn.eq(st_reg.rs_psn), rtx.p.skip_to.eq(rtx_from),
                                 rtx.p.fail.eq(rtx_fail), rtx.p.syndrome.eq(rtx_syn)]
                m.next = "IDLE"
        return m
