"""Receive payload writer: the payload of accepted RDMA WRITE packets into GPU memory."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream, fifo
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from rtl.common.axi import AxiWriteSignature, Burst, Cache, beats_to_page_end
from rtl.common.rx_beat import RxSegmentBeat, SEGMENT as SEG
from rtl.common.rx_packet import INLINE_MAX
from spec.params import AXI_ID_RX_WRITE, DATA_BYTES, RECV_MAX_SGE

__all__ = ["RxWriteCommand", "RxPayloadWriter"]

BEAT = DATA_BYTES               # bytes per beat (the segment format is defined for 1024 bits)
BEAT_SHIFT = (BEAT - 1).bit_length()
AWID = AXI_ID_RX_WRITE
W_QUEUE = 4                     # W beats between the aligner and the W channel
# The beats of a frame written in pieces (a SEND packet over receive segments), but its last:
# a 4096-byte payload behind up to 78 bytes of headers and ICRC, from lane 64, spans 34 beats.
REPLAY_BEATS = 33


# The low bits of a QP number that the write ordering compares (a larger table only
# shares a tag between QPs: more writes kept in order, never fewer)
QP_TAG_BITS = 10

RxWriteCommand = data.StructLayout({
    "write":  unsigned(1),      # 1: write the payload; 0: discard the frame
    "addr":   unsigned(64),     # GPU address of the payload's first byte
    "offset": unsigned(13),     # payload's byte offset within the frame (54, 58, 70, 74; a piece: further on)
    "length": unsigned(13),     # payload bytes, 0..4096
    "inline": unsigned(1),      # the payload is in ``data`` (RxPacket.inline): not for this writer
    "data":   unsigned(8 * INLINE_MAX),     # with inline: the payload bytes, first in bits 7..0
    "qp":     unsigned(QP_TAG_BITS),        # the QP's number (low bits): its writes land in order
    "fence":  unsigned(1),      # with inline: an atomic's or READ's place in the write order (no payload)
    "fence_read": unsigned(1),  # with fence: a READ's (else an atomic's)
    "read_response": unsigned(1),   # a READ RESPONSE received (``write`` and ``addr`` come from
                                    # the requester's checker: ``ReadResponseJoin``)
    "fence_local": unsigned(1),     # with fence: a READ of this NIC's requester completes
    "cqe":    unsigned(1),      # a receive completion follows this frame's write (a CQE fence
                                # after it: the CQE is written once the writes before it landed)
    # A SEND packet over receive segments: the payload past ``length`` goes on, in order, to
    # the pieces with a length (each from its segment's start; the responder's), which
    # ``RxScatterSplit`` makes commands of their own; and, on such a command, ``more``: more
    # of this frame's pieces follow (the payload writer goes over its beats again).
    "extra":  data.ArrayLayout(data.StructLayout({"addr": unsigned(64), "length": unsigned(13)}),
                               RECV_MAX_SGE - 1),
    "more":   unsigned(1),
})
RxWriteCommand.__doc__ = """What to do with one received frame (see :class:`RxPayloadWriter`)."""

# Per-frame aligner state, derived once from the command and the frame's start lane.
_Frame = data.StructLayout({
    "wr":       unsigned(1),    # the frame has W beats (write with length > 0)
    "addr_lo":  unsigned(7),    # address lane of the payload's first byte
    "r":        unsigned(7),    # shift: W lane L takes lane L + r of {hi beat, lo beat}
    "jm":       signed(8),      # W beat the main slot completes at this step (< 0: none yet)
    "nw":       unsigned(7),    # W beats of the frame
    "end_lane": unsigned(8),    # 1..128: lanes of the last W beat
    "nb0":      unsigned(7),    # W beats in the first burst (the rest go in a second one)
    "more":     unsigned(1),    # more pieces of the frame follow (its command's ``more``)
})

_WBeat = data.StructLayout({"data": unsigned(8 * BEAT), "strb": unsigned(BEAT), "last": unsigned(1)})
_AwJob = data.StructLayout({"line": unsigned(64 - BEAT_SHIFT), "nb0": unsigned(7), "nb1": unsigned(7)})
_Pending = data.StructLayout({"bursts": unsigned(2), "length": unsigned(13)})


class RxPayloadWriter(wiring.Component):
    """Writes the payload of accepted WRITE packets to GPU memory; discards other frames.

    Frames arrive on ``beats`` in the 64-byte segment format (:func:`rtl.common.rx_beat.RxSegmentBeat`):
    a frame starts at lane 0, or at lane 64 of the beat that ends the previous frame
    (``sop_hi``). One command per frame arrives on ``commands``, in frame order; it may
    come later than the frame's beats, which then wait (back-pressure on ``beats``; the
    top level buffers them). A frame with ``write`` = 0, or with ``length`` = 0, is
    consumed and nothing of it reaches memory.

    A write's payload, ``length`` bytes from frame byte ``offset``, goes to
    ``[addr, addr + length)`` as INCR bursts of 128-byte beats (``awsize`` 7) that start
    at ``addr`` rounded down to 128 bytes, split at the 4 KiB boundary (a burst inside
    one page is at most 32 beats); ``wstrb`` marks exactly the payload bytes, so the
    first and last beat are partial unless the payload is line aligned. W beats follow
    AW order; a W beat may go out before its AW (AXI allows it).

    Realignment: payload byte i sits at stream lane ``start + offset + i`` (``start``
    0 or 64) and goes to lane ``(addr + i) mod 128``, so W lane L of a beat takes lane
    ``L + r`` of two consecutive input beats ``{hi, lo}``, with ``r = (start + offset -
    addr) mod 128``: one 256-byte barrel shift of ``{cur, prev}`` per cycle, ``prev``
    being a one-beat carry. The shift of ``{0, cur}`` by the same ``r`` (the upper
    half of the shifter) gives a frame's last W beat in the cycle of its last input
    beat when no byte of it is in a later beat, so no extra flush cycle is spent.

    A frame written in pieces (a SEND packet over receive segments: ``RxScatterSplit``
    gives it consecutive commands, each with its piece's ``offset``, ``length`` and
    ``addr``, ``more`` on all but the last) is gone over once per piece: the first piece
    takes its beats from ``beats`` and keeps all but the last in a RAM of
    ``REPLAY_BEATS``; its last beat stays at the head of ``beats`` (a frame that starts at
    lane 64 of it is hidden until the last piece); each later piece takes the kept beats,
    then that beat, as a frame of its own that starts where the first did. A piece costs
    its frame's beats in cycles; a frame written whole costs nothing more.

    Completion: each write command (``write`` = 1, also with ``length`` = 0) is
    completed in command order once every burst of its payload has its B response:
    ``done`` pulses for one cycle with its ``done_length``, and the ``writes`` and
    ``bytes`` counters advance. At most ``max_outstanding`` write commands are between
    their acceptance and their completion.

    Throughput (``wready`` and ``awready`` high, commands in time). The block does one
    step per cycle: it takes an input beat or, when the beat also starts the next frame
    at lane 64, the part that ends the current frame; the next frame's first step is
    merged into the same cycle when it completes no W beat. A step puts at most one W
    beat into a 4-beat W queue, or two on a frame's last input beat (the W beat ending
    there and the frame's last W beat, both from the one shifter); W takes one per cycle.
    A payload of p bytes at address a needs ``ceil(((a mod 128) + p) / 128)`` W beats,
    at most one more than the input beats its bytes span.

    - Aligned addresses (a mod 128 = 0): one input beat per cycle, beats that end one
      frame and start the next at lane 64 included. The one exception: a beat holding a
      whole frame of at most 64 bytes from lane 0 (0..6 payload bytes behind 54 or 58
      header bytes, or a short frame to discard) and the start of another at lane 64
      takes two cycles. (tests/blocks/test_payload_writer.py counts the cycles.)
    - Unaligned addresses: the W channel sets the pace where W beats outnumber input
      beats; a stream takes at most ``max(input beats, W beats)`` cycles plus one per
      frame that starts at lane 64 with ``a mod 128 > 64 + offset`` (its first W beat
      needs its own step), as measured in the tests.

    Commands must describe bytes inside their frame (``offset + length + 4`` at most the
    frame's length, as the header parser ensures) and at most 4096 bytes: a burst is
    announced on AW for every W beat the command implies. Only ``last``, ``sop_hi`` and
    ``data`` of the beats are used; the command says which bytes count.

    Parameters
    ----------
    data_width : int
        Data width in bits; 1024 (the 64-byte segment format needs 128-byte beats).
    id_width : int
        AXI id width; at least 2 (AWID is 2).
    max_outstanding : int
        Write commands accepted and not yet completed (B), a power of two >= 2.

    Members
    -------
    beats : In(stream.Signature(RxSegmentBeat()))
        The received frames' beats, in frame order.
    commands : In(stream.Signature(RxWriteCommand))
        One per frame, in frame order.
    dma : Out(AxiWriteSignature(addr_width=64, data_width=1024, id_width=id_width))
        AWID 2; ``bready`` is always high.
    done : Out(1)
        Strobe: the oldest pending write command is complete (its data is in memory).
    done_length : Out(13)
        That command's ``length``, with ``done``.
    writes : Out(32)
        Write commands completed.
    bytes : Out(64)
        Payload bytes of the completed write commands.
    """
    def __init__(self, *, data_width=1024, id_width=4, max_outstanding=64):
        if data_width != 8 * BEAT:
            raise ValueError(f"data_width must be {8 * BEAT} (64-byte segments in 128-byte beats), "
                             f"not {data_width!r}")
        if not isinstance(id_width, int) or id_width < AWID.bit_length():
            raise ValueError(f"id_width must be an integer >= {AWID.bit_length()} (AWID {AWID}), "
                             f"not {id_width!r}")
        if (not isinstance(max_outstanding, int) or max_outstanding < 2
                or max_outstanding & (max_outstanding - 1)):
            raise ValueError(f"max_outstanding must be a power of two >= 2, not {max_outstanding!r}")
        self.data_width, self.id_width, self.max_outstanding = data_width, id_width, max_outstanding
        super().__init__({
            "beats": In(stream.Signature(RxSegmentBeat(BEAT))),
            "commands": In(stream.Signature(RxWriteCommand)),
            "dma": Out(AxiWriteSignature(addr_width=64, data_width=data_width, id_width=id_width)),
            "done": Out(1),
            "done_length": Out(13),
            "writes": Out(32),
            "bytes": Out(64),
        })

    def elaborate(self, platform):
        m = Module()
        dma, cmd = self.dma, self.commands.p

        m.submodules.aw_jobs = aw_jobs = fifo.SyncFIFOBuffered(width=_AwJob.size, depth=4)
        m.submodules.pending = pending = fifo.SyncFIFOBuffered(width=_Pending.size,
                                                               depth=self.max_outstanding)

        in_frame = Signal()          # a frame is loaded: lane 0 of the next step's beat is its
        part_hi = Signal()           # the held beat's lower part is done; next: its frame at lane 64
        cur = Signal(_Frame)         # the loaded frame
        prev = Signal(8 * BEAT)      # carry: the last input beat taken

        # A frame written in pieces (commands with ``more`` but the last): its first piece
        # takes its beats from ``beats`` and keeps all but the last in ``replay``; every later
        # piece goes over those again, then the last beat, which stays at the head of
        # ``beats`` until the frame's last piece takes it. So each piece is a frame of its own
        # here, with its payload further on in it (``offset``), and a one-piece frame (every
        # WRITE, a SEND packet within one segment) costs nothing more.
        m.submodules.replay = replay = Memory(shape=8 * BEAT, depth=REPLAY_BEATS, init=[])
        rp_wr = replay.write_port()
        rp_rd = replay.read_port(domain="comb")
        again = Signal()             # the frame's next piece goes over its beats again
        rp_n = Signal(range(REPLAY_BEATS + 1))      # beats kept of the frame
        rp_idx = Signal(range(REPLAY_BEATS + 1))    # the next kept beat to go over
        rp_hi = Signal()             # the frame starts at lane 64 of its first beat
        from_buf = Signal()          # this step's beat is a kept one
        m.d.comb += [from_buf.eq(again & (rp_idx != rp_n)), rp_rd.addr.eq(rp_idx)]

        # ---- a new frame's state, from the command ------------------------------------
        # Starts at lane 64 when it follows a frame in the same beat (a merge while a
        # frame is loaded, or the second pass of a held beat), else at lane 0.
        new = Signal(_Frame)
        start = Signal(7)
        m.d.comb += start.eq(Mux(in_frame | part_hi | (again & rp_hi), SEG, 0))
        delta = Signal(signed(15))   # -127..4255
        m.d.comb += delta.eq(start + cmd.offset - cmd.addr[:BEAT_SHIFT])
        span = Signal(14)            # lanes from the first W beat's lane 0 to the payload's end
        m.d.comb += span.eq(cmd.addr[:BEAT_SHIFT] + cmd.length)
        nw = Signal(7)
        m.d.comb += nw.eq(Mux(cmd.length == 0, 0, (span + BEAT - 1) >> BEAT_SHIFT))
        to_page = Signal(7)          # beats from the first line to the 4 KiB boundary: 1..32
        m.d.comb += to_page.eq(beats_to_page_end(Cat(C(0, BEAT_SHIFT), cmd.addr[BEAT_SHIFT:]), BEAT_SHIFT))
        span_m1 = Signal(14)
        m.d.comb += span_m1.eq(span - 1)
        m.d.comb += [
            new.wr.eq(cmd.write & (cmd.length != 0)),
            new.addr_lo.eq(cmd.addr[:BEAT_SHIFT]),
            new.r.eq(delta[:BEAT_SHIFT]),
            # the main slot completes W beat t - 1 - q at step t, q = floor(delta / 128)
            new.jm.eq(-1 - (delta >> BEAT_SHIFT)),
            new.nw.eq(nw),
            new.end_lane.eq(span_m1[:BEAT_SHIFT] + 1),
            new.nb0.eq(Mux(nw < to_page, nw, to_page)),
            new.more.eq(cmd.more),
        ]
        new_emits = Signal()         # the new frame's first step already completes a W beat (q = -1)
        m.d.comb += new_emits.eq(new.wr & (new.jm == 0))
        room = Signal()              # the command's AW job and completion entry fit
        m.d.comb += room.eq((~cmd.write | pending.w_rdy) & (~new.wr | aw_jobs.w_rdy))

        # ---- one step: the frame that holds the held beat's current part ----------------
        act = Signal(_Frame)
        with m.If(in_frame):
            m.d.comb += act.eq(cur)
        with m.Else():
            m.d.comb += act.eq(new)
        # The beat of this step: a kept one, or the input's (where a piece but the frame's last
        # ends, the frame it starts at lane 64 is not this piece's business: it stays hidden)
        beat = Signal(RxSegmentBeat(BEAT))
        beat_valid = Signal()
        with m.If(from_buf):
            m.d.comb += [beat.data.eq(rp_rd.data), beat_valid.eq(1)]    # never a frame's last beat
        with m.Else():
            m.d.comb += [beat.data.eq(self.beats.p.data), beat.last.eq(self.beats.p.last),
                         beat.sop_hi.eq(self.beats.p.sop_hi & ~act.more), beat_valid.eq(self.beats.valid)]
        stepping = Signal()
        m.d.comb += stepping.eq(beat_valid & (in_frame | (self.commands.valid & room)))
        # a frame started at lane 64 runs into the next beat: it never ends in its first
        step_last = Signal()
        m.d.comb += step_last.eq(beat.last & (in_frame | ~part_hi))

        # Barrel shift of {0, cur, prev} by r bytes: the low beat is the main slot's W beat
        # ({cur, prev}), the high beat the last W beat taken from cur alone.
        window = Signal(3 * 8 * BEAT)
        m.d.comb += window.eq(Cat(prev, beat.data, C(0, 8 * BEAT)))
        shifted = Signal(2 * 8 * BEAT)
        m.d.comb += shifted.eq(window >> (act.r * 8))

        main_emit, cur_emit = Signal(), Signal()
        m.d.comb += [
            main_emit.eq(act.wr & (act.jm >= 0) & (act.jm < act.nw)),
            cur_emit.eq(act.wr & step_last & (act.jm + 2 == act.nw)),
        ]

        def w_beat(j, payload):
            # strobes: lanes from addr_lo on the first W beat, up to end_lane on the last
            b = Signal(_WBeat, name=f"w_{payload.name}")
            first, final = Signal(name=f"first_{payload.name}"), Signal(name=f"final_{payload.name}")
            lo, hi = Signal(8, name=f"lo_{payload.name}"), Signal(8, name=f"hi_{payload.name}")
            cut = Signal(7, name=f"cut_{payload.name}")      # lanes above the last strobe
            lo_mask, hi_mask = Signal(BEAT, name=f"lom_{payload.name}"), Signal(BEAT, name=f"him_{payload.name}")
            ones = Const((1 << BEAT) - 1, BEAT)
            m.d.comb += [
                first.eq(j == 0), final.eq(j == act.nw - 1),
                lo.eq(Mux(first, act.addr_lo, 0)), hi.eq(Mux(final, act.end_lane, BEAT)),
                cut.eq(BEAT - hi), lo_mask.eq(ones << lo), hi_mask.eq(ones >> cut),
                b.data.eq(payload), b.strb.eq(lo_mask & hi_mask),
                b.last.eq(final | (j == act.nb0 - 1)),
            ]
            return b

        main_data, cur_data = Signal(8 * BEAT), Signal(8 * BEAT)
        m.d.comb += [main_data.eq(shifted[:8 * BEAT]), cur_data.eq(shifted[8 * BEAT:])]
        jm_next = Signal(signed(9))
        m.d.comb += jm_next.eq(act.jm + 1)
        main_beat = w_beat(act.jm, main_data)
        cur_beat = w_beat(jm_next, cur_data)

        # ---- W queue: up to two W beats in per cycle, one out -----------------------------
        wq = Array(Signal(_WBeat.size, name=f"wq{i}") for i in range(W_QUEUE))
        wq_rp, wq_wp = Signal(range(W_QUEUE)), Signal(range(W_QUEUE))
        wq_level = Signal(range(W_QUEUE + 1))
        n_emit = Signal(2)
        m.d.comb += n_emit.eq(main_emit + cur_emit)
        # registered level only: no path from wready to the input's ready
        fits = Signal()
        m.d.comb += fits.eq(wq_level + n_emit <= W_QUEUE)
        ok = Signal()                # the step happens this cycle
        m.d.comb += ok.eq(stepping & fits)
        push = Signal(2)
        m.d.comb += push.eq(Mux(ok, n_emit, 0))
        with m.If(push != 0):
            m.d.sync += wq[wq_wp].eq(Mux(main_emit, main_beat, cur_beat))
        with m.If(push == 2):
            m.d.sync += wq[(wq_wp + 1)[:len(wq_wp)]].eq(cur_beat)
        head = Signal(_WBeat)
        m.d.comb += head.eq(wq[wq_rp])
        pop = Signal()
        m.d.comb += [
            dma.wvalid.eq(wq_level != 0), dma.wdata.eq(head.data), dma.wstrb.eq(head.strb),
            dma.wlast.eq(head.last), pop.eq(dma.wvalid & dma.wready),
        ]
        m.d.sync += [wq_wp.eq(wq_wp + push), wq_rp.eq(wq_rp + pop), wq_level.eq(wq_level + push - pop)]

        # ---- frame sequencing ---------------------------------------------------------------
        load = Signal()              # take the command: a new frame starts in this beat
        consume = Signal()
        jm_sat = Signal(signed(8))   # stop counting past the last W beat (long discarded frames)
        m.d.comb += jm_sat.eq(Mux(act.jm < act.nw, act.jm + 1, act.jm))
        merge = Signal()             # the next frame's first step merged into this one
        keep = Signal()              # a beat of a frame written in pieces: kept (its first piece)
        final = Signal()             # the last piece of a frame written in pieces ends
        with m.If(ok):
            with m.If(~in_frame):
                m.d.comb += load.eq(1)
            with m.If(step_last & beat.sop_hi):
                # The next frame starts at lane 64 of this beat. Merge its first step into
                # this cycle when it completes no W beat (its W lanes would need its own shift).
                with m.If(in_frame & self.commands.valid & room & ~new_emits):
                    m.d.comb += [load.eq(1), consume.eq(1), merge.eq(1), keep.eq(cmd.more)]
                    m.d.sync += [cur.eq(new), cur.jm.eq(new.jm + 1), in_frame.eq(1), part_hi.eq(0),
                                 rp_hi.eq(1)]
                with m.Else():
                    m.d.sync += [in_frame.eq(0), part_hi.eq(1)]
            with m.Elif(step_last):
                m.d.comb += consume.eq(1)
                m.d.sync += [in_frame.eq(0), part_hi.eq(0)]
            with m.Else():
                m.d.comb += [consume.eq(1), keep.eq(act.more & ~again)]
                m.d.sync += [cur.eq(act), cur.jm.eq(jm_sat), in_frame.eq(1), part_hi.eq(0)]
            with m.If(~in_frame & ~again):
                m.d.sync += rp_hi.eq(part_hi)
            with m.If(step_last & act.more):
                m.d.sync += [again.eq(1), rp_idx.eq(0)]      # its next piece goes over it again
            with m.If(step_last & again & ~act.more):
                m.d.comb += final.eq(1)
                m.d.sync += [again.eq(0), rp_n.eq(0), rp_idx.eq(0)]
        # the input's beat is taken unless it is the last of a piece that more pieces follow
        m.d.comb += self.beats.ready.eq(consume & ~from_buf & ~(step_last & act.more))
        with m.If(consume & from_buf):
            m.d.sync += rp_idx.eq(rp_idx + 1)
        keep_at = Signal.like(rp_n)
        m.d.comb += [keep_at.eq(Mux(final, 0, rp_n)), rp_wr.addr.eq(keep_at), rp_wr.data.eq(beat.data),
                     rp_wr.en.eq(keep)]
        with m.If(keep):
            m.d.sync += rp_n.eq(keep_at + 1)
        with m.If(consume):
            m.d.sync += prev.eq(beat.data)
        m.d.comb += self.commands.ready.eq(load)

        # ---- AW: one or two bursts per write, in command order ---------------------------
        job_in = Signal(_AwJob)
        line = Signal(64 - BEAT_SHIFT)
        m.d.comb += [
            line.eq(cmd.addr[BEAT_SHIFT:]),
            job_in.line.eq(line), job_in.nb0.eq(new.nb0), job_in.nb1.eq(new.nw - new.nb0),
            aw_jobs.w_data.eq(job_in), aw_jobs.w_en.eq(load & new.wr),
        ]
        job = Signal(_AwJob)
        m.d.comb += job.eq(aw_jobs.r_data)
        second = Signal()            # the job's second burst (past the 4 KiB boundary) is next
        aw_line = Signal(64 - BEAT_SHIFT)
        m.d.comb += aw_line.eq(Mux(second, job.line + job.nb0, job.line))
        aw_len = Signal(7)
        m.d.comb += aw_len.eq(Mux(second, job.nb1, job.nb0) - 1)
        m.d.comb += [
            dma.awid.eq(AWID), dma.awaddr.eq(Cat(C(0, BEAT_SHIFT), aw_line)), dma.awlen.eq(aw_len),
            dma.awsize.eq(BEAT_SHIFT), dma.awburst.eq(Burst.INCR),
            dma.awcache.eq(Cache.NORMAL_NON_CACHEABLE_BUFFERABLE),
            dma.awvalid.eq(aw_jobs.r_rdy),
        ]
        with m.If(dma.awvalid & dma.awready):
            with m.If(~second & (job.nb1 != 0)):
                m.d.sync += second.eq(1)
            with m.Else():
                m.d.comb += aw_jobs.r_en.eq(1)
                m.d.sync += second.eq(0)

        # ---- B: complete the write commands in order ---------------------------------------
        entry_in = Signal(_Pending)
        m.d.comb += [
            entry_in.bursts.eq(Mux(new.nw == 0, 0, Mux(new.nw > new.nb0, 2, 1))),
            entry_in.length.eq(cmd.length),
            pending.w_data.eq(entry_in), pending.w_en.eq(load & cmd.write),
        ]
        m.d.comb += dma.bready.eq(1)
        entry = Signal(_Pending)
        m.d.comb += entry.eq(pending.r_data)
        b_got = Signal(range(2 * self.max_outstanding + 1))    # B responses not yet matched
        b_now = Signal.like(b_got)
        m.d.comb += b_now.eq(b_got + dma.bvalid)
        complete = Signal()
        m.d.comb += complete.eq(pending.r_rdy & (b_now >= entry.bursts))
        m.d.sync += b_got.eq(b_now - Mux(complete, entry.bursts, 0))
        m.d.comb += [pending.r_en.eq(complete), self.done.eq(complete), self.done_length.eq(entry.length)]
        with m.If(complete):
            m.d.sync += [self.writes.eq(self.writes + 1), self.bytes.eq(self.bytes + entry.length)]
        return m
