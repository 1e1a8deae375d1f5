"""Two RTL engines back to back (``ibgda_nic_pair``): RC RDMA WRITE end to end.

NIC 0's GPU posts WRITEs of every shape into a memory region of NIC 1's GPU. Checked:
NIC 0's frames and CQEs equal the transmit golden model (model/engine.py); the bytes in
NIC 1's GPU memory equal what was sent; NIC 1's ACK frames equal the RC golden
responder's (model/rc.py) for NIC 0's frames; every CQE of NIC 0 is written only after
the ACK covering its WQE reached NIC 0; the receive counters of both agree.
"""
import random

import cocotb
from cocotb.triggers import ClockCycles

from model.frames import Port, QpContext
from model.mr import MemoryRegion
from model.rc import RcResponder
from spec.formats import Access, CQE64, unpack
from tb import fault_matrix
from tb.network import FaultSpec
from tb.pair_env import NIC_IPS, NIC_MACS, NicPairEnv

PD = 3
KEY = (0x05 << 8) | 0x77
DST = 0x4000_0000
REGION = MemoryRegion(key=KEY, base=DST, length=1 << 24, access=Access.LOCAL_WRITE | Access.REMOTE_WRITE, pd=PD)


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


async def _faulty(dut, kind, rate, seed):
    """WRITEs from NIC 0 to NIC 1 with ``kind`` faults at ``rate`` on both directions
    of the cable: every message arrives once and intact, every CQE comes, in order,
    and the counters agree with the faults the link injected."""
    rnd = random.Random(seed)
    mtu = 1024
    spec = FaultSpec(**{kind: rate}, delay_cycles=300, reorder_depth=2)
    env, a, b, pairs = await _pair(dut, [(1, 11), (2, 12)], mtu=mtu, ack_every=(1, 4), faults=spec, seed=seed,
                                   timeout=3000)
    sent = []
    for i in range(fault_matrix.messages(rate)):
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
    pred = a.predict()
    want_cqes = pred.totals.cqes
    try:
        await a.wait_for(lambda: len(a.cqe_writes()) >= want_cqes, 400_000,
                         f"{want_cqes} CQEs (got {len(a.cqe_writes())})")
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
    ca, cb = await a.ctl.read_counters(), await b.ctl.read_counters()
    links = env.net.tx_links
    injected = {d: links[d].counters for d in (0, 1)}
    dut._log.info(f"{kind} at {rate}: link 0->1 {injected[0]}, 1->0 {injected[1]}; "
                  f"NIC 0 {dict((k, v) for k, v in ca.items() if v)}; NIC 1 {dict((k, v) for k, v in cb.items() if v)}")
    # the counters against the faults injected
    fault_key = {"drop": "dropped", "corrupt": "corrupted", "duplicate": "duplicated", "reorder": "reordered",
                 "delay": "delayed"}[kind]
    data_faults, ack_faults = injected[0][fault_key], injected[1][fault_key]
    assert data_faults + ack_faults > 0, "no fault was injected: raise the rate or the traffic"
    # every frame NIC 0 sent reached NIC 1's MAC once, or twice when duplicated; none when dropped
    frames_to_b = injected[0]["delivered"]
    assert sum(cb[k] for k in cb if k.startswith("rx_") and k != "rx_ack_received") == frames_to_b
    assert cb["rx_bad_icrc"] + cb["rx_bad_ip_checksum"] + cb["rx_bad_length"] + cb["rx_not_roce"] \
        == (data_faults if kind == "corrupt" else 0)
    assert ca["rx_ack_received"] + ca["rx_bad_icrc"] + ca["rx_bad_ip_checksum"] + ca["rx_bad_length"] \
        + ca["rx_not_roce"] == injected[1]["delivered"]
    if kind in ("drop", "corrupt") and data_faults:
        assert ca["retransmits"] > 0, "frames were lost but nothing was sent again"
    if kind == "duplicate":
        assert cb["rx_psn_duplicate"] >= data_faults
    return env


def _fault_test(kind, rate, seed):
    async def test(dut):
        await _faulty(dut, kind, rate, seed)
    test.__name__ = test.__qualname__ = fault_matrix.test_name(kind, rate)
    test.__doc__ = f"{kind} at {100 * rate:g}% on both directions of the cable"
    return cocotb.test()(test)


for _kind in fault_matrix.KINDS:
    for _rate in fault_matrix.RATES:
        globals()[fault_matrix.test_name(_kind, _rate)] = _fault_test(_kind, _rate, fault_matrix.SEED)
