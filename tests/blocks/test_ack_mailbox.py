"""AckMailbox: one waiting ACK/NAK record per QP; the input is never held.

Random ACK/NAK streams (one per cycle, or one or two per cycle as the receive dispatch
delivers them, some gaps) over 1, 2, 16 and all QPs: ACKs,
PSN-sequence NAKs, fatal NAKs, RNR NAKs, PSNs wrapping at 2^24 and stepping back now and
then, against an output ready at random, mostly not, or always. A reference model of
the merge rules runs on the events seen cycle by cycle: in a cycle, the record that
leaves first, then the pair taken the cycle before (the design decides one cycle after
it takes an input; an input meeting its QP's record as it leaves finds the slot empty):
two records of one QP fold first, then lane 0, then lane 1.
Checked every cycle: ``i.ready`` is 1; ``o.valid`` does not depend on ``o.ready``;
``o.valid`` says whether a record waits in the reference, ``o.p`` is the record of the
QP that arrived first; ``merged`` pulses when the reference drops or replaces one. At
the end: every input left once or was merged once, each QP's records left in arrival
order, and with the output always ready and one record per cycle every record left
within 3 cycles, unmerged.
"""
import gc
import random
import warnings

import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from rtl.requester.ack_mailbox import AckMailbox
from spec.formats import Aeth

MASK = (1 << 24) - 1
HALF = 1 << 23
READY = {"random": 0.5, "mostly_low": 0.1, "high": 1.0}


def _kind(syn):
    return syn >> 5 & 3


def _is_nak(syn):                   # a NAK or an RNR NAK: acknowledges every PSN before its own
    return _kind(syn) in (Aeth.KIND_NAK, Aeth.KIND_RNR)


def _fatal(syn):
    return _kind(syn) == Aeth.KIND_NAK and syn != Aeth.NAK_PSN_SEQ


def _inert(syn):                    # a reserved kind: moves nothing
    return _kind(syn) not in (Aeth.KIND_ACK, Aeth.KIND_NAK, Aeth.KIND_RNR)


def _implied(rec):
    return (rec[1] - 1) & MASK if _is_nak(rec[2]) else rec[1]


def replaces(new, old):
    """The merge rules: does ``new`` replace the waiting ``old`` of its QP?"""
    if _fatal(old[2]):
        return False
    if _fatal(new[2]):
        return True
    if _inert(new[2]):
        return False
    if _inert(old[2]):
        return True
    d = (_implied(new) - _implied(old)) & MASK
    if d == 0:
        return _is_nak(new[2]) and not _is_nak(old[2])
    return d < HALF


def _items(rnd, qps, n):
    psn = {q: rnd.randrange(MASK - 300, MASK + 1) for q in qps}     # wrap soon
    items, q = [], rnd.choice(qps)
    for k in range(n):
        if rnd.random() < 0.5:
            q = rnd.choice(qps)                   # runs of one QP and alternation
        step = rnd.choice([1, 1, 1, 2, 3, 0, -1, -4]) if rnd.random() > 0.01 else rnd.choice([HALF, HALF + 1])
        psn[q] = (psn[q] + step) & MASK
        r = rnd.random()
        if r < 0.65:
            syn = Aeth.ACK
        elif r < 0.82:
            syn = Aeth.NAK_PSN_SEQ
        elif r < 0.95:
            syn = Aeth.RNR_NAK | rnd.randrange(32)
        else:
            syn = rnd.choice([Aeth.NAK_INVALID_REQ, Aeth.NAK_REMOTE_ACCESS, Aeth.NAK_REMOTE_OP])
        items.append((q, psn[q], syn, k))        # msn = the input's index
    return items


def _run(num_qps, qps, ready_mode, n, seed, pair_p):
    rnd = random.Random(seed)
    items = _items(rnd, qps, n)
    ready_p = READY[ready_mode]
    dut = AckMailbox(num_qps)
    res = {"out": [], "merged": 0, "taken": 0, "latency": [], "pairs": 0}

    async def bench(ctx):
        ref = {}            # qp -> [record, cycle its first arrival was taken]; in arrival order
        pending = []        # the pair taken last cycle (one or two records): decided this cycle
        t_pending = 0
        k = cycle = 0
        idle = 0
        while k < len(items) or pending or ref or idle < 5:
            draining = k == len(items)
            idle = idle + 1 if draining and not pending and not ref else 0
            offer = not draining and rnd.random() >= 0.1
            two = offer and k + 1 < len(items) and rnd.random() < pair_p
            if offer:
                for lane in range(1 + two):
                    for name, v in zip(("qpn", "psn", "syndrome", "msn"), items[k + lane]):
                        ctx.set(getattr(dut.i.p.p[lane], name), v)
            ctx.set(dut.i.p.second, two)
            ctx.set(dut.i.valid, offer)
            ready = draining or rnd.random() < ready_p
            ctx.set(dut.o.ready, 0)
            ov = ctx.get(dut.o.valid)
            ctx.set(dut.o.ready, 1)
            assert ctx.get(dut.o.valid) == ov, f"cycle {cycle}: o.valid depends on o.ready"
            ctx.set(dut.o.ready, ready)
            assert ctx.get(dut.i.ready), f"cycle {cycle}: input held"
            op = ctx.get(dut.o.p)
            got = (op.qpn, op.psn, op.syndrome, op.msn)
            mg = ctx.get(dut.merged)

            # the reference: what waits now; then the departure; then last cycle's pair,
            # whose two records of one QP fold first (p[1] is the newer), then lane 0, lane 1
            assert ov == bool(ref), f"cycle {cycle}: o.valid {ov}, waiting {list(ref)[:4]}"
            if ov:
                head = next(iter(ref))
                assert got == ref[head][0], f"cycle {cycle}: presents {got}, expected {ref[head][0]}"
                if ready:
                    res["out"].append(got)
                    res["latency"].append(cycle - ref.pop(head)[1])
            expect = 0
            if len(pending) == 2 and pending[0][0] == pending[1][0]:
                expect += 1
                pending = [pending[1] if replaces(pending[1], pending[0]) else pending[0]]
            for rec in pending:
                if rec[0] in ref:
                    expect += 1
                    if replaces(rec, ref[rec[0]][0]):
                        ref[rec[0]][0] = rec
                else:
                    ref[rec[0]] = [rec, t_pending]
            assert mg == expect, f"cycle {cycle}: merged {mg}, expected {expect} ({pending})"
            res["merged"] += mg
            pending = []
            if offer:
                pending = items[k:k + 1 + two]
                t_pending = cycle
                k += 1 + two
                res["taken"] += 1 + two
                res["pairs"] += two
            await ctx.tick()
            cycle += 1
            assert cycle < 20 * n + 4 * num_qps, "does not drain"

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(bench)
    sim.run()
    return items, res


def _check(num_qps, qps, ready_mode, seed, pair_p):
    items, res = _run(num_qps, qps, ready_mode, 400, seed, pair_p)
    out = res["out"]
    assert res["taken"] == len(items)
    assert (res["pairs"] > 100) == (pair_p > 0), "pairs offered as asked"
    assert len(out) + res["merged"] == len(items), "every input leaves once or is merged once"
    assert len({o[3] for o in out}) == len(out) and all(items[o[3]] == o for o in out), "outputs are inputs"
    for q in qps:                                 # a QP's records leave in arrival order
        idx = [o[3] for o in out if o[0] == q]
        assert idx == sorted(idx), f"QP {q} out of order"
    if ready_mode == "high" and pair_p == 0:
        assert res["merged"] == 0 and out == items, "a ready output passes everything"
        assert max(res["latency"]) <= 3, f"latency {max(res['latency'])}"
    elif ready_mode == "mostly_low" and len(qps) <= 16:
        assert res["merged"] > len(items) // 3, f"the output stalls: records must merge ({res['merged']})"
    return res


def _qp_sets(num_qps, rnd):
    return [[rnd.randrange(num_qps)], rnd.sample(range(num_qps), 2), rnd.sample(range(num_qps), 16),
            list(range(num_qps))]


@pytest.mark.parametrize("num_qps", [16, 1024])
def test_ack_mailbox(num_qps):
    rnd = random.Random(num_qps)
    seed = 0
    for qps in _qp_sets(num_qps, rnd):
        for mode in READY:
            for pair_p in (0, 0.6):
                seed += 1
                _check(num_qps, qps, mode, seed, pair_p)


def test_ack_mailbox_num_qps_checked():
    with warnings.catch_warnings():
        # a constructor that raises leaves an object Amaranth would report as unused
        warnings.simplefilter("ignore", UnusedElaboratable)
        for bad in (0, 1, 3, 12, 16.0, "16", None, True):
            with pytest.raises(ValueError, match=r"num_qps must be a power of two >= 2, not"):
                AckMailbox(bad)
        gc.collect()        # (the objects go while the warning is ignored)
