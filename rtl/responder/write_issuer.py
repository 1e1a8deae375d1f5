"""Receive write issuer: received payload onto two AXI4 write ports, up to two writes per
cycle, writes that overlap kept in order."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from spec.params import AXI_PAGE_SHIFT
from rtl.common.axi import AxiWriteSignature, Burst, Cache
from rtl.common.rx_packet import INLINE_MAX
from rtl.common.stream import Pair
from rtl.responder.write_sorter import RxWriteOrder, LINE_SHIFT
from rtl.responder.payload_writer import QP_TAG_BITS
from spec.params import AXI_ID_RX_WRITE, DATA_BYTES

__all__ = ["RxWriteIssuer"]

BEAT = DATA_BYTES
assert BEAT == 1 << LINE_SHIFT
AWID = AXI_ID_RX_WRITE
PAGE_LINE_BITS = AXI_PAGE_SHIFT - LINE_SHIFT    # 32 lines in a 4 KiB page
PAGE_TAG_BITS = 16                      # low bits of the page number compared

_Sub = data.StructLayout({"lane": unsigned(LINE_SHIFT), "length": unsigned(3),
                          "data": unsigned(8 * INLINE_MAX)})
_Track = data.StructLayout({
    "seg":   unsigned(1),               # a payload-writer burst: W from the writer, B back to it
    "page":  unsigned(PAGE_TAG_BITS),   # the lines the burst covers: page tag,
    "first": unsigned(PAGE_LINE_BITS),  # first and last line in the page
    "last":  unsigned(PAGE_LINE_BITS),
    "qp":    unsigned(QP_TAG_BITS),     # the QP whose write it is
    "two":   unsigned(1),               # inline: w[1] (a later write to the same line) merged in
    "w":     data.ArrayLayout(_Sub, 2),
})


class RxWriteIssuer(wiring.Component):
    """Puts the writes of received payload on two AXI4 write ports, ``p0`` and ``p1``, up
    to two per cycle, so that floods of the smallest WRITEs (1-byte payloads, 1.01
    frames per cycle at 400 Gb/s) are written at line rate.

    The writes come on ``orders`` in the order the responder accepted them. An inline
    order is one write of 1..4 bytes within a 128-byte line, done here as a one-beat
    burst; a payload-writer order stands for the next one or two bursts on ``writer``
    (the :class:`rtl.responder.payload_writer.RxPayloadWriter`'s AXI master), passed to ``p0``
    with their W beats, their B responses passed back.

    Order. Two writes on one port stay in order (same AWID). Two writes on different
    ports may land in any order, so a write is never put on a port while a write it
    conflicts with is in flight (from AW to B) on the other one: one it overlaps (same
    128-byte line), or one of the same QP (so a QP's writes land in the order it sent
    them, whatever the ports' write-response latencies: put-with-signal's flag never
    lands before its data). Per port a ring of the bursts in flight holds each one's
    lines (a 16-bit page tag and the first and last line in the page) and QP (a 10-bit
    tag); a false match on a tag only narrows the choice. So one QP's writes take one
    port while any is in flight (one a cycle, two to one line merged into a beat), and
    different QPs' spread over both. The writes are issued strictly in order, one or two
    per cycle:

    - an inline write conflicting with bursts in flight on one port goes to that port;
      on both, it waits; otherwise it takes the port after the last one used (round
      robin), so other QPs' writes spread over both ports;
    - a payload-writer burst goes to ``p0``, once ``p1`` has nothing in flight it
      conflicts with;
    - the second write of a cycle takes the other port and must not conflict with the
      first;
      an inline write to the first one's line (inline too) is merged into its beat
      (later bytes win), so a flood of one line still takes two writes per cycle.

    Fences. A fence order (an atomic, a READ, a READ's landed responses) writes nothing:
    it notes how many bursts each port has issued so far and is done at once, so the
    writes behind it are not held up; one right behind a write in its transfer is taken
    in that write's cycle and counts it (a READ's last response and its fence: one cycle). Once
    both ports have had the B responses of those bursts (every write before the atomic
    has landed), ``fence_done`` strobes, one per fence in order: the atomic may read its
    word. (Coarser than the QP: it waits for other QPs' earlier writes too.)

    Parameters
    ----------
    depth : int
        Bursts in flight per port (a power of two); a port is not used while it has
        that many. One 1024-bit beat per cycle per port needs about the B latency.
    fences : int
        Fences waiting for their writes' responses (a power of two).

    Members
    -------
    orders : In(stream.Signature(Pair(RxWriteOrder)))
        The writes in order, one or two per transfer.
    writer : In(AxiWriteSignature(addr_width=64, data_width=1024, id_width=4))
        The payload writer's bursts; ``bready`` is ignored (B is passed on when it comes).
    p0, p1 : Out(AxiWriteSignature(addr_width=64, data_width=1024, id_width=4))
        The ports; AWID 2, 128-byte INCR beats, ``bready`` high.
    fence_done : Out(1)
        The writes before the oldest waiting fence have all landed (one strobe per fence).
    fence_read : Out(1)
        With ``fence_done``: that fence is a READ's (else an atomic's).
    fence_cqe : Out(1)
        With ``fence_done``: that fence is a receive completion's (its CQE may be written).
    fence_local : Out(1)
        With ``fence_done``: that fence is a completing READ's of this NIC's requester.
    """
    def __init__(self, *, depth=8, fences=64):
        for name, v in (("depth", depth), ("fences", fences)):
            if not isinstance(v, int) or v < 2 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 2, not {v!r}")
        self.depth, self.fences = depth, fences
        sig = AxiWriteSignature(addr_width=64, data_width=8 * BEAT, id_width=4)
        super().__init__({
            "orders": In(stream.Signature(Pair(RxWriteOrder))),
            "writer": In(sig),
            "p0": Out(sig), "p1": Out(sig),
            "fence_done": Out(1), "fence_read": Out(1), "fence_local": Out(1), "fence_cqe": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        K = self.depth
        wr, ports, head = self.writer, (self.p0, self.p1), self.orders.p

        ring = [Array(Signal(_Track, name=f"ring{p}_{i}") for i in range(K)) for p in range(2)]
        push_ptr = [Signal(range(K), name=f"push_ptr{p}") for p in range(2)]
        w_ptr = [Signal(range(K), name=f"w_ptr{p}") for p in range(2)]
        b_ptr = [Signal(range(K), name=f"b_ptr{p}") for p in range(2)]
        count = [Signal(range(K + 1), name=f"count{p}") for p in range(2)]      # AW to B
        w_count = [Signal(range(K + 1), name=f"w_count{p}") for p in range(2)]  # AW to last W
        aw_valid = [Signal(name=f"aw_valid{p}") for p in range(2)]
        aw_line = [Signal(64 - LINE_SHIFT, name=f"aw_line{p}") for p in range(2)]
        aw_len = [Signal(8, name=f"aw_len{p}") for p in range(2)]

        live = [[Signal(name=f"live{p}_{i}") for i in range(K)] for p in range(2)]
        for p in range(2):
            for i in range(K):
                m.d.comb += live[p][i].eq((i + K - b_ptr[p])[:len(b_ptr[p])] < count[p])

        def footprint(name, line, nlines_m1, qp):
            f = Signal(_Track, name=name)
            m.d.comb += [f.page.eq(line[PAGE_LINE_BITS:PAGE_LINE_BITS + PAGE_TAG_BITS]), f.qp.eq(qp),
                         f.first.eq(line[:PAGE_LINE_BITS]),
                         f.last.eq(line[:PAGE_LINE_BITS] + nlines_m1[:PAGE_LINE_BITS])]
            return f

        def overlap(a, b):
            # (a write's order with another: the same lines, or the same QP)
            return ((a.page == b.page) & (a.first <= b.last) & (b.first <= a.last)) | (a.qp == b.qp)

        def hits(name, f):
            h = [Signal(name=f"{name}_hits{p}") for p in range(2)]
            for p in range(2):
                m.d.comb += h[p].eq(Cat(*[live[p][i] & overlap(ring[p][i], f) for i in range(K)]).any())
            return h

        room = [Signal(name=f"room{p}") for p in range(2)]
        for p in range(2):
            # registered state only: no port's valid depends on a ready
            m.d.comb += room[p].eq(~aw_valid[p] & (count[p] < K))

        # ---- the first pending write of the head transfer (a) and the one after it (b) ----
        done0 = Signal()             # p[0] of the head transfer has been issued
        burst2 = Signal()            # a payload-writer order's first burst has been issued
        rr = Signal()                # the port a free inline write takes
        a, b = Signal(RxWriteOrder), Signal(RxWriteOrder)
        m.d.comb += [a.eq(Mux(done0, head.p[1], head.p[0])), b.eq(head.p[1])]
        a_there, b_there, b_exists = Signal(), Signal(), Signal()
        # (a write never goes beside a fence; a fence as b goes beside a write a: b_fence)
        m.d.comb += [a_there.eq(self.orders.valid), b_exists.eq(self.orders.valid & ~done0 & head.second),
                     b_there.eq(b_exists & ~a.fence & ~b.fence)]

        def burst(name, o):
            # the burst an order issues: its own line, or the payload writer's AW
            line, length = Signal(64 - LINE_SHIFT, name=f"{name}_line"), Signal(8, name=f"{name}_len")
            m.d.comb += [line.eq(Mux(o.inline, o.line, wr.awaddr[LINE_SHIFT:])),
                         length.eq(Mux(o.inline, 0, wr.awlen))]
            return line, length, footprint(f"{name}_f", line, length, o.qp)

        a_line, a_len, a_f = burst("a", a)
        b_line, b_len, b_f = burst("b", b)
        a_hit, b_hit = hits("a", a_f), hits("b", b_f)

        can = [Signal(name=f"a_can{p}") for p in range(2)]
        m.d.comb += [
            can[0].eq(room[0] & ~a_hit[1] & (a.inline | wr.awvalid) & ~a.fence),
            can[1].eq(room[1] & ~a_hit[0] & a.inline),
        ]
        # fences: each port's count of bursts issued (pushed) and answered (B)
        issued = [Signal(16, name=f"issued{p}") for p in range(2)]
        answered = [Signal(16, name=f"answered{p}") for p in range(2)]
        m.submodules.fence_q = fence_q = SyncFIFOBuffered(width=35, depth=self.fences)
        fence_take = Signal()
        m.d.comb += fence_take.eq(a_there & a.fence & fence_q.w_rdy)
        landed = Signal()
        m.d.comb += landed.eq(fence_q.r_rdy & ~(answered[0] - fence_q.r_data[:16])[15]
                              & ~(answered[1] - fence_q.r_data[16:32])[15])
        m.d.comb += [fence_q.r_en.eq(landed), self.fence_done.eq(landed), self.fence_read.eq(fence_q.r_data[32]),
                     self.fence_local.eq(fence_q.r_data[33]), self.fence_cqe.eq(fence_q.r_data[34])]
        a_issue, a_port, a_done = Signal(), Signal(), Signal()
        m.d.comb += [
            a_issue.eq((a_there & (can[0] | can[1])) | fence_take),
            a_port.eq(Mux(can[0] & can[1], rr, can[1])),
            a_done.eq(a_issue & (a.inline | (a.bursts != 2) | burst2)),
        ]
        # b: after a is done, on the other port (not overlapping a), or merged into a's beat
        other = Signal()
        m.d.comb += other.eq(~a_port)
        b_hit_a, b_hit_other = Signal(), Signal()
        m.d.comb += [b_hit_a.eq(Mux(a_port, b_hit[1], b_hit[0])), b_hit_other.eq(Mux(a_port, b_hit[0], b_hit[1]))]
        merge, b_sep, b_issue = Signal(), Signal(), Signal()
        m.d.comb += [
            merge.eq(a.inline & b.inline & (a.line == b.line) & ~b_hit_other),
            b_sep.eq(~overlap(a_f, b_f) & ~b_hit_a & Mux(other, room[1], room[0])
                     & (b.inline | (~other & a.inline & wr.awvalid))),
            b_issue.eq(a_done & b_there & (merge | b_sep)),
        ]
        m.d.comb += wr.awready.eq((a_issue & ~a.inline & ~a.fence) | (b_issue & ~merge & ~b.inline))

        b_half = Signal()            # b is a payload-writer order of two bursts: the first went
        m.d.comb += b_half.eq(b_issue & ~merge & ~b.inline & (b.bursts == 2))
        # a fence right behind a write is taken in the write's cycle (a READ's last response
        # and its completion fence: one cycle, not two); it counts the write's push
        b_fence = Signal()
        m.d.comb += b_fence.eq(a_done & ~a.fence & b_exists & b.fence & fence_q.w_rdy)
        push_a = [Signal(name=f"push_a{p}") for p in range(2)]
        m.d.comb += [push_a[p].eq(a_issue & ~a.fence & (a_port == p)) for p in range(2)]
        m.d.comb += [
            fence_q.w_en.eq(fence_take | b_fence),
            fence_q.w_data.eq(Mux(b_fence, Cat((issued[0] + push_a[0])[:16], (issued[1] + push_a[1])[:16], b.fence_read,
                                               b.fence_local, b.fence_cqe),
                                  Cat(issued[0], issued[1], a.fence_read, a.fence_local, a.fence_cqe))),
        ]
        finish = Signal()
        m.d.comb += [finish.eq(a_done & (~b_exists | (b_issue & ~b_half) | b_fence)), self.orders.ready.eq(finish)]
        with m.If(finish):
            m.d.sync += done0.eq(0)
        with m.Elif(a_done):
            m.d.sync += done0.eq(1)
        with m.If(a_done):
            m.d.sync += burst2.eq(b_half)
        with m.Elif(a_issue):
            m.d.sync += burst2.eq(1)
        with m.If(b_issue & ~merge):
            m.d.sync += rr.eq(a_port)
        with m.Elif(a_issue & a.inline):
            m.d.sync += rr.eq(other)

        def sub(o):
            s = Signal(_Sub)
            m.d.comb += [s.lane.eq(o.lane), s.length.eq(o.length), s.data.eq(o.data)]
            return s

        a_t, b_t = Signal(_Track), Signal(_Track)
        m.d.comb += [
            a_t.eq(a_f), a_t.seg.eq(~a.inline), a_t.two.eq(b_issue & merge),
            a_t.w[0].eq(sub(a)), a_t.w[1].eq(sub(b)),
            b_t.eq(b_f), b_t.seg.eq(~b.inline), b_t.w[0].eq(sub(b)),
        ]

        # ---- per port: AW register, ring, W, B -------------------------------------------
        for p, port in enumerate(ports):
            push_b = Signal(name=f"push_b{p}")
            m.d.comb += push_b.eq(b_issue & ~merge & (other == p))
            push = push_a[p] | push_b
            m.d.sync += [issued[p].eq(issued[p] + push), answered[p].eq(answered[p] + port.bvalid)]
            new_t = Signal(_Track, name=f"new{p}")
            new_line = Signal(64 - LINE_SHIFT, name=f"new_line{p}")
            new_len = Signal(8, name=f"new_len{p}")
            m.d.comb += [
                new_t.eq(Mux(push_a[p], a_t, b_t)),
                new_line.eq(Mux(push_a[p], a_line, b_line)),
                new_len.eq(Mux(push_a[p], a_len, b_len)),
            ]
            # A burst goes out in the cycle it is issued; the register holds it while the
            # port does not take it (a port with room has an empty register).
            with m.If(push):
                m.d.sync += [ring[p][push_ptr[p]].eq(new_t), push_ptr[p].eq(push_ptr[p] + 1)]
            with m.If(push & ~port.awready):
                m.d.sync += [aw_valid[p].eq(1), aw_line[p].eq(new_line), aw_len[p].eq(new_len)]
            with m.Elif(port.awready):
                m.d.sync += aw_valid[p].eq(0)
            m.d.comb += [
                port.awvalid.eq(aw_valid[p] | push), port.awid.eq(AWID),
                port.awaddr.eq(Cat(C(0, LINE_SHIFT), Mux(aw_valid[p], aw_line[p], new_line))),
                port.awlen.eq(Mux(aw_valid[p], aw_len[p], new_len)),
                port.awsize.eq(LINE_SHIFT), port.awburst.eq(Burst.INCR),
                port.awcache.eq(Cache.NORMAL_NON_CACHEABLE_BUFFERABLE),
                port.bready.eq(1),
            ]

            # W: the oldest burst whose W beats have not all gone (the one issued now when
            # there is none, so a beat goes with its AW)
            w_head = Signal(_Track, name=f"w_head{p}")
            m.d.comb += w_head.eq(Mux(w_count[p] != 0, ring[p][w_ptr[p]], new_t))
            beat_data, beat_strb = Signal(8 * BEAT, name=f"inline_data{p}"), Signal(BEAT, name=f"inline_strb{p}")
            strb = []
            for k in range(2):
                s = w_head.w[k]
                st = Signal(BEAT, name=f"strb{p}_{k}")
                ones = Signal(INLINE_MAX, name=f"ones{p}_{k}")     # length 1..4 -> 0b1..0b1111
                m.d.comb += [ones.eq(Array(C((1 << min(n, INLINE_MAX)) - 1, INLINE_MAX) for n in range(8))[s.length]),
                             st.eq(ones << s.lane)]
                strb.append(st)
            strb1 = Signal(BEAT, name=f"strb1_{p}")
            m.d.comb += strb1.eq(Mux(w_head.two, strb[1], 0))
            d0 = Signal(8 * BEAT, name=f"d0_{p}")
            d1 = Signal(8 * BEAT, name=f"d1_{p}")
            m.d.comb += [d0.eq(w_head.w[0].data << (w_head.w[0].lane * 8)),
                         d1.eq(w_head.w[1].data << (w_head.w[1].lane * 8))]
            m.d.comb += [
                beat_strb.eq(strb[0] | strb1),
                beat_data.eq(Cat(*[Mux(strb1[j], d1.word_select(j, 8), d0.word_select(j, 8))
                                   for j in range(BEAT)])),
            ]
            has_w = Signal(name=f"has_w{p}")
            m.d.comb += has_w.eq((w_count[p] != 0) | push)
            if p == 0:
                from_writer = Signal()
                m.d.comb += from_writer.eq(has_w & w_head.seg)
                with m.If(from_writer):
                    m.d.comb += [port.wvalid.eq(wr.wvalid), port.wdata.eq(wr.wdata),
                                 port.wstrb.eq(wr.wstrb), port.wlast.eq(wr.wlast)]
                with m.Else():
                    m.d.comb += [port.wvalid.eq(has_w), port.wdata.eq(beat_data),
                                 port.wstrb.eq(beat_strb), port.wlast.eq(1)]
                m.d.comb += wr.wready.eq(from_writer & port.wready)
            else:
                m.d.comb += [port.wvalid.eq(has_w), port.wdata.eq(beat_data),
                             port.wstrb.eq(beat_strb), port.wlast.eq(1)]
            w_end = Signal(name=f"w_end{p}")
            m.d.comb += w_end.eq(port.wvalid & port.wready & port.wlast)
            with m.If(w_end):
                m.d.sync += w_ptr[p].eq(w_ptr[p] + 1)
            m.d.sync += w_count[p].eq(w_count[p] + push - w_end)

            # B: in AW order on a port (one AWID); the oldest burst in flight is done
            with m.If(port.bvalid):
                m.d.sync += b_ptr[p].eq(b_ptr[p] + 1)
            m.d.sync += count[p].eq(count[p] + push - port.bvalid)
            if p == 0:
                m.d.comb += [wr.bvalid.eq(port.bvalid & ring[0][b_ptr[0]].seg),
                             wr.bid.eq(port.bid), wr.bresp.eq(port.bresp)]
        return m
