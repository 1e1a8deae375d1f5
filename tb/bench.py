"""Throughput benchmark (``make bench``): back-to-back RDMA WRITEs over several QPs, measured on the wire.

For each payload size, ``BENCH_QPS`` QPs each post ``BENCH_MSGS`` WRITEs (inline for
<= 64 bytes, pointer otherwise) with one doorbell per batch of 32 and CQ_UPDATE on the
batch's last WQE (NVSHMEM's moderation). Goodput and message rate are taken from the
wire times of the first and last frame; the wire limit is the SPEC arithmetic for the
same frames; the golden model's cycle model predicts every frame's wire time, so its
goodput and message rate are reported beside the measured ones (and must agree).
Results go to build/bench/results.json and <point>.pcap.
"""
import json
import os
from pathlib import Path

import cocotb

from spec import params as P
from tb.env import NicEnv

OUT = Path(os.environ.get("IBGDA_BENCH_OUT", "build/bench"))
SIZES = [int(x) for x in os.environ.get("BENCH_SIZES", "8,64,256,1024,4096,16384").split(",")]
NQPS = int(os.environ.get("BENCH_QPS", "8"))
NMSGS = int(os.environ.get("BENCH_MSGS", "32"))
LATENCY = int(os.environ.get("BENCH_DMA_LATENCY", str(P.DMA_READ_LATENCY_CYCLES)))


async def _point(dut, size):
    env = await NicEnv(dut, dma_latency=LATENCY).start()
    qps = []
    for q in range(NQPS):
        cq = await env.cq(q, 0, collapsed=True)
        qps.append(await env.qp(q, cq, log_depth=8))

    async def post(qp):
        for b in range(0, NMSGS, 32):
            n = min(32, NMSGS - b)
            for i in range(n):
                if size <= 64:
                    qp.post_write(0x1000 * (b + i), 1, inline=bytes(size), signaled=(i == n - 1))
                else:
                    addr, _ = env.payload(size, seed=b + i)
                    qp.post_write(0x100000 * (b + i), 1, local_addr=addr, length=size, signaled=(i == n - 1))
            await qp.ring_nvshmem()
    tasks = [cocotb.start_soon(post(qp)) for qp in qps]
    for t in tasks:
        await t
    pred = env.check(await env.drain(2_000_000))
    cyc = env.check_cycles()                   # the cycle model predicts every frame: same figures
    m_first, m_last = cyc.frames[0], cyc.frames[-1]
    m_span_ns = (m_last[4] + P.wire_bytes(m_last[5]) - m_first[4]) * 8 / P.WIRE_GBPS
    frames = env.wire.frames
    span = frames[-1].end_bytes - frames[0].start_bytes           # wire byte-times
    span_ns = span * 8 / P.WIRE_GBPS
    t = pred.totals
    limit_gbps = t.payload_bytes * 8 / (t.wire_bytes * 8 / P.WIRE_GBPS)
    name = f"write_{size}B_{NQPS}qp"
    OUT.mkdir(parents=True, exist_ok=True)
    env.wire.write_pcap(OUT / f"{name}.pcap")
    return {
        "point": name, "payload_bytes": size, "qps": NQPS, "messages": t.messages, "doorbell_batch": 32,
        "dma_latency_ns": LATENCY * P.CLOCK_PERIOD_NS,
        "messages_per_s": t.messages / span_ns * 1e9, "goodput_gbps": t.payload_bytes * 8 / span_ns,
        "wire_limit_goodput_gbps": limit_gbps,
        "ratio_to_wire_limit": (t.payload_bytes * 8 / span_ns) / limit_gbps,
        "golden_model_goodput_gbps": t.payload_bytes * 8 / m_span_ns,
        "golden_model_messages_per_s": t.messages / m_span_ns * 1e9,
        "golden_model_wire_bytes": t.wire_bytes, "simulated_cycles": frames[-1].last_cycle - frames[0].first_cycle,
    }


def _make(size):
    async def bench(dut):
        rec = await _point(dut, size)
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{rec['point']}.json").write_text(json.dumps(rec, indent=2))
    bench.__name__ = bench.__qualname__ = f"bench_{size}"
    return cocotb.test()(bench)


for _size in SIZES:
    globals()[f"bench_{_size}"] = _make(_size)
