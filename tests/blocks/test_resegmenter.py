"""RxResegmenter in Amaranth's simulator: received frames in the quarter format and their
keep bits in, the kept frames out in the 64-byte segment format, byte for byte, at the
wire rate."""
import random

import pytest
from amaranth.sim import Simulator

from rtl.common.rx_beat import RxBeat
from rtl.responder.resegmenter import RxResegmenter
from spec.params import WIRE_BYTES_PER_CYCLE, wire_bytes
from tb.rx_quarters import BEAT, QUARTER, QUARTERS, pack

SEG = 64
LAYOUT = RxBeat()


# ---- reference ------------------------------------------------------------------------------

def _positions(beats):
    """Per frame in order: (start beat, start quarter, end beat)."""
    starts, ends = [], []
    for i, b in enumerate(beats):
        for q in range(QUARTERS):
            if b.sop >> q & 1:
                starts.append((i, q))
            if b.eop >> q & 1:
                ends.append(i)
    return [(sb, sq, eb) for (sb, sq), eb in zip(starts, ends)]


def placement(frames, keeps, beats):
    """Where the kept frames go: per kept frame (output byte offset, start quarter, whether
    it starts in the input beat in which the kept frame before it ends in lanes 0..63),
    and the output bytes used.

    A kept frame goes to lane 64 of the previous kept frame's last beat when that frame
    ends in lanes 0..63, the new one is longer than 64 bytes and starts in the input beat
    in which the previous one ends; else to lane 0 of a new beat."""
    placed = []
    pos = 0                      # first free output byte (a multiple of 64)
    lo_end = None                # input beat in which the last kept frame ended in lanes 0..63
    for f, k, (sb, sq, eb) in zip(frames, keeps, _positions(beats)):
        if not k:
            continue
        behind = lo_end == sb
        start = pos if behind and len(f) > SEG else -(-pos // BEAT) * BEAT
        placed.append((start, sq, behind))
        end = start + len(f)
        lo_end = eb if (end - 1) % BEAT < SEG else None
        pos = -(-end // SEG) * SEG
    return placed, pos


def reference(frames, keeps, beats):
    """The output beats the block must produce: (data, lane mask, last, sop_hi)."""
    placed, used = placement(frames, keeps, beats)
    out = [[bytearray(BEAT), 0, 0, 0] for _ in range(-(-used // BEAT))]
    for (start, _, _), f in zip(placed, (f for f, k in zip(frames, keeps) if k)):
        for i, byte in enumerate(f):
            b, lane = divmod(start + i, BEAT)
            out[b][0][lane] = byte
            out[b][1] |= 1 << lane
        out[(start + len(f) - 1) // BEAT][2] = 1
        if start % BEAT == SEG:
            out[start // BEAT][3] = 1
    return [(int.from_bytes(d, "little"), mask, last, hi) for d, mask, last, hi in out]


def recover(out, lengths):
    """The frames in the output beats read as the payload writer reads them, knowing each
    frame's length: a frame starts at lane 0, or at lane 64 of the beat with ``sop_hi``
    that ends the one before; ``last`` must be set exactly in its last beat."""
    frames, b, lane = [], 0, 0
    for n in lengths:
        first = b
        raw = bytearray()
        while True:
            assert b < len(out), f"output ends inside a frame of {n} bytes"
            data, last, sop_hi = out[b]
            part = data.to_bytes(BEAT, "little")[lane:]
            take = min(n - len(raw), len(part))
            raw += part[:take]
            done = len(raw) == n
            if lane == 0:
                assert last == done, f"beat {b}: last={last} with {n - len(raw)} bytes of the frame to come"
            else:
                assert b == first and not done, f"beat {b}: a frame at lane 64 must run into the next beat"
            if done:
                break
            b, lane = b + 1, 0
        frames.append(bytes(raw))
        end_lane = (lane + take - 1) % BEAT
        if end_lane < SEG and sop_hi:
            lane = SEG
        else:
            assert not sop_hi or lane != 0, f"beat {b}: sop_hi behind a frame ending in lanes 64..127"
            b, lane = b + 1, 0
    assert b == len(out), f"{len(out) - b} output beats after the last frame"
    return frames


# ---- simulation -----------------------------------------------------------------------------

class Run:
    """One stream: frames with their keep bits, the input beats, the keep transfers."""
    def __init__(self, rnd, frames, keeps):
        self.frames, self.keeps = [bytes(f) for f in frames], list(keeps)
        self.qbeats = pack(self.frames)
        self.beats = []
        for qb in self.qbeats:
            garbage = rnd.getrandbits(8 * BEAT)       # idle lanes carry anything
            lanes = 0
            for lane in range(BEAT):
                if qb.keep >> lane & 1:
                    lanes |= 0xFF << (8 * lane)
            ebytes = [qb.ebytes(q) for q in range(QUARTERS)]
            self.beats.append(LAYOUT.const({
                "data": qb.data | (garbage & ~lanes), "sop": qb.sop, "eop": qb.eop,
                "ebytes": ebytes, "icrc_ok": qb.eop}))
        # one keep transfer per beat in which frames end, in frame order
        self.keep_xfers, k = {}, 0
        for i, qb in enumerate(self.qbeats):
            if qb.eop:
                n = len(qb.ended)
                bits = self.keeps[k] | (self.keeps[k + 1] << 1 if n == 2 else 0)
                self.keep_xfers[i] = (int(n == 2), bits)
                k += n
        assert k == len(self.frames)
        self.expect = reference(self.frames, self.keeps, self.qbeats)
        self.placed, _ = placement(self.frames, self.keeps, self.qbeats)
        self.out, self.taken = [], []
        self.first_offer = self.last_out = None


def simulate(runs, *, p_arrive, p_valid, p_keep, p_ready, keep_delay, seed, patience=500):
    """Feed the runs one after the other (each drains before the next starts)."""
    rnd = random.Random(seed)
    dut = RxResegmenter()

    async def bench(ctx):
        cycle = moved = 0               # moved: the last cycle with a transfer
        held = None                      # output beat seen with valid and not taken
        for run in runs:
            fifo, arrived = [], 0
            keep_at, keep_next = {}, 0   # beat index -> cycle its keep transfer may be offered
            keep_order = sorted(run.keep_xfers)
            beat_on = keep_on = False
            last_keep_at = 0
            while True:
                while arrived < len(run.beats) and (p_arrive is None or rnd.random() < p_arrive):
                    fifo.append(arrived)
                    if arrived in run.keep_xfers:  # a few cycles after the frame's last beat
                        last_keep_at = max(last_keep_at, cycle + rnd.randrange(0, keep_delay + 1))
                        keep_at[arrived] = last_keep_at
                    arrived += 1
                    if p_arrive is not None:
                        break
                if not beat_on and fifo and rnd.random() < p_valid:
                    beat_on = True
                    ctx.set(dut.beats.p, run.beats[fifo[0]])
                    if run.first_offer is None:
                        run.first_offer = cycle
                ctx.set(dut.beats.valid, beat_on)
                if (not keep_on and keep_next < len(keep_order)
                        and keep_at.get(keep_order[keep_next], 1 << 60) <= cycle and rnd.random() < p_keep):
                    keep_on = True
                    second, bits = run.keep_xfers[keep_order[keep_next]]
                    ctx.set(dut.keep.p.second, second)
                    ctx.set(dut.keep.p.keep, bits)
                ctx.set(dut.keep.valid, keep_on)
                ready = rnd.random() < p_ready
                ctx.set(dut.o.ready, ready)
                await ctx.delay(1e-12)

                if beat_on and ctx.get(dut.beats.ready):
                    moved = cycle
                    run.taken.append(cycle)
                    fifo.pop(0)
                    beat_on = False
                if keep_on and ctx.get(dut.keep.ready):
                    moved = cycle
                    keep_on = False
                    keep_next += 1
                if ctx.get(dut.o.valid):
                    beat = (ctx.get(dut.o.p.data), ctx.get(dut.o.p.last), ctx.get(dut.o.p.sop_hi))
                    assert held is None or beat == held, f"cycle {cycle}: output changed before it was taken"
                    held = None
                    if ready:
                        moved = cycle
                        run.out.append(beat)
                        run.last_out = cycle
                    else:
                        held = beat
                else:
                    assert held is None, f"cycle {cycle}: valid dropped before the beat was taken"
                await ctx.tick()
                cycle += 1
                if (len(run.taken) == len(run.beats) and keep_next == len(keep_order)
                        and len(run.out) >= len(run.expect) and not ctx.get(dut.o.valid)):
                    break
                assert cycle - moved < patience, (f"stuck: {len(run.taken)}/{len(run.beats)} beats, "
                                            f"{keep_next}/{len(keep_order)} keep transfers, "
                                            f"{len(run.out)}/{len(run.expect)} output beats")
            ctx.set(dut.beats.valid, 0)
            ctx.set(dut.keep.valid, 0)
            for _ in range(3):           # nothing more comes out
                await ctx.delay(1e-12)
                assert not ctx.get(dut.o.valid), "an output beat too many"
                await ctx.tick()
                cycle += 1

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(bench)
    sim.run()


def check(run):
    assert len(run.out) == len(run.expect), f"{len(run.out)} output beats, expected {len(run.expect)}"
    for i, ((data, last, sop_hi), (e_data, mask, e_last, e_hi)) in enumerate(zip(run.out, run.expect)):
        assert (last, sop_hi) == (e_last, e_hi), f"beat {i}: last/sop_hi {last},{sop_hi}, expected {e_last},{e_hi}"
        lanes = 0
        for lane in range(BEAT):
            if mask >> lane & 1:
                lanes |= 0xFF << (8 * lane)
        if data & lanes != e_data:
            bad = next(l for l in range(BEAT) if mask >> l & 1 and (data ^ e_data) >> (8 * l) & 0xFF)
            raise AssertionError(f"beat {i}: lane {bad} holds {data >> 8 * bad & 0xFF:#04x}, "
                                 f"expected {e_data >> 8 * bad & 0xFF:#04x}")
    kept = [f for f, k in zip(run.frames, run.keeps) if k]
    assert recover(run.out, [len(f) for f in kept]) == kept


# ---- workloads ------------------------------------------------------------------------------

def _frames(rnd, n, lo=33, hi=600, jumbo=0.03, short=0.15):
    """n random frames: sizes lo..hi, some of them 33..64 bytes (``short``), some 4000..9000."""
    def size():
        r = rnd.random()
        if r < jumbo:
            return rnd.randrange(4000, 9001)
        if r < jumbo + short:
            return rnd.randrange(max(lo, QUARTER + 1), min(hi, SEG) + 1)
        return rnd.randrange(lo, hi + 1)
    sizes = [size() for _ in range(n)]
    return [bytes(rnd.getrandbits(8) for _ in range(s)) for s in sizes]


def _keeps(rnd, n):
    """Random keep bits with runs of all kept and all dropped."""
    keeps = []
    while len(keeps) < n:
        kind = rnd.randrange(4)
        run = rnd.randrange(1, 12)
        if kind == 0:
            keeps += [1] * run
        elif kind == 1:
            keeps += [0] * run
        else:
            keeps += [int(rnd.random() < 0.6) for _ in range(run)]
    return keeps[:n]


def _coverage(runs):
    """Counts of the cases that matter: lane-64 starts by start quarter (3: the lower half
    waits a beat), and frames of 33..64 bytes in quarter 3 behind a frame ending in lanes
    0..63 (the lower half waits a beat and goes alone)."""
    hi_q = {1: 0, 2: 0, 3: 0}
    short_q3 = 0
    for run in runs:
        kept = [f for f, k in zip(run.frames, run.keeps) if k]
        for f, (start, sq, behind) in zip(kept, run.placed):
            if start % BEAT == SEG:
                hi_q[sq] += 1
            elif behind and sq == 3 and QUARTER < len(f) <= SEG:
                short_q3 += 1
    return hi_q, short_q3


@pytest.mark.parametrize("seed,stall", [(1, 0.0), (2, 0.3), (3, 0.6)],
                         ids=["no-stalls", "light-stalls", "heavy-stalls"])
def test_frames_pass_exactly(seed, stall):
    """Random frames (33..600 bytes, some jumbo) and keep bits; keep transfers a few cycles
    after their beats; random back-pressure: the kept frames come out as the reference packs them."""
    rnd = random.Random(seed)
    runs = []
    for _ in range(3):
        frames = _frames(rnd, 150)
        runs.append(Run(rnd, frames, _keeps(rnd, len(frames))))
    go = 1 - stall
    simulate(runs, p_arrive=0.9, p_valid=go, p_keep=go, p_ready=go, keep_delay=8, seed=seed)
    for run in runs:
        check(run)
    hi_q, short_q3 = _coverage(runs)
    assert min(hi_q.values()) >= 5, hi_q
    assert short_q3 >= 2


def test_short_frames():
    """Frames of 1..100 bytes (one-quarter frames and the empty quarter behind them)."""
    rnd = random.Random(4)
    runs = []
    for _ in range(2):
        frames = _frames(rnd, 200, lo=1, hi=100, jumbo=0)
        runs.append(Run(rnd, frames, _keeps(rnd, len(frames))))
    runs.append(Run(rnd, _frames(rnd, 200, lo=1, hi=100, jumbo=0), [1] * 200))
    simulate(runs, p_arrive=0.8, p_valid=0.8, p_keep=0.8, p_ready=0.7, keep_delay=5, seed=4)
    for run in runs:
        check(run)


def test_three_output_beats_from_one_beat():
    """Directed: a beat that completes three output beats (the one waiting from the beat
    before and two short frames; a beat holds at most two frame ends) takes three cycles."""
    rnd = random.Random(7)
    # 150: quarters 0..4 of beats 0..1; 50: beat 1 quarters 1..2 (ends in lanes 0..63);
    # 50: beat 1 quarter 3 (its length shows in beat 2, so the 50 before waits); 50: beat 2
    # quarters 1..2; 300 dropped: beat 2 quarter 3 on; 100 behind it
    sizes = [150, 50, 50, 50, 300, 100]
    frames = [bytes(rnd.getrandbits(8) for _ in range(n)) for n in sizes]
    run = Run(rnd, frames, [1, 1, 1, 1, 0, 1])
    assert [p[:2] for p in _positions(run.qbeats)] == [(0, 0), (1, 1), (1, 3), (2, 1), (2, 3), (5, 1)]
    simulate([run], p_arrive=None, p_valid=1.0, p_keep=1.0, p_ready=1.0, keep_delay=0, seed=7)
    check(run)
    t = run.taken
    assert [b - a for a, b in zip(t, t[1:])] == [1, 3, 1, 1, 1, 1], t      # beat 2: three cycles


def test_wire_rate():
    """All kept, o.ready high: N frames of each size 76..200 back to back take no more
    cycles than their wire time (plus pipeline latency)."""
    rnd = random.Random(5)
    n_frames = 20
    runs = []
    for size in range(76, 201):
        frames = [bytes(rnd.getrandbits(8) for _ in range(size)) for _ in range(n_frames)]
        runs.append(Run(rnd, frames, [1] * n_frames))
    simulate(runs, p_arrive=None, p_valid=1.0, p_keep=1.0, p_ready=1.0, keep_delay=0, seed=5)
    slow = []
    for run in runs:
        check(run)
        size = len(run.frames[0])
        wire = n_frames * wire_bytes(size) / WIRE_BYTES_PER_CYCLE
        cycles = run.last_out - run.first_offer + 1
        if cycles > wire + 3:
            slow.append((size, cycles, wire))
    assert not slow, f"slower than the wire (size, cycles, wire cycles): {slow}"


def test_dropped_rate():
    """All dropped: one cycle per input beat, nothing out."""
    rnd = random.Random(6)
    frames = _frames(rnd, 120)
    runs = [Run(rnd, frames, [0] * len(frames))]
    simulate(runs, p_arrive=None, p_valid=1.0, p_keep=1.0, p_ready=1.0, keep_delay=0, seed=6)
    run = runs[0]
    check(run)
    assert not run.out
    assert run.taken == list(range(run.taken[0], run.taken[0] + len(run.beats))), "an idle cycle in the input"


def test_rule_keeps_wire_rate():
    """The packing rule itself (reference): kept frames of one size >= 76 bytes back to back
    need no more output beats than their wire time in cycles: 76..1100 bytes (every
    remainder mod 128 several times), and a sample up to 9000."""
    slow = []
    for size in list(range(76, 1101)) + list(range(1101, 9001, 53)):
        frames = [bytes(size)] * 40
        _, used = placement(frames, [1] * 40, pack(frames))
        beats = -(-used // BEAT)
        wire = 40 * wire_bytes(size) / WIRE_BYTES_PER_CYCLE
        if beats > wire + 1:
            slow.append((size, beats, wire))
    assert not slow, slow
