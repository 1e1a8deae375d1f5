"""ReadResponseSource: a READ job leaves as a READ_RESPONSE message only after its fence has
landed (one ``landed`` strobe each, which may come before or after the job), with the QP's
peer from its table. Random jobs, strobes and output stalls; checked: no message ever runs
ahead of the strobes, every job leaves once, in order, with its fields and its QP's peer."""
import random

import pytest
from amaranth.sim import Simulator

from rtl.requester.message import MessageKind
from rtl.responder.read_response_source import ReadResponseSource
from tests.blocks.helpers import put, random_sink


@pytest.mark.parametrize("seed", range(2))
def test_read_response_source(seed):
    rnd = random.Random(seed)
    peers = {q: (rnd.randrange(1 << 48), rnd.randrange(1 << 32), rnd.randrange(1 << 24)) for q in range(8)}
    jobs = [{"qpn": rnd.randrange(8), "psn": rnd.randrange(1 << 24), "va": rnd.randrange(1 << 64),
             "length": rnd.randrange(1 << 20), "msn": rnd.randrange(1 << 24), "mtu": rnd.randrange(1, 6)}
            for _ in range(120)]
    dut = ReadResponseSource(num_qps=8, num_cqs=8, credits=16)
    got, strobes, ahead = [], [0], []

    async def setup_and_jobs(ctx):
        for q, (mac, ip, rq) in peers.items():
            ctx.set(dut.commit.p.qpn, q)
            ctx.set(dut.commit.valid, 1)
            ctx.set(dut.commit.p.addr.dmac, mac)
            ctx.set(dut.commit.p.addr.dip, ip)
            ctx.set(dut.commit.p.addr.remote_qpn, rq)
            await ctx.tick()
            ctx.set(dut.commit.valid, 0)
        for j in jobs:
            while rnd.random() < 0.3:
                await ctx.tick()
            await put(ctx, dut.jobs, **j)

    async def fences(ctx):
        await ctx.tick().repeat(20)
        n = 0
        while n < len(jobs):
            on = rnd.random() < 0.3 and n - len(got) < 10        # at most a few ahead of the jobs
            ctx.set(dut.landed, on)
            await ctx.tick()
            if on:
                n += 1
                strobes[0] = n
        ctx.set(dut.landed, 0)

    def take(o):
        got.append(o)
        if len(got) > strobes[0]:
            ahead.append(len(got))

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(setup_and_jobs, background=True)
    sim.add_testbench(fences, background=True)
    sim.add_testbench(random_sink(dut.messages, rnd, 40 * len(jobs), take, p_ready=0.7))
    sim.run()
    assert not ahead, f"messages ahead of their fences: {ahead[:5]}"
    assert len(got) == len(jobs)
    for o, j in zip(got, jobs):
        mac, ip, rq = peers[j["qpn"]]
        assert (o.kind, o.signaled, o.qpn, o.psn, o.addr, o.length, o.rkey, o.cfg.mtu) == (
            MessageKind.READ_RESPONSE, 1, j["qpn"], j["psn"], j["va"], j["length"], j["msn"], j["mtu"])
        assert (o.cfg.dmac, o.cfg.dip, o.cfg.remote_qpn) == (mac, ip, rq)
