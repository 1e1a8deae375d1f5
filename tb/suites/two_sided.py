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
import random

import cocotb
from cocotb.triggers import RisingEdge

from model.cqe import CqContext
from model.frames import Port, QpContext
from model.memory import SparseMemory
from model.mr import MemoryRegion
from model.network import FaultSpec, Link
from model.recv_queue import RecvPoster, RecvQueue
from model.requester import RcRequester
from model.responder import RcResponder
from spec import params as P
from spec.formats import AETH, BTH, OFF_BTH, OFF_EXT, RNR_TIMER_NS, Access, Aeth, CqeOp, Op, Syndrome, WqeOp, unpack
from tb.env import ENGINE_VERBS, NicEnv, PORT_IP, PORT_MAC, peer_ip, peer_mac
from tb.suites import fault_matrix
from tb.wire import BYTES_PER_CYCLE
from tb.clock import ClockCycles

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


# ---- the fault matrix with the golden responder as the peer -------------------------------

PEER_MAC, PEER_IP = peer_mac(0x7E), peer_ip(0x7E)   # one golden responder holds every peer QP
FAULT_TIMEOUT = 3000                 # the NIC's ACK timeout (cycles): a delayed frame's 300 and more
FAULT_LATENCY = 150                  # each direction of the cable (cycles)


class FaultyCable:
    """The NIC and one golden responder with receive queues (every peer QP) joined by a
    cable whose two directions inject faults (``model.network.Link``): the NIC's frames
    enter the cable the cycle their last wire byte has left, the peer answers the cycle
    a frame arrives, and its answers enter the NIC's MAC RX as they arrive."""

    def __init__(self, env, spec, seed):
        self.env = env
        self.mem = SparseMemory()
        self.to_peer = Link(FAULT_LATENCY, spec, f"{seed}/nic->peer", name="nic->peer")
        self.to_nic = Link(FAULT_LATENCY, spec, f"{seed}/peer->nic", name="peer->nic")
        self.peer = self._responder()
        self.twin = self._responder()     # the same peer on a lossless cable: the expected CQEs
        self.cqes = []                    # the peer's receive CQEs, as it writes them
        cocotb.start_soon(self._bridge())

    def _responder(self):
        r = RcResponder(Port(smac=PEER_MAC, sip=PEER_IP), two_sided=True, read_memory=self.mem.read,
                        cqs={RCQN: CqContext(RCQN, 12, base=0x7000_0000)})
        r.register(MemoryRegion(key=KEY, base=REMOTE, length=1 << 24, pd=PD,
                                access=Access.LOCAL_WRITE | Access.REMOTE_WRITE))
        return r

    def add_qp(self, qp, rq, ack_every):
        for r in (self.peer, self.twin):
            r.add_qp(QpContext(qpn=qp.remote_qpn, remote_qpn=qp.qpn, dmac=PORT_MAC, dip=PORT_IP,
                               start_psn=qp.start_psn, mtu=qp.mtu, rq=rq, rcqn=RCQN, min_rnr_timer=1),
                     pd=PD, ack_every=ack_every)

    async def _bridge(self):
        env, seen = self.env, 0
        edge = RisingEdge(env.dut.clk)
        while True:
            await edge
            now = env.counter.now
            while seen < len(env.wire.frames):
                f = env.wire.frames[seen]
                seen += 1
                self.to_peer.send(f.data, -(-f.end_bytes // BYTES_PER_CYCLE), end_bytes=f.end_bytes)
            for d in self.to_peer.deliver(now):
                res = self.peer.receive(d.frame)
                for a, data in res.writes:
                    self.mem.write(a, data)
                self.cqes += res.cqes
                if res.response is not None:
                    self.to_nic.send(res.response, now)
            for d in self.to_nic.deliver(now):
                env.rx.send(d.frame, cycle=max(d.cycle, now))

    @property
    def quiet(self):
        return self.to_peer.idle and self.to_nic.idle

    def lossless(self, env, cq, qps, posted):
        """The golden requester and the twin responder, frame by frame with no cable: the
        CQEs of both sides the faults must not change (requester CQEs by QP)."""
        model = RcRequester(Port(smac=PORT_MAC, sip=PORT_IP),
                            {cq.cqn: CqContext(cq.cqn, cq.log_depth, base=cq.base)}, env.mem.read, **ENGINE_VERBS)
        for qp in qps:
            model.add_qp(QpContext(qpn=qp.qpn, remote_qpn=qp.remote_qpn, dmac=qp.dmac, dip=qp.dip,
                                   start_psn=qp.start_psn, mtu=qp.mtu, cqn=cq.cqn, user_index=qp.user_index,
                                   rnr_retry=7), timeout_ns=NEVER)
        twin_cqes = []
        for w in posted:
            pending = [t.frame for t in model.post(w.qpn, w.wqe)]
            while pending:
                res = self.twin.receive(pending.pop(0))
                twin_cqes += res.cqes
                if res.response is not None:
                    pending += [t.frame for t in model.on_response(res.response, 0).retransmit]
        return model.completions, twin_cqes


async def _faults_with_golden_peer(dut, kind, rate, seed):
    """SEND, SEND with immediate (inline too) and WRITE with immediate of 0 B to 2 MTU + 5
    on two RC QPs (MTU 1024 and 4096, ACKs for every packet and every fourth) through a
    cable injecting ``kind`` at ``rate`` both ways; every message received once, in order,
    into its own receive WQE's buffers (scattered over three segments), both sides' CQEs
    as the lossless golden run's and as plain numbers."""
    rnd = random.Random(seed)
    env = await NicEnv(dut).start()
    cq = await env.cq(0, 10)
    cable = FaultyCable(env, FaultSpec(**{kind: rate}, delay_cycles=300, reorder_depth=2), seed)
    nmsg = fault_matrix.peer_messages(rate)
    log_rq = max(6, (nmsg - 1).bit_length())
    qps, wants, posted, scatters = [], [], [], []
    for i, (mtu, ack_every) in enumerate(((1024, 1), (4096, 4))):
        qp = await env.qp(i + 1, cq, mtu=mtu, uc=False, timeout=FAULT_TIMEOUT, retry_cnt=7, rnr_retry=7,
                          dmac=PEER_MAC, dip=PEER_IP)
        rq = RecvQueue(base=RQ_BASE + (i << 20), log_size=log_rq, log_stride=6, dbr=DBR_BASE + 64 * i)
        cable.add_qp(qp, rq, ack_every)
        seg = (2 * mtu + 5) // 3 + 1
        bufs = [[(BUFS + (i << 24) + 0x4000 * k + 0x1000 * j + 5 * j, seg) for j in range(3)] for k in range(nmsg)]
        RecvPoster(rq, cable.mem).post(*bufs)
        qps.append(qp)
        scatters.append(bufs)
        wants.append([])                  # (CQE opcode, payload, immediate, scatter list or WRITE address)
    for k in range(nmsg):
        for i, qp in enumerate(qps):
            n = rnd.choice([0, 8, 8, 64, 301, qp.mtu, 2 * qp.mtu + 5])
            imm, signaled = rnd.randrange(1 << 32), k % 4 == 3 or k == nmsg - 1
            if k % 3 == 2:
                addr, _ = env.payload(n, seed=rnd.randrange(1 << 16))
                raddr = REMOTE + (i << 21) + 0x4000 * k
                w = qp.post_write(raddr, KEY, local_addr=addr, length=n, opcode=WqeOp.RDMA_WRITE_IMM, imm=imm,
                                  signaled=signaled)
                wants[i].append((CqeOp.RESP_WR_IMM, w.payload, imm, raddr))
            else:
                with_imm = k % 3 == 1
                imm = imm if with_imm else None
                if n <= 28 and k % 2:
                    w = qp.post_send(inline=rnd.randbytes(n), imm=imm, signaled=signaled)
                elif n == 0:
                    w = qp.post_send(imm=imm, signaled=signaled)              # ctrl only
                else:
                    addr, _ = env.payload(n, seed=rnd.randrange(1 << 16))
                    w = qp.post_send(local_addr=addr, length=n, imm=imm, signaled=signaled)
                wants[i].append((CqeOp.RESP_SEND_IMM if with_imm else CqeOp.RESP_SEND, w.payload, imm or 0,
                                 scatters[i][k]))
            posted.append(w)
            if k % 4 == 3 or k == nmsg - 1:
                await qp.ring_nvshmem()
    want_cqes, want_peer = cable.lossless(env, cq, qps, posted)
    try:
        cqes = await cq.poll(len(want_cqes), 600_000)
    except TimeoutError:
        dut._log.error(f"hung: nic->peer {cable.to_peer.counters}, peer->nic {cable.to_nic.counters}; counters "
                       f"{dict((k, v) for k, v in (await env.ctl.read_counters()).items() if v)}")
        raise
    for _ in range(50):                   # resends still on the cable after the last CQE
        if cable.quiet:
            break
        await ClockCycles(dut.clk, 500)
    counters = await env.ctl.read_counters()
    links = {"nic->peer": cable.to_peer.counters, "peer->nic": cable.to_nic.counters}
    dut._log.info(f"{kind} at {rate}: {links}; NIC {dict((k, v) for k, v in counters.items() if v)}")
    fault_key = fault_matrix.counter(kind)
    assert sum(c[fault_key] for c in links.values()) > 0, "no fault was injected: raise the rate or the traffic"
    # the requester's CQEs: per QP in order, byte for byte as the lossless golden run's
    by_qp = lambda cs, raw: [[raw(c) for c in cs if c.qpn == qp.qpn] for qp in qps]
    assert by_qp(cqes, lambda c: c.raw) == by_qp(want_cqes, lambda c: c.cqe), (
        f"CQEs {[(c.qpn, c.opcode, c.wqe_counter, c.syndrome) for c in cqes][:8]}, the model "
        f"{[(c.qpn, c.opcode, c.wqe_counter, c.syndrome) for c in want_cqes][:8]}")
    assert all(c.syndrome == 0 for c in cqes) and cq.try_poll() is None
    # the peer: one receive CQE per message, in order per QP, as the lossless run's bytes ...
    peer_by_qp = lambda cs: [[c.cqe for c in cs if c.qpn == qp.remote_qpn] for qp in qps]
    assert peer_by_qp(cable.cqes) == peer_by_qp(want_peer), "the peer's receive CQEs differ from the lossless run's"
    # ... and as plain numbers, the bytes where each message had to land
    for i, qp in enumerate(qps):
        got = [(c.opcode, c.byte_cnt, c.imm, c.wqe_counter) for c in cable.cqes if c.qpn == qp.remote_qpn]
        assert got == [(op, len(d), imm, k) for k, (op, d, imm, _) in enumerate(wants[i])], (qp.qpn, got[:6])
        for k, (op, d, _, where) in enumerate(wants[i]):
            if op == CqeOp.RESP_WR_IMM:
                assert cable.mem.read(where, len(d)) == d, f"QP {qp.qpn}: WRITE_IMM {k} at {where:#x}"
            else:
                for addr, part in _scatter(d, where).items():
                    assert cable.mem.read(addr, len(part)) == part, f"QP {qp.qpn}: SEND {k}, bytes at {addr:#x}"
    if kind in ("drop", "corrupt") and links["nic->peer"][fault_key]:
        assert counters["retransmits"] > 0, "frames were lost but nothing was sent again"
    if kind == "duplicate" and links["nic->peer"][fault_key]:
        assert cable.peer.counters.dropped["psn_duplicate"] >= links["nic->peer"][fault_key]


fault_matrix.define_tests(globals(), _faults_with_golden_peer, fault_matrix.PEER_SEED,
                          "two-sided verbs to the golden responder, {kind} at {percent}% both ways")
