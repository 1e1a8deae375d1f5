"""QP context table and the round-robin queue of QPs with work."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream, fifo
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from spec.formats import QpState
from .contexts import QpConfig, QpEntry, qp_bits
from .doorbell_decoder import DoorbellEvent

__all__ = ["QpTable", "FetchJob", "QpUpdate"]


def FetchJob(num_qps, num_cqs, max_burst):
    """A burst of WQEBBs of one QP for the WQE fetch: ``count`` WQEBBs from ``ci``."""
    return data.StructLayout({
        "qpn": unsigned(qp_bits(num_qps)), "cfg": QpConfig(num_cqs),
        "ci": unsigned(16), "count": unsigned(max_burst.bit_length()), "psn": unsigned(24),
    })


def QpUpdate(num_qps):
    """End of a burst, from the WQE parser: new consumer index and PSN, or an error."""
    return data.StructLayout({"qpn": unsigned(qp_bits(num_qps)), "ci": unsigned(16),
                              "psn": unsigned(24), "error": unsigned(1)})


class QpTable(wiring.Component):
    """Per-QP context in one RAM, updated by one read-modify-write sequencer.

    The CPU commits contexts; doorbells raise the producer index; bursts go out to
    the WQE fetch as ``jobs``; the WQE parser reports each burst's end on ``updates``.
    A QP with work sits once in a FIFO of QP numbers, which gives round robin
    between QPs at burst granularity (at most ``max_burst`` WQEBBs per turn) and
    scales with RAM, not flip-flops. Only one burst per QP is in flight, so a QP's
    WQEs stay in order.

    Every operation takes two cycles (RAM read, then write).

    Parameters
    ----------
    num_qps, num_cqs : int
    max_burst : int
        Most WQEBBs fetched for one QP per turn.

    Members
    -------
    commit : In(stream.Signature(...))
        ``payload.qpn``, ``payload.cfg``, ``payload.psn`` from the control registers.
    doorbells : In(stream.Signature(DoorbellEvent))
    updates : In(stream.Signature(QpUpdate))
    jobs : Out(stream.Signature(FetchJob))
        Its consumer must keep ``ready`` high once high until it takes a job (a FIFO).
    db_dropped : Out(1)
        Strobe: a doorbell for a QP that is not in RTS was ignored.
    """
    def __init__(self, *, num_qps, num_cqs, max_burst=8):
        if num_qps < 2:
            raise ValueError(f"num_qps must be at least 2, not {num_qps}")
        if not 1 <= max_burst <= 64:
            raise ValueError(f"max_burst must be 1..64 WQEBBs, not {max_burst}")
        self.num_qps, self.num_cqs, self.max_burst = num_qps, num_cqs, max_burst
        commit = data.StructLayout({"qpn": unsigned(qp_bits(num_qps)), "cfg": QpConfig(num_cqs),
                                    "psn": unsigned(24)})
        super().__init__({
            "commit": In(stream.Signature(commit)),
            "doorbells": In(stream.Signature(DoorbellEvent(num_qps))),
            "updates": In(stream.Signature(QpUpdate(num_qps))),
            "jobs": Out(stream.Signature(FetchJob(num_qps, num_cqs, max_burst))),
            "db_dropped": Out(1),
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

        op = Signal(range(4))               # 0 commit, 1 update, 2 doorbell, 3 schedule
        qpn = Signal(qp_bits(self.num_qps))
        commit_p = Signal.like(self.commit.p)
        update_p = Signal.like(self.updates.p)
        limit = Signal(16)

        entry = Signal(layout)
        m.d.comb += [entry.eq(rd.data), wr.addr.eq(qpn)]
        new = Signal(layout)
        m.d.comb += wr.data.eq(new)

        pending = Signal(16)
        rts = Signal()
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.commit.valid):
                    m.d.comb += [self.commit.ready.eq(1), rd.addr.eq(self.commit.p.qpn), rd.en.eq(1)]
                    m.d.sync += [op.eq(0), qpn.eq(self.commit.p.qpn), commit_p.eq(self.commit.p)]
                    m.next = "EXEC"
                with m.Elif(self.updates.valid):
                    m.d.comb += [self.updates.ready.eq(1), rd.addr.eq(self.updates.p.qpn), rd.en.eq(1)]
                    m.d.sync += [op.eq(1), qpn.eq(self.updates.p.qpn), update_p.eq(self.updates.p)]
                    m.next = "EXEC"
                with m.Elif(self.doorbells.valid):
                    m.d.comb += [self.doorbells.ready.eq(1), rd.addr.eq(self.doorbells.p.qpn), rd.en.eq(1)]
                    m.d.sync += [op.eq(2), qpn.eq(self.doorbells.p.qpn), limit.eq(self.doorbells.p.limit)]
                    m.next = "EXEC"
                with m.Elif(active.r_rdy & self.jobs.ready):
                    # Schedule only when the job can leave at once: the sequencer must never
                    # wait on the fetch side, which waits on our updates (deadlock otherwise).
                    m.d.comb += [active.r_en.eq(1), rd.addr.eq(active.r_data), rd.en.eq(1)]
                    m.d.sync += [op.eq(3), qpn.eq(active.r_data)]
                    m.next = "EXEC"
            with m.State("EXEC"):
                # The RAM output holds while rd.en is low, so EXEC may wait for jobs.ready.
                m.d.comb += [new.eq(entry), rts.eq(entry.cfg.state == QpState.RTS)]
                m.d.comb += pending.eq(entry.dyn.pi - entry.dyn.ci)
                m.next = "IDLE"
                with m.Switch(op):
                    with m.Case(0):
                        m.d.comb += [new.cfg.eq(commit_p.cfg), new.dyn.pi.eq(0), new.dyn.ci.eq(0),
                                     new.dyn.psn.eq(commit_p.psn), wr.en.eq(1)]
                    with m.Case(1):
                        m.d.comb += [new.dyn.ci.eq(update_p.ci), new.dyn.psn.eq(update_p.psn),
                                     new.dyn.queued.eq(0), wr.en.eq(1)]
                        with m.If(update_p.error):
                            m.d.comb += new.cfg.state.eq(QpState.ERR)
                        with m.Elif(rts & (entry.dyn.pi != update_p.ci)):
                            m.d.comb += [active.w_en.eq(1), active.w_data.eq(qpn), new.dyn.queued.eq(1)]
                    with m.Case(2):
                        with m.If(rts):
                            m.d.comb += [new.dyn.pi.eq(limit), wr.en.eq(1)]
                            with m.If(~entry.dyn.queued & (limit != entry.dyn.ci)):
                                m.d.comb += [active.w_en.eq(1), active.w_data.eq(qpn),
                                             new.dyn.queued.eq(1)]
                        with m.Else():
                            m.d.comb += self.db_dropped.eq(1)
                    with m.Case(3):
                        # "queued" now means "waiting or in flight": cleared by the update.
                        with m.If(rts & (pending != 0)):
                            m.d.comb += [
                                self.jobs.valid.eq(1),
                                self.jobs.p.qpn.eq(qpn), self.jobs.p.cfg.eq(entry.cfg),
                                self.jobs.p.ci.eq(entry.dyn.ci), self.jobs.p.psn.eq(entry.dyn.psn),
                                self.jobs.p.count.eq(Mux(pending > self.max_burst, self.max_burst, pending)),
                            ]
                            with m.If(~self.jobs.ready):
                                m.next = "EXEC"
                        with m.Else():
                            m.d.comb += [new.dyn.queued.eq(0), wr.en.eq(1)]
        return m
