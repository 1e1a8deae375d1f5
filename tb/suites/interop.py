"""The RTL engine against the real stack: Linux Soft-RoCE (rdma_rxe) in a qemu guest.

One guest for the whole run (``tb.interop.rxe_env.shared_guest``); each test resets the
engine, makes its own QPs and regions on both sides, and joins the engine's MAC TX/RX to
the guest's wire (``RxeLink``: deterministic from the engine's side, every frame in
``<test>.pcap`` / ``<test>.log`` of the run folder). Only deterministic facts are checked:
bytes in memory on both sides, opcodes, PSNs, AETH syndromes and MSNs, the engine's CQEs
(and that they equal the golden requester's for rxe's answers), rxe's completions
(verbs_peer ``poll``), the engine's ACKs / READ responses / ATOMIC ACKs (equal to the
golden responder's for rxe's requests). When the guest cannot start every test FAILS
with the reason.

Tests: ``engine_writes_to_rxe`` (engine requester: WRITE 256 B, 3 x MTU across the PSN
wrap), ``rxe_writes_to_engine`` (engine responder: rxe's 4-packet WRITE across the PSN
wrap, an 8-byte one), ``engine_reads_and_atomics_on_rxe`` (READ 1500 B, FETCH_ADD,
COMPARE_SWAP hit and miss), ``rxe_reads_and_atomics_on_engine`` (READ 3000 B, FETCH_ADD,
COMPARE_SWAP), ``odd_lengths_padded_by_rxe`` (rxe's padded WRITEs and READ RESPONSEs of
203 and 1027 bytes into the engine, the engine's padded READ RESPONSE of 203 bytes to
rxe), ``access_errors_both_ways`` (NAK remote access each way, the error completions),
``mtu4096_both_ways``, ``engine_sends_to_rxe`` (SEND, SEND_IMM, WRITE_IMM into rxe's receive
WQEs, odd lengths padded) and ``rnr_from_rxe`` (rxe's RNR NAKs: the engine's wait, resend,
RNR retries exhausted).

The engine pads a WRITE ONLY/LAST, a SEND and a READ RESPONSE whose payload is not a
multiple of 4 (BTH PadCnt), as the golden model; rxe NAKs (invalid request, QP to ERROR) an
unpadded one (docs/interoperability.md, finding 1).
"""
import cocotb

from model.cqe import CqContext
from model.frames import Port, QpContext
from model.memory import SparseMemory
from model.mr import MemoryRegion
from model.requester import RcRequester
from model.responder import RcResponder
from spec import params as P
from spec.formats import RNR_TIMER_NS, AETH, ATOMIC_ACK_ETH, BTH, OFF_BTH, OFF_EXT, Access, Aeth, CqeOp, Op, Syndrome, WqeOp, unpack
from tb.env import ENGINE_VERBS
from tb.interop.rxe_env import (MTU, PD, ENGINE_IP, ENGINE_MAC, GUEST_IP, GUEST_MAC, RxeLink, aeth, bth,
                                connect_rc, pattern, start, summary)

NEVER = 1 << 31                      # the engine's ACK timeout (cycles): no retransmission
ENGINE_PORT = Port(smac=ENGINE_MAC, sip=ENGINE_IP)
# the engine's memory region that rxe writes, reads and does atomics on
DST = 0x2000_0000
KEY = (0x12 << 8) | 0x34
REGION = MemoryRegion(key=KEY, base=DST, length=1 << 20, pd=PD,
                      access=Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC)
LOCAL = 0x0900_0000                  # where the engine's READ data and atomic originals land
CQE_CYCLES = 60_000                  # bound on waiting for an engine CQE (simulated cycles)


async def _start(dut):
    return await start(dut)


async def _connect(env, g, cq, *, engine_qpn, guest_qp, engine_psn, guest_psn, ack_every=16):
    """An RC QP on each side, connected to each other (no retransmission on either side)."""
    return await connect_rc(env, g, cq, engine_qpn=engine_qpn, guest_qp=guest_qp, engine_psn=engine_psn,
                            guest_psn=guest_psn, engine_timeout=NEVER, ack_every=ack_every)


def _requester_model(env, cq, qp, writes):
    """The golden requester of the engine's QP (``writes``: addr -> bytes it puts into GPU memory)."""
    m = RcRequester(ENGINE_PORT, {cq.cqn: CqContext(cq.cqn, cq.log_depth, base=cq.base)}, env.mem.read,
                    remote_ops=True, write_memory=lambda a, d: writes.__setitem__(a, bytes(d)), **ENGINE_VERBS)
    m.add_qp(QpContext(qpn=qp.qpn, remote_qpn=qp.remote_qpn, dmac=qp.dmac, dip=qp.dip, start_psn=qp.start_psn,
                       mtu=qp.mtu, cqn=cq.cqn, user_index=qp.user_index, rnr_retry=getattr(qp, "rnr_retry", 7)),
             timeout_ns=NEVER)
    m.expect = []                    # the frames it sends (``_post``)
    return m


def _receive_model(env, qp, gq, rcq, guest_psn):
    """The golden responder of the engine's QP ``qp`` with its receive queue (read from the
    engine's GPU memory as the engine reads it), receive CQ ``rcq`` (CQ 1) and minimum RNR
    timer code 1; ``gq``: rxe's QP, whose first PSN is ``guest_psn``."""
    m = RcResponder(ENGINE_PORT, two_sided=True, read_memory=env.mem.read,
                    cqs={rcq.cqn: CqContext(rcq.cqn, rcq.log_depth, base=rcq.base)})
    m.add_qp(QpContext(qpn=qp.qpn, remote_qpn=gq["qpn"], dmac=GUEST_MAC, dip=GUEST_IP, start_psn=guest_psn, mtu=MTU,
                       rq=qp.rq, rcqn=rcq.cqn, user_index=qp.user_index, min_rnr_timer=1), PD, ack_every=16)
    return m


def _check_requester(env, link, model, cqes, writes, qp=None):
    """The engine's frames are the golden requester's; given rxe's answers, so are its CQEs
    and the bytes it wrote to GPU memory (``qp``: only that engine QP's frames)."""
    got, answers = link.frames("tx"), link.frames("rx")
    if qp is not None:
        got = [f for f in got if bth(f)["dqpn"] == qp.remote_qpn]
        answers = [f for f in answers if bth(f)["dqpn"] == qp.qpn]
    want = model.expect
    assert got == want, f"engine frames {summary(got)}; golden requester {summary(want)}"
    for f in answers:
        model.on_response(f, 0)
    assert [c.raw for c in cqes] == [c.cqe for c in model.completions], (
        f"engine CQEs {[(c.opcode, c.wqe_counter, c.byte_cnt, c.syndrome) for c in cqes]}; golden requester "
        f"{[(c.opcode, c.wqe_counter, c.byte_cnt, c.syndrome) for c in model.completions]}")
    for addr, data in writes.items():
        assert env.mem.read(addr, len(data)) == data, f"GPU memory at {addr:#x}: engine wrote " \
            f"{env.mem.read(addr, len(data)).hex()}, golden requester {data.hex()}"


def _post(model, qp, w):
    model.expect += [t.frame for t in model.post(qp.qpn, w.wqe)]
    return w


# rxe's error counters (hw_counters of Linux 6.1's rdma_rxe), none of which may move
RXE_ERROR_COUNTERS = ("duplicate_request", "out_of_seq_request", "rcvd_rnr_err", "send_rnr_err", "rcvd_seq_err",
                      "retry_exceeded_err", "retry_rnr_exceeded_err", "completer_retry_err", "send_err")


def _check_rxe_counters(g, before, link, allowed=()):
    """rxe received every frame the engine sent and sent every frame the engine got, and
    counted no error (but those ``allowed``)."""
    after = g.counters()
    delta = {k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], int)}
    bad = {k: delta[k] for k in RXE_ERROR_COUNTERS if delta.get(k) and k not in allowed}
    assert not bad, f"rxe error counters moved: {bad}"
    got = (delta.get("rcvd_pkts"), delta.get("sent_pkts"))
    assert got == (len(link.frames("tx")), len(link.frames("rx"))), \
        f"rxe rcvd_pkts/sent_pkts {got}, the link carried {len(link.frames('tx'))}/{len(link.frames('rx'))}: {delta}"


def _link_clean(link):
    assert (link.missing, link.unexpected) == (0, 0), \
        f"rxe: {link.missing} frames owed never came, {link.unexpected} came unasked (see the log)"


@cocotb.test()
async def engine_writes_to_rxe(dut):
    """The engine as requester: RDMA WRITEs of 256 B (ONLY) and 3 x MTU (FIRST/MIDDLE/LAST,
    across the PSN wrap) into rxe's registered buffer. rxe ACKs each message (syndrome 0x1F,
    MSN counting messages, PSN of the AckReq packet); the engine's CQEs are the golden
    requester's; the guest's buffer holds the bytes (and nothing around them); rxe counts
    the packets and no error. (The engine's requester has no WRITE with immediate: its
    WQE opcode 0x09 is an invalid WQE there, as in the golden model.)"""
    g, br, env, cq = await _start(dut)
    S, G = 0xFFFFFE, 0x000100                          # the engine's PSNs wrap in the second WRITE
    qp, gq = await _connect(env, g, cq, engine_qpn=1, guest_qp=0, engine_psn=S, guest_psn=G)
    m = g.reg_mr(0, 16384)
    before = g.counters()
    link = RxeLink(env, br, "engine_writes_to_rxe", {1: MTU})
    writes = {}
    model = _requester_model(env, cq, qp, writes)
    try:
        # WRITE ONLY, 256 bytes
        src1, d1 = env.payload(256, seed=1)
        _post(model, qp, qp.post_write(m["addr"] + 0x100, m["rkey"], local_addr=src1, length=256))
        await qp.ring_rdma_core()
        c1 = await cq.poll(1, CQE_CYCLES)
        # WRITE of 3 x MTU: FIRST, MIDDLE, LAST
        src2, d2 = env.payload(3 * MTU, seed=2)
        _post(model, qp, qp.post_write(m["addr"] + 0x1000, m["rkey"], local_addr=src2, length=3 * MTU))
        await qp.ring_rdma_core()
        c2 = await cq.poll(1, CQE_CYCLES)
        await link.settle()
        _link_clean(link)
        tx, rx = link.frames("tx"), link.frames("rx")
        # the engine's frames, then rxe's answers
        assert [(bth(f)["opcode"], bth(f)["psn"], bth(f)["ackreq"] >> 7) for f in tx] == [
            (Op.WRITE_ONLY, 0xFFFFFE, 1), (Op.WRITE_FIRST, 0xFFFFFF, 0), (Op.WRITE_MIDDLE, 0, 0),
            (Op.WRITE_LAST, 1, 1)], summary(tx)
        assert [(bth(f)["opcode"], bth(f)["dqpn"], bth(f)["psn"], aeth(f)) for f in rx] == [
            (Op.ACK, 1, 0xFFFFFE, (Aeth.ACK, 1)), (Op.ACK, 1, 1, (Aeth.ACK, 2))], summary(rx)
        # the engine's completions
        for c, w_index, n in ((c1[0], 0, 256), (c2[0], 1, 3 * MTU)):
            assert (c.opcode, c.qpn, c.wqe_counter, c.byte_cnt, c.syndrome) == (CqeOp.REQ, 1, w_index, n, 0), c
        _check_requester(env, link, model, c1 + c2, writes)
        # the guest's side: bytes, nothing else written, nothing completed, counters, QP still RTS
        assert g.read_mem(0, 0x100, 256) == d1
        assert g.read_mem(0, 0x1000, 3 * MTU) == d2
        assert g.read_mem(0, 0xFC, 4) == bytes(4) and g.read_mem(0, 0x200, 4) == bytes(4)
        assert g.read_mem(0, 0x1000 + 3 * MTU, 4) == bytes(4)
        assert g.poll_cq(0, ms=0) is None                  # (a WRITE completes nothing at its responder)
        _check_rxe_counters(g, before, link)
        assert g.qp_state(0) == 3                          # IBV_QPS_RTS
    finally:
        link.close()


@cocotb.test()
async def rxe_writes_to_engine(dut):
    """The engine as responder: rxe posts an RDMA WRITE of 4096 bytes (4 packets at MTU
    1024) and one of 8 bytes into the engine's region. The engine ACKs (its ACKs are the
    golden responder's for rxe's frames), rxe reports success, and the engine's GPU memory
    holds the bytes (and nothing around them)."""
    g, br, env, cq = await _start(dut)
    S, G = 0x000200, 0xFFFFFD                          # rxe's PSNs wrap inside its 4-packet WRITE
    await env.ctl.register_mr(REGION.key, REGION.base, REGION.length, REGION.access, REGION.pd)
    qp, gq = await _connect(env, g, cq, engine_qpn=2, guest_qp=1, engine_psn=S, guest_psn=G)
    g.reg_mr(1, 8192)
    data = pattern(4096, 4)
    g.write_mem(1, 0, data)
    g.write_mem(1, 4096, pattern(8, 5))
    before = g.counters()
    link = RxeLink(env, br, "rxe_writes_to_engine", {2: MTU})
    model = RcResponder(ENGINE_PORT)
    model.add_qp(QpContext(qpn=2, remote_qpn=gq["qpn"], dmac=GUEST_MAC, dip=GUEST_IP, start_psn=G, mtu=MTU), PD,
                 ack_every=16)
    model.register(REGION)
    try:
        g.write(1, 1, 0, 4096, raddr=DST + 0x40, rkey=KEY, wr=21)
        link.expect(4)
        await link.wait_tx(1)
        wc1 = g.poll_cq(1, ms=5000)
        g.write(1, 1, 4096, 8, raddr=DST + 0x2000, rkey=KEY, wr=22)
        link.expect(1)
        await link.wait_tx(2)
        wc2 = g.poll_cq(1, ms=5000)
        await link.settle()
        _link_clean(link)
        tx, rx = link.frames("tx"), link.frames("rx")
        assert [(bth(f)["opcode"], bth(f)["psn"], bth(f)["ackreq"] >> 7, (bth(f)["flags"] >> 4) & 3) for f in rx] == [
            (Op.WRITE_FIRST, 0xFFFFFD, 0, 0), (Op.WRITE_MIDDLE, 0xFFFFFE, 0, 0), (Op.WRITE_MIDDLE, 0xFFFFFF, 0, 0),
            (Op.WRITE_LAST, 0, 1, 0), (Op.WRITE_ONLY, 1, 1, 0)], summary(rx)
        # the engine's ACKs are the golden responder's for rxe's frames
        results = [model.receive(f) for f in rx]
        assert all(r.accepted for r in results), [r.reason for r in results]
        want = [r.response for r in results if r.response is not None]
        assert tx == want, f"engine sends {summary(tx)}, golden responder {summary(want)}"
        assert [(bth(f)["opcode"], bth(f)["dqpn"], bth(f)["psn"], aeth(f)) for f in tx] == [
            (Op.ACK, gq["qpn"], 0, (Aeth.ACK, 1)), (Op.ACK, gq["qpn"], 1, (Aeth.ACK, 2))], summary(tx)
        # rxe's completions
        for wc, wr, n in ((wc1, 21, 4096), (wc2, 22, 8)):
            assert wc is not None, f"rxe: no completion for wr {wr}"
            assert {k: wc.get(k) for k in ("wr", "status_str", "opcode", "byte_len", "qp_num")} == {
                "wr": wr, "status_str": "success", "opcode": "RDMA_WRITE", "byte_len": n, "qp_num": gq["qpn"]}, wc
        # the engine's memory
        assert env.mem.read(DST + 0x40, 4096) == data
        assert env.mem.read(DST + 0x2000, 8) == pattern(8, 5)
        assert env.mem.read(DST + 0x3C, 4) == bytes(4) and env.mem.read(DST + 0x40 + 4096, 4) == bytes(4)
        c = await env.ctl.read_counters()
        assert (c["rx_accepted"], c["acks_sent"], c["naks_sent"]) == (5, 2, 0), c
        assert cq.try_poll() is None, "an engine CQE for a remote WRITE without immediate"
        _check_rxe_counters(g, before, link)
        assert g.qp_state(1) == 3
    finally:
        link.close()


@cocotb.test()
async def engine_reads_and_atomics_on_rxe(dut):
    """The engine as requester of READ and 8-byte atomics: a READ of 1500 bytes (2 READ
    RESPONSE packets), a FETCH_ADD and a COMPARE_SWAP that hits, then one that misses, on
    rxe's buffer. The engine's frames and CQEs are the golden requester's; the READ data
    and the originals land in the engine's GPU memory; the words in the guest change as
    the arithmetic says."""
    g, br, env, cq = await _start(dut)
    S, G = 0x00ABC0, 0x000400
    qp, gq = await _connect(env, g, cq, engine_qpn=3, guest_qp=2, engine_psn=S, guest_psn=G)
    m = g.reg_mr(2, 8192)
    rdata = pattern(1500, 6)
    g.write_mem(2, 0x200, rdata)
    orig = 0x1122_3344_5566_7788
    g.write_mem(2, 0x1000, orig.to_bytes(8, "little"))     # the guest's word, host order
    before = g.counters()
    link = RxeLink(env, br, "engine_reads_and_atomics_on_rxe", {3: MTU})
    writes = {}
    model = _requester_model(env, cq, qp, writes)
    swap = 0xDEAD_BEEF_CAFE_F00D
    try:
        _post(model, qp, qp.post_read(m["addr"] + 0x200, m["rkey"], LOCAL, 1500))
        _post(model, qp, qp.post_atomic(WqeOp.ATOMIC_FA, m["addr"] + 0x1000, m["rkey"], 0x10, local_addr=LOCAL + 0x800))
        _post(model, qp, qp.post_atomic(WqeOp.ATOMIC_CS, m["addr"] + 0x1000, m["rkey"], swap, orig + 0x10,
                                        local_addr=LOCAL + 0x808))
        _post(model, qp, qp.post_atomic(WqeOp.ATOMIC_CS, m["addr"] + 0x1000, m["rkey"], 5, 1,
                                        local_addr=LOCAL + 0x810))
        await qp.ring_rdma_core()
        cqes = await cq.poll(4, CQE_CYCLES)
        await link.settle()
        _link_clean(link)
        tx, rx = link.frames("tx"), link.frames("rx")
        assert [(bth(f)["opcode"], bth(f)["psn"]) for f in tx] == [
            (Op.READ_REQUEST, S), (Op.FETCH_ADD, S + 2), (Op.COMPARE_SWAP, S + 3), (Op.COMPARE_SWAP, S + 4)], summary(tx)
        assert [(bth(f)["opcode"], bth(f)["psn"]) for f in rx] == [
            (Op.READ_RESP_FIRST, S), (Op.READ_RESP_LAST, S + 1), (Op.ATOMIC_ACK, S + 2), (Op.ATOMIC_ACK, S + 3),
            (Op.ATOMIC_ACK, S + 4)], summary(rx)
        origs = [unpack(ATOMIC_ACK_ETH, f, OFF_EXT + 4)["orig"] for f in rx if bth(f)["opcode"] == Op.ATOMIC_ACK]
        assert origs == [orig, orig + 0x10, swap], [hex(o) for o in origs]
        for c, k in zip(cqes, range(4)):
            assert (c.opcode, c.qpn, c.wqe_counter, c.syndrome) == (CqeOp.REQ, 3, k, 0), c
        _check_requester(env, link, model, cqes, writes)
        # plain numbers on both sides
        assert env.mem.read(LOCAL, 1500) == rdata
        assert env.mem.read(LOCAL + 0x800, 8) == orig.to_bytes(8, "little")
        assert env.mem.read(LOCAL + 0x808, 8) == (orig + 0x10).to_bytes(8, "little")
        assert env.mem.read(LOCAL + 0x810, 8) == swap.to_bytes(8, "little")
        assert g.read_mem(2, 0x1000, 8) == swap.to_bytes(8, "little")
        assert g.poll_cq(2, ms=0) is None
        _check_rxe_counters(g, before, link)
        assert g.qp_state(2) == 3
    finally:
        link.close()


@cocotb.test()
async def rxe_reads_and_atomics_on_engine(dut):
    """The engine as responder of READ and 8-byte atomics: rxe READs 3000 bytes of the
    engine's memory (3 READ RESPONSE packets), then a FETCH_ADD and a COMPARE_SWAP on a
    word there. The engine's answers are the golden responder's for rxe's requests; rxe
    reports success with the bytes and originals; the engine's word changes as said."""
    g, br, env, cq = await _start(dut)
    S, G = 0x000300, 0x7FFFFE
    await env.ctl.register_mr(REGION.key, REGION.base, REGION.length, REGION.access, REGION.pd)
    qp, gq = await _connect(env, g, cq, engine_qpn=4, guest_qp=3, engine_psn=S, guest_psn=G)
    g.reg_mr(3, 8192)
    image = SparseMemory()
    rdata = pattern(3000, 7)
    word, orig = DST + 0x8000, 0x0102_0304_0506_0708
    for addr, d in ((DST + 0x4000, rdata), (word, orig.to_bytes(8, "little"))):
        env.mem.write(addr, d)
        image.write(addr, d)
    before = g.counters()
    link = RxeLink(env, br, "rxe_reads_and_atomics_on_engine", {4: MTU})
    model = RcResponder(ENGINE_PORT, remote_ops=True, read_memory=image.read)
    model.add_qp(QpContext(qpn=4, remote_qpn=gq["qpn"], dmac=GUEST_MAC, dip=GUEST_IP, start_psn=G, mtu=MTU), PD,
                 ack_every=16)
    model.register(REGION)
    swap = 0x0F0F_0F0F_F0F0_F0F0
    try:
        g.read(3, 3, 0, 3000, raddr=DST + 0x4000, rkey=KEY, wr=31)
        link.expect(1)
        await link.wait_tx(3)
        wc_read = g.poll_cq(3, ms=5000)
        g.fetch_add(3, 3, 0x1000, raddr=word, rkey=KEY, add=0x100, wr=32)
        link.expect(1)
        await link.wait_tx(4)
        wc_fa = g.poll_cq(3, ms=5000)
        g.compare_swap(3, 3, 0x1008, raddr=word, rkey=KEY, compare=orig + 0x100, swap=swap, wr=33)
        link.expect(1)
        await link.wait_tx(5)
        wc_cs = g.poll_cq(3, ms=5000)
        await link.settle()
        _link_clean(link)
        tx, rx = link.frames("tx"), link.frames("rx")
        assert [(bth(f)["opcode"], bth(f)["psn"]) for f in rx] == [
            (Op.READ_REQUEST, G), (Op.FETCH_ADD, G + 3), (Op.COMPARE_SWAP, G + 4)], summary(rx)
        results = []
        for f in rx:
            r = model.receive(f)
            for addr, d in r.writes:                   # in order: the compare-swap sees the add
                image.write(addr, d)
            results.append(r)
        assert all(r.accepted for r in results), [r.reason for r in results]
        want = [o for r in results for o in (r.read_responses or ([r.response] if r.response is not None else []))]
        assert tx == want, f"engine sends {summary(tx)}, golden responder {summary(want)}"
        assert [(bth(f)["opcode"], bth(f)["psn"]) for f in tx] == [
            (Op.READ_RESP_FIRST, G), (Op.READ_RESP_MIDDLE, G + 1), (Op.READ_RESP_LAST, G + 2),
            (Op.ATOMIC_ACK, G + 3), (Op.ATOMIC_ACK, G + 4)], summary(tx)
        for wc, wr, op in ((wc_read, 31, "RDMA_READ"), (wc_fa, 32, "FETCH_ADD"), (wc_cs, 33, "COMP_SWAP")):
            assert wc is not None, f"rxe: no completion for wr {wr}"
            assert {k: wc.get(k) for k in ("wr", "status_str", "opcode", "qp_num")} == {
                "wr": wr, "status_str": "success", "opcode": op, "qp_num": gq["qpn"]}, wc
        assert g.read_mem(3, 0, 3000) == rdata
        assert g.read_mem(3, 0x1000, 8) == orig.to_bytes(8, "little")
        assert g.read_mem(3, 0x1008, 8) == (orig + 0x100).to_bytes(8, "little")
        assert env.mem.read(word, 8) == swap.to_bytes(8, "little")
        _check_rxe_counters(g, before, link)
        assert g.qp_state(3) == 3
    finally:
        link.close()



@cocotb.test()
async def odd_lengths_padded_by_rxe(dut):
    """Lengths that are not multiples of 4 where the engine takes rxe's padding or sends
    a READ RESPONSE: rxe WRITEs 203 bytes (ONLY, PadCnt 1) and 1027 bytes (FIRST + LAST of
    3 bytes, PadCnt 1) into the engine, READs 203 bytes of it, and the engine READs 203 and
    1027 bytes of rxe's buffer (rxe's READ RESPONSE ONLY/LAST carry PadCnt 1). The engine
    strips the pad: exactly the bytes land, not one more, on both sides; every completion
    succeeds. The engine's READ RESPONSE ONLY of 203 bytes goes out with PadCnt 1 (as the
    golden responder builds it) and rxe's requester takes it. (The engine's own WRITEs of
    such lengths: tb/suites/interop_mtu.py's engine_odd_lengths_*.)"""
    g, br, env, cq = await _start(dut)
    await env.ctl.register_mr(REGION.key, REGION.base, REGION.length, REGION.access, REGION.pd)
    qp, gq = await _connect(env, g, cq, engine_qpn=5, guest_qp=4, engine_psn=0x10, guest_psn=0x20)
    qp2, gq2 = await _connect(env, g, cq, engine_qpn=6, guest_qp=5, engine_psn=0x30, guest_psn=0x40)
    g.reg_mr(4, 8192)
    m2 = g.reg_mr(5, 8192)
    data = pattern(2048, 9)
    g.write_mem(4, 0, data)
    g.write_mem(5, 0, data)
    fill = b"\xee" * 0x3000
    env.mem.write(DST + 0x10000, fill)                # around what rxe writes
    env.mem.write(DST + 0x12000, data)                # what rxe reads
    env.mem.write(LOCAL + 0x4000, fill[:0x2000])      # where the engine's READs land
    image = SparseMemory()
    image.write(DST + 0x12000, data)
    before = g.counters()
    link = RxeLink(env, br, "odd_lengths_padded_by_rxe", {5: MTU, 6: MTU})
    model = RcResponder(ENGINE_PORT, remote_ops=True, read_memory=image.read)
    model.add_qp(QpContext(qpn=5, remote_qpn=gq["qpn"], dmac=GUEST_MAC, dip=GUEST_IP, start_psn=0x20, mtu=MTU), PD,
                 ack_every=16)
    model.register(REGION)
    writes = {}
    req = _requester_model(env, cq, qp2, writes)
    try:
        wcs = []
        for n, at, wr in ((203, DST + 0x10000, 41), (1027, DST + 0x11000, 42)):
            g.write(4, 4, 0, n, raddr=at, rkey=KEY, wr=wr)
            link.expect(-(-n // MTU))
            await link.wait_tx(len(link.frames("tx")) + 1)
            wcs.append(g.poll_cq(4, ms=5000))
        g.read(4, 4, 4096, 203, raddr=DST + 0x12000, rkey=KEY, wr=43)
        link.expect(1)
        await link.wait_tx(3)
        wcs.append(g.poll_cq(4, ms=5000))
        _post(req, qp2, qp2.post_read(m2["addr"], m2["rkey"], LOCAL + 0x4000, 203))
        _post(req, qp2, qp2.post_read(m2["addr"] + 0x200, m2["rkey"], LOCAL + 0x5000, 1027))
        await qp2.ring_rdma_core()
        cqes = await cq.poll(2, CQE_CYCLES)
        await link.settle()
        _link_clean(link)
        tx, rx = link.frames("tx"), link.frames("rx")
        pad = lambda f: (bth(f)["flags"] >> 4) & 3
        # rxe's requests to QP 5 and its READ RESPONSEs to QP 6, with their pad counts
        assert [(bth(f)["opcode"], bth(f)["psn"], pad(f), len(f)) for f in rx] == [
            (Op.WRITE_ONLY, 0x20, 1, 74 + 204), (Op.WRITE_FIRST, 0x21, 0, 74 + 1024), (Op.WRITE_LAST, 0x22, 1, 58 + 4),
            (Op.READ_REQUEST, 0x23, 0, 74),
            (Op.READ_RESP_ONLY, 0x30, 1, 62 + 204), (Op.READ_RESP_FIRST, 0x31, 0, 62 + 1024),
            (Op.READ_RESP_LAST, 0x32, 1, 62 + 4)], summary(rx)
        # the engine: ACKs and the READ RESPONSE as the golden responder, READ REQUESTs as the golden requester
        to_rxe5 = [f for f in tx if bth(f)["dqpn"] == gq["qpn"]]
        results = [model.receive(f) for f in rx if bth(f)["dqpn"] == 5]
        assert all(r.accepted for r in results), [r.reason for r in results]
        want = [o for r in results for o in (r.read_responses or ([r.response] if r.response is not None else []))]
        assert to_rxe5 == want, f"engine sends {summary(to_rxe5)}, golden responder {summary(want)}"
        assert [(bth(f)["opcode"], bth(f)["psn"], pad(f), len(f)) for f in to_rxe5] == [
            (Op.ACK, 0x20, 0, 62), (Op.ACK, 0x22, 0, 62), (Op.READ_RESP_ONLY, 0x23, 1, 62 + 204)], summary(to_rxe5)
        _check_requester(env, link, req, cqes, writes, qp=qp2)
        assert [(c.opcode, c.wqe_counter, c.byte_cnt, c.syndrome) for c in cqes] == [
            (CqeOp.REQ, 0, 203, 0), (CqeOp.REQ, 1, 1027, 0)], cqes
        # rxe's completions
        for wc, wr, op, n in zip(wcs, (41, 42, 43), ("RDMA_WRITE", "RDMA_WRITE", "RDMA_READ"), (203, 1027, 203)):
            assert wc is not None, f"rxe: no completion for wr {wr}"
            assert {k: wc.get(k) for k in ("wr", "status_str", "opcode", "byte_len")} == {
                "wr": wr, "status_str": "success", "opcode": op, "byte_len": n}, wc
        # exactly the bytes, on both sides
        assert env.mem.read(DST + 0x10000, 208) == data[:203] + fill[:5]
        assert env.mem.read(DST + 0x11000, 1032) == data[:1027] + fill[:5]
        assert env.mem.read(LOCAL + 0x4000, 208) == data[:203] + fill[:5]
        assert env.mem.read(LOCAL + 0x5000, 1032) == data[0x200:0x200 + 1027] + fill[:5]
        assert g.read_mem(4, 4096, 208) == data[:203] + bytes(5)
        _check_rxe_counters(g, before, link)
        assert (g.qp_state(4), g.qp_state(5)) == (3, 3)
    finally:
        link.close()


@cocotb.test()
async def access_errors_both_ways(dut):
    """A WRITE with a key the responder does not know, both ways. The engine's WRITE to an
    rkey rxe never gave out: rxe answers NAK remote access error (AETH 0x62, MSN 0); the
    engine completes the WQE with an error CQE (REMOTE_ACCESS_ERR), as the golden requester
    says, and nothing lands. rxe's WRITE to a key the engine has no region under: the
    engine answers the golden responder's NAK; rxe completes the work request with
    'remote access error'; the engine's memory is untouched. Both of rxe's QPs end in ERROR."""
    g, br, env, cq = await _start(dut)
    await env.ctl.register_mr(REGION.key, REGION.base, REGION.length, REGION.access, REGION.pd)
    qp, gq = await _connect(env, g, cq, engine_qpn=7, guest_qp=6, engine_psn=0x500, guest_psn=0x600)
    qp2, gq2 = await _connect(env, g, cq, engine_qpn=8, guest_qp=7, engine_psn=0x700, guest_psn=0x800)
    m = g.reg_mr(6, 4096)
    g.reg_mr(7, 4096)
    g.write_mem(7, 0, pattern(64, 11))
    bad_rkey = (m["rkey"] + 0x100) & 0xFFFF_FFFF           # another key index: no such MR in rxe
    bad_key = ((KEY >> 8) + 1) << 8 | (KEY & 0xFF)         # no region in the engine's table
    env.mem.write(DST + 0x6000, b"\xee" * 128)
    link = RxeLink(env, br, "access_errors_both_ways", {7: MTU, 8: MTU})
    writes = {}
    req = _requester_model(env, cq, qp, writes)
    rsp = RcResponder(ENGINE_PORT)
    rsp.add_qp(QpContext(qpn=8, remote_qpn=gq2["qpn"], dmac=GUEST_MAC, dip=GUEST_IP, start_psn=0x800, mtu=MTU), PD,
               ack_every=16)
    rsp.register(REGION)
    try:
        src, d = env.payload(64, seed=12)
        _post(req, qp, qp.post_write(m["addr"], bad_rkey, local_addr=src, length=64))
        await qp.ring_rdma_core()
        cqes = await cq.poll(1, CQE_CYCLES)
        g.write(7, 7, 0, 64, raddr=DST + 0x6020, rkey=bad_key, wr=71)
        link.expect(1)
        await link.wait_tx(2)
        wc = g.poll_cq(7, ms=5000)
        await link.settle()
        _link_clean(link)
        tx, rx = link.frames("tx"), link.frames("rx")
        assert [(bth(f)["opcode"], bth(f)["dqpn"], bth(f)["psn"]) for f in tx] == [
            (Op.WRITE_ONLY, gq["qpn"], 0x500), (Op.ACK, gq2["qpn"], 0x800)], summary(tx)
        assert [(bth(f)["opcode"], bth(f)["dqpn"], bth(f)["psn"]) for f in rx] == [
            (Op.ACK, 7, 0x500), (Op.WRITE_ONLY, 8, 0x800)], summary(rx)
        assert aeth(rx[0]) == (Aeth.NAK_REMOTE_ACCESS, 0), f"rxe answers AETH {aeth(rx[0])}"
        # the engine as requester: its error CQE is the golden requester's for rxe's NAK
        _check_requester(env, link, req, cqes, writes, qp=qp)
        assert (cqes[0].opcode, cqes[0].qpn, cqes[0].wqe_counter, cqes[0].syndrome) == (
            CqeOp.REQ_ERR, 7, 0, Syndrome.REMOTE_ACCESS_ERR), cqes[0]
        assert g.read_mem(6, 0, 64) == bytes(64)
        # the engine as responder: its NAK is the golden responder's
        r = rsp.receive(rx[1])
        assert (r.accepted, r.response_kind) == (False, "nak_remote_access"), (r.accepted, r.reason, r.response_kind)
        assert tx[1] == r.response, f"engine NAK {tx[1].hex()}, golden responder {r.response.hex()}"
        assert aeth(tx[1]) == (Aeth.NAK_REMOTE_ACCESS, 0)
        assert wc is not None, "rxe: no completion for its WRITE"
        # (verbs leaves a failed completion's opcode undefined: rxe reports 0, SEND; not checked)
        assert {k: wc.get(k) for k in ("wr", "status", "status_str", "qp_num")} == {
            "wr": 71, "status": 10, "status_str": "remote_access_error", "qp_num": gq2["qpn"]}, wc   # IBV_WC_REM_ACCESS_ERR
        assert env.mem.read(DST + 0x6000, 128) == b"\xee" * 128
        c = await env.ctl.read_counters()
        assert (c["naks_sent"], c["naks_received"], c["error_cqes"]) == (1, 1, 1), c
        assert (g.qp_state(6), g.qp_state(7)) == (6, 6)            # IBV_QPS_ERR both
    finally:
        link.close()


@cocotb.test()
async def mtu4096_both_ways(dut):
    """Path MTU 4096 (the short form of tb/suites/interop_mtu.py, which ``make interop``
    runs at 1024 and 4096 in full), on one engine reset: the engine WRITEs 3 x 4096 + 4 B
    to rxe; rxe WRITEs 3 x 4096 + 5 B to the engine (its LAST padded); the engine READs
    3 x 4096 + 5 B of rxe; rxe READs 3 x 4096 + 8 B of the engine; a FETCH_ADD and a
    COMPARE_SWAP each way. Each checked as in tb/interop/mtu_cases.py."""
    from tb.interop import mtu_cases as C
    g, br, env, cq = await _start(dut)
    m = 4096
    await C.engine_writes(g, br, env, cq, name="mtu4096_engine_writes", mtu=m, sizes=[3 * m + 4], engine_qpn=1,
                          engine_psn=0xFFFFFE)
    await C.rxe_writes(g, br, env, cq, name="mtu4096_rxe_writes", mtu=m, sizes=[3 * m + 5], engine_qpn=2,
                       guest_psn=0xFFFFFD)
    await C.engine_reads(g, br, env, cq, name="mtu4096_engine_reads", mtu=m, n=3 * m + 5, engine_qpn=3,
                         engine_psn=0x00ABC0)
    await C.rxe_reads(g, br, env, cq, name="mtu4096_rxe_reads", mtu=m, n=3 * m + 8, engine_qpn=4, guest_psn=0x7FFFFE)
    await C.atomics(g, br, env, cq, name="mtu4096_atomics", mtu=m, engine_qpn=5)


async def _feed(model, link, qp):
    """The golden requester given rxe's answers to ``qp`` at the cycles they came, its RNR
    timers run at those cycles (the frames it then sends join ``model.expect``)."""
    ns = 1000 // P.CLOCK_MHZ
    for cycle, d, f in link.log:
        if d != "rx" or bth(f)["dqpn"] != qp.qpn:
            continue
        deadline = model.next_deadline()
        if deadline is not None and deadline <= cycle * ns:
            model.expect += [t.frame for t in model.on_timeout(deadline)[0]]
        model.expect += [t.frame for t in model.on_response(f, cycle * ns).retransmit]
    deadline = model.next_deadline()
    if deadline is not None and deadline <= link.now * ns:
        model.expect += [t.frame for t in model.on_timeout(deadline)[0]]


@cocotb.test()
async def engine_sends_to_rxe(dut):
    """The engine as requester of the two-sided verbs: SEND of 300 B (ONLY) and 3000 B
    (FIRST/MIDDLE/LAST) into rxe's receive WQEs of three buffers each, SEND_IMM of 5 B
    inline (padded: PadCnt 3), a 0-byte SEND with immediate, WRITE_IMM of 1027 B (padded).
    rxe's receive completions (RECV / RECV_RDMA_WITH_IMM, byte_len, immediate) and buffers
    hold what was sent; the engine's frames and CQEs are the golden requester's."""
    g, br, env, cq = await _start(dut)
    qp, gq = await _connect(env, g, cq, engine_qpn=6, guest_qp=60, engine_psn=0x00FFF0, guest_psn=0x10)
    m = g.reg_mr(60, 65536)
    for k in range(5):                                 # 3 buffers each: 1000 B at 4 KiB strides
        g.post_recv(60, 60, sges=[(0x1000 * (3 * k + j) + 8 * j, 1000) for j in range(3)], wr=100 + k)
    before = g.counters()
    link = RxeLink(env, br, "engine_sends_to_rxe", {6: MTU})
    writes = {}
    model = _requester_model(env, cq, qp, writes)
    try:
        s300, d300 = env.payload(300, seed=11)
        s3000, d3000 = env.payload(3000, seed=12)
        s1027, d1027 = env.payload(1027, seed=13)
        _post(model, qp, qp.post_send(local_addr=s300, length=300))
        _post(model, qp, qp.post_send(local_addr=s3000, length=3000))
        _post(model, qp, qp.post_send(inline=b"hello", imm=0x11223344))
        _post(model, qp, qp.post_send(imm=0xA5A5A5A5))
        _post(model, qp, qp.post_write(m["addr"] + 0xF000, m["rkey"], local_addr=s1027, length=1027,
                                       opcode=WqeOp.RDMA_WRITE_IMM, imm=0xFEEDC0DE))
        await qp.ring_rdma_core()
        cqes = await cq.poll(5, CQE_CYCLES)
        await link.settle()
        _link_clean(link)
        tx = link.frames("tx")
        assert [(bth(f)["opcode"], (bth(f)["flags"] >> 4) & 3) for f in tx] == [
            (Op.SEND_ONLY, 0), (Op.SEND_FIRST, 0), (Op.SEND_MIDDLE, 0), (Op.SEND_LAST, 0), (Op.SEND_ONLY_IMM, 3),
            (Op.SEND_ONLY_IMM, 0), (Op.WRITE_FIRST, 0), (Op.WRITE_LAST_IMM, 1)], summary(tx)
        _check_requester(env, link, model, cqes, writes)
        assert all((c.opcode, c.syndrome) == (CqeOp.REQ, 0) for c in cqes), cqes
        # rxe's side: a receive completion per message, in order, and the bytes
        wcs = g.wait_cq(60, 5)
        got = [(w["wr"], w["status_name"], w["opcode"], w["byte_len"], w.get("imm") if w["with_imm"] else None)
               for w in wcs]
        assert got == [(100, "IBV_WC_SUCCESS", "RECV", 300, None), (101, "IBV_WC_SUCCESS", "RECV", 3000, None),
                       (102, "IBV_WC_SUCCESS", "RECV", 5, 0x11223344), (103, "IBV_WC_SUCCESS", "RECV", 0, 0xA5A5A5A5),
                       (104, "IBV_WC_SUCCESS", "RECV_RDMA_WITH_IMM", 1027, 0xFEEDC0DE)], got
        def scattered(k, n):
            return b"".join(g.read_mem(60, 0x1000 * (3 * k + j) + 8 * j, min(1000, n - 1000 * j))
                            for j in range(3) if n > 1000 * j)
        assert scattered(0, 300) == d300 and scattered(1, 3000) == d3000 and scattered(2, 5) == b"hello"
        assert g.read_mem(60, 0xF000, 1027) == d1027 and g.read_mem(60, 0xF000 + 1027, 4) == bytes(4)
        _check_rxe_counters(g, before, link)
    finally:
        link.close()


@cocotb.test()
async def rnr_from_rxe(dut):
    """rxe has no receive WQE for the engine's SEND: it answers RNR NAK (timer code 1,
    10 us); the engine resends no earlier than 5,000 cycles after it came; after the second
    RNR NAK a receive is posted and the third copy lands. On a second QP with rnr_retry 1
    and nothing posted, the second RNR NAK fails the SEND with RNR_RETRY_EXC_ERR and the
    WRITE behind it is flushed. Frames and CQEs are the golden requester's; rxe counts
    the RNR NAKs it sent (send_rnr_err) and nothing else."""
    g, br, env, cq = await _start(dut)
    qp, gq = await connect_rc(env, g, cq, engine_qpn=7, guest_qp=61, engine_psn=0x300, guest_psn=0x30,
                              engine_timeout=NEVER, min_rnr=1)
    qp2, gq2 = await connect_rc(env, g, cq, engine_qpn=8, guest_qp=62, engine_psn=0x800, guest_psn=0x80,
                                engine_timeout=NEVER, min_rnr=1, rnr_retry=1)
    g.reg_mr(61, 4096)
    before = g.counters()
    link = RxeLink(env, br, "rnr_from_rxe", {7: MTU, 8: MTU})
    writes = {}
    model = _requester_model(env, cq, qp, writes)
    model2 = _requester_model(env, cq, qp2, writes)
    wait = RNR_TIMER_NS[1] * P.CLOCK_MHZ // 1000             # 5,000 cycles
    try:
        src, data = env.payload(200, seed=21)
        _post(model, qp, qp.post_send(local_addr=src, length=200, imm=0x5EED))
        await qp.ring_rdma_core()
        rnr = lambda q: [(c, f) for c, d, f in link.log if d == "rx" and bth(f)["dqpn"] == q
                         and aeth(f)[0] >> 5 == Aeth.KIND_RNR]
        await env.wait_for(lambda: len(rnr(7)) >= 2, 60_000, lambda: f"two RNR NAKs (got {len(rnr(7))})")
        g.post_recv(61, 61, 0x100, 256, wr=7)
        c1 = await cq.poll(1, 60_000)
        # the second QP: rnr_retry 1, nothing posted
        _post(model2, qp2, qp2.post_send(local_addr=src, length=200))
        _post(model2, qp2, qp2.post_write(0x1000, 0x77, local_addr=src, length=8))
        await qp2.ring_rdma_core()
        c2 = await cq.poll(2, 60_000)
        await link.settle()
        _link_clean(link)
        sends = [(c, f) for c, d, f in link.log if d == "tx" and bth(f)["dqpn"] == gq["qpn"]]
        assert [bth(f)["opcode"] for _, f in sends] == [Op.SEND_ONLY_IMM] * 3, summary([f for _, f in sends])
        for (nak_at, nak), (resent, f) in zip(rnr(7), sends[1:]):
            assert aeth(nak)[0] == Aeth.RNR_NAK | 1 and bth(nak)["psn"] == 0x300
            assert resent >= nak_at + wait, f"resent at cycle {resent}, RNR NAK at {nak_at}: waited < {wait}"
        for mod, q, cqes in ((model, qp, c1), (model2, qp2, c2)):
            await _feed(mod, link, q)
            got = [f for f in link.frames("tx") if bth(f)["dqpn"] == q.remote_qpn]
            assert got == mod.expect, f"QP {q.qpn}: engine {summary(got)}; golden requester {summary(mod.expect)}"
            assert [c.raw for c in cqes] == [c.cqe for c in mod.completions], (q.qpn, cqes, mod.completions)
        assert (c1[0].opcode, c1[0].syndrome) == (CqeOp.REQ, 0)
        assert [(c.opcode, c.syndrome) for c in c2] == [(CqeOp.REQ_ERR, Syndrome.RNR_RETRY_EXC_ERR),
                                                        (CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR)], c2
        assert len(rnr(8)) == 2
        wc = g.poll_cq(61, ms=5000)
        assert (wc["wr"], wc["status_name"], wc["opcode"], wc["byte_len"], wc["imm"]) == (
            7, "IBV_WC_SUCCESS", "RECV", 200, 0x5EED), wc
        assert g.read_mem(61, 0x100, 200) == data
        # rxe's responder: an RNR NAK per copy of the SENDs (2 + 2, send_rnr_err) and, on the
        # second QP, the WRITE behind the RNR'd SEND out of sequence each time (its PSN
        # sequence NAK: out_of_seq_request 2), which the engine ignores while it waits
        _check_rxe_counters(g, before, link, allowed=("send_rnr_err", "out_of_seq_request"))
        after = g.counters()
        assert after["out_of_seq_request"] - before["out_of_seq_request"] == 2
        assert (await env.ctl.read_counters())["rnr_naks_received"] == 4
    finally:
        link.close()


@cocotb.test()
async def rxe_sends_to_engine(dut):
    """The engine as responder of the two-sided verbs: its receive queue (16 WQEs of up to 4
    segments in its GPU memory, posted as rdma-core does) takes rxe's SEND of 300 B, SEND of
    3000 B (three packets at MTU 1024, each into one of the WQE's MTU-sized segments), SEND
    with immediate of 5 B (rxe pads it) and WRITE with immediate of 1027 B (written at its
    RETH address, a WQE taken for its completion). The engine's ACKs are the golden
    responder's for rxe's frames; its receive CQEs are the golden responder's (bytes) and,
    as plain numbers, RESP_SEND / RESP_SEND_IMM / RESP_WR_IMM with byte count, immediate
    and WQE counter; the bytes land; rxe completes every send."""
    g, br, env, cq = await _start(dut)
    await env.ctl.register_mr(REGION.key, REGION.base, REGION.length, REGION.access, REGION.pd)
    rcq = await env.cq(1, 6)
    qp, gq = await connect_rc(env, g, cq, engine_qpn=10, guest_qp=63, engine_psn=0x40, guest_psn=0xFFFFFE,
                              engine_timeout=NEVER, engine_kw=dict(recv=(4, 6), rcq=rcq, min_rnr_timer=1))
    g.reg_mr(63, 8192)
    data = pattern(4096, 7)
    g.write_mem(63, 0, data)
    bufs = 0x0A00_0000
    segs = [[(bufs + 0x10000 * k + 0x1000 * j, 1024 if j < 2 else 2048) for j in range(3)] for k in range(4)]
    qp.post_recv(*segs)
    before = g.counters()
    link = RxeLink(env, br, "rxe_sends_to_engine", {10: MTU})
    model = _receive_model(env, qp, gq, rcq, 0xFFFFFE)
    model.register(REGION)
    try:
        posts = [("send", 0, 300, None, 31), ("send", 0, 3000, None, 32), ("send_imm", 5, 5, 0x11223344, 33),
                 ("write_imm", 100, 1027, 0xCAFEF00D, 34)]
        for verb, off, n, imm, wr in posts:
            if verb == "send":
                g.send(63, 63, off, n, wr=wr)
            elif verb == "send_imm":
                g.send_imm(63, 63, off, n, imm=imm, wr=wr)
            else:
                g.write_imm(63, 63, off, n, raddr=DST + 0x8000, rkey=KEY, imm=imm, wr=wr)
            link.expect(-(-n // MTU) if n else 1)
            await link.wait_seen("rx", link.seen["rx"] + (-(-n // MTU) if n else 1))
        rcqes = await rcq.poll(4, CQE_CYCLES)
        await link.settle()
        _link_clean(link)
        tx, rx = link.frames("tx"), link.frames("rx")
        results = [model.receive(f) for f in rx]
        assert all(r.accepted for r in results), [r.reason for r in results]
        want = [r.response for r in results if r.response is not None]
        assert tx == want, f"engine sends {summary(tx)}, golden responder {summary(want)}"
        want_cqes = [c.cqe for r in results for c in r.cqes]
        assert [c.raw for c in rcqes] == want_cqes, (rcqes, want_cqes)
        assert [(c.opcode, c.byte_cnt, c.imm, c.wqe_counter, c.syndrome) for c in rcqes] == [
            (CqeOp.RESP_SEND, 300, 0, 0, 0), (CqeOp.RESP_SEND, 3000, 0, 1, 0),
            (CqeOp.RESP_SEND_IMM, 5, 0x11223344, 2, 0), (CqeOp.RESP_WR_IMM, 1027, 0xCAFEF00D, 3, 0)], rcqes
        def landed(k, n, src_off):
            out, at = b"", 0
            for addr, size in segs[k]:
                take = min(size, n - at)
                if take <= 0:
                    break
                out += env.mem.read(addr, take)
                at += take
            return out == data[src_off:src_off + n]
        assert landed(0, 300, 0) and landed(1, 3000, 0) and landed(2, 5, 5)
        assert env.mem.read(DST + 0x8000, 1027) == data[100:1127]
        wcs = g.wait_cq(63, 4)
        assert [(w["wr"], w["status_name"]) for w in wcs] == [(wr, "IBV_WC_SUCCESS") for *_, wr in posts], wcs
        _check_rxe_counters(g, before, link)
    finally:
        link.close()


@cocotb.test()
async def rnr_to_rxe(dut):
    """The engine as responder with nothing posted: rxe's SEND of 64 B gets the engine's RNR
    NAK (the QP's minimum RNR timer, code 1: 10 us, AETH 0x21); rxe waits that long on its
    own clock and sends the SEND again, until one finds the receive posted meanwhile: an
    ACK, a RESP_SEND CQE, the bytes in the WQE's buffer, rxe's work completion a success.
    rxe's 10 us pass while the simulation holds its clock, so its resends come some 30
    cycles apart, inside the engine's rule (docs/architecture.md, "Armed QPs"): a receive
    posted less than two doorbell-record reads before a SEND may be missed (RNR NAK again),
    one posted earlier never is. So: the first copy and the accepted one are the golden
    responder's (the first before the post, the accepted one after it); every copy between
    is the same SEND, came within two reads of the post and got the same RNR NAK; the first
    copy after that window is accepted; rxe counts as many RNR NAKs as the engine sent
    (rcvd_rnr_err) and nothing else. (With a resend 10 us after the post, as in real time,
    one RNR NAK.)"""
    g, br, env, cq = await _start(dut)
    rcq = await env.cq(1, 6)
    qp, gq = await connect_rc(env, g, cq, engine_qpn=11, guest_qp=59, engine_psn=0x50, guest_psn=0x70,
                              engine_timeout=NEVER, engine_kw=dict(recv=(4, 6), rcq=rcq, min_rnr_timer=1))
    g.reg_mr(59, 4096)
    data = pattern(64, 9)
    g.write_mem(59, 0, data)
    buf = 0x0A80_0000
    before = g.counters()
    link = RxeLink(env, br, "rnr_to_rxe", {11: MTU}, rnr_resends=True)
    model = _receive_model(env, qp, gq, rcq, 0x70)
    window = 2 * env.dma_latency + 200          # two doorbell-record reads (and their queue)
    try:
        g.send(59, 59, 0, 64, wr=41)
        link.expect(1)
        await link.wait_seen("rx", 1)
        await link.wait_tx(1)
        first = model.receive(link.frames("rx")[0])          # nothing posted yet: RNR
        nak = link.frames("tx")[0]
        assert (bth(nak)["opcode"], aeth(nak)[0], bth(nak)["psn"]) == (Op.ACK, Aeth.RNR_NAK | 1, 0x70), summary([nak])
        posted_at = link.now
        qp.post_recv([(buf, 256)])
        # rxe's resends (each RNR NAK owes one), until the engine ACKs one
        rcqes = await rcq.poll(1, 4 * window + CQE_CYCLES)
        await link.settle()
        _link_clean(link)
        rx = [(c, f) for c, d, f in link.log if d == "rx"]
        tx = link.frames("tx")
        # (rxe's copies differ in the IPv4 identification, and so in the ICRC: the BTH and payload are one)
        assert len(tx) == len(rx) and all(f[OFF_BTH:-4] == rx[0][1][OFF_BTH:-4] for _, f in rx), \
            (summary(tx), summary([f for _, f in rx]))
        assert all(f == nak for f in tx[:-1]), f"engine sends {summary(tx)}: RNR NAKs, then one answer"
        late = [c for c, _ in rx[1:-1] if c >= posted_at + window]
        assert not late, f"copies at cycles {late} came two reads after the post (cycle {posted_at}) and were RNR NAKed"
        second = model.receive(rx[-1][1])
        assert second.response is not None and tx[-1] == second.response, \
            f"engine answers the accepted copy with {summary(tx[-1:])}, golden responder {summary([second.response])}"
        assert [c.raw for c in rcqes] == [c.cqe for c in second.cqes], (rcqes, second.cqes)
        assert (rcqes[0].opcode, rcqes[0].byte_cnt, rcqes[0].wqe_counter, rcqes[0].syndrome) == (
            CqeOp.RESP_SEND, 64, 0, 0), rcqes
        assert env.mem.read(buf, 64) == data
        wcs = g.wait_cq(59, 1)
        assert [(w["wr"], w["status_name"]) for w in wcs] == [(41, "IBV_WC_SUCCESS")], wcs
        _check_rxe_counters(g, before, link, allowed=("rcvd_rnr_err",))
        naks = len(tx) - 1
        assert g.counters()["rcvd_rnr_err"] - before.get("rcvd_rnr_err", 0) == naks
        assert (await env.ctl.read_counters())["rnr_naks_sent"] == naks
        dut._log.info(f"rnr_to_rxe: {naks} RNR NAKs, the post at cycle {posted_at}, the accepted copy at {rx[-1][0]}")
    finally:
        link.close()
