"""AxiWriteArbiter: two write masters with random bursts and stalls onto one slave.

Every burst must reach the slave whole (its AW, then exactly its W beats with wlast on
the last, never interleaved with the other master's beats), and every B must go back
to the master that wrote.
"""
import random

from amaranth.sim import Simulator

from rtl.common.axi_write_arbiter import AxiWriteArbiter

IDS = (0, 2)


def test_axi_write_arbiter():
    rnd = random.Random(3)
    dut = AxiWriteArbiter(data_width=64, id_width=4, ids=IDS)
    plans = {0: [], 1: []}
    for k in range(2):
        for n in range(40):
            plans[k].append((0x1000 * (k + 1) + 0x40 * n, rnd.randrange(1, 5),
                             [rnd.randrange(1 << 64) for _ in range(5)]))
    seen_aw, seen_w, b_back = [], [], {0: 0, 1: 0}

    def master(k, port):
        async def run(ctx):
            for addr, beats, data in plans[k]:
                while rnd.random() < 0.3:
                    await ctx.tick()
                ctx.set(port.awid, IDS[k])
                ctx.set(port.awaddr, addr)
                ctx.set(port.awlen, beats - 1)
                ctx.set(port.awvalid, 1)
                aw_left, w_left = True, beats
                ctx.set(port.wvalid, 0)
                while aw_left or w_left:
                    if w_left:
                        i = beats - w_left
                        ctx.set(port.wdata, data[i])
                        ctx.set(port.wlast, w_left == 1)
                        ctx.set(port.wvalid, rnd.random() < 0.8)
                    await ctx.delay(1e-12)
                    aw_fire = aw_left and ctx.get(port.awvalid) and ctx.get(port.awready)
                    w_fire = w_left and ctx.get(port.wvalid) and ctx.get(port.wready)
                    await ctx.tick()
                    if aw_fire:
                        aw_left = False
                        ctx.set(port.awvalid, 0)
                    if w_fire:
                        w_left -= 1
                        if not w_left:
                            ctx.set(port.wvalid, 0)
        return run

    def b_sink(k, port):
        async def run(ctx):
            ctx.set(port.bready, 1)
            async for _, _, v, bid in ctx.tick().sample(port.bvalid, port.bid):
                if v:
                    assert bid == IDS[k]
                    b_back[k] += 1
        return run

    async def slave(ctx):
        bus = dut.bus
        next_b, lasts = 0, 0
        async for _, _, awv, awr, awid, awaddr, awlen, wv, wr, wdata, wlast, bv, br in ctx.tick().sample(
                bus.awvalid, bus.awready, bus.awid, bus.awaddr, bus.awlen,
                bus.wvalid, bus.wready, bus.wdata, bus.wlast, bus.bvalid, bus.bready):
            if awv and awr:
                seen_aw.append((awid, awaddr, awlen + 1))
            if wv and wr:
                seen_w.append((wdata, wlast))
                lasts += wlast
            if bv and br:
                next_b += 1
            ctx.set(bus.awready, rnd.random() < 0.7)
            ctx.set(bus.wready, rnd.random() < 0.7)
            # B in order, for bursts whose AW and last W have both been seen
            if next_b < min(len(seen_aw), lasts):
                ctx.set(bus.bid, seen_aw[next_b][0])
                ctx.set(bus.bvalid, 1)
            else:
                ctx.set(bus.bvalid, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(master(0, dut.a), background=True)
    sim.add_testbench(master(1, dut.b), background=True)
    sim.add_process(b_sink(0, dut.a))
    sim.add_process(b_sink(1, dut.b))
    sim.add_process(slave)
    sim.run_until(1e-9 * 3000)

    # every burst once, W beats grouped per burst in AW order, data intact
    assert len(seen_aw) == 80
    pos = 0
    for awid, addr, beats in seen_aw:
        k = IDS.index(awid)
        plan = next(p for p in plans[k] if p[0] == addr)
        assert plan[1] == beats
        assert [d for d, _ in seen_w[pos:pos + beats]] == plan[2][:beats], (addr, pos)
        assert [last for _, last in seen_w[pos:pos + beats]] == [0] * (beats - 1) + [1]
        pos += beats
    assert pos == len(seen_w)
    for k in range(2):
        assert [a for i, a, _ in seen_aw if i == IDS[k]] == [p[0] for p in plans[k]]   # per master in order
    assert b_back == {0: 40, 1: 40}
    # both masters were interleaved at burst granularity (round robin), not one after the other
    order = [IDS.index(i) for i, _, _ in seen_aw]
    assert sum(1 for x, y in zip(order, order[1:]) if x != y) > 20
