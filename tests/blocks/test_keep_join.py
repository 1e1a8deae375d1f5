# amaranth: UnusedElaboratable=no
"""RxKeepJoin in Amaranth's simulator: the dispatch's candidate pairs with the write
sorter's verdicts put in, against a reference written here."""
import random

import pytest
from amaranth.sim import Simulator

from rtl.responder.keep_join import RxKeepJoin


def _pairs(rnd, n):
    """Candidate pairs: (second, [bit, bit]) as the dispatch gives them."""
    return [(s, [rnd.random() < 0.6, s and rnd.random() < 0.6]) for s in (rnd.random() < 0.5 for _ in range(n))]


@pytest.mark.parametrize("seed,p_cand,p_ver,p_out", [(1, 1.0, 1.0, 1.0), (2, 0.7, 0.5, 0.6), (3, 0.9, 0.3, 1.0),
                                                     (4, 0.3, 1.0, 0.9)])
def test_keep_join(seed, p_cand, p_ver, p_out):
    """Every candidate pair comes out once, in order, each candidate bit the next verdict
    and every other bit 0; verdicts in transfers of one or two at any time, before or after
    their candidates; random stalls on every side. At full rate one pair a cycle."""
    rnd = random.Random(seed)
    dut = RxKeepJoin()
    cands = _pairs(rnd, 400)
    verdicts = [rnd.random() < 0.5 for s, bits in cands for b in bits[:1 + s] if b]
    want, it = [], iter(verdicts)
    for s, bits in cands:
        want.append((s, [int(b and next(it)) for b in bits[:1 + s]]))
    got, cycles = [], [0]

    async def feed_cands(ctx):
        for s, bits in cands:
            while rnd.random() >= p_cand:
                await ctx.tick()
            ctx.set(dut.candidates.p.second, s)
            ctx.set(dut.candidates.p.keep, int(bits[0]) | int(bits[1]) << 1)
            ctx.set(dut.candidates.valid, 1)
            await ctx.tick().until(dut.candidates.ready)
            ctx.set(dut.candidates.valid, 0)

    async def feed_verdicts(ctx):
        k = 0
        while k < len(verdicts):
            while rnd.random() >= p_ver:
                await ctx.tick()
            two = k + 1 < len(verdicts) and rnd.random() < 0.5
            ctx.set(dut.verdicts.p.second, two)
            ctx.set(dut.verdicts.p.keep, int(verdicts[k]) | (int(verdicts[k + 1]) << 1 if two else 0))
            ctx.set(dut.verdicts.valid, 1)
            await ctx.tick().until(dut.verdicts.ready)
            ctx.set(dut.verdicts.valid, 0)
            k += 1 + two

    async def sink(ctx):
        while len(got) < len(want):
            ready = rnd.random() < p_out
            ctx.set(dut.keep.ready, ready)
            await ctx.delay(1e-12)
            if ctx.get(dut.keep.valid) and ready:
                p = ctx.get(dut.keep.p)
                got.append((p.second, [p.keep & 1] + ([p.keep >> 1] if p.second else [])))
            await ctx.tick()
            cycles[0] += 1
            assert cycles[0] < 20 * len(want) + 100, "stuck"
        for _ in range(5):
            await ctx.delay(1e-12)
            assert not ctx.get(dut.keep.valid), "a pair more than the candidates"
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(feed_cands, background=True)
    sim.add_testbench(feed_verdicts, background=True)
    sim.add_testbench(sink)
    sim.run()
    assert got == want
    if p_cand == p_ver == p_out == 1.0:
        assert cycles[0] <= len(want) + 3, cycles[0]


def test_keep_join_arguments():
    with pytest.raises(ValueError):
        RxKeepJoin(depth=3)
