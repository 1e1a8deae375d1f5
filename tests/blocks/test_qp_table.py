"""QpTable: the scheduler's bursts through a QP's first turn, a park, a capped wake (a ``hold`` job), the
wake at that burst's end, a RESUME, a CUT and a create again, each job's fields worked out by hand.

One RC QP (quantum 32, weight 1). Each step feeds one doorbell or parser update and then
takes every job the table issues within 40 cycles (``jobs`` always ready): a parked QP
must issue none, however much is posted."""
from amaranth.sim import Simulator

from rtl.requester.qp_table import QpTable, UpdateKind
from spec.formats import QpState
from tests.blocks.helpers import put

QPN = 1


async def _jobs(ctx, dut, fields, cycles=40):
    """Every job the table issues in ``cycles`` (``jobs`` always ready), as ``fields`` tuples."""
    got = []
    for _ in range(cycles):
        await ctx.delay(1e-12)
        if ctx.get(dut.jobs.valid):
            p = ctx.get(dut.jobs.p)
            got.append(tuple(getattr(p, f) for f in fields))
        await ctx.tick()
    return got


def _simulate(dut, body):
    """Run ``body(ctx)`` against the table with its job and BlueFlame outputs always taken."""
    async def bench(ctx):
        ctx.set(dut.jobs.ready, 1)
        ctx.set(dut.bf_wqebbs.ready, 1)
        await body(ctx)
    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(bench)
    sim.run()


def test_qp_table_park_wake_hold():
    dut = QpTable(num_qps=4, num_cqs=4, first_turn=16)
    log = []

    async def bench(ctx):
        async def jobs(cycles=40):
            return await _jobs(ctx, dut, ("ci", "count", "own", "hold"), cycles)

        await put(ctx, dut.commit, qpn=QPN, reset=1,
                  cfg={"log_depth": 8, "state": QpState.RTS, "weight": 1, "mtu": 3})
        await jobs(4)
        # 40 posted: the QP's first turn, 16 (first_turn, under the quantum) that reads
        # 15 on (MAX_WQEBBS - 1 past them, so its last WQE is whole), then the rest
        await put(ctx, dut.doorbells, qpn=QPN, limit=40)
        log.append(("doorbell 40", await jobs()))
        # the parser parks the QP at WQEBB 10 (a WQE waits on its READs)
        await put(ctx, dut.updates, qpn=QPN, ci=10, end=40, kind=UpdateKind.PARK)
        log.append(("park at 10", await jobs()))
        # more posted while parked: no job (its wake queues it)
        await put(ctx, dut.doorbells, qpn=QPN, limit=50)
        log.append(("doorbell 50, parked", await jobs()))
        # woken with room for 16: one capped burst, a hold job, and nothing after it
        await put(ctx, dut.updates, qpn=QPN, kind=UpdateKind.WAKE, room=16)
        log.append(("wake room 16", await jobs()))
        # that burst's end without a new park: uncapped, the rest
        await put(ctx, dut.updates, qpn=QPN, kind=UpdateKind.WAKE, room=0)
        log.append(("wake at the burst's end", await jobs()))
        # a park released at once (RESUME) from 45: fetched again now, capped to 4
        await put(ctx, dut.updates, qpn=QPN, ci=45, end=50, kind=UpdateKind.RESUME, room=4)
        log.append(("resume at 45, room 4", await jobs()))
        # and again, held at the burst's end: a CUT at 49 re-fetches once more is posted
        await put(ctx, dut.updates, qpn=QPN, ci=49, end=50, kind=UpdateKind.CUT)
        log.append(("cut at 49", await jobs()))
        await put(ctx, dut.doorbells, qpn=QPN, limit=52)
        log.append(("doorbell 52", await jobs()))
        # created again: its first turn is short again (then a full quantum of 32)
        await put(ctx, dut.commit, qpn=QPN, reset=1,
                  cfg={"log_depth": 8, "state": QpState.RTS, "weight": 1, "mtu": 3})
        await jobs(4)
        await put(ctx, dut.doorbells, qpn=QPN, limit=60)
        log.append(("created again, doorbell 60", await jobs()))

    _simulate(dut, bench)
    assert log == [
        ("doorbell 40", [(0, 31, 16, 0), (16, 24, 24, 0)]),
        ("park at 10", []),
        ("doorbell 50, parked", []),
        ("wake room 16", [(10, 16, 16, 1)]),
        ("wake at the burst's end", [(26, 24, 24, 0)]),
        ("resume at 45, room 4", [(45, 4, 4, 1)]),
        ("cut at 49", []),
        ("doorbell 52", [(49, 3, 3, 0)]),
        ("created again, doorbell 60", [(0, 31, 16, 0), (16, 44, 32, 0), (48, 12, 12, 0)]),
    ], log


def test_qp_table_reach_past_a_cut():
    """A turn cut by the quantum reads past the cut what the QP's largest WQE needs
    (``max_wqebbs - 1``; 0 and over 16 count as 16): 40 WQEBBs posted, first turn 16."""
    dut = QpTable(num_qps=4, num_cqs=4, first_turn=16)
    log = []

    async def bench(ctx):
        for size in (1, 2, 5, 16, 0, 31):
            await put(ctx, dut.commit, qpn=QPN, reset=1,
                      cfg={"log_depth": 8, "state": QpState.RTS, "weight": 1, "mtu": 3, "max_wqebbs": size})
            await put(ctx, dut.doorbells, qpn=QPN, limit=40)
            log.append((size, await _jobs(ctx, dut, ("ci", "count", "own"))))

    _simulate(dut, bench)
    rest = (16, 24, 24)
    assert log == [(1, [(0, 16, 16), rest]), (2, [(0, 17, 16), rest]), (5, [(0, 20, 16), rest]),
                   (16, [(0, 31, 16), rest]), (0, [(0, 31, 16), rest]), (31, [(0, 31, 16), rest])], log


def test_qp_table_byte_turn():
    """The parser's bound on a QP's turns (``turns``): turns of at most ``byte_turn`` WQEBBs
    while it is set (here 3, under the first turn's 16), a whole turn once it is 0 again,
    and a create clears it."""
    dut = QpTable(num_qps=4, num_cqs=4, first_turn=16)
    log = []

    async def bench(ctx):
        async def jobs():
            return await _jobs(ctx, dut, ("ci", "count", "own", "byte_turn"), 60)

        cfg = {"log_depth": 8, "state": QpState.RTS, "weight": 1, "mtu": 3, "max_wqebbs": 1}
        await put(ctx, dut.commit, qpn=QPN, reset=1, cfg=cfg)
        await put(ctx, dut.turns, qpn=QPN, byte_turn=3)
        await put(ctx, dut.doorbells, qpn=QPN, limit=10)
        log.append(("bound 3, doorbell 10", await jobs()))
        await put(ctx, dut.turns, qpn=QPN, byte_turn=0)
        await put(ctx, dut.doorbells, qpn=QPN, limit=50)
        log.append(("lifted, doorbell 50", await jobs()))
        await put(ctx, dut.turns, qpn=QPN, byte_turn=5)
        await put(ctx, dut.commit, qpn=QPN, reset=1, cfg=cfg)
        await put(ctx, dut.doorbells, qpn=QPN, limit=20)
        log.append(("bound 5, created again, doorbell 20", await jobs()))

    _simulate(dut, bench)
    assert log == [
        ("bound 3, doorbell 10", [(0, 3, 3, 3), (3, 3, 3, 3), (6, 3, 3, 3), (9, 1, 1, 3)]),
        ("lifted, doorbell 50", [(10, 32, 32, 0), (42, 8, 8, 0)]),
        ("bound 5, created again, doorbell 20", [(0, 16, 16, 0), (16, 4, 4, 0)]),
    ], log


def test_qp_table_turns_ahead():
    """Byte-bound bursts ahead of the parser (``turns_ahead`` 2): QP 1 (bound 1) posts 10
    WQEBBs and gets two one-WQEBB turns; QP 2 (no bound) then posts 5 and gets nothing while
    nothing is taken; two takes (``bounded_taken``) let QP 1's next turn, QP 2's whole work
    and QP 1's turn after out, in round-robin order (two bound turns again), then the table
    waits again. With the bound off (``turns_ahead`` 0, the default) QP 1's 10 turns all go
    at once."""
    dut = QpTable(num_qps=4, num_cqs=4, first_turn=16, turns_ahead=2)
    log = []

    async def bench(ctx):
        async def jobs():
            return await _jobs(ctx, dut, ("qpn", "ci", "count", "own", "byte_turn"), 40)

        cfg = {"log_depth": 8, "state": QpState.RTS, "weight": 1, "mtu": 3, "max_wqebbs": 1}
        for q in (1, 2):
            await put(ctx, dut.commit, qpn=q, reset=1, cfg=cfg)
        await put(ctx, dut.turns, qpn=1, byte_turn=1)
        await put(ctx, dut.doorbells, qpn=1, limit=10)
        log.append(("QP 1 posts 10", await jobs()))
        await put(ctx, dut.doorbells, qpn=2, limit=5)
        log.append(("QP 2 posts 5, nothing taken", await jobs()))
        for _ in range(2):
            ctx.set(dut.bounded_taken, 1)
            await ctx.tick()
        ctx.set(dut.bounded_taken, 0)
        log.append(("two taken", await jobs()))

    _simulate(dut, bench)
    assert log == [
        ("QP 1 posts 10", [(1, 0, 1, 1, 1), (1, 1, 1, 1, 1)]),
        ("QP 2 posts 5, nothing taken", []),
        ("two taken", [(1, 2, 1, 1, 1), (2, 0, 5, 5, 0), (1, 3, 1, 1, 1)]),
    ], log
