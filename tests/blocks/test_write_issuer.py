"""RxWriteIssuer (and RxWriteSorter) in Amaranth's simulator.

The issuer is held to three rules: GPU memory ends as if every write had landed in order,
a burst never goes on one port while a burst it overlaps is in flight (AW to B) on the
other, since two ports' writes may land in any order, and never while a burst of its QP
is (so a QP's writes land in order: put-with-signal). Then the cycles: inline writes two
per cycle, whatever their addresses, when two QPs send them; one QP's one a cycle.

A write's QP is either random (``qp_of`` None: the slaves check the line rule) or the
64 KiB region of its address (the slaves check the QP rule too).
"""
import random

import pytest
from amaranth.sim import Simulator

from rtl.responder.write_issuer import RxWriteIssuer
from rtl.responder.write_sorter import RxWriteSorter


LINE = 128
PAGE = 4096


def _plan(rnd, n, lines, p_seg):
    """n writes: ('inline', addr, bytes) or ('seg', addr, length, bursts) with the bursts
    [(line, [(data, strb), ...]), ...] the payload writer would make."""
    out = []
    for _ in range(n):
        line = rnd.choice(lines)
        if rnd.random() < p_seg:
            lane = rnd.randrange(LINE)
            length = rnd.randrange(1, 600)
            addr = line * LINE + lane
            beats, bursts = [], []
            first, last = addr // LINE, (addr + length - 1) // LINE
            for ln in range(first, last + 1):
                strb = 0
                for j in range(LINE):
                    if addr <= ln * LINE + j < addr + length:
                        strb |= 1 << j
                beats.append((ln, rnd.getrandbits(8 * LINE), strb))
            cut = next((i for i, b in enumerate(beats) if i and b[0] * LINE % PAGE == 0), len(beats))
            for part in (beats[:cut], beats[cut:]):
                if part:
                    bursts.append((part[0][0], [(d, s) for _, d, s in part]))
            out.append(("seg", addr, length, bursts))
        else:
            length = rnd.randrange(1, 5)
            lane = rnd.randrange(LINE - length + 1)
            out.append(("inline", line * LINE + lane, bytes(rnd.getrandbits(8) for _ in range(length))))
    return out


def _reference(plan):
    mem = {}
    for w in plan:
        if w[0] == "fence":
            continue
        if w[0] == "inline":
            for i, v in enumerate(w[2]):
                mem[w[1] + i] = v
        else:
            for line, beats in w[3]:
                for k, (d, s) in enumerate(beats):
                    for j in range(LINE):
                        if s >> j & 1:
                            mem[(line + k) * LINE + j] = d >> (8 * j) & 0xFF
    return mem


def _region(addr):
    return (addr >> 16) & 3


def _order(w, qp):
    if w[0] == "fence":
        return {"fence": 1, "qp": qp}
    if w[0] == "inline":
        return {"inline": 1, "line": w[1] // LINE, "lane": w[1] % LINE, "length": len(w[2]),
                "data": int.from_bytes(w[2], "little"), "qp": qp}
    return {"inline": 0, "bursts": len(w[3]), "qp": qp}


async def _put_pair(ctx, stream, entries):
    """Hand one Pair transfer of one or two entries (dicts of fields) to ``stream``."""
    ctx.set(stream.p.as_value(), 0)
    ctx.set(stream.p.second, len(entries) == 2)
    for k, fields in enumerate(entries):
        for name, v in fields.items():
            ctx.set(getattr(stream.p.p[k], name), v)
    ctx.set(stream.valid, 1)
    await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)


def _run(plan, *, seed, ready=0.7, b_lat=(1, 4), pairs=0.5, stalls=0.3, limit=20000, qp_of=_region):
    """Feed ``plan`` to an issuer; returns (memory, cycles from the first order to the
    last B, B responses passed to the writer). ``qp_of(addr)`` gives a write's QP (with
    ``_region`` the slaves check the QP rule too), or None: a random QP per write."""
    rnd = random.Random(seed)
    qps = [0 if w[0] == "fence" else qp_of(w[1]) if qp_of else rnd.randrange(4) for w in plan]
    dut = RxWriteIssuer()
    mem, state = {}, {"first": None, "last": 0, "writer_b": 0, "transfers": 0}
    errors = []
    in_flight = ([], [])                     # per port: [addr, length, cycle of its B or None]
    seg_bursts = [b for w in plan if w[0] == "seg" for b in w[3]]

    async def feed(ctx):
        i = 0
        while i < len(plan):
            while rnd.random() < stalls:
                await ctx.tick()
            two = i + 1 < len(plan) and rnd.random() < pairs
            o = [_order(plan[i], qps[i])] + ([_order(plan[i + 1], qps[i + 1])] if two else [])
            if state["first"] is None:
                state["first"] = state.get("now", 0)
            await _put_pair(ctx, dut.orders, o)
            i += len(o)
            state["transfers"] += 1
        state["fed"] = True

    async def writer(ctx):
        # AW of each burst in order; W beats in order, independently
        wr = dut.writer
        aws = list(seg_bursts)
        ws = [(d, s, k == len(b[1]) - 1) for b in seg_bursts for k, (d, s) in enumerate(b[1])]
        while aws or ws:
            if aws:
                ctx.set(wr.awaddr, aws[0][0] * LINE)
                ctx.set(wr.awlen, len(aws[0][1]) - 1)
                ctx.set(wr.awvalid, 1)
            else:
                ctx.set(wr.awvalid, 0)
            if ws:
                d, s, last = ws[0]
                ctx.set(wr.wdata, d)
                ctx.set(wr.wstrb, s)
                ctx.set(wr.wlast, last)
                ctx.set(wr.wvalid, ctx.get(wr.wvalid) or rnd.random() < 0.8)
            else:
                ctx.set(wr.wvalid, 0)
            await ctx.delay(1e-12)
            aw_fire = bool(aws) and ctx.get(wr.awvalid) and ctx.get(wr.awready)
            w_fire = bool(ws) and ctx.get(wr.wvalid) and ctx.get(wr.wready)
            await ctx.tick()
            if aw_fire:
                aws.pop(0)
            if w_fire:
                ws.pop(0)
                ctx.set(wr.wvalid, 0)
        ctx.set(wr.awvalid, 0)
        ctx.set(wr.wvalid, 0)
        state["writer_done"] = True

    def slave(k, port):
        async def run(ctx):
            aws, wq, bq = [], [], []         # [addr, beats, beat] awaiting W; landed, awaiting B
            now = 0
            async for _, _, awv, awr, addr, alen, wv, wr_, data, strb, last, bv in ctx.tick().sample(
                    port.awvalid, port.awready, port.awaddr, port.awlen, port.wvalid, port.wready,
                    port.wdata, port.wstrb, port.wlast, port.bvalid):
                now += 1
                if k == 0:
                    state["now"] = now
                if bv:                       # handed over in cycle now: in flight until then
                    next(f for f in in_flight[k] if f[2] is None)[2] = now
                    bq.pop(0)
                    state["last"] = now
                if awv and awr:
                    length = (alen + 1) * LINE
                    for f in in_flight[1 - k]:
                        if (f[2] is None or f[2] >= now) and addr < f[0] + f[1] and f[0] < addr + length:
                            errors.append(f"port {k}: {addr:#x}+{length} while {f[0]:#x}+{f[1]} "
                                          f"is in flight on port {1 - k}")
                        elif qp_of is _region and (f[2] is None or f[2] >= now) and _region(addr) == _region(f[0]):
                            errors.append(f"port {k}: {addr:#x} while {f[0]:#x} of the same QP is in flight "
                                          f"on port {1 - k}")
                    in_flight[k].append([addr, length, None])
                    aws.append([addr, alen + 1, 0])
                if wv and wr_:
                    wq.append((data, strb, last))
                while aws and wq:
                    d, s, lst = wq.pop(0)
                    a = aws[0]
                    base = a[0] + a[2] * LINE
                    for j in range(LINE):
                        if s >> j & 1:
                            mem[base + j] = d >> (8 * j) & 0xFF
                    a[2] += 1
                    if lst != (a[2] == a[1]):
                        errors.append(f"port {k}: wlast={lst} on beat {a[2]} of {a[1]}")
                    if lst:
                        aws.pop(0)
                        bq.append(now + rnd.randint(*b_lat))
                ctx.set(port.awready, rnd.random() < ready)
                ctx.set(port.wready, rnd.random() < ready)
                ctx.set(port.bvalid, bool(bq) and bq[0] <= now + 1)
        return run

    async def writer_b(ctx):
        now = 0
        state["fences"] = []
        async for _, _, v, f in ctx.tick().sample(dut.writer.bvalid, dut.fence_done):
            now += 1
            state["writer_b"] += v
            if f:
                state["fences"].append(now)

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(feed, background=True)
    sim.add_testbench(writer, background=True)
    sim.add_process(slave(0, dut.p0))
    sim.add_process(slave(1, dut.p1))
    sim.add_process(writer_b)
    sim.run_until(2e-9 * limit)
    assert not errors, errors[:5]
    assert state.get("fed") and (state.get("writer_done") or not seg_bursts), "the issuer did not take every write"
    assert all(f[2] is not None for f in in_flight[0] + in_flight[1]), "bursts still in flight at the end"
    state["bursts"] = in_flight[0] + in_flight[1]
    _run.last = state
    return mem, state["last"] - state["first"], state["writer_b"], state["transfers"]


@pytest.mark.parametrize("qp_mode", ["random", "region"])
@pytest.mark.parametrize("seed", range(2))
def test_random_writes_land_in_order(seed, qp_mode):
    """Inline and payload-writer writes to a few lines (so they overlap often), random
    pairs, stalls and B latencies, random QPs (lines shared between QPs) or four QPs
    each in its own region: memory as if in order, no overlap across ports, no QP on
    both ports at once."""
    rnd = random.Random(seed)
    lines = [31, 32, 33, 40, 41, 64 + seed, 95, 96]      # around page boundaries
    if qp_mode == "region":
        lines = [ln + (q << 9) for ln in lines for q in range(4)]
    plan = _plan(rnd, 200, lines, p_seg=0.25)
    mem, _, writer_b, _ = _run(plan, seed=seed, b_lat=(1, 12), qp_of=_region if qp_mode == "region" else None)
    ref = _reference(plan)
    assert mem == ref
    assert writer_b == sum(len(w[3]) for w in plan if w[0] == "seg")


@pytest.mark.parametrize("pairs", [1.0, 0.3])
@pytest.mark.parametrize("pattern", ["one_line", "two_lines", "stride_256", "random", "one_byte"])
def test_inline_pairs_two_per_cycle(pattern, pairs):
    """Inline writes one or two per transfer from two QPs taking turns, ports always
    ready, B one cycle after the beat: a transfer a cycle for any address pattern (a
    flood of 1-byte WRITEs needs 1.01 writes a cycle, a pair whenever two frames end in
    one MAC beat)."""
    rnd = random.Random(7)
    n = 160
    lines = {"one_line": lambda i: 5, "two_lines": lambda i: 5 + (i & 1) * 9,
             "stride_256": lambda i: 2 * i, "random": lambda i: rnd.randrange(1 << 20),
             "one_byte": lambda i: 5}[pattern]
    plan = []
    for i in range(n):
        lane = 17 if pattern == "one_byte" else rnd.randrange(LINE - 4)
        plan.append(("inline", lines(i) * LINE + lane, bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 4)))))
    turns = iter(range(len(plan)))
    mem, cycles, _, transfers = _run(plan, seed=1, ready=1.0, b_lat=(1, 1), pairs=pairs, stalls=0.0,
                                     qp_of=lambda addr: next(turns) & 1)
    assert mem == _reference(plan)
    # the last B a few cycles after the last AW
    assert cycles <= transfers + 6, f"{cycles} cycles for {transfers} transfers"


def test_one_qp_one_port_at_a_time():
    """One QP's inline writes to many lines, with random write-response latencies: never
    on both ports at once (else a later write could land first), so one a cycle; two to
    one line in one transfer still merge into one beat."""
    rnd = random.Random(11)
    plan = [("inline", (5 + rnd.randrange(64)) * LINE + rnd.randrange(LINE - 4), bytes([k & 0xFF, 1]))
            for k in range(200)]
    mem, cycles, _, transfers = _run(plan, seed=2, ready=1.0, b_lat=(1, 8), pairs=1.0, stalls=0.0)
    assert mem == _reference(plan)
    assert cycles >= len(plan) - 2, f"{len(plan)} writes of one QP in {cycles} cycles: two at once somewhere"


def test_sorter_splits_commands():
    """The sorter: writer commands (payload in the segment stream, accepted) in order one
    per cycle; a verdict for every frame of the segment stream (accepted or not) on its
    last piece, in order; orders for every accepted write, inline ones dropped when not
    accepted, in pairs as they came."""
    rnd = random.Random(5)
    dut = RxWriteSorter()
    cmds = []
    for _ in range(300):
        inline = rnd.random() < 0.5
        addr = rnd.randrange(1 << 40)
        length = rnd.randint(1, 4) if inline else rnd.randint(1, 4096)
        write = int(rnd.random() < 0.8)
        # (a written SEND over receive segments comes as pieces: ``more`` on all but the last)
        more = int(not inline and write and rnd.random() < 0.2)
        cmds.append({"write": write, "addr": addr, "offset": 70, "length": length,
                     "inline": int(inline), "data": rnd.getrandbits(32), "more": more})
    got_cmds, got_orders, got_verdicts = [], [], []

    async def feed(ctx):
        i = 0
        while i < len(cmds):
            two = i + 1 < len(cmds) and rnd.random() < 0.5
            c = cmds[i:i + 1 + two]
            await _put_pair(ctx, dut.i, c)
            i += len(c)

    async def sink(ctx):
        async for _, _, cv, cr, cp, ov, or_, op, vv, vr, vp in ctx.tick().sample(
                dut.commands.valid, dut.commands.ready, dut.commands.p,
                dut.orders.valid, dut.orders.ready, dut.orders.p,
                dut.verdicts.valid, dut.verdicts.ready, dut.verdicts.p):
            if cv and cr:
                got_cmds.append((cp.addr, cp.length, cp.write))
            if ov and or_:
                for k in range(1 + op.second):
                    o = op.p[k]
                    got_orders.append((o.inline, o.bursts, o.line, o.lane, o.length, o.data))
            if vv and vr:
                got_verdicts.extend([vp.keep & 1] + ([vp.keep >> 1] if vp.second else []))
            ctx.set(dut.commands.ready, rnd.random() < 0.7)
            ctx.set(dut.orders.ready, rnd.random() < 0.7)
            ctx.set(dut.verdicts.ready, rnd.random() < 0.7)

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(feed, background=True)
    sim.add_process(sink)
    sim.run_until(2e-9 * 3000)
    assert got_cmds == [(c["addr"], c["length"], c["write"]) for c in cmds if not c["inline"] and c["write"]]
    assert got_verdicts == [c["write"] for c in cmds if not c["inline"] and not c["more"]]
    want = []
    for c in cmds:
        if not c["write"]:
            continue
        two = c["addr"] % PAGE + c["length"] > PAGE
        want.append((c["inline"], 2 if two else 1, c["addr"] // LINE, c["addr"] % LINE, c["length"] % 8, c["data"]))
    # only the fields the issuer reads for each kind
    norm = lambda o: (o[0], o[1]) if not o[0] else (o[0], o[2], o[3], o[4], o[5])
    assert [norm(o) for o in got_orders] == [norm(o) for o in want]


@pytest.mark.parametrize("seed", range(2))
def test_fences_after_their_writes(seed):
    """Fence orders (atomics) among inline and payload-writer writes, each to lines of
    its own, random pairs, stalls and B latencies up to 40 cycles: one ``fence_done``
    per fence, in order, each only once every write before its fence has had its B
    response; and the writes behind a fence are not held up by it (a fence takes no
    port)."""
    rnd = random.Random(100 + seed)
    plan, line = [], 64
    for w in _plan(rnd, 200, [0], p_seg=0.3):
        if rnd.random() < 0.15:
            plan.append(("fence",))
        # move each write to lines of its own (none shared, so each burst is one write's)
        if w[0] == "inline":
            lane = w[1] % LINE
            plan.append(("inline", line * LINE + lane, w[2]))
            line += 1
        else:
            lines = (w[1] % LINE + w[2] + LINE - 1) // LINE
            sub = _plan(random.Random(line), 1, [line], p_seg=1.0)[0]
            plan.append(sub)
            line += 8 + lines
    mem, _, _, _ = _run(plan, seed=seed, b_lat=(1, 40), qp_of=None)
    st = _run.last
    assert mem == _reference(plan)
    fences = [i for i, w in enumerate(plan) if w[0] == "fence"]
    assert len(st["fences"]) == len(fences), (len(st["fences"]), len(fences))

    def b_cycles(w):
        spans = [(w[1], len(w[2]))] if w[0] == "inline" else [(ln * LINE, len(b) * LINE) for ln, b in w[3]]
        out = []
        for addr, n in spans:
            hit = [f[2] for f in st["bursts"] if f[0] <= addr < f[0] + f[1]]
            assert hit, f"no burst for {addr:#x}"
            out += hit
        return out

    for n, (i, done) in enumerate(zip(fences, st["fences"])):
        for w in plan[:i]:
            if w[0] != "fence":
                late = [b for b in b_cycles(w) if b > done]
                assert not late, f"fence {n} done at cycle {done}, a write before it had its B at {late}"
