"""AckAddresser: the responder's ACK/NAK records, one or two per transfer, get their QP's
address (requester MAC, IP and QP) from the table; in order, none lost or doubled under
random output stalls, one transfer per cycle with the output ready."""
import random

from rtl.responder.ack_addresser import AckAddresser
from tests.blocks.helpers import run

NQ = 16


def _run(dut, addrs, groups, rnd, p_ready):
    got, took = [], []

    async def bench(ctx):
        for qpn, (mac, ip, rqp) in addrs.items():
            ctx.set(dut.commit.p.qpn, qpn)
            ctx.set(dut.commit.p.addr.dmac, mac)
            ctx.set(dut.commit.p.addr.dip, ip)
            ctx.set(dut.commit.p.addr.remote_qpn, rqp)
            ctx.set(dut.commit.valid, 1)
            await ctx.tick()
        ctx.set(dut.commit.valid, 0)
        i = cycle = 0
        while len(got) < sum(len(g) for g in groups):
            assert cycle < 20 * len(groups) + 100, "addresser stopped"
            if i < len(groups):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.p.second, len(groups[i]) == 2)
                for k, r in enumerate(groups[i]):
                    for name, v in r.items():
                        ctx.set(getattr(dut.i.p.p[k], name), v)
            else:
                ctx.set(dut.i.valid, 0)
            ctx.set(dut.o.ready, rnd.random() < p_ready)
            await ctx.delay(1e-12)
            if ctx.get(dut.i.valid) and ctx.get(dut.i.ready):
                took.append(cycle)
                i += 1
            if ctx.get(dut.o.valid) and ctx.get(dut.o.ready):
                o = dut.o.p
                for k in range(1 + ctx.get(o.second)):
                    got.append({f: ctx.get(getattr(o.p[k], f))
                                for f in ("dmac", "dip", "dest_qp", "src_qpn", "psn", "syndrome", "msn")})
            await ctx.tick()
            cycle += 1

    run(dut, bench)
    return got, took


def test_ack_addresser():
    rnd = random.Random(5)
    addrs = {q: (rnd.randrange(1 << 48), rnd.randrange(1 << 32), rnd.randrange(1 << 24)) for q in range(NQ)}
    recs = [{"qpn": rnd.randrange(NQ), "psn": rnd.randrange(1 << 24), "syndrome": rnd.choice([0, 0x60, 0x63]),
             "msn": rnd.randrange(1 << 24)} for _ in range(600)]
    groups, k = [], 0
    while k < len(recs):
        n = rnd.choice([1, 2])
        groups.append(recs[k:k + n])
        k += n
    want = [{"dmac": addrs[r["qpn"]][0], "dip": addrs[r["qpn"]][1], "dest_qp": addrs[r["qpn"]][2],
             "src_qpn": r["qpn"], "psn": r["psn"], "syndrome": r["syndrome"], "msn": r["msn"]} for r in recs]
    for p_ready in (1.0, 0.4):
        dut = AckAddresser(num_qps=NQ)
        got, took = _run(dut, addrs, groups, random.Random(p_ready), p_ready)
        assert got == want
        if p_ready == 1.0:
            assert took == list(range(took[0], took[0] + len(groups))), "not one transfer per cycle"
