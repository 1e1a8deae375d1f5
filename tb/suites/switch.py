"""Four RTL engines through a 400G switch model (``ibgda_nic_quad``): all-to-all RC WRITEs.

Every NIC has one RC QP to each of the three others (NIC i's QP to NIC j is
``4 i + j``, so a NIC's QPs have distinct remote QPNs) and WRITEs into
a memory region of each peer, while it answers the WRITEs of all three: each MAC TX
carries requests and ACKs, each MAC RX both. The switch has output queues, so frames
of three senders meet at each egress port.

Lossless: each NIC's request frames and CQEs equal the transmit golden model; each
NIC's ACKs, per QP, equal the golden RC responder's for the requests it received; the
bytes land in the peers' memories. With faults (drop, corrupt, duplicate, reorder,
delay on every link): every message lands once and intact, every CQE comes, in order,
as the model's, and the receive counters add up to what the switch delivered.
"""
import random

import cocotb

from model.frames import Port, QpContext
from model.mr import MemoryRegion
from model.responder import RcResponder
from spec.formats import OFF_BTH, Access, Op
from model.network import FaultSpec
from tb.pair_env import NIC_IPS, NIC_MACS, NicSwitchEnv
from tb.clock import ClockCycles

PD = 5
KEY = (0x09 << 8) | 0x31
DST = 0x6000_0000
REGION = MemoryRegion(key=KEY, base=DST, length=1 << 24, access=Access.LOCAL_WRITE | Access.REMOTE_WRITE, pd=PD)
MTU = 1024
WAIT_CYCLES = 300_000                            # for every CQE of the run


def _is_ack(frame):
    return frame[OFF_BTH] == Op.ACK


async def _all_to_all(dut, msgs, *, faults=None, seed=0, timeout=None):
    rnd = random.Random(seed)
    env = await NicSwitchEnv(dut, faults=faults, seed=seed).start()
    nics = env.nics
    cqs = [await n.cq(0, 8) for n in nics]
    for n in nics:
        await n.ctl.register_mr(REGION.key, REGION.base, REGION.length, REGION.access, REGION.pd)
    qps = {}                                     # (i, j) -> NIC i's QP to NIC j
    for i in range(4):
        for j in range(i + 1, 4):
            qps[i, j], qps[j, i] = await env.connect(i, 4 * i + j, j, 4 * j + i, cq_a=cqs[i], cq_b=cqs[j], mtu=MTU, pd=PD,
                                                     ack_every=(1 + i + j) % 4 + 1,
                                                     **({"timeout": timeout} if timeout else {}))
    sent = []                                    # (peer NIC, raddr, data)
    for k in range(msgs):
        for (i, j), qp in sorted(qps.items()):
            n = rnd.choice([8, 64, 700, MTU, 2 * MTU + 5])
            raddr = DST + 0x10_0000 * i + 0x4000 * k + rnd.randrange(64)
            data = bytes(rnd.randrange(256) for _ in range(n))
            signaled = k % 2 == 1 or k == msgs - 1
            if n <= 28:
                qp.post_write(raddr, KEY, inline=data, signaled=signaled)
            else:
                addr = nics[i].gpu.alloc(n, 128)
                nics[i].gpu.write(addr, data)
                qp.post_write(raddr, KEY, local_addr=addr, length=n, signaled=signaled)
            sent.append((j, raddr, data))
            if signaled:
                await qp.ring_nvshmem()
    preds = [n.predict() for n in nics]
    want = [p.totals.cqes for p in preds]
    await nics[0].wait_for(lambda: all(len(n.cqe_writes()) >= w for n, w in zip(nics, want)), WAIT_CYCLES,
                           lambda: f"CQEs {want} (got {[len(n.cqe_writes()) for n in nics]})")
    await ClockCycles(dut.clk, 1000)
    for j, raddr, data in sent:
        assert nics[j].mem.read(raddr, len(data)) == data, f"NIC {j} memory at {raddr:#x} ({len(data)} B)"
    counters = [await n.ctl.read_counters() for n in nics]
    for i, c in enumerate(counters):
        dut._log.info(f"NIC {i}: {dict((k, v) for k, v in c.items() if v)}")
    dut._log.info(f"switch: {env.net.counters}")
    return env, nics, qps, preds, counters


@cocotb.test()
async def all_to_all(dut):
    """Lossless: 4 NICs x 3 peers, WRITEs of 8 B .. 2 MTU, requests and ACKs against the models
    (4 WRITEs a QP on Verilator, 2 on Icarus, where 4 took 94 s of the regression's budget)."""
    msgs = 4 if cocotb.SIM_NAME.lower().startswith("verilator") else 2
    env, nics, qps, preds, counters = await _all_to_all(dut, msgs)
    for i, nic in enumerate(nics):
        requests = [f for f in nic.wire.frames if not _is_ack(f.data)]
        nic.check(preds[i], frames=requests)             # request frames and CQEs: the transmit model
    # each NIC's ACKs are the RC responder model's for the requests it received, QP by QP
    for j, nic in enumerate(nics):
        model = RcResponder(Port(smac=NIC_MACS[j], sip=NIC_IPS[j]))
        for (a, b), qp in qps.items():
            if b == j:
                mine = qps[j, a]
                model.add_qp(QpContext(qpn=mine.qpn, remote_qpn=qp.qpn, dmac=NIC_MACS[a], dip=NIC_IPS[a],
                                       start_psn=qp.start_psn, mtu=MTU), PD, ack_every=(1 + a + j) % 4 + 1)
        model.register(REGION)
        want = {}
        for a in range(4):
            if a == j:
                continue
            for f in nics[a].wire.frames:
                if _is_ack(f.data) or f.data[:6] != NIC_MACS[j].to_bytes(6, "big"):
                    continue
                r = model.receive(f.data)
                assert r.accepted, f"NIC {j} model refuses a request of NIC {a}: {r}"
                if r.response is not None:
                    want.setdefault(r.response[OFF_BTH + 5:OFF_BTH + 8], []).append(r.response)
        got = {}
        for f in nic.wire.frames:
            if _is_ack(f.data):
                got.setdefault(f.data[OFF_BTH + 5:OFF_BTH + 8], []).append(f.data)
        assert got == want, f"NIC {j}: ACK frames per destination QP differ from the RC responder model"
        c = counters[j]
        received = sum(1 for a in range(4) if a != j for f in nics[a].wire.frames
                       if f.data[:6] == NIC_MACS[j].to_bytes(6, "big"))
        assert c["rx_accepted"] + c["rx_ack_received"] == received and c["naks_sent"] == 0, c
        assert c["retransmits"] == 0 and c["timeouts"] == 0, c
    assert env.net.counters["tail_drops"] == 0


@cocotb.test()
async def all_to_all_faults(dut):
    """All-to-all with drops, corruption, duplicates, reorders and delays (2% each) on every link."""
    spec = FaultSpec(drop=0.02, corrupt=0.02, duplicate=0.02, reorder=0.02, delay=0.02, delay_cycles=300,
                     reorder_depth=2)
    env, nics, qps, preds, counters = await _all_to_all(dut, 3, faults=spec, seed=7, timeout=2000)
    for nic in nics:
        nic.check_cqes()                             # every CQE, in order, as the model
    injected = {}
    for link in env.net.links:
        for k, v in link.counters.items():
            injected[k] = injected.get(k, 0) + v
    dut._log.info(f"links: {injected}")
    assert sum(injected.get(k, 0) for k in ("dropped", "corrupted", "duplicated", "reordered", "delayed")) > 0, \
        "no fault was injected"
    # every frame the switch delivered reached a MAC RX and was counted there once
    delivered = sum(link.counters["delivered"] for link in env.net.rx_links)
    counted = sum(v for c in counters for k, v in c.items() if k.startswith("rx_"))
    assert counted == delivered, f"receive counters {counted}, frames delivered {delivered}"
    if injected.get("dropped", 0) + injected.get("corrupted", 0):
        assert sum(c["retransmits"] for c in counters) > 0, "frames were lost but nothing was sent again"
    # a corrupted frame that reached a NIC was dropped by a header or ICRC check (one corrupted
    # in its destination MAC is unrouted; one corrupted and then dropped never arrives)
    bad = sum(c[k] for c in counters for k in ("rx_bad_icrc", "rx_bad_ip_checksum", "rx_bad_length", "rx_not_roce"))
    assert bad <= injected.get("corrupted", 0) and (bad > 0) == (injected.get("corrupted", 0) > 0), \
        f"{bad} frames failed the receive checks, {injected.get('corrupted', 0)} were corrupted"
