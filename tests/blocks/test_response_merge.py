"""ResponseMerge: each READ's response beats where its marker is among the ACK frames.

Random ACK frames (one beat each) with READ markers among them, and the READs' beats (runs
of 1..6, frames inside a run ending with ``last`` and the READ's last beat also with
``cpl_valid``), both sides and the output stalled at random. Checked against the order the
records alone give: every ACK frame, each marker replaced by its READ's beats, no marker
out, ``cpl_valid`` clear on the output."""
import random

import pytest
from amaranth.sim import Simulator

from rtl.responder.response_merge import ResponseMerge
from tests.blocks.helpers import random_sink


@pytest.mark.parametrize("seed", range(3))
def test_response_merge(seed):
    rnd = random.Random(seed)
    acks, reads, want = [], [], []          # acks: (tag, marker); reads: (tag, last, cpl)
    n_read = 0
    for k in range(300):
        if rnd.random() < 0.35:
            acks.append((0, True))
            run = rnd.randrange(1, 7)
            for b in range(run):
                tag = 0x10000 + n_read * 16 + b
                reads.append((tag, b == run - 1 or rnd.random() < 0.4, b == run - 1))
                want.append(tag)
            n_read += 1
        else:
            acks.append((k + 1, False))
            want.append(k + 1)
    dut = ResponseMerge(num_qps=8, num_cqs=8)
    got, cpl_seen = [], []

    def source(stream, items, fill):
        async def bench(ctx):
            for it in items:
                while rnd.random() < 0.3:
                    await ctx.tick()
                ctx.set(stream.p.as_value(), 0)
                fill(ctx, stream.p, it)
                ctx.set(stream.valid, 1)
                await ctx.tick().until(stream.ready)
                ctx.set(stream.valid, 0)
        return bench

    def fill_ack(ctx, p, it):
        tag, marker = it
        ctx.set(p.data, tag)
        ctx.set(p.last, 1)
        ctx.set(p.frame, 0 if marker else 1)

    def fill_read(ctx, p, it):
        tag, last, cpl = it
        ctx.set(p.data, tag)
        ctx.set(p.last, last)
        ctx.set(p.frame, 1)
        ctx.set(p.cpl_valid, cpl)

    def take(o):
        got.append(o.data)
        cpl_seen.append(o.cpl_valid or not o.frame)

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(source(dut.acks, acks, fill_ack), background=True)
    sim.add_testbench(source(dut.reads, reads, fill_read), background=True)
    sim.add_testbench(random_sink(dut.o, rnd, 30 * len(want), take))
    sim.run()
    assert got == want
    assert not any(cpl_seen), "a marker or a completion went out"


def test_response_merge_one_read_a_cycle():
    """Markers back to back, each READ one beat (an 8-byte READ's response), no stalls:
    a beat leaves every cycle (taking the marker in a cycle of its own halves the
    responder's 8-byte READ rate)."""
    n = 40
    dut = ResponseMerge(num_qps=8, num_cqs=8)
    cycles = []

    async def bench(ctx):
        ctx.set(dut.acks.p.frame, 0)
        ctx.set(dut.acks.p.last, 1)
        ctx.set(dut.reads.p.frame, 1)
        ctx.set(dut.reads.p.last, 1)
        ctx.set(dut.reads.p.cpl_valid, 1)
        ctx.set(dut.o.ready, 1)
        ctx.set(dut.acks.valid, 1)
        ctx.set(dut.reads.valid, 1)
        for cycle in range(n):
            ctx.set(dut.reads.p.data, cycle + 1)
            if ctx.get(dut.o.valid):
                assert ctx.get(dut.acks.ready) and ctx.get(dut.reads.ready)
                cycles.append((cycle, ctx.get(dut.o.p.data)))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(bench)
    sim.run()
    assert cycles == [(c, c + 1) for c in range(n)]
