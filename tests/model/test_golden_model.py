"""Unit tests of the golden model (model/) and the scapy checker (tb/roce_check.py).

No simulator. Expected values come from scapy builds, zlib directly, struct-packed
bytes written out by hand here, or arithmetic from SPEC.md, never from model/.
"""

import struct
import zlib

import pytest
from scapy.compat import raw
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from model.cqe import CqContext, CqModel, build_cqe, parse_cqe
from spec.formats import WqeOp
from model.engine import EngineModel
from model.frames import (Port, QpContext, build_nop_wqe, build_write_frames, build_write_wqe,
                          parse_wqe, split_message)
from model.icrc import icrc, ipv4_checksum
from tb.roce_check import RETH, check_frame, diff_cqe, diff_frames, field_at

SMAC, SIP = "02:00:00:00:00:01", "192.168.0.1"
DMAC, DIP = "02:00:00:00:00:02", "192.168.0.2"
PORT = Port(smac=0x020000000001, sip=0xC0A80001)


def qp_ctx(qpn=0x16345, remote=0x00ABCD, psn=100, mtu=4096, cqn=0, **kw):
    return QpContext(qpn=qpn, remote_qpn=remote, dmac=0x020000000002, dip="192.168.0.2",
                     start_psn=psn, mtu=mtu, cqn=cqn, **kw)


def scapy_write(qpn, remote, op, psn, payload, reth=None, ackreq=None):
    """Independent reference frame built with scapy's own layers."""
    ack = (op in (0x08, 0x0A)) if ackreq is None else ackreq
    p = (Ether(dst=DMAC, src=SMAC) / IP(src=SIP, dst=DIP, id=0, flags="DF", ttl=64, tos=0)
         / UDP(sport=0xC000 | (qpn & 0x3FFF), dport=4791, chksum=0)
         / BTH(opcode=op, dqpn=remote, ackreq=int(ack), psn=psn))
    if reth is not None:
        p = p / RETH(va=reth[0], rkey=reth[1], dlen=reth[2])
    return raw(p / Raw(payload)) if payload else raw(p)


class Memory:
    """Sparse GPU memory: dict of base -> bytes."""

    def __init__(self):
        self.regions = {}

    def add(self, addr, data):
        self.regions[addr] = bytes(data)

    def read(self, addr, n):
        for base, data in self.regions.items():
            if base <= addr and addr + n <= base + len(data):
                return data[addr - base:addr - base + n]
        raise KeyError(f"unmapped read {addr:#x}+{n}")


def hand_ctrl(opcode, index, qpn, ds, fm=0x08, opmod=0):
    # bytes 0-3 opmod|idx|opcode, 4-7 qpn|ds, 8 signature, 9-10 rsvd, 11 fm_ce_se, 12-15 imm
    return struct.pack(">IIB2xBI", (opmod << 24) | (index << 8) | opcode, (qpn << 8) | ds, 0, fm, 0)


def hand_cqe(opcode, qpn, counter, byte_cnt, owner, syndrome=0, wqe_op=0, uidx=0):
    b = bytearray(64)
    b[32:36] = struct.pack(">I", uidx)
    b[44:48] = struct.pack(">I", byte_cnt)
    b[55] = syndrome
    b[56:60] = struct.pack(">I", wqe_op << 24 | qpn & 0xFFFFFF)
    b[60:62] = struct.pack(">H", counter)
    b[63] = (opcode << 4) | owner
    return bytes(b)


# ---- ICRC and IPv4 checksum ---------------------------------------------------------
@pytest.mark.parametrize("tos,ttl,fecn,plen", [(0, 64, 0, 0), (0, 64, 0, 24), (0xB8, 3, 1, 5), (0, 255, 0, 4096)])
def test_icrc_matches_scapy(tos, ttl, fecn, plen):
    # Masked fields (TOS, TTL, FECN byte) must not change the ICRC; scapy computes it itself.
    p = (Ether(dst=DMAC, src=SMAC) / IP(src=SIP, dst=DIP, tos=tos, ttl=ttl)
         / UDP(sport=0xC001, dport=4791, chksum=0x1234)
         / BTH(opcode=0x0A, dqpn=7, psn=9, fecn=fecn) / RETH(va=1, rkey=2, dlen=plen)
         / Raw(bytes((i * 7) & 0xFF for i in range(plen))))
    f = raw(p)
    assert icrc(f[:-4]) == f[-4:]


def test_icrc_hand_formula():
    f = bytes(range(100))                      # arbitrary bytes; only the formula matters
    m = bytearray(f)
    for off in (15, 22, 24, 25, 40, 41, 46):   # TOS, TTL, IP csum, UDP csum, BTH byte 4
        m[off] = 0xFF
    assert icrc(f) == struct.pack("<I", zlib.crc32(b"\xff" * 8 + bytes(m[14:])))


def test_ipv4_checksum():
    # Textbook example header: 4500 0073 0000 4000 4011 [b861] c0a8 0001 c0a8 00c7
    h = bytes.fromhex("450000730000400040110000c0a80001c0a800c7")
    assert ipv4_checksum(h) == 0xB861
    assert ipv4_checksum(h[:10] + b"\xb8\x61" + h[12:]) == 0xB861   # stored value ignored
    s = raw(IP(src="10.1.2.3", dst="10.9.8.7", len=1234, id=0, flags="DF", ttl=64, proto=17))
    assert ipv4_checksum(s) == int.from_bytes(s[10:12], "big")
    with pytest.raises(ValueError):
        ipv4_checksum(h[:19])


# ---- frames ---------------------------------------------------------------------------
def test_inline_write_8_bytes_frame():
    data = b"\x11\x22\x33\x44\x55\x66\x77\x88"
    qp = qp_ctx(psn=0x42)
    wqe = hand_ctrl(0x08, 7, qp.qpn, 3) + struct.pack(">QII", 0xDEADBEEF000, 0x5555, 0) \
        + struct.pack(">I", 8 | 0x80000000) + data + b"\0" * 4
    wqe += b"\0" * (64 - len(wqe))
    cq = CqContext(cqn=0, log_depth=4)
    res = EngineModel(PORT, {qp.qpn: qp}, {0: cq}, Memory().read).run([(qp.qpn, wqe)])
    frames = res.frame_bytes(qp.qpn)
    assert len(frames) == 1
    # SPEC section 6: WRITE ONLY frame = 74 + p bytes without FCS (ICRC included), wire = 98 + p.
    assert len(frames[0]) == 74 + 8 == 82
    assert res.totals.wire_bytes == 106 and res.totals.frame_bytes == 82
    assert frames[0] == scapy_write(qp.qpn, 0x00ABCD, 0x0A, 0x42, data, reth=(0xDEADBEEF000, 0x5555, 8))
    d = check_frame(frames[0])
    assert (d["opcode"], d["psn"], d["dqpn"], d["ackreq"]) == (0x0A, 0x42, 0xABCD, 1)
    assert (d["va"], d["rkey"], d["dma_len"], d["payload"]) == (0xDEADBEEF000, 0x5555, 8, data)
    assert d["sport"] == 0xC000 | 0x2345 and d["flags_frag"] == 0x4000 and d["ttl"] == 64
    # wqe_counter is the WQE's position in the send queue (0), not its ctrl index field (7)
    assert res.cqes[0][0].cqe == hand_cqe(0, qp.qpn, 0, 8, 0, wqe_op=0x08)


def test_split_10000_mtu_4096_with_psn_wrap():
    size, raddr, addr = 10000, 0x7F0000001000, 0x100000
    payload = bytes((i * 13 + 5) & 0xFF for i in range(size))
    mem = Memory()
    mem.add(addr, payload)
    qp = qp_ctx(psn=(1 << 24) - 2)
    wqe = hand_ctrl(0x08, 3, qp.qpn, 3) + struct.pack(">QII", raddr, 0x77, 0) \
        + struct.pack(">IIQ", size, 0x99, addr) + b"\0" * 16
    res = EngineModel(PORT, {qp.qpn: qp}, {0: CqContext(0, 3)}, mem.read).run([(qp.qpn, wqe)])
    recs = res.frames[qp.qpn]
    assert [r.bth_opcode for r in recs] == [0x06, 0x07, 0x08]
    assert [r.psn for r in recs] == [(1 << 24) - 2, (1 << 24) - 1, 0]
    assert res.next_psn[qp.qpn] == 1
    assert [len(r.frame) for r in recs] == [70 + 4096 + 4, 54 + 4096 + 4, 54 + 1808 + 4]
    ds = [check_frame(r.frame) for r in recs]
    assert [len(d["payload"]) for d in ds] == [4096, 4096, 1808]
    assert b"".join(d["payload"] for d in ds) == payload
    assert [d["ackreq"] for d in ds] == [0, 0, 1]
    assert (ds[0]["va"], ds[0]["rkey"], ds[0]["dma_len"]) == (raddr, 0x77, 10000)
    assert ds[1]["va"] is None and ds[2]["dma_len"] is None
    expect = [scapy_write(qp.qpn, 0xABCD, 0x06, (1 << 24) - 2, payload[:4096], reth=(raddr, 0x77, size)),
              scapy_write(qp.qpn, 0xABCD, 0x07, (1 << 24) - 1, payload[4096:8192]),
              scapy_write(qp.qpn, 0xABCD, 0x08, 0, payload[8192:])]
    assert [r.frame for r in recs] == expect
    t = res.totals
    assert (t.messages, t.payload_bytes, t.packets) == (1, 10000, 3)
    assert t.frame_bytes == 4170 + 4154 + 1866 and t.wire_bytes == t.frame_bytes + 3 * 24
    assert res.cqes[0][0].cqe == hand_cqe(0, qp.qpn, 0, 10000, 0, wqe_op=0x08)   # the position, not the field (3)


@pytest.mark.parametrize("length,mtu,expect", [
    (0, 256, [(0x0A, 0, 0)]), (256, 256, [(0x0A, 0, 256)]),
    (257, 256, [(0x06, 0, 256), (0x08, 256, 1)]),
    (1024, 512, [(0x06, 0, 512), (0x08, 512, 512)]),
    (1025, 512, [(0x06, 0, 512), (0x07, 512, 512), (0x08, 1024, 1)]),
])
def test_split_message(length, mtu, expect):
    assert split_message(length, mtu) == expect


def test_bad_inputs_raise_value_error():
    with pytest.raises(ValueError):
        qp_ctx(mtu=1000)
    with pytest.raises(ValueError):
        qp_ctx(psn=1 << 24)
    with pytest.raises(ValueError):
        parse_wqe(b"\0" * 8)
    with pytest.raises(ValueError):
        build_cqe(0, 1 << 24, 0)


# ---- WQE parsing ------------------------------------------------------------------------
def test_parse_inline_crossing_wqebbs():
    data = bytes(range(100))
    ds = 2 + (4 + 100 + 15) // 16      # 9 units -> 3 WQEBBs
    wqe = hand_ctrl(0x08, 0xBEEF, 0x42, ds, fm=0x08) + struct.pack(">QII", 0x1000, 9, 0) \
        + struct.pack(">I", 100 | 0x80000000) + data
    wqe += b"\0" * (192 - len(wqe))
    w = parse_wqe(wqe)
    assert w.valid and w.kind == "inline" and w.inline_data == data and w.length == 100
    assert (w.index, w.qpn, w.ds, w.num_wqebbs, w.raddr, w.rkey, w.cq_update) == (0xBEEF, 0x42, 9, 3, 0x1000, 9, True)
    assert wqe == build_write_wqe(0xBEEF, 0x42, 0x1000, 9, inline=data)


def test_parse_pointer_and_nop():
    wqe = hand_ctrl(0x08, 1, 2, 3, fm=0) + struct.pack(">QII", 5, 6, 0) + struct.pack(">IIQ", 300, 7, 0xABC0)
    w = parse_wqe(wqe + b"\0" * 16)
    assert (w.kind, w.length, w.lkey, w.addr, w.cq_update, w.valid) == ("pointer", 300, 7, 0xABC0, False, True)
    assert wqe + b"\0" * 16 == build_write_wqe(1, 2, 5, 6, addr=0xABC0, lkey=7, length=300, cq_update=False)
    n = parse_wqe(hand_ctrl(0x00, 9, 2, 1) + b"\0" * 48)
    assert n.valid and n.opcode == 0 and n.index == 9 and n.cq_update
    assert build_nop_wqe(9, 2) == hand_ctrl(0x00, 9, 2, 1) + b"\0" * 48


@pytest.mark.parametrize("wqe", [
    hand_ctrl(0x0A, 4, 2, 3) + b"\0" * 48,                                       # SEND: unsupported
    hand_ctrl(0x08, 4, 2, 1) + b"\0" * 48,                                       # WRITE, ds < 2
    hand_ctrl(0x08, 4, 2, 4) + struct.pack(">QII", 0, 0, 0)
    + struct.pack(">IIQ", 8, 0, 0) * 2 + b"\0" * 0,                              # two data segments
    hand_ctrl(0x08, 4, 2, 3) + struct.pack(">QII", 0, 0, 0)
    + struct.pack(">I", 40 | 0x80000000) + b"\0" * 28,                           # inline overruns ds
])
def test_parse_errors(wqe):
    assert not parse_wqe(wqe).valid


# ---- CQ ---------------------------------------------------------------------------------
def test_cqe_layout():
    assert build_cqe(0, 0x123456, 0xABCD, 4096, 1) == hand_cqe(0, 0x123456, 0xABCD, 4096, 1)
    assert build_cqe(13, 0x123456, 7, 0, 0, 5, wqe_opcode=0x10, user_index=0xABCDEF) == \
        hand_cqe(13, 0x123456, 7, 0, 0, 5, wqe_op=0x10, uidx=0xABCDEF)
    e = build_cqe(13, 5, 2, 0, 0, syndrome=2)
    assert e[63] == 0xD0 and e[55] == 2 and e[54] == 0 and e[62] == 0
    assert parse_cqe(e)["qpn"] == 5 and parse_cqe(e)["opcode"] == 13


def test_cq_owner_flips_per_wrap():
    cq = CqModel(CqContext(cqn=1, log_depth=2, base=0x4000))
    recs = [cq.push(0, 3, i) for i in range(10)]
    assert [r.slot for r in recs] == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert [r.owner for r in recs] == [0, 0, 0, 0, 1, 1, 1, 1, 0, 0]
    assert [r.address for r in recs[:5]] == [0x4000, 0x4040, 0x4080, 0x40C0, 0x4000]
    buf = cq.buffer()
    assert len(buf) == 4 * 64
    # slots 0,1 last written by k=8,9 (owner 0), slots 2,3 by k=6,7 (owner 1)
    assert [buf[64 * s + 63] for s in range(4)] == [0, 0, 1, 1]
    assert [struct.unpack(">H", buf[64 * s + 60:64 * s + 62])[0] for s in range(4)] == [8, 9, 6, 7]


def test_collapsed_cq_always_slot_0():
    cq = CqModel(CqContext(cqn=0, log_depth=1, collapsed=True))
    recs = [cq.push(0, 3, i) for i in range(5)]
    assert [r.slot for r in recs] == [0] * 5
    assert [r.owner for r in recs] == [0, 0, 1, 1, 0]
    buf = cq.buffer()
    assert buf[:64] == hand_cqe(0, 3, 4, 0, 0)
    assert buf[64:] == b"\xff" * 64


# ---- engine semantics ---------------------------------------------------------------------
def test_error_wqe_semantics():
    a, b = qp_ctx(qpn=1, psn=0), qp_ctx(qpn=2, psn=50, user_index=0x2222)
    eng = EngineModel(PORT, {1: a, 2: b}, {0: CqContext(0, 4)}, Memory().read)
    posts = [
        (1, build_write_wqe(0, 1, 0x100, 1, inline=b"abcd")),
        (1, hand_ctrl(0x0A, 1, 1, 3, fm=0) + b"\0" * 48),        # SEND, no CQ_UPDATE: still an error CQE
        (2, build_write_wqe(0, 2, 0x200, 1, inline=b"xy")),
        (1, build_write_wqe(2, 1, 0x100, 1, inline=b"lost", cq_update=False)),  # after the error: flushed,
        (1, build_nop_wqe(3, 1)),                                # signaled or not; nothing sent
        (2, build_nop_wqe(1, 2)),
    ]
    res = eng.run(posts)
    assert [r.status for r in eng.results] == ["sent", "error", "sent", "flushed", "flushed", "nop"]
    assert [r.psn for r in res.frames[1]] == [0]
    assert [r.psn for r in res.frames[2]] == [50]
    assert res.qp_error == {1: True, 2: False}
    assert [r.cqe for r in res.cqes[0]] == [
        hand_cqe(0, 1, 0, 4, 0, wqe_op=0x08), hand_cqe(13, 1, 1, 0, 0, syndrome=2, wqe_op=0x0A),
        hand_cqe(0, 2, 0, 2, 0, wqe_op=0x08, uidx=0x2222), hand_cqe(13, 1, 2, 0, 0, syndrome=5, wqe_op=0x08),
        hand_cqe(13, 1, 3, 0, 0, syndrome=5), hand_cqe(0, 2, 1, 0, 0, uidx=0x2222)]
    t = res.totals
    assert (t.messages, t.packets, t.cqes, t.error_cqes, t.wqes_executed, t.flushed_wqes) == (2, 2, 6, 3, 3, 2)


def test_no_cqe_without_cq_update_and_nop_sends_nothing():
    qp = qp_ctx(qpn=3)
    res = EngineModel(PORT, {3: qp}, {0: CqContext(0, 2)}, Memory().read).run([
        (3, build_write_wqe(0, 3, 0, 0, inline=b"z", cq_update=False)),
        (3, build_nop_wqe(1, 3, cq_update=False)),
        (3, build_nop_wqe(2, 3)),
    ])
    assert len(res.frames[3]) == 1
    assert [r.cqe for r in res.cqes[0]] == [hand_cqe(0, 3, 2, 0, 0)]


def test_shared_cq_reorder():
    a, b = qp_ctx(qpn=1), qp_ctx(qpn=2)
    eng = EngineModel(PORT, {1: a, 2: b}, {0: CqContext(0, 1)}, Memory().read)
    eng.run([(1, build_nop_wqe(0, 1)), (1, build_nop_wqe(1, 1)), (2, build_nop_wqe(0, 2))])
    cq = eng.cq_for_order(0, [2, 1, 1])
    assert [(r.qpn, r.wqe_counter, r.slot, r.owner) for r in cq.records] == [(2, 0, 0, 0), (1, 0, 1, 0), (1, 1, 0, 1)]
    with pytest.raises(ValueError):
        eng.cq_for_order(0, [1, 2])


def test_every_model_frame_passes_checker():
    mem = Memory()
    blob = bytes((i * 31 + 7) & 0xFF for i in range(30000))
    mem.add(0x10000, blob)
    qps = {q: qp_ctx(qpn=q, remote=0x100 + q, psn=(1 << 24) - 4 + q, mtu=m)
           for q, m in [(1, 256), (2, 1024), (3, 4096)]}
    posts, idx = [], {q: 0 for q in qps}
    for n in [0, 1, 5, 12, 255, 256, 257, 1000, 4096, 4097, 12345]:
        for q in qps:
            posts.append((q, build_write_wqe(idx[q], q, 0x5000 + n, 0x33, addr=0x10000 + n, length=n)))
            idx[q] += 1
    for n in [0, 1, 12, 13, 100, 220]:
        posts.append((1, build_write_wqe(idx[1], 1, 0x9000, 0x44, inline=blob[:n])))
        idx[1] += 1
    res = EngineModel(PORT, qps, {0: CqContext(0, 5)}, mem.read).run(posts)
    assert res.totals.packets == sum(len(v) for v in res.frames.values())
    for q, recs in res.frames.items():
        psns = [r.psn for r in recs]
        assert psns == [(qps[q].start_psn + i) % (1 << 24) for i in range(len(recs))]
        for r in recs:
            d = check_frame(r.frame)
            assert d["psn"] == r.psn and d["opcode"] == r.bth_opcode and d["dqpn"] == 0x100 + q
            assert len(d["payload"]) <= qps[q].mtu
    assert sum(res.frame_multiset().values()) == res.totals.packets


# ---- checker catches corruption ----------------------------------------------------------------
def test_checker_rejects_corruption():
    qp = qp_ctx()
    f = build_write_frames(qp, PORT, 0x1000, 1, b"hello world!", 5)[0]
    check_frame(f)
    for off, what in [(len(f) - 6, "ICRC"), (24, "checksum"), (37, "dport"), (39, "UDP length"),
                      (len(f) - 1, "ICRC")]:
        bad = bytearray(f)
        bad[off] ^= 0x01
        with pytest.raises(AssertionError, match=what):
            check_frame(bytes(bad))
    with pytest.raises(AssertionError):
        check_frame(f[:-1])


def test_diff_frames_names_fields():
    qp = qp_ctx()
    f = build_write_frames(qp, PORT, 0x1000, 1, b"0123456789", 5)[0]
    assert diff_frames(f, f) == ""
    bad = bytearray(f)
    bad[42 + 11] ^= 0xFF                 # last PSN byte
    msg = diff_frames(bytes(bad), f)
    assert "byte 53" in msg and "BTH.psn" in msg
    assert field_at(0, f) == "ETH.dmac" and field_at(54, f) == "RETH.va"
    assert field_at(70, f) == "payload[0]" and field_at(len(f) - 1, f) == "ICRC[3]"
    assert "length" in diff_frames(f[:-1], f)
    assert "op_own" in diff_cqe(hand_cqe(0, 1, 0, 0, 1), hand_cqe(0, 1, 0, 0, 0))


@pytest.mark.parametrize("latency", [20, 100, 500, 1000])
def test_latency_closed_form_matches_cycle_model(latency):
    """The fixed latencies of model/timing.py add up to what the cycle model predicts for
    one-beat inline and pointer WRITEs and for inline WQEs of 1..4 WQEBBs."""
    from types import SimpleNamespace
    from model.cycle_model import isolated_write
    from model.timing import single_beat_latency
    qp = SimpleNamespace(mtu=4096)

    def wqe(nwqebbs, length, inline, addr=0):
        return SimpleNamespace(qpn=0, index=0, nwqebbs=nwqebbs, inline=inline, length=length, local_addr=addr,
                               signaled=True, opcode=0x08)
    for nbb, n in ((1, 8), (2, 60), (3, 100), (4, 200)):
        got = isolated_write(wqe(nbb, n, True), qp, dma_latency=latency)["db_to_first_beat"]
        assert got == single_beat_latency(inline=True, dma_latency=latency, nwqebbs=nbb), (nbb, n)
    got = isolated_write(wqe(1, 64, False, 0x1000), qp, dma_latency=latency)["db_to_first_beat"]
    assert got == single_beat_latency(inline=False, dma_latency=latency)


def test_memory_region_rules():
    """The key-check rules by hand: key and variant, PD, rights, both range edges, zero length."""
    from model.mr import MemoryRegion, check
    from spec.formats import Access, MrCheck
    mr = MemoryRegion(key=0x0305, base=0x1000, length=0x100, access=Access.REMOTE_WRITE | Access.LOCAL_WRITE, pd=7)
    w = Access.REMOTE_WRITE
    assert check(mr, 0x0305, 0x1000, 0x100, w, 7) == MrCheck.OK            # the whole region
    assert check(mr, 0x0305, 0x10FF, 1, w, 7) == MrCheck.OK                # its last byte
    assert check(mr, 0x0305, 0x10FF, 2, w, 7) == MrCheck.BOUNDS            # one past the end
    assert check(mr, 0x0305, 0x0FFF, 1, w, 7) == MrCheck.BOUNDS            # one before the start
    assert check(mr, 0x0306, 0x1000, 8, w, 7) == MrCheck.BAD_KEY           # other variant byte
    assert check(None, 0x0305, 0x1000, 8, w, 7) == MrCheck.BAD_KEY
    assert check(mr, 0x0305, 0x1000, 8, w, 6) == MrCheck.PD
    assert check(mr, 0x0305, 0x1000, 8, Access.REMOTE_READ, 7) == MrCheck.RIGHTS
    assert check(mr, 0x0999, 0, 0, Access.REMOTE_READ, 1) == MrCheck.OK    # zero length: no check


def test_every_ds_value():
    """ds 0..63: a NOP is good for ds 1..63 (ceil(ds/4) WQEBBs, up to the 6-bit field's
    limit of 16), a WRITE for ds 2 (no data) or 3 (one pointer); ds 0 is malformed for
    both. The WQEBB count takes the whole field: ds 61..63 are 16 WQEBBs, not 0. An
    inline WRITE is good exactly when its data fills its ds, up to ds 63 (972 bytes)."""
    for ds in range(64):
        nop = parse_wqe(hand_ctrl(WqeOp.NOP, 0, 5, ds) + bytes(16 * 63))
        assert nop.valid == (1 <= ds <= 63), ds
        assert nop.num_wqebbs == max(1, -(-ds // 4)), ds
        body = struct.pack(">QII", 0x1000, 7, 0) + struct.pack(">IIQ", 8, 9, 0x2000) + bytes(16 * 63)
        wr = parse_wqe(hand_ctrl(WqeOp.RDMA_WRITE, 0, 5, ds) + body)
        assert wr.valid == (ds in (2, 3)), ds
    for n, ds in ((12, 3), (256, 19), (972, 63)):          # 19: NVSHMEM's warp-wide p of 32 x 8 B
        inline = struct.pack(">QII", 0x1000, 7, 0) + struct.pack(">I", 0x80000000 | n) + bytes(range(256)) * 4
        for d in (ds - 1, ds, ds + 1):
            if 2 < d < 64:                                  # ds 2 is the WRITE without data
                w = parse_wqe((hand_ctrl(WqeOp.RDMA_WRITE, 0, 5, d) + inline)[:16 * 64])
                assert w.valid == (d == ds) and (not w.valid or w.inline_data == (bytes(range(256)) * 4)[:n]), (n, d)


def test_wqe_counter_is_the_position():
    """A CQE's wqe_counter is the WQE's position in the send queue (mlx5 reports its own
    counter), whatever the ctrl segment's index field says."""
    qp = qp_ctx(psn=0)
    nop2 = hand_ctrl(WqeOp.NOP, 0x1234, qp.qpn, 8) + bytes(128 - 16)        # 2 WQEBBs, a wrong index
    nop1 = hand_ctrl(WqeOp.NOP, 0x0BAD, qp.qpn, 1) + bytes(48)
    res = EngineModel(PORT, {qp.qpn: qp}, {0: CqContext(0, 4)}, Memory().read).run(
        [(qp.qpn, nop2), (qp.qpn, nop1), (qp.qpn, nop1)])
    assert [r.wqe_counter for r in res.cqes[0]] == [0, 2, 3]
