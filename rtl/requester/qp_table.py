"""QP context table and the weighted round-robin scheduler of QPs with work."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, enum, stream, fifo
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from spec import formats as F
from spec.params import FIRST_TURN_WQEBBS, TURNS_AHEAD
from spec.formats import QpState
from rtl.common.contexts import QpConfig, QpEntry, qp_bits
from rtl.common.records import DoorbellEvent

__all__ = ["QpTable", "QpOp", "DoorbellDrop", "FetchJob", "QpUpdate", "UpdateKind", "QpCommit", "QpTurn"]


class QpOp(enum.Enum, shape=3):
    """The operation the table executes on the QP entry it has read."""
    COMMIT   = 0        # the host's QP configuration (``commit``)
    UPDATE   = 1        # the WQE fetch's progress (``updates``)
    DOORBELL = 2        # a doorbell (``doorbells``)
    SCHEDULE = 3        # the next QP of the active list: a fetch job
    TURN     = 4        # the parser's bound on the QP's turns (``turns``)


class DoorbellDrop(enum.Enum, shape=2):
    """Why the table drops a doorbell (``NONE``: it does not); counters ``db_<name>``."""
    NONE       = 0
    QP_NOT_RTS = 1      # the QP is not in RTS
    STALE      = 2      # the producer index is behind the QP's (mod 2^16)
    OVER_DEPTH = 3      # more than the send-queue depth past the fetch index


def FetchJob(num_qps, num_cqs, max_burst):
    """A burst of one QP for the WQE fetch: ``count`` WQEBBs from ``ci``.

    The burst owns the WQEs that start in its first ``own`` WQEBBs. When the QP has
    more posted than its quantum, up to its ``max_wqebbs - 1`` more are read so that the
    last owned WQE is whole; the next burst starts at ``ci + own`` and the parser
    skips what it already took.
    """
    width = (max_burst + F.MAX_WQEBBS - 1).bit_length()
    return data.StructLayout({
        "qpn": unsigned(qp_bits(num_qps)), "cfg": QpConfig(num_cqs),
        "ci": unsigned(16), "count": unsigned(width), "own": unsigned(width),
        "bf": unsigned(1),               # BlueFlame: the WQEBB comes with the doorbell, no read
        "hold": unsigned(1),             # capped with more posted: the QP waits for this burst's end
        "byte_turn": unsigned(8),        # the QP's byte-bound turn when it was scheduled (0: none)
    })


class UpdateKind(enum.Enum, shape=2):
    """What a :func:`QpUpdate` asks of the table."""
    CUT    = 0      # fetch again from ``ci`` once more than ``end`` is posted (or a go-back: ci = end)
    PARK   = 1      # fetch again from ``ci``, but not before a WAKE (a WQE waits on its READs/atomics)
    RESUME = 2      # fetch again from ``ci`` now (parked and released at once)
    WAKE   = 3      # a parked QP may run: queue it if it has work (``ci``, ``end`` unused)


def QpUpdate(num_qps):
    """From the WQE parser, only when a burst went wrong: a WQE ran past the WQEBBs
    posted when the burst was scheduled (CUT: fetch again from ``ci`` once more is
    posted; ``end`` is where the burst ended), a go-back-N restart (CUT, ``ci`` =
    ``end``), or a WQE that must wait for the QP's READs and atomics (PARK, then WAKE;
    see :class:`UpdateKind`). A malformed WQE sends none: the parser flushes the QP's
    later WQEs, so it keeps fetching them."""
    return data.StructLayout({"qpn": unsigned(qp_bits(num_qps)), "ci": unsigned(16), "end": unsigned(16),
                              "kind": UpdateKind,
                              "room": unsigned(5)})      # RESUME, WAKE: READs/atomics the QP may add


def QpTurn(num_qps):
    """From the WQE parser: turns of QP ``qpn`` are at most ``byte_turn`` WQEBBs from now on
    (what its last turn took to carry ``TURN_BYTES`` of payload; 0: no bound)."""
    return data.StructLayout({"qpn": unsigned(qp_bits(num_qps)), "byte_turn": unsigned(8)})


def QpCommit(num_qps, num_cqs):
    """A context write from the control path; ``reset`` also clears the indices (create)."""
    return data.StructLayout({"qpn": unsigned(qp_bits(num_qps)), "cfg": QpConfig(num_cqs),
                              "reset": unsigned(1)})


class QpTable(wiring.Component):
    """Per-QP context in one RAM, updated by one read-modify-write sequencer.

    The CPU commits contexts; doorbells raise the producer index ``pi``; bursts go
    out to the WQE fetch as ``jobs`` and advance the fetch index ``fi``. A QP with
    work sits once in a FIFO of QP numbers: each turn it gets one burst of up to
    ``weight x quantum`` WQEBBs and, if it has more, goes to the back of the FIFO.
    That is weighted round robin at WQEBB granularity, with state in RAM only, so it
    scales with the RAM. Bursts of one QP may be in flight back to back: the fetch
    and the parser keep them in order. A turn is also at most the QP's ``byte_turn``
    WQEBBs, when the parser has set one (``turns``): what its WQEs took to carry
    ``TURN_BYTES`` of payload, so that a QP of large messages leaves the wire to the
    other QPs (and their peers) every few messages instead of every 128.

    A burst ends at a doorbell's limit (a WQE boundary) or, when the quantum cuts the
    QP's work, reads up to ``max_wqebbs - 1`` WQEBBs beyond it (the QP's largest WQE, from
    its create; at most ``MAX_WQEBBS - 1``) so that its last WQE is whole (see
    :func:`FetchJob`): reading more costs the parser a cycle a WQEBB to drop. A WQE that
    runs past the doorbell's limit, or past that reach, is cut: the
    parser reports it on ``updates``, ``fi`` goes back to it, and it is fetched again
    when more is posted (the parser discards the bursts in flight behind it). A WQE that
    must wait for its QP's READs and atomics (their limit, or a fence) parks the QP the
    same way: off the round robin, so other QPs' WQEs pass it, until the parser wakes it.

    With ``turns_ahead`` not 0, bursts with a byte bound (``byte_turn`` not 0) that wait
    between the table and the parser are counted (``bounded_taken``: the parser took one),
    two cycles late: while the count is ``turns_ahead``, no QP is scheduled (so at most
    ``turns_ahead + 1`` wait). The WQE fetch buffer holds hundreds of WQEBBs, so without it
    a QP table that schedules as fast as doorbells come would fix the wire's order for
    large messages far ahead (512 WQEBBs of 14 KB tokens: 148 us of wire) in the order
    of their doorbells instead of in turns over every QP with work.

    Every operation takes two cycles (RAM read, then write); priority is commit,
    update, turn, doorbell, schedule.

    Parameters
    ----------
    num_qps, num_cqs : int
    quantum : int
        WQEBBs per turn for weight 1.
    max_weight : int
    first_turn : int
        WQEBBs of a QP's first turn after its create at most (when under its quantum):
        a QP that posts READs or atomics fills its ring with them and parks at that
        turn's end, instead of a whole quantum being fetched to be dropped.
    turns_ahead : int
        Byte-bound bursts scheduled and not yet taken by the parser, at most (1..31; 0: no
        bound, the default ``TURNS_AHEAD``).

    Members
    -------
    commit : In(stream.Signature(QpCommit))
    doorbells : In(stream.Signature(DoorbellEvent))
    updates : In(stream.Signature(QpUpdate))
    turns : In(stream.Signature(QpTurn))
        The parser's bound on a QP's turns (a hint: it only shortens them).
    bounded_taken : In(1)
        Strobe: the parser took a burst whose ``byte_turn`` is not 0.
    jobs : Out(stream.Signature(FetchJob))
        Its consumer must keep ``ready`` high once high until it takes a job (a FIFO).
    bf_wqebbs : Out(stream.Signature(512))
        The WQEBB of each BlueFlame job, in job order, for the parser.
    db_accepted : Out(1)
        Strobe: a doorbell was applied.
    db_drop : Out(DoorbellDrop)
        Not NONE for one cycle when a doorbell is dropped, with the reason: the QP is
        not in RTS, its producer index is behind the QP's (a stale doorbell, which
        would replay the ring), or it is more than the send-queue depth past the fetch
        index (every WQEBB before the fetch index has been read: the queue cannot hold
        more). Each doorbell gives exactly one of the two strobes.

    A BlueFlame doorbell whose WQE is the QP's only work (nothing pending, the WQE is
    the next WQEBB) becomes a job at once, without the round-robin queue, and its
    WQEBB goes to the parser: no read. Otherwise it counts as a plain doorbell (the
    WQE is in GPU memory too) and waits its turn.
    """
    def __init__(self, *, num_qps, num_cqs, quantum=32, max_weight=15, first_turn=FIRST_TURN_WQEBBS,
                 turns_ahead=TURNS_AHEAD):
        if num_qps < 2:
            raise ValueError(f"num_qps must be at least 2, not {num_qps}")
        if not 1 <= quantum <= 256:
            raise ValueError(f"quantum must be 1..256 WQEBBs, not {quantum}")
        if not 1 <= max_weight <= 15:
            raise ValueError(f"max_weight must be 1..15 (a 4-bit field), not {max_weight}")
        if not 1 <= first_turn <= 256:
            raise ValueError(f"first_turn must be 1..256 WQEBBs, not {first_turn}")
        if not 0 <= turns_ahead <= 31:
            raise ValueError(f"turns_ahead must be 0 (no bound) or 1..31 bursts, not {turns_ahead}")
        self.first_turn, self.turns_ahead = first_turn, turns_ahead
        self.num_qps, self.num_cqs, self.quantum, self.max_weight = num_qps, num_cqs, quantum, max_weight
        self.max_burst = quantum * max_weight
        super().__init__({
            "commit": In(stream.Signature(QpCommit(num_qps, num_cqs))),
            "doorbells": In(stream.Signature(DoorbellEvent(num_qps))),
            "updates": In(stream.Signature(QpUpdate(num_qps))),
            "turns": In(stream.Signature(QpTurn(num_qps))),
            "bounded_taken": In(1),
            "jobs": Out(stream.Signature(FetchJob(num_qps, num_cqs, self.max_burst))),
            "bf_wqebbs": Out(stream.Signature(8 * F.WQEBB)),
            "db_accepted": Out(1),
            "db_drop": Out(DoorbellDrop),
        })

    def elaborate(self, platform):
        m = Module()
        layout = QpEntry(self.num_cqs)
        m.submodules.ram = ram = Memory(shape=layout, depth=self.num_qps, init=[])
        rd = ram.read_port()
        m.d.comb += rd.en.eq(0)          # read ports default to always enabled; hold the data instead
        wr = ram.write_port()
        m.submodules.active = active = fifo.SyncFIFOBuffered(width=qp_bits(self.num_qps),
                                                             depth=self.num_qps)

        op = Signal(QpOp)
        qpn = Signal(qp_bits(self.num_qps))
        commit_p = Signal.like(self.commit.p)
        update_p = Signal.like(self.updates.p)
        turn_p = Signal(8)
        limit = Signal(16)
        bf = Signal()
        bf_data = Signal(8 * F.WQEBB)

        entry = Signal(layout)
        m.d.comb += [entry.eq(rd.data), wr.addr.eq(qpn)]
        new = Signal(layout)
        m.d.comb += wr.data.eq(new)

        pending = Signal(16)
        rts = Signal()                    # RTS, or ERR (its WQEs are fetched and flushed)
        weight = Signal(4)
        quantum = Signal(range(self.max_burst + 1))
        if self.max_weight < 15:
            m.d.comb += weight.eq(Mux(entry.cfg.weight > self.max_weight, self.max_weight, entry.cfg.weight))
        else:
            m.d.comb += weight.eq(entry.cfg.weight)
        weighted = Mux(weight == 0, 1, weight) * self.quantum
        # read past a cut only what the QP's largest WQE needs (its create says; 0, > 16: 16)
        reach = Signal(range(F.MAX_WQEBBS))
        size = entry.cfg.max_wqebbs
        m.d.comb += reach.eq(Mux((size == 0) | (size > F.MAX_WQEBBS), F.MAX_WQEBBS - 1, size - 1))
        plain = Mux(entry.dyn.first & (weighted > self.first_turn), self.first_turn, weighted)
        bound = entry.dyn.byte_turn
        m.d.comb += quantum.eq(Mux((bound != 0) & (bound < plain), bound, plain))

        # Byte-bound bursts ahead of the parser: counted from registers only (a job out and
        # a take, each a cycle late), so the count adds no logic to the table's paths
        ahead_full = Signal()
        if self.turns_ahead:
            ahead = Signal(range(self.turns_ahead + 3))
            out_q, taken_q = Signal(), Signal()
            ahead_next = ahead + out_q - taken_q
            m.d.sync += [out_q.eq(self.jobs.valid & self.jobs.ready & (self.jobs.p.byte_turn != 0)),
                         taken_q.eq(self.bounded_taken), ahead.eq(ahead_next),
                         ahead_full.eq(ahead_next >= self.turns_ahead)]

        def job(count, own, bf=0, hold=0):
            # a burst of this QP from its fetch index
            m.d.comb += [self.jobs.valid.eq(1), self.jobs.p.qpn.eq(qpn), self.jobs.p.cfg.eq(entry.cfg),
                         self.jobs.p.ci.eq(entry.dyn.fi), self.jobs.p.count.eq(count), self.jobs.p.own.eq(own),
                         self.jobs.p.bf.eq(bf), self.jobs.p.hold.eq(hold), self.jobs.p.byte_turn.eq(entry.dyn.byte_turn)]

        def enqueue():
            m.d.comb += [active.w_en.eq(1), active.w_data.eq(qpn), new.dyn.queued.eq(1)]

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.commit.valid):
                    m.d.comb += [self.commit.ready.eq(1), rd.addr.eq(self.commit.p.qpn), rd.en.eq(1)]
                    m.d.sync += [op.eq(QpOp.COMMIT), qpn.eq(self.commit.p.qpn), commit_p.eq(self.commit.p)]
                    m.next = "EXEC"
                with m.Elif(self.updates.valid):
                    m.d.comb += [self.updates.ready.eq(1), rd.addr.eq(self.updates.p.qpn), rd.en.eq(1)]
                    m.d.sync += [op.eq(QpOp.UPDATE), qpn.eq(self.updates.p.qpn), update_p.eq(self.updates.p)]
                    m.next = "EXEC"
                with m.Elif(self.turns.valid):
                    m.d.comb += [self.turns.ready.eq(1), rd.addr.eq(self.turns.p.qpn), rd.en.eq(1)]
                    m.d.sync += [op.eq(QpOp.TURN), qpn.eq(self.turns.p.qpn), turn_p.eq(self.turns.p.byte_turn)]
                    m.next = "EXEC"
                with m.Elif(self.doorbells.valid):
                    m.d.comb += [self.doorbells.ready.eq(1), rd.addr.eq(self.doorbells.p.qpn), rd.en.eq(1)]
                    m.d.sync += [op.eq(QpOp.DOORBELL), qpn.eq(self.doorbells.p.qpn), limit.eq(self.doorbells.p.limit),
                                 bf.eq(self.doorbells.p.bf), bf_data.eq(self.doorbells.p.wqebb)]
                    m.next = "EXEC"
                with m.Elif(active.r_rdy & self.jobs.ready & ~ahead_full):
                    # Schedule only when the job can leave at once: the sequencer must never
                    # wait on the fetch side, which waits on our updates (deadlock otherwise).
                    m.d.comb += [active.r_en.eq(1), rd.addr.eq(active.r_data), rd.en.eq(1)]
                    m.d.sync += [op.eq(QpOp.SCHEDULE), qpn.eq(active.r_data)]
                    m.next = "EXEC"
            with m.State("EXEC"):
                m.d.comb += [new.eq(entry), rts.eq((entry.cfg.state == QpState.RTS) | (entry.cfg.state == QpState.ERR))]
                m.d.comb += pending.eq(entry.dyn.pi - entry.dyn.fi)
                m.next = "IDLE"
                with m.Switch(op):
                    with m.Case(QpOp.COMMIT):
                        m.d.comb += [new.cfg.eq(commit_p.cfg), wr.en.eq(1)]
                        with m.If(commit_p.reset):
                            m.d.comb += [new.dyn.pi.eq(0), new.dyn.fi.eq(0), new.dyn.queued.eq(0), new.dyn.cap.eq(0),
                                         new.dyn.parked.eq(0), new.dyn.first.eq(1), new.dyn.byte_turn.eq(0)]
                    with m.Case(QpOp.TURN):
                        m.d.comb += [new.dyn.byte_turn.eq(turn_p), wr.en.eq(1)]
                    with m.Case(QpOp.UPDATE):
                        m.d.comb += [wr.en.eq(1), new.dyn.fi.eq(update_p.ci)]
                        with m.Switch(update_p.kind):
                            with m.Case(UpdateKind.PARK):
                                m.d.comb += new.dyn.parked.eq(1)
                            with m.Case(UpdateKind.CUT):
                                # Fetch the cut WQE again only once more has been posted (a
                                # go-back-N's cut unparks: its walk completes or flushes the ops).
                                m.d.comb += new.dyn.parked.eq(0)
                                with m.If(rts & ~entry.dyn.queued & (entry.dyn.pi != update_p.ci)
                                          & (entry.dyn.pi != update_p.end)):
                                    enqueue()
                            with m.Case(UpdateKind.RESUME):
                                m.d.comb += [new.dyn.cap.eq(update_p.room), new.dyn.parked.eq(0)]
                                with m.If(rts & ~entry.dyn.queued & (entry.dyn.pi != update_p.ci)):
                                    enqueue()
                            with m.Case(UpdateKind.WAKE):
                                m.d.comb += [new.dyn.fi.eq(entry.dyn.fi), new.dyn.cap.eq(update_p.room),
                                             new.dyn.parked.eq(0)]
                                with m.If(rts & ~entry.dyn.queued & (entry.dyn.pi != entry.dyn.fi)):
                                    enqueue()
                    with m.Case(QpOp.DOORBELL):
                        # A doorbell never moves the producer index back (``stale``: behind
                        # it, mod 2^16) nor beyond the send-queue depth past the fetch index
                        # (every WQEBB before it has been read): either would replay the ring.
                        stale = (limit - entry.dyn.pi)[15]
                        over = (limit - entry.dyn.fi)[:16] > (Const(1, 17) << entry.cfg.log_depth)
                        with m.If(~rts):
                            m.d.comb += self.db_drop.eq(DoorbellDrop.QP_NOT_RTS)
                        with m.Elif(stale):
                            m.d.comb += self.db_drop.eq(DoorbellDrop.STALE)
                        with m.Elif(over):
                            m.d.comb += self.db_drop.eq(DoorbellDrop.OVER_DEPTH)
                        with m.Elif(bf & ~entry.dyn.queued & ~entry.dyn.parked & (entry.dyn.pi == entry.dyn.fi)
                                  & (limit == entry.dyn.fi + 1) & self.jobs.ready & self.bf_wqebbs.ready):
                            job(1, 1, bf=1)
                            m.d.comb += [new.dyn.pi.eq(limit), new.dyn.fi.eq(limit), wr.en.eq(1),
                                         self.bf_wqebbs.valid.eq(1), self.bf_wqebbs.p.eq(bf_data)]
                        with m.Else():
                            m.d.comb += [new.dyn.pi.eq(limit), wr.en.eq(1)]
                            with m.If(~entry.dyn.queued & ~entry.dyn.parked & (limit != entry.dyn.fi)):
                                enqueue()               # (a parked QP: its wake queues it)
                        m.d.comb += self.db_accepted.eq(rts & ~stale & ~over)
                    with m.Case(QpOp.SCHEDULE):
                        m.d.comb += wr.en.eq(1)
                        with m.If(rts & (pending != 0) & ~entry.dyn.parked):
                            # a woken QP's turn: at most its cap, and nothing read past it (a
                            # WQE across the cap is cut and fetched again with the rest)
                            capped = (entry.dyn.cap != 0) & (entry.dyn.cap < quantum)
                            turn = Mux(capped, entry.dyn.cap, quantum)
                            clamped = pending > turn
                            own = Mux(clamped, turn, pending)
                            extra = pending - turn
                            over = Mux(clamped & ~capped, Mux(extra < reach, extra, reach), 0)
                            m.d.comb += [new.dyn.cap.eq(0), new.dyn.first.eq(0)]
                            job(own + over, own, hold=capped & clamped)
                            m.d.comb += new.dyn.fi.eq(entry.dyn.fi + own)
                            with m.If(clamped & ~capped):
                                enqueue()               # more to do: back of the queue
                            with m.Elif(clamped):
                                # capped: its WQEs likely fill the ring again, so its next
                                # turn waits for the parser (PARK, or WAKE at the burst's end)
                                # instead of being fetched only to wait
                                m.d.comb += [new.dyn.parked.eq(1), new.dyn.queued.eq(0)]
                            with m.Else():
                                m.d.comb += new.dyn.queued.eq(0)
                        with m.Else():
                            m.d.comb += new.dyn.queued.eq(0)
        return m
