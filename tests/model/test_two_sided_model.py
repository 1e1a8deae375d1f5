"""Golden model of the two-sided verbs: receive queues in memory, SEND / SEND_IMM / WRITE_IMM,
gather lists, responder CQEs, RNR.

Byte-level expectations are written by hand from the formats (mlx5, IBTA), not taken from
the code under test; the ICRC of the hand-built SEND frame is computed here with zlib.
"""

import random
import struct
import zlib

import pytest

from model.cqe import CqContext, build_cqe, parse_cqe
from model.engine import EngineModel
from model.frames import (Port, QpContext, build_message_frames, build_send_wqe, build_write_frames,
                          build_write_imm_wqe, build_write_wqe, message_packets, parse_wqe)
from model.link import simulate
from model.memory import SparseMemory
from model.mr import MemoryRegion
from model.parse import SEND_OPCODES, parse_frame
from model.recv_queue import RecvPoster, RecvQueue, build_recv_wqe, parse_recv_wqe, recv_wqe_writes
from model.requester import RcRequester
from model.responder import RcResponder
from spec.formats import RNR_TIMER_NS, Access, CqeOp, Op, QpState, Syndrome, WqeOp

A_MAC, A_IP = "02:00:00:00:00:0a", "10.0.0.1"      # requester
B_MAC, B_IP = "02:00:00:00:00:0b", "10.0.0.2"      # responder
A_PORT = Port(smac=0x02000000000A, sip=A_IP)
B_PORT = Port(smac=0x02000000000B, sip=B_IP)
SRC = 0x7000_0000                 # requester's payload buffers
DST = 0x1000_0000                 # responder's region (WRITE targets)
BUF = 0x2000_0000                 # responder's receive buffers
RQ_BASE, DBR = 0x3000_0000, 0x3100_0000
KEY = (0x12 << 8) | 0x5A
PD = 5
REGION = MemoryRegion(key=KEY, base=DST, length=1 << 20, access=Access.LOCAL_WRITE | Access.REMOTE_WRITE, pd=PD)
TIMEOUT = 100_000                 # ns
UIDX = 0x00ABCD


def be32(v):
    return v.to_bytes(4, "big")


class Pair:
    """A requester QP 0x100 (memory ``src``) and a responder QP 0x200 with a receive queue
    (16 WQEs of 64 bytes, memory ``mem``), both two-sided; send CQ 0, receive CQ 1."""

    def __init__(self, mtu=256, rnr_retry=7, min_rnr_timer=1, log_size=4, retry_cnt=7):
        self.src, self.mem = SparseMemory(), SparseMemory()
        self.src.write(SRC, bytes((7 * i + 3) & 0xFF for i in range(16384)))
        self.rq = RecvQueue(base=RQ_BASE, log_size=log_size, log_stride=6, dbr=DBR)
        self.a = QpContext(qpn=0x100, remote_qpn=0x200, dmac=B_MAC, dip=B_IP, mtu=mtu, cqn=0, rnr_retry=rnr_retry)
        self.b = QpContext(qpn=0x200, remote_qpn=0x100, dmac=A_MAC, dip=A_IP, mtu=mtu, rq=self.rq, rcqn=1,
                           min_rnr_timer=min_rnr_timer, user_index=UIDX)
        self.req = RcRequester(A_PORT, {0: CqContext(0, 4)}, self.src.read, two_sided=True)
        self.req.add_qp(self.a, timeout_ns=TIMEOUT, retry_cnt=retry_cnt)
        self.resp = RcResponder(B_PORT, two_sided=True, read_memory=self.mem.read, cqs={1: CqContext(1, 4)})
        self.resp.register(REGION)
        self.resp.add_qp(self.b, pd=PD)
        self.poster = RecvPoster(self.rq, self.mem)
        self.idx = 0

    def wqe_index(self):
        i, self.idx = self.idx, self.idx + 1
        return i

    def send(self, length, *, imm=None, off=0, solicited=False):
        return build_send_wqe(self.wqe_index(), 0x100, segments=[(SRC + off, length, 1)], imm=imm,
                              solicited=solicited)

    def payload(self, length, off=0):
        return self.src.read(SRC + off, length)

    def run(self, posts, recv_posts=(), **kw):
        return simulate(self.req, self.resp, posts, memory=self.mem, latency_ns=1000,
                        recv_posts=recv_posts, **kw)

    def req_cqes(self):
        return [(r.opcode, r.wqe_counter, r.byte_cnt, r.syndrome) for r in self.req.completions]

    def recv_cqes(self):
        return [parse_cqe(r.cqe) for r in self.resp.completions]


def req_frames(res):
    return [r.frame for r in res.records if r.direction == "req"]


def resp_frames(res):
    return [r for r in res.records if r.direction == "resp"]


# ---- formats, by hand ------------------------------------------------------------------------
def test_send_only_imm_frame_bytes():
    """SEND ONLY with immediate of 5 bytes: BTH opcode 0x05, PadCnt 3 (flags 0x30; SE adds
    0x80), AckReq, ImmDt right after the BTH, the 5 bytes, 3 zero pad bytes, the ICRC."""
    qp = QpContext(qpn=0x123, remote_qpn=0x456, dmac=B_MAC, dip=B_IP, mtu=256)
    f = build_message_frames(qp, A_PORT, WqeOp.SEND_IMM, b"hello", 0x0ABCDE, imm=0x11223344)
    assert len(f) == 1
    f = f[0]
    assert len(f) == 14 + 20 + 8 + 12 + 4 + 5 + 3 + 4 == 70
    assert f[42] == 0x05 and f[43] == 0x30 and f[44:46] == b"\xff\xff" and f[46] == 0
    assert f[47:50] == bytes.fromhex("000456") and f[50] == 0x80 and f[51:54] == bytes.fromhex("0abcde")
    assert f[54:58] == bytes.fromhex("11223344") and f[58:63] == b"hello" and f[63:66] == bytes(3)
    assert f[16:18] == (70 - 14).to_bytes(2, "big") and f[38:40] == (70 - 34).to_bytes(2, "big")
    m = bytearray(f[14:-4])                     # ICRC: TOS, TTL, IP checksum, UDP checksum, BTH[4] all ones
    for o, n in ((1, 1), (8, 1), (10, 2), (26, 2), (32, 1)):
        m[o:o + n] = b"\xff" * n
    assert f[-4:] == struct.pack("<I", zlib.crc32(b"\xff" * 8 + bytes(m)) & 0xFFFFFFFF)
    se = build_message_frames(qp, A_PORT, WqeOp.SEND_IMM, b"hello", 0x0ABCDE, imm=0x11223344, se=True)[0]
    assert se[43] == 0xB0 and se[:43] == f[:43] and se[44:-4] == f[44:-4]
    p, why = parse_frame(f, SEND_OPCODES, B_PORT)
    assert why is None and p.imm == 0x11223344 and p.payload == b"hello" and p.padcnt == 3
    assert parse_frame(f, None, B_PORT) == (None, "bad_opcode")     # only when named


def test_send_packets_and_write_imm_packets():
    assert message_packets(WqeOp.SEND, 600, 256) == [(0x00, 0, 256), (0x01, 256, 256), (0x02, 512, 88)]
    assert message_packets(WqeOp.SEND_IMM, 600, 256)[-1] == (0x03, 512, 88)
    assert message_packets(WqeOp.SEND, 0, 256) == [(0x04, 0, 0)]
    assert message_packets(WqeOp.RDMA_WRITE_IMM, 256, 256) == [(0x0B, 0, 256)]
    assert message_packets(WqeOp.RDMA_WRITE_IMM, 257, 256) == [(0x06, 0, 256), (0x09, 256, 1)]
    qp = QpContext(qpn=1, remote_qpn=2, dmac=B_MAC, dip=B_IP, mtu=256)
    data = bytes(range(256)) * 3
    # WRITE ONLY_IMM: RETH (va, rkey, len) then ImmDt then the payload
    f = build_message_frames(qp, A_PORT, WqeOp.RDMA_WRITE_IMM, data[:8], 5, raddr=0x1122334455667788,
                             rkey=0xCAFE, imm=0xA0B0C0D0)[0]
    assert f[42] == 0x0B and f[54:62] == bytes.fromhex("1122334455667788") and f[62:66] == be32(0xCAFE)
    assert f[66:70] == be32(8) and f[70:74] == be32(0xA0B0C0D0) and f[74:82] == data[:8]
    # SEND FIRST / MIDDLE carry no RETH and no AckReq; LAST_IMM the ImmDt
    fs = build_message_frames(qp, A_PORT, WqeOp.SEND_IMM, data[:600], 0, imm=9)
    assert [x[42] for x in fs] == [0x00, 0x01, 0x03] and [x[50] for x in fs] == [0, 0, 0x80]
    assert fs[0][54:54 + 256] == data[:256] and fs[2][54:58] == be32(9) and fs[2][58:58 + 88] == data[512:600]
    # a plain WRITE is exactly build_write_frames' (the SE wish is ignored: it completes nothing remote)
    assert build_message_frames(qp, A_PORT, WqeOp.RDMA_WRITE, data, 7, raddr=DST, rkey=KEY, se=True) == \
        build_write_frames(qp, A_PORT, DST, KEY, data, 7)


def test_send_wqe_forms():
    """SEND = ctrl + data segments (no raddr); SEND_IMM's immediate in ctrl bytes 12-15;
    a gather list; inline; ds 1 = 0 bytes; without two_sided a SEND is unsupported."""
    w = build_send_wqe(3, 0x42, segments=[(0x1000, 10, 7), (0x2000, 20, 8), (0x3000, 0, 9)], imm=0xDEADBEEF,
                       solicited=True)
    ctrl = be32((3 << 8) | 0x0B) + be32((0x42 << 8) | 4) + bytes([0, 0, 0, 0x08 | 0x02]) + be32(0xDEADBEEF)
    segs = b"".join(struct.pack(">IIQ", n, k, a) for a, n, k in ((0x1000, 10, 7), (0x2000, 20, 8), (0x3000, 0, 9)))
    assert w == ctrl + segs
    p = parse_wqe(w, two_sided=True)
    assert p.valid and p.kind == "pointer" and p.length == 30 and p.imm == 0xDEADBEEF and p.solicited
    assert p.segments == ((0x1000, 10, 7), (0x2000, 20, 8), (0x3000, 0, 9))
    assert parse_wqe(w).error == "unsupported opcode 0x0b"
    i = parse_wqe(build_send_wqe(0, 1, inline=b"abc"), two_sided=True)
    assert (i.kind, i.inline_data, i.ds) == ("inline", b"abc", 2)
    z = parse_wqe(build_send_wqe(0, 1), two_sided=True)
    assert (z.kind, z.length, z.ds, z.valid) == ("none", 0, 1, True)
    # a WRITE gather list: valid with two_sided only; an inline segment after a pointer one never
    g = build_write_wqe(0, 1, DST, KEY, segments=[(0x10, 4), (0x20, 4)])
    assert parse_wqe(g, two_sided=True).valid and not parse_wqe(g).valid
    bad = g[:48] + struct.pack(">I", 0x80000004) + g[52:]
    assert "inline segment after" in parse_wqe(bad, two_sided=True).error
    wi = parse_wqe(build_write_imm_wqe(0, 1, DST, KEY, 0x01020304, inline=b"xy"), two_sided=True)
    assert (wi.opcode, wi.raddr, wi.rkey, wi.imm, wi.inline_data) == (0x09, DST, KEY, 0x01020304, b"xy")


def test_recv_wqe_bytes():
    """mlx5 receive WQE: 16-byte data segments (byte_count, lkey, addr, big-endian), a
    terminator with lkey 0x100 when fewer than fit, nothing after."""
    w = build_recv_wqe([(0x1122334455667788, 64, 0xAABB), (0x2000, 8)], 6)
    assert w == (be32(64) + be32(0xAABB) + bytes.fromhex("1122334455667788")
                 + be32(8) + be32(0) + (0x2000).to_bytes(8, "big")
                 + be32(0) + be32(0x100) + bytes(8)
                 + bytes(16))
    assert parse_recv_wqe(w) == [(0x1122334455667788, 64, 0xAABB), (0x2000, 8, 0)]
    full = build_recv_wqe([(i, i + 1) for i in range(4)], 6)
    assert len(full) == 64 and b"\x00\x00\x01\x00" not in full[4:8]      # full: no terminator
    assert parse_recv_wqe(full) == [(i, i + 1, 0) for i in range(4)]
    with pytest.raises(ValueError):
        build_recv_wqe([(0, 1)] * 5, 6)
    rq = RecvQueue(base=0x4000, log_size=1, log_stride=5, dbr=0x8000)
    writes, head = recv_wqe_writes(rq, 1, [[(0x10, 1)], [(0x20, 2)]])
    assert head == 3 and [a for a, _ in writes] == [0x4020, 0x4000, 0x8000] and writes[-1][1] == be32(3)


def test_resp_send_imm_cqe_bytes():
    """A responder CQE by hand: srqn_uidx @32, imm @36 (as on the wire), byte_cnt @44,
    sop_drop_qpn @56, wqe_counter @60, op_own @63 = opcode 3 << 4 | SE << 1 | owner."""
    c = build_cqe(CqeOp.RESP_SEND_IMM, 0x200, 0x1234, 700, owner=1, user_index=UIDX, imm=0xCAFEF00D, se=1)
    want = bytearray(64)
    want[32:36] = be32(UIDX)
    want[36:40] = bytes.fromhex("cafef00d")
    want[44:48] = be32(700)
    want[56:60] = be32(0x200)
    want[60:62] = b"\x12\x34"
    want[63] = 0x30 | 0x02 | 0x01
    assert c == bytes(want)


# ---- the pair --------------------------------------------------------------------------------
def test_send_scattered_over_three_segments():
    """A 700-byte SEND_IMM (MTU 256: FIRST, MIDDLE, LAST_IMM) into segments of 100, 500 and
    200 bytes: bytes land in order, one RESP_SEND_IMM CQE of 700 with the immediate, the SE
    bit, the QPN, the user index and receive WQE counter 0; the requester's REQ CQE."""
    e = Pair()
    segs = [(BUF, 100), (BUF + 0x1000, 500), (BUF + 0x2000, 200)]
    e.poster.post(segs)
    res = e.run([(0x100, e.send(700, imm=0x0BADCAFE, solicited=True))])
    assert not res.hung
    data = e.payload(700)
    assert e.mem.read(BUF, 100) == data[:100] and e.mem.read(BUF + 0x1000, 500) == data[100:600]
    assert e.mem.read(BUF + 0x2000, 100) == data[600:] and e.mem.read(BUF + 0x2000 + 100, 1) == b"\0"
    assert [f[42] for f in req_frames(res)] == [Op.SEND_FIRST, Op.SEND_MIDDLE, Op.SEND_LAST_IMM]
    assert [f[43] & 0x80 for f in req_frames(res)] == [0, 0, 0x80]           # SE on the last one
    (c,) = e.recv_cqes()
    assert (c["opcode"], c["byte_cnt"], c["imm"], c["se"], c["qpn"], c["wqe_counter"], c["user_index"],
            c["owner"]) == (CqeOp.RESP_SEND_IMM, 700, 0x0BADCAFE, 1, 0x200, 0, UIDX, 0)
    assert e.req_cqes() == [(CqeOp.REQ, 0, 700, 0)]
    assert e.req.completions[0].cqe[56] == WqeOp.SEND_IMM


def test_send_longer_than_buffers_is_a_length_error():
    """300 bytes into a 256-byte WQE: FIRST (256) fits, LAST (44) does not: nothing of it
    written, NAK invalid request, RESP_ERR / LOCAL_LENGTH_ERR for WQE 0, the other posted
    WQE flushed, the QP in ERR; the requester fails with REMOTE_INVAL_REQ_ERR."""
    e = Pair()
    e.poster.post([(BUF, 200), (BUF + 0x1000, 56)], [(BUF + 0x2000, 1000)])
    res = e.run([(0x100, e.send(300)), (0x100, e.send(8, off=300))])
    assert e.mem.read(BUF, 200) == e.payload(200) and e.mem.read(BUF + 0x1000, 56) == e.payload(56, 200)
    assert e.mem.read(BUF + 0x2000, 64) == bytes(64)
    assert [(c["opcode"], c["syndrome"], c["wqe_counter"]) for c in e.recv_cqes()] == [
        (CqeOp.RESP_ERR, Syndrome.LOCAL_LENGTH_ERR, 0), (CqeOp.RESP_ERR, Syndrome.WR_FLUSH_ERR, 1)]
    assert e.resp.qp_info(0x200)["state"] == QpState.ERR
    assert e.resp.counters.naks_sent["nak_invalid_request"] == 1
    nak = [r.frame for r in resp_frames(res)][-1]
    assert nak[42] == Op.ACK and nak[54] == 0x61 and nak[51:54] == be32(1)[1:]
    assert e.req_cqes() == [(CqeOp.REQ_ERR, 0, 0, Syndrome.REMOTE_INVAL_REQ_ERR),
                            (CqeOp.REQ_ERR, 1, 0, Syndrome.WR_FLUSH_ERR)]
    # WQEs posted while in ERR are flushed when the engine looks again
    e.poster.post([(BUF, 4)])
    assert [(r.opcode, r.syndrome, r.wqe_counter) for r in e.resp.flush_receives(0x200)] == [
        (CqeOp.RESP_ERR, Syndrome.WR_FLUSH_ERR, 2)]


def test_rnr_then_success_after_a_later_post():
    """No receive WQE: RNR NAK (syndrome 0x20 | 1, PSN of the SEND, MSN 0); the requester
    waits RNR_TIMER_NS[1] = 10 us from the NAK's arrival and sends again, until the post at
    35 us lets one through; one WQE, one CQE, no transport retry."""
    e = Pair(min_rnr_timer=1)
    res = e.run([(0x100, e.send(40, imm=5))], recv_posts=[(35_000, e.poster, [[(BUF, 64)]])])
    assert not res.hung
    reqs = [r for r in res.records if r.direction == "req"]
    nak_arrivals = [r.arrival for r in resp_frames(res) if r.frame[54] == 0x21]
    assert len(nak_arrivals) == len(reqs) - 1 >= 3
    assert [r.time for r in reqs[1:]] == [t + RNR_TIMER_NS[1] for t in nak_arrivals]
    assert len({r.frame for r in reqs}) == 1                             # the same SEND every time
    nak = resp_frames(res)[0].frame
    assert nak[54:58] == bytes([0x21, 0, 0, 0]) and nak[51:54] == bytes(3)
    assert e.mem.read(BUF, 40) == e.payload(40)
    (c,) = e.recv_cqes()
    assert (c["opcode"], c["byte_cnt"], c["imm"], c["wqe_counter"]) == (CqeOp.RESP_SEND_IMM, 40, 5, 0)
    assert e.req_cqes() == [(CqeOp.REQ, 0, 40, 0)]
    rc = e.req.counters
    assert rc.rnr_resends == len(reqs) - 1 and rc.timeouts == 0 and rc.naks_received["rnr"] == len(reqs) - 1
    assert e.resp.counters.rnr_naks == len(reqs) - 1 and e.resp.qp_info(0x200)["rq_ci"] == 1


def test_rnr_retries_exhausted():
    """rnr_retry 2: the SEND is sent 3 times, the third RNR NAK fails it with
    RNR_RETRY_EXC_ERR (0x16) and flushes the next WQE; the QP goes to ERR."""
    e = Pair(rnr_retry=2)
    res = e.run([(0x100, e.send(16)), (0x100, e.send(16, off=16))])
    assert not res.hung
    sends = [f for f in req_frames(res)]
    # the second SEND went out once behind the first; the first 3 times
    assert [f[51:54] for f in sends].count(bytes(3)) == 3
    assert e.req_cqes() == [(CqeOp.REQ_ERR, 0, 0, Syndrome.RNR_RETRY_EXC_ERR),
                            (CqeOp.REQ_ERR, 1, 0, Syndrome.WR_FLUSH_ERR)]
    assert e.req.qp_info(0x100)["state"] == QpState.ERR and e.req.counters.rnr_retry_exceeded == 1
    assert e.resp.counters.rnr_naks == 3 and e.recv_cqes() == []
    # the second SEND, behind each RNR NAK, got the gap's PSN-sequence NAK (as rxe does:
    # tb/suites/interop.py rnr_from_rxe), which the requester ignored while it waited
    assert e.resp.counters.naks_sent == {"nak_rnr": 3, "nak_psn_seq": 3}


def test_rnr_retry_7_never_gives_up():
    """rnr_retry 7: 20 RNR NAKs and still waiting; a post then lets the SEND through."""
    e = Pair(rnr_retry=7)
    t_post = 20 * (RNR_TIMER_NS[1] + 2_000) + 1_000
    res = e.run([(0x100, e.send(8))], recv_posts=[(t_post, e.poster, [[(BUF, 8)]])])
    assert not res.hung and e.resp.counters.rnr_naks >= 20
    assert e.req_cqes() == [(CqeOp.REQ, 0, 8, 0)] and e.mem.read(BUF, 8) == e.payload(8)
    # and without a post it waits forever (the run is cut off, nothing completed or failed)
    e2 = Pair(rnr_retry=7)
    res2 = e2.run([(0x100, e2.send(8))], max_time_ns=2_000_000)
    assert res2.hung and e2.req_cqes() == [] and e2.req.qp_info(0x100)["state"] == QpState.RTS
    assert e2.req.qp_info(0x100)["rnr_retries"] == 0 and e2.req.counters.rnr_resends > 100


def test_write_imm_consumes_a_wqe_on_its_last_packet():
    """WRITE_IMM of 600 bytes (FIRST, MIDDLE, LAST_IMM): FIRST and MIDDLE are written
    without a receive WQE; LAST_IMM finds none: RNR NAK at its PSN (2), then only it is
    sent again; it takes WQE 0 (which holds no data): RESP_WR_IMM, byte_cnt 600."""
    e = Pair()
    wqe = build_write_imm_wqe(0, 0x100, DST + 0x40, KEY, 0x55667788, segments=[(SRC, 600, 1)])
    res = e.run([(0x100, wqe)], recv_posts=[(5_000, e.poster, [[(BUF, 4)]])])
    assert not res.hung
    ops = [(f[42], int.from_bytes(f[51:54], "big")) for f in req_frames(res)]
    assert ops[:3] == [(Op.WRITE_FIRST, 0), (Op.WRITE_MIDDLE, 1), (Op.WRITE_LAST_IMM, 2)]
    assert set(ops[3:]) == {(Op.WRITE_LAST_IMM, 2)}
    assert e.mem.read(DST + 0x40, 600) == e.payload(600) and e.mem.read(BUF, 4) == bytes(4)
    (c,) = e.recv_cqes()
    assert (c["opcode"], c["byte_cnt"], c["imm"], c["wqe_counter"]) == (CqeOp.RESP_WR_IMM, 600, 0x55667788, 0)
    assert e.req_cqes() == [(CqeOp.REQ, 0, 600, 0)]


def test_duplicate_send_not_applied_twice():
    """The ACK of a SEND is lost: the requester times out and sends it again; the
    responder ACKs the duplicate without executing it: one WQE, one CQE, the second
    posted WQE untouched."""
    e = Pair()
    e.poster.post([(BUF, 64)], [(BUF + 0x100, 64)])
    res = e.run([(0x100, e.send(20))], response_faults=[(0, "drop")])
    assert not res.hung and e.req.counters.timeouts == 1
    assert len(req_frames(res)) == 2 and req_frames(res)[0] == req_frames(res)[1]
    assert e.resp.counters.dropped["psn_duplicate"] == 1
    assert len(e.recv_cqes()) == 1 and e.resp.qp_info(0x200)["rq_ci"] == 1
    assert e.mem.read(BUF + 0x100, 64) == bytes(64) and e.mem.read(BUF, 20) == e.payload(20)
    assert e.req_cqes() == [(CqeOp.REQ, 0, 20, 0)]


def test_gather_list_send_and_recv_cq_wrap():
    """A gather list of 3 segments is one message (their concatenation); 20 SENDs through a
    16-entry receive CQ: the owner bit flips at the wrap; wqe_counter counts WQEs."""
    e = Pair(log_size=5)
    segs = [(SRC + 1000, 3, 1), (SRC + 5, 0, 1), (SRC + 2000, 9, 1)]
    for i in range(20):
        e.poster.post([(BUF + 64 * i, 64)])
    posts = [(0x100, build_send_wqe(e.wqe_index(), 0x100, segments=segs)) for _ in range(20)]
    res = e.run(posts)
    assert not res.hung
    msg = e.src.read(SRC + 1000, 3) + e.src.read(SRC + 2000, 9)
    assert all(e.mem.read(BUF + 64 * i, 12) == msg for i in range(20))
    cs = e.recv_cqes()
    assert [c["wqe_counter"] for c in cs] == list(range(20))
    assert [c["owner"] for c in cs] == [0] * 16 + [1] * 4 and {c["opcode"] for c in cs} == {CqeOp.RESP_SEND}


def test_engine_model_sends_two_sided_frames():
    """EngineModel with two_sided predicts the same frames as build_message_frames."""
    mem = SparseMemory()
    mem.write(SRC, bytes(range(256)) * 4)
    qp = QpContext(qpn=5, remote_qpn=6, dmac=B_MAC, dip=B_IP, mtu=256, start_psn=10)
    eng = EngineModel(A_PORT, {5: qp}, {0: CqContext(0, 4)}, mem.read, two_sided=True)
    r1 = eng.post(5, build_send_wqe(0, 5, segments=[(SRC, 300), (SRC + 600, 100)], imm=0x77, solicited=True))
    want = build_message_frames(qp, A_PORT, WqeOp.SEND_IMM, mem.read(SRC, 300) + mem.read(SRC + 600, 100), 10,
                                imm=0x77, se=True)
    assert [r.frame for r in r1.frames] == want and [r.bth_opcode for r in r1.frames] == [0x00, 0x03]
    r2 = eng.post(5, build_write_imm_wqe(1, 5, DST, KEY, 9, inline=b"abc"))
    assert [r.frame for r in r2.frames] == build_message_frames(qp, A_PORT, WqeOp.RDMA_WRITE_IMM, b"abc", 12,
                                                                 raddr=DST, rkey=KEY, imm=9)
    assert [(c.opcode, c.byte_cnt) for c in eng.result().cqes[0]] == [(CqeOp.REQ, 400), (CqeOp.REQ, 3)]
    plain = EngineModel(A_PORT, {5: qp}, {0: CqContext(0, 4)}, mem.read)       # without: an error CQE
    assert plain.post(5, build_send_wqe(0, 5, inline=b"x")).status == "error"


@pytest.mark.parametrize("seed", range(60))
def test_scatter_matches_concatenation(seed):
    """Random scatter lists against random SEND lengths (frames straight into the responder):
    fits -> the buffers hold the message in order, else a LOCAL_LENGTH_ERR CQE at the packet
    that overruns, and nothing of it written."""
    rnd = random.Random(seed)
    seg_lens = [rnd.choice([0, 1, 3, 4, rnd.randrange(301)]) for _ in range(rnd.randrange(1, 5))]
    mtu = rnd.choice([256, 512])
    cap = sum(seg_lens)
    length = rnd.choice([cap, cap + 1, max(0, cap - 1), rnd.randrange(901)])
    e = Pair(mtu=mtu)
    segs, addr = [], BUF
    for n in seg_lens:
        segs.append((addr, n))
        addr += n + 16                        # a gap between buffers: nothing may land there
    e.poster.post(segs)
    data = bytes((i * 13 + 1) & 0xFF or 1 for i in range(length))
    frames = build_message_frames(e.a, A_PORT, WqeOp.SEND, data, 0)
    written, failed_at = 0, None
    for i, f in enumerate(frames):
        r = e.resp.receive(f)
        for a, chunk in r.writes:
            e.mem.write(a, chunk)
        if not r.accepted:
            failed_at = i
            break
        written += len(f) - 54 - 4 - (f[43] >> 4 & 3)
    cap = sum(seg_lens)
    pos, got = 0, b""
    for a, n in segs:
        got += e.mem.read(a, n)
        assert e.mem.read(a + n, 16) == bytes(16)
    if length <= cap:
        assert failed_at is None and got[:length] == data and got[length:] == bytes(cap - length)
        (c,) = e.recv_cqes()
        assert (c["opcode"], c["byte_cnt"]) == (CqeOp.RESP_SEND, length)
    else:
        assert failed_at is not None and got[:written] == data[:written] and got[written:] == bytes(cap - written)
        assert written + min(mtu, length - failed_at * mtu) > cap
        (c,) = e.recv_cqes()
        assert (c["opcode"], c["syndrome"]) == (CqeOp.RESP_ERR, Syndrome.LOCAL_LENGTH_ERR)
