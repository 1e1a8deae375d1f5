"""The engine-against-rxe cases of the path-MTU matrix, each a coroutine on an engine that is
already started (``tb.interop.rxe_env.start``), so that one cocotb test can run one case
(tb/suites/interop_mtu.py: the matrix at MTU 1024 and 4096, ``make interop``) or several
on one reset (tb/suites/interop.py ``mtu4096_both_ways``: the short form in ``make test``).

Every case makes its own QP on each side (``Ids`` hands out the guest's QP and MR numbers:
one guest serves the whole simulation), joins the engine to the guest with its own
``RxeLink`` (frames in ``<name>.pcap`` / ``<name>.log``), and checks what the suites
check: the frames (opcode, PSN, AckReq, BTH PadCnt, length), the engine's frames equal to
the golden requester's / responder's for rxe's, the engine's CQEs, rxe's completions,
every byte on both sides (and the guard bytes around them), rxe's counters.

PadCnt: IBTA pads the payload of a packet to a multiple of 4 (only LAST/ONLY can carry a
pad: FIRST/MIDDLE carry a whole MTU). rxe pads what it sends and NAKs an unpadded WRITE
(docs/interoperability.md, finding 1, fixed: the engine pads too); the tests
``engine_odd_lengths_*`` of tb/suites/interop_mtu.py hold the engine's pad on WRITEs and
READ responses of lengths that are not multiples of 4.
"""
import itertools

from model.frames import QpContext
from model.memory import SparseMemory
from model.responder import RcResponder
from spec.formats import ATOMIC_ACK_ETH, OFF_EXT, Aeth, CqeOp, Op, WqeOp, unpack
from tb.interop.rxe_env import GUEST_IP, GUEST_MAC, PD, RxeLink, aeth, bth, connect_rc, pattern, summary
from tb.suites.interop import (CQE_CYCLES, DST, ENGINE_PORT, KEY, LOCAL, NEVER, REGION, _check_requester,
                               _check_rxe_counters, _link_clean, _post, _requester_model)

GUARD = 0xEE                         # the byte around every target buffer
RTS = 3                              # IBV_QPS_RTS


class Ids:
    """The guest's QP and MR numbers, never reused within one guest (one simulation)."""
    _next = itertools.count(32)      # above the ids the suites' own tests use

    @classmethod
    def take(cls):
        return next(cls._next)


def pad_of(n):
    """IBTA PadCnt of a payload of ``n`` bytes."""
    return (-n) & 3


def padcnt(f):
    return (bth(f)["flags"] >> 4) & 3


def write_packets(n, mtu, psn):
    """(opcode, PSN, AckReq, PadCnt, frame length) of an IBTA-conformant RC WRITE of ``n``
    bytes from ``psn`` (RETH on FIRST/ONLY; AckReq on the LAST/ONLY: what rxe and the
    engine set; the pad on the LAST/ONLY)."""
    if n <= mtu:
        return [(Op.WRITE_ONLY, psn & 0xFFFFFF, 1, pad_of(n), 74 + n + pad_of(n))]
    k = -(-n // mtu)
    out = [(Op.WRITE_FIRST, psn & 0xFFFFFF, 0, 0, 74 + mtu)]
    out += [(Op.WRITE_MIDDLE, (psn + i) & 0xFFFFFF, 0, 0, 58 + mtu) for i in range(1, k - 1)]
    r = n - (k - 1) * mtu
    out.append((Op.WRITE_LAST, (psn + k - 1) & 0xFFFFFF, 1, pad_of(r), 58 + r + pad_of(r)))
    return out


def read_response_packets(n, mtu, psn):
    """(opcode, PSN, PadCnt, frame length) of the IBTA READ RESPONSEs for ``n`` bytes
    (AETH on FIRST/LAST/ONLY)."""
    if n <= mtu:
        return [(Op.READ_RESP_ONLY, psn & 0xFFFFFF, pad_of(n), 62 + n + pad_of(n))]
    k = -(-n // mtu)
    out = [(Op.READ_RESP_FIRST, psn & 0xFFFFFF, 0, 62 + mtu)]
    out += [(Op.READ_RESP_MIDDLE, (psn + i) & 0xFFFFFF, 0, 58 + mtu) for i in range(1, k - 1)]
    r = n - (k - 1) * mtu
    out.append((Op.READ_RESP_LAST, (psn + k - 1) & 0xFFFFFF, pad_of(r), 62 + r + pad_of(r)))
    return out


def npackets(n, mtu):
    return max(1, -(-n // mtu))


async def ensure_region(env):
    """The engine's region REGION (rxe's target), registered once per engine reset."""
    if not getattr(env, "_mtu_region", False):
        await env.ctl.register_mr(REGION.key, REGION.base, REGION.length, REGION.access, REGION.pd)
        env._mtu_region = True


def _responder_model(gq, qpn, start_psn, mtu, image=None):
    model = RcResponder(ENGINE_PORT, remote_ops=image is not None, read_memory=image.read if image else None)
    model.add_qp(QpContext(qpn=qpn, remote_qpn=gq["qpn"], dmac=GUEST_MAC, dip=GUEST_IP, start_psn=start_psn,
                           mtu=mtu), PD, ack_every=16)
    model.register(REGION)
    return model


async def engine_writes(g, br, env, cq, *, name, mtu, sizes, engine_qpn, engine_psn):
    """The engine WRITEs ``sizes`` (one message each, in order) into an rxe buffer: each
    message's frames are IBTA's (opcodes, PSNs from ``engine_psn``, AckReq on the LAST/
    ONLY, PadCnt, lengths) and the golden requester's; rxe ACKs each message (0x1F, MSN
    counting them); the engine's CQEs succeed with the byte counts; the guest's buffer holds
    exactly the bytes (guard bytes around untouched); rxe counts no error; its QP stays RTS."""
    gqp = Ids.take()
    qp, gq = await connect_rc(env, g, cq, engine_qpn=engine_qpn, guest_qp=gqp, engine_psn=engine_psn,
                              guest_psn=0x100, engine_timeout=NEVER, mtu=mtu)
    span, o = [], 64                 # (offset in the guest's buffer, length) of each WRITE
    for n in sizes:
        span.append((o, n))
        o += -(-n // 64) * 64 + 64
    size = o
    gmr = Ids.take()
    m = g.reg_mr(gmr, size)
    g.write_mem(gmr, 0, bytes([GUARD]) * size)
    before = g.counters()
    link = RxeLink(env, br, name, {engine_qpn: mtu})
    writes = {}
    model = _requester_model(env, cq, qp, writes)
    try:
        want_frames, want_acks, cqes, datas = [], [], [], []
        psn = engine_psn
        for k, (off, n) in enumerate(span):
            src, d = env.payload(n, seed=40 + k)
            datas.append(d)
            _post(model, qp, qp.post_write(m["addr"] + off, m["rkey"], local_addr=src, length=n))
            await qp.ring_rdma_core()
            cqes += await cq.poll(1, CQE_CYCLES)
            pk = write_packets(n, mtu, psn)
            want_frames += pk
            want_acks.append((Op.ACK, engine_qpn, pk[-1][1], (Aeth.ACK, k + 1)))
            psn += len(pk)
        await link.settle()
        _link_clean(link)
        tx, rx = link.frames("tx"), link.frames("rx")
        got = [(bth(f)["opcode"], bth(f)["psn"], bth(f)["ackreq"] >> 7, padcnt(f), len(f)) for f in tx]
        assert got == want_frames, f"engine frames {got}, IBTA {want_frames}"
        assert [(bth(f)["opcode"], bth(f)["dqpn"], bth(f)["psn"], aeth(f)) for f in rx] == want_acks, summary(rx)
        assert [(c.opcode, c.qpn, c.wqe_counter, c.byte_cnt, c.syndrome) for c in cqes] == [
            (CqeOp.REQ, engine_qpn, k, n, 0) for k, n in enumerate(sizes)], cqes
        _check_requester(env, link, model, cqes, writes)
        for (off, n), d in zip(span, datas):
            assert g.read_mem(gmr, off - 4, n + 8) == bytes([GUARD]) * 4 + d + bytes([GUARD]) * 4, \
                f"rxe buffer around the WRITE of {n} B"
        assert g.poll_cq(gqp, ms=0) is None
        _check_rxe_counters(g, before, link)
        assert g.qp_state(gqp) == RTS
    finally:
        link.close()


async def rxe_writes(g, br, env, cq, *, name, mtu, sizes, engine_qpn, guest_psn):
    """rxe WRITEs ``sizes`` into the engine's region: rxe's frames are IBTA's (its pad on
    the LAST/ONLY); the engine's ACKs are the golden responder's; exactly the bytes land in
    the engine's memory (guard bytes around untouched); rxe's completions succeed."""
    await ensure_region(env)
    gqp, gmr = Ids.take(), Ids.take()
    qp, gq = await connect_rc(env, g, cq, engine_qpn=engine_qpn, guest_qp=gqp, engine_psn=0x200,
                              guest_psn=guest_psn, engine_timeout=NEVER, mtu=mtu)
    src_size = sum(-(-s // 64) * 64 for s in sizes)
    g.reg_mr(gmr, src_size)
    base = DST + 0x40000 + engine_qpn * 0x10000
    offs, datas, o = [], [], 0
    for k, n in enumerate(sizes):
        d = pattern(n, 50 + k)
        g.write_mem(gmr, o, d)
        offs.append(o)
        datas.append(d)
        o += -(-n // 64) * 64
    targets = [base + 0x40 + i * (3 * mtu + 0x400) for i in range(len(sizes))]
    env.mem.write(base, bytes([GUARD]) * (targets[-1] - base + sizes[-1] + 0x40))
    before = g.counters()
    link = RxeLink(env, br, name, {engine_qpn: mtu})
    model = _responder_model(gq, engine_qpn, guest_psn, mtu)
    try:
        wcs, want = [], []
        psn = guest_psn
        for k, n in enumerate(sizes):
            g.write(gqp, gmr, offs[k], n, raddr=targets[k], rkey=KEY, wr=500 + k)
            pk = write_packets(n, mtu, psn)
            want += pk
            psn += len(pk)
            link.expect(len(pk))
            await link.wait_tx(k + 1)
            wcs.append(g.poll_cq(gqp, ms=5000))
        await link.settle()
        _link_clean(link)
        tx, rx = link.frames("tx"), link.frames("rx")
        got = [(bth(f)["opcode"], bth(f)["psn"], bth(f)["ackreq"] >> 7, padcnt(f), len(f)) for f in rx]
        assert got == want, f"rxe frames {got}, IBTA {want}"
        results = [model.receive(f) for f in rx]
        assert all(r.accepted for r in results), [r.reason for r in results]
        golden = [r.response for r in results if r.response is not None]
        assert tx == golden, f"engine sends {summary(tx)}, golden responder {summary(golden)}"
        assert [aeth(f) for f in tx] == [(Aeth.ACK, k + 1) for k in range(len(sizes))], summary(tx)
        for k, (wc, n) in enumerate(zip(wcs, sizes)):
            assert wc is not None, f"rxe: no completion for its WRITE of {n} B"
            assert {x: wc.get(x) for x in ("wr", "status_str", "opcode", "byte_len")} == {
                "wr": 500 + k, "status_str": "success", "opcode": "RDMA_WRITE", "byte_len": n}, wc
        for t, d in zip(targets, datas):
            assert env.mem.read(t - 4, len(d) + 8) == bytes([GUARD]) * 4 + d + bytes([GUARD]) * 4, \
                f"engine memory around rxe's WRITE of {len(d)} B"
        assert cq.try_poll() is None, "an engine CQE for a remote WRITE without immediate"
        _check_rxe_counters(g, before, link)
        assert g.qp_state(gqp) == RTS
    finally:
        link.close()


async def engine_reads(g, br, env, cq, *, name, mtu, n, engine_qpn, engine_psn):
    """The engine READs ``n`` bytes of an rxe buffer: rxe's READ RESPONSEs are IBTA's
    (its pad on the LAST/ONLY); the engine's READ REQUEST, CQE and the bytes it writes are
    the golden requester's; exactly the bytes land (guard bytes around untouched)."""
    gqp, gmr = Ids.take(), Ids.take()
    qp, gq = await connect_rc(env, g, cq, engine_qpn=engine_qpn, guest_qp=gqp, engine_psn=engine_psn,
                              guest_psn=0x300, engine_timeout=NEVER, mtu=mtu)
    m = g.reg_mr(gmr, n + 0x100)
    data = pattern(n, 60)
    g.write_mem(gmr, 0x40, data)
    local = LOCAL + 0x100000 + engine_qpn * 0x10000
    env.mem.write(local - 0x40, bytes([GUARD]) * (n + 0x80))
    before = g.counters()
    link = RxeLink(env, br, name, {engine_qpn: mtu})
    writes = {}
    model = _requester_model(env, cq, qp, writes)
    try:
        _post(model, qp, qp.post_read(m["addr"] + 0x40, m["rkey"], local, n))
        await qp.ring_rdma_core()
        cqes = await cq.poll(1, CQE_CYCLES)
        await link.settle()
        _link_clean(link)
        tx, rx = link.frames("tx"), link.frames("rx")
        assert [(bth(f)["opcode"], bth(f)["psn"]) for f in tx] == [(Op.READ_REQUEST, engine_psn)], summary(tx)
        got = [(bth(f)["opcode"], bth(f)["psn"], padcnt(f), len(f)) for f in rx]
        want = read_response_packets(n, mtu, engine_psn)
        assert got == want, f"rxe READ RESPONSEs {got}, IBTA {want}"
        assert [(c.opcode, c.qpn, c.wqe_counter, c.syndrome) for c in cqes] == [(CqeOp.REQ, engine_qpn, 0, 0)], cqes
        _check_requester(env, link, model, cqes, writes)
        assert env.mem.read(local - 4, n + 8) == bytes([GUARD]) * 4 + data + bytes([GUARD]) * 4
        _check_rxe_counters(g, before, link)
        assert g.qp_state(gqp) == RTS
    finally:
        link.close()


async def rxe_reads(g, br, env, cq, *, name, mtu, n, engine_qpn, guest_psn):
    """rxe READs ``n`` bytes of the engine's region: the engine's READ RESPONSEs are the
    golden responder's and IBTA's (opcodes, PSNs, PadCnt, lengths); rxe's completion
    succeeds; exactly the bytes land in rxe's buffer (guard bytes around untouched)."""
    await ensure_region(env)
    gqp, gmr = Ids.take(), Ids.take()
    qp, gq = await connect_rc(env, g, cq, engine_qpn=engine_qpn, guest_qp=gqp, engine_psn=0x400,
                              guest_psn=guest_psn, engine_timeout=NEVER, mtu=mtu)
    g.reg_mr(gmr, n + 0x100)
    g.write_mem(gmr, 0, bytes([GUARD]) * (n + 0x100))
    src = DST + 0x80000 + engine_qpn * 0x10000
    data = pattern(n, 70)
    image = SparseMemory()
    env.mem.write(src, data)
    image.write(src, data)
    before = g.counters()
    link = RxeLink(env, br, name, {engine_qpn: mtu})
    model = _responder_model(gq, engine_qpn, guest_psn, mtu, image)
    try:
        g.read(gqp, gmr, 0x40, n, raddr=src, rkey=KEY, wr=600)
        link.expect(1)
        await link.wait_tx(npackets(n, mtu))
        wc = g.poll_cq(gqp, ms=5000)
        await link.settle()
        _link_clean(link)
        tx, rx = link.frames("tx"), link.frames("rx")
        assert [(bth(f)["opcode"], bth(f)["psn"]) for f in rx] == [(Op.READ_REQUEST, guest_psn)], summary(rx)
        results = [model.receive(f) for f in rx]
        assert all(r.accepted for r in results), [r.reason for r in results]
        golden = [o for r in results for o in (r.read_responses or [])]
        assert tx == golden, f"engine sends {summary(tx)}, golden responder {summary(golden)}"
        got = [(bth(f)["opcode"], bth(f)["psn"], padcnt(f), len(f)) for f in tx]
        want = read_response_packets(n, mtu, guest_psn)
        assert got == want, f"engine READ RESPONSEs {got}, IBTA {want}"
        assert wc is not None, "rxe: no completion for its READ"
        assert {x: wc.get(x) for x in ("wr", "status_str", "opcode", "byte_len")} == {
            "wr": 600, "status_str": "success", "opcode": "RDMA_READ", "byte_len": n}, wc
        assert g.read_mem(gmr, 0x3C, n + 8) == bytes([GUARD]) * 4 + data + bytes([GUARD]) * 4
        _check_rxe_counters(g, before, link)
        assert g.qp_state(gqp) == RTS
    finally:
        link.close()


async def atomics(g, br, env, cq, *, name, mtu, engine_qpn):
    """One FETCH_ADD and one COMPARE_SWAP each way at path MTU ``mtu``: the engine's on an
    rxe word (ATOMIC ACKs with the originals; the engine's frames and CQEs the golden
    requester's), rxe's on an engine word (the engine's ATOMIC ACKs the golden responder's);
    the words change as the arithmetic says, the originals land on both sides."""
    await ensure_region(env)
    q1, q2, m1, m2 = Ids.take(), Ids.take(), Ids.take(), Ids.take()
    qp, gq = await connect_rc(env, g, cq, engine_qpn=engine_qpn, guest_qp=q1, engine_psn=0xFFFFFE,
                              guest_psn=0x500, engine_timeout=NEVER, mtu=mtu)
    qp2, gq2 = await connect_rc(env, g, cq, engine_qpn=engine_qpn + 1, guest_qp=q2, engine_psn=0x600,
                                guest_psn=0x700, engine_timeout=NEVER, mtu=mtu)
    m = g.reg_mr(m1, 4096)
    g.reg_mr(m2, 4096)
    orig, orig2 = 0x1122_3344_5566_7788, 0x0102_0304_0506_0708
    g.write_mem(m1, 0x100, orig.to_bytes(8, "little"))
    word = DST + 0xC0000 + engine_qpn * 0x100
    image = SparseMemory()
    env.mem.write(word, orig2.to_bytes(8, "little"))
    image.write(word, orig2.to_bytes(8, "little"))
    local = LOCAL + 0x200000 + engine_qpn * 0x100
    swap, swap2 = 0xDEAD_BEEF_CAFE_F00D, 0x0F0F_0F0F_F0F0_F0F0
    before = g.counters()
    link = RxeLink(env, br, name, {engine_qpn: mtu, engine_qpn + 1: mtu})
    writes = {}
    req = _requester_model(env, cq, qp, writes)
    rsp = _responder_model(gq2, engine_qpn + 1, 0x700, mtu, image)
    try:
        # the engine's atomics on rxe's word
        _post(req, qp, qp.post_atomic(WqeOp.ATOMIC_FA, m["addr"] + 0x100, m["rkey"], 0x10, local_addr=local))
        _post(req, qp, qp.post_atomic(WqeOp.ATOMIC_CS, m["addr"] + 0x100, m["rkey"], swap, orig + 0x10,
                                      local_addr=local + 8))
        await qp.ring_rdma_core()
        cqes = await cq.poll(2, CQE_CYCLES)
        # rxe's atomics on the engine's word
        g.fetch_add(q2, m2, 0, raddr=word, rkey=KEY, add=0x100, wr=700)
        link.expect(1)
        await link.wait_tx(3)
        wc_fa = g.poll_cq(q2, ms=5000)
        g.compare_swap(q2, m2, 8, raddr=word, rkey=KEY, compare=orig2 + 0x100, swap=swap2, wr=701)
        link.expect(1)
        await link.wait_tx(4)
        wc_cs = g.poll_cq(q2, ms=5000)
        await link.settle()
        _link_clean(link)
        tx, rx = link.frames("tx"), link.frames("rx")
        to1 = [f for f in rx if bth(f)["dqpn"] == engine_qpn]
        assert [(bth(f)["opcode"], bth(f)["psn"]) for f in to1] == [
            (Op.ATOMIC_ACK, 0xFFFFFE), (Op.ATOMIC_ACK, 0xFFFFFF)], summary(to1)
        assert [unpack(ATOMIC_ACK_ETH, f, OFF_EXT + 4)["orig"] for f in to1] == [orig, orig + 0x10]
        assert [(c.opcode, c.qpn, c.wqe_counter, c.syndrome) for c in cqes] == [
            (CqeOp.REQ, engine_qpn, 0, 0), (CqeOp.REQ, engine_qpn, 1, 0)], cqes
        _check_requester(env, link, req, cqes, writes, qp=qp)
        assert env.mem.read(local, 16) == orig.to_bytes(8, "little") + (orig + 0x10).to_bytes(8, "little")
        assert g.read_mem(m1, 0x100, 8) == swap.to_bytes(8, "little")
        # rxe's side
        from_rxe = [f for f in rx if bth(f)["dqpn"] == engine_qpn + 1]
        assert [(bth(f)["opcode"], bth(f)["psn"]) for f in from_rxe] == [
            (Op.FETCH_ADD, 0x700), (Op.COMPARE_SWAP, 0x701)], summary(from_rxe)
        results = []
        for f in from_rxe:
            r = rsp.receive(f)
            for addr, d in r.writes:
                image.write(addr, d)
            results.append(r)
        assert all(r.accepted for r in results), [r.reason for r in results]
        to_rxe = [f for f in tx if bth(f)["dqpn"] == gq2["qpn"]]
        golden = [r.response for r in results if r.response is not None]
        assert to_rxe == golden, f"engine sends {summary(to_rxe)}, golden responder {summary(golden)}"
        for wc, wr, op in ((wc_fa, 700, "FETCH_ADD"), (wc_cs, 701, "COMP_SWAP")):
            assert wc is not None, f"rxe: no completion for wr {wr}"
            assert {x: wc.get(x) for x in ("wr", "status_str", "opcode")} == {
                "wr": wr, "status_str": "success", "opcode": op}, wc
        assert g.read_mem(m2, 0, 16) == orig2.to_bytes(8, "little") + (orig2 + 0x100).to_bytes(8, "little")
        assert env.mem.read(word, 8) == swap2.to_bytes(8, "little")
        _check_rxe_counters(g, before, link)
        assert (g.qp_state(q1), g.qp_state(q2)) == (RTS, RTS)
    finally:
        link.close()
