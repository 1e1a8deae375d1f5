"""Latency of isolated WQEs: the pipeline's fixed latencies.

``Latencies`` states, block by block, the cycles a WQE spends in the pipeline when
nothing else is in the way; ``single_beat_latency`` adds them up with the GPU-memory
round trips for a one-beat frame (tests/model/test_golden_model.py holds it to the cycle
model's ``isolated_write``, model/cycle_model.py, which runs the cycle model on one WQE).
Tolerance: zero cycles; the regression holds the RTL to exact equality.
"""
from dataclasses import dataclass

from spec import params as P
from spec.formats import AETH_LEN, ETH_MIN_FRAME, HDR_LEN_NO_RETH, HDR_LEN_RETH, ICRC_LEN


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


def single_beat_latency(*, inline, dma_latency, nwqebbs=1, lat=Latencies()):
    """Closed form of ``db_to_first_beat`` for a WRITE whose frame fits one beat, on an idle
    engine: the fixed latencies above plus one GPU-memory round trip per read."""
    gather = nwqebbs - 1
    wqe_back = lat.db_to_wqe_read + dma_latency
    if inline:
        return wqe_back + lat.wqe_to_builder + gather + lat.chunk_to_tx
    return (wqe_back + lat.wqe_to_payload_read + gather + dma_latency + lat.payload_to_chunk
            + lat.chunk_to_tx)


# An atomic unit entry is busy for a GPU-memory read round trip plus about this many
# cycles (the AR register, the fill, the free entry chosen a cycle ahead): an estimate,
# not a cycle model (`make bench` prints it beside the measured rate).
ATOMIC_ENTRY_OVERHEAD = 3


def atomic_rate_estimate(*, words, entries, dma_latency, wire_limit_per_cycle):
    """Atomics per cycle the responder's atomic unit sustains: one a cycle to one word
    (it stays cached: no GPU-memory round trip between them); to distinct words, the
    cache's ``entries`` misses in flight over an entry's busy time; never more than the
    requests arrive (``wire_limit_per_cycle``)."""
    per_cycle = 1.0 if words == 1 else entries / (dma_latency + ATOMIC_ENTRY_OVERHEAD)
    return min(per_cycle, wire_limit_per_cycle)


def read_frame_lengths(size, mtu):
    """Captured lengths (no FCS) of one RDMA READ's request and of its responses (IBTA
    9.4.6: AETH on FIRST, LAST and ONLY; payload padded to 4 bytes; ICRC last)."""
    request = HDR_LEN_RETH + ICRC_LEN
    npk = max(1, -(-size // mtu))
    out = []
    for k in range(npk):
        n = min(mtu, size - k * mtu) if size else 0
        aeth = AETH_LEN if k in (0, npk - 1) else 0
        out.append(max(ETH_MIN_FRAME, HDR_LEN_NO_RETH + aeth + -(-n // 4) * 4 + ICRC_LEN))
    return request, out


def read_rate_estimate(*, size, qps, outstanding, mtu, round_trip_cycles):
    """READs per second two engines sustain: the least of the request direction's wire
    limit, the response direction's, and ``qps`` x ``outstanding`` READs per round trip
    (a QP holds at most ``outstanding`` READs unanswered; ``round_trip_cycles``: the
    cable both ways and the responder's GPU-memory read; a READ longer than one beat
    adds its transfer time). Returns ``{"reads_per_s", "bound"}``, the bound naming the
    limit that decides."""
    request, responses = read_frame_lengths(size, mtu)
    per_s = P.WIRE_GBPS * 1e9 / 8
    limits = {"request wire": per_s / P.wire_bytes(request),
              "response wire": per_s / sum(P.wire_bytes(n) for n in responses),
              "outstanding": qps * outstanding / (round_trip_cycles * P.CLOCK_PERIOD_NS * 1e-9
                                                  + sum(P.wire_bytes(n) for n in responses) / per_s)}
    bound = min(limits, key=limits.get)
    return {"reads_per_s": limits[bound], "bound": bound}
