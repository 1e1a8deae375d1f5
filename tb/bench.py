"""Benchmark points (``make bench``): back-to-back RDMA WRITEs over several QPs, measured on the wire.

Each point (``BENCH_POINTS``, a JSON list of ``{"size", "qps", "batch", "latency_ns",
"msgs"}``) posts ``msgs`` WRITEs per QP (inline up to 28 bytes: one WQEBB; pointer above), one
doorbell per ``batch`` WQEs with CQ_UPDATE on the batch's last (NVSHMEM's moderation).
Goodput and message rate come from the wire times of the first and last frame; the
wire limit is the SPEC arithmetic for the same frames; the golden cycle model predicts
every frame's wire time, and its figures are reported beside the measured ones (the
run fails if any frame differs). Each point writes <point>.json and <point>.pcap.
"""
import json
import os
from pathlib import Path

import cocotb

from spec import params as P
from tb.env import NicEnv

INLINE_MAX = 28        # what fits one WQEBB (ctrl 16 + raddr 16 + 4 + 28 = 64 B); NVSHMEM inlines only tiny puts
OUT = Path(os.environ.get("IBGDA_BENCH_OUT", "build/bench"))
POINTS = json.loads(os.environ.get("BENCH_POINTS", '[{"size": 4096, "qps": 8, "batch": 32, '
                                                   '"latency_ns": 1000, "msgs": 32}]'))


def point_name(p):
    return f"write_{p['size']}B_{p['qps']}qp_b{p['batch']}_{p['latency_ns']}ns"


async def _point(dut, p):
    latency = int(p["latency_ns"] / P.CLOCK_PERIOD_NS)
    env = await NicEnv(dut, dma_latency=latency).start()
    size, batch, nmsgs = p["size"], p["batch"], p["msgs"]
    qps = []
    for q in range(p["qps"]):
        cqn = q % P.NUM_CQS                   # more QPs than CQs: QPs share collapsed CQs
        cq = env.cqs.get(cqn) or await env.cq(cqn, 0, collapsed=True)
        qps.append(await env.qp(q, cq, log_depth=max(8, (nmsgs * 4).bit_length())))

    async def post(qp):
        for b in range(0, nmsgs, batch):
            n = min(batch, nmsgs - b)
            for i in range(n):
                if size <= INLINE_MAX:
                    qp.post_write(0x1000 * (b + i), 1, inline=bytes(size), signaled=(i == n - 1))
                else:
                    addr, _ = env.payload(size, seed=b + i)
                    qp.post_write(0x100000 * (b + i), 1, local_addr=addr, length=size, signaled=(i == n - 1))
            await qp.ring_nvshmem()
    tasks = [cocotb.start_soon(post(qp)) for qp in qps]
    for t in tasks:
        await t
    pred = env.check(await env.drain(5_000_000))
    cyc = env.check_cycles()                   # every frame where the cycle model puts it
    m_first, m_last = cyc.frames[0], cyc.frames[-1]
    m_span_ns = (m_last[4] + P.wire_bytes(m_last[5]) - m_first[4]) * 8 / P.WIRE_GBPS
    frames = env.wire.frames
    span_ns = (frames[-1].end_bytes - frames[0].start_bytes) * 8 / P.WIRE_GBPS
    t = pred.totals
    limit_gbps = t.payload_bytes * 8 / (t.wire_bytes * 8 / P.WIRE_GBPS)
    OUT.mkdir(parents=True, exist_ok=True)
    env.wire.write_pcap(OUT / f"{point_name(p)}.pcap")
    return {
        "point": point_name(p), "payload_bytes": size, "qps": p["qps"], "messages": t.messages,
        "doorbell_batch": batch, "dma_latency_ns": p["latency_ns"],
        "messages_per_s": t.messages / span_ns * 1e9, "goodput_gbps": t.payload_bytes * 8 / span_ns,
        "wire_limit_goodput_gbps": limit_gbps,
        "ratio_to_wire_limit": (t.payload_bytes * 8 / span_ns) / limit_gbps,
        "golden_model_goodput_gbps": t.payload_bytes * 8 / m_span_ns,
        "golden_model_messages_per_s": t.messages / m_span_ns * 1e9,
        "simulated_cycles": frames[-1].last_cycle - frames[0].first_cycle,
    }


def _make(k, p):
    async def bench(dut):
        print(f"[bench] point {k + 1}/{len(POINTS)}: {point_name(p)}", flush=True)
        rec = await _point(dut, p)
        (OUT / f"{rec['point']}.json").write_text(json.dumps(rec, indent=2))
    bench.__name__ = bench.__qualname__ = f"bench_{k:03d}"
    return cocotb.test()(bench)


for _k, _p in enumerate(POINTS):
    globals()[f"bench_{_k:03d}"] = _make(_k, _p)
