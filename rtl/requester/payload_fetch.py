"""Payload fetch: AXI4 burst reads of the data-pointer payloads, ahead of the builder."""
from amaranth.hdl import *
from amaranth.lib import data, wiring, stream, fifo
from amaranth.lib.wiring import In, Out

from spec.params import AXI_PAGE
from spec.params import AXI_ID_PAYLOAD_FETCH
from rtl.common.axi import AxiReadSignature, Burst, Cache, beats_to_page_end
from rtl.requester.message import GATHER_MORE, GatherSegment, Message, MessageKind, first_segment_length

__all__ = ["PayloadFetch"]


class PayloadFetch(wiring.Component):
    """Issues the reads of each message's payload and passes the message on.

    A message is passed to the builder when taken, then its payload is read as
    128-byte-aligned beats covering ``[addr, addr + length)``, in INCR bursts of
    at most ``max_burst_beats`` that never cross a 4 KiB boundary (AXI rule). A
    burst is issued only when the payload buffer has room for all its beats, so
    the read data channel never stalls; the buffer depth is the most data in flight.

    A gather list (``nseg`` segments after the first) is read segment after segment,
    each as above from its own address (its first beat holds its data from ``addr %
    128``): the first segment's last burst and the next's first go in consecutive
    cycles, so its bursts are those of the segments one after the other.

    Parameters
    ----------
    num_qps, num_cqs : int
    buffer_beats : int
        Payload buffer depth in data beats.
    max_burst_beats : int
        Longest AXI burst (power of two, at most 4096 / beat bytes).
    arid : int
        The ARID of its reads (the responder's READ responses use their own).

    Members
    -------
    messages_in : In(stream.Signature(Message))
    messages_out : Out(stream.Signature(Message))
    payload : Out(stream.Signature(1024))
        Raw aligned beats, in message order.
    level : Out(range(buffer_beats + 1))
        Beats in the payload buffer (the head one on ``payload`` included): a builder that
        starts a frame only with all its beats at hand reads it (``PacketBuilder(back_to_back=True)``).
    dma : Out(AxiReadSignature)    ARID ``arid`` (1, the requester's payload fetch).
    """
    def __init__(self, *, num_qps, num_cqs, buffer_beats=64, max_burst_beats=32,
                 data_width=1024, id_width=4, arid=AXI_ID_PAYLOAD_FETCH):
        if not isinstance(arid, int) or not 0 <= arid < 1 << id_width:
            raise ValueError(f"arid must be an ARID of {id_width} bits, not {arid!r}")
        self.arid = arid
        beat = data_width // 8
        if max_burst_beats < 1 or max_burst_beats & (max_burst_beats - 1) or max_burst_beats * beat > AXI_PAGE:
            raise ValueError(f"max_burst_beats must be a power of two with bursts <= 4 KiB, "
                             f"not {max_burst_beats}")
        if buffer_beats < max_burst_beats:
            raise ValueError(f"buffer_beats ({buffer_beats}) must hold one burst ({max_burst_beats})")
        self.buffer_beats, self.max_burst_beats, self.data_width = buffer_beats, max_burst_beats, data_width
        msg = Message(num_qps, num_cqs)
        super().__init__({
            "messages_in": In(stream.Signature(msg)),
            "messages_out": Out(stream.Signature(msg)),
            "payload": Out(stream.Signature(data_width)),
            "level": Out(range(buffer_beats + 1)),
            "dma": Out(AxiReadSignature(addr_width=64, data_width=data_width, id_width=id_width)),
        })

    def elaborate(self, platform):
        m = Module()
        dma = self.dma
        beat_shift = (self.data_width // 8 - 1).bit_length()          # 7
        m.submodules.buf = buf = fifo.SyncFIFOBuffered(width=self.data_width, depth=self.buffer_beats)

        credits = Signal(range(self.buffer_beats + 1))    # beats reserved in the buffer
        issued = Signal(range(self.max_burst_beats + 1))
        m.d.sync += credits.eq(credits + issued - (buf.r_rdy & buf.r_en))

        addr = Signal(64)            # next beat address (aligned)
        beats = Signal(32)           # beats still to request
        to_4k = Signal(range(AXI_PAGE // (1 << beat_shift) + 1))
        m.d.comb += to_4k.eq(beats_to_page_end(addr, beat_shift))
        by_len = Signal(range(self.max_burst_beats + 1))
        m.d.comb += by_len.eq(Mux(beats < self.max_burst_beats, beats, self.max_burst_beats))
        burst = Signal(range(self.max_burst_beats + 1))
        m.d.comb += burst.eq(Mux(to_4k < by_len, to_4k, by_len))

        msg = self.messages_in.p
        # a gather list's further segments, in order, and their count (shifted on as each
        # segment's last burst goes)
        queue = Signal(data.ArrayLayout(GatherSegment, GATHER_MORE))
        queued = Signal(2)
        needs_dma = (((msg.kind == MessageKind.WRITE) | (msg.kind == MessageKind.DUMP) | (msg.kind == MessageKind.READ_RESPONSE))
                     & ~msg.inline & (msg.length != 0))

        def span(start, length):
            # the aligned first beat and the beats of ``length`` (> 0) bytes from ``start``
            last_byte = start + length - 1
            return start & ~((1 << beat_shift) - 1), ((last_byte >> beat_shift) - (start >> beat_shift) + 1)[:32]

        first_beat, nbeats = span(msg.addr, first_segment_length(msg))
        next_beat, next_beats = span(queue[0].addr, queue[0].len)

        m.d.comb += [
            dma.arid.eq(self.arid), dma.araddr.eq(addr), dma.arlen.eq(burst - 1), dma.arsize.eq(beat_shift),
            dma.arburst.eq(Burst.INCR), dma.arcache.eq(Cache.NORMAL_NON_CACHEABLE_BUFFERABLE),
            self.messages_out.p.eq(msg),
        ]
        # One burst per cycle; the next message is taken in the cycle of the last burst.
        busy = Signal()
        fire = Signal()
        m.d.comb += [dma.arvalid.eq(busy & (credits + burst <= self.buffer_beats)),
                     fire.eq(dma.arvalid & dma.arready)]
        free = Signal()
        m.d.comb += [
            free.eq(~busy | (fire & (beats == burst) & (queued == 0))),
            self.messages_out.valid.eq(self.messages_in.valid & free),
            self.messages_in.ready.eq(self.messages_out.ready & free),
        ]
        with m.If(fire):
            m.d.comb += issued.eq(burst)
            m.d.sync += [addr.eq(addr + (burst << beat_shift)), beats.eq(beats - burst)]
            with m.If((beats == burst) & (queued != 0)):
                # the segment's last burst: the next segment's first goes in the next cycle
                m.d.sync += [addr.eq(next_beat), beats.eq(next_beats), queued.eq(queued - 1),
                             *[queue[i].eq(queue[i + 1]) for i in range(GATHER_MORE - 1)]]
            with m.Elif(beats == burst):
                m.d.sync += busy.eq(0)
        with m.If(self.messages_in.valid & self.messages_in.ready & needs_dma):
            m.d.sync += [addr.eq(first_beat), beats.eq(nbeats), busy.eq(1), queue.eq(msg.segs), queued.eq(msg.nseg)]

        m.d.comb += [
            dma.rready.eq(1), buf.w_en.eq(dma.rvalid), buf.w_data.eq(dma.rdata),
            self.payload.valid.eq(buf.r_rdy), self.payload.p.eq(buf.r_data), buf.r_en.eq(self.payload.ready),
            self.level.eq(buf.level),
        ]
        return m
