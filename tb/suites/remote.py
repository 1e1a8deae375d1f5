"""System regressions of READ and atomics with the NIC as requester (cocotb).

The peer of each RC QP is the golden responder (``RcResponder`` with ``remote_ops``) on
its own memory, answering the NIC's frames after a wire latency; the golden requester
(``RcRequester`` with ``remote_ops``) is posted the same WQEs and given the same
responses, and the NIC's frames, the values it writes to its GPU memory and its CQEs
must equal the model's. The arithmetic is also checked against plain numbers (a sum of
fetch-adds, the value a compare-swap leaves), so the model cannot agree with itself.
"""
import random
import zlib

import cocotb
from cocotb.triggers import RisingEdge

from model.cqe import CqContext
from model.frames import Port, QpContext
from model.memory import SparseMemory
from model.mr import MemoryRegion
from model.requester import RcRequester
from model.responder import RcResponder
from spec.formats import Access, Op, WqeOp, unpack, BTH, OFF_BTH
from tb.env import NicEnv, PORT_IP, PORT_MAC, peer_ip, peer_mac
from tb.clock import ClockCycles

PD = 3
REMOTE = 0x4000_0000                 # the peers' memory region
REMOTE_LEN = 1 << 20
KEY = (0x31 << 8) | 0x77
LOCAL = 0x0800_0000                  # where originals land in the NIC's GPU memory
LATENCY = 300                        # cycles from a request's last byte to its answer
NEVER = 1 << 31


class PeerMemory(SparseMemory):
    """The peers' memory: sparse bytes, zero where never written."""
    def u(self, addr, n):
        return int.from_bytes(self.read(addr, n), "little")


class RequesterWithPeers:
    """The NIC's RC QPs, each answered by a golden responder, and the golden requester
    that predicts the NIC."""

    def __init__(self, env, cq, qps, *, latency=LATENCY, drop=None):
        self.env, self.cq, self.qps, self.latency = env, cq, qps, latency
        self.drop = drop or (lambda direction, frame, k: False)
        self.mem = PeerMemory()
        self.peers = {}
        for qp in qps:
            r = RcResponder(Port(smac=peer_mac(qp.qpn), sip=peer_ip(qp.qpn)), remote_ops=True,
                            read_memory=self.mem.read)
            r.add_qp(QpContext(qpn=qp.remote_qpn, remote_qpn=qp.qpn, dmac=PORT_MAC, dip=PORT_IP,
                               start_psn=qp.start_psn, mtu=qp.mtu), pd=PD)
            r.register(MemoryRegion(key=KEY, base=REMOTE, length=REMOTE_LEN, pd=PD,
                                    access=Access.REMOTE_READ | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC))
            self.peers[qp.remote_qpn] = r
        self.model = RcRequester(Port(smac=PORT_MAC, sip=PORT_IP), {cq.cqn: CqContext(cq.cqn, cq.log_depth,
                                                                                       base=cq.base)},
                                 env.mem.read, remote_ops=True, write_memory=self._model_write)
        for qp in qps:
            self.model.add_qp(QpContext(qpn=qp.qpn, remote_qpn=qp.remote_qpn, dmac=qp.dmac, dip=qp.dip,
                                        start_psn=qp.start_psn, mtu=qp.mtu, cqn=cq.cqn, user_index=qp.user_index),
                              timeout_ns=NEVER, max_rd_atomic=getattr(qp, "max_rd_atomic", 16))
        self.model_writes = {}           # addr -> bytes the model's requester wrote
        self.expect = []                 # frames the model sends, in order
        self.delivered = []              # responses handed to the NIC
        self.sent_k = self.resp_k = 0
        cocotb.start_soon(self._bridge())

    def _model_write(self, addr, data):
        self.model_writes[addr] = bytes(data)

    def post(self, qp, wqes):
        for w in wqes:
            self.expect += [t.frame for t in self.model.post(qp.qpn, w.wqe)]

    async def _bridge(self):
        env = self.env
        seen = 0
        while True:
            await RisingEdge(env.dut.clk)
            while seen < len(env.wire.frames):
                f = env.wire.frames[seen].data
                seen += 1
                k, self.sent_k = self.sent_k, self.sent_k + 1
                if self.drop("request", f, k):
                    continue
                dqpn = unpack(BTH, f, OFF_BTH)["dqpn"]
                res = self.peers[dqpn].receive(f)
                for a, d in res.writes:
                    self.mem.write(a, d)
                outs = res.read_responses or ([res.response] if res.response is not None else [])
                for o in outs:
                    j, self.resp_k = self.resp_k, self.resp_k + 1
                    if self.drop("response", o, j):
                        continue
                    env.rx.send(o, env.counter.now + self.latency)
                    self.delivered.append(o)
                    out = self.model.on_response(o, 0)
                    self.expect += [t.frame for t in out.retransmit]

    async def finish(self, ncqes, timeout_cycles=40_000):
        cqes = await self.cq.poll(ncqes, timeout_cycles)
        await ClockCycles(self.env.dut.clk, 2 * self.latency)
        return cqes

    def check(self, cqes, frames=True):
        """Frames (``frames``) and CQEs per QP (between QPs their order is the scheduler's
        and the ACKs' timing), the originals the model wrote. Under faults the frames are
        not compared: the model resends every outstanding packet the moment a response
        says so, the NIC walks its WQEs again from GPU memory (a microsecond later), so
        how many are resent before the next response moves the restart point is timing."""
        def by_qp(frames):
            out = {}
            for f in frames:
                out.setdefault(f[OFF_BTH + 5:OFF_BTH + 8], []).append(f)
            return out
        got, want = by_qp(f.data for f in self.env.wire.frames), by_qp(self.expect)
        for q in sorted(set(got) | set(want)) if frames else ():
            a, b = got.get(q, []), want.get(q, [])
            summary = lambda fs: " ".join(f"{f[OFF_BTH]:02x}:{int.from_bytes(f[OFF_BTH + 9:OFF_BTH + 12], 'big'):x}"
                                          for f in fs)
            assert a == b, (f"QP {q.hex()}: {len(a)} frames, the model sends {len(b)}; first difference at "
                            f"{next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))}\n"
                            f"NIC   {summary(a)}\nmodel {summary(b)}")
        key = lambda c: c[0]
        got_c = sorted(((c.qpn, k, c.raw) for k, c in enumerate(cqes)), key=key)
        want_c = sorted(((c.qpn, k, c.cqe) for k, c in enumerate(self.model.completions)), key=key)
        assert [(q, r) for q, _, r in got_c] == [(q, r) for q, _, r in want_c], (
            f"CQEs {[(c.opcode, c.qpn, c.wqe_counter, c.byte_cnt, c.syndrome) for c in cqes]}, the model "
            f"{[(c.opcode, c.qpn, c.wqe_counter, c.byte_cnt, c.syndrome) for c in self.model.completions]}")
        for addr, data in self.model_writes.items():
            assert self.env.mem.read(addr, len(data)) == data, (
                f"{addr:#x}: the NIC wrote {self.env.mem.read(addr, len(data)).hex()}, the model {data.hex()}")
        assert self.cq.try_poll() is None, "a CQE the model does not write"


async def _setup(dut, nqps=1, limits=None, **kw):
    """``limits``: QP -> QP_MAX_RD_ATOMIC (default 16)."""
    env = await NicEnv(dut).start()
    cq = await env.cq(0, 8)
    qps = []
    for q in range(1, nqps + 1):
        limit = (limits or {}).get(q, 16)
        qp = await env.qp(q, cq, mtu=1024, uc=False, timeout=NEVER, max_rd_atomic=limit)
        qp.max_rd_atomic = limit
        qps.append(qp)
    return env, cq, qps, RequesterWithPeers(env, cq, qps, **kw)


def _u(env, addr, n, order="little"):
    return int.from_bytes(env.mem.read(addr, n), order)


@cocotb.test()
async def atomics_every_form(dut):
    """Every atomic WQE form NVSHMEM and DeepEP post (IBTA FETCH_ADD / COMPARE_SWAP, the
    masked fetch-add and compare-swap on 4 and 8 bytes), between WRITEs on one RC QP:
    request frames, the originals in GPU memory (a 4-byte one big-endian, an 8-byte one
    little-endian), the peer's words and the CQEs."""
    env, cq, (qp,), net = await _setup(dut)
    words = {i: REMOTE + 8 * i for i in range(8)}
    init = {0: 100, 1: 7, 2: 0x1122_3344, 3: 0x0102_0304_0506_0708, 4: 0xAAAA_5555, 5: 0xF0F0_F0F0_0F0F_0F0F, 6: 9}
    for i, v in init.items():
        net.mem.write(words[i], v.to_bytes(8, "little"))        # GPU memory: host order
    src, _ = env.payload(8, seed=1)
    w = []
    w.append(qp.post_write(REMOTE + 0x1000, KEY, local_addr=src, length=8))
    w.append(qp.post_atomic(WqeOp.ATOMIC_FA, words[0], KEY, 5, local_addr=LOCAL))
    w.append(qp.post_atomic(WqeOp.ATOMIC_CS, words[1], KEY, 70, 7, local_addr=LOCAL + 8))
    w.append(qp.post_masked_atomic(WqeOp.ATOMIC_MASKED_FA, 4, words[2], KEY, {"add": 1, "field_boundary": 0},
                                   local_addr=LOCAL + 16))
    w.append(qp.post_masked_atomic(WqeOp.ATOMIC_MASKED_FA, 8, words[3], KEY,
                                   {"add": 0x0101_0101_0101_0101, "field_boundary": 0x8080_8080_8080_8080},
                                   local_addr=LOCAL + 24))
    w.append(qp.post_masked_atomic(WqeOp.ATOMIC_MASKED_CS, 4, words[4], KEY,
                                   {"swap": 0x1234_5678, "compare": 0xAAAA_0000, "swap_mask": 0xFFFF_0000,
                                    "compare_mask": 0xFFFF_0000}, local_addr=LOCAL + 32))
    w.append(qp.post_masked_atomic(WqeOp.ATOMIC_MASKED_CS, 8, words[5], KEY,
                                   {"swap": 0, "compare": 0, "swap_mask": 0xFF00_0000_0000_00FF, "compare_mask": 0},
                                   local_addr=LOCAL + 40, signaled=False))
    w.append(qp.post_nop())
    w.append(qp.post_write(REMOTE + 0x2000, KEY, local_addr=src, length=8))
    net.post(qp, w)
    await qp.ring_nvshmem()
    cqes = await net.finish(8)
    net.check(cqes)
    # plain numbers: the peer's words after, the originals the NIC wrote
    assert net.mem.u(words[0], 8) == 105 and _u(env, LOCAL, 8) == 100
    assert net.mem.u(words[1], 8) == 70 and _u(env, LOCAL + 8, 8) == 7
    assert net.mem.u(words[2], 4) == 0x1122_3345 and _u(env, LOCAL + 16, 4, "big") == 0x1122_3344
    assert net.mem.u(words[3], 8) == 0x0203_0405_0607_0809 and _u(env, LOCAL + 24, 8) == init[3]
    assert net.mem.u(words[4], 4) == 0x1234_5555 and _u(env, LOCAL + 32, 4, "big") == init[4]
    assert net.mem.u(words[5], 8) == 0x00F0_F0F0_0F0F_0F00 and _u(env, LOCAL + 40, 8) == init[5]
    ops = [unpack(BTH, f.data, OFF_BTH)["opcode"] for f in env.wire.frames]
    assert ops == [0x0A, 0x14, 0x13, 0xC1, 0xC1, 0xC0, 0xC0, 0x0A], [hex(o) for o in ops]


@cocotb.test()
async def fetch_add_counts_exactly_once(dut):
    """DeepEP's count: 3 QPs each post 24 4-byte masked fetch-adds to one shared word and
    8-byte IBTA fetch-adds to a word of their own, unsignaled between signaled WRITEs, so
    more than 16 are posted at a time (the ring of 16 per QP holds the rest back): the
    shared word ends at the sum, the originals seen are each partial sum once, every CQE
    is the model's."""
    env, cq, qps, net = await _setup(dut, 3)
    shared = REMOTE + 0x100
    rnd = random.Random(zlib.crc32(b"fetch_add_counts_exactly_once"))
    adds, slots = [], []
    ncqe = 0
    for qp in qps:
        w = []
        own = REMOTE + 0x1000 * qp.qpn
        for i in range(24):
            v = rnd.randrange(1, 1000)
            adds.append(v)
            slot = LOCAL + 0x1000 * qp.qpn + 8 * i
            slots.append(slot)
            w.append(qp.post_masked_atomic(WqeOp.ATOMIC_MASKED_FA, 4, shared, KEY, {"add": v, "field_boundary": 0},
                                           local_addr=slot, signaled=i % 8 == 7))
            ncqe += i % 8 == 7
            if i % 6 == 5:
                w.append(qp.post_atomic(WqeOp.ATOMIC_FA, own, KEY, 3, local_addr=slot + 0x800, signaled=False))
        w.append(qp.post_nop())
        ncqe += 1
        net.post(qp, w)
    for qp in qps:
        await qp.ring_nvshmem()
    cqes = await net.finish(ncqe, 60_000)
    net.check(cqes)
    assert net.mem.u(shared, 4) == sum(adds)
    # applied once each, one at a time: sorted by the original each saw, every add takes
    # the word from its original to the next one's, the last to the sum
    chain = sorted((_u(env, s, 4, "big"), v) for s, v in zip(slots, adds))
    assert chain[0][0] == 0, chain[:3]
    for (o, v), (o2, _) in zip(chain, chain[1:]):
        assert o + v == o2, f"an add of {v} saw {o}, the next one {o2}"
    assert chain[-1][0] + chain[-1][1] == sum(adds)
    for qp in qps:
        assert net.mem.u(REMOTE + 0x1000 * qp.qpn, 8) == 3 * 4


@cocotb.test()
async def max_rd_atomic_per_qp(dut):
    """QP_MAX_RD_ATOMIC: QP 1 may have 2 atomics in flight, QP 2 the default 16 (the peer
    answers each 300 cycles after it). Each posts 12 8-byte FETCH_ADDs and a signaled
    NOP: frames and CQEs as the model (given the same limits); QP 1 sends its k-th
    request only after the ATOMIC ACK of its (k-2)-th reached the NIC, QP 2 all 12 before
    its first answer; the words are the sums."""
    limits = {1: 2}
    env, cq, qps, net = await _setup(dut, 2, limits=limits)
    for qp in qps:
        w = [qp.post_atomic(WqeOp.ATOMIC_FA, REMOTE + 0x1000 * qp.qpn, KEY, i + 1,
                            local_addr=LOCAL + 0x1000 * qp.qpn + 8 * i, signaled=False) for i in range(12)]
        w.append(qp.post_nop())
        net.post(qp, w)
    for qp in qps:
        await qp.ring_nvshmem()
    cqes = await net.finish(2, 40_000)
    net.check(cqes)
    for qp in qps:
        assert net.mem.u(REMOTE + 0x1000 * qp.qpn, 8) == sum(range(1, 13))
        sent = [f.first_cycle for f in env.wire.frames
                if unpack(BTH, f.data, OFF_BTH)["dqpn"] == qp.remote_qpn and f.data[OFF_BTH] == Op.FETCH_ADD]
        answered = [last for f, _, last in env.rx.sent
                    if unpack(BTH, f, OFF_BTH)["dqpn"] == qp.qpn and f[OFF_BTH] == Op.ATOMIC_ACK]
        assert len(sent) == len(answered) == 12, (len(sent), len(answered))
        limit = limits.get(qp.qpn, 16)
        if limit < 12:
            early = [k for k in range(limit, 12) if sent[k] <= answered[k - limit]]
            assert not early, f"QP {qp.qpn}: requests {early} sent with {limit} already in flight"
        else:
            assert sent[-1] < answered[0], f"QP {qp.qpn} held back below its limit of {limit}"


@cocotb.test()
async def atomic_ack_lost(dut):
    """Lost ATOMIC ACKs and a lost request: the next response beyond a missing answer is
    an implied NAK (go back), the peer answers the resent atomic from its replay record,
    so every fetch-add is applied exactly once and every CQE arrives as the model's."""
    lost = {("response", 1), ("response", 5), ("request", 9)}
    env, cq, (qp,), net = await _setup(dut, drop=lambda d, f, k: (d, k) in lost)
    word = REMOTE + 0x40
    src, _ = env.payload(64, seed=3)
    w = []
    for i in range(12):
        w.append(qp.post_atomic(WqeOp.ATOMIC_FA, word, KEY, i + 1, local_addr=LOCAL + 8 * i, signaled=True))
        if i % 3 == 2:
            w.append(qp.post_write(REMOTE + 0x8000 + 64 * i, KEY, local_addr=src, length=64))
    net.post(qp, w)
    await qp.ring_nvshmem()
    cqes = await net.finish(16, 80_000)
    net.check(cqes, frames=False)
    # the first transmission of every WQE as the model's
    assert [f.data for f in env.wire.frames[:16]] == net.expect[:16]
    assert net.mem.u(word, 8) == sum(range(1, 13))
    assert [_u(env, LOCAL + 8 * i, 8) for i in range(12)] == [sum(range(1, i + 1)) for i in range(12)]
    assert len(env.wire.frames) > 16, "nothing was resent"
