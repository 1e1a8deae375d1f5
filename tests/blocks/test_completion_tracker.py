"""CompletionTracker: RC completions wait for the ACK that covers them, UC ones pass;
PSN-sequence NAKs and ACK timeouts send go-back-N retransmissions.

Random completions of several QPs (PSNs wrapping at 2^24), ACKs that advance in
random steps (plus stale ones), PSN-sequence NAKs (which acknowledge every PSN before
theirs), repeated completions of WQEs sent again, random stalls on the output.
Checked: every completion whose last PSN an ACK covered comes out exactly once, in
its QP's order, never before that ACK was taken; nothing uncovered comes out; UC
completions all pass; one retransmission per NAK, from the WQE after the last released
completion; and a QP left waiting gets timer retransmissions up to its retry count.
"""
import random

from amaranth.hdl import Signal
from amaranth.sim import Simulator

from rtl.requester.completion_tracker import CompletionTracker
from spec.formats import PSN_HALF, PSN_MASK, RNR_TIMER_NS, Aeth, Syndrome
from spec.params import CLOCK_MHZ
from tests.blocks.helpers import put



def covered(psn, acked):
    return ((acked - psn) & PSN_MASK) < PSN_HALF


async def send_ack(ctx, dut, q, psn, syn):
    """One received ACK/NAK into the tracker."""
    await put(ctx, dut.acks, qpn=q, psn=psn, syndrome=syn)


async def note_packet(ctx, dut, q, psn):
    """The transmit path's note of one RC packet sent (``packets``), for a cycle."""
    ctx.set(dut.packets.valid, 1)
    ctx.set(dut.packets.qpn, q)
    ctx.set(dut.packets.psn, psn & PSN_MASK)
    await ctx.tick()
    ctx.set(dut.packets.valid, 0)


def test_completion_tracker():
    rnd = random.Random(4)
    dut = CompletionTracker(num_qps=8, num_cqs=4, pool=32)
    timeout = 3000
    start = {q: (0xFFFFF0 if q == 1 else rnd.randrange(1 << 24)) for q in range(4)}
    uc_qp = 3
    # per QP: completions (index, last psn) with PSNs advancing; a few share the PSN
    # before (NOPs: nothing sent since the previous)
    plan = {}
    for q in range(4):
        psn, items = start[q], []
        for i in range(30):
            step = rnd.choice([0, 1, 1, 2, 5])
            psn = (psn + step) & PSN_MASK
            items.append((i, (psn - 1) & PSN_MASK))
        plan[q] = items
    events = []                       # ("sent", q, index, psn) / ("ack", q, psn, syndrome)
    acked = {q: (start[q] - 1) & PSN_MASK for q in range(4)}
    pos = dict.fromkeys(range(4), 0)
    while any(pos[q] < len(plan[q]) for q in range(4)):
        q = rnd.choice([q for q in range(4) if pos[q] < len(plan[q])])
        i, psn = plan[q][pos[q]]
        pos[q] += 1
        events.append(("sent", q, i, psn))
        if q != uc_qp and rnd.random() < 0.4 and pos[q] < 24:
            # acknowledge up to some PSN already sent on this QP
            target = plan[q][rnd.randrange(pos[q])][1]
            events.append(("ack", q, target, Aeth.ACK))
        if q != uc_qp and pos[q] % 6 == 0 and pos[q] <= 24:
            # a responder acknowledges everything eventually: the pool (32 entries: 8 per QP) never
            # needs more than 6 (a full queue stalls the transmit path until ACKs come)
            events.append(("ack", q, psn, Aeth.ACK))
        if q != uc_qp and rnd.random() < 0.08 and pos[q] < 24:
            # a PSN-sequence NAK for a PSN just after one already sent
            events.append(("ack", q, (plan[q][rnd.randrange(pos[q])][1] + 1) & PSN_MASK, Aeth.NAK_PSN_SEQ))
        if q != uc_qp and rnd.random() < 0.05 and pos[q] > 1:
            events.append(("sent", q, *plan[q][pos[q] - 2]))               # a WQE sent again
    for q in range(3):
        events.append(("ack", q, (plan[q][-3][1]), Aeth.ACK))                # the last ones stay waiting

    out, ack_taken, rtx = [], [], []
    naks, timeouts = [0], [0]

    sent_count = [0]
    sends = [e for e in events if e[0] == "sent"]
    acks_plan, n = [], 0              # each ACK with the number of completions sent before it
    for e in events:
        if e[0] == "sent":
            n += 1
        else:
            acks_plan.append((n, e))

    async def drive_sent(ctx):
        for q in range(4):
            await put(ctx, dut.commit, qpn=q, start_psn=start[q], timeout=timeout, retry_cnt=2)
        for _, q, i, psn in sends:
            while rnd.random() < 0.3:
                await ctx.tick()
            await put(ctx, dut.sent, qpn=q, index=i, next_index=i + 1, psn=psn, uc=q == uc_qp)
            sent_count[0] += 1

    async def drive_acks(ctx):
        # the ACKs come from the wire, independent of the transmit path (which may stall)
        for need, (_, q, psn, syn) in acks_plan:
            while sent_count[0] < need or rnd.random() < 0.3:
                await ctx.tick()
            await send_ack(ctx, dut, q, psn, syn)

    async def sink(ctx):
        cycle = 0
        ctx.set(dut.retransmit.ready, 1)
        async for _, _, v, r, p, av, ar, ap, nk, rv, rp, to in ctx.tick().sample(
                dut.completions.valid, dut.completions.ready, dut.completions.p,
                dut.acks.valid, dut.acks.ready, dut.acks.p, dut.naks, dut.retransmit.valid, dut.retransmit.p,
                dut.timeouts):
            cycle += 1
            if v and r:
                out.append((cycle, p.qpn, p.index, p.psn))
            if av and ar:
                ack_taken.append((cycle, ap.qpn, ap.psn, ap.syndrome))
            if rv:
                rtx.append((cycle, rp.qpn, rp.index, rp.psn, rp.skip_to, rp.fail, rp.syndrome))
            naks[0] += nk
            timeouts[0] += to
            ctx.set(dut.completions.ready, rnd.random() < 0.7)

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(drive_sent)
    sim.add_testbench(drive_acks)
    sim.add_process(sink)
    sim.run_until(2e-9 * 20000)

    for q in range(4):
        got = [(i, psn) for _, qq, i, psn in out if qq == q]
        if q == uc_qp:
            assert got == plan[q]
            continue
        # an ACK acknowledges its PSN, a PSN-sequence NAK every PSN before its PSN
        acks = [(c, psn if syn == Aeth.ACK else (psn - 1) & PSN_MASK) for c, qq, psn, syn in ack_taken if qq == q]
        best = (start[q] - 1) & PSN_MASK
        for _, psn in acks:
            if not covered(psn, best):
                best = psn
        want = [(i, psn) for i, psn in plan[q] if covered(psn, best)]
        assert got == want, q
        # one retransmission per NAK, skipping to its PSN, from the WQE after the last
        # completion released before it; then timer retransmissions for what still waits
        nak_cycles = [(c, psn) for c, qq, psn, syn in ack_taken if qq == q and syn == Aeth.NAK_PSN_SEQ]
        mine = [r for r in rtx if r[1] == q]
        assert [r[4] for r in mine[:len(nak_cycles)]] == [psn for _, psn in nak_cycles], q
        for (c, _), r in zip(nak_cycles, mine):
            released = [(i, psn) for cc, qq, i, psn in out if qq == q and cc <= r[0]]
            want_index = released[-1][0] + 1 if released else 0
            want_psn = (released[-1][1] + 1) & PSN_MASK if released else start[q]
            assert (r[2], r[3]) == (want_index, want_psn), (q, r, released[-1:] )
        late = mine[len(nak_cycles):]
        # retry count 2: two timer retransmissions, then the third timeout fails the QP:
        # a failure walk from the first unacknowledged PSN with TRANSPORT_RETRY_EXC_ERR
        assert [r[5] for r in late] == [0, 0, 1], (q, late)
        assert all(r[4] == (best + 1) & PSN_MASK for r in late), (q, late)
        assert late[2][6] == Syndrome.TRANSPORT_RETRY_EXC_ERR, late
        assert len(want) < len(plan[q])          # some stayed waiting
        # never before an ACK covering it was taken (unless nothing needed acknowledging)
        for c, qq, i, psn in out:
            if qq == q and not covered(psn, (start[q] - 1) & PSN_MASK):
                assert any(ac < c and covered(psn, ap) for ac, ap in acks), (q, i, c)
    assert naks[0] == sum(1 for e in events if e[0] == "ack" and e[3] == Aeth.NAK_PSN_SEQ)
    assert timeouts[0] == 3 * 3                    # 3 RC QPs: 2 retries each, then the third gives up


def test_completion_tracker_failure():
    """A NAK remote-access error: the completions before its PSN are released, the rest
    of the queue is dropped, one failure walk (fail, REMOTE_ACCESS_ERR, skip to the NAK's
    PSN) goes to the parser; afterwards the QP's error completions pass in order, its
    other completions are dropped, ACKs and NAKs change nothing, and other QPs carry on."""
    dut = CompletionTracker(num_qps=4, num_cqs=4, pool=32)
    out, rtx = [], []
    base = 100

    async def drive(ctx):
        ctx.set(dut.retransmit.ready, 1)
        ctx.set(dut.completions.ready, 1)
        for q in (0, 1):
            await put(ctx, dut.commit, qpn=q, start_psn=base, timeout=1 << 20, retry_cnt=3)

        async def sent(q, i, psn, error=0, syndrome=0):
            await put(ctx, dut.sent, qpn=q, index=i, next_index=i + 1, psn=psn, error=error, syndrome=syndrome)

        for i in range(6):                      # WQE i: PSNs base+2i, base+2i+1
            for q in (0, 1):
                await sent(q, i, base + 2 * i + 1)
        await send_ack(ctx, dut, 0, base + 6, 0x62)            # NAK remote access at PSN base+6 (WQE 3)
        await ctx.tick().repeat(10)
        await sent(0, 6, base + 13)             # a WQE that was in the transmit path: dropped
        for i, syn in ((3, 0x13), (4, 0x05), (5, 0x05), (6, 0x05)):
            await sent(0, i, base + 2 * i, 1, syn)   # the walk's error completions
        await send_ack(ctx, dut, 0, base + 20, Aeth.ACK)           # changes nothing on a failed QP
        await send_ack(ctx, dut, 0, base + 8, Aeth.NAK_PSN_SEQ)
        await send_ack(ctx, dut, 1, base + 11, Aeth.ACK)           # QP 1 carries on
        await ctx.tick().repeat(20)

    async def sink(ctx):
        async for _, _, v, r, p, rv, rp in ctx.tick().sample(
                dut.completions.valid, dut.completions.ready, dut.completions.p, dut.retransmit.valid,
                dut.retransmit.p):
            if v and r:
                out.append((p.qpn, p.index, p.error, p.syndrome))
            if rv:
                rtx.append((p.qpn, rp.qpn, rp.index, rp.psn, rp.skip_to, rp.fail, rp.syndrome))

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(drive)
    sim.add_process(sink)
    sim.run_until(2e-9 * 600)
    assert [o for o in out if o[0] == 0] == [(0, i, 0, 0) for i in range(3)] + \
        [(0, 3, 1, 0x13), (0, 4, 1, 0x05), (0, 5, 1, 0x05), (0, 6, 1, 0x05)], out
    assert [o for o in out if o[0] == 1] == [(1, i, 0, 0) for i in range(6)], out
    # one failure walk: restart point WQE 3 (PSN base+6), skip to base+6
    assert [r[1:] for r in rtx] == [(0, 3, base + 6, base + 6, 1, 0x13)], rtx


def test_completion_tracker_timer_without_completions():
    """The ACK timer runs while packets wait for their ACK, signaled or not.

    QP 0: ten packets noted, no completion (unsignaled WQEs), an ACK for the first six,
    then silence: timer retransmissions skipping to the seventh PSN, from the restart
    point (nothing released: WQE 0 and the start PSN), each at least a timeout after
    the one before, the third a failure walk (TRANSPORT_RETRY_EXC_ERR). QP 1: packets
    all acknowledged: no timeout. QP 2: packets acknowledged, then quiet for longer than
    a timeout, then one more packet: its timer starts at that send, not at the old ACK
    (no early timeout); the retransmission skips to the new PSN. During the quiet time a
    flood of stale ACKs for QP 3 keeps the scanner away, so only the ACK itself can have
    stopped QP 2's timer."""
    dut = CompletionTracker(num_qps=4, num_cqs=4, pool=32)
    timeout, base = 400, 0xFFFFFC             # PSNs wrap at 2^24
    rtx, marks = [], {}

    async def drive(ctx):
        ctx.set(dut.retransmit.ready, 1)
        ctx.set(dut.completions.ready, 1)
        for q in range(4):
            await put(ctx, dut.commit, qpn=q, start_psn=base, timeout=timeout, retry_cnt=2)
        for k in range(10):
            for q in range(3):
                await note_packet(ctx, dut, q, base + k)
        await send_ack(ctx, dut, 0, (base + 5) & PSN_MASK, Aeth.ACK)
        await send_ack(ctx, dut, 1, (base + 9) & PSN_MASK, Aeth.ACK)
        await send_ack(ctx, dut, 2, (base + 9) & PSN_MASK, Aeth.ACK)
        marks["acks"] = ctx.get(cycle)
        ctx.set(dut.acks.p.qpn, 3)
        ctx.set(dut.acks.p.psn, (base - 1) & PSN_MASK)      # nothing new: changes nothing
        ctx.set(dut.acks.p.syndrome, Aeth.ACK)
        ctx.set(dut.acks.valid, 1)
        await ctx.tick().repeat(3 * timeout)
        ctx.set(dut.acks.valid, 0)
        marks["late_send"] = ctx.get(cycle)
        await note_packet(ctx, dut, 2, base + 10)

    cycle = Signal(32)

    async def sink(ctx):
        async for _, _, rv, rp, n in ctx.tick().sample(dut.retransmit.valid, dut.retransmit.p, cycle):
            if rv:
                rtx.append((n, rp.qpn, rp.index, rp.psn, rp.skip_to, rp.fail, rp.syndrome))
            ctx.set(cycle, n + 1)

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(drive)
    sim.add_process(sink)
    sim.run_until(2e-9 * 12 * timeout)
    q0 = [r for r in rtx if r[1] == 0]
    assert [r[2:6] for r in q0] == [(0, base, (base + 6) & PSN_MASK, 0)] * 2 + \
        [(0, base, (base + 6) & PSN_MASK, 1)] and q0[2][6] == Syndrome.TRANSPORT_RETRY_EXC_ERR, q0
    # (the marks are taken as the testbench returns from a handshake: a cycle or two of slack)
    starts = [marks["acks"]] + [r[0] for r in q0]
    assert all(b - a >= timeout - 2 for a, b in zip(starts, starts[1:])), (starts, q0)
    assert not [r for r in rtx if r[1] == 1], rtx
    q2 = [r for r in rtx if r[1] == 2]
    assert q2 and q2[0][4] == (base + 10) & PSN_MASK, q2
    assert q2[0][0] - marks["late_send"] >= timeout - 2, (marks, q2)


def test_completion_tracker_rnr():
    """RNR NAKs: QP 0 (rnr_retry 2) has five packets and their completions out; an RNR
    NAK at the third releases the first two completions and, no earlier than its timer
    (code 1: 10 us, 5,000 cycles), sends a retransmission skipping to it; the same NAK
    again, and a sequence NAK at its PSN, during the wait change nothing; two more RNR
    NAKs at that PSN: one more retransmission, then the failure walk with
    RNR_RETRY_EXC_ERR. QP 1 (rnr_retry 7): three RNR NAKs, three retransmissions, no
    failure, then its ACK releases everything (that 7 has no limit, nine RNR NAKs, is
    the system test ``rnr_retry_forever``: 5,000 cycles a wait are minutes here). Without the wait the
    retransmissions come at once; without the count QP 0 never fails."""
    dut = CompletionTracker(num_qps=4, num_cqs=4, pool=32)
    base, wait = 0xFFFFFE, RNR_TIMER_NS[1] * CLOCK_MHZ // 1000
    rtx, out, naks = [], [], {0: [], 1: []}
    cycle = Signal(32)

    async def rnr(ctx, q, psn):
        naks[q].append(ctx.get(cycle))
        await send_ack(ctx, dut, q, psn & PSN_MASK, Aeth.RNR_NAK | 1)

    async def drive(ctx):
        ctx.set(dut.retransmit.ready, 1)
        ctx.set(dut.completions.ready, 1)
        await put(ctx, dut.commit, qpn=0, start_psn=base, timeout=1 << 24, retry_cnt=7, rnr_retry=2)
        await put(ctx, dut.commit, qpn=1, start_psn=base, timeout=1 << 24, retry_cnt=7, rnr_retry=7)
        for k in range(5):
            for q in (0, 1):
                await note_packet(ctx, dut, q, base + k)
                await put(ctx, dut.sent, qpn=q, index=k, next_index=k + 1, psn=(base + k) & PSN_MASK)
        await rnr(ctx, 0, base + 2)
        await rnr(ctx, 1, base)
        await ctx.tick().repeat(100)
        await rnr(ctx, 0, base + 2)                            # the same again: nothing
        await send_ack(ctx, dut, 0, (base + 2) & PSN_MASK, Aeth.NAK_PSN_SEQ)   # nothing either
        seen = {0: 0, 1: 0}
        while seen[0] < 2 or seen[1] < 3:
            await ctx.tick()
            for q in (0, 1):
                mine = [r for r in rtx if r[1] == q and not r[5]]
                if len(mine) > seen[q]:
                    seen[q] = len(mine)
                    await ctx.tick().repeat(50)
                    await note_packet(ctx, dut, q, base + 2 * (1 - q))       # the resend leaves ...
                    if q == 0 or seen[1] < 3:
                        await rnr(ctx, q, base + 2 * (1 - q))    # ... and finds no receive WQE again
        await ctx.tick().repeat(wait + 200)
        await send_ack(ctx, dut, 1, (base + 4) & PSN_MASK, Aeth.ACK)
        await ctx.tick().repeat(200)

    async def sink(ctx):
        async for _, _, v, p, rv, rp, n in ctx.tick().sample(dut.completions.valid, dut.completions.p,
                                                             dut.retransmit.valid, dut.retransmit.p, cycle):
            if v:
                out.append((p.qpn, p.index, p.error, p.syndrome))
            if rv:
                rtx.append((n, rp.qpn, rp.index, rp.psn, rp.skip_to, rp.fail, rp.syndrome))
            ctx.set(cycle, n + 1)

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(drive)
    sim.add_process(sink)
    sim.run_until(2e-9 * 6 * wait)
    q0 = [r for r in rtx if r[1] == 0]
    s2 = (base + 2) & PSN_MASK
    assert [r[2:6] for r in q0] == [(2, s2, s2, 0), (2, s2, s2, 0), (2, s2, s2, 1)], q0
    assert q0[2][6] == Syndrome.RNR_RETRY_EXC_ERR, q0      # (the syndrome means something with fail only)
    # each resend at least the timer after its NAK (the repeated first NAK did not restart it)
    assert q0[0][0] - naks[0][0] >= wait and q0[0][0] - naks[0][1] < wait, (naks[0], q0)
    assert q0[1][0] - naks[0][2] >= wait, (naks[0], q0)
    assert [o for o in out if o[0] == 0][:2] == [(0, 0, 0, 0), (0, 1, 0, 0)], out
    q1 = [r for r in rtx if r[1] == 1]
    assert len(q1) == 3 and all(r[2:6] == (0, base, base, 0) for r in q1), q1
    assert all(b[0] - a >= wait for a, b in zip(naks[1], q1)), (naks[1], q1)
    assert [o for o in out if o[0] == 1] == [(1, k, 0, 0) for k in range(5)], out


def test_completion_tracker_shared_pool():
    """Every QP's waiting completions share one pool (32 entries here).

    QP 0 fills 30 entries (more than a fair share, more than one drain's budget of 16);
    QP 1 takes the last 2 and its third waits (a full pool holds the transmit path)
    until one ACK of QP 0 releases all 30, in order (the scan finishes what the drain's
    budget cut). Then, three times: QP 2 fills the pool, a NAK remote access fails it
    (nothing released: its entries are dead), and a create of QP 2 follows; the freed
    entries must be reusable: QP 3 then fills all 32 and an ACK releases them all. A
    pool that lost the dead entries would stall QP 3 for good."""
    dut = CompletionTracker(num_qps=4, num_cqs=4, pool=32)
    out, taken = [], {}
    cycle = Signal(32)

    async def drive(ctx):
        ctx.set(dut.retransmit.ready, 1)
        for q in range(4):
            await put(ctx, dut.commit, qpn=q, start_psn=0, timeout=1 << 30, retry_cnt=3)

        async def sent(q, i):
            await put(ctx, dut.sent, qpn=q, index=i, next_index=i + 1, psn=i)
            taken[(q, i)] = ctx.get(cycle)

        for i in range(30):
            await sent(0, i)
        await sent(1, 0)
        await sent(1, 1)

        # QP 1's third waits for the ACK (the handshake by hand: the ACK goes in from here)
        ctx.set(dut.sent.p.as_value(), 0)
        ctx.set(dut.sent.p.qpn, 1)
        ctx.set(dut.sent.p.index, 2)
        ctx.set(dut.sent.p.next_index, 3)
        ctx.set(dut.sent.p.psn, 2)
        ctx.set(dut.sent.valid, 1)
        for _ in range(200):
            await ctx.tick()
            assert not ctx.get(dut.sent.ready), "the pool was full: QP 1's third must wait"
        await send_ack(ctx, dut, 0, 29, Aeth.ACK)
        taken["ack0"] = ctx.get(cycle)
        await ctx.tick().until(dut.sent.ready)
        ctx.set(dut.sent.valid, 0)
        taken[(1, 2)] = ctx.get(cycle)
        await ctx.tick().repeat(100)
        for rnd_ in range(3):
            for i in range(29):
                await sent(2, i)
            await send_ack(ctx, dut, 2, 0, 0x62)           # NAK remote access at PSN 0
            await ctx.tick().repeat(10)
            await put(ctx, dut.commit, qpn=2, start_psn=0, timeout=1 << 30, retry_cnt=3)
            await ctx.tick().repeat(60)
        await send_ack(ctx, dut, 1, 2, Aeth.ACK)
        await ctx.tick().repeat(20)
        for i in range(32):
            await sent(3, i)
        await send_ack(ctx, dut, 3, 31, Aeth.ACK)
        await ctx.tick().repeat(100)
        taken["done"] = 1

    async def sink(ctx):
        ctx.set(dut.completions.ready, 1)
        async for _, _, v, p, n in ctx.tick().sample(dut.completions.valid, dut.completions.p, cycle):
            if v:
                out.append((p.qpn, p.index, n))
            ctx.set(cycle, n + 1)

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(drive)
    sim.add_process(sink)
    sim.run_until(2e-9 * 6000)
    assert taken.get("done"), "the pool stalled for good"
    assert [(q, i) for q, i, _ in out if q == 0] == [(0, i) for i in range(30)], out
    assert all(n > taken["ack0"] for q, _, n in out if q == 0)
    assert taken[(1, 2)] >= taken["ack0"]
    assert [(q, i) for q, i, _ in out if q == 1] == [(1, 0), (1, 1), (1, 2)], out
    assert not [o for o in out if o[0] == 2], "a failed QP's entries are never released"
    assert [(q, i) for q, i, _ in out if q == 3] == [(3, i) for i in range(32)], out
