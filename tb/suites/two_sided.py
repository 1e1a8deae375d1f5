"""System regressions of the two-sided verbs with the NIC as requester (cocotb): SEND,
SEND with immediate and WRITE with immediate, RNR.

The peer of each RC QP is the golden responder with receive queues (``RcResponder`` with
``two_sided``) on its own memory, answering after a wire latency; the golden requester
(``RcRequester`` with ``two_sided``, the gather list the engine takes) is posted the same
WQEs, given the same responses and its timers at the same simulated time, and the NIC's
frames (per QP, in order) and CQEs must equal the model's. What lands at the peer is
also checked against plain bytes and numbers (the scatter worked out here, the receive
CQEs' fields), so the model cannot agree with itself.
"""
import cocotb
from cocotb.triggers import ClockCycles, RisingEdge

from model.cqe import CqContext
from model.frames import Port, QpContext
from model.memory import SparseMemory
from model.mr import MemoryRegion
from model.recv_queue import RecvPoster, RecvQueue
from model.requester import RcRequester
from model.responder import RcResponder
from spec import params as P
from spec.formats import AETH, BTH, OFF_BTH, OFF_EXT, RNR_TIMER_NS, Access, Aeth, CqeOp, Op, Syndrome, WqeOp, unpack
from tb.env import ENGINE_VERBS, NicEnv, PORT_IP, PORT_MAC, peer_ip, peer_mac

PD = 3
REMOTE = 0x4000_0000                 # the peers' memory region (WRITE with immediate lands here)
KEY = (0x31 << 8) | 0x77
RQ_BASE = 0x5000_0000                # the peers' receive queues, 64 KiB apart
DBR_BASE = 0x5800_0000
BUFS = 0x6000_0000                   # the peers' receive buffers
RCQN = 9
LATENCY = 300                        # cycles from a request's last byte to its answer
NEVER = 1 << 31
NS_PER_CYCLE = 1000 // P.CLOCK_MHZ


class SendPeers:
    """The NIC's RC QPs, each answered by a golden responder with a receive queue, and the
    golden requester that predicts the NIC (its RNR timers run on simulated time)."""

    def __init__(self, env, cq, qps, *, rnr_timer=1):
        self.env, self.cq, self.qps = env, cq, qps
        self.mem = SparseMemory()
        self.peers, self.posters = {}, {}
        for i, qp in enumerate(qps):
            rq = RecvQueue(base=RQ_BASE + (i << 16), log_size=6, log_stride=6, dbr=DBR_BASE + 64 * i)
            r = RcResponder(Port(smac=peer_mac(qp.qpn), sip=peer_ip(qp.qpn)), two_sided=True,
                            read_memory=self.mem.read, cqs={RCQN: CqContext(RCQN, 8, base=0x7000_0000)})
            r.add_qp(QpContext(qpn=qp.remote_qpn, remote_qpn=qp.qpn, dmac=PORT_MAC, dip=PORT_IP,
                               start_psn=qp.start_psn, mtu=qp.mtu, rq=rq, rcqn=RCQN, min_rnr_timer=rnr_timer), pd=PD)
            r.register(MemoryRegion(key=KEY, base=REMOTE, length=1 << 20, pd=PD,
                                    access=Access.LOCAL_WRITE | Access.REMOTE_WRITE))
            self.peers[qp.remote_qpn] = r
            self.posters[qp.qpn] = RecvPoster(rq, self.mem)
        self.model = RcRequester(Port(smac=PORT_MAC, sip=PORT_IP),
                                 {cq.cqn: CqContext(cq.cqn, cq.log_depth, base=cq.base)}, env.mem.read, **ENGINE_VERBS)
        for qp in qps:
            self.model.add_qp(QpContext(qpn=qp.qpn, remote_qpn=qp.remote_qpn, dmac=qp.dmac, dip=qp.dip,
                                        start_psn=qp.start_psn, mtu=qp.mtu, cqn=cq.cqn, user_index=qp.user_index,
                                        rnr_retry=qp.rnr_retry), timeout_ns=NEVER)
        self.expect = []                 # frames the model sends, in order
        self.peer_cqes = []              # the peers' receive CQEs
        self.rnr_naks = []               # (cycle the NIC gets it, PSN, timer code)
        self.sent_at = []                # (cycle, frame) of every request the NIC sent
        cocotb.start_soon(self._bridge())

    def post(self, qp, wqes):
        for w in wqes:
            self.expect += [t.frame for t in self.model.post(qp.qpn, w.wqe)]

    def post_receives(self, qp, *scatter_lists):
        """Post receive WQEs at QP ``qp``'s peer (into the peer's memory; it reads them when
        a SEND needs one)."""
        return self.posters[qp.qpn].post(*scatter_lists)

    async def _bridge(self):
        env = self.env
        seen = 0
        while True:
            await RisingEdge(env.dut.clk)
            now = env.counter.now
            d = self.model.next_deadline()
            if d is not None and d <= now * NS_PER_CYCLE:
                tx, _ = self.model.on_timeout(now * NS_PER_CYCLE)
                self.expect += [t.frame for t in tx]
            while seen < len(env.wire.frames):
                f = env.wire.frames[seen].data
                seen += 1
                self.sent_at.append((now, f))
                res = self.peers[unpack(BTH, f, OFF_BTH)["dqpn"]].receive(f)
                for a, data in res.writes:
                    self.mem.write(a, data)
                self.peer_cqes += res.cqes
                if res.response is None:
                    continue
                o = res.response
                at = now + LATENCY
                env.rx.send(o, at)
                syn = unpack(AETH, o, OFF_EXT)["syndrome"]
                if syn >> 5 == Aeth.KIND_RNR:
                    self.rnr_naks.append((at, unpack(BTH, o, OFF_BTH)["psn"], syn & 0x1F))
                out = self.model.on_response(o, at * NS_PER_CYCLE)
                self.expect += [t.frame for t in out.retransmit]

    def check(self, cqes):
        """Frames per QP and CQEs (bytes) as the model's, nothing more in the CQ."""
        for qp in self.qps:
            dq = qp.remote_qpn.to_bytes(3, "big")
            got = [f.data for f in self.env.wire.frames if f.data[OFF_BTH + 5:OFF_BTH + 8] == dq]
            want = [f for f in self.expect if f[OFF_BTH + 5:OFF_BTH + 8] == dq]
            show = lambda fs: " ".join(f"{f[OFF_BTH]:02x}:{int.from_bytes(f[OFF_BTH + 9:OFF_BTH + 12], 'big'):x}"
                                       for f in fs)
            assert got == want, f"QP {qp.qpn}: NIC {show(got)}\nmodel {show(want)}"
        assert [c.raw for c in cqes] == [c.cqe for c in self.model.completions], (
            f"CQEs {[(c.opcode, c.wqe_counter, c.byte_cnt, c.syndrome) for c in cqes]}, the model "
            f"{[(c.opcode, c.wqe_counter, c.byte_cnt, c.syndrome) for c in self.model.completions]}")
        assert self.cq.try_poll() is None, "a CQE the model does not write"


async def _setup(dut, nqps=1, *, mtu=1024, rnr_retry=7, rnr_timer=1):
    env = await NicEnv(dut).start()
    cq = await env.cq(0, 8)
    qps = []
    for q in range(1, nqps + 1):
        qp = await env.qp(q, cq, mtu=mtu, uc=False, timeout=NEVER, rnr_retry=rnr_retry)
        qp.rnr_retry = rnr_retry
        qps.append(qp)
    return env, cq, qps, SendPeers(env, cq, qps, rnr_timer=rnr_timer)


def _scatter(payload, segments):
    """Where each byte of a message lands in a receive WQE's scatter list, worked out
    here: ``{addr: bytes}``."""
    out, at = {}, 0
    for addr, n in segments:
        if at >= len(payload):
            break
        out[addr] = payload[at:at + n]
        at += n
    assert at >= len(payload), "the test's receive buffers are too short"
    return out


@cocotb.test()
async def sends_to_golden_responder(dut):
    """SEND of 300 B (ONLY) and 2500 B (FIRST/MIDDLE/LAST at MTU 1024), SEND_IMM inline,
    a 0-byte SEND, WRITE_IMM of 1500 B: the NIC's frames and CQEs as the model's; at the
    peer the bytes scattered over three buffers each, the immediate, and its receive
    CQEs (opcode, byte count, immediate, receive WQE counter) as plain numbers."""
    env, cq, (qp,), net = await _setup(dut)
    segs = [[(BUFS + 0x10000 * k + 0x1000 * j + 3 * j, 1000) for j in range(3)] for k in range(5)]
    net.post_receives(qp, *segs)
    a300, _ = env.payload(300, seed=1)
    a2500, _ = env.payload(2500, seed=2)
    a1500, _ = env.payload(1500, seed=3)
    w = [qp.post_send(local_addr=a300, length=300),
         qp.post_send(local_addr=a2500, length=2500),
         qp.post_send(inline=b"immediate, inline", imm=0xC0FFEE01),
         qp.post_send(),
         qp.post_write(REMOTE + 0x100, KEY, local_addr=a1500, length=1500, opcode=WqeOp.RDMA_WRITE_IMM,
                       imm=0x0BADF00D)]
    net.post(qp, w)
    await qp.ring_nvshmem()
    cqes = await cq.poll(5, 40_000)
    await ClockCycles(dut.clk, 2 * LATENCY)
    net.check(cqes)
    payloads = [env.mem.read(a300, 300), env.mem.read(a2500, 2500), b"immediate, inline", b""]
    for k, p in enumerate(payloads):
        for addr, data in _scatter(p, segs[k]).items():
            assert net.mem.read(addr, len(data)) == data, f"SEND {k}: bytes at {addr:#x}"
    assert net.mem.read(REMOTE + 0x100, 1500) == env.mem.read(a1500, 1500)
    got = [(c.opcode, c.byte_cnt, c.imm, c.wqe_counter) for c in net.peer_cqes]
    assert got == [(CqeOp.RESP_SEND, 300, 0, 0), (CqeOp.RESP_SEND, 2500, 0, 1),
                   (CqeOp.RESP_SEND_IMM, 17, 0xC0FFEE01, 2), (CqeOp.RESP_SEND, 0, 0, 3),
                   (CqeOp.RESP_WR_IMM, 1500, 0x0BADF00D, 4)], got
    ops = [f.data[OFF_BTH] for f in env.wire.frames]
    assert ops == [Op.SEND_ONLY, Op.SEND_FIRST, Op.SEND_MIDDLE, Op.SEND_LAST, Op.SEND_ONLY_IMM, Op.SEND_ONLY,
                   Op.WRITE_FIRST, Op.WRITE_LAST_IMM], [hex(o) for o in ops]
    assert all(c.opcode == CqeOp.REQ and c.syndrome == 0 for c in cqes)


@cocotb.test()
async def rnr_wait_then_receive(dut):
    """A SEND finds no receive WQE: the peer answers RNR NAK (timer code 1, 10 us); the
    NIC resends it no earlier than 10 us after the NAK arrived, and again after the next
    one; a receive posted meanwhile takes the third copy. Frames and CQEs as the model's;
    the RNR count in the counters. Without the RNR wait (resending at once, as after a
    sequence NAK) the timing check fails."""
    env, cq, (qp,), net = await _setup(dut, rnr_timer=1)
    a, _ = env.payload(64, seed=4)
    net.post(qp, [qp.post_send(local_addr=a, length=64, imm=5)])
    await qp.ring_nvshmem()
    while len(net.rnr_naks) < 2:
        await ClockCycles(dut.clk, 100)
    net.post_receives(qp, [(BUFS, 64)])
    cqes = await cq.poll(1, 60_000)
    await ClockCycles(dut.clk, 2 * LATENCY)
    net.check(cqes)
    wait = RNR_TIMER_NS[1] // NS_PER_CYCLE                    # 5000 cycles
    sends = [t for t, f in net.sent_at if f[OFF_BTH] == Op.SEND_ONLY_IMM]
    assert len(sends) == 3, sends
    for (nak_at, _, code), resent in zip(net.rnr_naks, sends[1:]):
        assert code == 1
        assert resent >= nak_at + wait, f"resent at {resent}, the RNR NAK came at {nak_at}: waited < {wait} cycles"
    assert net.mem.read(BUFS, 64) == env.mem.read(a, 64)
    assert [(c.opcode, c.byte_cnt, c.imm) for c in net.peer_cqes] == [(CqeOp.RESP_SEND_IMM, 64, 5)]
    assert (await env.ctl.read_counters())["rnr_naks_received"] == 2


@cocotb.test()
async def rnr_retry_exceeded(dut):
    """rnr_retry 2 and no receive ever posted: the SEND goes out three times (the first and
    two resends), the third RNR NAK fails it with RNR_RETRY_EXC_ERR and the WRITE behind
    it is flushed (WR_FLUSH_ERR), both as the model's CQEs."""
    env, cq, (qp,), net = await _setup(dut, rnr_retry=2)
    a, _ = env.payload(32, seed=5)
    net.post(qp, [qp.post_send(local_addr=a, length=32), qp.post_write(REMOTE, KEY, local_addr=a, length=32)])
    await qp.ring_nvshmem()
    cqes = await cq.poll(2, 60_000)
    await ClockCycles(dut.clk, 2 * LATENCY)
    net.check(cqes)
    assert [(c.opcode, c.syndrome) for c in cqes] == [(CqeOp.REQ_ERR, Syndrome.RNR_RETRY_EXC_ERR),
                                                      (CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR)]
    assert sum(f[OFF_BTH] == Op.SEND_ONLY for _, f in net.sent_at) == 3
    assert len(net.rnr_naks) == 3 and not net.peer_cqes


@cocotb.test()
async def rnr_retry_forever(dut):
    """rnr_retry 7 means without limit: nine RNR NAKs (more than 7), then a receive is
    posted and the SEND completes."""
    env, cq, (qp,), net = await _setup(dut, rnr_retry=7)
    net.post(qp, [qp.post_send(inline=b"patience")])
    await qp.ring_nvshmem()
    while len(net.rnr_naks) < 9:
        await ClockCycles(dut.clk, 200)
    net.post_receives(qp, [(BUFS + 0x40, 8)])
    cqes = await cq.poll(1, 40_000)
    await ClockCycles(dut.clk, 2 * LATENCY)
    net.check(cqes)
    assert cqes[0].syndrome == 0 and net.mem.read(BUFS + 0x40, 8) == b"patience"
