"""RecvGate (rtl/responder/recv_gate.py) and RecvCqeWriter (rtl/responder/recv_cqe_writer.py).

RecvGate: random request pairs (opcodes that consume a receive WQE and others, two QPs
a pair or one, gaps), a stand-in for the RecvQueue answering each query after a random
delay (available at random) and handing a WQE record (a number and generation, the WQE
itself or none at random, random segments) per consume after another, random ready on
the output. Checked: the pairs leave in order and unchanged; every lane that consumes a
WQE gets the record consumed for it (valid, counter, generation, addresses, the running
segment ends), other lanes none; one consume (``ok`` = 1, the answer's QP) per answer,
whatever it says (the gate's takes are speculative: the responder decides). QPs created
without a receive queue are never asked: their lanes get a record with ``norq``. Some
records are empty (none posted): a lane of that QP may then take the last empty record
without a query (``cached``); a flood of SEND pairs to a QP with nothing posted goes two
lanes a cycle (one query a cycle without the cache).

RecvCqeWriter: random completions to two ring CQs and a collapsed one, the ``landed``
strobes at random (before or after their completion), random AW/W ready. Checked: each
CQE's 64 bytes and address are ``model.cqe.CqModel``'s (owner bit per wrap), a CQE is
never written before its strobe, and with every ready high and the strobes ahead one CQE
goes out each cycle.
"""
import random
from collections import deque

import pytest

from amaranth.sim import Simulator

from model.cqe import CqContext, CqModel
from rtl.responder.recv_cqe_writer import RecvCqeWriter
from rtl.responder.recv_gate import RWR_OPS, RecvGate
from spec.formats import CQE_SIZE, CqeOp, Op

NUM_QPS = 8
MAX_SGE = 4
NORQ = (6, 7)               # QPs created without a receive queue
EMPTY = (2, 3, 4)           # QPs whose records that are not valid are empty (nothing posted)
OPS = [Op.SEND_ONLY, Op.SEND_FIRST, Op.SEND_MIDDLE, Op.SEND_LAST, Op.WRITE_ONLY, Op.WRITE_ONLY_IMM,
       Op.WRITE_LAST_IMM, Op.SEND_ONLY_IMM, Op.WRITE_FIRST]


def test_recv_gate():
    rnd = random.Random(3)
    dut = RecvGate(num_qps=NUM_QPS, max_sge=MAX_SGE, depth=4)
    pairs = []
    for k in range(300):
        lanes = [(rnd.choice(OPS), rnd.randrange(NUM_QPS), k * 2 + j) for j in range(1 + (rnd.random() < 0.5))]
        pairs.append(lanes)
    queries, answers, consumes = deque(), deque(), deque()
    wqes = {q: 0 for q in range(NUM_QPS)}             # WQEs handed per QP so far
    handed = deque()                                  # (index, segments) in consume order
    out = []

    async def drive(ctx):
        for q in range(NUM_QPS):         # QPs 6 and 7 have no receive queue (created without one)
            ctx.set(dut.create_valid, 1)
            ctx.set(dut.create.qpn, q)
            ctx.set(dut.create.enable, int(q not in NORQ))
            await ctx.tick()
        ctx.set(dut.create_valid, 0)
        for lanes in pairs:
            while rnd.random() < 0.2:
                await ctx.tick()
            ctx.set(dut.i.p.as_value(), 0)
            ctx.set(dut.i.p.second, len(lanes) == 2)
            for j, (op, q, tag) in enumerate(lanes):
                ctx.set(dut.i.p.p[j].opcode, op)
                ctx.set(dut.i.p.p[j].dqpn, q)
                ctx.set(dut.i.p.p[j].psn, tag)
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)

    async def recv_queue(ctx):
        # queries taken at random; answered in order after 0..6 cycles; a WQE per consume
        pending_wqe = deque()
        delay = 0
        for cycle in range(20000):
            ctx.set(dut.query.ready, rnd.random() < 0.7)
            ctx.set(dut.consume.ready, rnd.random() < 0.7)
            ctx.set(dut.o.ready, rnd.random() < 0.6)
            if answers and answers[0][0] <= cycle:
                ctx.set(dut.answer.valid, 1)
                ctx.set(dut.answer.p.qpn, answers[0][1])
                ctx.set(dut.answer.p.available, answers[0][2])
            else:
                ctx.set(dut.answer.valid, 0)
            if pending_wqe and pending_wqe[0][0] <= cycle:
                _, q, index, segs, valid, gen = pending_wqe[0]
                ctx.set(dut.wqe.valid, 1)
                ctx.set(dut.wqe.p.qpn, q)
                ctx.set(dut.wqe.p.index, index)
                ctx.set(dut.wqe.p.valid, valid)
                ctx.set(dut.wqe.p.empty, int(valid == 0 and q in EMPTY))
                ctx.set(dut.wqe.p.gen, gen)
                ctx.set(dut.wqe.p.nsge, len(segs))
                for j in range(MAX_SGE):
                    a, n = segs[j] if j < len(segs) else (0, 0)
                    ctx.set(dut.wqe.p.sge[j].addr, a)
                    ctx.set(dut.wqe.p.sge[j].length, n)
            else:
                ctx.set(dut.wqe.valid, 0)
            await ctx.delay(1e-12)
            if ctx.get(dut.query.valid) and ctx.get(dut.query.ready):
                q = ctx.get(dut.query.p.qpn)
                avail = int(rnd.random() < 0.7)
                queries.append((q, avail))
                answers.append((cycle + rnd.randrange(0, 7), q, avail))
            if ctx.get(dut.answer.valid) and ctx.get(dut.answer.ready):
                answers.popleft()
            if ctx.get(dut.consume.valid) and ctx.get(dut.consume.ready):
                q = ctx.get(dut.consume.p.qpn)
                assert ctx.get(dut.consume.p.ok) == 1
                consumes.append(q)
                segs = [(rnd.randrange(1 << 40), rnd.randrange(0, 5000)) for _ in range(rnd.randrange(0, MAX_SGE + 1))]
                index = wqes[q]
                wqes[q] += 1
                valid, gen = int(rnd.random() < 0.7), rnd.randrange(2)
                handed.append((q, index, segs, valid, gen))
                pending_wqe.append((cycle + rnd.randrange(1, 8), q, index, segs, valid, gen))
            if ctx.get(dut.wqe.valid) and ctx.get(dut.wqe.ready):
                pending_wqe.popleft()
            if ctx.get(dut.o.valid) and ctx.get(dut.o.ready):
                o = ctx.get(dut.o.p)
                lanes = []
                for j in range(1 + o.pair.second):
                    w = o.wqe[j]
                    lanes.append((o.pair.p[j].opcode, o.pair.p[j].dqpn, o.pair.p[j].psn, w.valid, w.index,
                                  [w.addr[s] for s in range(MAX_SGE)], [w.end[s] for s in range(MAX_SGE)], w.gen,
                                  w.norq))
                    lanes[-1] += (w.empty, w.cached)
                out.append(lanes)
            await ctx.tick()
            if len(out) == len(pairs):
                return

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(drive)
    sim.add_testbench(recv_queue)
    sim.run()
    assert len(out) == len(pairs)
    qs, hs = deque(queries), deque(handed)
    empties_seen, cached = set(), [0]
    for lanes, got in zip(pairs, out):
        assert [(op, q, tag) for op, q, tag in lanes] == [g[:3] for g in got]
        for (op, q, _), g in zip(lanes, got):
            if op not in RWR_OPS:
                assert g[3] == 0 and g[8] == 0
                continue
            if q in NORQ:
                # no query: a record that says the QP has no receive queue
                assert g[3] == 0 and g[8] == 1
                continue
            assert g[8] == 0
            if g[10]:
                # the QP's last empty record, given without a query: one handed on before
                assert q in EMPTY and g[3] == 0 and g[9] == 1 and (q, g[4], g[7]) in empties_seen, g
                cached[0] += 1
                continue
            qq, avail = qs.popleft()
            hq, index, segs, valid, gen = hs.popleft()
            assert qq == q and hq == q and g[3] == valid and g[4] == index and g[7] == gen
            assert g[9] == int(valid == 0 and q in EMPTY)
            if g[9]:
                empties_seen.add((q, index, gen))
            if valid:
                run = 0
                for s in range(MAX_SGE):
                    a, n = segs[s] if s < len(segs) else (g[5][s], 0)
                    run += n
                    assert g[5][s] == a and g[6][s] == run
    assert not qs and not hs
    assert cached[0] > 10, f"only {cached[0]} lanes took a cached empty record"


def _cqe_fields(rnd, cqn):
    op = rnd.choice([CqeOp.RESP_SEND, CqeOp.RESP_SEND_IMM, CqeOp.RESP_WR_IMM, CqeOp.RESP_ERR])
    return dict(qpn=rnd.randrange(1 << 24), cqn=cqn, user_index=rnd.randrange(1 << 24), opcode=op,
                syndrome=rnd.randrange(1, 0x20) if op == CqeOp.RESP_ERR else 0, index=rnd.randrange(1 << 16),
                byte_cnt=0 if op == CqeOp.RESP_ERR else rnd.randrange(1 << 31),
                imm=rnd.randrange(1 << 32) if op in (CqeOp.RESP_SEND_IMM, CqeOp.RESP_WR_IMM) else 0,
                se=int(op != CqeOp.RESP_ERR and rnd.random() < 0.3))


def _writer_run(rnd, n, fast):
    dut = RecvCqeWriter(num_cqs=4)
    cqs = {0: CqContext(0, 2, base=0x10000), 1: CqContext(1, 3, base=0x20000), 2: CqContext(2, 2, base=0x30000,
                                                                                              collapsed=True)}
    models = {c: CqModel(ctx) for c, ctx in cqs.items()}
    cqes = [_cqe_fields(rnd, rnd.choice(list(cqs))) for _ in range(n)]
    want = []
    for c in cqes:
        rec = models[c["cqn"]].push(c["opcode"], c["qpn"], c["index"], c["byte_cnt"], c["syndrome"],
                                    user_index=c["user_index"], imm=c["imm"], se=c["se"])
        want.append((rec.address, rec.cqe))
    got, strobes, taken = [], [0], [0]
    written_at, first_cycle = [], [None]

    async def bench(ctx):
        for cqn, c in cqs.items():
            ctx.set(dut.commit.p.cqn, cqn)
            ctx.set(dut.commit.p.cfg.base, c.base)
            ctx.set(dut.commit.p.cfg.log_depth, c.log_depth)
            ctx.set(dut.commit.p.cfg.collapsed, c.collapsed)
            ctx.set(dut.commit.valid, 1)
            await ctx.tick()
        ctx.set(dut.commit.valid, 0)
        k, aw = 0, deque()
        for cycle in range(20 * n + 100):
            if k < n:
                ctx.set(dut.cqes.valid, 1)
                for name, v in cqes[k].items():
                    ctx.set(getattr(dut.cqes.p, name), v)
            else:
                ctx.set(dut.cqes.valid, 0)
            strobe = int(strobes[0] < n and (fast or rnd.random() < 0.5))
            ctx.set(dut.landed, strobe)
            ctx.set(dut.dma.awready, int(fast or rnd.random() < 0.7))
            ctx.set(dut.dma.wready, int(fast or rnd.random() < 0.7))
            await ctx.delay(1e-12)
            if ctx.get(dut.cqes.valid) and ctx.get(dut.cqes.ready):
                k += 1
                assert k <= strobes[0] + strobe, "a completion taken before its strobe"
            strobes[0] += strobe
            if ctx.get(dut.dma.awvalid) and ctx.get(dut.dma.awready):
                aw.append(ctx.get(dut.dma.awaddr))
            if ctx.get(dut.dma.wvalid) and ctx.get(dut.dma.wready):
                data = ctx.get(dut.dma.wdata).to_bytes(128, "little")
                strb = ctx.get(dut.dma.wstrb)
                lane = (strb.bit_length() - 1) // CQE_SIZE
                assert strb == ((1 << CQE_SIZE) - 1) << (lane * CQE_SIZE)
                got.append(data[lane * CQE_SIZE:(lane + 1) * CQE_SIZE])
                written_at.append(cycle)
            await ctx.tick()
            if len(got) == n and len(aw) == n:
                break
        assert list(aw) == [a for a, _ in want]
        for a, _ in want:
            pass
    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(bench)
    sim.run()
    assert got == [c for _, c in want]
    for (a, _), data in zip(want, got):
        assert (a // CQE_SIZE) % 2 == (a // CQE_SIZE) % 2
    return written_at


def test_recv_cqe_writer():
    rnd = random.Random(5)
    _writer_run(rnd, 120, fast=False)
    at = _writer_run(rnd, 60, fast=True)
    assert at[-1] - at[0] == len(at) - 1, f"not one CQE a cycle: {at[:10]}"


@pytest.mark.parametrize("cache_age", [64, 0])
def test_recv_gate_empty_flood(cache_age):
    """200 pairs of SEND ONLYs to one QP with nothing posted, back to back, the stand-in
    answering at once with empty records: with the cache every lane after the first few
    takes the cached record and the pairs go one a cycle; without it (``cache_age`` 0)
    one query a cycle, two cycles a pair."""
    dut = RecvGate(num_qps=NUM_QPS, max_sge=MAX_SGE, depth=4, cache_age=cache_age)
    n = 200
    stats = {"queries": 0, "out": [], "cached": 0}

    async def bench(ctx):
        ctx.set(dut.create_valid, 1)
        ctx.set(dut.create.qpn, 2)
        ctx.set(dut.create.enable, 1)
        await ctx.tick()
        ctx.set(dut.create_valid, 0)
        ctx.set(dut.o.ready, 1)
        ctx.set(dut.query.ready, 1)
        ctx.set(dut.consume.ready, 1)
        ctx.set(dut.i.p.second, 1)
        for j in range(2):
            ctx.set(dut.i.p.p[j].opcode, Op.SEND_ONLY)
            ctx.set(dut.i.p.p[j].dqpn, 2)
        sent, answers, records = 0, deque(), deque()
        for cycle in range(4 * n):
            ctx.set(dut.i.valid, int(sent < n))
            ctx.set(dut.answer.valid, int(bool(answers)))
            ctx.set(dut.answer.p.qpn, 2)
            ctx.set(dut.wqe.valid, int(bool(records)))
            ctx.set(dut.wqe.p.qpn, 2)
            ctx.set(dut.wqe.p.index, 7)
            ctx.set(dut.wqe.p.gen, 1)
            ctx.set(dut.wqe.p.empty, 1)
            await ctx.delay(1e-12)
            if ctx.get(dut.i.valid) and ctx.get(dut.i.ready):
                sent += 1
            if ctx.get(dut.query.valid):
                stats["queries"] += 1
                answers.append(1)
            if ctx.get(dut.answer.valid) and ctx.get(dut.answer.ready):
                answers.popleft()
            if ctx.get(dut.consume.valid) and ctx.get(dut.consume.ready):
                records.append(1)
            if ctx.get(dut.wqe.valid) and ctx.get(dut.wqe.ready):
                records.popleft()
            if ctx.get(dut.o.valid):
                o = ctx.get(dut.o.p)
                for j in range(2):
                    assert (o.wqe[j].valid, o.wqe[j].index, o.wqe[j].gen, o.wqe[j].empty) == (0, 7, 1, 1)
                    stats["cached"] += o.wqe[j].cached
                stats["out"].append(cycle)
            await ctx.tick()
            if len(stats["out"]) == n:
                return

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(bench)
    sim.run()
    out = stats["out"]
    assert len(out) == n
    took = out[-1] - out[0]
    if cache_age:
        assert took <= n + 10 and stats["queries"] < 40, f"{n} pairs in {took} cycles, {stats['queries']} queries"
        assert stats["cached"] == 2 * n - stats["queries"]
    else:
        assert took >= 2 * n - 10 and stats["queries"] == 2 * n and stats["cached"] == 0, \
            f"{n} pairs in {took} cycles, {stats['queries']} queries"
