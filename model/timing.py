"""Cycle model of the transmit engine for isolated WQEs.

Predicts, for a WQE that meets an idle engine, the cycle of its first beat on the
MAC port and of its CQE write, counted from the doorbell's W handshake. The
model is a transaction model, not a copy of the RTL: fixed pipeline latencies
(each stated below with the blocks it crosses) plus the three things that make
the timing depend on the data:

- GPU-memory reads: each read returns ``dma_latency`` cycles after its request,
  one 128-byte beat per cycle, in request order;
- the payload buffer: a burst (at most 32 beats, never across 4 KiB) is requested
  only when the buffer has room for all of it, so beats beyond the buffer wait
  for the builder to drain earlier ones;
- the builder packs one chunk per cycle (a chunk ends at a raw-beat or packet
  boundary), appends 4 ICRC bytes, and the 400G wire rule of docs/interfaces.md
  paces the first beat of every frame.

Tolerance: zero cycles for every event it predicts; the regression holds the
RTL to exact equality.
"""
from dataclasses import dataclass

from spec import formats as F
from spec import params as P
from model.frames import split_message

BEAT = P.DATA_BYTES


@dataclass(frozen=True)
class Latencies:
    """Fixed latencies of the pipeline, in cycles."""
    # doorbell decoder -> doorbell FIFO -> QP table (RMW) -> active-QP FIFO -> QP table
    # (schedule) -> job FIFO -> WQE fetch issues the first WQEBB read
    db_to_wqe_read: int = 9
    # WQEBB buffer (two-stage FIFO) -> parser hands the message on as its last WQEBB
    # arrives -> payload fetch issues its first read
    wqe_to_payload_read: int = 3
    # WQEBB buffer -> parser -> message (and inline beat) -> FIFOs -> builder packs its first chunk
    wqe_to_builder: int = 5
    # payload buffer (two-stage FIFO) -> builder packs the chunk
    payload_to_chunk: int = 2
    # a WQE of n > 1 WQEBBs: n - 1 more WQEBBs to gather (added to the two above)
    # packed beat -> ICRC stage register -> MAC handshake
    chunk_to_tx: int = 1
    # last beat's handshake -> completion FIFO -> CQ context read -> CQE write handshake
    tx_to_cqe: int = 3


def _bursts(addr, length, max_burst=P.PAYLOAD_MAX_BURST_BEATS):
    """Payload read bursts (beats each) covering [addr, addr + length), as the fetch cuts them."""
    if length == 0:
        return []
    beat = addr & ~(BEAT - 1)
    left = ((addr + length - 1) // BEAT) - (addr // BEAT) + 1
    out = []
    while left:
        to_4k = (4096 - (beat & 0xFFF)) // BEAT
        n = min(left, max_burst, to_4k)
        out.append(n)
        beat += n * BEAT
        left -= n
    return out


def _chunks(offset, length, mtu):
    """(raw beat index, bytes, ends packet) of each chunk the builder packs, per packet."""
    packets = []
    pos = offset
    beat = 0
    for _, _, plen in split_message(length, mtu):
        chunks = []
        left = plen
        if left == 0:
            chunks.append((None, 0, True))
        while left:
            n = min(BEAT - pos, left)
            left -= n
            chunks.append((beat, n, left == 0))
            pos += n
            if pos == BEAT:
                pos, beat = 0, beat + 1
        packets.append(chunks)
    return packets


class _Wire:
    def __init__(self):
        self.end = 0                     # wire time (bytes) when the last frame ends

    def first_beat(self, cycle, frame_len):
        """Cycle the MAC takes a frame's first beat offered from ``cycle`` on."""
        per = int(P.WIRE_BYTES_PER_CYCLE)
        c = max(cycle, -(-self.end // per) - 1)
        self.end = max(per * c, self.end) + P.wire_bytes(frame_len)
        return c


def isolated_write(posted, qp, *, dma_latency, payload_buffer=P.PAYLOAD_BUFFER_BEATS, lat=Latencies()):
    """Predicted ``db_to_first_beat`` and ``db_to_cqe`` cycles of an RDMA WRITE on an idle engine.

    Parameters
    ----------
    posted : a posted WQE record (``nwqebbs``, ``inline`` (true for an inline segment), ``local_addr``, ``length``).
    qp : its QP (``mtu`` in bytes).
    dma_latency : GPU-memory read latency in cycles.
    payload_buffer : payload buffer depth in beats (the engine's build parameter).
    """
    gather = posted.nwqebbs - 1
    wqe_data = lat.db_to_wqe_read + dma_latency             # first WQEBB back
    length = posted.length
    inline = bool(posted.inline)
    offset = 36 if inline else posted.local_addr % BEAT
    at_builder = wqe_data + lat.wqe_to_builder + gather       # the message can be packed
    if inline:
        source = _InlineBeats(at_builder)
    else:
        source = _PayloadBeats(_bursts(posted.local_addr, length), wqe_data + lat.wqe_to_payload_read + gather,
                               dma_latency, payload_buffer, lat.payload_to_chunk)

    builder = _Builder(at_builder - 1, lat)
    builder.message(offset, length, qp.mtu, source)
    return {"db_to_first_beat": builder.frames[0][0], "db_to_cqe": builder.tx_prev + lat.tx_to_cqe}


class _Builder:
    """The packet builder, ICRC stage and MAC port: chunks, beats and the wire, cycle by cycle.

    ``t`` is the cycle of the builder's last action; ``frames`` collects
    ``(first_beat_cycle, last_beat_cycle, wire_start_bytes, length)``.
    """
    def __init__(self, t, lat):
        self.t, self.lat = t, lat
        self.tx_prev = -1             # handshake cycle of the previous beat (frees the ICRC register)
        self.wire = _Wire()
        self.frames = []

    def message(self, offset, length, mtu, source, *, first_message=True):
        if not first_message:
            self.t += 1               # MESSAGE state: the builder takes the next descriptor
        beats = first_beat = None
        for step in plan_message(offset, length, mtu):
            if step["kind"] == "chunk":
                beat = step["beat"]
                cycle = self.t + 1 if beat is None else max(self.t + 1, source.ready(beat))
            else:
                cycle = self.t + 1
            if step["emit"]:
                cycle = max(cycle, self.tx_prev)
                tx = cycle + self.lat.chunk_to_tx
                if step["first_beat"]:
                    tx = first_beat = self.wire.first_beat(tx, step["flen"])
                self.tx_prev = tx
            self.t = cycle
            if step["pop"]:
                source.pop(step["beat"], cycle)
            if step["last_beat"]:
                flen = step["flen"]
                self.frames.append((first_beat, self.tx_prev, self.wire.end - P.wire_bytes(flen), flen))


def plan_message(offset, length, mtu):
    """The builder's steps for one message, in order: one per cycle it works.

    A ``chunk`` step packs ``beat`` (raw payload beat index, or None for an empty
    packet); a ``flush`` step sends what is left of a packet after its last chunk.
    Each step says whether it hands a beat to the ICRC stage (``emit``), whether that
    beat is its frame's first or last (``first_beat``, ``last_beat``), the frame's
    length ``flen``, whether the raw beat leaves the buffer (``pop``: with the chunk
    that reaches its end or ends the message) and whether the packet is the message's
    last (``last_packet``).
    """
    steps = []
    packets = _chunks(offset, length, mtu)
    msg_left = length
    for p, chunks in enumerate(packets):
        hlen = F.HDR_LEN_RETH if p == 0 else F.HDR_LEN_NO_RETH
        flen = hlen + sum(n for _, n, _ in chunks) + F.ICRC_LEN
        last_packet = p == len(packets) - 1
        base, beats = hlen, 0
        for beat, n, last in chunks:
            total = base + n + (F.ICRC_LEN if last else 0)
            emit = total >= BEAT or last
            msg_left -= n
            after = (offset + length - msg_left) % BEAT          # read position after this chunk
            steps.append({"kind": "chunk", "beat": beat, "emit": emit, "first_beat": emit and beats == 0,
                          "last_beat": last and total <= BEAT, "flen": flen, "last_packet": last_packet,
                          "pop": beat is not None and (after == 0 or msg_left == 0)})
            beats += emit
            base = total - BEAT if total >= BEAT else total
        flush = total - BEAT if total > BEAT else 0
        while flush > 0:
            steps.append({"kind": "flush", "beat": None, "emit": True, "first_beat": False,
                          "last_beat": flush <= BEAT, "flen": flen, "last_packet": last_packet, "pop": False})
            flush -= BEAT
    return steps


class _InlineBeats:
    """The WQE's own beats: the parser hands them over one per cycle."""
    def __init__(self, first):
        self.first = first

    def ready(self, j):
        return self.first + j

    def pop(self, j, cycle):
        pass


class _PayloadBeats:
    """Payload beats from GPU memory, with the buffer-credit rule of the payload fetch."""
    def __init__(self, bursts, first_issue, dma_latency, buffer, to_chunk):
        self.bursts, self.first_issue = bursts, first_issue
        self.latency, self.buffer, self.to_chunk = dma_latency, buffer, to_chunk
        self.where = [(k, i) for k, n in enumerate(bursts) for i in range(n)]
        self.issue, self.arrival, self.pops = [], [], {}

    def _issue(self, k):
        while len(self.issue) <= k:
            kk = len(self.issue)
            t = self.first_issue if kk == 0 else self.issue[-1] + 1
            # the burst needs room for all its beats: beats that must have left first
            need = sum(self.bursts[:kk + 1]) - self.buffer
            if need > 0:
                t = max(t, self.pops[need - 1] + 1)
            self.issue.append(t)
        return self.issue[k]

    def ready(self, j):
        while len(self.arrival) <= j:
            k, i = self.where[len(self.arrival)]
            t = self._issue(k) + self.latency + i
            if self.arrival:
                t = max(t, self.arrival[-1] + 1)
            self.arrival.append(t)
        return self.arrival[j] + self.to_chunk

    def pop(self, j, cycle):
        self.pops[j] = cycle
