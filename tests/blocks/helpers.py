"""Helpers of the block tests that run in Amaranth's simulator."""


async def put(ctx, stream, **fields):
    """Hand one transfer to ``stream`` (an ``In`` stream of the design under test): the
    payload zeroed, then ``fields`` set, ``valid`` held until ``ready``."""
    ctx.set(stream.p.as_value(), 0)
    for name, value in fields.items():
        ctx.set(getattr(stream.p, name), value)
    ctx.set(stream.valid, 1)
    await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)


def random_sink(stream, rnd, cycles, take, p_ready=0.6):
    """A testbench that drains ``stream`` (an ``Out`` stream of the design under test) for
    ``cycles`` cycles with ``ready`` high at random (probability ``p_ready``), calling
    ``take(payload)`` for each transfer."""
    async def bench(ctx):
        for _ in range(cycles):
            ready = rnd.random() < p_ready
            ctx.set(stream.ready, ready)
            await ctx.delay(1e-12)
            if ready and ctx.get(stream.valid):
                take(ctx.get(stream.p))
            await ctx.tick()
    return bench


def run(dut, bench, period=2e-9):
    """Run testbench ``bench`` on ``dut`` with a clock of ``period`` until it returns."""
    from amaranth.sim import Simulator
    sim = Simulator(dut)
    sim.add_clock(period)
    sim.add_testbench(bench)
    sim.run()
