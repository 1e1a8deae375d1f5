"""WQE parser: WQEBBs -> message descriptors, inline payload beats and QP updates."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.wiring import In, Out

from spec import formats as F
from .qp_table import FetchJob, QpUpdate
from .message import Message, MessageKind

__all__ = ["WqeParser"]


def _be_field(buf, table, name):
    """A big-endian field of a segment at byte 0 of ``buf`` (a byte-ordered Value)."""
    off, width = F.get_field(table, name)
    return Cat(*(buf.word_select(off + width - 1 - i, 8) for i in range(width)))


class WqeParser(wiring.Component):
    """Assembles mlx5 WQEs from their WQEBBs and turns them into messages.

    For each burst of a QP it reads the WQEs in order: ctrl segment first (its ds
    gives the WQE's length in WQEBBs), then the remote-address segment and either
    one data-pointer segment or one inline segment. The PSN of each message is
    assigned here (one per packet: ``ceil(length / MTU)``, at least one), so the
    burst's end carries the QP's next consumer index and PSN back to the QP table.

    A WQE cut by the burst end is left for the next turn (its WQEBBs are dropped
    and re-read). An unsupported opcode or malformed WQE becomes an ERROR message
    (the builder turns it into an error CQE) and moves the QP to the error state.

    Members
    -------
    bursts : In(stream.Signature(FetchJob))
    wqebbs : In(stream.Signature(512))
    messages : Out(stream.Signature(Message))
    inline : Out(stream.Signature(1024))
        WQE bytes 0..127 (and 128..255 when the inline data reaches them) of each
        inline WRITE, in message order: the payload starts at byte 36.
    updates : Out(stream.Signature(QpUpdate))
    """
    INLINE_OFFSET = 36          # ctrl (16) + raddr (16) + inline byte count (4)

    def __init__(self, *, num_qps, num_cqs, max_burst):
        self.num_qps, self.num_cqs = num_qps, num_cqs
        super().__init__({
            "bursts": In(stream.Signature(FetchJob(num_qps, num_cqs, max_burst))),
            "wqebbs": In(stream.Signature(8 * F.WQEBB)),
            "messages": Out(stream.Signature(Message(num_qps, num_cqs))),
            "inline": Out(stream.Signature(1024)),
            "updates": Out(stream.Signature(QpUpdate(num_qps))),
        })

    def elaborate(self, platform):
        m = Module()
        job = Signal.like(self.bursts.p)
        left = Signal.like(self.bursts.p.count)      # WQEBBs of the burst not yet taken
        index = Signal(16)                           # WQEBB index of the current WQE
        psn = Signal(24)
        error = Signal()
        wqe = Signal(8 * F.WQEBB * F.MAX_WQEBBS)
        got = Signal(range(F.MAX_WQEBBS + 1))
        need = Signal(range(F.MAX_WQEBBS + 1))
        drop = Signal.like(left)
        too_long = Signal()

        # First WQEBB's ctrl segment, straight from the stream (to size the WQE).
        first = self.wqebbs.p
        ds_first = first.word_select(7, 8)[:6]
        nbb_first = Signal(4)
        m.d.comb += nbb_first.eq(Mux(ds_first == 0, 1, (ds_first + 3) >> 2))

        # Fields of the assembled WQE.
        ctrl, raddr_seg, data_seg = wqe[0:128], wqe[128:256], wqe[256:384]
        opcode = _be_field(ctrl, F.CTRL_SEG, "opmod_idx_opcode")[:8]
        ds = _be_field(ctrl, F.CTRL_SEG, "qpn_ds")[:6]
        fm_ce_se = _be_field(ctrl, F.CTRL_SEG, "fm_ce_se")
        raddr = _be_field(raddr_seg, F.RADDR_SEG, "raddr")
        rkey = _be_field(raddr_seg, F.RADDR_SEG, "rkey")
        byte_count = _be_field(data_seg, F.DATA_SEG, "byte_count")
        seg_addr = _be_field(data_seg, F.DATA_SEG, "addr")
        is_inline = byte_count[31]
        inline_len = byte_count[:31]
        length = Signal(32)
        kind = Signal(MessageKind)
        m.d.comb += length.eq(Mux(ds == 2, 0, Mux(is_inline, inline_len, byte_count)))
        with m.If(too_long):
            m.d.comb += kind.eq(MessageKind.ERROR)
        with m.Elif(opcode == F.WqeOp.NOP):
            m.d.comb += kind.eq(MessageKind.NOP)
        with m.Elif((opcode == F.WqeOp.RDMA_WRITE)
                    & ((ds == 2)
                       | ((ds >= 3) & is_inline & ((inline_len + 4 + 15) >> 4 == ds - 2))
                       | ((ds == 3) & ~is_inline))):
            m.d.comb += kind.eq(MessageKind.WRITE)
        with m.Else():
            m.d.comb += kind.eq(MessageKind.ERROR)

        mtu_shift = Signal(4)
        m.d.comb += mtu_shift.eq(job.cfg.mtu + 7)
        npkts = Signal(24)
        m.d.comb += npkts.eq(Mux(length == 0, 1, ((length - 1) >> mtu_shift) + 1))
        send_inline = Signal()
        m.d.comb += send_inline.eq((kind == MessageKind.WRITE) & (ds != 2) & is_inline & (inline_len != 0))
        two_beats = Signal()
        m.d.comb += two_beats.eq(self.INLINE_OFFSET + inline_len > 128)

        m.d.comb += [
            self.messages.p.qpn.eq(job.qpn), self.messages.p.cfg.eq(job.cfg),
            self.messages.p.kind.eq(kind), self.messages.p.signaled.eq((fm_ce_se & F.FM_CE_SE_CQ_UPDATE) != 0),
            self.messages.p.index.eq(index), self.messages.p.raddr.eq(raddr), self.messages.p.rkey.eq(rkey),
            self.messages.p.length.eq(Mux(kind == MessageKind.WRITE, length, 0)),
            self.messages.p.inline.eq(is_inline & (ds != 2)),
            self.messages.p.addr.eq(seg_addr), self.messages.p.psn.eq(psn),
            self.updates.p.qpn.eq(job.qpn), self.updates.p.ci.eq(index),
            self.updates.p.psn.eq(psn), self.updates.p.error.eq(error),
        ]

        with m.FSM():
            with m.State("BURST"):
                m.d.comb += self.bursts.ready.eq(1)
                with m.If(self.bursts.valid):
                    m.d.sync += [job.eq(self.bursts.p), left.eq(self.bursts.p.count),
                                 index.eq(self.bursts.p.ci), psn.eq(self.bursts.p.psn), error.eq(0)]
                    m.next = "FIRST"
            with m.State("FIRST"):
                with m.If(left == 0):
                    m.next = "UPDATE"
                with m.Elif(self.wqebbs.valid):
                    with m.If(nbb_first > F.MAX_WQEBBS):
                        # Longer than the engine takes: an error for this WQE.
                        m.d.comb += self.wqebbs.ready.eq(1)
                        m.d.sync += [wqe.eq(first), got.eq(1), need.eq(1), too_long.eq(1),
                                     left.eq(left - 1)]
                        m.next = "EMIT"
                    with m.Elif(nbb_first > left):
                        # Cut by the burst end: re-read from this WQE next turn.
                        m.d.sync += drop.eq(left)
                        m.next = "DROP"
                    with m.Else():
                        m.d.comb += self.wqebbs.ready.eq(1)
                        m.d.sync += [wqe.eq(first), got.eq(1), need.eq(nbb_first), too_long.eq(0),
                                     left.eq(left - 1)]
                        with m.If(nbb_first == 1):
                            m.next = "EMIT"
                        with m.Else():
                            m.next = "REST"
            with m.State("REST"):
                with m.If(got == need):
                    m.next = "EMIT"
                with m.Elif(self.wqebbs.valid):
                    m.d.comb += self.wqebbs.ready.eq(1)
                    with m.Switch(got):
                        for i in range(1, F.MAX_WQEBBS):
                            with m.Case(i):
                                m.d.sync += wqe.word_select(i, 8 * F.WQEBB).eq(self.wqebbs.p)
                    m.d.sync += [got.eq(got + 1), left.eq(left - 1)]
            with m.State("EMIT"):
                m.d.comb += self.messages.valid.eq(1)
                with m.If(self.messages.ready):
                    m.d.sync += index.eq(index + need)
                    with m.If(kind == MessageKind.WRITE):
                        m.d.sync += psn.eq(psn + npkts)
                    with m.If(kind == MessageKind.ERROR):
                        m.d.sync += [error.eq(1), drop.eq(left)]
                        m.next = "DROP"
                    with m.Elif(send_inline):
                        m.next = "INLINE0"
                    with m.Else():
                        m.next = "FIRST"
            with m.State("INLINE0"):
                m.d.comb += [self.inline.valid.eq(1), self.inline.p.eq(wqe[:1024])]
                with m.If(self.inline.ready):
                    with m.If(two_beats):
                        m.next = "INLINE1"
                    with m.Else():
                        m.next = "FIRST"
            with m.State("INLINE1"):
                m.d.comb += [self.inline.valid.eq(1), self.inline.p.eq(wqe[1024:])]
                with m.If(self.inline.ready):
                    m.next = "FIRST"
            with m.State("DROP"):
                # Discard the rest of the burst: after an error, or a cut WQE.
                with m.If(drop == 0):
                    m.next = "UPDATE"
                with m.Elif(self.wqebbs.valid):
                    m.d.comb += self.wqebbs.ready.eq(1)
                    m.d.sync += drop.eq(drop - 1)
            with m.State("UPDATE"):
                m.d.comb += self.updates.valid.eq(1)
                with m.If(self.updates.ready):
                    m.next = "BURST"
        return m
