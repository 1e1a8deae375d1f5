"""Latency of isolated WQEs: the pipeline's fixed latencies.

``Latencies`` states, block by block, the cycles a WQE spends in the pipeline when
nothing else is in the way; ``single_beat_latency`` adds them up with the GPU-memory
round trips for a one-beat frame (tests/model/test_golden_model.py holds it to the cycle
model's ``isolated_write``, model/cycle_model.py, which runs the cycle model on one WQE).
Tolerance: zero cycles; the regression holds the RTL to exact equality.
"""
from dataclasses import dataclass


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
