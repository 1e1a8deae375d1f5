"""Two RTL engines back to back (``ibgda_nic_pair``): RC RDMA WRITE end to end.

NIC 0's GPU posts WRITEs of every shape into a memory region of NIC 1's GPU. Checked:
NIC 0's frames and CQEs equal the transmit golden model (model/engine.py); the bytes in
NIC 1's GPU memory equal what was sent; NIC 1's ACK frames equal the RC golden
responder's (model/rc.py) for NIC 0's frames; every CQE of NIC 0 is written only after
the ACK covering its WQE reached NIC 0; the receive counters of both agree.
"""
import random

import cocotb

from model.frames import Port, QpContext
from model.mr import MemoryRegion
from model.rc import RcResponder
from spec.formats import Access, CQE64, unpack
from tb.pair_env import NIC_IPS, NIC_MACS, NicPairEnv

PD = 3
KEY = (0x05 << 8) | 0x77
DST = 0x4000_0000
REGION = MemoryRegion(key=KEY, base=DST, length=1 << 22, access=Access.LOCAL_WRITE | Access.REMOTE_WRITE, pd=PD)


async def _pair(dut, links, *, mtu=1024, ack_every=(1, 4, 8)):
    env = await NicPairEnv(dut, latency_cycles=100).start()
    a, b = env.nics
    cq_a = await a.cq(0, 7)
    cq_b = await b.cq(0, 7)
    await b.ctl.register_mr(REGION.key, REGION.base, REGION.length, REGION.access, REGION.pd)
    pairs = []
    for (qa, qb), every in zip(links, ack_every):
        pairs.append(await env.connect(0, qa, 1, qb, cq_a=cq_a, cq_b=cq_b, mtu=mtu, pd=PD, ack_every=every))
    return env, a, b, pairs


def _responder_model(pairs, mtu, ack_every):
    model = RcResponder(Port(smac=NIC_MACS[1], sip=NIC_IPS[1]))
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
    acks = [(last, int.from_bytes(f[47:50], "big"), int.from_bytes(f[51:54], "big"))
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
