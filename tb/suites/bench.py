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
from spec.formats import BTH, OFF_BTH, read_field
from tb.env import NicEnv
from tb.suites import point_tests
from tb.clock import ClockCycles

INLINE_MAX = 28        # what fits one WQEBB (ctrl 16 + raddr 16 + 4 + 28 = 64 B); NVSHMEM inlines only tiny puts
OUT = Path(os.environ.get("IBGDA_BENCH_OUT", "build/bench"))
POINTS = json.loads(os.environ.get("BENCH_POINTS", '[{"size": 4096, "qps": 8, "batch": 32, '
                                                   '"latency_ns": 1000, "msgs": 32}]'))


def point_name(p):
    kind = p.get("kind", "write")
    if kind == "share":
        return f"share_w{'-'.join(map(str, p['weights']))}_{p['window']}"
    if kind == "latency":
        return f"latency_{p['latency_ns']}ns"
    if kind == "atomic":
        return f"atomic_fetch_add_{p['words']}words_{p['qps']}qp_{p['latency_ns']}ns"
    if kind == "rx":
        stride = f"_s{p['stride']}" if "stride" in p else ""
        return f"rx_{p['flood']}_{p['size']}B_{p.get('qps', 1)}qp{stride}"
    return f"write_{p['size']}B_{p['qps']}qp_b{p['batch']}_{p['latency_ns']}ns"


async def _point(dut, p):
    latency = int(p["latency_ns"] / P.CLOCK_PERIOD_NS)
    env = await NicEnv(dut, dma_latency=latency).start()
    size, batch, nmsgs = p["size"], p["batch"], p["msgs"]
    qps = []
    for q in range(p["qps"]):
        cqn = q % P.NUM_CQS                   # one collapsed CQ per QP (NUM_CQS = NUM_QPS), as NVSHMEM
        cq = env.cqs.get(cqn) or await env.cq(cqn, 0, collapsed=True)
        qps.append(await env.qp(q, cq, log_depth=max(8, (nmsgs * 4).bit_length()), max_wqebbs=1))

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
        "point": point_name(p), "kind": "write", "payload_bytes": size, "qps": p["qps"], "messages": t.messages,
        "doorbell_batch": batch, "dma_latency_ns": p["latency_ns"],
        "messages_per_s": t.messages / span_ns * 1e9, "goodput_gbps": t.payload_bytes * 8 / span_ns,
        "wire_limit_goodput_gbps": limit_gbps,
        "ratio_to_wire_limit": (t.payload_bytes * 8 / span_ns) / limit_gbps,
        "golden_model_goodput_gbps": t.payload_bytes * 8 / m_span_ns,
        "golden_model_messages_per_s": t.messages / m_span_ns * 1e9,
        "simulated_cycles": frames[-1].last_cycle - frames[0].first_cycle,
        # how fast the testbench GPU rang: with small batches its serialised doorbell
        # stores, not the engine, can set the pace
        "doorbells": len(env.gpu.doorbells),
        "doorbell_interval_cycles": (env.gpu.doorbells[-1].cycle - env.gpu.doorbells[0].cycle)
        / max(1, len(env.gpu.doorbells) - 1),
    }


async def _share(dut, p):
    """Scheduler shares: QPs of the given weights, every QP backlogged (all its WQEs posted,
    one doorbell), 8-byte inline WRITEs; the share of each QP among the first ``window``
    frames on the wire, against weight / sum of weights."""
    weights, window = p["weights"], p["window"]
    env = await NicEnv(dut, dma_latency=int(p["latency_ns"] / P.CLOCK_PERIOD_NS)).start()
    qps = []
    for q, w in enumerate(weights):
        cq = await env.cq(q, 0, collapsed=True)
        qps.append(await env.qp(q, cq, log_depth=15, weight=w, max_wqebbs=1))
    want = [window * w / sum(weights) for w in weights]
    for qp, n in zip(qps, want):
        count = int(n * 1.05) + 256             # enough that no QP runs dry inside the window
        assert count <= qp.depth, f"{count} WQEs do not fit an SQ of {qp.depth}"
        for i in range(count):
            qp.post_write(0x1000 * i, 1, inline=bytes(8), signaled=(i % 32 == 31 or i == count - 1))
    for qp in qps:
        await qp.ring_nvshmem()
    await env.drain(20_000_000)
    # Bytes of 10^5 frames are not re-checked against the golden frames here (the byte-exact
    # checks run at every other point); every frame's cycle is, against the cycle model.
    print(f"[bench] {point_name(p)}: frame bytes not re-checked at this point (cycles are)", flush=True)
    env.check_cycles()
    OUT.mkdir(parents=True, exist_ok=True)
    env.wire.write_pcap(OUT / f"{point_name(p)}.pcap")
    # The window starts once every QP has had its first turn: all of them active, and past
    # the first turn after create, which is FIRST_TURN_WQEBBS whatever the weight.
    owner = [read_field(BTH, "dqpn", f.data, OFF_BTH) - 0x1000 for f in env.wire.frames]
    second_turn = []
    for q in range(len(weights)):
        first = owner.index(q)
        end = next(i for i in range(first, len(owner)) if owner[i] != q)
        second_turn.append(owner.index(q, end))
    start = max(second_turn)
    frames = env.wire.frames[start:start + window]
    assert len(frames) == window, f"only {len(frames)} frames after all QPs started"
    counts = [0] * len(weights)
    for q in owner[start:start + window]:
        counts[q] += 1
    shares = [c / window for c in counts]
    ideal = [w / sum(weights) for w in weights]
    return {"point": point_name(p), "kind": "share", "weights": weights, "window_frames": window,
            "window_start_frame": start,
            "frames_per_qp": counts, "shares": shares, "ideal_shares": ideal,
            "max_share_error": max(abs(a - b) / b for a, b in zip(shares, ideal)),
            "dma_latency_ns": p["latency_ns"],
            "simulated_cycles": frames[-1].last_cycle - frames[0].first_cycle}


async def _latency(dut, p):
    """Isolated WRITEs on an idle engine: doorbell (last store beat) to the frame's first
    beat on the MAC port, for a doorbell + inline WQE, a doorbell + pointer WQE, and a
    BlueFlame store of an inline and of a pointer WQE, against the cycle model's figure
    for the same WQE."""
    from model.cycle_model import isolated_write
    latency = int(p["latency_ns"] / P.CLOCK_PERIOD_NS)
    env = await NicEnv(dut, dma_latency=latency).start()
    cq = await env.cq(0, 6)
    qp = await env.qp(0, cq)
    rows = {}
    for case in ("inline_8B", "pointer_64B", "blueflame_8B", "blueflame_pointer_64B"):
        bf = case.startswith("blueflame")
        if case.endswith("pointer_64B"):
            addr, _ = env.payload(64)
            w = qp.post_write(0x100, 1, local_addr=addr, length=64)
        else:
            w = qp.post_write(0x100, 1, inline=bytes(8))
        cycle = await (qp.ring_blueflame() if bf else qp.ring_nvshmem())
        await qp.cq.poll(1, timeout_cycles=20 * latency + 20_000)
        first = next(f for f in env.wire.frames if f.first_cycle >= cycle)
        model = isolated_write(w, qp, dma_latency=latency, blueflame=bf)["db_to_first_beat"]
        rows[case] = {"db_to_first_byte_cycles": first.first_cycle - cycle, "cycle_model": model}
        await ClockCycles(dut.clk, 100)
    env.check(await env.drain())
    env.check_cycles()
    OUT.mkdir(parents=True, exist_ok=True)
    env.wire.write_pcap(OUT / f"{point_name(p)}.pcap")
    return {"point": point_name(p), "kind": "latency", "dma_latency_ns": p["latency_ns"],
            "dma_round_trip_cycles": latency, "cases": rows}


async def _rx(dut, p):
    """A flood of ``frames`` received frames of one kind and size, back to back at the
    400G line rate on MAC RX: ``garbage`` (another EtherType, dropped), ``ack`` (62-byte
    ACKs for ``qps`` QPs in turn), ``write`` (WRITE ONLYs of ``size - 74`` payload bytes
    for ``qps`` QPs in turn, each answered with an ACK). The rate is the wire time of the
    frames over the cycles MAC RX took to hand them over: 1.0 when it is never held back."""
    import random
    from model.frames import QpContext, build_write_frames
    from model.parse import build_response
    from spec.formats import Aeth
    from tb.env import PORT_IP, PORT_MAC
    from tb.rc_env import DST, KEY, not_roce, peer_port, responder_env
    rnd = random.Random(1)
    size, n, qps = p["size"], p["frames"], p.get("qps", 1)
    env, model, peers = await responder_env(dut, rnd, {q: 4096 for q in range(1, qps + 1)},
                                            {q: 1 for q in range(1, qps + 1)})
    psn = {q: ctx.start_psn for q, (ctx, _) in peers.items()}
    frames = []
    for k in range(n):
        q = 1 + k % qps
        ctx, _ = peers[q]
        if p["flood"] == "garbage":
            frames.append(not_roce(size, k))
        elif p["flood"] == "ack":
            back = QpContext(qpn=ctx.qpn, remote_qpn=q, dmac=PORT_MAC, dip=PORT_IP, mtu=ctx.mtu)
            frames.append(build_response(back, peer_port(q), k, Aeth.ACK, k))
        else:
            (f,) = build_write_frames(ctx, peer_port(q), DST + p.get("stride", 64) * k, KEY, bytes(size - 74),
                                      psn[q])
            psn[q] = (psn[q] + 1) & 0xFFFFFF
            frames.append(f)
    assert all(len(f) == size for f in frames)
    for f in frames:
        env.rx.send(f)
    while not env.rx.idle:
        await ClockCycles(dut.clk, 100)
    sent = env.rx.sent
    cycles = sent[-1][2] - sent[0][1] + 1
    wire_cycles = sum(P.wire_bytes(len(f)) for f in frames) / P.WIRE_BYTES_PER_CYCLE
    await ClockCycles(dut.clk, 2000)
    c = await env.ctl.read_counters()
    return {"point": point_name(p), "kind": "rx", "flood": p["flood"], "frame_bytes": size, "qps": qps,
            "stride": p.get("stride", 64),
            "frames": n, "cycles": cycles, "wire_cycles": wire_cycles,
            "ratio_to_line_rate": min(1.0, wire_cycles / cycles), "mac_rx_stall_cycles": env.rx.stall_cycles,
            "counters": {k: v for k, v in c.items() if k.startswith("rx_") or k.startswith("ack")}}


async def _atomics(dut, p):
    """``frames`` 8-byte IBTA FETCH_ADDs of 1 (86-byte frames) received back to back at
    the 400G line rate from ``qps`` peer QPs in turn, to ``words`` distinct 8-byte words
    (1: every one to one address), GPU memory ``latency_ns`` away: the rate is the
    atomics over the time from the first request on MAC RX to the last ATOMIC ACK on the
    wire (the execution rate; the request wire limit is 1 / wire time of 86 bytes). Each
    word must end as the count of its adds and every ATOMIC ACK's original be distinct
    per word (applied once each)."""
    import random
    from model.read_atomic import build_atomic_request
    from model.timing import atomic_rate_estimate
    from rtl.responder.path import ATOMIC_WORDS
    from spec.formats import OFF_EXT, Op
    from tb.rc_env import DST, KEY_ATOMIC, peer_port, responder_env
    rnd = random.Random(1)
    n, qps, words = p["frames"], p["qps"], p["words"]
    latency = int(p["latency_ns"] / P.CLOCK_PERIOD_NS)
    env, _, peers = await responder_env(dut, rnd, {q: 4096 for q in range(1, qps + 1)},
                                        {q: 1 for q in range(1, qps + 1)}, dma_latency=latency)
    psn = {q: ctx.start_psn for q, (ctx, _) in peers.items()}
    frames, targets = [], []
    for k in range(n):
        q = 1 + k % qps
        addr = DST + 0x8_0000 + 8 * (k % words)
        frames.append(build_atomic_request(peers[q][0], peer_port(q), Op.FETCH_ADD, addr, KEY_ATOMIC, 1, 0, psn[q]))
        targets.append(addr)
        psn[q] = (psn[q] + 1) & 0xFFFFFF
    for f in frames:
        env.rx.send(f)
    # every request is answered by one frame, its ATOMIC ACK
    await env.wait_for(lambda: len(env.wire.frames) >= n, 200_000, lambda: f"{n} answers (got {len(env.wire.frames)})")
    acks = [f for f in env.wire.frames if f.data[OFF_BTH] == Op.ATOMIC_ACK]
    assert len(acks) == n, f"{len(acks)} ATOMIC ACKs of {n}"
    await ClockCycles(dut.clk, 2 * latency + 200)
    for w in range(words):
        addr = DST + 0x8_0000 + 8 * w
        want = sum(1 for t in targets if t == addr)
        assert int.from_bytes(env.mem.read(addr, 8), "little") == want, f"word {addr:#x}"
    if words == 1:
        origs = {int.from_bytes(a.data[OFF_EXT + 4:OFF_EXT + 12], "big") for a in acks}
        assert len(origs) == n, "one address: every original distinct (applied once each)"
    sent = env.rx.sent
    t0 = sent[0][1]
    t1 = acks[-1].last_cycle
    # the steady rate: the middle half of the ATOMIC ACKs
    lo, hi = acks[n // 4], acks[3 * n // 4]
    steady = (3 * n // 4 - n // 4) / ((hi.last_cycle - lo.last_cycle) * P.CLOCK_PERIOD_NS) * 1e9
    wire_limit = 1e9 / (P.wire_bytes(len(frames[0])) / P.WIRE_BYTES_PER_CYCLE * P.CLOCK_PERIOD_NS)
    estimate = atomic_rate_estimate(words=words, entries=ATOMIC_WORDS, dma_latency=latency,
                                    wire_limit_per_cycle=wire_limit * P.CLOCK_PERIOD_NS / 1e9) / P.CLOCK_PERIOD_NS * 1e9
    OUT.mkdir(parents=True, exist_ok=True)
    env.wire.write_pcap(OUT / f"{point_name(p)}.pcap")
    c = await env.ctl.read_counters()
    return {"point": point_name(p), "kind": "atomic", "estimate_per_s": estimate, "atomic_unit_words": ATOMIC_WORDS,
            "words": words, "qps": qps, "atomics": n,
            "dma_latency_ns": p["latency_ns"], "cycles": t1 - t0,
            "atomics_per_s": n / ((t1 - t0) * P.CLOCK_PERIOD_NS) * 1e9, "steady_atomics_per_s": steady,
            "request_wire_limit_per_s": wire_limit, "mac_rx_stall_cycles": env.rx.stall_cycles,
            "counters": {k: v for k, v in c.items() if v and (k.startswith("rx_") or k.startswith("ack"))}}


async def _run(dut, p):
    kind = p.get("kind", "write")
    return await (_share(dut, p) if kind == "share" else _latency(dut, p) if kind == "latency"
                  else _rx(dut, p) if kind == "rx" else _atomics(dut, p) if kind == "atomic"
                  else _point(dut, p))


point_tests(globals(), "bench", "bench", POINTS, point_name, _run, OUT)
