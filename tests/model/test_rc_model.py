"""Tests of the RC golden model (model/parse.py, responder.py, requester.py, link.py): responder, requester, go-back-N over a lossy link.

No simulator. Expected counts are worked out by hand in the comments; frames are read
back at hand-written byte offsets or by scapy (tb/roce_check.py), and lossless runs are
held to the transmit-path golden model (model/engine.py), which is itself tested against
scapy in tests/model/test_golden_model.py.
"""

import random

import pytest
from scapy.compat import raw
from scapy.contrib.roce import AETH as ScapyAETH, BTH as ScapyBTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from model.cqe import CqContext
from model.engine import EngineModel
from model.frames import QpContext, Port, build_ctrl, build_nop_wqe, build_write_wqe, parse_wqe, split_message
from model.icrc import icrc, ipv4_checksum
from model.mr import MemoryRegion
from model.link import CORRUPT_BIT, FAULT_KINDS, simulate
from model.memory import SparseMemory
from model.network import FaultEvent, Link
from model.parse import WRITE_OPCODES, Aeth, CqeSyndrome, build_rc_packet, build_response, parse_frame
from model.requester import RcRequester
from model.responder import RcResponder
from spec.formats import OFF_BTH, PSN_MASK, Access, CqeOp, MrCheck, Op, QpState, Syndrome, WqeOp
from tb.roce_check import check_frame

A_MAC, A_IP = "02:00:00:00:00:0a", "10.0.0.1"      # requester
B_MAC, B_IP = "02:00:00:00:00:0b", "10.0.0.2"      # responder
A_PORT = Port(smac=0x02000000000A, sip=A_IP)
B_PORT = Port(smac=0x02000000000B, sip=B_IP)

SRC = 0x7000_0000                 # requester's payload buffers
DST = 0x1000_0000                 # responder's region
KEY = (0x12 << 8) | 0x5A          # index 0x12, variant byte 0x5a
PD = 5
REGION = MemoryRegion(key=KEY, base=DST, length=1 << 22, access=Access.LOCAL_WRITE | Access.REMOTE_WRITE, pd=PD)
TIMEOUT = 20_000                  # ns

# hand offsets in a frame: BTH at 42 (14 + 20 + 8): opcode @42, dqpn @47..49, ackreq @50, psn @51..53
OFF_BTH = 42


def f_opcode(f):
    return f[OFF_BTH]


def f_psn(f):
    return int.from_bytes(f[OFF_BTH + 9:OFF_BTH + 12], "big")


def f_dqpn(f):
    return int.from_bytes(f[OFF_BTH + 5:OFF_BTH + 8], "big")


def f_aeth(f):
    """(syndrome, msn) of a 62-byte ACK/NAK: AETH right after the BTH."""
    assert len(f) == 62, len(f)
    return f[54], int.from_bytes(f[55:58], "big")


def refresh(f):
    """Recompute the IPv4 checksum and the ICRC of an edited frame (test input helper)."""
    b = bytearray(f[:-4])
    b[24:26] = ipv4_checksum(b[14:34]).to_bytes(2, "big")
    return bytes(b) + icrc(b)


def contexts(qa, qb, psn=0, mtu=256, cqn=0, state_b=QpState.RTS):
    req = QpContext(qpn=qa, remote_qpn=qb, dmac=B_MAC, dip=B_IP, start_psn=psn, mtu=mtu, cqn=cqn)
    resp = QpContext(qpn=qb, remote_qpn=qa, dmac=A_MAC, dip=A_IP, start_psn=psn, mtu=mtu, state=state_b)
    return req, resp


class Env:
    """Requester and responder with ``pairs`` connected QP pairs (requester QPN 0x100+i,
    responder QPN 0x200+i) and a requester source buffer of random bytes."""

    def __init__(self, pairs=1, mtu=256, psn=0, ack_every=1, timeout=TIMEOUT, retry_cnt=7, seed=1):
        psns = psn if isinstance(psn, (list, tuple)) else [psn] * pairs
        rnd = random.Random(seed)
        self.src = SparseMemory()
        self.src.write(SRC, bytes(rnd.randrange(256) for _ in range(64 * 1024)))
        self.req = RcRequester(A_PORT, {0: CqContext(0, 10)}, self.src.read)
        self.resp = RcResponder(B_PORT, ack_every=ack_every)
        self.resp.register(REGION)
        self.ctx = []
        for i in range(pairs):
            a, b = contexts(0x100 + i, 0x200 + i, psn=psns[i], mtu=mtu)
            self.req.add_qp(a, timeout_ns=timeout, retry_cnt=retry_cnt)
            self.resp.add_qp(b, pd=PD)
            self.ctx.append((a, b))
        self.index = {a.qpn: 0 for a, _ in self.ctx}
        self.posts = []
        self.msgs = []            # (qpn, wqe index, raddr, payload, signalled)

    def write(self, i, raddr, length=None, *, inline=None, src_off=0, signalled=True, rkey=KEY):
        """Post an RDMA WRITE on pair ``i``; returns the payload."""
        qpn = self.ctx[i][0].qpn
        idx = self.index[qpn]
        self.index[qpn] += 1
        if inline is not None:
            wqe = build_write_wqe(idx, qpn, raddr, rkey, inline=inline, cq_update=signalled)
            payload = bytes(inline)
        else:
            wqe = build_write_wqe(idx, qpn, raddr, rkey, addr=SRC + src_off, length=length, cq_update=signalled)
            payload = self.src.read(SRC + src_off, length)
        self.index[qpn] += parse_wqe(wqe).num_wqebbs - 1        # positions in WQEBBs
        self.posts.append((qpn, wqe))
        self.msgs.append((qpn, idx, raddr, payload, signalled))
        return payload

    def nop(self, i, signalled=True):
        qpn = self.ctx[i][0].qpn
        idx = self.index[qpn]
        self.index[qpn] += 1
        self.posts.append((qpn, build_nop_wqe(idx, qpn, signalled)))
        return idx

    def run(self, faults=(), response_faults=(), **kw):
        return simulate(self.req, self.resp, self.posts, faults, response_faults, **kw)

    def cqes(self, qpn):
        return [(r.opcode, r.wqe_counter, r.byte_cnt, r.syndrome) for r in self.req.completions if r.qpn == qpn]


def expected_chunks(msgs, mtu):
    """Every (addr, bytes) the responder must write for ``msgs``: one per non-empty packet."""
    out = []
    for qpn, _, raddr, payload, _ in msgs:
        for _, off, n in split_message(len(payload), mtu):
            if n:
                out.append((raddr + off, payload[off:off + n]))
    return out


def req_frames(res):
    return [r.frame for r in res.records if r.direction == "req"]


def resp_frames(res):
    return [r.frame for r in res.records if r.direction == "resp"]


def test_syndromes_match_rdma_core():
    """rdma-core providers/mlx5/mlx5dv.h MLX5_CQE_SYNDROME_*, copied by hand, against spec.formats."""
    want = dict(LOCAL_LENGTH_ERR=0x01, LOCAL_QP_OP_ERR=0x02, LOCAL_PROT_ERR=0x04, WR_FLUSH_ERR=0x05,
                MW_BIND_ERR=0x06, BAD_RESP_ERR=0x10, LOCAL_ACCESS_ERR=0x11, REMOTE_INVAL_REQ_ERR=0x12,
                REMOTE_ACCESS_ERR=0x13, REMOTE_OP_ERR=0x14, TRANSPORT_RETRY_EXC_ERR=0x15, RNR_RETRY_EXC_ERR=0x16,
                REMOTE_ABORTED_ERR=0x22)
    assert {k: v for k, v in vars(Syndrome).items() if not k.startswith("_")} == want


# ---- lossless -------------------------------------------------------------------------------
@pytest.mark.parametrize("mtu,psn", [(256, 0), (1024, PSN_MASK - 2)])
def test_lossless_write_shapes(mtu, psn):
    """0 B, 8 B, MTU-1, MTU, MTU+1, multi-MTU and inline WRITEs land exactly their bytes at the
    right offsets; frames and CQEs are the transmit-path model's; ACKs coalesce as computed."""
    env = Env(mtu=mtu, psn=psn, ack_every=2)
    sizes = [0, 8, mtu - 1, mtu, mtu + 1, 3 * mtu, 5 * mtu + 7]
    for k, n in enumerate(sizes):
        env.write(0, DST + k * 0x8000 + 3 * k, n, src_off=5 * k)           # unaligned on both sides
    for k, n in enumerate((1, 12, 28, 60)):
        env.write(0, DST + 0x100000 + k * 0x100 + k, inline=bytes((k * 7 + j) & 0xFF for j in range(n)))
    env.nop(0)
    res = env.run()
    assert not res.hung
    qpn = env.ctx[0][0].qpn

    # Every byte at its address, in PSN order, nothing else written.
    assert [(a, d) for _, _, _, a, d in res.writes] == expected_chunks(env.msgs, mtu)
    for _, _, raddr, payload, _ in env.msgs:
        assert res.memory.read(raddr - 1, len(payload) + 2) == b"\0" + payload + b"\0"

    # Frames and CQEs: exactly what the transmit-path golden model predicts.
    eng = EngineModel(A_PORT, {qpn: env.ctx[0][0]}, {0: CqContext(0, 10)}, env.src.read)
    eng.run(env.posts)
    assert req_frames(res) == eng.result().frame_bytes(qpn)
    assert [r.cqe for r in env.req.completions] == [r.cqe for r in eng.result().cqes[0]]
    # the NOP, after every WRITE, at its position (the 60-byte inline WRITE takes two WQEBBs)
    assert env.cqes(qpn)[-1] == (CqeOp.REQ, len(env.msgs) + 1, 0, 0)

    # PSNs run on through the 24-bit wrap.
    npk = sum(len(split_message(len(p), mtu)) for *_, p, _ in env.msgs)
    assert [f_psn(f) for f in req_frames(res)] == [(psn + i) & PSN_MASK for i in range(npk)]

    # ACKs with ack_every=2: in a message of n packets one at packets 2, 4, ... < n and one
    # at the last: (n - 1) // 2 + 1 each.
    acks = sum((len(split_message(len(p), mtu)) - 1) // 2 + 1 for *_, p, _ in env.msgs)
    rc, qc = env.resp.counters, env.req.counters
    assert rc.acks_sent == acks == qc.acks_received == len(resp_frames(res))
    assert rc.accepted == npk and rc.messages == len(env.msgs) and not rc.dropped and not rc.naks_sent
    assert qc.retransmitted_packets == qc.timeouts == qc.stale_responses == qc.msn_mismatches == 0
    assert qc.payload_reread_bytes == 0
    assert env.req.qp_info(qpn)["una"] == env.req.qp_info(qpn)["next_psn"] == (psn + npk) & PSN_MASK


def test_unsignalled_and_nop_complete_in_order():
    """An unsignalled WRITE gets no CQE; a NOP's CQE waits until the WRITE before it is ACKed."""
    env = Env()
    env.write(0, DST, 300, signalled=False)
    nop = env.nop(0)
    env.write(0, DST + 0x1000, 8)
    qpn = env.ctx[0][0].qpn
    tx = env.req.post(*env.posts[0])
    assert len(tx) == 2
    assert env.req.post(*env.posts[1]) == [] and env.cqes(qpn) == []   # NOP waits for the WRITE
    tx += env.req.post(*env.posts[2])
    for k, t in enumerate(tx):
        r = env.resp.receive(t.frame)
        assert r.accepted and r.response is not None
        env.req.on_response(r.response, 10 + k)
        if k == 1:           # the 300-byte WRITE acknowledged: the NOP completes, not the WRITE
            assert env.cqes(qpn) == [(CqeOp.REQ, nop, 0, 0)]
    assert env.cqes(qpn) == [(CqeOp.REQ, nop, 0, 0), (CqeOp.REQ, 2, 8, 0)]
    assert env.req.idle()


# ---- responder: ACK coalescing, duplicates, gaps -------------------------------------------------------
def responder_only(ack_every=1, mtu=256, psn=0):
    req_ctx, resp_ctx = contexts(0x100, 0x200, psn=psn, mtu=mtu)
    resp = RcResponder(B_PORT, ack_every=ack_every)
    resp.register(REGION)
    resp.add_qp(resp_ctx, pd=PD)
    return req_ctx, resp


def message_frames(req_ctx, psn0, raddr, payload, ackreq=False, ackreq_psns=()):
    """FIRST/MIDDLE/LAST (or ONLY) frames with AckReq cleared except on ``ackreq_psns``."""
    out = []
    for i, (op, off, n) in enumerate(split_message(len(payload), req_ctx.mtu)):
        reth = (raddr, KEY, len(payload)) if op in (Op.WRITE_FIRST, Op.WRITE_ONLY) else None
        psn = (psn0 + i) & PSN_MASK
        out.append(build_rc_packet(req_ctx, A_PORT, op, psn, payload[off:off + n], reth,
                                   ackreq=ackreq or psn in ackreq_psns))
    return out


@pytest.mark.parametrize("ackreq_psns,want", [((), [(0, 1), (3, 1), (5, 2)]), ((2,), [(0, 1), (2, 1), (5, 2)])])
def test_ack_coalescing_by_hand(ackreq_psns, want):
    """ack_every=3, AckReq cleared: ONLY (PSN 0) then FIRST MIDDLE MIDDLE MIDDLE LAST (1..5).
    PSN 0: last of a message -> ACK, count 0. PSN 1, 2: count 1, 2. PSN 3: count 3 -> ACK.
    PSN 4: count 1. PSN 5: last -> ACK. ACKs (PSN, MSN) = (0,1) (3,1) (5,2). With AckReq on
    PSN 2: ACK there, count restarts: PSN 3, 4 count 1, 2; PSN 5 last: (0,1) (2,1) (5,2)."""
    req_ctx, resp = responder_only(ack_every=3)
    frames = message_frames(req_ctx, 0, DST, b"\x11" * 8, ackreq_psns=ackreq_psns)
    frames += message_frames(req_ctx, 1, DST + 0x1000, bytes(range(256)) * 4 + b"\x22" * 10, ackreq_psns=ackreq_psns)
    assert [f_opcode(f) for f in frames] == [0x0A, 0x06, 0x07, 0x07, 0x07, 0x08]
    got = []
    for f in frames:
        r = resp.receive(f)
        assert r.accepted
        if r.response is not None:
            assert r.response_kind == "ack"
            syn, msn = f_aeth(r.response)
            assert syn == 0x1F
            got.append((f_psn(r.response), msn))
    assert got == want
    assert resp.counters.acks_sent == 3 and resp.counters.messages == 2


def test_ack_frame_matches_scapy():
    """An ACK is Ether/IPv4/UDP/BTH(0x11)/AETH/ICRC exactly as scapy builds it."""
    req_ctx, resp = responder_only()
    r = resp.receive(message_frames(req_ctx, 0, DST, b"abcdefgh", ackreq=True)[0])
    want = raw(Ether(dst=A_MAC, src=B_MAC) / IP(src=B_IP, dst=A_IP, id=0, flags="DF", ttl=64, tos=0)
               / UDP(sport=0xC000 | 0x200, dport=4791, chksum=0)
               / ScapyBTH(opcode=0x11, dqpn=0x100, ackreq=0, psn=0) / ScapyAETH(syndrome=0x1F, msn=1))
    assert r.response == want
    d = check_frame(r.response)          # scapy recomputes the IPv4 checksum and the ICRC
    assert d["opcode"] == 0x11 and d["payload"] == bytes([0x1F, 0, 0, 1])


def test_duplicate_reacked_not_rewritten():
    """A duplicate is not written again; it is ACKed with the PSN of the last accepted packet."""
    req_ctx, resp = responder_only(ack_every=4, psn=10)
    f0 = message_frames(req_ctx, 10, DST, b"A" * 8)[0]
    f1 = message_frames(req_ctx, 11, DST + 0x100, b"B" * 8)[0]
    assert resp.receive(f0).writes == [(DST, b"A" * 8)]
    assert resp.receive(f1).accepted
    for f in (f0, f1, f0):
        r = resp.receive(f)
        assert (r.accepted, r.reason, r.writes, r.response_kind) == (False, "psn_duplicate", [], "ack")
        assert (f_psn(r.response), f_aeth(r.response)) == (11, (0x1F, 2))     # last accepted PSN, MSN 2
    assert resp.counters.dropped == {"psn_duplicate": 3}
    assert resp.counters.accepted == 2 and resp.counters.bytes_written == 16


def test_gap_one_nak_then_drops_until_expected():
    """PSN 0 accepted, 1 lost: 2 gives one NAK (PSN 1, MSN 0), 3 and 4 are dropped silently;
    1 then 2.. are accepted; a later gap gives a new NAK."""
    req_ctx, resp = responder_only(ack_every=16)
    fr = message_frames(req_ctx, 0, DST, bytes(range(256)) * 5 + b"xyz")     # 6 packets, PSN 0..5
    assert resp.receive(fr[0]).accepted
    r = resp.receive(fr[2])
    assert (r.reason, r.response_kind, r.writes) == ("psn_out_of_order", "nak_psn_seq", [])
    assert (f_psn(r.response), f_aeth(r.response)) == (1, (0x60, 0))
    for f in (fr[3], fr[4]):
        r = resp.receive(f)
        assert (r.reason, r.response, r.writes) == ("psn_out_of_order", None, [])
    writes = []
    for f in fr[1:5]:
        r = resp.receive(f)
        assert r.accepted and r.response is None
        writes += r.writes
    assert writes == [(DST + 256 * k, bytes(range(256))) for k in (1, 2, 3, 4)]
    r = resp.receive(fr[5])        # last: ACK, message done
    assert r.accepted and r.message_done and f_aeth(r.response) == (0x1F, 1)
    # A second gap: new NAK with the new expected PSN.
    g = message_frames(req_ctx, 6, DST, b"q" * 8) + message_frames(req_ctx, 7, DST, b"r" * 8)
    r = resp.receive(g[1])
    assert r.response_kind == "nak_psn_seq" and (f_psn(r.response), f_aeth(r.response)) == (6, (0x60, 1))
    assert resp.counters.naks_sent == {"nak_psn_seq": 2}
    assert resp.counters.dropped == {"psn_out_of_order": 4}


@pytest.mark.parametrize("order,want", [
    # PSN 0 (count 1); PSN 2 -> NAK(1), which acknowledges PSN 0: count 0; PSN 1, 2, 3 -> count 3: ACK 3; PSN 5 last.
    ([0, 2, 1, 2, 3, 4, 5], [("nak_psn_seq", 1), ("ack", 3), ("ack", 5)]),
    # PSN 0 (count 1); duplicate 0 -> ACK 0, count 0; PSN 1, 2, 3 -> ACK 3; PSN 5 last.
    ([0, 0, 1, 2, 3, 4, 5], [("ack", 0), ("ack", 3), ("ack", 5)]),
])
def test_nak_and_reack_restart_the_ack_count(order, want):
    """ack_every=3 over one 6-packet message (AckReq clear): a PSN NAK or a duplicate's re-ACK
    acknowledges everything accepted so far, so the coalescing count starts again."""
    req_ctx, resp = responder_only(ack_every=3)
    fr = message_frames(req_ctx, 0, DST, bytes(range(256)) * 5 + b"end")
    got = []
    for i in order:
        r = resp.receive(fr[i])
        if r.response is not None:
            got.append((r.response_kind, f_psn(r.response)))
    assert got == want


# ---- memory-key violations -----------------------------------------------------------------
VIOLATIONS = {
    # name: (regions to add, rkey, raddr of the 600-byte WRITE, MrCheck)
    "wrong_variant": ((), KEY ^ 0x01, DST + 0x10000, MrCheck.BAD_KEY),
    "unregistered": ((), (0x33 << 8) | 0x5A, DST + 0x10000, MrCheck.BAD_KEY),
    "past_end": ((), KEY, DST + REGION.length - 599, MrCheck.BOUNDS),       # last byte one past the end
    "before_base": ((), KEY, DST - 1, MrCheck.BOUNDS),
    "no_remote_write": ((MemoryRegion((0x13 << 8) | 1, DST, 1 << 20, Access.LOCAL_WRITE | Access.REMOTE_READ, PD),),
                        (0x13 << 8) | 1, DST + 0x10000, MrCheck.RIGHTS),
    "other_pd": ((MemoryRegion((0x14 << 8) | 1, DST, 1 << 20, Access.LOCAL_WRITE | Access.REMOTE_WRITE, PD + 1),),
                 (0x14 << 8) | 1, DST + 0x10000, MrCheck.PD),
}


@pytest.mark.parametrize("name", list(VIOLATIONS))
def test_access_violation_nak_error_and_flush(name):
    """A 600-byte WRITE (3 packets at MTU 256) that fails the key check writes nothing, gets a
    remote-access NAK, then REQ_ERR 0x13; the WQE behind it is flushed (0x05); the other QP
    pair completes everything."""
    regions, rkey, bad_addr, status = VIOLATIONS[name]
    env = Env(pairs=2, ack_every=1)
    for r in regions:
        env.resp.register(r)
    env.write(0, DST + 0x8000, 100)          # clear of every bad range below
    env.write(0, bad_addr, 600, src_off=100, rkey=rkey)
    env.write(0, DST + 0x20000, 50)
    for k in range(3):
        env.write(1, DST + 0x30000 + k * 0x1000, 300 + k)
    res = env.run()
    assert not res.hung
    qa0, qa1 = env.ctx[0][0].qpn, env.ctx[1][0].qpn
    assert env.cqes(qa0) == [(CqeOp.REQ, 0, 100, 0), (CqeOp.REQ_ERR, 1, 0, CqeSyndrome.REMOTE_ACCESS_ERR),
                             (CqeOp.REQ_ERR, 2, 0, CqeSyndrome.WR_FLUSH_ERR)]
    assert env.cqes(qa1) == [(CqeOp.REQ, k, 300 + k, 0) for k in range(3)]
    # Memory: only the first WRITE of pair 0 and pair 1's WRITEs.
    assert sorted((a, d) for *_, a, d in res.writes) == sorted(expected_chunks([env.msgs[0]] + env.msgs[3:], 256))
    assert res.memory.read(bad_addr, 600) == bytes(600) and res.memory.read(DST + 0x20000, 50) == bytes(50)
    # The NAK: syndrome 0x62, PSN of the FIRST (PSN 1), MSN 1.
    bad = [r for r in res.rx if r.reason == "access_error"]
    assert len(bad) == 1 and bad[0].mr_status == status and bad[0].psn == 1
    assert bad[0].response_kind == "nak_remote_access" and f_aeth(bad[0].response) == (0x62, 1)
    assert f_psn(bad[0].response) == 1
    rc, qc = env.resp.counters, env.req.counters
    # MIDDLE and LAST of the bad WRITE and the WQE behind it reach a responder QP in ERR.
    assert rc.dropped == {"access_error": 1, "qp_not_ready": 3}
    assert qc.naks_received == {"remote_access": 1} and qc.flushed_wqes == 1 and qc.retransmitted_packets == 0
    assert env.req.qp_info(qa0)["state"] == QpState.ERR and env.resp.qp_info(env.ctx[0][1].qpn)["state"] == QpState.ERR
    assert env.req.qp_info(qa1)["state"] == QpState.RTS and env.resp.qp_info(env.ctx[1][1].qpn)["state"] == QpState.RTS
    # Posting to the QP in error completes at once with a flush error.
    env.req.post(qa0, build_write_wqe(3, qa0, DST, KEY, inline=b"late"))
    assert env.cqes(qa0)[-1] == (CqeOp.REQ_ERR, 3, 0, CqeSyndrome.WR_FLUSH_ERR)


def test_zero_length_write_needs_no_key():
    """IBA: the R_Key of a zero-length transfer is not checked (model/mr.py rule)."""
    req_ctx, resp = responder_only()
    r = resp.receive(build_rc_packet(req_ctx, A_PORT, Op.WRITE_ONLY, 0, b"", (0xDEAD, 0xBAD, 0)))
    assert r.accepted and r.writes == [] and f_aeth(r.response) == (0x1F, 1)


@pytest.mark.parametrize("case", ["middle_first", "first_short", "only_len_mismatch", "first_inside_message",
                                  "only_over_mtu"])
def test_invalid_request_nak(case):
    """Opcode-sequence and length errors of an in-sequence packet: NAK invalid request with its
    PSN, nothing written, responder QP to ERR; the requester maps it to REQ_ERR 0x12."""
    req_ctx, resp = responder_only()
    pre = []
    if case == "middle_first":
        f = build_rc_packet(req_ctx, A_PORT, Op.WRITE_MIDDLE, 0, b"m" * 256)
    elif case == "first_short":
        f = build_rc_packet(req_ctx, A_PORT, Op.WRITE_FIRST, 0, b"f" * 100, (DST, KEY, 600))
    elif case == "only_len_mismatch":
        f = build_rc_packet(req_ctx, A_PORT, Op.WRITE_ONLY, 0, b"o" * 100, (DST, KEY, 101))
    elif case == "only_over_mtu":
        f = build_rc_packet(req_ctx, A_PORT, Op.WRITE_ONLY, 0, b"o" * 257, (DST, KEY, 257))
    else:
        pre = [build_rc_packet(req_ctx, A_PORT, Op.WRITE_FIRST, 0, b"f" * 256, (DST, KEY, 600))]
        f = build_rc_packet(req_ctx, A_PORT, Op.WRITE_ONLY, 1, b"o" * 8, (DST + 0x1000, KEY, 8))
    for p in pre:
        assert resp.receive(p).accepted
    r = resp.receive(f)
    assert (r.accepted, r.reason, r.writes, r.response_kind) == (False, "invalid_request", [], "nak_invalid_request")
    assert f_aeth(r.response) == (0x61, 0) and f_psn(r.response) == len(pre)
    assert resp.qp_info(0x200)["state"] == QpState.ERR
    assert resp.receive(message_frames(req_ctx, len(pre) + 1, DST, b"z" * 8)[0]).reason == "qp_not_ready"

    # Requester side: a posted WRITE answered by this NAK.
    req = RcRequester(A_PORT, {0: CqContext(0, 4)}, lambda a, n: bytes(n))
    req.add_qp(req_ctx, timeout_ns=TIMEOUT)
    req.post(0x100, build_write_wqe(7, 0x100, DST, KEY, inline=b"12345678"))
    req.post(0x100, build_write_wqe(8, 0x100, DST, KEY, inline=b"next"))
    out = req.on_response(build_response(contexts(0x100, 0x200)[1], B_PORT, 0, Aeth.NAK_INVALID_REQ, 0), 5)
    assert out.kind == "nak_invalid_request"
    assert [(c.opcode, c.wqe_counter, c.syndrome) for c in req.completions] == [   # positions 0, 1
        (CqeOp.REQ_ERR, 0, CqeSyndrome.REMOTE_INVAL_REQ_ERR), (CqeOp.REQ_ERR, 1, CqeSyndrome.WR_FLUSH_ERR)]


def _without_ibta_pad(frame):
    """``frame`` (a 1..3-byte payload behind the BTH) as a peer that sends no IBTA pad
    would: PadCnt 0, the pad bytes gone, lengths, IP checksum and ICRC made again."""
    f = bytearray(frame[:-4 - (frame[OFF_BTH + 1] >> 4 & 3)])
    f[OFF_BTH + 1] = 0
    n = len(f) + 4
    f[16:18] = (n - 14).to_bytes(2, "big")
    f[38:40] = (n - 34).to_bytes(2, "big")
    f[24:26] = b"\0\0"
    f[24:26] = ipv4_checksum(f[14:34]).to_bytes(2, "big")
    return bytes(f) + icrc(bytes(f))


def test_short_frame_with_ethernet_padding():
    """A WRITE LAST with 1 byte is 62 bytes with its IBTA pad (3 bytes, PadCnt 3); sent
    without it (59 bytes) and padded to Ethernet's 60, it is still accepted (the IP length
    bounds the packet); a longer frame with a trailing byte is not."""
    req_ctx, resp = responder_only()
    fr = message_frames(req_ctx, 0, DST, bytes(range(256)) + b"!")
    assert len(fr[1]) == 54 + 1 + 3 + 4 and fr[1][OFF_BTH + 1] == 3 << 4 and fr[1][55:58] == bytes(3)
    short = _without_ibta_pad(fr[1])
    assert len(short) == 59
    check_frame(short)
    assert resp.receive(fr[0]).accepted
    r = resp.receive(short + b"\0")
    assert r.accepted and r.writes == [(DST + 256, b"!")]
    long_ = message_frames(req_ctx, 2, DST, b"x" * 8)[0] + b"\0"          # 83 bytes
    assert resp.receive(long_).reason == "bad_length"


def test_write_with_immediate():
    """WRITE ONLY_IMM and FIRST/MIDDLE/LAST_IMM: payload after the ImmDt lands at VA + offset,
    the immediate is reported with the message; scapy verifies the frames' ICRC."""
    req_ctx, resp = responder_only()
    data = bytes(range(256)) * 2 + b"tail"
    frames = [build_rc_packet(req_ctx, A_PORT, Op.WRITE_ONLY_IMM, 0, b"imm-only", (DST, KEY, 8), imm=0xDEADBEEF),
              build_rc_packet(req_ctx, A_PORT, Op.WRITE_FIRST, 1, data[:256], (DST + 0x1000, KEY, len(data))),
              build_rc_packet(req_ctx, A_PORT, Op.WRITE_MIDDLE, 2, data[256:512]),
              build_rc_packet(req_ctx, A_PORT, Op.WRITE_LAST_IMM, 3, data[512:], imm=0x01020304),
              build_rc_packet(req_ctx, A_PORT, Op.WRITE_ONLY_IMM, 4, b"", (0, 0xBAD, 0), imm=7)]
    for f in frames:
        check_frame(f)
    # ONLY_IMM: BTH, RETH, ImmDt, payload (hand offsets)
    assert frames[0][70:74] == bytes.fromhex("deadbeef") and frames[0][74:82] == b"imm-only"
    assert frames[3][54:58] == bytes.fromhex("01020304") and frames[3][50] == 0x80      # AckReq on LAST_IMM
    rs = [resp.receive(f) for f in frames]
    assert all(r.accepted for r in rs)
    assert [r.imm for r in rs] == [0xDEADBEEF, None, None, 0x01020304, 7]
    assert [w for r in rs for w in r.writes] == [(DST, b"imm-only"), (DST + 0x1000, data[:256]),
                                                 (DST + 0x1100, data[256:512]), (DST + 0x1200, b"tail")]
    assert resp.counters.imm_messages == 3 and resp.counters.messages == 3


# ---- bad frames ----------------------------------------------------------------------------
def _bad_frames(req_ctx, good):
    b = bytearray(good)
    icrc_bad = bytes(b[:80]) + bytes([b[80] ^ 1]) + bytes(b[81:])               # a payload byte
    ipck_bad = bytes(b[:24]) + bytes([b[24] ^ 0x40]) + bytes(b[25:])            # IPv4 checksum (ICRC-masked)
    mid = build_rc_packet(req_ctx, A_PORT, Op.WRITE_MIDDLE, 0, b"12345678")
    first_short = refresh(mid[:OFF_BTH] + bytes([Op.WRITE_FIRST]) + mid[OFF_BTH + 1:])   # RETH cut short
    send_only = refresh(good[:OFF_BTH] + bytes([0x04]) + good[OFF_BTH + 1:])          # SEND ONLY
    ud = refresh(good[:OFF_BTH] + bytes([0x64]) + good[OFF_BTH + 1:])                 # UD SEND ONLY
    port = refresh(good[:36] + (4792).to_bytes(2, "big") + good[38:])
    pkey = refresh(good[:OFF_BTH + 2] + b"\x7f\xff" + good[OFF_BTH + 4:])
    ack = build_response(req_ctx, A_PORT, 0, Aeth.ACK, 0)                           # an ACK sent to a responder
    other_qp = build_rc_packet(contexts(0x101, 0x201)[0], A_PORT, Op.WRITE_ONLY, 0, b"x" * 16, (DST, KEY, 16))
    init_qp = build_rc_packet(contexts(0x102, 0x202)[0], A_PORT, Op.WRITE_ONLY, 0, b"x" * 16, (DST, KEY, 16))
    return [(icrc_bad, "bad_icrc"), (ipck_bad, "bad_ip_checksum"), (good[:-1], "bad_length"),
            (good + b"\0", "bad_length"), (good[:50], "bad_length"), (first_short, "bad_length"),
            (send_only, "bad_opcode"), (ud, "bad_opcode"), (ack, "bad_opcode"), (port, "not_roce"),
            (pkey, "bad_pkey"), (other_qp, "qp_not_ready"), (init_qp, "qp_not_ready")]


def test_bad_frames_dropped_and_counted():
    """Bad ICRC, bad IPv4 checksum, wrong lengths, unknown opcodes, a QP that does not exist or
    is in INIT: dropped with their reason, no write, no response, the expected PSN unchanged."""
    req_ctx, resp = responder_only()
    resp.add_qp(contexts(0x102, 0x202, state_b=QpState.INIT)[1], pd=PD)
    good = build_rc_packet(req_ctx, A_PORT, Op.WRITE_ONLY, 0, bytes(range(40)), (DST, KEY, 40))
    cases = _bad_frames(req_ctx, good)
    for f, reason in cases:
        r = resp.receive(f)
        assert (r.accepted, r.reason, r.writes, r.response) == (False, reason, [], None), reason
        assert parse_frame(f, WRITE_OPCODES)[1] == (reason if reason != "qp_not_ready" else None)
    want = {}
    for _, reason in cases:
        want[reason] = want.get(reason, 0) + 1
    assert dict(resp.counters.dropped) == want
    assert resp.qp_info(0x200)["epsn"] == 0 and resp.counters.accepted == 0 and resp.counters.acks_sent == 0
    r = resp.receive(good)
    assert r.accepted and r.writes == [(DST, bytes(range(40)))]


# ---- requester: go-back-N, timeouts, retries --------------------------------------------------
def test_single_drop_nak_go_back_n_by_hand():
    """Six 8-byte WRITEs, ack_every 1, data frame 2 dropped. Responder: ACK 0, ACK 1, frame 3
    -> NAK(2), frames 4, 5 dropped silently. Requester: NAK -> resend PSN 2..5 (4 packets),
    each ACKed. Link: 6 + 4 data frames, 2 + 1 + 4 responses; no timeout."""
    env = Env(ack_every=1)
    for k in range(6):
        env.write(0, DST + 0x100 * k, 8, src_off=8 * k)
    res = env.run(faults=[(2, "drop")])
    assert not res.hung
    fr = req_frames(res)
    assert [f_psn(f) for f in fr] == [0, 1, 2, 3, 4, 5, 2, 3, 4, 5]
    assert fr[6:] == fr[2:6]                      # retransmissions byte-identical to the originals
    rs = resp_frames(res)
    assert [(f_psn(f), f_aeth(f)) for f in rs] == [(0, (0x1F, 1)), (1, (0x1F, 2)), (2, (0x60, 2)),
                                                   (2, (0x1F, 3)), (3, (0x1F, 4)), (4, (0x1F, 5)), (5, (0x1F, 6))]
    rc, qc = env.resp.counters, env.req.counters
    assert rc.dropped == {"psn_out_of_order": 3} and rc.naks_sent == {"nak_psn_seq": 1} and rc.accepted == 6
    assert (qc.retransmitted_packets, qc.go_back_n, qc.timeouts, qc.naks_received) == (4, 1, 0, {"psn_seq": 1})
    assert qc.payload_reread_bytes == 4 * 8                # pointer payloads read again
    assert env.cqes(0x100) == [(CqeOp.REQ, k, 8, 0) for k in range(6)]
    assert sorted((a, d) for *_, a, d in res.writes) == sorted(expected_chunks(env.msgs, 256))


def test_lost_ack_timeout_duplicate_reack():
    """One 8-byte WRITE whose ACK is lost: the timer fires once at post + timeout, the resent
    packet is a duplicate (not written again) and is re-ACKed; the WQE completes."""
    env = Env(ack_every=1)
    env.write(0, DST, 8)
    res = env.run(response_faults=[(0, "drop")])
    assert not res.hung
    rc, qc = env.resp.counters, env.req.counters
    assert (qc.timeouts, qc.retransmitted_packets, rc.dropped, rc.acks_sent) == (1, 1, {"psn_duplicate": 1}, 2)
    assert len(res.writes) == 1
    assert [r.time for r in res.records if r.direction == "req"] == [0, TIMEOUT]
    assert env.cqes(0x100) == [(CqeOp.REQ, 0, 8, 0)]


def test_progress_restores_the_retry_budget():
    """retry_cnt 1: WRITE 0's first frame is lost (one timeout, one retry, then ACKed); WRITE 1,
    posted later, loses its first frame too. Its retry is allowed because the ACK of WRITE 0
    reset the counter; without the reset it would be the second retry and fail."""
    env = Env(ack_every=1, retry_cnt=1)
    env.write(0, DST, 8)
    env.write(0, DST + 0x100, 8, src_off=8)
    env.posts[1] = (3 * TIMEOUT,) + env.posts[1]
    res = env.run(faults=[(0, "drop"), (2, "drop")])
    assert not res.hung
    assert env.req.counters.timeouts == 2 and env.req.counters.retry_exceeded == 0
    assert env.cqes(0x100) == [(CqeOp.REQ, 0, 8, 0), (CqeOp.REQ, 1, 8, 0)]
    assert [r.time for r in res.records if r.direction == "req"] == [0, TIMEOUT, 3 * TIMEOUT, 4 * TIMEOUT]


@pytest.mark.parametrize("lose", ["data", "acks"])
def test_retry_exhaustion(lose):
    """retry_cnt 3 and every data frame (or every response) lost: timeouts at T, 2T, 3T resend
    the 3 outstanding packets (300 B = 2 packets, 8 B = 1); the 4th timeout, at 4T, fails the
    first WQE with TRANSPORT_RETRY_EXC_ERR (0x15) and flushes the second (0x05)."""
    env = Env(ack_every=1, retry_cnt=3)
    env.write(0, DST, 300)
    env.write(0, DST + 0x1000, 8, src_off=300)
    lost = [(i, "drop") for i in range(40)]
    res = env.run(faults=lost if lose == "data" else (), response_faults=lost if lose == "acks" else ())
    assert not res.hung and res.end_time == 4 * TIMEOUT
    qc = env.req.counters
    assert (qc.timeouts, qc.go_back_n, qc.retransmitted_packets, qc.retry_exceeded) == (4, 3, 9, 1)
    assert qc.payload_reread_bytes == 3 * 308
    assert env.cqes(0x100) == [(CqeOp.REQ_ERR, 0, 0, CqeSyndrome.TRANSPORT_RETRY_EXC_ERR),
                               (CqeOp.REQ_ERR, 1, 0, CqeSyndrome.WR_FLUSH_ERR)]
    assert env.req.qp_info(0x100)["state"] == QpState.ERR
    fr = req_frames(res)
    assert len(fr) == 12 and fr[3:6] == fr[0:3] == fr[6:9] == fr[9:12]
    rc = env.resp.counters
    if lose == "acks":      # each byte written once, the resent packets are duplicates
        assert rc.accepted == 3 and rc.dropped == {"psn_duplicate": 9} and len(res.writes) == 3
    else:
        assert rc.rx_frames == 0 and res.writes == []


def test_invalid_wqe_errors_after_earlier_work_and_flushes():
    """An unsupported-opcode WQE stops sending; once the WRITE before it is ACKed it completes
    with LOCAL_QP_OP_ERR (0x02), the QP goes to ERR and the WRITE behind it is flushed unsent."""
    req_ctx, resp_ctx = contexts(0x100, 0x200)
    req = RcRequester(A_PORT, {0: CqContext(0, 4)}, lambda a, n: bytes(n))
    req.add_qp(req_ctx, timeout_ns=TIMEOUT)
    assert len(req.post(0x100, build_write_wqe(0, 0x100, DST, KEY, inline=b"first"))) == 1
    assert req.post(0x100, build_ctrl(WqeOp.SEND, 1, 0x100, 1) + bytes(48)) == []
    assert req.post(0x100, build_write_wqe(2, 0x100, DST, KEY, inline=b"third")) == []
    assert req.completions == [] and req.qp_info(0x100)["outstanding"] == 1
    req.on_response(build_response(resp_ctx, B_PORT, 0, Aeth.ACK, 1), 100)
    assert [(c.opcode, c.wqe_counter, c.byte_cnt, c.syndrome) for c in req.completions] == [
        (CqeOp.REQ, 0, 5, 0), (CqeOp.REQ_ERR, 1, 0, CqeSyndrome.LOCAL_QP_OP_ERR),
        (CqeOp.REQ_ERR, 2, 0, CqeSyndrome.WR_FLUSH_ERR)]
    assert req.counters.packets_sent == 1


def test_requester_ignores_stale_and_duplicate_responses():
    """ACKs naming no outstanding PSN and a repeated PSN NAK change nothing (counted by reason)."""
    req_ctx, resp_ctx = contexts(0x100, 0x200)
    req = RcRequester(A_PORT, {0: CqContext(0, 4)}, lambda a, n: bytes(n))
    req.add_qp(req_ctx, timeout_ns=TIMEOUT)
    tx = req.post(0x100, build_write_wqe(0, 0x100, DST, KEY, addr=0, length=700))     # PSN 0, 1, 2
    assert [t.psn for t in tx] == [0, 1, 2]
    ack = lambda psn, msn: build_response(resp_ctx, B_PORT, psn, Aeth.ACK, msn)  # noqa: E731
    nak = build_response(resp_ctx, B_PORT, 1, Aeth.NAK_PSN_SEQ, 0)
    assert req.on_response(ack(PSN_MASK, 0), 1).reason == "stale"          # the PSN before the first
    assert req.on_response(ack(5, 0), 1).reason == "psn_ahead"             # never sent
    out = req.on_response(nak, 2)                                          # acks PSN 0, resends 1, 2
    assert [t.psn for t in out.retransmit] == [1, 2] and all(t.retransmit for t in out.retransmit)
    assert [t.frame for t in out.retransmit] == [t.frame for t in tx[1:]]
    assert req.on_response(nak, 3).reason == "duplicate_nak"
    assert req.qp_info(0x100)["una"] == 1 and req.counters.retransmitted_packets == 2
    assert req.on_response(ack(2, 1), 4).cqes[0].wqe_counter == 0
    assert req.idle() and req.next_deadline() is None and req.counters.msn_mismatches == 0
    assert req.counters.dropped_responses == {"stale": 1, "psn_ahead": 1, "duplicate_nak": 1}


# ---- random fault patterns -----------------------------------------------------------------
@pytest.mark.parametrize("rate", [0.001, 0.01, 0.05])
def test_random_faults_deliver_exactly_once(rate):
    """Three QP pairs (one starting just below the PSN wrap), 360 WRITEs of 0..1200 bytes
    (pointer and inline, some unsignalled), faults of every kind on both links at ``rate``:
    every message lands exactly once and intact, every CQE arrives in order with no error,
    nothing hangs, and the counters agree with the faults injected."""
    rnd = random.Random(int(rate * 10000) + 7)
    env = Env(pairs=3, ack_every=3, seed=3, psn=[0, 1000, PSN_MASK - 20])       # pair 2 wraps
    for k in range(360):
        i = k % 3
        raddr = DST + k * 0x1000 + rnd.randrange(64)
        if rnd.random() < 0.25:
            env.write(i, raddr, inline=bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 61))),
                      signalled=k >= 357 or rnd.random() < 0.7)
        else:
            env.write(i, raddr, rnd.randrange(0, 1201), src_off=rnd.randrange(4096),
                      signalled=k >= 357 or rnd.random() < 0.7)
    npk = sum(len(split_message(len(m[3]), 256)) for m in env.msgs)

    def pattern(n, sure):
        # Faults at ``rate`` over the first n frames, and at least one among the first
        # ``sure`` frames, which are always sent (npk data packets; one ACK per message).
        out = [(j, rnd.choice(FAULT_KINDS)) for j in range(n) if rnd.random() < rate]
        if not any(j < sure for j, _ in out):
            j = rnd.randrange(sure)
            out = sorted([x for x in out if x[0] != j] + [(j, rnd.choice(FAULT_KINDS))])
        return out
    faults, response_faults = pattern(4 * npk, npk), pattern(4 * npk, len(env.msgs))
    res = env.run(faults, response_faults)
    assert not res.hung and env.req.idle()
    assert sum(res.faults["req"].values()) >= 1 and sum(res.faults["resp"].values()) >= 1   # the test tests something

    # Exactly once and intact.
    assert sorted((a, d) for *_, a, d in res.writes) == sorted(expected_chunks(env.msgs, 256))
    for _, _, raddr, payload, _ in env.msgs:
        assert res.memory.read(raddr, len(payload)) == payload
    # Every CQE, in order, no error.
    for a, _ in env.ctx:
        want = [(CqeOp.REQ, idx, len(p), 0) for q, idx, _, p, s in env.msgs if q == a.qpn and s]
        assert env.cqes(a.qpn) == want
        assert env.req.qp_info(a.qpn)["state"] == QpState.RTS

    rc, qc = env.resp.counters, env.req.counters
    fq, fr = res.faults["req"], res.faults["resp"]
    sent_req, sent_resp = req_frames(res), resp_frames(res)
    assert rc.accepted == npk and rc.messages == len(env.msgs) and qc.msn_mismatches == 0
    assert len(sent_req) == qc.packets_sent + qc.retransmitted_packets and qc.packets_sent == npk
    assert len(sent_resp) == rc.acks_sent + sum(rc.naks_sent.values())
    assert rc.rx_frames == len(sent_req) - fq["drop"] + fq["duplicate"]
    assert (qc.acks_received + sum(qc.naks_received.values()) + sum(qc.dropped_responses.values())
            == len(sent_resp) - fr["drop"] + fr["duplicate"])
    assert rc.dropped["bad_icrc"] == fq["corrupt"] and qc.dropped_responses["bad_icrc"] == fr["corrupt"]
    assert set(rc.dropped) <= {"bad_icrc", "psn_duplicate", "psn_out_of_order"}
    assert set(qc.dropped_responses) <= {"bad_icrc", "stale", "duplicate_nak"}
    assert set(qc.naks_received) <= {"psn_seq"}
    if fq["drop"] + fq["corrupt"]:
        assert qc.retransmitted_packets > 0
    if not faults and not response_faults:
        assert qc.retransmitted_packets == qc.timeouts == 0
    # Retransmissions are byte-identical to the first transmission of their PSN.
    first = {}
    for f in sent_req:
        assert first.setdefault((f_dqpn(f), f_psn(f)), f) == f
    assert sum(fq.values()) == len([j for j, _ in faults if j < len(sent_req)])
    assert sum(fr.values()) == len([j for j, _ in response_faults if j < len(sent_resp)])


def test_fault_pattern_checks():
    env = Env()
    env.write(0, DST, 8)
    with pytest.raises(ValueError, match="kind"):
        env.run(faults=[(0, "explode")])
    with pytest.raises(ValueError, match="two faults"):
        env.run(faults=[(0, "drop"), (0, "delay")])
    with pytest.raises(ValueError, match="24-bit"):
        build_response(contexts(1, 2)[1], B_PORT, 1 << 24, Aeth.ACK, 0)
    with pytest.raises(ValueError, match="retry_cnt"):
        env.req.add_qp(contexts(0x300, 0x400)[0], retry_cnt=8)
    with pytest.raises(ValueError, match="ack_every"):
        RcResponder(B_PORT, ack_every=0)


def test_simulate_runs_over_network_links():
    """``simulate``'s links are model.network.Link (cycles of 2 ns, 100 wire bytes a cycle)
    and its faults FaultSpec pattern entries, (index, kind) or (index, kind, arg). One 8-byte
    WRITE: an 82-byte frame, 106 wire bytes; an ACK: 62 bytes, 86 wire bytes; latency 200 ns =
    100 cycles = 10000 wire bytes. Times in ns (cycle x 2)."""
    def one(faults):
        env = Env(ack_every=1)
        env.write(0, DST, 8)
        res = env.run(faults=faults, latency_ns=200)
        assert not res.hung and isinstance(res.links["req"], Link) and isinstance(res.links["resp"], Link)
        return env, res

    # No fault: the frame's wire end is byte 106 (cycle 2), in at byte 10106: cycle 102, 204 ns.
    # The ACK leaves at 204 ns = byte 10200, ends at 10286, in at 20286: cycle 203, 406 ns.
    _, res = one(())
    assert [(r.direction, r.time, r.arrival) for r in res.records] == [("req", 0, 204), ("resp", 204, 406)]
    assert res.end_time == 406 and res.links["req"].log == [] and res.links["req"].latency_cycles == 100

    # Delay by 10 cycles (the pattern's arg): held from cycle 2 to 12, leaves with its wire end at
    # byte 1200, in at 11200: cycle 112, 224 ns. The ACK: bytes 11200..11286, in at 21286: 426 ns.
    _, res = one([(0, "delay", 10)])
    assert [(r.direction, r.time, r.arrival, r.fault) for r in res.records] == [
        ("req", 0, 224, "delay"), ("resp", 224, 426, None)]
    assert res.links["req"].log == [FaultEvent(0, "delay", 2, 10)] and res.faults["req"] == {"delay": 1}

    # Duplicate: the copy right behind the frame (wire end 212, in at 10212: cycle 103, 206 ns);
    # its re-ACK leaves at 206 ns = byte 10300, ends 10386, in at 20386: cycle 204, 408 ns.
    env, res = one([(0, "duplicate")])
    assert [(r.psn, r.reason) for r in res.rx] == [(0, None), (0, "psn_duplicate")]
    assert [w[0] for w in res.writes] == [204]
    assert [(r.direction, r.time, r.arrival) for r in res.records] == [
        ("req", 0, 204), ("resp", 204, 406), ("resp", 206, 408)]

    # Corrupt with its bit (byte 60, in the RETH) or without (CORRUPT_BIT, the last bit of the
    # BTH): bad ICRC, nothing else shows the loss, the ACK timer resends at TIMEOUT.
    for faults, bit in (([(0, "corrupt", 8 * 60)], 480), ([(0, "corrupt")], 8 * (42 + 12) - 1)):
        env, res = one(faults)
        assert CORRUPT_BIT == 431 and res.links["req"].log == [FaultEvent(0, "corrupt", 2, bit)]
        assert res.rx[0].reason == "bad_icrc" and env.req.counters.timeouts == 1
        assert [r.time for r in res.records if r.direction == "req"] == [0, TIMEOUT]

    with pytest.raises(ValueError, match="latency_ns must be an even int"):
        Env().run(latency_ns=201)             # 100.5 cycles: no rounding


def test_responder_fork_equals_deepcopy():
    """``RcResponder.fork`` (the fuzzer's trial copy) behaves as a deep copy: on the
    fuzzer's receive frames, each frame given to a fork and to a deep copy of the same
    model gives the same result, and both leave the original untouched."""
    import copy
    from dataclasses import asdict
    from tb.suites.fuzz import receive_plan
    plan = receive_plan(5, 400)
    m = plan.make_model()
    acks = set(plan.acks)
    for k, f in enumerate(plan.frames):
        if k in acks:
            continue
        before = copy.deepcopy(m)
        a, b = m.fork(), copy.deepcopy(m)
        ra, rb = a.receive(f), b.receive(f)
        assert ra == rb, k
        assert {n: asdict(q) for n, q in a.qps.items()} == {n: asdict(q) for n, q in b.qps.items()}, k
        assert asdict(a.counters) == asdict(b.counters) and a.completions == b.completions, k
        assert {n: asdict(q) for n, q in m.qps.items()} == {n: asdict(q) for n, q in before.qps.items()}, k
        assert asdict(m.counters) == asdict(before.counters), k
        m.receive(f)
