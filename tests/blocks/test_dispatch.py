"""RxDispatch: descriptor pairs to counters, the ACK path, the responder and keep bits.

Random pairs of descriptors (frame-level drops of every reason, ACKs and NAKs of 1-3
QPs, WRITE requests) against outputs that are ready at random. Checked against a
reference written from the rules: each drop is counted under its reason and goes
nowhere else; the requests of a pair, and its ACK/NAKs, each leave together as one
transfer of one or two, in order (the responder and the ACK mailbox take two a cycle);
the keep bits say, per pair, which frames were requests with payload; the ACK counter
counts every ACK frame taken. With every output ready a pair is taken each cycle,
whatever it holds.
"""
import random

from amaranth.sim import Simulator

from rtl.port.dispatch import RxDispatch
from rtl.common.rx_packet import RxDrop
from spec.formats import Aeth, Op

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
            "dqpn": rnd.randrange(1 << 24), "psn": rnd.randrange(1 << 24),
            "payload_len": rnd.choice([0, 0, 1, 8, 4096]), "inline": int(rnd.random() < 0.3)}


def _reference(pairs):
    reqs, acks, keeps, drops, n_acks = [], [], [], {}, 0
    for pair in pairs:
        keep, got, req = [], [], []
        for d in pair:
            if d["drop"]:
                drops[d["drop"]] = drops.get(d["drop"], 0) + 1
                keep.append(0)
            elif d["opcode"] == Op.ACK:
                n_acks += 1
                got.append((d["dqpn"], d["psn"], d["syndrome"], d["msn"]))
                keep.append(0)
            else:
                req.append((d["opcode"], d["dqpn"], d["psn"], d["payload_len"]))
                keep.append(int(d["payload_len"] != 0 and not d["inline"]))   # inline: not in the segments
        if req:
            reqs.append(tuple(req))
        if got:
            acks.append(tuple(got))
        keeps.append((len(pair) == 2, tuple(keep + [0] * (2 - len(keep)))))
    return reqs, acks, keeps, drops, n_acks


def _run(pairs, ready_p, seed):
    rnd = random.Random(seed)
    dut = RxDispatch()
    res = {"reqs": [], "acks": [], "keeps": [], "drops": {}, "n_acks": 0, "taken_at": []}

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
        async for _, _, pv, pr, rv, rr, rp, av, ar, ap, kv, kr, kp, dropped, n_acks in ctx.tick().sample(
                dut.packets.valid, dut.packets.ready, dut.requests.valid, dut.requests.ready, dut.requests.p,
                dut.acks.valid, dut.acks.ready, dut.acks.p, dut.keep.valid, dut.keep.ready, dut.keep.p,
                dut.dropped, dut.acks_received):
            if pv and pr:
                res["taken_at"].append(cycle)
            if rv and rr:
                res["reqs"].append(tuple((r.opcode, r.dqpn, r.psn, r.payload_len) for r in rp.p[:1 + rp.second]))
            if av and ar:
                res["acks"].append(tuple((a.qpn, a.psn, a.syndrome, a.msn) for a in ap.p[:1 + ap.second]))
            if kv and kr:
                res["keeps"].append((bool(kp.second), (kp.keep & 1, kp.keep >> 1)))
            for d in DROPS:
                if dropped[d.value - 1]:
                    res["drops"][d.value] = res["drops"].get(d.value, 0) + dropped[d.value - 1]
            res["n_acks"] += n_acks
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
        pairs = _pairs(rnd, 150, qps)              # every drop kind and ACK pairs among them
        reqs, acks, keeps, drops, n_acks = _reference(pairs)
        got = _run(pairs, ready_p, seed)
        assert got["reqs"] == reqs
        assert got["acks"] == acks
        assert got["keeps"] == keeps
        assert got["drops"] == drops and len(drops) == len(DROPS)
        assert got["n_acks"] == n_acks
        assert any(len(a) == 2 for a in acks), "the stimulus has pairs of ACKs"


def test_rx_dispatch_one_pair_per_cycle():
    """All outputs ready: one pair a cycle, two requests or two ACKs included."""
    rnd = random.Random(4)
    pairs = _pairs(rnd, 300, [5])
    got = _run(pairs, 1.0, 4)
    reqs, acks = _reference(pairs)[:2]
    assert got["reqs"] == reqs and got["acks"] == acks
    assert sum(len(a) == 2 for a in acks) > 20 and sum(len(r) == 2 for r in reqs) > 20
    t = got["taken_at"]
    assert len(t) == len(pairs) and t[-1] - t[0] == len(pairs) - 1, "a pair was not taken every cycle"
