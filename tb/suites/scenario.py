"""The default end-to-end scenario (``make sim``): a GPU drives the NIC as NVSHMEM and rdma-core do.

Eight QPs on a 400G port. QPs 0-3 post like NVSHMEM's IBGDA code: batches of
WQEs, one doorbell per batch with the next free index, CQ_UPDATE on the batch's
last WQE only, one collapsed CQ each polled by wqe_counter. QPs 4-7 post like
rdma-core: every WQE signaled, the doorbell carries the last WQE's ctrl words,
ring CQs polled by owner bit. Messages mix inline and pointer RDMA WRITEs of
several sizes. Everything is checked against the golden model; the summary
goes to build/sim/summary.txt and every frame to build/sim/wire.pcap.
"""
import json
import os
import time
from pathlib import Path

import cocotb

from spec import params as P
from spec.formats import BTH, CQE64, OFF_BTH, read_field
from tb.env import NicEnv

OUT = Path(os.environ.get("IBGDA_SIM_OUT", "build/sim"))
SIZES = [("inline", 8), ("pointer", 64), ("inline", 12), ("pointer", 256), ("inline", 64),
         ("pointer", 1500), ("inline", 200), ("pointer", 4096), ("pointer", 9000), ("pointer", 32768)]
BATCH = 5


async def _post_all(env, qp, nvshmem):
    for b in range(0, len(SIZES), BATCH):
        batch = SIZES[b:b + BATCH]
        for i, (kind, n) in enumerate(batch):
            signaled = (not nvshmem) or i == len(batch) - 1
            raddr = 0x7F00_0000_0000 + (qp.qpn << 24) + (b + i) * 0x10000
            if kind == "inline":
                qp.post_write(raddr, 0x4000 + qp.qpn, inline=bytes((qp.qpn + j) & 0xFF for j in range(n)),
                              signaled=signaled)
            else:
                addr, _ = env.payload(n, offset=(qp.qpn * 13) % 128, seed=qp.qpn + b + i)
                qp.post_write(raddr, 0x4000 + qp.qpn, local_addr=addr, length=n, signaled=signaled)
        if nvshmem:
            await qp.ring_nvshmem()
        else:
            await qp.ring_rdma_core()


@cocotb.test()
async def default_scenario(dut):
    wall0 = time.perf_counter()
    env = await NicEnv(dut).start()
    qps = []
    for q in range(8):
        nvshmem = q < 4
        cq = await env.cq(q, 0 if nvshmem else 6, collapsed=nvshmem)
        qps.append((await env.qp(q, cq, log_depth=8), nvshmem))
    t0 = env.counter.now
    posting = [cocotb.start_soon(_post_all(env, qp, nvshmem)) for qp, nvshmem in qps]
    for task in posting:
        await task
    pred = env.check(await env.drain(500_000))
    await env.check_counters(pred)
    env.check_cycles()                     # every frame and CQE at the cycle model's cycle
    summary = _summary(env, pred, t0)
    # the simulation's own speed (issue 47): every cycle since reset, over this test's wall time
    wall = time.perf_counter() - wall0
    summary.update(simulator=cocotb.SIM_NAME, sim_cycles=env.counter.now, wall_s=wall,
                   cycles_per_s=env.counter.now / wall)
    OUT.mkdir(parents=True, exist_ok=True)
    env.wire.write_pcap(OUT / "wire.pcap")
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2))
    # every handshake the models recorded, with its cycles (test_scenario compares a run
    # whose models never sleep with one whose models do)
    (OUT / "handshakes.json").write_text(json.dumps({
        "reads": [(r.id, r.addr, r.length, r.start_cycle, r.end_cycle) for r in env.mem.reads],
        "writes": [(w.port, w.id, w.addr, w.length, w.start_cycle, w.end_cycle) for w in env.mem.writes],
        "frames": [(f.data.hex(), f.first_cycle, f.last_cycle, f.start_bytes, f.end_bytes) for f in env.wire.frames],
        "doorbells": [(d.qpn, d.cycle) for d in env.gpu.doorbells]}))
    text = _format(summary)
    (OUT / "summary.txt").write_text(text)
    dut._log.info("\n%s", text)


def _summary(env, pred, t0):
    frames = env.wire.frames
    ns = P.CLOCK_PERIOD_NS
    # map every wire frame to its WQE through the model's per-QP frame order
    first_frame, cqe_at = {}, {}
    per_qp = {}
    for f in frames:
        qpn = read_field(BTH, "dqpn", f.data, OFF_BTH) - 0x1000
        per_qp.setdefault(qpn, []).append(f)
    for qpn, fl in per_qp.items():
        for f, rec in zip(fl, pred.frames[qpn]):
            first_frame.setdefault((qpn, rec.wqe_index), f.first_cycle)
    for cqn, slot, raw, cycle in env.cqe_writes():
        qpn = read_field(CQE64, "sop_drop_qpn", raw) & 0xFFFFFF
        cqe_at[(qpn, read_field(CQE64, "wqe_counter", raw))] = cycle
    db_wire, db_cqe = [], []
    for qpn, qp in env.qps.items():
        for w in qp.posted:
            if (qpn, w.index) in first_frame:
                db_wire.append(first_frame[(qpn, w.index)] - w.db_cycle)
            if (qpn, w.index) in cqe_at:
                db_cqe.append(cqe_at[(qpn, w.index)] - w.db_cycle)
    t = pred.totals
    span_bytes = frames[-1].end_bytes - frames[0].start_bytes
    span_ns = span_bytes * 8 / P.WIRE_GBPS
    last = max(c for *_, c in env.cqe_writes())
    return {
        "qps": len(env.qps), "messages": t.messages, "payload_bytes": t.payload_bytes, "packets": t.packets,
        "frame_bytes": t.frame_bytes, "wire_bytes": t.wire_bytes, "cqes": t.cqes,
        "simulated_ns": (last - t0) * ns, "cycles": last - t0,
        "wire_span_ns": span_ns,
        "goodput_gbps": t.payload_bytes * 8 / span_ns,
        "wire_utilization": t.wire_bytes / span_bytes,
        "message_rate_mps": t.messages / span_ns * 1e3,
        "db_to_wire_cycles": {"min": min(db_wire), "mean": sum(db_wire) / len(db_wire), "max": max(db_wire)},
        "db_to_cqe_cycles": {"min": min(db_cqe), "mean": sum(db_cqe) / len(db_cqe), "max": max(db_cqe)},
        "dma_latency_cycles": env.dma_latency,
    }


def _format(s):
    ns = P.CLOCK_PERIOD_NS
    w, c = s["db_to_wire_cycles"], s["db_to_cqe_cycles"]
    return "\n".join([
        "ibgda-nic default scenario: %d QPs, %d RDMA WRITEs (inline and pointer, 8 B .. 32 KiB)" % (
            s["qps"], s["messages"]),
        "  payload            %d bytes in %d packets (%d frame bytes, %d on the wire)" % (
            s["payload_bytes"], s["packets"], s["frame_bytes"], s["wire_bytes"]),
        "  CQEs               %d (bytes and cycles of every frame and CQE match the golden model)" % s["cqes"],
        "  simulated time     %.1f ns (%d cycles at %d MHz), first doorbell to last CQE" % (
            s["simulated_ns"], s["cycles"], P.CLOCK_MHZ),
        "  wire busy span     %.1f ns: goodput %.1f Gb/s, %.1f M messages/s, wire utilization %.1f%%" % (
            s["wire_span_ns"], s["goodput_gbps"], s["message_rate_mps"], 100 * s["wire_utilization"]),
        "  doorbell -> wire   min %d, mean %.0f, max %d cycles (min %.0f ns; GPU memory latency %d cycles)" % (
            w["min"], w["mean"], w["max"], w["min"] * ns, s["dma_latency_cycles"]),
        "  doorbell -> CQE    min %d, mean %.0f, max %d cycles" % (c["min"], c["mean"], c["max"]),
        "  simulation speed   %d cycles (from reset) in %.1f s wall: %.0f cycles/s on %s" % (
            s["sim_cycles"], s["wall_s"], s["cycles_per_s"], s["simulator"]),
    ]) + "\n"
