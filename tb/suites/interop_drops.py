"""The RTL engine against Linux Soft-RoCE (rdma_rxe, in a qemu guest) with the bridge
dropping chosen frames in each direction: both sides retransmit, nothing is lost or
applied twice (an atomic included).

As tb/suites/interop.py (one guest for the run, each test resets the engine and makes its
own QPs and regions), with ``RxeLink(drop=...)``: the chosen frames (direction, index per
direction) are not delivered; they are logged as DROPPED in ``<test>.log`` and kept in
``<test>.dropped.pcap``. The engine's ACK timeout is short (``ACK_TIMEOUT`` cycles) so that
its timer retransmissions cost little simulated time; rxe's is 0 (off) where the engine's
NAK drives its retransmission and t = 16 (268 ms) where its timer must fire (the link
holds the simulated clock until rxe's retransmission is in: ``expect``). Only
deterministic facts are checked: frames (opcode, PSN, AETH), bytes on both sides,
exact-once atomics, counts of CQEs and completions, the engine's counters.

The engine's own WRITEs use lengths that are multiples of 4 (it sends no pad).
"""
import cocotb

from spec.formats import AETH, ATOMIC_ACK_ETH, BTH, OFF_BTH, OFF_EXT, Access, Aeth, CqeOp, Op, WqeOp, unpack
from tb.interop.rxe_env import (MTU, PD, RxeLink, aeth, bth, connect_rc, pattern, start,
                                summary)
from model.mr import MemoryRegion

ACK_TIMEOUT = 8_192                  # the engine's ACK timeout (cycles, 16 us): its timer retransmits soon
RXE_TIMER = 16                       # rxe's timeout code where its timer must fire: 4.096 us * 2^16 = 268 ms
DST = 0x2000_0000
KEY = (0x12 << 8) | 0x34
REGION = MemoryRegion(key=KEY, base=DST, length=1 << 20, pd=PD,
                      access=Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC)
LOCAL = 0x0900_0000
CQE_CYCLES = 200_000


def orig_of(f):
    return unpack(ATOMIC_ACK_ETH, f, OFF_EXT + 4)["orig"]


def ops(frames):
    return [(bth(f)["opcode"], bth(f)["psn"]) for f in frames]


async def _start(dut):
    return await start(dut)


async def _connect(env, g, cq, *, engine_qpn, guest_qp, engine_psn, guest_psn, rxe_timeout=0):
    return await connect_rc(env, g, cq, engine_qpn=engine_qpn, guest_qp=guest_qp, engine_psn=engine_psn,
                            guest_psn=guest_psn, engine_timeout=ACK_TIMEOUT, rxe_timeout=rxe_timeout)


def _link_clean(link, dropped):
    assert (link.missing, link.unexpected) == (0, 0), \
        f"rxe: {link.missing} frames owed never came, {link.unexpected} came unasked (see the log)"
    assert [(d, i) for _, d, i, _ in link.dropped] == dropped, link.dropped


def _rxe_delta(g, before):
    after = g.counters()
    return {k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], int)}


@cocotb.test()
async def engine_write_data_dropped(dut):
    """Engine -> rxe WRITEs of 3 x MTU. First WRITE: its MIDDLE is dropped; rxe NAKs the PSN
    gap on the LAST (0x60, the MIDDLE's PSN); the engine goes back to it (MIDDLE, LAST) and
    rxe ACKs. Second WRITE: its LAST is dropped (nothing for rxe to NAK): the engine's ACK
    timer fires and it resends the whole unacknowledged WRITE; rxe re-ACKs the duplicate
    FIRST and MIDDLE, each with the PSN of the last packet it has (the MIDDLE's: a
    coalesced ACK), and ACKs the LAST. rxe's buffer holds exactly the bytes; one CQE each."""
    g, br, env, cq = await _start(dut)
    S = 0x000010
    qp, gq = await _connect(env, g, cq, engine_qpn=1, guest_qp=0, engine_psn=S, guest_psn=0x100)
    m = g.reg_mr(0, 16384)
    before = g.counters()
    link = RxeLink(env, br, "engine_write_data_dropped", {1: MTU}, drop={("tx", 1), ("tx", 7)})
    try:
        src1, d1 = env.payload(3 * MTU, seed=1)
        qp.post_write(m["addr"] + 0x100, m["rkey"], local_addr=src1, length=3 * MTU)
        await qp.ring_rdma_core()
        c1 = await cq.poll(1, CQE_CYCLES)
        src2, d2 = env.payload(3 * MTU, seed=2)
        qp.post_write(m["addr"] + 0x2000, m["rkey"], local_addr=src2, length=3 * MTU)
        await qp.ring_rdma_core()
        c2 = await cq.poll(1, CQE_CYCLES)
        await link.settle()
        _link_clean(link, [("tx", 1), ("tx", 7)])
        tx, rx = link.frames("tx"), link.frames("rx")
        W = Op
        assert ops(tx) == [
            (W.WRITE_FIRST, S), (W.WRITE_LAST, S + 2),                          # MIDDLE S+1 dropped
            (W.WRITE_MIDDLE, S + 1), (W.WRITE_LAST, S + 2),                     # go-back-N from the NAK
            (W.WRITE_FIRST, S + 3), (W.WRITE_MIDDLE, S + 4),                    # LAST S+5 dropped
            (W.WRITE_FIRST, S + 3), (W.WRITE_MIDDLE, S + 4), (W.WRITE_LAST, S + 5)], summary(tx)   # timer
        assert [(bth(f)["opcode"], bth(f)["psn"], aeth(f)[0]) for f in rx] == [
            (Op.ACK, S + 1, Aeth.NAK_PSN_SEQ), (Op.ACK, S + 2, Aeth.ACK),
            (Op.ACK, S + 4, Aeth.ACK), (Op.ACK, S + 4, Aeth.ACK),        # duplicates: rxe's last PSN in
            (Op.ACK, S + 5, Aeth.ACK)], summary(rx)
        for c, k in ((c1[0], 0), (c2[0], 1)):
            assert (c.opcode, c.qpn, c.wqe_counter, c.byte_cnt, c.syndrome) == (CqeOp.REQ, 1, k, 3 * MTU, 0), c
        assert cq.try_poll() is None
        assert g.read_mem(0, 0x100, 3 * MTU) == d1
        assert g.read_mem(0, 0x2000, 3 * MTU) == d2
        assert g.read_mem(0, 0xFC, 4) == bytes(4) and g.read_mem(0, 0x100 + 3 * MTU, 4) == bytes(4)
        assert g.read_mem(0, 0x2000 + 3 * MTU, 4) == bytes(4)
        c = await env.ctl.read_counters()
        assert (c["naks_received"], c["timeouts"], c["retransmits"], c["error_cqes"]) == (1, 1, 2, 0), c
        d = _rxe_delta(g, before)
        assert (d["out_of_seq_request"], d["duplicate_request"]) == (1, 2), d
        assert (d["rcvd_pkts"], d["sent_pkts"]) == (len(tx), len(rx)), d
        assert g.qp_state(0) == 3
    finally:
        link.close()


@cocotb.test()
async def engine_write_ack_dropped(dut):
    """Engine -> rxe WRITE ONLY of 512 B whose ACK from rxe is dropped: the engine's ACK
    timer resends it; rxe takes it as a duplicate and ACKs again (applies nothing twice:
    the bytes are there once, one CQE)."""
    g, br, env, cq = await _start(dut)
    S = 0xFFFFFF
    qp, gq = await _connect(env, g, cq, engine_qpn=2, guest_qp=1, engine_psn=S, guest_psn=0x200)
    m = g.reg_mr(1, 8192)
    before = g.counters()
    link = RxeLink(env, br, "engine_write_ack_dropped", {2: MTU}, drop={("rx", 0)})
    try:
        src, data = env.payload(512, seed=3)
        qp.post_write(m["addr"] + 0x40, m["rkey"], local_addr=src, length=512)
        await qp.ring_rdma_core()
        c1 = await cq.poll(1, CQE_CYCLES)
        await link.settle()
        _link_clean(link, [("rx", 0)])
        tx, rx = link.frames("tx"), link.frames("rx")
        assert ops(tx) == [(Op.WRITE_ONLY, S), (Op.WRITE_ONLY, S)], summary(tx)
        assert [(bth(f)["opcode"], bth(f)["psn"], aeth(f)) for f in rx] == [(Op.ACK, S, (Aeth.ACK, 1))], summary(rx)
        assert (c1[0].opcode, c1[0].wqe_counter, c1[0].byte_cnt, c1[0].syndrome) == (CqeOp.REQ, 0, 512, 0), c1
        assert cq.try_poll() is None
        assert g.read_mem(1, 0x40, 512) == data
        assert g.read_mem(1, 0x3C, 4) == bytes(4) and g.read_mem(1, 0x240, 4) == bytes(4)
        c = await env.ctl.read_counters()
        assert (c["timeouts"], c["retransmits"], c["error_cqes"]) == (1, 1, 0), c
        d = _rxe_delta(g, before)
        assert (d["duplicate_request"], d["rcvd_pkts"], d["sent_pkts"]) == (1, 2, 2), d
        assert g.qp_state(1) == 3
    finally:
        link.close()


@cocotb.test()
async def engine_fetch_add_ack_dropped(dut):
    """Engine -> rxe FETCH_ADD whose ATOMIC ACK is dropped: the engine's timer resends the
    atomic; rxe answers the duplicate from its responder resources (the same original)
    and does not add twice: the guest's word is original + add, the engine's CQE is one,
    the original lands in the engine's memory."""
    g, br, env, cq = await _start(dut)
    S = 0x0ABC00
    qp, gq = await _connect(env, g, cq, engine_qpn=3, guest_qp=2, engine_psn=S, guest_psn=0x300)
    m = g.reg_mr(2, 8192)
    orig, add = 0x1122_3344_5566_7788, 0x0000_0001_0000_0010
    g.write_mem(2, 0x1000, orig.to_bytes(8, "little"))
    env.mem.write(LOCAL, b"\xee" * 16)
    before = g.counters()
    link = RxeLink(env, br, "engine_fetch_add_ack_dropped", {3: MTU}, drop={("rx", 0)})
    try:
        qp.post_atomic(WqeOp.ATOMIC_FA, m["addr"] + 0x1000, m["rkey"], add, local_addr=LOCAL)
        await qp.ring_rdma_core()
        c1 = await cq.poll(1, CQE_CYCLES)
        await link.settle()
        _link_clean(link, [("rx", 0)])
        tx, rx = link.frames("tx"), link.frames("rx")
        assert ops(tx) == [(Op.FETCH_ADD, S), (Op.FETCH_ADD, S)], summary(tx)
        assert ops(rx) == [(Op.ATOMIC_ACK, S)], summary(rx)
        assert orig_of(rx[0]) == orig and orig_of(link.dropped[0][3]) == orig
        assert (c1[0].opcode, c1[0].wqe_counter, c1[0].syndrome) == (CqeOp.REQ, 0, 0), c1
        assert cq.try_poll() is None
        assert env.mem.read(LOCAL, 16) == orig.to_bytes(8, "little") + b"\xee" * 8
        assert g.read_mem(2, 0x1000, 8) == ((orig + add) & (2**64 - 1)).to_bytes(8, "little"), "added twice?"
        c = await env.ctl.read_counters()
        assert (c["timeouts"], c["retransmits"], c["error_cqes"]) == (1, 1, 0), c
        d = _rxe_delta(g, before)
        assert (d["duplicate_request"], d["rcvd_pkts"], d["sent_pkts"]) == (1, 2, 2), d
        assert g.qp_state(2) == 3
    finally:
        link.close()


@cocotb.test()
async def rxe_write_data_dropped(dut):
    """rxe -> engine WRITE of 4 x MTU with its second packet (MIDDLE) dropped: the engine
    NAKs the PSN gap (0x60, the dropped PSN); rxe (its timer off) goes back and resends
    from there; the engine ACKs; its memory holds exactly the bytes; rxe reports success
    once."""
    g, br, env, cq = await _start(dut)
    G = 0x000500
    await env.ctl.register_mr(REGION.key, REGION.base, REGION.length, REGION.access, REGION.pd)
    qp, gq = await _connect(env, g, cq, engine_qpn=4, guest_qp=3, engine_psn=0x40, guest_psn=G)
    g.reg_mr(3, 8192)
    data = pattern(4096, 4)
    g.write_mem(3, 0, data)
    env.mem.write(DST + 0x3C, b"\xee" * (4096 + 8))
    link = RxeLink(env, br, "rxe_write_data_dropped", {4: MTU}, drop={("rx", 1)})
    try:
        g.write(3, 3, 0, 4096, raddr=DST + 0x40, rkey=KEY, wr=41)
        link.expect(4)
        await link.wait_tx(2, timeout_cycles=CQE_CYCLES)
        wc = g.poll_cq(3, ms=5000)
        await link.settle()
        _link_clean(link, [("rx", 1)])
        tx, rx = link.frames("tx"), link.frames("rx")
        assert ops(rx) == [(Op.WRITE_FIRST, G), (Op.WRITE_MIDDLE, G + 2), (Op.WRITE_LAST, G + 3),
                           (Op.WRITE_MIDDLE, G + 1), (Op.WRITE_MIDDLE, G + 2), (Op.WRITE_LAST, G + 3)], summary(rx)
        assert [(bth(f)["opcode"], bth(f)["psn"], aeth(f)[0]) for f in tx] == [
            (Op.ACK, G + 1, Aeth.NAK_PSN_SEQ), (Op.ACK, G + 3, Aeth.ACK)], summary(tx)
        assert wc is not None, "rxe: no completion"
        assert {k: wc.get(k) for k in ("wr", "status_str", "opcode", "byte_len")} == {
            "wr": 41, "status_str": "success", "opcode": "RDMA_WRITE", "byte_len": 4096}, wc
        assert g.poll_cq(3, ms=0) is None
        assert env.mem.read(DST + 0x40, 4096) == data
        assert env.mem.read(DST + 0x3C, 4) == b"\xee" * 4 and env.mem.read(DST + 0x40 + 4096, 4) == b"\xee" * 4
        c = await env.ctl.read_counters()
        assert (c["naks_sent"], c["acks_sent"]) == (1, 1), c
        assert cq.try_poll() is None
        assert g.qp_state(3) == 3
    finally:
        link.close()


@cocotb.test()
async def rxe_write_only_dropped(dut):
    """rxe -> engine WRITE ONLY of 1 KiB dropped on its way: the engine never sees it and
    answers nothing; rxe's timer (t = 16) fires and it resends the WRITE; the engine ACKs;
    its memory holds exactly the bytes; rxe reports success once. (A single packet: when a
    multi-packet WRITE is resent whole, the engine's re-ACKs of the duplicate FIRST/MIDDLE
    set off a burst of resent LASTs from rxe whose count depends on wall time.)"""
    g, br, env, cq = await _start(dut)
    G = 0xFFFFFF
    await env.ctl.register_mr(REGION.key, REGION.base, REGION.length, REGION.access, REGION.pd)
    qp, gq = await _connect(env, g, cq, engine_qpn=6, guest_qp=5, engine_psn=0x60, guest_psn=G,
                            rxe_timeout=RXE_TIMER)
    g.reg_mr(5, 8192)
    data = pattern(MTU, 6)
    g.write_mem(5, 0, data)
    env.mem.write(DST + 0xA000 - 4, b"\xee" * (MTU + 8))
    link = RxeLink(env, br, "rxe_write_only_dropped", {6: MTU}, drop={("rx", 0)})
    try:
        g.write(5, 5, 0, MTU, raddr=DST + 0xA000, rkey=KEY, wr=61)
        link.expect(1)
        await link.wait_seen("rx", 1, timeout_cycles=CQE_CYCLES)
        await link.settle()
        assert link.frames("tx") == [], "the engine answered a frame it never got"
        link.expect(1)                                 # rxe's timer retransmission (held for)
        await link.wait_tx(1, timeout_cycles=CQE_CYCLES)
        wc = g.poll_cq(5, ms=5000)
        await link.settle()
        _link_clean(link, [("rx", 0)])
        tx, rx = link.frames("tx"), link.frames("rx")
        assert ops(rx) == [(Op.WRITE_ONLY, G)], summary(rx)
        # the same packet again from the BTH to the ICRC (the IPv4 ID, checksum and ICRC differ)
        assert link.dropped[0][3][OFF_BTH:-4] == rx[0][OFF_BTH:-4], "rxe's retransmission differs from the original"
        assert [(bth(f)["opcode"], bth(f)["psn"], aeth(f)) for f in tx] == [(Op.ACK, G, (Aeth.ACK, 1))], summary(tx)
        assert wc is not None, "rxe: no completion"
        assert {k: wc.get(k) for k in ("wr", "status_str", "opcode", "byte_len")} == {
            "wr": 61, "status_str": "success", "opcode": "RDMA_WRITE", "byte_len": MTU}, wc
        assert g.poll_cq(5, ms=0) is None
        assert env.mem.read(DST + 0xA000, MTU) == data
        assert env.mem.read(DST + 0xA000 - 4, 4) == b"\xee" * 4 and env.mem.read(DST + 0xA000 + MTU, 4) == b"\xee" * 4
        c = await env.ctl.read_counters()
        assert (c["naks_sent"], c["acks_sent"]) == (0, 1), c
        assert cq.try_poll() is None
        assert g.qp_state(5) == 3
    finally:
        link.close()


@cocotb.test()
async def rxe_fetch_add_ack_dropped(dut):
    """rxe -> engine FETCH_ADD whose ATOMIC ACK from the engine is dropped: rxe's timer
    (t = 16) resends the atomic; the engine's responder answers the duplicate from its
    replay record with the same original; the engine's word is added once; rxe's one
    completion carries the original."""
    g, br, env, cq = await _start(dut)
    G = 0x7FFFF0
    await env.ctl.register_mr(REGION.key, REGION.base, REGION.length, REGION.access, REGION.pd)
    qp, gq = await _connect(env, g, cq, engine_qpn=7, guest_qp=6, engine_psn=0x50, guest_psn=G,
                            rxe_timeout=RXE_TIMER)
    g.reg_mr(6, 8192)
    word, orig, add = DST + 0x8000, 0x0102_0304_0506_0708, 0x100
    env.mem.write(word, orig.to_bytes(8, "little"))
    g.write_mem(6, 0x1000, b"\xee" * 8)
    link = RxeLink(env, br, "rxe_fetch_add_ack_dropped", {7: MTU}, drop={("tx", 0)})
    try:
        g.fetch_add(6, 6, 0x1000, raddr=word, rkey=KEY, add=add, wr=51)
        link.expect(1)
        await link.wait_seen("tx", 1, timeout_cycles=CQE_CYCLES)
        link.expect(1)                                 # rxe's timer retransmission (held for)
        await link.wait_tx(1, timeout_cycles=CQE_CYCLES)
        wc = g.poll_cq(6, ms=5000)
        await link.settle()
        _link_clean(link, [("tx", 0)])
        tx, rx = link.frames("tx"), link.frames("rx")
        assert ops(rx) == [(Op.FETCH_ADD, G), (Op.FETCH_ADD, G)], summary(rx)
        assert ops(tx) == [(Op.ATOMIC_ACK, G)], summary(tx)
        assert orig_of(tx[0]) == orig and orig_of(link.dropped[0][3]) == orig
        assert wc is not None, "rxe: no completion"
        assert {k: wc.get(k) for k in ("wr", "status_str", "opcode")} == {
            "wr": 51, "status_str": "success", "opcode": "FETCH_ADD"}, wc
        assert g.poll_cq(6, ms=0) is None
        assert g.read_mem(6, 0x1000, 8) == orig.to_bytes(8, "little")
        assert env.mem.read(word, 8) == (orig + add).to_bytes(8, "little"), "added twice?"
        assert g.qp_state(6) == 3
    finally:
        link.close()
