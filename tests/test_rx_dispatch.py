"""RxDispatch: descriptor pairs to counters, the ACK path, the responder and keep bits.

Random pairs of descriptors (frame-level drops of every reason, ACKs and NAKs of 1-3
QPs, WRITE requests) against outputs that are ready at random. Checked against a
reference written from the rules: each drop is counted under its reason and goes
nowhere else; requests leave in order, one each; ACK/NAKs leave in order, except that
two plain ACKs of one QP in one pair leave as one, the newer (the fold counted); the
keep bits say, per pair, which frames were requests; the ACK counter counts every ACK
frame taken. With every output ready a pair is taken each cycle.
"""
import random

from amaranth.sim import Simulator

from rtl.rx_dispatch import RxDispatch
from rtl.rx_packet import RxDrop
from spec.formats import Aeth, Op

MASK = (1 << 24) - 1
DROPS = [d for d in RxDrop if d != RxDrop.NONE]


def _desc(rnd, qps):
    kind = rnd.choice(["drop", "ack", "ack", "req", "req"])
    if kind == "drop":
        return {"drop": rnd.choice(DROPS).value, "opcode": rnd.choice([Op.ACK, Op.WRITE_ONLY]), "dqpn": 1, "psn": 5}
    if kind == "ack":
        syn = Aeth.ACK if rnd.random() < 0.8 else rnd.choice([Aeth.NAK_PSN_SEQ, Aeth.NAK_REMOTE_ACCESS])
        return {"drop": 0, "opcode": Op.ACK, "dqpn": rnd.choice(qps), "psn": rnd.randrange(1 << 24),
                "syndrome": syn, "msn": rnd.randrange(1 << 24)}
    return {"drop": 0, "opcode": rnd.choice([Op.WRITE_ONLY, Op.WRITE_FIRST, Op.WRITE_MIDDLE]),
            "dqpn": rnd.randrange(1 << 24), "psn": rnd.randrange(1 << 24)}


def _reference(pairs):
    reqs, acks, keeps, drops, n_acks, folds = [], [], [], {}, 0, 0
    for pair in pairs:
        keep = []
        got = []
        for d in pair:
            if d["drop"]:
                drops[d["drop"]] = drops.get(d["drop"], 0) + 1
                keep.append(0)
            elif d["opcode"] == Op.ACK:
                n_acks += 1
                got.append((d["dqpn"], d["psn"], d["syndrome"], d["msn"]))
                keep.append(0)
            else:
                reqs.append((d["opcode"], d["dqpn"], d["psn"]))
                keep.append(1)
        if (len(got) == 2 and got[0][0] == got[1][0]
                and got[0][2] >> 5 == Aeth.KIND_ACK and got[1][2] >> 5 == Aeth.KIND_ACK):
            folds += 1
            got = [got[1] if ((got[1][1] - got[0][1]) & MASK) < (1 << 23) else got[0]]
        acks += got
        keeps.append((len(pair) == 2, tuple(keep + [0] * (2 - len(keep)))))
    return reqs, acks, keeps, drops, n_acks, folds


def _run(pairs, ready_p, seed):
    rnd = random.Random(seed)
    dut = RxDispatch()
    res = {"reqs": [], "acks": [], "keeps": [], "drops": {}, "n_acks": 0, "folds": 0, "taken_at": []}

    async def drive(ctx):
        for pair in pairs:
            ctx.set(dut.packets.p.as_value(), 0)
            ctx.set(dut.packets.p.second, len(pair) == 2)
            for i, d in enumerate(pair):
                p = dut.packets.p.p[i]
                for k, v in d.items():
                    if k == "syndrome":
                        ctx.set(p.aeth.syndrome, v)
                    elif k == "msn":
                        ctx.set(p.aeth.msn, v)
                    else:
                        ctx.set(getattr(p, k), v)
            ctx.set(dut.packets.valid, 1)
            await ctx.tick().until(dut.packets.ready)
        ctx.set(dut.packets.valid, 0)

    async def sink(ctx):
        cycle = 0
        async for _, _, pv, pr, rv, rr, rp, av, ar, ap, kv, kr, kp, dropped, n_acks, fold in ctx.tick().sample(
                dut.packets.valid, dut.packets.ready, dut.requests.valid, dut.requests.ready, dut.requests.p,
                dut.acks.valid, dut.acks.ready, dut.acks.p, dut.keep.valid, dut.keep.ready, dut.keep.p,
                dut.dropped, dut.acks_received, dut.acks_merged):
            if pv and pr:
                res["taken_at"].append(cycle)
            if rv and rr:
                res["reqs"].append((rp.opcode, rp.dqpn, rp.psn))
            if av and ar:
                res["acks"].append((ap.qpn, ap.psn, ap.syndrome, ap.msn))
            if kv and kr:
                res["keeps"].append((bool(kp.second), (kp.keep & 1, kp.keep >> 1)))
            for d in DROPS:
                if dropped[d.value - 1]:
                    res["drops"][d.value] = res["drops"].get(d.value, 0) + dropped[d.value - 1]
            res["n_acks"] += n_acks
            res["folds"] += fold
            for s in (dut.requests, dut.acks, dut.keep):
                ctx.set(s.ready, rnd.random() < ready_p)
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(2e-9)
    sim.add_testbench(drive)
    sim.add_process(sink)
    sim.run_until(2e-9 * (len(pairs) * (3 if ready_p == 1 else 12) + 200))
    return res


def _pairs(rnd, n, qps):
    return [[_desc(rnd, qps) for _ in range(rnd.choice([1, 2, 2]))] for _ in range(n)]


def test_rx_dispatch_random():
    for seed, ready_p, qps in ((1, 0.5, [7]), (2, 0.9, [3, 9]), (3, 0.3, [1, 2, 3])):
        rnd = random.Random(seed)
        pairs = _pairs(rnd, 400, qps)
        reqs, acks, keeps, drops, n_acks, folds = _reference(pairs)
        got = _run(pairs, ready_p, seed)
        assert got["reqs"] == reqs
        assert got["acks"] == acks
        assert got["keeps"] == keeps
        assert got["drops"] == drops and len(drops) == len(DROPS)
        assert (got["n_acks"], got["folds"]) == (n_acks, folds) and folds > 0


def test_rx_dispatch_one_pair_per_cycle():
    """All outputs ready, pairs without two requests or two unfolded ACKs: one a cycle."""
    rnd = random.Random(4)
    pairs = []
    while len(pairs) < 300:
        p = _pairs(rnd, 1, [5])[0]
        kinds = [("req" if not d["drop"] and d["opcode"] != Op.ACK else
                  "ack" if not d["drop"] and d["syndrome"] == Aeth.ACK else "nak" if not d["drop"] else "drop")
                 for d in p]
        if kinds.count("req") < 2 and "nak" not in kinds:
            pairs.append(p)
    got = _run(pairs, 1.0, 4)
    assert got["reqs"] == _reference(pairs)[0]
    t = got["taken_at"]
    assert len(t) == len(pairs) and t[-1] - t[0] == len(pairs) - 1, "a pair was not taken every cycle"
