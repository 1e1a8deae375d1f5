"""AckCoalescer: a re-ACK identical to the last record queued is dropped, only while the
queue holds the input back.

Random streams of AckRecord pairs (one or two records, gaps, ``valid`` held until taken)
with long runs of one ACK, interleaved with what must not merge: NAKs (repeated too),
ACKs of another credit count (an ACK kind, not ``Aeth.ACK``), records differing in one
field, pairs only one of whose records is the repeat, an unused lane 1 (``second`` 0)
that differs. The output's ``ready`` drops at random, mostly, or never.

Checked every cycle against a reference (the last record that left, the last of its
pair): a pair is taken and dropped exactly when ``o.ready`` is 0 or ``backlog`` 1 (at
random, but never in the always-ready mode) and every record of it
is an ACK equal to that record; else it is passed on unchanged (``o.valid`` = ``i.valid``,
``o.p`` = ``i.p``) and taken when ``o.ready``; ``coalesced`` counts the dropped records.
At the end, from the records alone: what left is the input with only such records
removed, each in a cycle whose ``o.ready`` was 0 or with a backlog; ``coalesced`` sums to
their count; with ``o.ready`` always 1 and no backlog nothing is removed.
"""
import random

import pytest

from rtl.responder.ack_coalescer import AckCoalescer
from rtl.responder.responder import ResponderAck
from spec.formats import Aeth
from tests.blocks.helpers import run

MASK = (1 << 24) - 1


# (qpn, psn, syndrome, msn, atomic, read): ``atomic`` marks an ATOMIC ACK's place holder,
# ``read`` a READ's, which must never be dropped (each one takes one atomic's result or one
# READ's responses downstream)
# (``counted`` left 0: it rides with ``atomic`` and ``read``, which are never dropped)
FIELDS = [f for name, f in ResponderAck if name not in ("orig", "counted")]


def _pack(rec):
    v = 0
    for f, x in zip(FIELDS, rec):
        v |= (x & ((1 << f.width) - 1)) << f.offset
    return v


def _unpack(v):
    return tuple(v >> f.offset & ((1 << f.width) - 1) for f in FIELDS)


class Stream:
    """Records (qpn, psn, syndrome, msn): mostly one ACK again and again."""
    def __init__(self, rnd):
        self.rnd = rnd
        self.base = (3, MASK - 5, Aeth.ACK, 100, 0, 0)
        self.prev = self.base

    def record(self):
        rnd = self.rnd
        q, psn, syn, msn, _, _ = self.base
        x = rnd.random()
        if x < 0.6:
            r = self.base                                          # the re-ACK
        elif x < 0.66:
            self.base = (q, (psn + rnd.randrange(1, 3)) & MASK, Aeth.ACK, (msn + rnd.randrange(2)) & MASK, 0, 0)
            r = self.base                                          # a new ACK
        elif x < 0.74:
            r = self.prev                                          # whatever came last again (a NAK too)
        elif x < 0.78:
            r = (q, psn, Aeth.ACK, msn, 1, 0)                      # an ATOMIC ACK's place holder (repeated too)
        elif x < 0.80:
            r = (q, psn, Aeth.ACK, msn, 0, 1)                      # a READ's place holder (repeated too)
        elif x < 0.82:
            r = (q, psn, rnd.choice([Aeth.NAK_PSN_SEQ, Aeth.NAK_INVALID_REQ, Aeth.RNR_NAK | 3]), msn, 0, 0)
        elif x < 0.86:
            r = (q, psn, rnd.choice([0x00, 0x1E, 0x01]), msn, 0, 0)   # an ACK, not Aeth.ACK
        elif x < 0.96:
            k = rnd.randrange(4)                                   # one field (one bit) off
            r = list(self.base)
            r[k] ^= 1 << rnd.randrange(8 if k == 2 else 24)
            r = tuple(r)
        else:
            r = (rnd.randrange(1 << 24), rnd.randrange(1 << 24), Aeth.ACK, rnd.randrange(1 << 24), 0, 0)
        self.prev = r
        return r

    def pair(self):
        p = [self.record()]
        if self.rnd.random() < 0.5:
            p.append(self.record())
        return p


READY = {"random": 0.5, "mostly_low": 0.15, "high": 1.0}


def _run(ready_mode, seed, n):
    rnd = random.Random(seed)
    gen = Stream(rnd)
    pairs = [gen.pair() for _ in range(n)]
    ready_p = READY[ready_mode]
    dut = AckCoalescer()
    shape = dut.i.p.shape()
    off = [shape["p"].offset + k * ResponderAck.size for k in range(2)]
    sec = shape["second"].offset
    res = {"out": [], "removed": [], "coalesced": 0, "log": []}

    async def bench(ctx):
        tail = None             # the last record that left (the reference)
        k = cycle = 0
        holding = False         # a pair offered and not yet taken: valid held, payload kept
        while k < len(pairs):
            offer = holding or rnd.random() < 0.85
            if offer:
                pair = pairs[k]
                lane1 = pair[1] if len(pair) == 2 else rnd.choice([tail or gen.base, gen.record()])
            else:
                pair, lane1 = [], gen.record()              # junk while not valid
            lane0 = pair[0] if pair else (tail or gen.base)
            ctx.set(dut.i.valid, offer)
            ctx.set(dut.i.p.as_value(), (len(pair) == 2) << sec | _pack(lane0) << off[0] | _pack(lane1) << off[1])
            ready = rnd.random() < ready_p
            ctx.set(dut.o.ready, ready)
            backlog = ready_mode != "high" and rnd.random() < 0.2      # the queue holds a backlog
            ctx.set(dut.backlog, backlog)

            same = (bool(pair) and tail is not None and tail[2] == Aeth.ACK and not tail[4] and not tail[5]
                    and all(r == tail for r in pair))
            drop = same and (not ready or backlog)
            ov = ctx.get(dut.o.valid)
            assert ov == (offer and not drop), f"cycle {cycle}: o.valid {ov} (ready {ready}, {pair}, last {tail})"
            ir = ctx.get(dut.i.ready)
            assert ir == (ready or drop), f"cycle {cycle}: i.ready {ir} (ready {ready}, {pair}, last {tail})"
            co = ctx.get(dut.coalesced)
            assert co == (len(pair) if drop else 0), f"cycle {cycle}: coalesced {co} ({pair}, last {tail})"
            if ov:
                op = ctx.get(dut.o.p.as_value())
                got = [_unpack(op >> off[j]) for j in range(1 + (op >> sec & 1))]
                assert got == pair, f"cycle {cycle}: o.p {got}, i.p {pair}"
            res["coalesced"] += co
            res["log"].append((ready and not backlog, tuple(pair), ov and ready, drop))
            if ov and ready:
                res["out"].append((k, pair))
                tail = pair[-1]
            if drop:
                res["removed"].append(k)
            if offer and ir:
                k += 1
            holding = offer and not ir
            await ctx.tick()
            cycle += 1
            assert cycle < 100 * n, "stuck"

    run(dut, bench)
    return pairs, res


def _check_stream(pairs, res):
    """From the records alone: what left is the input less removed ACKs, each equal to
    the last record that left before it and removed in a cycle of ``o.ready`` 0."""
    left = [r for _, p in res["out"] for r in p]
    removed = set(res["removed"])
    assert [r for k, p in enumerate(pairs) if k not in removed for r in p] == left, "output = input less removed"
    assert sorted(removed | {k for k, _ in res["out"]}) == list(range(len(pairs))), "each pair once"
    assert res["coalesced"] == sum(len(pairs[k]) for k in removed), "coalesced counts the removed records"
    last = None
    for ready, pair, passed, dropped in res["log"]:
        if dropped:
            assert not ready, "removed while o.ready was 1 and the queue held no backlog"
            assert last is not None and last[2] == Aeth.ACK and all(r == last for r in pair), \
                f"removed {pair}, the last that left {last}"
        if passed:
            last = pair[-1]


@pytest.mark.parametrize("ready_mode", list(READY))
@pytest.mark.parametrize("seed", [1, 2])
def test_ack_coalescer(ready_mode, seed):
    pairs, res = _run(ready_mode, seed, 700)
    _check_stream(pairs, res)
    n_removed = len(res["removed"])
    # repeats of the last record that left, met with o.ready 1: passed on, not removed
    repeats = sum(ready and passed and prev is not None and prev[2] == Aeth.ACK and all(r == prev for r in pair)
                  for (ready, pair, passed, _), prev in zip(res["log"], _lasts(res["log"])))
    assert repeats > 20, repeats
    if ready_mode == "high":
        assert n_removed == 0 and res["coalesced"] == 0, "a ready output: nothing removed"
        assert [p for _, p in res["out"]] == pairs
    else:
        # the stream repeats: with the output held back, many must go
        assert n_removed > len(pairs) // 10, f"only {n_removed} pairs coalesced"


def _lasts(log):
    """The last record that left before each cycle of ``log``."""
    last = None
    for ready, pair, passed, dropped in log:
        yield last
        if passed:
            last = pair[-1]
