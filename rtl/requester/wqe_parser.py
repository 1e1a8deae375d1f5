"""WQE parser: WQEBBs -> message descriptors, inline payload beats and QP updates."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.memory import Memory
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from spec import formats as F
from spec import params as P
from rtl.common.contexts import qp_bits
from rtl.common.headers import from_be
from rtl.requester.qp_table import FetchJob, QpTurn, QpUpdate, UpdateKind
from rtl.requester.message import GATHER_MORE, Message, MessageKind

__all__ = ["WqeParser", "RemoteOpNote", "RemoteOpPop"]


def RemoteOpNote(num_qps):
    """A READ or atomic registered as the parser hands it on (first transmission only):
    its QP, its slot (the QP's count of registered ops, mod 32; the ring index is the low
    4 bits), its first and last PSN (a READ's responses take one each), and where its
    result lands in local memory; ``read``: a READ of ``length`` bytes at the QP's MTU
    (ibv_mtu code ``mtu``), else an atomic of 8 bytes or, ``size8`` clear, 4."""
    return data.StructLayout({"valid": unsigned(1), "qpn": unsigned(qp_bits(num_qps)), "slot": unsigned(5),
                              "psn": unsigned(24), "last": unsigned(24), "addr": unsigned(64),
                              "size8": unsigned(1), "read": unsigned(1), "length": unsigned(32), "mtu": unsigned(3)})


def RemoteOpPop(num_qps):
    """A QP's oldest registered READ or atomic is done with (its result written, or the QP
    created again): ``head`` is the QP's count of retired ops (mod 32) from now on."""
    return data.StructLayout({"valid": unsigned(1), "qpn": unsigned(qp_bits(num_qps)), "head": unsigned(5)})


# The atomic WQE forms (VERBS.md section 1): (WQE opcode, opmod) -> (BTH opcode, ds, 8-byte operands)
# (WQE opcode, opmod, BTH opcode, ds, 8 bytes) of each atomic form (spec.formats.ATOMIC_FORMS)
_ATOMIC_FORMS = tuple((wop, wmod, bth_op, ds, int(size == 8))
                      for (wop, wmod), (bth_op, size, _, ds) in F.ATOMIC_FORMS.items())


class WqeParser(wiring.Component):
    """Assembles mlx5 WQEs from their WQEBBs and turns them into messages.

    For each burst of a QP it reads the WQEs in order: ctrl segment first (its ds
    gives the WQE's length in WQEBBs), then the remote-address segment and either
    a gather list of up to ``REQUESTER_GATHER`` data-pointer segments or one inline
    segment. A WQE leaves as a message (and its inline beat) in the cycle its last
    WQEBB arrives: one single-WQEBB WQE per cycle, plus one cycle per burst to store
    the QP's state.

    Gather lists: a WQE of two or more pointer segments is held a cycle, in which its
    total, prefix sums and checks (no more than ``REQUESTER_GATHER`` segments, no inline
    one after the first, a total below 2^31; else malformed) are summed into registers,
    so no adder tree lies on the take's path; it leaves in the next cycle with its
    non-empty segments (``nseg``, ``seg_len``, ``segs``: the message is their
    concatenation). Resumed by a go-back walk, it is held a cycle more to find the
    segment the resume point falls in and the offset in it: the message starts there.

    The parser owns each QP's consumer index, next PSN (one per packet:
    ``ceil(length / MTU)``, at least one) and failure state, in a RAM read when a burst
    starts and written when it ends. A burst that does not start at the consumer
    index (behind a cut WQE) is discarded.

    Retransmission (go-back-N): a ``retransmit`` command (from the completion tracker)
    sets the QP's consumer index and next PSN back to the requester's restart point
    and asks the QP table to fetch again from there; bursts already in flight are then
    stale and discarded. The WQEs are walked again: a WQE whose packets all precede
    ``skip_to`` (the first PSN to send again) is skipped, the WQE holding it leaves as
    a message resumed at that packet (``resume``: MIDDLE/LAST opcodes, addresses and
    length advanced by whole MTUs), and the ones after leave as usual. The resumed WQE
    is held a cycle (after a gather list's two), in which its advanced fields are summed
    into registers: no adder between the WQEBB and the message (a cycle per go-back).

    Failure (RC error): a ``retransmit`` with ``fail`` set walks the WQEs the same way,
    but the WQE holding ``skip_to`` leaves as an ERROR message with the command's
    ``syndrome`` and every WQE after it, also those posted later, as an ERROR message
    with WR_FLUSH_ERR: each gets an error CQE and no packet (verbs flushes every
    outstanding work request of a QP in error).

    A WQE cut by the burst end is left for the next turn: its WQEBBs are dropped,
    ``updates`` tells the QP table to fetch again from it. An unsupported opcode or
    malformed WQE becomes an ERROR message with LOCAL_QP_OP_ERR (the builder turns it
    into an error CQE) and fails the QP as above: every WQE after it, in this burst and
    in every later one until the QP is created again, leaves as an ERROR message with
    WR_FLUSH_ERR (verbs: a QP in error completes every work request with a flush error).
    The QP table keeps fetching for it, as for an RC failure, so nothing posted is lost.

    READs and atomics (RC only; on a UC QP they are malformed): a new one (not a
    go-back walk's resend) is registered on ``remote`` (its slot in the QP's ring of
    ``MAX_RD_ATOMIC``) as it leaves. One that finds the ring full must wait, and so must
    a fenced WQE (ctrl fence mode not 0) while any is registered and not popped
    (``pops``: the result writer retires them), so a fence holds a WQE until earlier
    READs and atomics have completed. Such a WQE does not wait here, where it would hold
    every other QP's WQEs behind it: the burst is cut there and the QP parked (PARK on
    ``updates``: the QP table takes it off the round robin, its fetch index on that
    WQE). A RAM of parked QPs (ring tail and wake level) is read on every pop; the pop
    that brings a parked QP's ops down to its level (below the limit; none left, for a
    fence) queues a WAKE, and the QP is fetched again from that WQE. A pop between the
    cut and the PARK makes it a RESUME (fetched again at once), so no wake is lost. A
    retransmission or a QP commit waiting meanwhile makes the cut a plain CUT (the
    go-back-N or the create fetches it again). An atomic's operands go to the builder as
    its WQE's first beat on ``inline``.

    Moved to ERR (UC): ``flush`` marks the QP (a bit per QP in its own RAM, so it is taken
    in any cycle); from its next burst on every WQE leaves as an ERROR message with
    WR_FLUSH_ERR. (An RC QP is flushed by the tracker's failure walk instead.)

    Members
    -------
    commit : In(stream.Signature(...))
        ``qpn``, ``psn``: a QP is created; its consumer index is 0, its next PSN ``psn``;
        ``error``: it is created in ERR (its WQEs are flushed).
    bursts : In(stream.Signature(FetchJob))
    wqebbs : In(stream.Signature(512))
    bf_wqebbs : In(stream.Signature(512))
        The WQEBB of each BlueFlame burst (``bf``), read instead of ``wqebbs``.
    messages : Out(stream.Signature(Message))
    inline : Out(stream.Signature(1024))
        The 128-byte beats of each inline WRITE's WQE that hold its data, in message
        order: from the beat holding byte 36 (the message's ``addr`` is the data's offset
        in the WQE, 36, or 36 + the advance of a resumed WQE) to the last data byte.
    updates : Out(stream.Signature(QpUpdate))
    turns : Out(stream.Signature(QpTurn))
        A QP's turns bounded to the WQEBBs its WQEs took to carry ``TURN_BYTES`` of
        payload (WRITE lengths, from the start of a burst to the end of the first WQE
        whose sum reaches them; after a bounded turn that did not reach them, twice the
        bound, or 0 (none) from 128 up). Counted a cycle after each take, from registers; a new bound is
        dropped while the last one waits (a hint).
    retransmit : In(stream.Signature(...))
        ``qpn``, ``index``, ``psn`` (the restart point: a WQE index and its first PSN)
        and ``skip_to`` (the first PSN to send again); ``fail``: fail the WQE holding
        ``skip_to`` with ``syndrome`` and flush the rest. Taken between bursts.
    flush : In(stream.Signature(...))
        ``qpn``: the QP moved to ERR (UC); always taken.
    remote : Out(RemoteOpNote)
        A READ or atomic registered (must be taken in its cycle).
    pops : In(RemoteOpPop)
        A QP's registered ops retired up to ``head``.
    """
    INLINE_OFFSET = F.WQE_INLINE_OFFSET     # 36: ctrl (16) + raddr (16) + inline byte count (4)
    SEND_INLINE_OFFSET = F.SEND_INLINE_OFFSET   # 20: ctrl (16) + inline byte count (4)

    def __init__(self, *, num_qps, num_cqs, max_burst):
        self.num_qps, self.num_cqs = num_qps, num_cqs
        super().__init__({
            "commit": In(stream.Signature(data.StructLayout({"qpn": unsigned(qp_bits(num_qps)),
                                                            "psn": unsigned(24), "error": unsigned(1)}))),
            "bursts": In(stream.Signature(FetchJob(num_qps, num_cqs, max_burst))),
            "wqebbs": In(stream.Signature(8 * F.WQEBB)),
            "bf_wqebbs": In(stream.Signature(8 * F.WQEBB)),
            "messages": Out(stream.Signature(Message(num_qps, num_cqs))),
            "inline": Out(stream.Signature(1024)),
            "updates": Out(stream.Signature(QpUpdate(num_qps))),
            "turns": Out(stream.Signature(QpTurn(num_qps))),
            "retransmit": In(stream.Signature(data.StructLayout({
                "qpn": unsigned(qp_bits(num_qps)), "index": unsigned(16), "psn": unsigned(24),
                "skip_to": unsigned(24), "fail": unsigned(1), "syndrome": unsigned(8)}))),
            "flush": In(stream.Signature(data.StructLayout({"qpn": unsigned(qp_bits(num_qps))}))),
            "remote": Out(RemoteOpNote(num_qps)),
            "pops": In(RemoteOpPop(num_qps)),
        })

    def elaborate(self, platform):
        m = Module()
        ctx_layout = data.StructLayout({"index": unsigned(16), "psn": unsigned(24),
                                        "skip_to": unsigned(24), "resume": unsigned(1),
                                        "fail": unsigned(1), "fsyn": unsigned(8)})
        m.submodules.ctx = ctx_ram = Memory(shape=ctx_layout, depth=self.num_qps, init=[])
        wr = ctx_ram.write_port()
        rd = ctx_ram.read_port(transparent_for=(wr,))   # a burst may follow its QP's previous one
        m.d.comb += rd.en.eq(0)
        # A QP moved to ERR (``flush``, cleared by a create): read beside the context
        m.submodules.flushed = fl_ram = Memory(shape=unsigned(1), depth=self.num_qps, init=[])
        fl_wr = fl_ram.write_port()
        fl_rd = fl_ram.read_port(transparent_for=(fl_wr,))
        m.d.comb += [fl_rd.en.eq(rd.en), fl_rd.addr.eq(rd.addr), self.flush.ready.eq(1)]
        ctx = Signal(ctx_layout)
        m.d.comb += [ctx.eq(rd.data), ctx.fail.eq(rd.data.fail | fl_rd.data),
                     ctx.fsyn.eq(Mux(rd.data.fail, rd.data.fsyn, F.Syndrome.WR_FLUSH_ERR))]
        # READs/atomics registered per QP (count, last PSN): apart from the context, which a
        # retransmission writes without reading
        ring_layout = data.StructLayout({"rtail": unsigned(5), "rlast": unsigned(24)})
        m.submodules.rring = rr_ram = Memory(shape=ring_layout, depth=self.num_qps, init=[])
        rr_wr = rr_ram.write_port()
        rr_rd = rr_ram.read_port(transparent_for=(rr_wr,))
        m.d.comb += [rr_rd.en.eq(rd.en), rr_rd.addr.eq(rd.addr)]
        # READs/atomics retired per QP (the result writer's pops; a create sets 0), read beside the context
        m.submodules.rhead = rh_ram = Memory(shape=unsigned(5), depth=self.num_qps, init=[])
        rh_pop, rh_new = rh_ram.write_port(), rh_ram.write_port()
        rh_rd = rh_ram.read_port(transparent_for=(rh_pop, rh_new))
        m.d.comb += [rh_rd.en.eq(rd.en), rh_rd.addr.eq(rd.addr),
                     rh_pop.en.eq(self.pops.valid & ~(self.commit.valid & self.commit.ready
                                                      & (self.commit.p.qpn == self.pops.qpn))),
                     rh_pop.addr.eq(self.pops.qpn), rh_pop.data.eq(self.pops.head)]

        # Parked QPs: their ring tail and the in-flight count that wakes them
        park_layout = data.StructLayout({"parked": unsigned(1), "rtail": unsigned(5), "level": unsigned(5),
                                         "limit": unsigned(5)})
        m.submodules.parked = pk_ram = Memory(shape=park_layout, depth=self.num_qps, init=[])
        pk_set, pk_clr = pk_ram.write_port(), pk_ram.write_port()
        pk_rd = pk_ram.read_port(transparent_for=(pk_set, pk_clr))
        m.d.comb += [pk_rd.addr.eq(self.pops.qpn), pk_rd.en.eq(1)]
        pop_v, pop_q, pop_head = Signal(), Signal.like(self.pops.qpn), Signal(5)
        m.d.sync += [pop_v.eq(self.pops.valid), pop_q.eq(self.pops.qpn), pop_head.eq(self.pops.head)]
        # at most one wake a park, and a QP parks once before its wake is taken (it is off
        # the round robin): twice the QPs never fill (a doorbell may fetch one meanwhile)
        m.submodules.wakes = wake_q = SyncFIFOBuffered(width=len(self.pops.qpn) + 5, depth=2 * self.num_qps)
        wake, pk_left = Signal(), Signal(5)
        m.d.comb += [pk_left.eq(pk_rd.data.rtail - pop_head),
                     wake.eq(pop_v & pk_rd.data.parked & (pk_left <= pk_rd.data.level) & wake_q.w_rdy),
                     # the QP table caps its next burst to the ring (more could only be dropped)
                     wake_q.w_en.eq(wake), wake_q.w_data.eq(Cat(pop_q, pk_rd.data.limit)),
                     pk_clr.en.eq(wake & ~(pk_set.en & (pk_set.addr == pop_q))), pk_clr.addr.eq(pop_q),
                     pk_clr.data.eq(0)]

        job = Signal.like(self.bursts.p)
        # WQEBB source of the current burst: the fetch, or the doorbell (BlueFlame).
        src = stream.Signature(8 * F.WQEBB).flip().create(path=("src",))
        with m.If(job.bf):
            m.d.comb += [src.valid.eq(self.bf_wqebbs.valid), src.payload.eq(self.bf_wqebbs.payload),
                         self.bf_wqebbs.ready.eq(src.ready)]
        with m.Else():
            m.d.comb += [src.valid.eq(self.wqebbs.valid), src.payload.eq(self.wqebbs.payload),
                         self.wqebbs.ready.eq(src.ready)]
        left = Signal.like(self.bursts.p.count)      # WQEBBs of the burst not yet taken
        index = Signal(16)                           # WQEBB index of the current WQE
        psn = Signal(24)
        fresh = Signal()                             # psn not loaded yet: it is ctx.psn
        cur_psn = Signal(24)
        m.d.comb += cur_psn.eq(Mux(fresh, ctx.psn, psn))
        # Failure (RC, or a malformed WQE): every WQE leaves as an ERROR message (the
        # first with fsyn, then flushes)
        failing, fsyn = Signal(), Signal(8)
        cur_fail, cur_syn = Signal(), Signal(8)
        m.d.comb += [cur_fail.eq(Mux(fresh, ctx.fail, failing)), cur_syn.eq(Mux(fresh, ctx.fsyn, fsyn))]
        cut = Signal()                               # this burst ended inside a WQE
        stale = Signal()                             # this burst is discarded as a whole
        wqe = Signal(8 * F.WQEBB * F.MAX_WQEBBS)     # WQEBBs gathered so far
        got = Signal(range(F.MAX_WQEBBS + 1))
        need = Signal(range(F.MAX_WQEBBS + 1))
        drop = Signal.like(left)

        # The WQE as it stands this cycle: gathered WQEBBs plus the one arriving.
        bb = 8 * F.WQEBB
        view = Signal.like(wqe)
        m.d.comb += view.eq(wqe)
        for i in range(F.MAX_WQEBBS):
            with m.If(got == i):
                m.d.comb += view.word_select(i, bb).eq(src.p)

        # Ctrl segment of a first WQEBB, straight from the stream (to size the WQE).
        first = src.p
        ds_first = first.word_select(7, 8)[:6]
        nbb_first = Signal(range(64 // F.DS_PER_WQEBB + 1))   # ds 0..63: 0..16 WQEBBs (a 4-bit count wraps)
        m.d.comb += nbb_first.eq((ds_first + F.DS_PER_WQEBB - 1) >> 2)
        # Every ds of the 6-bit field fits (MAX_WQEBBS covers ds 63), so the only WQE
        # malformed by size is ds 0 (no ctrl segment), taken as 1 WQEBB.
        assert -(-63 // F.DS_PER_WQEBB) <= F.MAX_WQEBBS, "the parser gathers a WQE of any ds"
        no_ctrl = Signal()
        m.d.comb += no_ctrl.eq((got == 0) & (ds_first == 0))
        nbb = Signal(range(F.MAX_WQEBBS + 1))        # WQEBBs of the WQE (1 for ds 0)
        m.d.comb += nbb.eq(Mux(got == 0, Mux(no_ctrl, 1, nbb_first), need))

        # Fields of the WQE.
        ctrl, raddr_seg = view[0:128], view[128:256]
        opmod_idx_opcode = from_be(ctrl, *F.get_field(F.CTRL_SEG, "opmod_idx_opcode"))
        opcode, opmod = opmod_idx_opcode[:8], opmod_idx_opcode[24:32]
        ds = from_be(ctrl, *F.get_field(F.CTRL_SEG, "qpn_ds"))[:6]
        # The WRITE-like forms: RDMA WRITE and WRITE with immediate (ctrl + raddr + data or
        # inline) and SEND, SEND with immediate (ctrl + data or inline: no raddr segment,
        # so its data segment is where a WRITE's raddr segment is); the immediate is in
        # the ctrl segment's last 4 bytes.
        is_send = Signal()
        m.d.comb += is_send.eq((opcode == F.WqeOp.SEND) | (opcode == F.WqeOp.SEND_IMM))
        is_write = Signal()
        m.d.comb += is_write.eq((opcode == F.WqeOp.RDMA_WRITE) | (opcode == F.WqeOp.RDMA_WRITE_IMM))
        has_imm = Signal()
        m.d.comb += has_imm.eq((opcode == F.WqeOp.SEND_IMM) | (opcode == F.WqeOp.RDMA_WRITE_IMM))
        imm_bytes = ctrl[8 * 12:8 * 16]
        data_seg = Mux(is_send, view[128:256], view[256:384])
        head_ds = Mux(is_send, 1, 2)                 # ds ahead of the data segment
        no_data = Signal()                           # a WRITE-like WQE without a data segment: 0 bytes
        m.d.comb += no_data.eq(ds == head_ds)
        fm_ce_se = from_be(ctrl, *F.get_field(F.CTRL_SEG, "fm_ce_se"))
        raddr = from_be(raddr_seg, *F.get_field(F.RADDR_SEG, "raddr"))
        rkey = from_be(raddr_seg, *F.get_field(F.RADDR_SEG, "rkey"))
        byte_count = from_be(data_seg, *F.get_field(F.DATA_SEG, "byte_count"))
        seg_addr = from_be(data_seg, *F.get_field(F.DATA_SEG, "addr"))
        is_inline = byte_count[31]
        inline_len = byte_count[:31]
        # Gather lists (REQUESTER_GATHER pointer segments, segment k at ds head_ds + k): a
        # WQE of two or more (``multi``) is held a cycle (``g_sum``) while its total, prefix
        # sums and checks are summed into registers, off the take's path; during a go-back
        # walk a cycle more (``g_res``) to find the segment and offset the resume point
        # falls in. Its message carries the non-empty segments (``nseg``, ``seg_len``, ``segs``).
        G = P.REQUESTER_GATHER
        assert G - 1 == GATHER_MORE, "the message carries the segments after the first"
        g_segs = [Mux(is_send, view[128 * (1 + k):128 * (2 + k)], view[128 * (2 + k):128 * (3 + k)])
                  for k in range(G)]
        g_bc = [from_be(sg, *F.get_field(F.DATA_SEG, "byte_count")) for sg in g_segs]
        g_addr = [from_be(sg, *F.get_field(F.DATA_SEG, "addr")) for sg in g_segs]
        g_len = [Signal(31, name=f"g_len{k}") for k in range(G)]    # 0 for the segments ds does not hold
        for k in range(G):
            m.d.comb += g_len[k].eq(Mux(ds > head_ds + k, g_bc[k][:31], 0))
        multi = Signal()
        m.d.comb += multi.eq((is_write | is_send) & (ds > head_ds + 1) & ~is_inline)
        g_sum, g_res, g_ok = Signal(), Signal(), Signal()
        g_total = Signal(33)
        g_pre = [Signal(32, name=f"g_pre{k + 1}") for k in range(G - 1)]   # bytes before segment k + 1
        g_adv = Signal(36)                           # the go-back walk's advance into the WQE
        g_j = Signal(range(G))                       # the segment it falls in ...
        g_off = Signal(32)                           # ... and where
        # DUMP: ctrl + one data segment (where the raddr segment of a WRITE is)
        dump_count = from_be(raddr_seg, *F.get_field(F.DATA_SEG, "byte_count"))
        dump_addr = from_be(raddr_seg, *F.get_field(F.DATA_SEG, "addr"))
        # Atomics: ctrl + raddr + atomic segment(s) + a pointer data segment (the last of ds)
        atomic_ok, wire_op, size8 = Signal(), Signal(8), Signal()
        for wop, wmod, bth_op, want_ds, is8 in _ATOMIC_FORMS:
            with m.If((opcode == wop) & (opmod == wmod) & (ds == want_ds)):
                m.d.comb += [atomic_ok.eq(1), wire_op.eq(bth_op), size8.eq(is8)]
        res_seg = Mux(ds == 5, view[512:640], view[384:512])
        res_count = from_be(res_seg, *F.get_field(F.DATA_SEG, "byte_count"))
        res_addr = from_be(res_seg, *F.get_field(F.DATA_SEG, "addr"))
        fence = fm_ce_se[5:8] != 0
        length = Signal(32)
        kind = Signal(MessageKind)
        m.d.comb += length.eq(Mux(no_data, 0, Mux(is_inline, inline_len, Mux(multi, g_total[:32], byte_count))))
        with m.If(no_ctrl):
            m.d.comb += kind.eq(MessageKind.ERROR)
        with m.Elif(opcode == F.WqeOp.NOP):
            m.d.comb += kind.eq(MessageKind.NOP)
        with m.Elif((opcode == F.WqeOp.DUMP) & (ds == 2) & ~dump_count[31]):
            m.d.comb += kind.eq(MessageKind.DUMP)
        with m.Elif(atomic_ok & ~res_count[31] & ~job.cfg.uc):
            m.d.comb += kind.eq(MessageKind.ATOMIC)
        with m.Elif((opcode == F.WqeOp.RDMA_READ) & (ds == 3) & ~is_inline & ~job.cfg.uc):
            m.d.comb += kind.eq(MessageKind.READ)
        with m.Elif((is_write | is_send)
                    & (no_data
                       | ((ds > head_ds) & is_inline & ((inline_len + 4 + 15) >> 4 == ds - head_ds))
                       | ((ds == head_ds + 1) & ~is_inline)
                       | (multi & g_ok))):
            m.d.comb += kind.eq(MessageKind.WRITE)
        with m.Else():
            m.d.comb += kind.eq(MessageKind.ERROR)

        mtu_shift = Signal(4)
        m.d.comb += mtu_shift.eq(job.cfg.mtu + 7)
        # Packets: ceil(length / MTU), at least one, as (length >> s) + (a remainder, or
        # nothing whole): constant shifts for each MTU, then one choice (no shifter or
        # decrement on the path from the WQEBB to the PSN store)
        whole, part = Signal(24), Signal()
        # (also of the data segment's byte count alone: a READ's length, without the choice
        # of ``length``, for its last PSN)
        bc_whole, bc_part = Signal(24), Signal()
        with m.Switch(job.cfg.mtu):
            for code in range(1, 6):
                with m.Case(code):
                    sh = code + 7
                    m.d.comb += [whole.eq(length >> sh), part.eq(length[:sh].any()),
                                 bc_whole.eq(byte_count >> sh), bc_part.eq(byte_count[:sh].any())]
            with m.Default():                    # (not an ibv_mtu: taken as 4096)
                m.d.comb += [whole.eq(length >> 12), part.eq(length[:12].any()),
                             bc_whole.eq(byte_count >> 12), bc_part.eq(byte_count[:12].any())]
        cin = Signal()                               # the WQE's packets, npkts, are whole + cin
        m.d.comb += cin.eq(part | (length == 0))
        # Go-back-N: skip WQEs wholly before skip_to, resume the one holding it.
        resuming = Signal()                          # the QP is still walking up to skip_to
        resuming_now = Signal()
        m.d.comb += resuming_now.eq(Mux(fresh, ctx.resume, resuming))
        dist = Signal(24)
        m.d.comb += dist.eq(ctx.skip_to - cur_psn)
        ahead = Signal()
        m.d.comb += ahead.eq(resuming_now & (dist != 0) & ~dist[23])
        # PSNs the WQE takes: a flushed WRITE sends nothing, so it takes none (the PSN of a
        # local error's flushes is then the last one sent, which an ACK covers); WQEs a
        # go-back walk passes on its way to skip_to count theirs: npk, npkts for a WRITE or
        # READ, 1 for an atomic, else 0. The WQE's next PSN, cur_psn + npk, with one adder
        # (whole and the carry cin added to cur_psn at once) beside the choice of npk.
        wr_rd = Signal()                             # a WQE whose packets are npkts
        m.d.comb += wr_rd.eq((kind == MessageKind.WRITE) | (kind == MessageKind.READ))
        psn_whole = Signal(24)
        m.d.comb += psn_whole.eq((Cat(cin, cur_psn) + Cat(cin, whole))[1:25])
        next_psn = Signal(24)
        m.d.comb += next_psn.eq(Mux(~cur_fail | ahead, Mux(wr_rd, psn_whole,
                                                         Mux(kind == MessageKind.ATOMIC, cur_psn + 1, cur_psn)),
                                    cur_psn))
        # skip: dist >= npk (while ahead, npk is npkts or, an atomic, 1 <= dist, or 0), as
        # comparisons of dist with whole (npkts < 2^23: no wrap)
        skip_wqe = Signal()
        resume_wqe = Signal()
        covers = Signal()
        m.d.comb += covers.eq(~wr_rd | Mux(cin, dist > whole, dist >= whole))
        m.d.comb += [skip_wqe.eq(ahead & covers), resume_wqe.eq(ahead & ~covers)]
        advance = Signal(36)
        m.d.comb += advance.eq(dist << mtu_shift)
        send_inline = Signal()
        m.d.comb += send_inline.eq((kind == MessageKind.WRITE) & ~no_data & is_inline & (inline_len != 0)
                                   & ~cur_fail)
        # A malformed WQE (not skipped by a go-back walk) fails the QP: the WQEs after it flush.
        malformed = Signal()
        m.d.comb += malformed.eq((kind == MessageKind.ERROR) & ~cur_fail & ~skip_wqe)
        next_fail, next_syn = Signal(), Signal(8)   # failure state and syndrome of the WQE after this one
        m.d.comb += [next_fail.eq(cur_fail | malformed),
                     next_syn.eq(Mux((cur_fail & ~skip_wqe) | malformed, F.Syndrome.WR_FLUSH_ERR, cur_syn))]
        # Inline data: the WQE's 128-byte beats from the one holding byte 36 (or, resumed
        # inside the WQE, the one holding byte 36 + advance) to its last data byte.
        inline_at = Signal(6)                        # where the inline data starts in the WQE: 36, a SEND's 20
        m.d.comb += inline_at.eq(Mux(is_send, self.SEND_INLINE_OFFSET, self.INLINE_OFFSET))
        nbeats = Signal(range(F.MAX_WQEBBS // 2 + 1))
        m.d.comb += nbeats.eq((inline_at + inline_len + 127) >> 7)
        # A WQE a go-back walk resumes inside (``resume_wqe``) is held a cycle (``r_held``), in
        # which its advanced addresses, length and data offset are summed into registers: no
        # adder lies between the WQEBB and the message (a cycle per go-back, which the cycle
        # model, without retransmissions, never sees). The message's fields take the
        # registered values whenever ``r_held`` is set (it is only while the WQE is resumed).
        r_held = Signal()
        r_raddr, r_addr, r_len = Signal(64), Signal(64), Signal(32)
        r_data_off = Signal(36)
        r_eff_addr, r_eff_len = Signal(64), Signal(31)     # a gather list's resumed segment
        g_jaddr = Signal(64)                         # its address, registered in the g_res cycle
        data_off = Signal(36)                        # where the (resumed) data starts in the WQE
        m.d.comb += data_off.eq(Mux(r_held, r_data_off, inline_at))
        skip_beats = Signal.like(nbeats)
        m.d.comb += skip_beats.eq(Mux(r_held, r_data_off >> 7, 0))
        assert max(self.SEND_INLINE_OFFSET, self.INLINE_OFFSET) < 128
        more_beats = Signal()
        m.d.comb += more_beats.eq(skip_beats + 1 < nbeats)
        ibeat, iend = Signal.like(nbeats), Signal.like(nbeats)   # INLINE: next beat, beats in all
        send_atomic = Signal()                       # the atomic's first beat (its operands) to the builder
        m.d.comb += send_atomic.eq((kind == MessageKind.ATOMIC) & ~cur_fail)
        remote_op = Signal()                         # a READ or atomic (not failed)
        m.d.comb += remote_op.eq(((kind == MessageKind.ATOMIC) | (kind == MessageKind.READ)) & ~cur_fail)
        op_last = Signal(24)                         # its last PSN (a READ's last response's)
        # (a READ: cur_psn + ceil(byte_count / MTU) - 1, at least cur_psn; cur_psn - 1 from
        # registers, then one adder with the carry)
        psn_m1 = Signal(24)
        m.d.comb += psn_m1.eq(cur_psn - 1)
        bc_cin = Signal()
        m.d.comb += bc_cin.eq(bc_part | (byte_count == 0))
        m.d.comb += op_last.eq(Mux(kind == MessageKind.READ, (Cat(bc_cin, psn_m1) + Cat(bc_cin, bc_whole))[1:25],
                                   cur_psn))

        # Gather list, the held cycle: the total and prefix sums (an adder tree), and the
        # checks: at most G segments, no inline one after the first, a total below 2^31
        s01, s23 = Signal(32), Signal(32)
        m.d.comb += [s01.eq(g_len[0] + g_len[1]), s23.eq(g_len[2] + g_len[3])]
        sum_total = Signal(33)
        m.d.comb += sum_total.eq(s01 + s23)
        sum_ok = Signal()
        m.d.comb += sum_ok.eq((ds <= head_ds + G) & (sum_total[31:] == 0)
                              & ~Cat(*[(ds > head_ds + k) & g_bc[k][31] for k in range(1, G)]).any())
        # the go-back walk's cycle: the segment j holding the advance (the prefix sums at or
        # below it: an empty segment is passed, one past ds never reached) and the offset in it
        g_ge = Cat(*[p <= g_adv for p in g_pre])
        res_j = Signal(range(G))
        m.d.comb += res_j.eq(sum(g_ge[k] for k in range(G - 1)))
        res_before = Signal(32)
        with m.Switch(res_j):
            for k in range(1, G):
                with m.Case(k):
                    m.d.comb += res_before.eq(g_pre[k - 1])
        hold_gather = Signal()                       # a gather list's WQE, held this cycle
        m.d.comb += hold_gather.eq(multi & (~g_sum | (resuming_now & ~g_res)))
        hold_resume = Signal()                       # a resumed WQE, held this cycle
        m.d.comb += hold_resume.eq(resume_wqe & ~r_held)

        def resume_step():
            m.d.sync += [r_held.eq(1), r_raddr.eq(raddr + advance), r_addr.eq(seg_addr + advance),
                         r_len.eq(length - advance), r_data_off.eq(inline_at + advance),
                         # (from registers: the segment's address, and its length past the
                         # offset as the bytes up to its end less the advance)
                         r_eff_addr.eq(g_jaddr + g_off),
                         r_eff_len.eq(Array([*g_pre, g_total[:32]])[g_j] - g_adv)]

        def gather_step():
            with m.If(~g_sum):
                m.d.sync += [g_sum.eq(1), g_total.eq(sum_total), g_ok.eq(sum_ok), g_adv.eq(advance),
                             g_pre[0].eq(g_len[0]), g_pre[1].eq(s01), g_pre[2].eq(s01 + g_len[2]),
                             g_j.eq(0), g_off.eq(0)]
            with m.Else():
                m.d.sync += [g_res.eq(1), g_j.eq(res_j), g_off.eq(g_adv - res_before),
                             g_jaddr.eq(Array(g_addr)[res_j])]

        # The message's segments: segment j starts at the offset (0 unless resumed), the
        # ones before it and the empty ones are dropped, the rest packed in order
        # (resumed: its segment's address and length advanced by the offset, summed in the
        # held cycle; else g_j and g_off are 0 and every segment is as the WQE has it)
        g_at = Signal(G)
        m.d.comb += g_at.eq(Mux(r_held, 1 << g_j, 0))
        eff = [(Mux(g_at[k], r_eff_addr, g_addr[k]), Mux(g_at[k], r_eff_len, g_len[k])) for k in range(G)]
        g_valid = Cat(*[(g_len[k] != 0) & ((g_j <= k) if k < G - 1 else C(1, 1)) for k in range(G)])
        slot_addr = [Signal(64, name=f"slot_addr{i}") for i in range(G)]
        slot_len = [Signal(31, name=f"slot_len{i}") for i in range(G)]
        g_nseg = Signal(2)
        with m.Switch(g_valid):
            for pattern in range(1 << G):
                idx = [k for k in range(G) if pattern >> k & 1]
                with m.Case(pattern):
                    m.d.comb += g_nseg.eq(max(len(idx) - 1, 0))
                    for i, k in enumerate(idx):
                        m.d.comb += [slot_addr[i].eq(eff[k][0]), slot_len[i].eq(eff[k][1])]

        # READs and atomics: registered (first transmissions), limited, and waited for by fences.
        rtail, rlast, rhead, rhead_fresh = Signal(5), Signal(24), Signal(5), Signal()
        cur_rtail, cur_rlast, cur_rhead = Signal(5), Signal(24), Signal(5)
        m.d.comb += [cur_rtail.eq(Mux(fresh, rr_rd.data.rtail, rtail)), cur_rlast.eq(Mux(fresh, rr_rd.data.rlast, rlast)),
                     cur_rhead.eq(Mux(rhead_fresh, rh_rd.data, rhead))]
        in_flight = Signal(5)
        m.d.comb += in_flight.eq(cur_rtail - cur_rhead)
        new_op = Signal()                            # a first transmission of a READ or atomic
        m.d.comb += new_op.eq(remote_op & ~skip_wqe & ~(cur_psn - cur_rlast - 1)[23])
        # the QP's limit (QP_MAX_RD_ATOMIC: 1..16, else the ring's 16)
        cfg_limit = job.cfg.max_rd_atomic
        limit = Signal(5)
        m.d.comb += limit.eq(Mux((cfg_limit == 0) | (cfg_limit > P.MAX_RD_ATOMIC), P.MAX_RD_ATOMIC, cfg_limit))
        wait_op = Signal()                           # this WQE waits (limit reached, or fenced behind ops)
        m.d.comb += wait_op.eq(~cur_fail & ~skip_wqe
                               & ((new_op & (in_flight >= limit)) | (fence & (in_flight != 0))))
        park, park_tail, park_level, park_limit = Signal(), Signal(5), Signal(5), Signal(5)  # the cut parks its QP

        def park_at(tail, level, parks):
            # cut the burst here; ``parks``: park the QP, woken when its ring (tail ``tail``)
            # is down to ``level`` ops (else a plain cut)
            m.d.sync += [cut.eq(1), park.eq(parks), park_tail.eq(tail), park_limit.eq(limit), park_level.eq(level)]

        full_after = Signal()                        # this WQE is a new op that fills the ring
        m.d.comb += full_after.eq(new_op & ~wait_op & (in_flight + 1 >= limit))
        recreated = Signal()                         # the burst's QP was created again (registered)
        with m.If(rhead_fresh):
            m.d.sync += [rhead.eq(rh_rd.data), rhead_fresh.eq(0)]
        with m.If(self.pops.valid & (self.pops.qpn == job.qpn)):
            m.d.sync += rhead.eq(self.pops.head)

        m.d.comb += [
            self.messages.p.qpn.eq(job.qpn), self.messages.p.cfg.eq(job.cfg),
            self.messages.p.kind.eq(Mux(cur_fail, MessageKind.ERROR, kind)),
            self.messages.p.syndrome.eq(Mux(cur_fail, cur_syn, F.Syndrome.LOCAL_QP_OP_ERR)),
            self.messages.p.signaled.eq((fm_ce_se & F.FM_CE_SE_CQ_UPDATE) != 0),
            self.messages.p.index.eq(index), self.messages.p.raddr.eq(Mux(r_held, r_raddr, raddr)),
            self.messages.p.rkey.eq(rkey), self.messages.p.opcode.eq(opcode),
            self.messages.p.length.eq(Mux((kind == MessageKind.WRITE) | (kind == MessageKind.READ),
                                          Mux(r_held, r_len, length),
                                          Mux(kind == MessageKind.DUMP, dump_count,
                                              Mux(kind == MessageKind.ATOMIC, Mux(size8, 8, 4), 0)))),
            self.messages.p.wire_op.eq(wire_op), self.messages.p.size8.eq(size8),
            self.messages.p.inline.eq(is_inline & ~no_data & (kind == MessageKind.WRITE)),
            self.messages.p.send.eq(is_send), self.messages.p.has_imm.eq(has_imm),
            self.messages.p.imm.eq(imm_bytes), self.messages.p.se.eq((fm_ce_se & F.FM_CE_SE_SOLICITED) != 0),
            # inline: the data's offset in the WQE (the builder starts there in the first beat)
            self.messages.p.addr.eq(Mux(kind == MessageKind.DUMP, dump_addr,
                                        Mux(kind == MessageKind.ATOMIC, res_addr,
                                            Mux(is_inline, data_off,
                                                Mux(multi, slot_addr[0],
                                                    Mux(r_held, r_addr, seg_addr)))))),
            self.messages.p.nseg.eq(Mux(multi, g_nseg, 0)), self.messages.p.seg_len.eq(slot_len[0]),
            *[self.messages.p.segs[i].addr.eq(slot_addr[i + 1]) for i in range(G - 1)],
            *[self.messages.p.segs[i].len.eq(slot_len[i + 1]) for i in range(G - 1)],
            self.remote.qpn.eq(job.qpn), self.remote.slot.eq(cur_rtail), self.remote.psn.eq(cur_psn),
            self.remote.last.eq(op_last), self.remote.addr.eq(Mux(kind == MessageKind.READ, seg_addr, res_addr)),
            self.remote.size8.eq(size8), self.remote.read.eq(kind == MessageKind.READ),
            self.remote.length.eq(length), self.remote.mtu.eq(job.cfg.mtu),
            self.messages.p.psn.eq(Mux(r_held, ctx.skip_to, cur_psn)),
            self.messages.p.resume.eq(r_held), self.messages.p.next_index.eq(index + nbb),
            self.updates.p.qpn.eq(job.qpn), self.updates.p.ci.eq(index),
            self.updates.p.end.eq(job.ci + job.count),
        ]

        # Byte-bound turns (``turns``): each take is noted (``tk_*``) and counted the next
        # cycle, off the path from the WQEBB stream to the context RAM.
        TB = P.TURN_BYTES
        assert TB & (TB - 1) == 0, "TURN_BYTES is a power of two"
        tk_v, tk_first, tk_last, tk_bounded = Signal(), Signal(), Signal(), Signal()
        tk_len = Signal(range(16 * TB))              # a WRITE's length, its low bits ...
        tk_big = Signal()                            # ... and whether it is 16 x TB or more
        tk_goal = Signal(range(16 * TB))             # weight x TB: a QP of weight w gets w x TB a turn
        tk_end = Signal(16)
        tk_qpn = Signal.like(job.qpn)
        tk_bound = Signal(8)
        acc = Signal(range(16 * TB))                 # payload of the burst's WQEs so far, below the goal
        reached = Signal()                           # the burst's WQEs have carried the goal
        m.d.sync += tk_v.eq(0)
        was = Signal()
        total = Signal(range(32 * TB + 1))
        m.d.comb += [was.eq(~tk_first & reached), total.eq(Mux(tk_first, 0, acc) + Mux(tk_big, 16 * TB, tk_len))]
        full = total >= tk_goal
        cross = tk_v & ~was & full
        value = Mux(tk_end < 256, tk_end, 0)
        set_bound = cross & (value != tk_bound)
        # a bounded turn that did not carry the goal (smaller messages now): the bound
        # doubles (up to the quantum's range, then none) rather than going at once, so
        # that one short turn does not open a whole quantum to the next big messages
        grow = tk_v & tk_last & ~was & ~full & tk_bounded
        grown = Mux(tk_bound[7], 0, (tk_bound << 1)[:8])
        with m.If(tk_v):
            m.d.sync += [acc.eq(total[:len(acc)]), reached.eq(was | full)]
        with m.If((set_bound | grow) & (~self.turns.valid | self.turns.ready)):
            m.d.sync += [self.turns.valid.eq(1), self.turns.p.qpn.eq(tk_qpn),
                         self.turns.p.byte_turn.eq(Mux(set_bound, value, grown))]
        with m.Elif(self.turns.ready):
            m.d.sync += self.turns.valid.eq(0)

        def note_take():
            # the take only raises tk_v: the note itself is loaded every cycle (no enable
            # on the take's path, which is the parser's longest)
            m.d.sync += tk_v.eq(1)

        def load_note():
            m.d.sync += [tk_first.eq(fresh), tk_last.eq(last_own), tk_end.eq(rel + nbb),
                         tk_len.eq(Mux(kind == MessageKind.WRITE, length[:len(tk_len)], 0)),
                         tk_big.eq((kind == MessageKind.WRITE) & (length[len(tk_len):] != 0)),
                         tk_goal.eq(Mux(job.cfg.weight == 0, 1, job.cfg.weight) * TB),
                         tk_qpn.eq(job.qpn), tk_bound.eq(job.byte_turn),
                         tk_bounded.eq((job.byte_turn != 0) & (job.own == job.byte_turn))]

        # Context writes: QP creation (any time but END), and the burst's end.
        commit_ok = Signal()
        m.d.comb += self.commit.ready.eq(commit_ok)
        with m.If(self.commit.valid & commit_ok & (self.commit.p.qpn == job.qpn)):
            m.d.sync += recreated.eq(1)
        with m.If(self.commit.valid & commit_ok):
            m.d.comb += [wr.en.eq(1), wr.addr.eq(self.commit.p.qpn), wr.data.index.eq(0),
                         wr.data.psn.eq(self.commit.p.psn), wr.data.resume.eq(0),
                         wr.data.fail.eq(0),
                         rr_wr.en.eq(1), rr_wr.addr.eq(self.commit.p.qpn), rr_wr.data.rtail.eq(0),
                         rr_wr.data.rlast.eq(self.commit.p.psn - 1),
                         rh_new.en.eq(1), rh_new.addr.eq(self.commit.p.qpn), rh_new.data.eq(0),
                         fl_wr.en.eq(1), fl_wr.addr.eq(self.commit.p.qpn), fl_wr.data.eq(self.commit.p.error)]
        with m.If(self.flush.valid):            # (never in a create's cycle: one commit at a time)
            m.d.comb += [fl_wr.en.eq(1), fl_wr.addr.eq(self.flush.p.qpn), fl_wr.data.eq(1)]

        end_now = Signal()                           # RUN ends the burst this cycle (RAM write)
        fsm_update = Signal()                        # the FSM has an update out; else a wake may go

        def store_ctx(index_, psn_, resume_=None, syn_=None, fail_=None, rtail_=None, rlast_=None):
            # the burst's end: the QP's consumer index, next PSN, go-back-N, failure and READ/atomic state
            m.d.comb += [wr.en.eq(1), wr.addr.eq(job.qpn), wr.data.index.eq(index_),
                         rr_wr.en.eq(1), rr_wr.addr.eq(job.qpn),
                         rr_wr.data.rtail.eq(cur_rtail if rtail_ is None else rtail_),
                         rr_wr.data.rlast.eq(cur_rlast if rlast_ is None else rlast_),
                         wr.data.psn.eq(psn_), wr.data.skip_to.eq(ctx.skip_to),
                         wr.data.resume.eq(resuming_now if resume_ is None else resume_),
                         wr.data.fail.eq(cur_fail if fail_ is None else fail_),
                         wr.data.fsyn.eq(cur_syn if syn_ is None else syn_)]

        def start_burst():
            # a waiting retransmission goes first (from IDLE), so busy bursts cannot starve it
            with m.If(~self.retransmit.valid):
                m.d.comb += [self.bursts.ready.eq(1), rd.addr.eq(self.bursts.p.qpn), rd.en.eq(1)]
                with m.If(self.bursts.valid):
                    m.d.sync += [job.eq(self.bursts.p), left.eq(self.bursts.p.count), index.eq(self.bursts.p.ci),
                                 fresh.eq(1), cut.eq(0), stale.eq(0), got.eq(0), rhead_fresh.eq(1),
                                 recreated.eq(0), park.eq(0), g_sum.eq(0), g_res.eq(0), r_held.eq(0)]
                    m.next = "RUN"

        # Where the QP's consumer index stands in this burst: WQEBBs the previous burst
        # already took (it read past its end to finish a WQE), or beyond the burst (stale).
        skip = Signal(16)
        m.d.comb += skip.eq(ctx.index - job.ci)
        rel = Signal(16)
        m.d.comb += rel.eq(index - job.ci)
        last_own = Signal()                          # this WQE is the burst's last own one
        m.d.comb += last_own.eq(rel + nbb >= job.own)
        load_note()
        after_drop = Signal()                        # 0: END, 1: RUN (a skip at the burst's start)

        def drop_then(n, then_run=False):
            with m.If(n == 0):
                m.next = "RUN" if then_run else "END"
            with m.Else():
                m.d.sync += [drop.eq(n), after_drop.eq(then_run)]
                m.next = "DROP"

        with m.FSM():
            with m.State("IDLE"):
                rtx = self.retransmit
                m.d.comb += commit_ok.eq(~rtx.valid)
                with m.If(rtx.valid):
                    # Go back: the QP table fetches again from the restart point.
                    m.d.comb += [self.updates.valid.eq(1), fsm_update.eq(1), self.updates.p.qpn.eq(rtx.p.qpn),
                                 self.updates.p.ci.eq(rtx.p.index), self.updates.p.end.eq(rtx.p.index)]
                    with m.If(self.updates.ready):
                        m.d.comb += [rtx.ready.eq(1), wr.en.eq(1), wr.addr.eq(rtx.p.qpn),
                                     wr.data.index.eq(rtx.p.index), wr.data.psn.eq(rtx.p.psn),
                                     wr.data.skip_to.eq(rtx.p.skip_to), wr.data.resume.eq(1),
                                     wr.data.fail.eq(rtx.p.fail), wr.data.fsyn.eq(rtx.p.syndrome)]
                with m.Else():
                    start_burst()
            with m.State("RUN"):
                m.d.comb += commit_ok.eq(~end_now)
                with m.If(fresh & (skip > job.count)):
                    # Behind a cut WQE (its refetch follows).
                    m.d.sync += [stale.eq(1), drop.eq(left), after_drop.eq(0)]
                    m.next = "DROP"
                with m.Elif(fresh & (skip != 0) & (index != ctx.index)):
                    m.d.sync += [index.eq(ctx.index), left.eq(left - skip)]
                    drop_then(skip, then_run=True)
                with m.Elif(left == 0):
                    m.next = "END"
                with m.Elif((got == 0) & (rel >= job.own)):
                    # Read past the burst's own WQEs: the next burst starts here.
                    drop_then(left)
                with m.Elif(src.valid):
                    with m.If((got == 0) & ~no_ctrl & (nbb_first > left)):
                        # The WQE runs past what was posted: fetched again from here.
                        m.d.sync += cut.eq(1)
                        drop_then(left)
                    with m.Elif(got + 1 < nbb):
                        # gather
                        m.d.comb += src.ready.eq(1)
                        m.d.sync += [wqe.eq(view), got.eq(got + 1), left.eq(left - 1)]
                        with m.If(got == 0):
                            m.d.sync += need.eq(nbb_first)
                    with m.Elif(wait_op):
                        # A WQE that must wait: cut the burst here and park the QP, so the
                        # other QPs' WQEs go on (a go-back-N or create waiting: a plain cut,
                        # they fetch it again); it is woken when its ops are down to the level
                        park_at(cur_rtail, Mux(fence & (in_flight != 0), 0, limit - 1),
                                ~self.retransmit.valid & ~recreated)
                        drop_then(left)
                    with m.Elif(hold_gather):
                        # A gather list: summed this cycle (and split at the resume point,
                        # a cycle more, in a go-back walk); taken in the next
                        gather_step()
                    with m.Elif(hold_resume):
                        # Resumed inside: its advanced fields summed this cycle, taken in the next
                        resume_step()
                    with m.Else():
                        # The WQE is whole: hand it on with its inline beat (or skip it:
                        # it was acknowledged before the retransmission's first PSN).
                        emit = ~skip_wqe
                        beat_out = send_inline | send_atomic
                        inline_ok = ~beat_out | self.inline.ready
                        m.d.comb += [
                            self.messages.valid.eq(emit & inline_ok & ~wait_op),
                            self.inline.valid.eq(emit & beat_out & self.messages.ready & ~wait_op),
                            self.inline.p.eq(Mux(send_atomic, view[:1024], view.word_select(skip_beats, 1024))),
                        ]
                        # (taken when a message could leave, emitted or skipped: the take does
                        # not wait on the skip decision, one LUT level off the longest path)
                        with m.If(self.messages.ready & inline_ok & ~wait_op):
                            m.d.comb += [src.ready.eq(1), self.remote.valid.eq(new_op)]
                            note_take()
                            m.d.sync += [index.eq(index + nbb), left.eq(left - 1), got.eq(0), fresh.eq(0),
                                         g_sum.eq(0), g_res.eq(0), r_held.eq(0),
                                         psn.eq(next_psn), wqe.eq(view), resuming.eq(skip_wqe),
                                         failing.eq(next_fail), fsyn.eq(next_syn),
                                         rtail.eq(cur_rtail + new_op), rlast.eq(Mux(new_op, op_last, cur_rlast))]
                            with m.If(emit & send_inline & more_beats):
                                m.d.sync += [ibeat.eq(skip_beats + 1), iend.eq(nbeats)]
                                m.next = "INLINE"
                            with m.Elif(((left == 1) | last_own) & full_after & ~self.retransmit.valid & ~recreated):
                                # The burst's last own WQE fills the QP's ring: park the QP at
                                # the next WQE (END, after the WQEBBs read past it), so its next
                                # turn is not fetched only to wait
                                park_at(cur_rtail + 1, limit - 1, 1)
                                drop_then(left - 1)
                            with m.Elif((left == 1) & job.hold):
                                m.next = "END"              # the QP table waits for its WAKE
                            with m.Elif(left == 1):
                                # The burst's last WQE: store the QP's state and take the
                                # next burst in this same cycle (no END cycle).
                                m.d.comb += end_now.eq(1)
                                store_ctx(index + nbb, next_psn, skip_wqe, next_syn, next_fail,
                                          cur_rtail + new_op, Mux(new_op, op_last, cur_rlast))
                                m.next = "IDLE"
                                start_burst()
            with m.State("INLINE"):
                # the inline WRITE's further beats, one a cycle, from the gathered WQE
                m.d.comb += [commit_ok.eq(1), self.inline.valid.eq(1), self.inline.p.eq(wqe.word_select(ibeat, 1024))]
                with m.If(self.inline.ready):
                    m.d.sync += ibeat.eq(ibeat + 1)
                    with m.If(ibeat + 1 == iend):
                        with m.If(left == 0):
                            m.next = "END"
                        with m.Else():
                            m.next = "RUN"
            with m.State("DROP"):
                # Discard WQEBBs: the burst's rest (after a cut WQE, past its own WQEs, or
                # all of a stale burst), or the head its predecessor already took.
                quiet = ~after_drop & ~cut & ~job.hold    # nothing to report: end the burst here
                m.d.comb += commit_ok.eq(~(quiet & (drop == 1) & src.valid))
                with m.If(src.valid):
                    m.d.comb += src.ready.eq(1)
                    m.d.sync += drop.eq(drop - 1)
                    with m.If(drop == 1):
                        with m.If(after_drop):
                            m.next = "RUN"
                        with m.Elif(quiet):
                            with m.If(~stale):
                                store_ctx(index, cur_psn)
                            m.next = "IDLE"
                            start_burst()
                        with m.Else():
                            m.next = "END"
            with m.State("END"):
                # Store the QP's state; report a cut (a park: released already by a pop
                # since, or now, it is a resume); take the next burst.
                # A held burst (the QP table keeps its QP off the round robin) that ends
                # without a cut wakes its QP, uncapped (``fi`` already stands past it).
                cutting = ~stale & cut
                report = cutting | job.hold
                released = Signal()
                m.d.comb += released.eq(((park_tail - cur_rhead)[:5] <= park_level)
                                        | (self.pops.valid & (self.pops.qpn == job.qpn)))
                m.d.comb += [self.updates.valid.eq(report), fsm_update.eq(report),
                             self.updates.p.room.eq(Mux(cutting, park_limit, 0)),
                             self.updates.p.kind.eq(Mux(~cutting, UpdateKind.WAKE,
                                                        Mux(park, Mux(released, UpdateKind.RESUME, UpdateKind.PARK),
                                                            UpdateKind.CUT)))]
                m.d.comb += [pk_set.addr.eq(job.qpn), pk_set.data.parked.eq(1), pk_set.data.rtail.eq(park_tail),
                             pk_set.data.level.eq(park_level), pk_set.data.limit.eq(park_limit),
                             pk_set.en.eq(cutting & park & ~released & self.updates.ready)]
                with m.If(~report | self.updates.ready):
                    with m.If(~stale):
                        store_ctx(index, cur_psn)
                    m.next = "IDLE"
                    start_burst()
        # Wakes go to the QP table when the FSM has no update out (after the PARK they answer)
        with m.If(~fsm_update):
            m.d.comb += [self.updates.valid.eq(wake_q.r_rdy), self.updates.p.qpn.eq(wake_q.r_data[:len(self.pops.qpn)]),
                         self.updates.p.room.eq(wake_q.r_data[len(self.pops.qpn):]),
                         self.updates.p.kind.eq(UpdateKind.WAKE), wake_q.r_en.eq(self.updates.ready)]
        return m
