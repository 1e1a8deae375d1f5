"""Two RTL engines back to back (``ibgda_nic_pair``): RC RDMA WRITE and atomics end to end.

NIC 0's GPU posts WRITEs of every shape into a memory region of NIC 1's GPU. Checked:
NIC 0's frames and CQEs equal the transmit golden model (model/engine.py); the bytes in
NIC 1's GPU memory equal what was sent; NIC 1's ACK frames equal the RC golden
responder's (model/responder.py) for NIC 0's frames; every CQE of NIC 0 is written only after
the ACK covering its WQE reached NIC 0; the receive counters of both agree. Atomics:
NIC 0 the requester, NIC 1 the responder; the golden requester and responder predict the
frames, CQEs and both memories, and plain sums back them up; under the fault matrix NIC 1
also sends atomics to NIC 0 beside the WRITEs, each applied exactly once.
"""
import random

import cocotb

from model.cqe import CqContext, parse_cqe
from model.frames import Port, QpContext
from model.link import simulate
from model.memory import SparseMemory
from model.mr import MemoryRegion
from model.requester import RcRequester
from model.responder import RcResponder
from spec import params as P
from spec.formats import BTH, OFF_BTH, Access, CQE64, CqeOp, Op, QpState, Syndrome, WqeOp, read_field, unpack
from tb.suites import fault_matrix
from model.network import FaultSpec
from tb.env import ENGINE_VERBS
from tb.pair_env import NIC_IPS, NIC_MACS, NicPairEnv
from tb.clock import ClockCycles

PD = 3
KEY = (0x05 << 8) | 0x77
DST = 0x4000_0000
REGION = MemoryRegion(key=KEY, base=DST, length=1 << 24, access=Access.LOCAL_WRITE | Access.REMOTE_WRITE, pd=PD)
# atomics' words (on either NIC) and where their originals land
ATOMIC_KEY = (0x08 << 8) | 0x44
WORDS = 0x6000_0000
ATOMIC_REGION = MemoryRegion(key=ATOMIC_KEY, base=WORDS, length=1 << 16,
                             access=Access.REMOTE_WRITE | Access.REMOTE_ATOMIC, pd=PD)
ORIGINALS = 0x6800_0000
RECV_BUFS = 0x5000_0000              # NIC 1's receive buffers (the fault matrix's SENDs)


def _assert_no_underrun(a, b):
    """No frame stalled inside on either wire (tvalid low within it: a real MAC would underrun)."""
    assert (a.wire.underrun_cycles, b.wire.underrun_cycles) == (0, 0), "a frame stalled inside: a MAC underrun"


async def _pair(dut, links, *, mtu=1024, ack_every=(1, 4, 8), faults=None, seed=0, timeout=None):
    env = await NicPairEnv(dut, latency_cycles=100, faults=faults, seed=seed).start()
    a, b = env.nics
    cq_a = await a.cq(0, 7)
    cq_b = await b.cq(0, 7)
    await b.ctl.register_mr(REGION.key, REGION.base, REGION.length, REGION.access, REGION.pd)
    pairs = []
    for (qa, qb), every in zip(links, ack_every):
        pairs.append(await env.connect(0, qa, 1, qb, cq_a=cq_a, cq_b=cq_b, mtu=mtu, pd=PD, ack_every=every,
                                       **({"timeout": timeout} if timeout else {})))
    return env, a, b, pairs


class PeerImage(SparseMemory):
    """What the golden responder takes GPU memory to hold."""


def _responder_model(pairs, mtu, ack_every, atomics=None):
    """NIC 1's golden responder (``atomics``: its memory image, to execute atomics on)."""
    model = RcResponder(Port(smac=NIC_MACS[1], sip=NIC_IPS[1]), atomics=atomics is not None,
                        read_memory=atomics.read if atomics is not None else None)
    for (qp_a, qp_b), every in zip(pairs, ack_every):
        model.add_qp(QpContext(qpn=qp_b.qpn, remote_qpn=qp_a.qpn, dmac=NIC_MACS[0], dip=NIC_IPS[0],
                               start_psn=qp_a.start_psn, mtu=mtu), PD, ack_every=every)
    model.register(REGION)
    return model


@cocotb.test()
async def rc_writes_back_to_back(dut):
    """Inline and pointer WRITEs (0 B .. 3 MTU) on 3 QPs, NVSHMEM and rdma-core posting."""
    rnd = random.Random(2)
    mtu, every = 1024, (1, 4, 8)
    env, a, b, pairs = await _pair(dut, [(1, 11), (2, 12), (3, 13)], mtu=mtu, ack_every=every)
    sent = []
    for k, (qp_a, _) in enumerate(pairs):
        for i in range(10):
            n = rnd.choice([0, 1, 8, 28, 64, 150, mtu - 1, mtu, mtu + 1, 3 * mtu])
            raddr = DST + 0x10000 * qp_a.qpn + 0x1000 * i + rnd.randrange(64)
            data = bytes(rnd.randrange(256) for _ in range(n))
            if n and n <= 28:
                qp_a.post_write(raddr, KEY, inline=data, signaled=(k != 1 or i % 4 == 3))
            else:
                addr = a.gpu.alloc(max(n, 1), 128)
                a.gpu.write(addr, data)
                qp_a.post_write(raddr, KEY, local_addr=addr, length=n, signaled=(k != 1 or i % 4 == 3))
            sent.append((raddr, data))
            if k == 1 and i % 4 == 3:
                await qp_a.ring_nvshmem()            # a batch, CQE on its last WQE only
            elif k != 1:
                await qp_a.ring_rdma_core()                # every WQE signaled and rung
        await qp_a.ring_nvshmem()
    pred = a.check(await a.drain(timeout_cycles=400_000))
    # the bytes landed in NIC 1's GPU memory
    for raddr, data in sent:
        assert b.mem.read(raddr, len(data)) == data, f"remote memory at {raddr:#x}"
    # NIC 1's ACKs are the golden responder's for NIC 0's frames
    model = _responder_model(pairs, mtu, every)
    results = [model.receive(f.data) for f in a.wire.frames]
    assert all(r.accepted for r in results)
    want = [r.response for r in results if r.response is not None]
    got = [f.data for f in b.wire.frames]
    assert got == want, f"{len(got)} ACK frames, the model sends {len(want)}"
    # a CQE is written only after the ACK covering its WQE's last packet reached NIC 0
    last_psn = {}
    for recs in pred.frames.values():
        for r in recs:
            last_psn[(r.qpn, r.wqe_index)] = r.psn
    acks = [(last, read_field(BTH, "dqpn", f, OFF_BTH), read_field(BTH, "psn", f, OFF_BTH))
            for f, first, last in a.rx.sent]
    for cqn, slot, raw, cycle in a.cqe_writes():
        c = unpack(CQE64, raw)
        qpn, index = c["sop_drop_qpn"] & 0xFFFFFF, c["wqe_counter"]
        if (qpn, index) not in last_psn:
            continue                                   # a WQE without packets
        psn = last_psn[(qpn, index)]
        covering = [cyc for cyc, dq, apsn in acks
                    if dq == qpn and ((apsn - psn) & 0xFFFFFF) < (1 << 23) and cyc < cycle]
        assert covering, f"CQE of QP {qpn} WQE {index} at cycle {cycle} before any ACK covering PSN {psn:#x}"
    ca, cb = await a.ctl.read_counters(), await b.ctl.read_counters()
    assert cb["rx_accepted"] == len(a.wire.frames) and cb["acks_sent"] == len(want) and cb["naks_sent"] == 0
    assert ca["rx_ack_received"] == len(b.wire.frames)
    dut._log.info(f"{len(a.wire.frames)} frames, {len(want)} ACKs, {len(a.cqe_writes())} CQEs")


@cocotb.test()
async def rc_atomics_back_to_back(dut):
    """Every atomic form from NIC 0 to NIC 1 on 2 QPs, between WRITEs, DeepEP's count
    (a 4-byte masked fetch-add by both QPs on one word) and NVSHMEM's signal (an 8-byte
    FETCH_ADD) among them. NIC 0's frames are the golden requester's, NIC 1's answers
    (ATOMIC ACKs and ACKs) the golden responder's for them, NIC 0's CQEs and originals
    the requester's for those answers, NIC 1's words the responder's, and the plain
    numbers (the count is the sum, the chain of originals) hold."""
    rnd = random.Random(11)
    mtu = 1024
    env, a, b, pairs = await _pair(dut, [(1, 11), (2, 12)], mtu=mtu, ack_every=(1, 4))
    await b.ctl.register_mr(ATOMIC_REGION.key, ATOMIC_REGION.base, ATOMIC_REGION.length, ATOMIC_REGION.access,
                            ATOMIC_REGION.pd)
    count, signal = WORDS, WORDS + 8
    own = {qp_a.qpn: WORDS + 0x100 * qp_a.qpn for qp_a, _ in pairs}
    init = {count: 0, signal: 0}
    for base in own.values():
        init.update({base + 8 * i: rnd.randrange(1 << 64) for i in range(6)})
    image = PeerImage()
    for va, v in init.items():
        b.mem.write(va, v.to_bytes(8, "little"))
        image.write(va, v.to_bytes(8, "little"))
    req = RcRequester(Port(smac=NIC_MACS[0], sip=NIC_IPS[0]), {0: CqContext(0, 7, base=a.cqs[0].base)}, a.mem.read,
                      remote_ops=True, write_memory=lambda addr, data: originals.__setitem__(addr, bytes(data)))
    originals = {}
    adds, want_frames, ncqe = [], [], 0
    for k, (qp_a, _) in enumerate(pairs):
        req.add_qp(QpContext(qpn=qp_a.qpn, remote_qpn=qp_a.remote_qpn, dmac=NIC_MACS[1], dip=NIC_IPS[1],
                             start_psn=qp_a.start_psn, mtu=mtu, cqn=0, user_index=qp_a.user_index), timeout_ns=1 << 40)
        base, out = own[qp_a.qpn], ORIGINALS + 0x1000 * qp_a.qpn
        ws = []
        for i in range(8):
            data = bytes(rnd.randrange(256) for _ in range(rnd.choice([8, 300, 2 * mtu])))
            src = a.gpu.alloc(len(data), 128)
            a.gpu.write(src, data)
            ws.append(qp_a.post_write(DST + 0x10000 * qp_a.qpn + 0x1000 * i, KEY, local_addr=src, length=len(data),
                                      signaled=False))
            v = rnd.randrange(1, 1 << 16)
            adds.append((v, out + 8 * i))
            ws.append(qp_a.post_masked_atomic(WqeOp.ATOMIC_MASKED_FA, 4, count, ATOMIC_KEY,
                                              {"add": v, "field_boundary": 0}, local_addr=out + 8 * i,
                                              signaled=i % 4 == 3))
            ncqe += i % 4 == 3
        ws.append(qp_a.post_atomic(WqeOp.ATOMIC_FA, signal, ATOMIC_KEY, 1, local_addr=out + 0x100))
        ws.append(qp_a.post_atomic(WqeOp.ATOMIC_FA, base, ATOMIC_KEY, 5, local_addr=out + 0x108))
        ws.append(qp_a.post_atomic(WqeOp.ATOMIC_CS, base + 8, ATOMIC_KEY, 0x77, init[base + 8], local_addr=out + 0x110))
        ws.append(qp_a.post_masked_atomic(WqeOp.ATOMIC_MASKED_FA, 8, base + 16, ATOMIC_KEY,
                                          {"add": 0x0101_0101_0101_0101, "field_boundary": 0x8080_8080_8080_8080},
                                          local_addr=out + 0x118))
        ws.append(qp_a.post_masked_atomic(WqeOp.ATOMIC_MASKED_CS, 4, base + 28, ATOMIC_KEY,
                                          {"swap": 0xABCD, "compare": 0, "swap_mask": 0xFFFF, "compare_mask": 0},
                                          local_addr=out + 0x120))
        ws.append(qp_a.post_masked_atomic(WqeOp.ATOMIC_MASKED_CS, 8, base + 32, ATOMIC_KEY,
                                          {"swap": 1 << 63, "compare": init[base + 32], "swap_mask": 1 << 63,
                                           "compare_mask": (1 << 64) - 1}, local_addr=out + 0x128))
        ncqe += 6
        for w in ws:
            want_frames += [t.frame for t in req.post(qp_a.qpn, w.wqe)]
        await qp_a.ring_nvshmem()
    await a.wait_for(lambda: len(a.cqe_writes()) >= ncqe, 100_000, lambda: f"{ncqe} CQEs (got {len(a.cqe_writes())})")
    await ClockCycles(dut.clk, 1000)
    # NIC 1's answers are the golden responder's for NIC 0's frames (on the same words)
    rsp = _responder_model(pairs, mtu, (1, 4), atomics=image)
    rsp.register(ATOMIC_REGION)
    want_answers = []
    for f in a.wire.frames:
        r = rsp.receive(f.data)
        assert r.accepted, r.reason
        for addr, data in r.writes:
            image.write(addr, data)
        if r.response is not None:
            want_answers.append(r.response)
    assert [f.data for f in b.wire.frames] == want_answers, "NIC 1's answers differ from the golden responder's"
    # NIC 0's frames are the golden requester's (by QP: their order between QPs is the scheduler's)
    by_qp = lambda fs: sorted(fs, key=lambda f: f[OFF_BTH + 5:OFF_BTH + 8])
    assert by_qp([f.data for f in a.wire.frames]) == by_qp(want_frames)
    for f in b.wire.frames:                      # the answers in the order NIC 0 took them
        req.on_response(f.data, 0)
    got = sorted((c["qpn"], c["wqe_counter"], raw) for raw in (w[2] for w in a.cqe_writes()) for c in [parse_cqe(raw)])
    want = sorted((c["qpn"], c["wqe_counter"], rec.cqe) for rec in req.completions for c in [parse_cqe(rec.cqe)])
    assert got == want, "NIC 0's CQEs differ from the golden requester's"
    for addr, data in originals.items():
        assert a.mem.read(addr, len(data)) == data, f"original at {addr:#x}"
    assert b.mem.read(WORDS, 0x400) == image.read(WORDS, 0x400), "NIC 1's words differ from the golden responder's"
    # plain numbers
    u = lambda nic, addr, n, order="little": int.from_bytes(nic.mem.read(addr, n), order)
    assert u(b, count, 4) == sum(v for v, _ in adds) and u(b, signal, 8) == 2
    chain = sorted((u(a, slot, 4, "big"), v) for v, slot in adds)
    assert all(o + v == o2 for (o, v), (o2, _) in zip(chain, chain[1:])) and chain[0][0] == 0, chain
    for base in own.values():
        assert u(b, base, 8) == (init[base] + 5) % (1 << 64) and u(b, base + 8, 8) == 0x77
        assert u(b, base + 32, 8) == init[base + 32] | 1 << 63
    cb = await b.ctl.read_counters()
    assert cb["rx_accepted"] == len(a.wire.frames) and cb["naks_sent"] == 0


# NIC 1's region that READs read (REMOTE_READ only: a WRITE there is refused)
READ_KEY = (0x09 << 8) | 0x55
SOURCE = 0x7000_0000
READ_REGION = MemoryRegion(key=READ_KEY, base=SOURCE, length=1 << 20, access=Access.REMOTE_READ, pd=PD)


@cocotb.test()
async def rc_reads_back_to_back(dut):
    """NVSHMEM's get: RDMA READs of 0 B .. 3 MTU + 5 from NIC 0 out of NIC 1's memory on 2
    QPs, between WRITEs, every other READ signaled on QP 2, each landing at an odd local
    offset. NIC 0's frames are the golden requester's (READ REQUESTs with their RETH),
    NIC 1's answers (READ RESPONSE FIRST/MIDDLE/LAST/ONLY with AETH and MSN, ACKs) the
    golden responder's, NIC 0's CQEs (byte_cnt, opcode) the requester's for those answers,
    and every READ's bytes in NIC 0's memory are the source's, each CQE written only after
    its READ's last response arrived."""
    rnd = random.Random(13)
    mtu = 1024
    env, a, b, pairs = await _pair(dut, [(1, 11), (2, 12)], mtu=mtu, ack_every=(1, 4))
    await b.ctl.register_mr(READ_REGION.key, READ_REGION.base, READ_REGION.length, READ_REGION.access,
                            READ_REGION.pd)
    src = bytes(rnd.randrange(256) for _ in range(0x10000))
    b.mem.write(SOURCE, src)
    image = PeerImage()
    image.write(SOURCE, src)
    landed = {}
    req = RcRequester(Port(smac=NIC_MACS[0], sip=NIC_IPS[0]), {0: CqContext(0, 7, base=a.cqs[0].base)}, a.mem.read,
                      remote_ops=True, write_memory=lambda addr, data: landed.__setitem__(addr, bytes(data)))
    reads, want_frames, ncqe, read_wqes = [], [], 0, []
    for k, (qp_a, _) in enumerate(pairs):
        req.add_qp(QpContext(qpn=qp_a.qpn, remote_qpn=qp_a.remote_qpn, dmac=NIC_MACS[1], dip=NIC_IPS[1],
                             start_psn=qp_a.start_psn, mtu=mtu, cqn=0, user_index=qp_a.user_index), timeout_ns=1 << 40)
        ws = []
        for i in range(10):
            n = rnd.choice([0, 1, 8, 100, mtu - 1, mtu, mtu + 1, 3 * mtu + 5])
            off = rnd.randrange(0x8000)
            dst = a.gpu.alloc(n + 64, 128) + rnd.randrange(1, 64)
            signaled = k == 0 or i % 2 == 1 or i == 9
            ws.append(qp_a.post_read(SOURCE + off, READ_KEY, dst, n, signaled=signaled))
            read_wqes.append((qp_a.qpn, ws[-1].index, n))
            ncqe += signaled
            reads.append((dst, src[off:off + n]))
            if i % 3 == 1:
                data = bytes(rnd.randrange(256) for _ in range(rnd.choice([8, 300, 2 * mtu])))
                buf = a.gpu.alloc(len(data), 128)
                a.gpu.write(buf, data)
                ws.append(qp_a.post_write(DST + 0x10000 * qp_a.qpn + 0x1000 * i, KEY, local_addr=buf,
                                          length=len(data), signaled=False))
        for w in ws:
            want_frames += [t.frame for t in req.post(qp_a.qpn, w.wqe)]
        await qp_a.ring_nvshmem()
    await a.wait_for(lambda: len(a.cqe_writes()) >= ncqe, 200_000, lambda: f"{ncqe} CQEs (got {len(a.cqe_writes())})")
    await ClockCycles(dut.clk, 1000)
    # NIC 0's frames are the golden requester's (by QP: their order between QPs is the scheduler's)
    by_qp = lambda fs: sorted(fs, key=lambda f: f[OFF_BTH + 5:OFF_BTH + 8])
    assert by_qp([f.data for f in a.wire.frames]) == by_qp(want_frames), "NIC 0's requests differ from the model's"
    # each READ's last response PSN, from its READ REQUEST (in posting order per QP)
    read_psn, requests = {}, {}
    for f in a.wire.frames:
        if f.data[OFF_BTH] == Op.READ_REQUEST:
            requests.setdefault(read_field(BTH, "dqpn", f.data, OFF_BTH), []).append(
                read_field(BTH, "psn", f.data, OFF_BTH))
    remote_qpn = {qp_a.qpn: qp_a.remote_qpn for qp_a, _ in pairs}
    for qpn in remote_qpn:
        mine = [(index, n) for q, index, n in read_wqes if q == qpn]
        psns = requests.get(remote_qpn[qpn], [])
        assert len(psns) == len(mine), f"QP {qpn}: {len(psns)} READ REQUESTs for {len(mine)} READs"
        for (index, n), psn in zip(mine, psns):
            read_psn[(qpn, index)] = (psn + max(1, -(-n // mtu)) - 1) & 0xFFFFFF
    # NIC 1's answers are the golden responder's for NIC 0's frames
    rsp = RcResponder(Port(smac=NIC_MACS[1], sip=NIC_IPS[1]), remote_ops=True, read_memory=image.read)
    for qp_a, qp_b in pairs:
        rsp.add_qp(QpContext(qpn=qp_b.qpn, remote_qpn=qp_a.qpn, dmac=NIC_MACS[0], dip=NIC_IPS[0],
                             start_psn=qp_a.start_psn, mtu=mtu), PD, ack_every=1 if qp_a.qpn == 1 else 4)
    rsp.register(REGION)
    rsp.register(READ_REGION)
    want_answers = []
    for f in a.wire.frames:
        r = rsp.receive(f.data)
        assert r.accepted, r.reason
        want_answers += r.read_responses or ([r.response] if r.response is not None else [])
    got_answers = [f.data for f in b.wire.frames]
    assert got_answers == want_answers, f"NIC 1's answers differ from the golden responder's " \
                                        f"({len(got_answers)} frames, the model's {len(want_answers)})"
    for f in b.wire.frames:                      # the answers in the order NIC 0 took them
        req.on_response(f.data, 0)
    got = sorted((c["qpn"], c["wqe_counter"], raw) for raw in (w[2] for w in a.cqe_writes()) for c in [parse_cqe(raw)])
    want = sorted((c["qpn"], c["wqe_counter"], rec.cqe) for rec in req.completions for c in [parse_cqe(rec.cqe)])
    diff = next(((parse_cqe(g[2]), parse_cqe(w[2])) for g, w in zip(got, want) if g != w), None)
    assert got == want, f"NIC 0's CQEs differ from the golden requester's ({len(got)}, {len(want)}): first {diff}"
    # every READ's bytes landed, as the model says and as the source holds
    for addr, data in landed.items():
        assert a.mem.read(addr, len(data)) == data, f"READ data at {addr:#x}"
    for dst, data in reads:
        assert a.mem.read(dst, len(data)) == data, f"READ of {len(data)} bytes into {dst:#x}"
    # a READ's CQE is written only after its last response reached NIC 0 (at that
    # response's PSN: its READ REQUEST's plus one per further MTU)
    arrived = {(read_field(BTH, "dqpn", f, OFF_BTH), read_field(BTH, "psn", f, OFF_BTH)): last
               for f, first, last in a.rx.sent if f[OFF_BTH] in (Op.READ_RESP_LAST, Op.READ_RESP_ONLY)}
    for cqn, slot, raw, cycle in a.cqe_writes():
        c = parse_cqe(raw)
        psn = read_psn.get((c["qpn"], c["wqe_counter"]))
        if psn is not None:
            assert (c["qpn"], psn) in arrived and arrived[(c["qpn"], psn)] < cycle, \
                f"CQE of READ {c['wqe_counter']} of QP {c['qpn']} at cycle {cycle} before its last response"
    ca, cb = await a.ctl.read_counters(), await b.ctl.read_counters()
    assert cb["rx_accepted"] == len(a.wire.frames) and cb["naks_sent"] == 0
    assert ca["rx_ack_received"] == len(b.wire.frames)
    _assert_no_underrun(a, b)          # READ RESPONSEs stream from GPU memory
    dut._log.info(f"{len(reads)} READs, {len(a.wire.frames)} requests, {len(b.wire.frames)} answers, "
                  f"{len(a.cqe_writes())} CQEs")


# Regions of NIC 1 that a WRITE of PD 3 must not write: read-only, and of another PD.
RO_REGION = MemoryRegion(key=(0x06 << 8) | 0x11, base=DST + 0x200_0000, length=1 << 20,
                         access=Access.LOCAL_WRITE | Access.REMOTE_READ, pd=PD)
PD4_REGION = MemoryRegion(key=(0x07 << 8) | 0x22, base=DST + 0x300_0000, length=1 << 20,
                          access=Access.LOCAL_WRITE | Access.REMOTE_WRITE, pd=PD + 1)


@cocotb.test()
async def rc_access_errors(dut):
    """Access violations and a dead peer. QP 1..4 each post good WRITEs, one bad one
    (wrong rkey, out of bounds, no remote-write right, other PD) and good ones after;
    QP 5 only good ones; QP 6's peer QP does not exist (no ACK ever: timeouts, then
    TRANSPORT_RETRY_EXC_ERR). Each failing QP: its signaled WQEs before the bad one
    complete, the bad one gets REQ_ERR with the syndrome (signaled or not), every later
    WQE, also those posted after the failure, REQ_ERR WR_FLUSH_ERR; QP 5 carries on.
    NIC 1's memory outside the good WRITEs is untouched. The CQEs equal the golden RC
    model's (model/link.py simulate) for the same WQEs."""
    mtu = 1024
    env = await NicPairEnv(dut, latency_cycles=100, dma_latency=100).start()
    a, b = env.nics
    cq_a = await a.cq(0, 7)
    cq_b = await b.cq(0, 7)
    for r in (REGION, RO_REGION, PD4_REGION):
        await b.ctl.register_mr(r.key, r.base, r.length, r.access, r.pd)
    pairs = [await env.connect(0, q, 1, 10 + q, cq_a=cq_a, cq_b=cq_b, mtu=mtu, pd=PD, ack_every=2)
             for q in range(1, 6)]
    timeout, retry_cnt = 1000, 1
    dead = await a.qp(6, cq_a, log_depth=8, mtu=mtu, start_psn=0x600, remote_qpn=16, uc=False,
                      dmac=b.port_mac, dip=b.port_ip, rq_psn=0x700, pd=PD, timeout=timeout, retry_cnt=retry_cnt)
    bad = {1: (DST + 0xF0_0000, (KEY ^ 0x100)),                 # no region under this key
           2: (REGION.base + REGION.length - 60, KEY),          # runs 40 bytes past the region
           3: (RO_REGION.base + 0x100, RO_REGION.key),          # no REMOTE_WRITE
           4: (PD4_REGION.base + 0x100, PD4_REGION.key)}        # another PD
    syndrome = {q: Syndrome.REMOTE_ACCESS_ERR for q in bad} | {6: Syndrome.TRANSPORT_RETRY_EXC_ERR}
    good = []                                                    # (raddr, data) that must land
    untouched = []                                               # (raddr, n) that must not be written
    expect = {}                                                  # qpn -> [(index, opcode, syndrome, byte_cnt)]
    qps = [qp for qp, _ in pairs] + [dead]

    def post(qp, i, raddr, key, n, signaled):
        data = bytes((qp.qpn * 31 + i * 7 + j) & 0xFF for j in range(n))
        addr = a.gpu.alloc(n, 128)
        a.gpu.write(addr, data)
        qp.post_write(raddr, key, local_addr=addr, length=n, signaled=signaled)
        return data

    for qp in qps:
        q, exp, failed = qp.qpn, [], False
        for i in range(6):
            n = (100, 2 * mtu + 10, 300)[i % 3]
            signaled = i in (1, 5)
            raddr, key = bad[q] if (q in bad and i == 3) else (DST + 0x10_0000 * q + 0x4000 * i, KEY)
            data = post(qp, i, raddr, key, n, signaled)
            fails = (q in bad and i == 3) or (q == 6 and i == 0)
            if fails:
                exp.append((i, CqeOp.REQ_ERR, syndrome[q], 0))
                failed = True
            elif failed:
                exp.append((i, CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR, 0))
            elif signaled:
                exp.append((i, CqeOp.REQ, 0, n))
            (untouched if failed or q == 6 else good).append((raddr, data) if not failed and q != 6 else
                                                            (raddr, n))
        expect[q] = exp
        await qp.ring_nvshmem()
    want = sum(len(e) for e in expect.values())
    await a.wait_for(lambda: len(a.cqe_writes()) >= want, 200_000, f"{want} CQEs (got {len(a.cqe_writes())})")
    # WQEs posted to a QP in error are flushed too
    for qp in qps:
        if qp.qpn in syndrome:
            for i in (6, 7):
                raddr = DST + 0x10_0000 * qp.qpn + 0x4000 * i
                post(qp, i, raddr, KEY, 64, i == 7)
                expect[qp.qpn].append((i, CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR, 0))
                untouched.append((raddr, 64))
            await qp.ring_nvshmem()
    want = sum(len(e) for e in expect.values())
    await a.wait_for(lambda: len(a.cqe_writes()) >= want, 50_000, f"{want} CQEs (got {len(a.cqe_writes())})")
    await ClockCycles(dut.clk, 3000)
    cqes = [parse_cqe(raw) for _, _, raw, _ in a.cqe_writes()]
    assert len(cqes) == want, f"{len(cqes)} CQEs, {want} expected"
    got = {}
    for c in cqes:
        got.setdefault(c["qpn"], []).append((c["wqe_counter"], c["opcode"], c["syndrome"], c["byte_cnt"]))
    assert got == expect, f"CQEs per QP {got}, expected {expect}"
    # the golden RC model gives the same CQEs for the same WQEs
    req = RcRequester(Port(smac=NIC_MACS[0], sip=NIC_IPS[0]), {0: CqContext(0, 7)}, a.mem.read)
    for qp in qps:
        req.add_qp(QpContext(qpn=qp.qpn, remote_qpn=qp.remote_qpn, dmac=NIC_MACS[1], dip=NIC_IPS[1],
                             start_psn=qp.start_psn, mtu=mtu, cqn=0, user_index=qp.user_index),
                   timeout_ns=2 * timeout, retry_cnt=retry_cnt)
    rsp = RcResponder(Port(smac=NIC_MACS[1], sip=NIC_IPS[1]), ack_every=2)
    for qp_a, qp_b in pairs:
        rsp.add_qp(QpContext(qpn=qp_b.qpn, remote_qpn=qp_a.qpn, dmac=NIC_MACS[0], dip=NIC_IPS[0],
                             start_psn=qp_a.start_psn, mtu=mtu), PD)
    for r in (REGION, RO_REGION, PD4_REGION):
        rsp.register(r)
    posts = [(0 if w.index < 6 else 10 ** 7, qp.qpn, w.wqe) for qp in qps for w in qp.posted]
    res = simulate(req, rsp, sorted(posts, key=lambda p: p[0]))
    assert not res.hung
    model = {}
    for rec in req.completions:
        c = parse_cqe(rec.cqe)
        model.setdefault(c["qpn"], []).append((c["wqe_counter"], c["opcode"], c["syndrome"], c["byte_cnt"]))
    assert got == model, f"CQEs per QP {got}, the RC model's {model}"
    # memory: the good WRITEs landed; nothing else of NIC 1's memory was written
    for raddr, data in good:
        assert b.mem.read(raddr, len(data)) == data, f"remote memory at {raddr:#x}"
    payload_writes = [w for w in b.mem.writes if w.id == 2]
    for raddr, n in untouched:
        hit = [w for w in payload_writes if w.addr < raddr + n and raddr < w.addr + w.length]
        assert not hit, f"NIC 1 wrote [{raddr:#x}, +{n}) of a WRITE that failed or was flushed: {hit}"
    for w in payload_writes:
        assert any(w.addr < ra + len(d) and ra < w.addr + w.length for ra, d in good), \
            f"NIC 1 wrote {w.addr:#x}+{w.length} outside every good WRITE"
    ca, cb = await a.ctl.read_counters(), await b.ctl.read_counters()
    dut._log.info(f"NIC 0 {dict((k, v) for k, v in ca.items() if v)}; NIC 1 {dict((k, v) for k, v in cb.items() if v)}")
    assert cb["rx_access_error"] == len(bad) and ca["naks_received"] >= len(bad)
    assert ca["error_cqes"] == sum(1 for e in expect.values() for x in e if x[1] == CqeOp.REQ_ERR)
    assert ca["timeouts"] == retry_cnt + 1 and ca["retry_exceeded"] == 1 and ca["retransmits"] == retry_cnt


async def _one_qp_pair(dut, faults, mtu, ack_every, timeout):
    """Two NICs, 100 cycles of cable and of GPU memory latency, one RC QP from NIC 0 (QP 1)
    to NIC 1 (QP 11), retry count 3: (NIC 0, NIC 1, NIC 0's CQ, NIC 0's QP)."""
    env = await NicPairEnv(dut, latency_cycles=100, faults=faults, dma_latency=100).start()
    a, b = env.nics
    cq_a, cq_b = await a.cq(0, 4), await b.cq(0, 4)
    await b.ctl.register_mr(REGION.key, REGION.base, REGION.length, REGION.access, REGION.pd)
    qp_a, _ = await env.connect(0, 1, 1, 11, cq_a=cq_a, cq_b=cq_b, mtu=mtu, pd=PD, ack_every=ack_every,
                                timeout=timeout, retry_cnt=3)
    return a, b, cq_a, qp_a


def _one_qp_models(a, cq_a, qp_a, mtu, ack_every, timeout):
    """The golden RC requester and responder of ``_one_qp_pair`` (timeout in cycles of 2 ns)."""
    req = RcRequester(Port(smac=NIC_MACS[0], sip=NIC_IPS[0]), {0: CqContext(0, 4, base=cq_a.base)}, a.mem.read,
                      **ENGINE_VERBS)
    req.add_qp(QpContext(qpn=1, remote_qpn=11, dmac=NIC_MACS[1], dip=NIC_IPS[1], start_psn=qp_a.start_psn, mtu=mtu,
                         cqn=0, user_index=qp_a.user_index), timeout_ns=2 * timeout, retry_cnt=3)
    rsp = RcResponder(Port(smac=NIC_MACS[1], sip=NIC_IPS[1]), ack_every=ack_every)
    rsp.add_qp(QpContext(qpn=11, remote_qpn=1, dmac=NIC_MACS[0], dip=NIC_IPS[0], start_psn=qp_a.start_psn, mtu=mtu), PD)
    rsp.register(REGION)
    return req, rsp


def _assert_frames_as_model(res, a, b):
    """Every frame on both directions of the cable equals the model run's (``simulate``)."""
    for name, nic, direction in (("NIC 0 -> NIC 1", a, "req"), ("NIC 1 -> NIC 0", b, "resp")):
        want = [r.frame for r in res.records if r.direction == direction]
        got = [f.data for f in nic.wire.frames]
        for k, (g, w) in enumerate(zip(got, want)):
            assert g == w, f"{name}: frame {k} differs from the model's"
        assert len(got) == len(want), f"{name}: {len(got)} frames, the model sends {len(want)}"


# Explicit faults by frame index: the same FaultSpec pattern for the cable (model.network.Link)
# and for model.link.simulate, which runs the golden endpoints over that Link class.
# Each episode is one 4-packet WRITE posted when the previous one completed; frame
# indices below follow from the protocol alone (the episode's packets all leave before a
# response can come back), so the model's frame sequences are the RTL's, byte for byte.
PD4_ATOMIC_REGION = MemoryRegion(key=(0x0B << 8) | 0x22, base=WORDS + 0x2_0000, length=0x1000,
                                 access=Access.REMOTE_ATOMIC, pd=PD + 1)


PD4_READ_REGION = MemoryRegion(key=(0x0C << 8) | 0x22, base=SOURCE + 0x10_0000, length=0x1000,
                               access=Access.REMOTE_READ, pd=PD + 1)


@cocotb.test()
async def rc_atomic_access_errors(dut):
    """Atomic and READ violations through two engines: QP 1..5 each post a good FETCH_ADD,
    then a bad atomic (1: a region without REMOTE_ATOMIC, 2: a wrong key, 3: another PD,
    4: out of bounds, 5: a 4-byte masked fetch-add at a VA not 4-byte aligned), then a
    WRITE and an atomic. NIC 1 NAKs (remote access; invalid request for the misaligned
    one); NIC 0 gives each bad one REQ_ERR with REMOTE_ACCESS_ERR / REMOTE_INVAL_REQ_ERR
    and every WQE after it WR_FLUSH_ERR. On NIC 1 only the five good atomics wrote (one
    write-through each, AWID 4): every bad one's target and the flushed ones' are
    untouched. QP 6..9 do the same with READs (6: a region without REMOTE_READ, 7: a
    wrong key, 8: another PD, 9: past the region's end): NIC 1 reads only the good READs'
    bytes (ARID 3), NIC 0's memory holds those and nothing where the bad and flushed
    READs would have landed."""
    env, a, b, pairs = await _pair(dut, [(q, 20 + q) for q in range(1, 10)], ack_every=(1,) * 9)
    for r in (ATOMIC_REGION, PD4_ATOMIC_REGION, READ_REGION, PD4_READ_REGION):
        await b.ctl.register_mr(r.key, r.base, r.length, r.access, r.pd)
    rnd = random.Random(21)
    rsrc = rnd.randbytes(0x2000)
    b.mem.write(SOURCE, rsrc)
    b.mem.write(PD4_READ_REGION.base, rsrc[:0x100])
    b.mem.write(REGION.base + 0x80_0000, rsrc[:0x100])
    read_pairs, pairs = pairs[5:], pairs[:5]
    fa = lambda qp, i, va, key: qp.post_atomic(WqeOp.ATOMIC_FA, va, key, 5, local_addr=ORIGINALS + 0x100 * qp.qpn
                                               + 8 * i, signaled=i != 2)
    bad = {1: (REGION.base + 0x40, KEY), 2: (WORDS + 0x800, ATOMIC_KEY ^ 0x100),
           3: (PD4_ATOMIC_REGION.base, PD4_ATOMIC_REGION.key), 4: (WORDS + ATOMIC_REGION.length, ATOMIC_KEY),
           5: (WORDS + 0x902, ATOMIC_KEY)}
    syndrome = {q: Syndrome.REMOTE_ACCESS_ERR for q in (1, 2, 3, 4)} | {5: Syndrome.REMOTE_INVAL_REQ_ERR}
    expect, untouched = {}, []
    for qp, _ in pairs:
        q = qp.qpn
        good = WORDS + 0x100 * q
        fa(qp, 0, good, ATOMIC_KEY)
        va, key = bad[q]
        if q == 5:
            qp.post_masked_atomic(WqeOp.ATOMIC_MASKED_FA, 4, va, key, {"add": 1, "field_boundary": 0},
                                  local_addr=ORIGINALS + 0x100 * q + 8)
        else:
            fa(qp, 1, va, key)
        src = a.gpu.alloc(64, 128)
        a.gpu.write(src, bytes(range(64)))
        qp.post_write(DST + 0x1000 * q, KEY, local_addr=src, length=64, signaled=False)
        fa(qp, 3, good + 8, ATOMIC_KEY)
        untouched += [(va & ~7, 8), (good + 8, 8), (DST + 0x1000 * q, 64)]
        expect[q] = [(0, CqeOp.REQ, 0, 8), (1, CqeOp.REQ_ERR, syndrome[q], 0),
                     (2, CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR, 0), (3, CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR, 0)]
        await qp.ring_nvshmem()
    bad_reads = {6: (REGION.base + 0x80_0000, KEY, 64), 7: (SOURCE + 0x800, READ_KEY ^ 0x100, 64),
                 8: (PD4_READ_REGION.base, PD4_READ_REGION.key, 64),
                 9: (SOURCE + READ_REGION.length - 32, READ_KEY, 64)}
    good_reads, empty = [], []
    for qp, _ in read_pairs:
        q = qp.qpn
        dsts = [a.gpu.alloc(128, 128) for _ in range(4)]
        qp.post_read(SOURCE + 0x100 * q, READ_KEY, dsts[0], 96)
        good_reads.append((dsts[0], rsrc[0x100 * q:0x100 * q + 96]))
        va, key, n = bad_reads[q]
        qp.post_read(va, key, dsts[1], n)
        buf = a.gpu.alloc(64, 128)
        a.gpu.write(buf, bytes(range(64)))
        qp.post_write(DST + 0x1000 * q, KEY, local_addr=buf, length=64, signaled=False)
        qp.post_read(SOURCE + 0x100 * q + 0x80, READ_KEY, dsts[3], 32)
        empty += [(dsts[1], n), (dsts[3], 32)]
        untouched.append((DST + 0x1000 * q, 64))
        expect[q] = [(0, CqeOp.REQ, 0, 96), (1, CqeOp.REQ_ERR, Syndrome.REMOTE_ACCESS_ERR, 0),
                     (2, CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR, 0), (3, CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR, 0)]
        await qp.ring_nvshmem()
    want = sum(len(e) for e in expect.values())
    await a.wait_for(lambda: len(a.cqe_writes()) >= want, 100_000, f"{want} CQEs (got {len(a.cqe_writes())})")
    await ClockCycles(dut.clk, 2000)
    got = {}
    for c in (parse_cqe(raw) for _, _, raw, _ in a.cqe_writes()):
        got.setdefault(c["qpn"], []).append((c["wqe_counter"], c["opcode"], c["syndrome"], c["byte_cnt"]))
    assert got == expect, f"CQEs per QP {got}, expected {expect}"
    for dst, data in good_reads:
        assert a.mem.read(dst, len(data)) == data, f"READ into {dst:#x}"
    for dst, n in empty:
        assert a.mem.read(dst, n) == bytes(n), f"NIC 0 memory at {dst:#x} was written by a failed READ"
    payload_reads = [r for r in b.mem.reads if r.id == P.AXI_ID_READ_RESPONSE]
    assert len(payload_reads) == len(good_reads) and all(
        any(r.covers(SOURCE + 0x100 * qp.qpn, 96) for r in payload_reads) for qp, _ in read_pairs), \
        f"NIC 1 read {[(hex(r.addr), r.length) for r in payload_reads]} for READs, only the 4 good ones may be read"
    for qp, _ in pairs:
        assert int.from_bytes(b.mem.read(WORDS + 0x100 * qp.qpn, 8), "little") == 5
        assert int.from_bytes(a.mem.read(ORIGINALS + 0x100 * qp.qpn, 8), "little") == 0   # its original
    for va, n in untouched:
        assert b.mem.read(va, n) == bytes(n), f"NIC 1 memory at {va:#x} was written"
    atomic_writes = [w for w in b.mem.writes if w.id == P.AXI_ID_ATOMIC_WRITE]
    assert len(atomic_writes) == 5, f"{len(atomic_writes)} atomic write-throughs, 5 good atomics"
    cb = await b.ctl.read_counters()
    assert cb["naks_sent"] == 9, cb["naks_sent"]


PATTERN_DATA = [(5, "drop"),                 # episode 1: a middle packet: NAK, go back to it
                (14, "drop"),                # episode 2: the last packet: timeout, resend all 4
                (20, "corrupt", 8 * 300),    # episode 3: a payload bit: bad ICRC, NAK
                (27, "duplicate"),           # episode 4: the responder re-ACKs the copy
                (45, "delay", 200)]          # episode 7: the last packet 200 cycles late (before the timeout)
PATTERN_ACKS = [(11, "drop")]                # episode 5's ACK: timeout, 4 duplicates re-ACKed
EPISODES = 8


@cocotb.test()
async def rc_fault_pattern(dut):
    """Go-back-N against the golden RC model for a given fault pattern: a dropped middle
    packet (NAK), a dropped last packet (timeout), a corrupted packet (ICRC, NAK), a
    duplicate, a dropped ACK (timeout, duplicates re-acknowledged), a late last packet. Every frame on both
    directions equals the model's (model/link.py simulate with the same pattern), and so
    do the CQEs, the memory and the NAK, timeout and go-back counts."""
    mtu, n, timeout, ack_every = 1024, 3 * 1024 + 100, 800, 4
    faults = {("tx", 0): FaultSpec(pattern=PATTERN_DATA), ("tx", 1): FaultSpec(pattern=PATTERN_ACKS)}
    a, b, cq_a, qp_a = await _one_qp_pair(dut, faults, mtu, ack_every, timeout)
    sent = []
    for e in range(EPISODES):
        data = bytes((e * 13 + j * 7) & 0xFF for j in range(n))
        addr = a.gpu.alloc(n, 128)
        a.gpu.write(addr, data)
        raddr = DST + 0x10000 * e
        qp_a.post_write(raddr, KEY, local_addr=addr, length=n, signaled=True)
        sent.append((raddr, data))
        await qp_a.ring_rdma_core()
        await a.wait_for(lambda: len(a.cqe_writes()) > e, 20_000, f"the CQE of episode {e}")
    await ClockCycles(dut.clk, 500)
    # the golden model, the same WQEs and fault pattern (the same bit flipped, the same
    # delay in cycles), 100 cycles (200 ns) of cable as above
    req, rsp = _one_qp_models(a, cq_a, qp_a, mtu, ack_every, timeout)
    posts = [(e * 10 ** 6, 1, w.wqe) for e, w in enumerate(qp_a.posted)]
    res = simulate(req, rsp, posts, faults=PATTERN_DATA, response_faults=PATTERN_ACKS, latency_ns=200)
    assert not res.hung
    _assert_frames_as_model(res, a, b)
    got_cqes = [raw for _, _, raw, _ in a.cqe_writes()]
    assert got_cqes == [rec.cqe for rec in req.completions], "CQEs differ from the model's"
    for raddr, data in sent:
        assert b.mem.read(raddr, len(data)) == data, f"remote memory at {raddr:#x}"
    ca, cb = await a.ctl.read_counters(), await b.ctl.read_counters()
    mc = req.counters
    dut._log.info(f"NIC 0 {dict((k, v) for k, v in ca.items() if v)}; NIC 1 {dict((k, v) for k, v in cb.items() if v)}")
    assert ca["naks_received"] == sum(mc.naks_received.values()) == 2
    assert ca["timeouts"] == mc.timeouts == 2
    assert ca["retransmits"] == mc.go_back_n == 4
    assert cb["rx_bad_icrc"] == 1 and cb["naks_sent"] == 2


@cocotb.test()
async def rc_local_error_flush(dut):
    """A malformed WQE on an RC QP behind an outstanding WRITE whose middle packet is lost:
    the WRITE is sent again (the go-back walk meets the malformed WQE a second time and
    must not complete it twice), completes, then the malformed WQE completes with
    LOCAL_QP_OP_ERR and every WQE after it, signaled or not, also one posted after the
    error CQE, with WR_FLUSH_ERR, in order and without a packet. CQEs and frames on both
    directions equal the golden model's (``simulate``)."""
    mtu, n, timeout = 1024, 3 * 1024, 400
    pattern = [(1, "drop")]                      # the first WRITE's middle packet: NAK, go back
    a, b, cq_a, qp_a = await _one_qp_pair(dut, {("tx", 0): FaultSpec(pattern=pattern)}, mtu, 1, timeout)
    data = bytes((j * 5 + 1) & 0xFF for j in range(n))
    addr = a.gpu.alloc(n, 128)
    a.gpu.write(addr, data)
    qp_a.post_write(DST, KEY, local_addr=addr, length=n, signaled=True)          # index 0
    qp_a.post_write(DST + 0x8000, KEY, inline=b"atomic", opcode=0x12)          # 1: ATOMIC_FA, unsupported
    qp_a.post_write(DST + 0x9000, KEY, inline=b"flushed", signaled=False)      # 2
    qp_a.post_nop(signaled=False)                                              # 3
    await qp_a.ring_rdma_core()
    await a.wait_for(lambda: len(a.cqe_writes()) >= 4, 30 * timeout, "4 CQEs")
    qp_a.post_write(DST + 0xA000, KEY, inline=b"late", signaled=True)          # 4: posted to a QP in ERR
    await qp_a.ring_rdma_core()
    await a.wait_for(lambda: len(a.cqe_writes()) >= 5, 30 * timeout, "the 5th CQE")
    await ClockCycles(dut.clk, 4 * timeout)
    got = [parse_cqe(raw) for _, _, raw, _ in a.cqe_writes()]
    assert [(c["opcode"], c["syndrome"], c["wqe_counter"]) for c in got] == [
        (CqeOp.REQ, 0, 0), (CqeOp.REQ_ERR, Syndrome.LOCAL_QP_OP_ERR, 1), (CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR, 2),
        (CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR, 3), (CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR, 4)]
    assert b.mem.read(DST, n) == data
    assert not any(t in f.data for f in a.wire.frames for t in (b"atomic", b"flushed", b"late"))
    req, rsp = _one_qp_models(a, cq_a, qp_a, mtu, 1, timeout)
    posts = [(0, 1, w.wqe) for w in qp_a.posted[:4]] + [(10 ** 6, 1, qp_a.posted[4].wqe)]
    res = simulate(req, rsp, posts, faults=pattern, latency_ns=200)
    assert not res.hung
    _assert_frames_as_model(res, a, b)
    assert [raw for _, _, raw, _ in a.cqe_writes()] == [rec.cqe for rec in req.completions], "CQEs differ from the model's"
    ca = await a.ctl.read_counters()
    assert ca["error_cqes"] == 4 and ca["retransmits"] == req.counters.go_back_n == 1, ca


@cocotb.test()
async def rc_long_inline_resume(dut):
    """Go-back-N inside an inline WQE: two 972-byte inline WRITEs (ds 63, 16 WQEBBs) at
    MTU 256, 4 packets each. The first WRITE's second packet is lost (a NAK: the go-back
    resumes inside the first WQE, from the beat holding byte 36 + 256), then the resent
    last packet of the second (the timer: it resumes inside the second WQE, at byte
    36 + 768). The remote memory gets both, and every frame on both directions equals
    the golden model's (``simulate``)."""
    mtu, n, timeout = 256, 972, 400
    pattern = [(1, "drop"), (14, "drop")]        # frame 14: PSN 7 as resent after the NAK
    a, b, cq_a, qp_a = await _one_qp_pair(dut, {("tx", 0): FaultSpec(pattern=pattern)}, mtu, 1, timeout)
    sent = []
    for e in range(2):
        data = bytes((e * 41 + j * 7) & 0xFF for j in range(n))
        w = qp_a.post_write(DST + 0x1000 * e, KEY, inline=data, signaled=True)
        assert w.ds == 63
        sent.append((DST + 0x1000 * e, data))
    await qp_a.ring_rdma_core()
    await a.wait_for(lambda: len(a.cqe_writes()) >= 2, 30 * timeout, "2 CQEs")
    await ClockCycles(dut.clk, 4 * timeout)
    for raddr, data in sent:
        assert b.mem.read(raddr, len(data)) == data, f"remote memory at {raddr:#x}"
    req, rsp = _one_qp_models(a, cq_a, qp_a, mtu, 1, timeout)
    res = simulate(req, rsp, [(0, 1, w.wqe) for w in qp_a.posted], faults=pattern, latency_ns=200)
    assert not res.hung
    _assert_frames_as_model(res, a, b)
    assert [raw for _, _, raw, _ in a.cqe_writes()] == [rec.cqe for rec in req.completions], "CQEs differ from the model's"
    ca = await a.ctl.read_counters()
    assert ca["retransmits"] == req.counters.go_back_n >= 2, ca


@cocotb.test()
async def rc_unsignaled_tail(dut):
    """A lost packet of an unsignaled WQE with nothing sent after it: only the ACK
    timer can recover it (no later packet shows the gap, no CQE waits). Two unsignaled
    3-packet WRITEs; the last packet of the second is dropped. The timer (armed by the
    packets sent, not by a waiting completion) sends the second WRITE again; the remote
    memory gets both, and every frame on both directions, the timeout and go-back
    counts equal the golden model's for the same pattern (``simulate``)."""
    mtu, n, timeout = 1024, 2 * 1024 + 100, 300
    pattern = [(5, "drop")]                      # frame 5: the second WRITE's last packet
    a, b, cq_a, qp_a = await _one_qp_pair(dut, {("tx", 0): FaultSpec(pattern=pattern)}, mtu, 4, timeout)
    sent = []
    for e in range(2):
        data = bytes((e * 29 + j * 3) & 0xFF for j in range(n))
        addr = a.gpu.alloc(n, 128)
        a.gpu.write(addr, data)
        raddr = DST + 0x10000 * e
        qp_a.post_write(raddr, KEY, local_addr=addr, length=n, signaled=False)
        sent.append((raddr, data))
    await qp_a.ring_rdma_core()
    await a.wait_for(lambda: all(b.mem.read(r, len(d)) == d for r, d in sent), 20 * timeout,
                     "the second WRITE in the remote memory (sent again by the timer)")
    await ClockCycles(dut.clk, 4 * timeout)
    req, rsp = _one_qp_models(a, cq_a, qp_a, mtu, 4, timeout)
    res = simulate(req, rsp, [(0, 1, w.wqe) for w in qp_a.posted], faults=pattern, latency_ns=200)
    assert not res.hung
    _assert_frames_as_model(res, a, b)
    assert not a.cqe_writes() and not req.completions, "unsignaled WQEs: no CQE"
    ca = await a.ctl.read_counters()
    dut._log.info(f"NIC 0 {dict((k, v) for k, v in ca.items() if v)}")
    assert ca["timeouts"] == req.counters.timeouts == 1
    assert ca["retransmits"] == req.counters.go_back_n == 1


@cocotb.test()
async def rc_signal_every_wqe(dut):
    """DeepEP's habit: a CQE requested on every WQE. One RC QP posts 64 signaled 8-byte
    WRITEs under one doorbell across a cable of 1,500 cycles each way: all 64 packets
    leave before the first ACK is back (64 completions wait for their ACKs at once, in
    the tracker's shared pool: with 16 per QP the 17th held MAC TX for a round trip);
    then 64 CQEs, in order, each after its ACK, frames and CQEs as the transmit model."""
    env = await NicPairEnv(dut, latency_cycles=1500).start()
    a, b = env.nics
    cq_a, cq_b = await a.cq(0, 7), await b.cq(0, 7)
    await b.ctl.register_mr(REGION.key, REGION.base, REGION.length, REGION.access, REGION.pd)
    qp_a, qp_b = await env.connect(0, 1, 1, 11, cq_a=cq_a, cq_b=cq_b, mtu=1024, pd=PD, timeout=20_000)
    n = 64
    for i in range(n):
        qp_a.post_write(DST + 8 * i, KEY, inline=(0x1122334455667700 + i).to_bytes(8, "little"), signaled=True)
    await qp_a.ring_nvshmem()
    pred = a.check(await a.drain(timeout_cycles=60_000))
    assert len(a.wire.frames) == n and len(a.cqe_writes()) == n
    first_ack = min(first for _, first, _ in a.rx.sent)
    assert a.wire.frames[-1].last_cycle < first_ack, (
        f"the 64th packet left at cycle {a.wire.frames[-1].last_cycle}, after the first ACK came ({first_ack})")
    for i in range(n):
        assert b.mem.read(DST + 8 * i, 8) == (0x1122334455667700 + i).to_bytes(8, "little")
    counters = [unpack(CQE64, raw)["wqe_counter"] for _, _, raw, _ in a.cqe_writes()]
    assert counters == list(range(n)), counters
    dut._log.info(f"{n} packets by cycle {a.wire.frames[-1].last_cycle}, first ACK at {first_ack}, "
                  f"{len(pred.frames)} QPs in the model")


@cocotb.test()
async def rc_modify_to_error(dut):
    """An RC QP moved to ERR through the control path with WQEs unacknowledged (the peer's
    QP is in ERR, so no ACK comes; the timer is far off): every outstanding WQE, signaled
    or not, completes with WR_FLUSH_ERR in order (the tracker's failure walk), and so does
    every WQE posted afterwards, with no packet; frames and CQEs equal the golden
    requester's (``RcRequester.modify``)."""
    mtu, timeout = 1024, 200_000
    a, b, cq_a, qp_a = await _one_qp_pair(dut, None, mtu, 1, timeout)
    qp_b = b.qps[11]
    assert await b.modify_qp(qp_b, QpState.ERR)
    req, _ = _one_qp_models(a, cq_a, qp_a, mtu, 1, timeout)
    want_frames = []
    for i, (n, signaled) in enumerate(((8, True), (8, False), (mtu + 100, True), (8, False))):
        addr = a.gpu.alloc(n, 128)
        a.gpu.write(addr, bytes((i * 17 + j) & 0xFF for j in range(n)))
        w = qp_a.post_write(DST + 0x1000 * i, KEY, local_addr=addr, length=n, signaled=signaled)
        want_frames += [t.frame for t in req.post(1, w.wqe)]
    await qp_a.ring_nvshmem()
    await a.wire.wait_frames(len(want_frames), timeout_cycles=20_000)
    await ClockCycles(dut.clk, 500)
    assert not a.cqe_writes(), "no ACK came: nothing may complete yet"
    assert await a.modify_qp(qp_a, QpState.ERR)
    flushed = req.modify(1, QpState.ERR)
    assert len(flushed) == 4
    qp_a.post_nop(signaled=True)
    qp_a.post_write(DST, KEY, inline=b"never", signaled=False)
    for w in qp_a.posted[-2:]:
        assert req.post(1, w.wqe) == []
    await qp_a.ring_nvshmem()
    await a.wait_for(lambda: len(a.cqe_writes()) >= 6, 20_000, lambda: f"6 CQEs (got {len(a.cqe_writes())})")
    await ClockCycles(dut.clk, 1000)
    assert [f.data for f in a.wire.frames] == want_frames, "frames differ from the model's"
    got = [raw for _, _, raw, _ in a.cqe_writes()]
    assert got == [rec.cqe for rec in req.completions], "CQEs differ from the model's"
    assert {unpack(CQE64, raw)["syndrome"] for raw in got} == {Syndrome.WR_FLUSH_ERR}
    ca = await a.ctl.read_counters()
    assert ca["error_cqes"] == 6 and ca["timeouts"] == 0, ca


async def _faulty(dut, kind, rate, seed):
    """WRITEs from NIC 0 to NIC 1, SENDs, SENDs with immediate and WRITEs with immediate
    from NIC 0 into NIC 1's receive queue, and atomics and READs from NIC 1 to NIC 0
    (DeepEP's 4-byte masked fetch-add on a count, an 8-byte FETCH_ADD now and then,
    NVSHMEM's get of 8 B .. 2 MTU + 100), with ``kind`` faults at ``rate`` on both
    directions of the cable: every message arrives once and intact (a SEND into its own
    receive WQE's buffer, in order: receive CQE k has WQE counter k, its byte count and
    immediate), every atomic is applied exactly once (the words are the sums, the
    originals a chain), every READ returns the source's bytes, every CQE comes on both
    sides, in order, and the counters agree with the faults the link injected."""
    rnd = random.Random(seed)
    mtu = 1024
    spec = FaultSpec(**{kind: rate}, delay_cycles=300, reorder_depth=2)
    env, a, b, pairs = await _pair(dut, [(1, 11), (2, 12)], mtu=mtu, ack_every=(1, 4), faults=spec, seed=seed,
                                   timeout=3000)
    await a.ctl.register_mr(ATOMIC_REGION.key, ATOMIC_REGION.base, ATOMIC_REGION.length, ATOMIC_REGION.access,
                            ATOMIC_REGION.pd)
    await a.ctl.register_mr(READ_REGION.key, READ_REGION.base, READ_REGION.length, READ_REGION.access, READ_REGION.pd)
    source = bytes(rnd.randrange(256) for _ in range(0x8000))
    a.mem.write(SOURCE, source)
    reads = []
    qp_at, _ = await env.connect(1, 3, 0, 3, cq_a=b.cqs[0], cq_b=a.cqs[0], mtu=mtu, pd=PD, timeout=3000)
    count, signal = WORDS, WORDS + 8
    adds, fetch_adds, atomic_cqes = [], 0, 0
    sent = []
    # the two-sided QP: NIC 1's receive queue holds a WQE (one 16 KiB buffer) per message
    nmsg = fault_matrix.messages(rate)
    rcq = await b.cq(2, 8)
    qp_s, qp_r = await env.connect(0, 4, 1, 14, cq_a=a.cqs[0], cq_b=rcq, mtu=mtu, pd=PD, ack_every=2, timeout=3000,
                                   b_kw=dict(recv=(8, 4), rcq=rcq))
    qp_r.post_recv(*[[(RECV_BUFS + 0x4000 * i, 0x4000)] for i in range(nmsg)])
    received = []                     # (CQE opcode, bytes, immediate, where the bytes land)
    for i in range(nmsg):
        v = rnd.randrange(1, 1 << 12)
        adds.append((v, ORIGINALS + 8 * i))
        qp_at.post_masked_atomic(WqeOp.ATOMIC_MASKED_FA, 4, count, ATOMIC_KEY, {"add": v, "field_boundary": 0},
                                 local_addr=ORIGINALS + 8 * i, signaled=i % 4 == 3)
        atomic_cqes += i % 4 == 3
        if i % 8 == 5:
            qp_at.post_atomic(WqeOp.ATOMIC_FA, signal, ATOMIC_KEY, 1, local_addr=ORIGINALS + 0x8000 + 8 * i,
                              signaled=False)
            fetch_adds += 1
        if i % 4 == 1:
            n = rnd.choice([8, 300, mtu, 2 * mtu + 100])
            off = rnd.randrange(len(source) - n)
            dst = b.gpu.alloc(n + 64, 128) + rnd.randrange(64)
            qp_at.post_read(SOURCE + off, READ_KEY, dst, n, signaled=True)
            reads.append((dst, source[off:off + n]))
            atomic_cqes += 1
        if i % 4 == 3:
            await qp_at.ring_nvshmem()
        for k, (qp_a, _) in enumerate(pairs):
            n = rnd.choice([8, 64, 700, mtu, 2 * mtu + 5, 4 * mtu])
            raddr = DST + 0x400000 * qp_a.qpn + 0x4000 * i
            data = bytes(rnd.randrange(256) for _ in range(n))
            if n <= 28:
                qp_a.post_write(raddr, KEY, inline=data, signaled=(i % 4 == 3))
            else:
                addr = a.gpu.alloc(n, 128)
                a.gpu.write(addr, data)
                qp_a.post_write(raddr, KEY, local_addr=addr, length=n, signaled=(i % 4 == 3))
            sent.append((raddr, data))
            if i % 4 == 3:
                await qp_a.ring_nvshmem()
        n = rnd.choice([0, 8, 301, mtu, 2 * mtu + 5])
        data, imm = bytes(rnd.randrange(256) for _ in range(n)), rnd.randrange(1 << 32)
        addr = a.gpu.alloc(max(n, 1), 128)
        a.gpu.write(addr, data)
        if i % 3 == 2:
            raddr = DST + 0xC0_0000 + 0x4000 * i
            qp_s.post_write(raddr, KEY, local_addr=addr, length=n, opcode=WqeOp.RDMA_WRITE_IMM, imm=imm,
                            signaled=(i % 4 == 3))
            received.append((CqeOp.RESP_WR_IMM, data, imm, raddr))
        else:
            qp_s.post_send(local_addr=addr, length=n, imm=imm if i % 3 else None, signaled=(i % 4 == 3))
            received.append((CqeOp.RESP_SEND_IMM if i % 3 else CqeOp.RESP_SEND, data, imm if i % 3 else 0,
                             RECV_BUFS + 0x4000 * i))
        if i % 4 == 3 or i == nmsg - 1:
            await qp_s.ring_nvshmem()
    pred = a.predict()
    want_cqes = pred.totals.cqes
    try:
        await a.wait_for(lambda: len(a.cqe_writes()) >= want_cqes, 400_000,
                         f"{want_cqes} CQEs (got {len(a.cqe_writes())})")
        await b.wait_for(lambda: len(b.cqe_writes()) >= atomic_cqes + nmsg, 400_000,
                         f"{atomic_cqes} atomic CQEs and {nmsg} receive CQEs of NIC 1 (got {len(b.cqe_writes())})")
    except TimeoutError:
        ca, cb = await a.ctl.read_counters(), await b.ctl.read_counters()
        dut._log.error(f"hung: link 0->1 {env.net.tx_links[0].counters}, 1->0 {env.net.tx_links[1].counters}; "
                       f"NIC 0 {dict((k, v) for k, v in ca.items() if v)}; "
                       f"NIC 1 {dict((k, v) for k, v in cb.items() if v)}")
        raise
    await ClockCycles(dut.clk, 2000)
    a.check_cqes()                                        # all CQEs, in order, as the model
    for raddr, data in sent:
        got = b.mem.read(raddr, len(data))
        if got != data:
            off = next(i for i in range(len(data)) if got[i] != data[i])
            end = max(i for i in range(len(data)) if got[i] != data[i]) + 1
            src = [(hex(ra), d.find(got[off:off + 32])) for ra, d in sent if got[off:off + 32] in d]
            raise AssertionError(f"remote memory at {raddr:#x} ({len(data)} B): bytes {off}..{end} differ; "
                                 f"they are found in the payload of {src}")
    for dst, data in reads:
        assert b.mem.read(dst, len(data)) == data, f"READ of {len(data)} bytes into NIC 1's {dst:#x}"
    # the atomics: each applied once (the count is the sum, each original the sum of the
    # adds applied before it), every CQE a success
    u = lambda nic, addr, n, order="little": int.from_bytes(nic.mem.read(addr, n), order)
    assert u(a, count, 4) == sum(v for v, _ in adds) and u(a, signal, 8) == fetch_adds
    chain = sorted((u(b, slot, 4, "big"), v) for v, slot in adds)
    assert chain[0][0] == 0 and all(o + v == o2 for (o, v), (o2, _) in zip(chain, chain[1:])), chain[:4]
    cqes = [parse_cqe(raw) for cqn, _, raw, _ in b.cqe_writes() if cqn == 0]
    assert [(c["qpn"], c["opcode"], c["syndrome"]) for c in cqes] == [(3, CqeOp.REQ, 0)] * atomic_cqes
    # the two-sided messages: each received once, in order, into its own WQE's buffer
    rcqes = [parse_cqe(raw) for cqn, _, raw, _ in b.cqe_writes() if cqn == 2]
    got = [(c["qpn"], c["opcode"], c["byte_cnt"], c["imm"], c["wqe_counter"], c["syndrome"]) for c in rcqes]
    assert got == [(14, op, len(d), imm, k, 0) for k, (op, d, imm, _) in enumerate(received)], got[:6]
    for k, (_, d, _, where) in enumerate(received):
        assert b.mem.read(where, len(d)) == d, f"two-sided message {k} ({len(d)} B) at {where:#x}"
    # quiet first: a go-back-N or a timer's resends may still be on the cable or in a NIC's
    # receive path after the last CQE (the SENDs' QP resends after 3000 cycles)
    links = env.net.tx_links
    for _ in range(20):
        ca, cb = await a.ctl.read_counters(), await b.ctl.read_counters()
        settled = all(links[d].counters["sent"] == links[d].counters["delivered"] + links[d].counters["dropped"]
                      and links[d].counters["delivered"] == sum(c[k] for k in c if k.startswith("rx_"))
                      for c, d in ((cb, 0), (ca, 1)))
        if settled:
            break
        await ClockCycles(dut.clk, 1000)
    injected = {d: links[d].counters for d in (0, 1)}
    dut._log.info(f"{kind} at {rate}: link 0->1 {injected[0]}, 1->0 {injected[1]}; "
                  f"NIC 0 {dict((k, v) for k, v in ca.items() if v)}; NIC 1 {dict((k, v) for k, v in cb.items() if v)}")
    # the counters against the faults injected
    fault_key = fault_matrix.counter(kind)
    data_faults, ack_faults = injected[0][fault_key], injected[1][fault_key]
    assert data_faults + ack_faults > 0, "no fault was injected: raise the rate or the traffic"
    # every frame one NIC sent reached the other's MAC once, or twice when duplicated; none
    # when dropped; each counted once by a receive counter
    bad = lambda c: c["rx_bad_icrc"] + c["rx_bad_ip_checksum"] + c["rx_bad_length"] + c["rx_not_roce"]
    for c, direction in ((cb, 0), (ca, 1)):
        assert sum(c[k] for k in c if k.startswith("rx_")) == injected[direction]["delivered"]
        assert bad(c) == (injected[direction]["corrupted"] if kind == "corrupt" else 0)
    if kind in ("drop", "corrupt") and data_faults:
        assert ca["retransmits"] > 0, "frames were lost but nothing was sent again"
    if kind == "duplicate":
        # link 0->1 carries NIC 0's WRITEs and its ATOMIC ACKs to NIC 1's atomics: a second
        # WRITE is a PSN duplicate at NIC 1, a second ATOMIC ACK a stale response
        assert cb["rx_psn_duplicate"] + cb["resp_stale"] >= data_faults
    _assert_no_underrun(a, b)          # READ RESPONSEs re-read after a go-back-N too
    return env


fault_matrix.define_tests(globals(), _faulty, fault_matrix.SEED, "{kind} at {percent}% on both directions of the cable")


@cocotb.test()
async def rc_zero_byte_sends_padded(dut):
    """0-byte SENDs from NIC 0 into NIC 1's receive queue through MACs that pad short frames
    to Ethernet's 60 bytes (``mac_pad``): NIC 0 sends each as the golden model's 58-byte
    frame (no Ethernet padding: that is its MAC's job), the cable carries 60 bytes, and
    NIC 1 takes it by the ICRC in front of the padding: ACKed, a receive CQE with byte
    count 0. Between them a 5-byte SEND (66 bytes) and a 0-byte SEND with immediate (62
    bytes), not padded. NIC 0's frames and CQEs as the model's, NIC 1's receive CQEs as
    plain numbers, the 5 bytes in place; no bad ICRC, nothing sent twice."""
    env = await NicPairEnv(dut, latency_cycles=100, mac_pad=True).start()
    a, b = env.nics
    cq_a = await a.cq(0, 7)
    rcq = await b.cq(2, 6)
    qp_s, qp_r = await env.connect(0, 4, 1, 14, cq_a=cq_a, cq_b=rcq, pd=PD, timeout=3000,
                                   b_kw=dict(recv=(6, 4), rcq=rcq))
    qp_r.post_recv(*[[(RECV_BUFS + 0x100 * i, 0x40)] for i in range(4)])
    addr = a.gpu.alloc(8, 128)
    a.gpu.write(addr, b"hello")
    qp_s.post_send()
    qp_s.post_send(local_addr=addr, length=5)
    qp_s.post_send()
    qp_s.post_send(imm=0x0BADCAFE)
    await qp_s.ring_rdma_core()
    a.check(await a.drain(timeout_cycles=100_000))
    assert [len(f) for f in a.wire.frames] == [58, 66, 58, 62]
    assert [len(f) for f, _, _ in b.rx.sent] == [60, 66, 60, 62]
    assert b.rx.sent[0][0] == a.wire.frames[0].data + bytes(2)
    await b.wait_for(lambda: sum(cqn == 2 for cqn, *_ in b.cqe_writes()) >= 4, 20_000, "NIC 1's receive CQEs")
    rcqes = [parse_cqe(raw) for cqn, _, raw, _ in b.cqe_writes() if cqn == 2]
    got = [(c["qpn"], c["opcode"], c["byte_cnt"], c["imm"], c["wqe_counter"], c["syndrome"]) for c in rcqes]
    assert got == [(14, CqeOp.RESP_SEND, 0, 0, 0, 0), (14, CqeOp.RESP_SEND, 5, 0, 1, 0),
                   (14, CqeOp.RESP_SEND, 0, 0, 2, 0), (14, CqeOp.RESP_SEND_IMM, 0, 0x0BADCAFE, 3, 0)], got
    assert b.mem.read(RECV_BUFS + 0x100, 5) == b"hello"
    ca, cb = await a.ctl.read_counters(), await b.ctl.read_counters()
    assert (cb["rx_accepted"], cb["rx_bad_icrc"], cb["rx_bad_length"]) == (4, 0, 0), cb
    assert (ca["retransmits"], ca["timeouts"]) == (0, 0), ca


@cocotb.test()
async def rc_gather_resume(dut):
    """Go-back-N inside gather lists: two RDMA WRITEs from 4 and 2 pointer segments (an
    empty one, odd offsets, one across 4 KiB) at MTU 256, 3 and 4 packets. The first
    WRITE's second packet is lost (a NAK: resent from byte 256, 156 bytes into its third
    segment, past the empty one), then, in the resend, the second WRITE's third packet
    (a NAK: resent from byte 512, 12 bytes into its second segment). The remote memory
    gets both messages (the segments' concatenation), and every frame on both directions
    and every CQE equals the golden model's (``simulate``)."""
    mtu, timeout = 256, 400
    pattern = [(1, "drop"), (11, "drop")]        # frame 11: PSN 5 as resent after the first NAK
    a, b, cq_a, qp_a = await _one_qp_pair(dut, {("tx", 0): FaultSpec(pattern=pattern)}, mtu, 1, timeout)
    sent = []
    for e, segs in enumerate([[(100, 3), (0, 9), (300, 4096 - 150), (250, 7)], [(500, 4096 - 200), (290, 11)]]):
        gl, data = [], b""
        for k, (n, off) in enumerate(segs):
            base = (a.gpu.alloc(n + off + 1, 4096)) + off
            d = bytes((e * 53 + k * 29 + j * 7) & 0xFF for j in range(n))
            a.gpu.write(base, d)
            gl.append((base, n))
            data += d
        qp_a.post_write(DST + 0x1000 * e, KEY, segments=gl, signaled=True)
        sent.append((DST + 0x1000 * e, data))
    await qp_a.ring_rdma_core()
    await a.wait_for(lambda: len(a.cqe_writes()) >= 2, 30 * timeout, "2 CQEs")
    await ClockCycles(dut.clk, 4 * timeout)
    for raddr, data in sent:
        assert b.mem.read(raddr, len(data)) == data, f"remote memory at {raddr:#x}"
    req, rsp = _one_qp_models(a, cq_a, qp_a, mtu, 1, timeout)
    res = simulate(req, rsp, [(0, 1, w.wqe) for w in qp_a.posted], faults=pattern, latency_ns=200)
    assert not res.hung
    _assert_frames_as_model(res, a, b)
    assert [raw for _, _, raw, _ in a.cqe_writes()] == [rec.cqe for rec in req.completions], "CQEs differ from the model's"
    ca = await a.ctl.read_counters()
    assert ca["retransmits"] == req.counters.go_back_n >= 2, ca
