"""Latency of isolated WQEs: the pipeline's fixed latencies and the isolated-WQE view.

``Latencies`` states, block by block, the cycles a WQE spends in the pipeline when
nothing else is in the way; ``single_beat_latency`` adds them up with the GPU-memory
round trips for a one-beat frame (tests/model/test_golden_model.py holds it to the cycle
model). ``isolated_write`` runs the cycle model (model/cycle_model.py) on one WQE.
Tolerance: zero cycles; the regression holds the RTL to exact equality.
"""
from dataclasses import dataclass

from spec import params as P

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


def isolated_write(posted, qp, *, dma_latency, blueflame=False):
    """Predicted ``db_to_first_beat`` and ``db_to_cqe`` cycles of a WRITE that meets an idle engine.

    The engine's cycle model run on this WQE alone, its doorbell at cycle 0.

    Parameters
    ----------
    posted : a posted WQE record (``nwqebbs``, ``inline``, ``local_addr``, ``length``, ...).
    qp : its QP (``mtu`` in bytes).
    dma_latency : GPU-memory read latency in cycles.
    blueflame : the WQE comes in a BlueFlame store (cycle 0 = its last beat), not by a read.
    """
    import copy
    from model.cycle_model import EngineCycleModel
    w = copy.copy(posted)
    w.index, w.signaled = 0, True
    pred = EngineCycleModel({posted.qpn: (qp.mtu, 1 << 15, [w])}, [(0, posted.qpn, w.nwqebbs, blueflame)],
                            dma_latency=dma_latency).run()
    return {"db_to_first_beat": pred.first_beat[(posted.qpn, 0)], "db_to_cqe": pred.cqes[(posted.qpn, 0)]}


def single_beat_latency(*, inline, dma_latency, nwqebbs=1, lat=Latencies()):
    """Closed form of ``db_to_first_beat`` for a WRITE whose frame fits one beat, on an idle
    engine: the fixed latencies above plus one GPU-memory round trip per read."""
    gather = nwqebbs - 1
    wqe_back = lat.db_to_wqe_read + dma_latency
    if inline:
        return wqe_back + lat.wqe_to_builder + gather + lat.chunk_to_tx
    return (wqe_back + lat.wqe_to_payload_read + gather + dma_latency + lat.payload_to_chunk
            + lat.chunk_to_tx)
