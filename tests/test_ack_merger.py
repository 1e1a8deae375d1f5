"""AckMerger: ACKs of one QP waiting for the completion tracker fold into one.

Random ACKs and NAKs of 3 QPs (PSNs wrapping at 2^24, some ACKs older than the one
waiting) against an output that is ready at random. Checked: every input is either
passed or folded (strobe); an input folds only into a waiting ACK of its QP and only
when it is an ACK; each output is its group's first input with the newest PSN (and its
MSN) of the group; NAKs are never folded; order is kept. With the output always ready
nothing is folded and the output equals the input one cycle later.
"""
import random

from amaranth.sim import Simulator

from rtl.ack_merger import AckMerger
from tests.stream_sim import put

MASK = (1 << 24) - 1


def newer(a, b):
    return ((a - b) & MASK) < (1 << 23)


def _run(items, ready_p, seed):
    rnd = random.Random(seed)
    dut = AckMerger()
    taken, out = [], []

    async def drive(ctx):
        for q, psn, syn, msn in items:
            while rnd.random() < 0.2:
                await ctx.tick()
            await put(ctx, dut.i, qpn=q, psn=psn, syndrome=syn, msn=msn)

    async def sink(ctx):
        async for _, _, iv, ir, ip, mg, ov, orr, op in ctx.tick().sample(
                dut.i.valid, dut.i.ready, dut.i.p, dut.merged, dut.o.valid, dut.o.ready, dut.o.p):
            if iv and ir:
                taken.append(((ip.qpn, ip.psn, ip.syndrome, ip.msn), bool(mg)))
            if ov and orr:
                out.append((op.qpn, op.psn, op.syndrome, op.msn))
            ctx.set(dut.o.ready, rnd.random() < ready_p)

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(drive)
    sim.add_process(sink)
    sim.run_until(2e-9 * (len(items) * 12 + 200))
    return taken, out


def _items(rnd, n):
    psn = {q: rnd.randrange(1 << 24) for q in range(3)}
    items, q = [], 0
    for k in range(n):
        if rnd.random() < 0.3:
            q = rnd.randrange(3)                     # runs of one QP, as a QP's turn gives
        step = rnd.choice([1, 1, 2, 5, -3])          # an older ACK now and then (reordered)
        psn[q] = (psn[q] + step) & MASK
        syn = 0x1F if rnd.random() < 0.85 else rnd.choice([0x60, 0x62])
        items.append((q, psn[q], syn, k & 0xFFFFFF))
    return items


def test_ack_merger_folds_waiting_acks():
    rnd = random.Random(1)
    items = _items(rnd, 600)
    taken, out = _run(items, 0.3, 2)
    assert [t for t, _ in taken] == items
    groups = []
    for item, merged in taken:
        if merged:
            head = groups[-1][0]
            assert item[0] == head[0] and item[2] >> 5 == 0 and head[2] >> 5 == 0, (item, head)
            groups[-1].append(item)
        else:
            groups.append([item])
    assert len(groups) == len(out)
    folded = sum(m for _, m in taken)
    assert folded > 50, f"the output stalls often: some ACKs must fold ({folded})"
    for g, o in zip(groups, out):
        best = g[0]
        for it in g[1:]:
            if newer(it[1], best[1]):
                best = it
        assert o == (g[0][0], best[1], g[0][2], best[3]), (g, o)


def test_ack_merger_passes_everything_when_ready():
    items = _items(random.Random(3), 300)
    taken, out = _run(items, 1.0, 4)
    assert not any(m for _, m in taken)
    assert out == items
