"""Two-node benchmark points (``make bench``): RC WRITEs from NIC 0 to NIC 1 with the responder in the loop.

Each point (``BENCH_PAIR_POINTS``: ``{"size", "qps", "msgs", "loss"}``, optional ``seed`` of
the links' drops, 11 by default) posts ``msgs``
WRITEs per QP on RC QPs (NVSHMEM posting: a doorbell and a CQE per 32), over a cable of
100 cycles each way that drops frames at ``loss`` in both directions. Goodput is the
payload delivered over the time from the first frame on the wire to the last CQE (so
it includes ACK round trips and every retransmission); every byte is checked in NIC 1's
memory. The steady-state message rate counts NIC 0's frames on the wire over the middle
half of the run (whether ACK handling holds the sender back), as the one-NIC points do.
Writes ``pair_<point>.json``.
"""
import json
import os
import random
from pathlib import Path


from model.cqe import parse_cqe
from spec import params as P
from spec.formats import Access, CqeOp, WqeOp
from model.network import FaultSpec
from model.timing import read_rate_estimate
from tb.pair_env import NicPairEnv
from tb.suites import point_tests

OUT = Path(os.environ.get("IBGDA_BENCH_OUT", "build/bench"))
POINTS = json.loads(os.environ.get("BENCH_PAIR_POINTS", '[{"size": 4096, "qps": 4, "msgs": 32, "loss": 0}]'))
KEY = (0x09 << 8) | 0x33
DST = 0x8000_0000
PD = 1
TIMEOUT_CYCLES = 4000        # 8 us: a few ACK round trips of this cable and GPU memory
# READs: a QP's 16 READs of 64 KiB take 21 us of response wire behind the other QPs'
# (a real QP's timeout is 4.096 us x 2^n, NVSHMEM's some seconds): 100 us
READ_TIMEOUT_CYCLES = 50_000


COUNT_KEY = (0x0A << 8) | 0x33           # NIC 1's counts: remote atomic
COUNTS = 0x9000_0000
SCRATCH_BYTES = 8


READ_KEY = (0x0B << 8) | 0x55          # NIC 1's READ source: remote read
SOURCE = 0xA000_0000


def point_name(p):
    if p.get("kind") in ("send", "write_imm"):
        return f"pair_{p['kind']}_{p['size']}B_{p['qps']}qp"
    if p.get("kind") == "read":
        return f"pair_read_{p['size']}B_{p['qps']}qp" + (f"_dma{p['dma']}" if "dma" in p else "")
    sig = f"_count{p['batch']}" if p.get("signal") == "count" else ""
    return f"pair_{p['size']}B_{p['qps']}qp{sig}_loss{p['loss']:g}" + (f"_seed{p['seed']}" if "seed" in p else "")


async def _point(dut, p):
    size, nq, msgs, loss = p["size"], p["qps"], p["msgs"], p["loss"]
    faults = FaultSpec(drop=loss) if loss else None
    env = await NicPairEnv(dut, latency_cycles=100, faults=faults, seed=p.get("seed", 11)).start()
    a, b = env.nics
    cq_a, cq_b = await a.cq(0, 0, collapsed=True), await b.cq(0, 0, collapsed=True)
    region = max(1 << 20, nq * msgs * max(size, 64))
    await b.ctl.register_mr(KEY, DST, region, Access.LOCAL_WRITE | Access.REMOTE_WRITE, PD)
    deepep = p.get("signal") == "count"       # DeepEP's low-latency pattern: tokens, then the count
    if deepep:
        await b.ctl.register_mr(COUNT_KEY, COUNTS, 1 << 16, Access.LOCAL_WRITE | Access.REMOTE_ATOMIC, PD)
    pairs = [await env.connect(0, q + 1, 1, q + 1, cq_a=cq_a, cq_b=cq_b, mtu=4096, pd=PD, ack_every=8,
                               timeout=TIMEOUT_CYCLES, log_depth=max(8, (msgs * 2).bit_length()),
                               max_wqebbs=1)
             for q in range(nq)]
    rnd = random.Random(3)
    sent = []
    for q, (qp, _) in enumerate(pairs):
        for i in range(msgs):
            raddr = DST + (q * msgs + i) * max(size, 64)
            data = bytes(rnd.randrange(256) for _ in range(size)) if i % 8 == 0 else bytes([i & 0xFF]) * size
            last = i % 32 == 31 or i == msgs - 1
            if size <= 28:
                qp.post_write(raddr, KEY, inline=data, signaled=last)
            else:
                addr = a.gpu.alloc(size, 128)
                a.gpu.write(addr, data)
                qp.post_write(raddr, KEY, local_addr=addr, length=size, signaled=last)
            sent.append((raddr, data))
            if deepep and i % p["batch"] == p["batch"] - 1:
                # the batch's count: a 4-byte masked fetch-add of 1 (CQ_UPDATE set), as
                # DeepEP's low-latency dispatch signals a peer after its tokens
                qp.amo_nonfetch_add(COUNTS + 4 * q, COUNT_KEY, 1, scratch=a.gpu.alloc(SCRATCH_BYTES, 8))
            if last:
                await qp.ring_nvshmem()
    want = sum((msgs + 31) // 32 for _ in pairs) + (nq * (msgs // p["batch"]) if deepep else 0)
    await a.wait_for(lambda: len(a.cqe_writes()) >= want, 5_000_000, f"{want} CQEs")
    for raddr, data in sent:
        assert b.mem.read(raddr, len(data)) == data, f"NIC 1 memory at {raddr:#x}"
    if deepep:
        # every count is its QP's batches (each fetch-add applied once, after its tokens),
        # every CQE a success (the golden transmit model does not predict atomics' CQEs)
        for q in range(nq):
            got = int.from_bytes(b.mem.read(COUNTS + 4 * q, 4), "little")
            assert got == msgs // p["batch"], f"count of QP {q + 1}: {got}"
        bad = [c for c in (parse_cqe(raw) for _, _, raw, _ in a.cqe_writes()) if c["syndrome"]]
        assert not bad, f"error CQEs: {bad[:2]}"
    else:
        a.predict()
        a.check_cqes()                               # every CQE as the golden model's
    first = a.wire.frames[0].start_bytes / P.WIRE_BYTES_PER_CYCLE
    last_cqe = max(c for *_, c in a.cqe_writes())
    ns = (last_cqe - first) * P.CLOCK_PERIOD_NS
    payload = size * msgs * nq
    ca, cb = await a.ctl.read_counters(), await b.ctl.read_counters()
    frames = a.wire.frames
    n = len(frames)
    lo, hi = frames[n // 4], frames[3 * n // 4]
    steady_ns = (hi.start_bytes - lo.start_bytes) / P.WIRE_BYTES_PER_CYCLE * P.CLOCK_PERIOD_NS
    # the wire limit of what NIC 0 sent (tokens, their headers and the atomics): its frames
    # back to back; the ratio is the payload's goodput over the wire span against it
    wire_ns = sum(P.wire_bytes(len(f)) for f in frames) * 8 / P.WIRE_GBPS
    span_ns = (frames[-1].end_bytes - frames[0].start_bytes) * 8 / P.WIRE_GBPS
    limit_gbps = 8 * payload / wire_ns
    if not loss:
        OUT.mkdir(parents=True, exist_ok=True)
        a.wire.write_pcap(OUT / f"{point_name(p)}.pcap")
    return {"point": point_name(p), "kind": "pair", "signal": p.get("signal"), "batch": p.get("batch"),
            "wire_limit_goodput_gbps": limit_gbps, "ratio_to_wire_limit": 8 * payload / span_ns / limit_gbps,
            "payload_bytes": size, "qps": nq, "messages": msgs * nq,
            "loss": loss, "goodput_gbps": 8 * payload / ns, "messages_per_s": msgs * nq / ns * 1e9,
            "steady_frames_per_s": (3 * n // 4 - n // 4) / steady_ns * 1e9 if steady_ns else None,
            "acks_merged": ca["acks_merged"],
            "frames_sent": len(a.wire.frames), "acks": len(b.wire.frames),
            "retransmits": ca["retransmits"], "timeouts": ca["timeouts"], "naks": ca["naks_received"],
            "dropped": {d: env.net.tx_links[d].counters["dropped"] for d in (0, 1)},
            "duplicates_at_responder": cb["rx_psn_duplicate"], "out_of_order_at_responder": cb["rx_psn_out_of_order"],
            "underrun_cycles": {"sent": a.wire.underrun_cycles, "acks": b.wire.underrun_cycles},
            "simulated_ns": ns}


async def _read_point(dut, p):
    """RDMA READs (NVSHMEM's get) of ``size`` bytes from NIC 1's GPU memory into NIC 0's,
    ``msgs`` per QP on ``qps`` QPs, GPU memory 1 us away at both ends, cable 100 cycles
    each way (``dma``: another GPU-memory latency in cycles, for experiments). The rate is the READs over the time from the first READ REQUEST on the wire
    to the last CQE; the goodput ratio is the READ RESPONSEs' payload over their wire span
    against those frames back to back (the response direction's wire limit). Every READ's
    bytes are checked in NIC 0's memory, every CQE a success with its byte count."""
    size, nq, msgs = p["size"], p["qps"], p["msgs"]
    env = await NicPairEnv(dut, latency_cycles=100, dma_latency=p.get("dma", P.DMA_READ_LATENCY_CYCLES)).start()
    a, b = env.nics
    cq_a, cq_b = await a.cq(0, 0, collapsed=True), await b.cq(0, 0, collapsed=True)
    span = nq * msgs * max(size, 64)
    await b.ctl.register_mr(READ_KEY, SOURCE, max(1 << 20, span), Access.LOCAL_WRITE | Access.REMOTE_READ, PD)
    pairs = [await env.connect(0, q + 1, 1, q + 1, cq_a=cq_a, cq_b=cq_b, mtu=4096, pd=PD, ack_every=8,
                               timeout=READ_TIMEOUT_CYCLES, log_depth=max(8, (msgs * 2).bit_length()),
                               max_wqebbs=1)
             for q in range(nq)]
    rnd = random.Random(5)
    src = rnd.randbytes(span)
    b.mem.write(SOURCE, src)
    reads, signaled = [], 0
    for q, (qp, _) in enumerate(pairs):
        for i in range(msgs):
            off = (q * msgs + i) * max(size, 64)
            dst = a.gpu.alloc(max(size, 1), 128)
            last = i % 32 == 31 or i == msgs - 1
            qp.post_read(SOURCE + off, READ_KEY, dst, size, signaled=last)
            reads.append((dst, src[off:off + size]))
            signaled += last
    # the QPs' threads post at once: their doorbells a batch of 32 at a time, QP after QP
    # (one QP's whole stream before the next QP's first doorbell would only measure the
    # testbench's doorbell writes)
    for batch in range(0, msgs, 32):
        for qp, _ in pairs:
            await qp.ring_nvshmem(upto=min(batch + 32, msgs))
    await a.wait_for(lambda: len(a.cqe_writes()) >= signaled, 5_000_000, f"{signaled} CQEs")
    for dst, data in reads:
        assert a.mem.read(dst, len(data)) == data, f"READ into {dst:#x}"
    cqes = [parse_cqe(raw) for _, _, raw, _ in a.cqe_writes()]
    bad = [c for c in cqes if c["syndrome"]]
    assert not bad, f"error CQEs: {bad[:2]}"
    ca, cb = await a.ctl.read_counters(), await b.ctl.read_counters()
    assert ca["retransmits"] == 0 and cb["naks_sent"] == 0, (ca, cb)
    reqs, resps = a.wire.frames, b.wire.frames
    first = reqs[0].start_bytes / P.WIRE_BYTES_PER_CYCLE
    last_cqe = max(c for *_, c in a.cqe_writes())
    ns = (last_cqe - first) * P.CLOCK_PERIOD_NS
    n = len(reqs)
    lo, hi = reqs[n // 4], reqs[3 * n // 4]
    steady_ns = (hi.start_bytes - lo.start_bytes) / P.WIRE_BYTES_PER_CYCLE * P.CLOCK_PERIOD_NS
    payload = size * msgs * nq
    resp_wire_ns = sum(P.wire_bytes(len(f)) for f in resps) * 8 / P.WIRE_GBPS
    resp_span_ns = (resps[-1].end_bytes - resps[0].start_bytes) * 8 / P.WIRE_GBPS
    req_wire_ns = sum(P.wire_bytes(len(f)) for f in reqs) / len(reqs) * 8 / P.WIRE_GBPS
    est = read_rate_estimate(size=size, qps=nq, outstanding=P.MAX_RD_ATOMIC, mtu=4096,
                             round_trip_cycles=2 * 100 + P.DMA_READ_LATENCY_CYCLES)
    OUT.mkdir(parents=True, exist_ok=True)
    a.wire.write_pcap(OUT / f"{point_name(p)}_requests.pcap")
    b.wire.write_pcap(OUT / f"{point_name(p)}_responses.pcap")
    return {"point": point_name(p), "kind": "pair_read", "payload_bytes": size, "qps": nq, "reads": msgs * nq,
            "reads_per_s": msgs * nq / ns * 1e9, "goodput_gbps": 8 * payload / ns,
            "steady_requests_per_s": (3 * n // 4 - n // 4) / steady_ns * 1e9 if steady_ns else None,
            "request_wire_limit_per_s": 1e9 / req_wire_ns,
            "response_wire_limit_gbps": 8 * payload / resp_wire_ns,
            "response_ratio_to_wire_limit": resp_wire_ns / resp_span_ns,
            "estimate_reads_per_s": est["reads_per_s"], "estimate_bound": est["bound"],
            "requests": n, "responses": len(resps), "cqes": len(cqes), "simulated_ns": ns,
            # wire cycles lost to frames that stalled inside (a real MAC would underrun)
            "underrun_cycles": {"requests": a.wire.underrun_cycles, "responses": b.wire.underrun_cycles}}


RECV_BUFS = 0xB000_0000               # NIC 1's receive buffers (one per message, 64 bytes apart)


async def _two_sided_point(dut, p):
    """``kind`` "send" (SEND, inline) or "write_imm" (WRITE with immediate, inline) of
    ``size`` bytes, ``msgs`` per QP on ``qps`` RC QPs, NIC 0 to NIC 1 (cable 100 cycles,
    1 us GPU memory). NIC 1's QPs have a receive queue each (every receive WQE posted
    before the first message, so the doorbell record and the WQEs are read while the
    messages arrive: the prefetch, not the posting, is measured) and a receive CQ each.
    A first round of one message per QP is sent and completed before the measured ones:
    the responder learns each QP's receive counter from its doorbell record on the QP's
    first SEND (a 1 us read that the receive queue's queries wait for in order: 16 QPs
    queue 16 of them, ``first_round_ns``); the ACK timeout is 100 us, a real QP's order
    (4.096 us x 2^n), so that first round does not trigger resends. The rate counts the
    measured messages from NIC 0's first frame of them to NIC 1's last receive CQE
    (written after its message's payload landed), the receive CQE included as the target
    asks; steady: NIC 0's frames over the middle half. Every payload byte, immediate and
    receive CQE is checked (opcode, byte count, immediate, WQE counter, in order per QP)."""
    kind, size, nq, msgs = p["kind"], p["size"], p["qps"], p["msgs"]
    env = await NicPairEnv(dut, latency_cycles=100).start()
    a, b = env.nics
    cq_a = await a.cq(0, 0, collapsed=True)
    log_rq = max(4, (msgs - 1).bit_length())
    rcqs = [await b.cq(1 + q, log_rq) for q in range(nq)]
    await b.ctl.register_mr(KEY, DST, 1 << 20, Access.LOCAL_WRITE | Access.REMOTE_WRITE, PD)
    pairs = []
    for q in range(nq):
        pairs.append(await env.connect(0, q + 1, 1, q + 1, cq_a=cq_a, cq_b=rcqs[q], mtu=4096, pd=PD, ack_every=8,
                                       timeout=READ_TIMEOUT_CYCLES, log_depth=max(8, (msgs * 2).bit_length()),
                                       max_wqebbs=1, b_kw=dict(recv=(log_rq, 4), rcq=rcqs[q])))
    for q, (_, qb) in enumerate(pairs):
        qb.post_recv(*[[(RECV_BUFS + ((q * msgs + i) << 6), max(size, 1))] for i in range(msgs)])
    rnd = random.Random(5)
    sent = []

    def post(q, qa, i, last):
        data, imm = bytes(rnd.randrange(256) for _ in range(size)), rnd.randrange(1 << 32)
        if kind == "send":
            qa.post_send(inline=data, imm=imm, signaled=last)
        else:
            qa.post_write(DST + ((q * msgs + i) << 6), KEY, inline=data, opcode=WqeOp.RDMA_WRITE_IMM, imm=imm,
                          signaled=last)
        sent.append((q, i, data, imm))

    for q, (qa, _) in enumerate(pairs):           # the first round: message 0 of every QP
        post(q, qa, 0, True)
        await qa.ring_nvshmem()
    t0 = a.counter.now
    await b.wait_for(lambda: len(b.cqe_writes()) >= nq, 1_000_000, f"{nq} first receive CQEs")
    first_round_ns = (a.counter.now - t0) * P.CLOCK_PERIOD_NS
    await a.wait_for(lambda: len(a.cqe_writes()) >= nq, 1_000_000, f"{nq} first send CQEs")
    n_first = len(a.wire.frames)
    for i in range(1, msgs):
        for q, (qa, _) in enumerate(pairs):
            post(q, qa, i, i % 32 == 31 or i == msgs - 1)
    for qa, _ in pairs:
        await qa.ring_nvshmem()
    want = nq * msgs
    await b.wait_for(lambda: len(b.cqe_writes()) >= want, 5_000_000, f"{want} receive CQEs")
    by_q = {}
    for cqn, _, raw, cycle in b.cqe_writes():
        by_q.setdefault(cqn - 1, []).append((parse_cqe(raw), cycle))
    op = CqeOp.RESP_SEND_IMM if kind == "send" else CqeOp.RESP_WR_IMM
    sent.sort(key=lambda s: (s[0], s[1]))
    for q, i, data, imm in sent:
        c, _ = by_q[q][i]
        got = (c["opcode"], c["byte_cnt"], c["imm"], c["wqe_counter"], c["syndrome"])
        assert got == (op, size, imm, i & 0xFFFF, 0), f"QP {q + 1} message {i}: receive CQE {got}"
        where = RECV_BUFS + ((q * msgs + i) << 6) if kind == "send" else DST + ((q * msgs + i) << 6)
        assert b.mem.read(where, size) == data, f"QP {q + 1} message {i}: payload at {where:#x}"
    frames = a.wire.frames[n_first:]
    first = frames[0].start_bytes / P.WIRE_BYTES_PER_CYCLE
    last_cqe = max(c for cs in by_q.values() for _, c in cs)
    ns = (last_cqe - first) * P.CLOCK_PERIOD_NS
    want -= nq                                   # the measured messages
    n = len(frames)
    lo, hi = frames[n // 4], frames[3 * n // 4]
    steady_ns = (hi.start_bytes - lo.start_bytes) / P.WIRE_BYTES_PER_CYCLE * P.CLOCK_PERIOD_NS
    wire_limit = P.WIRE_BYTES_PER_CYCLE * 1e3 / P.CLOCK_PERIOD_NS / P.wire_bytes(len(frames[n // 2].data))
    OUT.mkdir(parents=True, exist_ok=True)
    a.wire.write_pcap(OUT / f"{point_name(p)}.pcap")
    return {"point": point_name(p), "kind": f"pair_{kind}", "payload_bytes": size, "qps": nq, "messages": want,
            "frame_bytes": len(frames[n // 2].data), "messages_per_s": want / ns * 1e9,
            "steady_frames_per_s": (3 * n // 4 - n // 4) / steady_ns * 1e9 if steady_ns else None,
            "wire_limit_per_s": wire_limit * 1e6, "frames_sent": n, "acks": len(b.wire.frames),
            "naks": (await b.ctl.read_counters())["naks_sent"], "retransmits": (await a.ctl.read_counters())["retransmits"],
            "first_round_ns": first_round_ns, "simulated_ns": ns}


async def _run(dut, p):
    if p.get("kind") in ("send", "write_imm"):
        return await _two_sided_point(dut, p)
    return await (_read_point if p.get("kind") == "read" else _point)(dut, p)


point_tests(globals(), "bench_pair", "bench", POINTS, lambda p: f"pair {point_name(p)}", _run, OUT)
