"""AtomicAckJoin: the n-th ATOMIC ACK place holder takes the n-th atomic result.

Random pairs of the responder's answers (plain ACK/NAKs and place holders, one or two a
transfer, gaps) and results (``found`` mostly 1, sometimes 0: a retried atomic with no
record), with the results late and the output stalled at random. Checked against a
reference from the records alone: the answers leave in order; each place holder gets
its result's MSN and original, or is dropped when the result says ``found`` 0; an
ATOMIC ACK leaves alone in its transfer; a transfer of two plain answers leaves whole.
"""
import random

import pytest
from amaranth.sim import Simulator

from rtl.responder.atomic_ack_join import AtomicAckJoin
from tests.blocks.helpers import put


def _records(rnd, n):
    out = []
    for k in range(n):
        atomic = rnd.random() < 0.4
        out.append({"qpn": rnd.randrange(8), "psn": k, "syndrome": 0x1F if atomic or rnd.random() < 0.8 else 0x60,
                    "msn": 0 if atomic else rnd.randrange(1 << 24), "atomic": int(atomic)})
    return out


@pytest.mark.parametrize("seed", range(3))
def test_atomic_ack_join(seed):
    rnd = random.Random(seed)
    recs = _records(rnd, 400)
    pairs, k = [], 0
    while k < len(recs):
        n = rnd.choice([1, 2]) if k + 1 < len(recs) else 1
        pairs.append(recs[k:k + n])
        k += n
    results = [{"msn": rnd.randrange(1 << 24), "orig": rnd.randrange(1 << 64), "found": int(rnd.random() < 0.85)}
               for r in recs if r["atomic"]]
    dut = AtomicAckJoin(num_qps=8)
    got = []

    async def answers(ctx):
        for p in pairs:
            while rnd.random() < 0.2:
                await ctx.tick()
            ctx.set(dut.i.p.as_value(), 0)
            ctx.set(dut.i.p.second, len(p) == 2)
            for j, r in enumerate(p):
                for name, v in r.items():
                    ctx.set(getattr(dut.i.p.p[j], name), v)
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)

    async def unit(ctx):
        for res in results:
            for _ in range(rnd.randrange(4)):
                await ctx.tick()
            await put(ctx, dut.results, **res)

    async def sink(ctx):
        for _ in range(20 * len(recs)):
            ready = rnd.random() < 0.6
            ctx.set(dut.o.ready, ready)
            await ctx.delay(1e-12)
            if ready and ctx.get(dut.o.valid):
                o = ctx.get(dut.o.p)
                got.append([{"qpn": o.p[j].qpn, "psn": o.p[j].psn, "syndrome": o.p[j].syndrome, "msn": o.p[j].msn,
                             "atomic": o.p[j].atomic, "orig": o.p[j].orig} for j in range(1 + o.second)])
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(answers, background=True)
    sim.add_testbench(unit, background=True)
    sim.add_testbench(sink)
    sim.run()
    # the reference
    want, it = [], iter(results)
    for p in pairs:
        if not any(r["atomic"] for r in p):
            want.append([{**r, "orig": 0} for r in p])
            continue
        for r in p:
            if r["atomic"]:
                res = next(it)
                if res["found"]:
                    want.append([{**r, "msn": res["msn"], "orig": res["orig"]}])
            else:
                want.append([{**r, "orig": 0}])
    assert got == want
