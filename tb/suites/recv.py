"""System regressions of the two-sided verbs with the NIC as responder (cocotb): SEND,
SEND with immediate and WRITE with immediate into receive queues in the NIC's GPU memory.

The peer requester is played by the golden model's frames (``model.frames.build_message_frames``),
which enter on MAC RX; the NIC's receive WQEs are posted by the GPU model
(``Qp.post_recv``: rdma-core's layout from ``model.recv_queue``). The golden responder
(``RcResponder`` with ``two_sided``, reading the same receive queues) sees the same frames:
the NIC's ACK/NAK frames must equal its, its receive CQEs must equal the model's byte for
byte, and they are also checked as plain numbers (opcode, byte count, immediate, QPN,
WQE counter, owner), and the scattered bytes in GPU memory against the scatter worked out
here from the segments (not from the model).
"""
import cocotb

from model.cqe import CqContext, parse_cqe
from model.frames import Port, QpContext, build_message_frames, build_rc_frame, build_write_frames
from model.mr import MemoryRegion
from model.responder import RcResponder
from spec.formats import (AETH, ETH_MIN_FRAME, OFF_EXT, RNR_TIMER_NS, Access, Aeth, CqeOp, Op, QpState, Syndrome,
                          WqeOp, unpack)
from spec.params import CLOCK_PERIOD_NS
from tb.env import PORT_IP, PORT_MAC, NicEnv, peer_ip, peer_mac
from tb.rc_env import match_coalesced, peer_port
from tb.clock import ClockCycles

PD = 5
DST = 0x2000_0000                    # WRITE with immediate lands here
KEY = (0x41 << 8) | 0x3C
BUFS = 0x3000_0000                   # receive buffers
FILL = 0xEE                          # what the receive buffers hold before
RCQN = 1
RCQ_LOG = 5


class RecvEnv:
    """The NIC with RC QPs that have receive queues (QP q: MTU ``mtus[q]``), the golden
    responder of the same set-up, and the peers' PSNs."""

    @classmethod
    async def start(cls, dut, mtus, *, log_size=4, log_stride=6, min_rnr_timer=3):
        self = cls()
        self.dut = dut
        self.env = env = await NicEnv(dut).start()
        cq = await env.cq(0, 4)
        self.rcq = rcq = await env.cq(RCQN, RCQ_LOG)
        self.model = RcResponder(Port(smac=PORT_MAC, sip=PORT_IP), two_sided=True, read_memory=env.mem.read,
                                 cqs={RCQN: CqContext(RCQN, RCQ_LOG, base=rcq.base)})
        self.qps, self.peers, self.psn = {}, {}, {}
        for q, mtu in mtus.items():
            qp = await env.qp(q, cq, mtu=mtu, remote_qpn=0x100 + q, rq_psn=0x10 * q, pd=PD, ack_every=1,
                              recv=(log_size, log_stride), rcq=rcq, min_rnr_timer=min_rnr_timer)
            self.qps[q] = qp
            self.model.add_qp(QpContext(qpn=q, remote_qpn=0x100 + q, dmac=peer_mac(q), dip=peer_ip(q),
                                        start_psn=0x10 * q, mtu=mtu, rq=qp.rq, rcqn=RCQN,
                                        min_rnr_timer=min_rnr_timer, user_index=qp.user_index), PD)
            self.peers[q] = QpContext(qpn=0x100 + q, remote_qpn=q, dmac=PORT_MAC, dip=PORT_IP, start_psn=0x10 * q,
                                      mtu=mtu)
            self.psn[q] = 0x10 * q
        region = MemoryRegion(key=KEY, base=DST, length=1 << 20, access=Access.LOCAL_WRITE | Access.REMOTE_WRITE,
                              pd=PD)
        await env.ctl.register_mr(region.key, region.base, region.length, region.access, region.pd)
        self.model.register(region)
        env.mem.write(BUFS, bytes([FILL]) * 0x10000)
        self.expect_mem = bytearray([FILL]) * 0x10000      # the buffers as they must end up
        self.responses = []                                # the model's ACK/NAK frames so far
        self.sent = 0
        return self

    def message(self, q, opcode, payload, *, imm=None, raddr=0, se=False, advance=True):
        """The frames of one message of QP q's peer (its next PSNs)."""
        fs = build_message_frames(self.peers[q], peer_port(q), opcode, payload, self.psn[q], raddr=raddr, rkey=KEY,
                                  imm=imm, se=se)
        if advance:
            self.psn[q] = (self.psn[q] + len(fs)) & 0xFFFFFF
        return fs

    def scatter(self, segments, payload):
        """Where a SEND's payload must land (worked out here): the segments in order."""
        pos = 0
        for addr, length in segments:
            piece = payload[pos:pos + length]
            self.expect_mem[addr - BUFS:addr - BUFS + len(piece)] = piece
            pos += len(piece)

    async def exchange(self, frames):
        """The frames into MAC RX; the NIC's answers must be the model's."""
        results = [self.model.receive(f) for f in frames]
        self.responses += [f for r in results for f in r.frames_out]
        for f in frames:
            self.env.rx.send(f)
        while not self.env.rx.idle:
            await ClockCycles(self.dut.clk, 16)
        try:
            await self.env.wire.wait_frames(len(self.responses), timeout_cycles=20_000)
        except TimeoutError:
            pass
        await ClockCycles(self.dut.clk, 400)
        match_coalesced([f.data for f in self.env.wire.frames], self.responses)
        return results

    def check(self):
        """GPU memory (the receive buffers) and the receive CQ, as worked out and as the model."""
        got = self.env.mem.read(BUFS, len(self.expect_mem))
        if got != bytes(self.expect_mem):
            i = next(i for i, (x, y) in enumerate(zip(got, self.expect_mem)) if x != y)
            raise AssertionError(f"receive buffer at {BUFS + i:#x}: {got[i]:#04x}, expected {self.expect_mem[i]:#04x}")
        cq = self.model.cqs[RCQN]
        buf = self.env.mem.read(self.rcq.base, 64 << RCQ_LOG)
        want = cq.buffer()
        for slot in range(1 << RCQ_LOG):
            got_cqe, want_cqe = buf[64 * slot:64 * slot + 64], want[64 * slot:64 * slot + 64]
            assert got_cqe == want_cqe, f"receive CQ slot {slot}: RTL {got_cqe.hex()}, model {want_cqe.hex()}"
        return [parse_cqe(buf[r.slot * 64:r.slot * 64 + 64]) for r in cq.records[-(1 << RCQ_LOG):]]


def _payload(n, seed):
    return bytes((seed * 7 + 13 * i) & 0xFF for i in range(n))


def _cqe_numbers(c, opcode, qpn, counter, byte_cnt, imm=0, syndrome=0, owner=0):
    want = dict(opcode=opcode, qpn=qpn, wqe_counter=counter, byte_cnt=byte_cnt, imm=imm, owner=owner)
    if opcode == CqeOp.RESP_ERR:
        want["syndrome"] = syndrome
    got = {k: c[k] for k in want}
    assert got == want, f"CQE fields {got}, expected {want}"


@cocotb.test()
async def send_scatter(dut):
    """SENDs into one- and three-segment receive WQEs (multi-packet SENDs whose packets
    fill the segments in turn, a SEND that leaves a segment untouched), a SEND_IMM and a
    0-byte SEND, on two QPs: ACKs and receive CQEs as the model, the bytes where the
    segments say (each packet's payload within one segment)."""
    r = await RecvEnv.start(dut, {1: 256, 2: 1024})
    qp1, qp2 = r.qps[1], r.qps[2]
    segs = {
        # QP 1 (MTU 256): one segment; three segments (packets of 256 fill 256, 512 of them)
        1: [[(BUFS + 0x000, 300)], [(BUFS + 0x200, 256), (BUFS + 0x400, 512), (BUFS + 0x800, 100)],
            [(BUFS + 0xA00, 64)], [(BUFS + 0xB00, 16)]],
        # QP 2 (MTU 1024): a SEND_IMM into the second of two segments, after a 0-length one
        2: [[(BUFS + 0x1000, 0), (BUFS + 0x1100, 2048)], [(BUFS + 0x2000, 8)]],
    }
    for q, lists in segs.items():
        r.qps[q].post_recv(*lists)
    frames, done = [], []
    # QP 1: 300 bytes into 300; 700 bytes over 256 + 512 (+ 100 untouched... 700 - 768 < 0)
    p = _payload(300, 1)
    frames += r.message(1, WqeOp.SEND, p)
    r.scatter(segs[1][0], p)
    p = _payload(700, 2)
    frames += r.message(1, WqeOp.SEND, p)
    r.scatter(segs[1][1], p)
    p = _payload(8, 3)
    frames += r.message(1, WqeOp.SEND_IMM, p, imm=0x11223344, se=True)
    r.scatter(segs[1][2], p)
    frames += r.message(1, WqeOp.SEND, b"")            # 0 bytes: a CQE, nothing written
    # QP 2: 1500 bytes (two packets) into the second segment; an 8-byte SEND_IMM
    p = _payload(1500, 4)
    frames += r.message(2, WqeOp.SEND, p)
    r.scatter(segs[2][0], p)
    p = _payload(8, 5)
    frames += r.message(2, WqeOp.SEND_IMM, p, imm=0xCAFEF00D)
    r.scatter(segs[2][1], p)
    await r.exchange(frames)
    cqes = r.check()
    want = [(CqeOp.RESP_SEND, 1, 0, 300), (CqeOp.RESP_SEND, 1, 1, 700), (CqeOp.RESP_SEND_IMM, 1, 2, 8, 0x11223344),
            (CqeOp.RESP_SEND, 1, 3, 0), (CqeOp.RESP_SEND, 2, 0, 1500), (CqeOp.RESP_SEND_IMM, 2, 1, 8, 0xCAFEF00D)]
    assert len(cqes) == len(want)
    for c, w in zip(cqes, want):
        _cqe_numbers(c, *w)
    assert cqes[2]["se"] == 1


@cocotb.test()
async def send_over_segments(dut):
    """SEND packets whose payload runs over receive-segment boundaries, scattered over
    every segment they span (the payload writer goes over such a frame once per piece):
    3000 bytes at MTU 1024 into segments of 700, 1100 and 1500 bytes (two packets span two
    segments each), 4- and 3-byte SENDs into 1-byte segments, a 0-length segment in the
    middle of a list, a SEND_IMM over all four segments of its WQE, and at MTU 256 1000
    bytes over segments of 333, 333 and 400; unaligned addresses, frames back to back.
    ACKs and CQEs as the model, the bytes where the scatter worked out here puts them."""
    r = await RecvEnv.start(dut, {1: 1024, 2: 256})
    segs = {
        1: [[(BUFS + 0x0003, 700), (BUFS + 0x0405, 1100), (BUFS + 0x0903, 1500)],
            [(BUFS + 0x1001, 1), (BUFS + 0x1081, 1), (BUFS + 0x1082, 1), (BUFS + 0x10FF, 1)],
            [(BUFS + 0x1101, 1), (BUFS + 0x1140, 1), (BUFS + 0x1180, 1)],
            [(BUFS + 0x1201, 100), (BUFS + 0x1300, 0), (BUFS + 0x1377, 200)],
            [(BUFS + 0x1501, 10), (BUFS + 0x1580, 20), (BUFS + 0x15F0, 30), (BUFS + 0x1700, 1000)]],
        2: [[(BUFS + 0x2007, 333), (BUFS + 0x2401, 333), (BUFS + 0x2800, 400)],
            [(BUFS + 0x2C00 + 100, 1), (BUFS + 0x2C00 + 0x7F, 64)]],
    }
    for q, lists in segs.items():
        r.qps[q].post_recv(*lists)
    sends = {1: [(WqeOp.SEND, 3000, None), (WqeOp.SEND, 4, None), (WqeOp.SEND, 3, None), (WqeOp.SEND, 250, None),
                 (WqeOp.SEND_IMM, 500, 0x5EED0001)],
             2: [(WqeOp.SEND, 1000, None), (WqeOp.SEND_IMM, 65, 0x5EED0002)]}
    frames, want = [], []
    for q, msgs in sends.items():
        for i, (op, n, imm) in enumerate(msgs):
            p = _payload(n, 20 + 8 * q + i)
            frames += r.message(q, op, p, imm=imm)
            r.scatter(segs[q][i], p)
            want.append((CqeOp.RESP_SEND if imm is None else CqeOp.RESP_SEND_IMM, q, i, n, imm or 0))
    await r.exchange(frames)
    cqes = r.check()
    assert len(cqes) == len(want)
    for c, w in zip(sorted(cqes, key=lambda c: (c["qpn"], c["wqe_counter"])), want):
        _cqe_numbers(c, *w)


@cocotb.test()
async def write_imm(dut):
    """WRITE with immediate, ONLY_IMM and FIRST..LAST_IMM: written at the RETH address, a
    receive WQE consumed by the last packet only, RESP_WR_IMM with the RETH length."""
    r = await RecvEnv.start(dut, {1: 256})
    r.qps[1].post_recv([(BUFS, 64)], [(BUFS + 0x100, 64)])
    frames = []
    a = _payload(100, 6)
    frames += r.message(1, WqeOp.RDMA_WRITE_IMM, a, imm=0x01020304, raddr=DST + 0x10)
    b = _payload(600, 7)
    frames += r.message(1, WqeOp.RDMA_WRITE_IMM, b, imm=0xA0B0C0D0, raddr=DST + 0x1000)
    await r.exchange(frames)
    assert r.env.mem.read(DST + 0x10, 100) == a and r.env.mem.read(DST + 0x1000, 600) == b
    cqes = r.check()
    assert len(cqes) == 2
    _cqe_numbers(cqes[0], CqeOp.RESP_WR_IMM, 1, 0, 100, 0x01020304)
    _cqe_numbers(cqes[1], CqeOp.RESP_WR_IMM, 1, 1, 600, 0xA0B0C0D0)


def _mac_padded(frame, pad=b""):
    """``frame`` as a MAC hands it over: padded to Ethernet's 60 bytes (zeros, or ``pad``)."""
    n = ETH_MIN_FRAME - len(frame)
    assert n > 0
    return frame + (pad or bytes(n))[:n]


@cocotb.test()
async def padded_short_frames(dut):
    """Packets shorter than Ethernet's 60 bytes come padded to 60 by the MAC, the packet's
    end where its IPv4 length says: a 0-byte SEND ONLY (58 bytes, what rxe sends for a
    0-byte SEND) into a posted receive WQE: ACKed, a RESP_SEND CQE with byte count 0,
    nothing written; the same with its ICRC wrong: dropped unanswered (rx_bad_icrc); a
    1-byte SEND ONLY without the IBTA pad (59 bytes, its pad byte not zero): ACKed, the
    byte in the next WQE's buffer; a two-packet WRITE (MTU 256) whose 1-byte LAST comes
    without the IBTA pad (59 bytes padded to 60), then that LAST again (a duplicate,
    re-ACKed): the 257 bytes land. ACKs and CQEs as the golden model's, which takes every one of these (and
    drops the bad ICRC) by the same rule; the counters."""
    r = await RecvEnv.start(dut, {1: 256})
    r.qps[1].post_recv([(BUFS, 64)], [(BUFS + 0x100, 64)], [(BUFS + 0x200, 64)])
    peer, port = r.peers[1], peer_port(1)
    zero = r.message(1, WqeOp.SEND, b"")
    assert len(zero) == 1 and len(zero[0]) == 58
    bad = bytearray(_mac_padded(r.message(1, WqeOp.SEND, b"", advance=False)[0]))
    bad[54] ^= 0x40                                      # the ICRC, in front of the padding
    one = build_rc_frame(peer, port, Op.SEND_ONLY, r.psn[1], payload=b"\x5a", ackreq=True, pad=False)
    assert len(one) == 59
    r.psn[1] += 1
    r.scatter([(BUFS + 0x100, 64)], b"\x5a")
    data = _payload(257, 40)
    write = build_write_frames(peer, port, DST + 0x300, KEY, data, r.psn[1], pad=False)
    assert [len(f) for f in write] == [74 + 256, 59]
    r.psn[1] += 2
    frames = [_mac_padded(zero[0]), bytes(bad), _mac_padded(one, b"\xa5"), write[0], _mac_padded(write[1]),
              _mac_padded(write[1])]
    assert [len(f) for f in frames] == [60, 60, 60, 330, 60, 60]
    res = await r.exchange(frames)
    assert [(x.accepted, x.reason, x.response_kind) for x in res] == [
        (True, None, "ack"), (False, "bad_icrc", None), (True, None, "ack"), (True, None, "ack"),
        (True, None, "ack"), (False, "psn_duplicate", "ack")], [(x.accepted, x.reason, x.response_kind) for x in res]
    # the NIC's ACKs are the model's (exchange): the two SENDs', the WRITE's two (ACK every
    # packet), the duplicate's (may be merged with the one before it, AckCoalescer)
    assert len(r.env.wire.frames) >= 4
    assert r.env.mem.read(DST + 0x300, 257) == data
    cqes = r.check()
    assert len(cqes) == 2
    _cqe_numbers(cqes[0], CqeOp.RESP_SEND, 1, 0, 0)
    _cqe_numbers(cqes[1], CqeOp.RESP_SEND, 1, 1, 1)
    c = await r.env.ctl.read_counters()
    assert (c["rx_bad_icrc"], c["rx_bad_length"], c["rx_psn_duplicate"]) == (1, 0, 1), c


@cocotb.test()
async def rnr_then_posted(dut):
    """No receive WQE posted: RNR NAK (the QP's timer code, the packet's PSN), the packet
    behind it the gap's PSN-sequence NAK; posted, the resend is accepted. A duplicate SEND
    is ACKed and consumes no WQE (the next SEND takes the next WQE). The resend comes 10 us
    after the post, IBTA's shortest RNR timer, as from a requester: the engine reads the
    record of a QP it RNR NAKed again and again while SENDs come, and a receive posted
    less than two reads before a SEND may be missed (an RNR NAK again; here the resend
    right after the post was NAKed, where the model, reading at the packet, took it)."""
    r = await RecvEnv.start(dut, {1: 1024}, min_rnr_timer=7)
    first = r.message(1, WqeOp.SEND, _payload(40, 8), advance=False)
    second = build_message_frames(r.peers[1], peer_port(1), WqeOp.SEND, _payload(24, 9), r.psn[1] + 1)
    res = await r.exchange(first + second)
    assert res[0].response_kind == "nak_rnr" and res[1].response_kind == "nak_psn_seq"
    nak = unpack(AETH, r.env.wire.frames[-2].data, OFF_EXT)
    assert nak["syndrome"] == Aeth.RNR_NAK | 7, nak
    r.qps[1].post_recv([(BUFS, 64)], [(BUFS + 0x100, 64)], [(BUFS + 0x200, 64)])
    await ClockCycles(dut.clk, int(RNR_TIMER_NS[1] / CLOCK_PERIOD_NS))
    await r.exchange(first + second + first)          # the resend, then a duplicate of the first
    r.scatter([(BUFS, 64)], _payload(40, 8))
    r.scatter([(BUFS + 0x100, 64)], _payload(24, 9))
    r.psn[1] += 2
    third = r.message(1, WqeOp.SEND, _payload(16, 10))   # takes the third WQE (the duplicate took none)
    await r.exchange(third)
    r.scatter([(BUFS + 0x200, 64)], _payload(16, 10))
    cqes = r.check()
    assert [(c["wqe_counter"], c["byte_cnt"]) for c in cqes] == [(0, 40), (1, 24), (2, 16)]
    c = await r.env.ctl.read_counters()
    assert c["rnr_naks_sent"] == r.model.counters.rnr_naks == 1, c["rnr_naks_sent"]


@cocotb.test()
async def duplicates_and_gaps(dut):
    """Packets that take no receive WQE, several in a row, between packets that do, all back
    to back on MAC RX (so the packets behind them hold WQE numbers given out before the
    responder decided): two duplicate SENDs, a gap (two packets ahead, the first NAKed, the
    second dropped), the go-back-N resend, a WRITE_IMM and a SEND_IMM. Every WQE is used once,
    in order: the receive CQEs count 0..6, each SEND in its own WQE's buffer, the frames and
    CQEs as the model's. (Under the responder's one-spare rule, the second duplicate lost WQE
    3: the CQEs counted 0, 1, 2, 4, ..., and the last SEND found none.)"""
    r = await RecvEnv.start(dut, {2: 1024})
    q, n = 2, 8
    r.qps[q].post_recv(*[[(BUFS + 0x400 * k, 0x100)] for k in range(n)])
    pay = [_payload(20 + 3 * k, 30 + k) for k in range(7)]
    m = [r.message(q, WqeOp.SEND, pay[k]) for k in range(2)]
    m2 = r.message(q, WqeOp.SEND, pay[2])
    m3 = r.message(q, WqeOp.SEND, pay[3])
    m4 = r.message(q, WqeOp.SEND_IMM, pay[4], imm=0x1234)
    m5 = r.message(q, WqeOp.RDMA_WRITE_IMM, pay[5], imm=0x5678, raddr=DST)
    m6 = r.message(q, WqeOp.SEND, pay[6])
    frames = m[0] + m[1] + m[0] + m[1] + m3 + m4 + m2 + m3 + m4 + m5 + m6
    res = await r.exchange(frames)
    kinds = [x.response_kind for x in res]
    assert kinds[4] == "nak_psn_seq" and r.model.counters.recv_wqes == 7, kinds
    for k in (0, 1, 2, 3, 4, 6):
        r.scatter([(BUFS + 0x400 * k, 0x100)], pay[k])
    cqes = r.check()
    assert [(c["wqe_counter"], c["byte_cnt"]) for c in cqes] == [(k, len(pay[k])) for k in range(7)], \
        [(c["wqe_counter"], c["byte_cnt"]) for c in cqes]
    assert r.env.mem.read(DST, len(pay[5])) == pay[5]


@cocotb.test()
async def length_error(dut):
    """A SEND longer than its receive WQE: NAK invalid request, nothing written, the WQE
    completes with RESP_ERR / LOCAL_LENGTH_ERR, the QP goes to ERR (later packets
    dropped unanswered)."""
    r = await RecvEnv.start(dut, {1: 256})
    r.qps[1].post_recv([(BUFS, 32)], [(BUFS + 0x100, 100)])
    ok = _payload(32, 11)
    frames = r.message(1, WqeOp.SEND, ok)
    r.scatter([(BUFS, 32)], ok)
    frames += r.message(1, WqeOp.SEND, _payload(200, 12))     # 200 > 100
    frames += r.message(1, WqeOp.SEND, _payload(8, 13))
    res = await r.exchange(frames)
    assert [x.response_kind for x in res] == ["ack", "nak_invalid_request", None]
    cqes = r.check()
    assert len(cqes) == 2
    _cqe_numbers(cqes[0], CqeOp.RESP_SEND, 1, 0, 32)
    _cqe_numbers(cqes[1], CqeOp.RESP_ERR, 1, 1, 0, syndrome=Syndrome.LOCAL_LENGTH_ERR)


@cocotb.test()
async def flush(dut):
    """The receive WQEs of a QP that goes to ERR complete with RESP_ERR / WR_FLUSH_ERR, in
    order, as the model's: QP 1, 5 posted, 2 consumed, QP_MODIFY to ERR: 3 flushed, then 2
    posted and QP_MODIFY to ERR again (the model's ``flush_receives``): 2 more; QP 2, a SEND
    FIRST accepted and QP_MODIFY to ERR: the WQE it holds, then the 2 posted behind it;
    QP 3, a SEND too long for its WQE: LOCAL_LENGTH_ERR, then the 3 posted behind it (a
    packet after the error, with a WQE, keeps its place); QP 4 without a WQE posted:
    nothing. CQEs byte for byte as the model and as numbers."""
    r = await RecvEnv.start(dut, {1: 256, 2: 256, 3: 256, 4: 256})
    ctl, model = r.env.ctl, r.model
    r.qps[1].post_recv(*[[(BUFS + 0x100 * k, 64)] for k in range(5)])
    r.qps[2].post_recv(*[[(BUFS + 0x800 + 0x400 * k, 1024)] for k in range(3)])
    r.qps[3].post_recv(*[[(BUFS + 0x2000 + 0x100 * k, 100)] for k in range(4)])
    frames = []
    for k in range(2):
        p = _payload(40 + k, 30 + k)
        frames += r.message(1, WqeOp.SEND, p)
        r.scatter([(BUFS + 0x100 * k, 64)], p)
    p = _payload(600, 33)
    first = r.message(2, WqeOp.SEND, p)[:1]            # its FIRST only: the WQE stays held
    r.scatter([(BUFS + 0x800, 256)], p[:256])
    frames += first
    frames += r.message(3, WqeOp.SEND, _payload(200, 34))     # 200 > 100
    frames += r.message(3, WqeOp.SEND, _payload(8, 35))       # dropped: the QP is in ERR
    res = await r.exchange(frames)
    assert [x.response_kind for x in res][-2:] == ["nak_invalid_request", None]

    async def to_err(q, *, again=False):
        await ctl.modify_qp(q, state=QpState.ERR)
        got = model.flush_receives(q) if again else model.modify(q, QpState.ERR)
        await ClockCycles(dut.clk, 2000)
        return got

    assert len(await to_err(1)) == 3
    assert len(await to_err(2)) == 3
    assert len(await to_err(4)) == 0
    r.qps[1].post_recv([(BUFS + 0x500, 64)], [(BUFS + 0x600, 64)])
    assert len(await to_err(1, again=True)) == 2
    cqes = r.check()
    by_qp = {}
    for c in cqes:
        by_qp.setdefault(c["qpn"], []).append(c)
    flush = CqeOp.RESP_ERR, Syndrome.WR_FLUSH_ERR
    assert [(c["opcode"], c["wqe_counter"]) for c in by_qp[1]] == [(CqeOp.RESP_SEND, 0), (CqeOp.RESP_SEND, 1)] + [
        (CqeOp.RESP_ERR, k) for k in range(2, 7)]
    assert all((c["opcode"], c["syndrome"]) == flush for c in by_qp[1][2:] + by_qp[2])
    assert [c["wqe_counter"] for c in by_qp[2]] == [0, 1, 2]
    _cqe_numbers(by_qp[3][0], CqeOp.RESP_ERR, 3, 0, 0, syndrome=Syndrome.LOCAL_LENGTH_ERR)
    assert [(c["syndrome"], c["wqe_counter"]) for c in by_qp[3][1:]] == [(Syndrome.WR_FLUSH_ERR, k) for k in (1, 2, 3)]
    assert 4 not in by_qp


@cocotb.test()
async def send_flood_rate(dut):
    """8-byte SEND ONLYs at the 400G line rate from 256 peer QPs (round robin) into
    prefetched receive WQEs (1 us GPU memory): messages per second from the first frame
    on MAC RX to the last receive CQE written, every CQE and ACK as the model's, every
    payload in place. (A first SEND per QP warms its prefetch; the flood is measured.)"""
    nq, per_qp = (256, 8) if cocotb.SIM_NAME.lower().startswith("verilator") else (4, 2)
    mtus = {q: 1024 for q in range(1, nq + 1)}
    r = await RecvEnv.start(dut, mtus, log_size=6, log_stride=4)
    env = r.env
    # the flood's WQEs, and as many again beyond them (a receiver posts ahead: the engine
    # then knows them from one doorbell-record read instead of reading it as they run out)
    for q, qp in r.qps.items():
        qp.post_recv(*[[(BUFS + 16 * ((q - 1) * (per_qp + 1) + k), 8)] for k in range(per_qp + 1)],
                     *[[(BUFS + 0xF000, 8)] for _ in range(per_qp + 8)])
    warm = [f for q in r.qps for f in r.message(q, WqeOp.SEND, _payload(8, q))]
    for q in r.qps:
        r.scatter([(BUFS + 16 * ((q - 1) * (per_qp + 1)), 8)], _payload(8, q))
    await r.exchange(warm)
    flood = []
    for k in range(1, per_qp + 1):
        for q in r.qps:
            p = _payload(8, q + 7 * k)
            flood += r.message(q, WqeOp.SEND, p)
            r.scatter([(BUFS + 16 * ((q - 1) * (per_qp + 1) + k), 8)], p)
    results = [r.model.receive(f) for f in flood]
    r.responses += [f for x in results for f in x.frames_out]
    cq = r.model.cqs[RCQN]
    last = cq.records[-1]
    t0 = env.counter.now
    for f in flood:
        env.rx.send(f)
    t_end = None
    while t_end is None:
        await ClockCycles(dut.clk, 4)
        if env.mem.read(last.address, 64) == last.cqe:
            t_end = env.counter.now
        if env.counter.now - t0 > 200_000:
            raise AssertionError("the flood's last receive CQE never came")
    cycles = t_end - t0
    rate = len(flood) / (cycles * 2e-9)
    dut._log.info(f"{len(flood)} 8-byte SENDs from {nq} QPs: {cycles} cycles to the last receive CQE, "
                  f"{rate / 1e6:.0f} M messages/s ({len(flood) / cycles:.3f} a cycle), MAC RX held back "
                  f"{env.rx.stall_cycles} cycles")
    await env.wire.wait_frames(len(r.responses), timeout_cycles=20_000)
    await ClockCycles(dut.clk, 400)
    match_coalesced([f.data for f in env.wire.frames], r.responses)
    r.check()
