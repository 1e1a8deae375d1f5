"""Linux Soft-RoCE (rdma_rxe, in a qemu guest) as a real RoCEv2 peer.

Needs the guest image (``interop/guest/build_guest.sh``) and qemu-system-x86; when the guest
cannot start, every test FAILS with the reason (never skips). One guest serves the module.
Only deterministic facts are checked: bytes, opcodes, PSNs, MSNs, completion fields.

(a) ``test_loopback_verbs``: two QPs of the guest connected to each other through rxe's
    loopback: WRITE, READ, FETCH_ADD, COMPARE_SWAP (hit and miss), SEND/RECV, SEND with
    immediate, WRITE with immediate.
(b) ``test_host_frames_*``: RoCEv2 frames built by the project's model (model/frames.py,
    model/parse.py) sent to a guest QP over the UDP bridge, rxe's answers checked against
    the model's own ACK builder; the differences found are asserted as facts.
"""
import inspect
import os
import time

import pytest

from model.frames import Port, QpContext, build_rc_frame, build_write_frames
from model.icrc import ipv4_checksum
from model.parse import build_response, parse_frame
from spec.formats import OFF_BTH, OFF_IP, OFF_UDP, Aeth, Op
from tb.interop.bridge import UdpBridge
from tb.interop.guest import GuestError, RxeGuest

HOST_MAC, HOST_IP = "02:00:00:00:00:01", "10.0.0.1"        # the "engine" side (this test)
GUEST_MAC, GUEST_IP = "02:00:00:00:00:02", "10.0.0.2"
HOST_PORT = Port(smac=HOST_MAC, sip=HOST_IP)
WAIT = 20.0            # bound (s) on waiting for one frame from the guest; never asserted


class _Env:
    guest = None
    bridge = None
    error = None


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = _Env()
    out = tmp_path_factory.mktemp("interop")
    try:
        e.bridge = UdpBridge(pcap=out / "frames.pcap")
        e.guest = RxeGuest(e.bridge.port, e.bridge.guest_port, mac=GUEST_MAC, ip=GUEST_IP + "/24",
                           mtu=9000, log_path=out / "console.log",
                           accel=os.environ.get("IBGDA_RXE_ACCEL", "tcg"))
    except (GuestError, OSError) as exc:
        e.error = f"rxe guest could not start: {exc}"
    yield e
    if e.guest is not None:
        e.guest.close()
    if e.bridge is not None:
        e.bridge.close()


def _need(env):
    if env.error:
        pytest.fail(env.error, pytrace=False)
    return env.guest, env.bridge


def _pattern(n, seed):
    return bytes((i * 31 + seed * 7 + (i >> 8)) & 0xFF for i in range(n))


def _wc(g, qp, **expect):
    """One completion of ``qp``, checked field by field against ``expect`` (status 0)."""
    wc = g.poll_cq(qp, ms=10000)
    assert wc is not None, f"qp {qp}: no completion"
    expect = {"status": 0, "status_str": "success", **expect}
    assert {k: wc.get(k) for k in expect} == expect, wc
    return wc


# ---- (a) rxe loopback inside the guest ------------------------------------------------
def test_loopback_verbs(env):
    g, _ = _need(env)
    a = g.create_qp(0, mtu=1024, psn=0x100)
    b = g.create_qp(1, mtu=1024, psn=0xFFFFFE)          # PSN wraps during the test
    ma, mb = g.reg_mr(0, 8192), g.reg_mr(1, 8192)
    ip = g.ready["ip"]
    g.connect(0, rqpn=b["qpn"], rpsn=b["psn"], ip=ip)    # own IP: rxe loops back
    g.connect(1, rqpn=a["qpn"], rpsn=a["psn"], ip=ip)
    assert g.qp_state(0) == g.qp_state(1) == 3           # IBV_QPS_RTS

    # RDMA WRITE, 3000 B = 3 packets at MTU 1024
    data = _pattern(3000, 1)
    g.write_mem(0, 0, data)
    g.write(0, 0, 0, 3000, mb["addr"], mb["rkey"], wr=1)
    _wc(g, 0, wr=1, opcode="RDMA_WRITE", byte_len=3000, qp_num=a["qpn"])
    assert g.read_mem(1, 0, 3000) == data

    # RDMA READ, 1500 B (2 response packets)
    rdata = _pattern(1500, 2)
    g.write_mem(1, 4096, rdata)
    g.read(0, 0, 4096, 1500, mb["addr"] + 4096, mb["rkey"], wr=2)
    _wc(g, 0, wr=2, opcode="RDMA_READ", byte_len=1500, qp_num=a["qpn"])
    assert g.read_mem(0, 4096, 1500) == rdata

    # FETCH_ADD: the original value lands in the local buffer (host byte order)
    orig = 0x1122334455667788
    g.write_mem(1, 6000, orig.to_bytes(8, "little"))
    g.fetch_add(0, 0, 6000, mb["addr"] + 6000, mb["rkey"], add=0x10, wr=3)
    _wc(g, 0, wr=3, opcode="FETCH_ADD", byte_len=8, qp_num=a["qpn"])
    assert g.read_mem(0, 6000, 8) == orig.to_bytes(8, "little")
    assert g.read_mem(1, 6000, 8) == (orig + 0x10).to_bytes(8, "little")

    # COMPARE_SWAP that matches, then one that does not (memory unchanged)
    swap = 0xDEADBEEFCAFEF00D
    g.compare_swap(0, 0, 6008, mb["addr"] + 6000, mb["rkey"], compare=orig + 0x10, swap=swap, wr=4)
    _wc(g, 0, wr=4, opcode="COMP_SWAP", byte_len=8, qp_num=a["qpn"])
    assert g.read_mem(0, 6008, 8) == (orig + 0x10).to_bytes(8, "little")
    assert g.read_mem(1, 6000, 8) == swap.to_bytes(8, "little")
    g.compare_swap(0, 0, 6016, mb["addr"] + 6000, mb["rkey"], compare=1, swap=2, wr=5)
    _wc(g, 0, wr=5, opcode="COMP_SWAP", byte_len=8, qp_num=a["qpn"])
    assert g.read_mem(0, 6016, 8) == swap.to_bytes(8, "little")
    assert g.read_mem(1, 6000, 8) == swap.to_bytes(8, "little")

    # SEND / RECV, then SEND with immediate
    g.post_recv(1, 1, 7000, 256, wr=21)
    g.send(0, 0, 0, 100, wr=6)
    _wc(g, 0, wr=6, opcode="SEND", byte_len=100, qp_num=a["qpn"])
    wc = _wc(g, 1, wr=21, opcode="RECV", byte_len=100, qp_num=b["qpn"])
    assert "imm" not in wc
    assert g.read_mem(1, 7000, 100) == data[:100]
    g.post_recv(1, 1, 7300, 256, wr=22)
    g.send(0, 0, 100, 37, imm=0x12345678, wr=7)
    _wc(g, 0, wr=7, opcode="SEND", byte_len=37, qp_num=a["qpn"])
    _wc(g, 1, wr=22, opcode="RECV", byte_len=37, qp_num=b["qpn"], imm=0x12345678)
    assert g.read_mem(1, 7300, 37) == data[100:137]

    # RDMA WRITE with immediate: consumes a receive WQE, whose buffer stays untouched
    g.post_recv(1, 1, 7600, 16, wr=23)
    g.write(0, 0, 200, 64, mb["addr"] + 7700, mb["rkey"], imm=0xCAFE, wr=8)
    _wc(g, 0, wr=8, opcode="RDMA_WRITE", byte_len=64, qp_num=a["qpn"])
    _wc(g, 1, wr=23, opcode="RECV_RDMA_WITH_IMM", byte_len=64, qp_num=b["qpn"], imm=0xCAFE)
    assert g.read_mem(1, 7700, 64) == data[200:264]
    assert g.read_mem(1, 7600, 16) == bytes(16)
    assert g.poll_cq(0, ms=0) is None and g.poll_cq(1, ms=0) is None


# ---- (b) frames from the host -----------------------------------------------------------
def rxe_udp_sport(lqpn, rqpn):
    """rxe's UDP source port: rdma_get_udp_sport(flow_label 0, lqpn, rqpn) of
    include/rdma/ib_verbs.h (set when the QP gets its address vector, at RTR)."""
    v = lqpn * rqpn
    v ^= v >> 20
    v ^= v >> 40
    fl = v & 0xFFFFF
    return 0xC000 | ((fl & 0x3FFF) ^ (fl >> 14))


def _recv(br):
    f = br.recv_roce(WAIT)
    assert f is not None, "no RoCEv2 frame from the guest"
    p, why = parse_frame(f, opcodes=None, port=HOST_PORT)
    assert why is None, f"rxe frame rejected by model.parse.parse_frame: {why}: {f.hex()}"
    return f, p


def _connect_to_host(g, qp, host_qpn, host_psn, guest_psn, mtu):
    q = g.create_qp(qp, mtu=mtu, psn=guest_psn)
    g.connect(qp, rqpn=host_qpn, rpsn=host_psn, ip=HOST_IP, mac=HOST_MAC, timeout=0)
    host = QpContext(qpn=host_qpn, remote_qpn=q["qpn"], dmac=GUEST_MAC, dip=GUEST_IP,
                     start_psn=host_psn, mtu=mtu)
    return q, host


def _masked(frame):
    """A frame with the fields where rxe and the model legitimately differ zeroed:
    IPv4 identification and header checksum, UDP source port, ICRC."""
    f = bytearray(frame)
    f[OFF_IP + 4:OFF_IP + 6] = b"\0\0"
    f[OFF_IP + 10:OFF_IP + 12] = b"\0\0"
    f[OFF_UDP:OFF_UDP + 2] = b"\0\0"
    f[-4:] = b"\0\0\0\0"
    return bytes(f)


def test_host_frames_write_ack(env):
    g, br = _need(env)
    HQ, HPSN, GPSN = 0x123, 0x500, 0x300
    q, host = _connect_to_host(g, 2, HQ, HPSN, GPSN, mtu=4096)
    m = g.reg_mr(2, 16384)
    guest_port = Port(smac=GUEST_MAC, sip=GUEST_IP)
    guest_ctx = QpContext(qpn=q["qpn"], remote_qpn=HQ, dmac=HOST_MAC, dip=HOST_IP, mtu=4096)
    br.drain()

    # WRITE ONLY, 256 B, from the model's frame builder -> one ACK
    data = _pattern(256, 3)
    frames = build_write_frames(host, HOST_PORT, m["addr"] + 0x100, m["rkey"], data, HPSN)
    assert len(frames) == 1 and frames[0][OFF_BTH] == Op.WRITE_ONLY
    br.send(frames[0])
    ack, p = _recv(br)
    assert (p.opcode, p.dqpn, p.psn, p.aeth, p.ackreq) == (Op.ACK, HQ, HPSN, (Aeth.ACK, 1), False)
    assert Aeth.ACK == 0x1F                              # syndrome: ACK, credit field "invalid"
    assert g.read_mem(2, 0x100, 256) == data
    # rxe's ACK is the model's ACK (build_response) byte for byte, except:
    model_ack = build_response(guest_ctx, guest_port, HPSN, Aeth.ACK, 1)
    assert len(ack) == len(model_ack) == 62
    assert _masked(ack) == _masked(model_ack)
    sport = int.from_bytes(ack[OFF_UDP:OFF_UDP + 2], "big")
    assert sport == rxe_udp_sport(q["qpn"], HQ)          # model: 0xC000 | (qpn & 0x3fff)
    assert int.from_bytes(ack[OFF_IP + 10:OFF_IP + 12], "big") == ipv4_checksum(ack[OFF_IP:OFF_IP + 20])
    assert ack[OFF_UDP + 6:OFF_UDP + 8] == b"\0\0"       # UDP checksum 0, as the model
    assert (ack[OFF_IP + 1], ack[OFF_IP + 8], ack[OFF_IP + 6] & 0x40) == (0, 64, 0x40)   # TOS, TTL, DF

    # WRITE of 5000 B: FIRST (4096, no AckReq) + LAST (904, AckReq) -> one ACK, for LAST
    data = _pattern(5000, 4)
    frames = build_write_frames(host, HOST_PORT, m["addr"] + 0x1000, m["rkey"], data, HPSN + 1)
    assert [f[OFF_BTH] for f in frames] == [Op.WRITE_FIRST, Op.WRITE_LAST]
    for f in frames:
        br.send(f)
    _, p = _recv(br)
    assert (p.opcode, p.psn, p.aeth) == (Op.ACK, HPSN + 2, (Aeth.ACK, 2))
    assert g.read_mem(2, 0x1000, 5000) == data

    # The other direction: rxe's own WRITE ONLY of 203 B to the host, acked with the model's ACK
    out = _pattern(203, 5)
    g.write_mem(2, 0x3000, out)
    g.write(2, 2, 0x3000, 203, raddr=0xABC000, rkey=0x77, wr=31)
    f, p = _recv(br)
    assert (p.opcode, p.dqpn, p.psn, p.ackreq, p.reth, p.payload) == (
        Op.WRITE_ONLY, HQ, GPSN, True, (0xABC000, 0x77, 203), out)
    assert p.padcnt == 1 and len(f) == 14 + 20 + 8 + 12 + 16 + 204 + 4      # rxe pads to 4 B
    assert int.from_bytes(f[OFF_UDP:OFF_UDP + 2], "big") == sport
    br.send(build_response(host, HOST_PORT, GPSN, Aeth.ACK, 1))
    _wc(g, 2, wr=31, opcode="RDMA_WRITE", byte_len=203, qp_num=q["qpn"])


def test_host_frames_unpadded_write_is_nak(env):
    """A WRITE ONLY of 203 bytes with BTH PadCnt 0 and no pad bytes (frame = 74 + 203: what the
    model built before it padded, and builds with pad=False): rxe requires PadCnt =
    (-length) & 3 (IBTA), answers NAK invalid request and moves the QP to the error state
    (docs/interoperability.md, finding 1)."""
    g, br = _need(env)
    HQ, HPSN = 0x124, 0x700
    q, host = _connect_to_host(g, 3, HQ, HPSN, 0x900, mtu=1024)
    m = g.reg_mr(3, 4096)
    br.drain()
    data = _pattern(203, 6)
    no_pad = {"pad": False} if "pad" in inspect.signature(build_write_frames).parameters else {}
    (frame,) = build_write_frames(host, HOST_PORT, m["addr"], m["rkey"], data, HPSN, **no_pad)
    assert (frame[OFF_BTH + 1] >> 4) & 3 == 0 and len(frame) == 74 + 203
    br.send(frame)
    _, p = _recv(br)
    assert (p.opcode, p.dqpn, p.psn, p.aeth) == (Op.ACK, HQ, HPSN, (0x61, 0))   # NAK invalid request
    assert g.read_mem(3, 0, 203) == bytes(203)
    assert g.qp_state(3) == 6                            # IBV_QPS_ERR



def test_host_frames_send_rnr_nak(env):
    """SENDs from the host to an rxe QP (min_rnr 14: 1.28 ms), on the wire. A SEND ONLY
    with no receive WQE posted: RNR NAK, an ACK frame whose BTH PSN is the SEND's, AETH
    syndrome 0x20 | min_rnr (0x2E) and MSN 0 (the messages completed so far: the SEND is not
    taken; rxe expects the same PSN again). The same SEND again after a receive is posted:
    ACK 0x1F, MSN 1, RECV completion of 64 B. A SEND ONLY with immediate: the ImmDt's four
    bytes on the wire are the immediate big-endian (0x11223344 -> 11 22 33 44), and the
    completion's imm (ntohl) is 0x11223344."""
    g, br = _need(env)
    HQ, HPSN = 0x125, 0xFFFFFF
    q = g.create_qp(22, mtu=1024, psn=0x40)
    r = g.connect(22, rqpn=HQ, rpsn=HPSN, ip=HOST_IP, mac=HOST_MAC, timeout=0, min_rnr=14)
    assert (r["min_rnr"], r["rnr_retry"]) == (14, 7), r
    host = QpContext(qpn=HQ, remote_qpn=q["qpn"], dmac=GUEST_MAC, dip=GUEST_IP, start_psn=HPSN, mtu=1024)
    g.reg_mr(22, 4096)
    br.drain()
    data = _pattern(64, 7)
    send = build_rc_frame(host, HOST_PORT, Op.SEND_ONLY, HPSN, payload=data, ackreq=True)
    br.send(send)
    _, p = _recv(br)
    assert (p.opcode, p.dqpn, p.psn, p.aeth) == (Op.ACK, HQ, HPSN, (0x20 | 14, 0)), p
    assert g.poll_cq(22, ms=50) is None
    g.post_recv(22, 22, 0x100, 256, wr=51)
    br.send(send)                                          # the host's RNR retry: the same PSN
    _, p = _recv(br)
    assert (p.opcode, p.psn, p.aeth) == (Op.ACK, HPSN, (Aeth.ACK, 1)), p
    _wc(g, 22, wr=51, opcode="RECV", byte_len=64, with_imm=False, src_qp=0)
    assert g.read_mem(22, 0x100, 64) == data
    # SEND ONLY with immediate: the ImmDt follows the BTH, big-endian
    g.post_recv(22, 22, 0x200, 256, wr=52)
    br.send(build_rc_frame(host, HOST_PORT, Op.SEND_ONLY_IMM, 0, ext=bytes.fromhex("11223344"), payload=data[:8],
                           ackreq=True))
    _, p = _recv(br)
    assert (p.opcode, p.psn, p.aeth) == (Op.ACK, 0, (Aeth.ACK, 2)), p
    _wc(g, 22, wr=52, opcode="RECV", byte_len=8, with_imm=True, imm=0x11223344)
    assert g.read_mem(22, 0x200, 8) == data[:8]
    assert g.qp_state(22) == IBV_QPS_RTS

# ---- (c) two-sided verbs, rxe QP to rxe QP (loopback in the guest) ----------------------
# What rxe does with SEND, SEND/WRITE with immediate, RNR and over-long SENDs: the facts the
# golden model's receive side must reproduce (docs/interoperability.md, "rxe's rules for the
# two-sided verbs").
IBV_QPS_RTS, IBV_QPS_ERR = 3, 6


def _pair(g, qa, qb, mra, mrb, *, mtu=1024, psn_a=0x10, psn_b=0x20, size=16384, rnr_retry=7, min_rnr=1):
    """QP ``qa`` (requester) and ``qb`` (responder) of the guest, connected to each other
    through rxe's loopback, and one MR each: (a, b, ma, mb). ``rnr_retry`` is ``qa``'s,
    ``min_rnr`` (the timer code of ``qb``'s RNR NAKs) is ``qb``'s; both are checked to have
    reached the QPs (``connect`` reads them back with ibv_query_qp)."""
    a = g.create_qp(qa, mtu=mtu, psn=psn_a)
    b = g.create_qp(qb, mtu=mtu, psn=psn_b)
    ma, mb = g.reg_mr(mra, size), g.reg_mr(mrb, size)
    ip = g.ready["ip"]
    ra = g.connect(qa, rqpn=b["qpn"], rpsn=psn_b, ip=ip, mtu=mtu, rnr_retry=rnr_retry, min_rnr=1)
    rb = g.connect(qb, rqpn=a["qpn"], rpsn=psn_a, ip=ip, mtu=mtu, rnr_retry=7, min_rnr=min_rnr)
    assert (ra["rnr_retry"], ra["min_rnr"], ra["mtu"], ra["qp_state"]) == (rnr_retry, 1, mtu, IBV_QPS_RTS), ra
    assert (rb["rnr_retry"], rb["min_rnr"], rb["mtu"], rb["qp_state"]) == (7, min_rnr, mtu, IBV_QPS_RTS), rb
    return a, b, ma, mb


def _counters(g):
    """rxe's hw_counters; the kernel caches them for 10 ms (RDMA_HW_STATS_DEFAULT_LIFESPAN):
    wait that out so that a read never returns an earlier one's values."""
    time.sleep(0.05)
    return g.counters()


def _counters_delta(g, before):
    after = _counters(g)
    return {k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], int) and after[k] != before.get(k, 0)}


def test_send_scattered_over_three_sges(env):
    """SEND of 3000 B (3 packets at MTU 1024) into one receive WQE of 3 SGEs (1000 + 1500 +
    700 B, not adjacent): the bytes fill the SGEs in order (the last one partly); the
    receive completion: RECV, byte_len 3000 (the bytes received, not the WQE's 3200), no
    immediate, src_qp 0 (RC); the gather side: a SEND of 3 gather SGEs arrives as one stream."""
    g, _ = _need(env)
    a, b, ma, mb = _pair(g, 10, 11, 10, 11)
    data = _pattern(3000, 21)
    g.write_mem(10, 0, data)
    fill = b"\xee" * 0x3000
    g.write_mem(11, 0, fill)
    sges = [(0x100, 1000), (0x800, 1500), (0x2000, 700)]
    r = g.post_recv(11, 11, sges=sges, wr=101)
    assert (r["num_sge"], r["len"]) == (3, 3200), r
    g.send(10, 10, 0, 3000, wr=102)
    _wc(g, 10, wr=102, opcode="SEND", byte_len=3000, qp_num=a["qpn"])
    wc = _wc(g, 11, wr=101, opcode="RECV", byte_len=3000, qp_num=b["qpn"], src_qp=0, with_imm=False,
             status_name="IBV_WC_SUCCESS")
    assert "imm" not in wc
    assert g.read_mem(11, 0x100, 1000) == data[:1000]
    assert g.read_mem(11, 0x800, 1500) == data[1000:2500]
    assert g.read_mem(11, 0x2000, 700) == data[2500:] + b"\xee" * 200      # 500 of its 700 B
    assert g.read_mem(11, 0xFC, 4) == b"\xee" * 4 and g.read_mem(11, 0x100 + 1000, 4) == b"\xee" * 4
    # the other way round: a gather list of 3 SGEs on the send side, one receive buffer
    g.post_recv(11, 11, 0x2800, 1400, wr=103)
    g.send(10, 10, sges=[(0x10, 100), (0x400, 1200), (0xA00, 1)], wr=104)
    _wc(g, 10, wr=104, opcode="SEND", byte_len=1301)
    _wc(g, 11, wr=103, opcode="RECV", byte_len=1301)
    assert g.read_mem(11, 0x2800, 1301) == data[0x10:0x10 + 100] + data[0x400:0x400 + 1200] + data[0xA00:0xA01]
    assert (g.qp_state(10), g.qp_state(11)) == (IBV_QPS_RTS, IBV_QPS_RTS)


def test_send_and_write_with_immediate(env):
    """SEND with immediate (3 packets, and 0 bytes) and RDMA WRITE with immediate (3
    packets). The receiver's completions: SEND_IMM -> RECV, byte_len = the bytes sent,
    with_imm, imm as posted (verbs carries it big-endian; verbs_peer converts both ways);
    WRITE_IMM -> RECV_RDMA_WITH_IMM, byte_len = the WRITE's length (3000, although the
    receive WQE's one SGE has 16 B, which stay untouched: WRITE_IMM consumes the WQE, not
    its buffer), the bytes at the WRITE's remote address. The sender's completions: SEND
    and RDMA_WRITE (rxe sets with_imm on them too)."""
    g, _ = _need(env)
    a, b, ma, mb = _pair(g, 12, 13, 12, 13)
    data = _pattern(3000, 22)
    g.write_mem(12, 0, data)
    g.write_mem(13, 0, b"\xee" * 0x3000)
    # SEND with immediate, 2500 B
    g.post_recv(13, 13, 0x100, 4096, wr=201)
    g.send_imm(12, 12, 0, 2500, imm=0x89ABCDEF, wr=202)
    _wc(g, 12, wr=202, opcode="SEND", byte_len=2500)
    _wc(g, 13, wr=201, opcode="RECV", byte_len=2500, with_imm=True, imm=0x89ABCDEF, src_qp=0)
    assert g.read_mem(13, 0x100, 2504) == data[:2500] + b"\xee" * 4
    # SEND with immediate and no payload: byte_len 0, the buffer untouched
    g.post_recv(13, 13, 0x1200, 64, wr=203)
    g.send_imm(12, 12, 0, 0, imm=1, wr=204)
    _wc(g, 12, wr=204, opcode="SEND", byte_len=0)
    _wc(g, 13, wr=203, opcode="RECV", byte_len=0, with_imm=True, imm=1)
    assert g.read_mem(13, 0x1200, 64) == b"\xee" * 64
    # RDMA WRITE with immediate, 3000 B, into 0x2000 of the receiver's MR
    g.post_recv(13, 13, 0x1800, 16, wr=205)
    g.write_imm(12, 12, 0, 3000, raddr=mb["addr"] + 0x2000, rkey=mb["rkey"], imm=0xFEED0001, wr=206)
    wc = _wc(g, 12, wr=206, opcode="RDMA_WRITE", byte_len=3000)
    _wc(g, 13, wr=205, opcode="RECV_RDMA_WITH_IMM", byte_len=3000, with_imm=True, imm=0xFEED0001, src_qp=0,
        qp_num=b["qpn"])
    assert g.read_mem(13, 0x2000, 3004) == data + b"\xee" * 4
    assert g.read_mem(13, 0x1800, 16) == b"\xee" * 16
    # a WRITE without immediate consumes no receive WQE: the next SEND takes the one posted
    g.post_recv(13, 13, 0x1900, 64, wr=207)
    g.write(12, 12, 0, 8, raddr=mb["addr"] + 0x2F00, rkey=mb["rkey"], wr=208)
    _wc(g, 12, wr=208, opcode="RDMA_WRITE", byte_len=8)
    assert g.poll_cq(13, ms=50) is None
    g.send(12, 12, 8, 8, wr=209)
    _wc(g, 12, wr=209, opcode="SEND", byte_len=8)
    _wc(g, 13, wr=207, opcode="RECV", byte_len=8, with_imm=False)
    assert g.poll_cq(12, ms=0) is None and g.poll_cq(13, ms=0) is None


def test_send_without_receive_rnr(env):
    """A SEND with no receive WQE posted: rxe's responder answers RNR NAK (counted as
    send_rnr_err) and takes nothing. rnr_retry 0 at the sender: its work request completes
    IBV_WC_RNR_RETRY_EXC_ERR at the first RNR NAK and the sender's QP goes to ERROR, the
    receiver's stays in RTS. rnr_retry 7 (forever): the sender resends after each RNR timer
    (the receiver's min_rnr code, 20 = 10.24 ms) until a receive is posted, then both
    complete successfully. A WRITE with immediate (3 packets) with no receive posted: its
    FIRST and MIDDLE land (only the packet that carries the immediate, the LAST, needs the
    WQE), the LAST gets the RNR NAK; rxe resends the whole message from its FIRST."""
    g, _ = _need(env)
    data = _pattern(3000, 23)
    # rnr_retry 0: the first RNR NAK ends the work request
    a, b, ma, mb = _pair(g, 14, 15, 14, 15, rnr_retry=0, min_rnr=20)
    g.write_mem(14, 0, data)
    before = _counters(g)
    g.send(14, 14, 0, 100, wr=301)
    wc = g.poll_cq(14, ms=10000)
    assert wc is not None and (wc["wr"], wc["status_name"]) == (301, "IBV_WC_RNR_RETRY_EXC_ERR"), wc
    d = _counters_delta(g, before)
    assert (d.get("send_rnr_err"), d.get("rcvd_rnr_err"), d.get("retry_rnr_exceeded_err")) == (1, 1, 1), d
    assert (g.qp_state(14), g.qp_state(15)) == (IBV_QPS_ERR, IBV_QPS_RTS)
    assert g.poll_cq(15, ms=0) is None
    # rnr_retry 7: retried until a receive is posted
    a, b, ma, mb = _pair(g, 16, 17, 16, 17, rnr_retry=7, min_rnr=20)
    g.write_mem(16, 0, data)
    before = _counters(g)
    g.send(16, 16, 0, 100, wr=311)
    assert g.poll_cq(16, ms=300) is None                       # still retrying
    d = _counters_delta(g, before)
    # (read while the sender still retries: an RNR NAK may be counted at one end and not
    # yet at the other, so the two may differ by one)
    assert d.get("rcvd_rnr_err", 0) >= 2 and abs(d.get("send_rnr_err", 0) - d["rcvd_rnr_err"]) <= 1, d
    assert not d.get("retry_rnr_exceeded_err"), d
    g.post_recv(17, 17, 0x100, 256, wr=312)
    _wc(g, 16, wr=311, opcode="SEND", byte_len=100)
    _wc(g, 17, wr=312, opcode="RECV", byte_len=100)
    assert g.read_mem(17, 0x100, 100) == data[:100]
    # WRITE with immediate, 3 packets, no receive posted
    g.write_mem(17, 0x1000, b"\xee" * 3000)
    before = _counters(g)
    g.write_imm(16, 16, 0, 3000, raddr=mb["addr"] + 0x1000, rkey=mb["rkey"], imm=7, wr=313)
    assert g.poll_cq(16, ms=300) is None
    assert g.read_mem(17, 0x1000, 3000) == data[:2048] + b"\xee" * 952      # FIRST + MIDDLE landed
    d = _counters_delta(g, before)
    assert d.get("send_rnr_err", 0) >= 2 and d.get("duplicate_request", 0) >= 2, d   # FIRST/MIDDLE resent
    g.post_recv(17, 17, 0x100, 16, wr=314)
    _wc(g, 16, wr=313, opcode="RDMA_WRITE", byte_len=3000)
    _wc(g, 17, wr=314, opcode="RECV_RDMA_WITH_IMM", byte_len=3000, imm=7)
    assert g.read_mem(17, 0x1000, 3000) == data
    assert (g.qp_state(16), g.qp_state(17)) == (IBV_QPS_RTS, IBV_QPS_RTS)


def test_send_longer_than_receive_buffers(env):
    """A SEND longer than the receive WQE's buffers. One packet (600 B into 2 SGEs of 200 +
    300 B) and three packets (2500 B into 2100 B: FIRST and MIDDLE fit and land, the LAST
    does not). Linux 6.1's rxe treats it as a malformed WQE (class A): its responder answers
    NAK remote operational error (0x63) for the packet that does not fit, the receive WQE
    completes IBV_WC_LOC_QP_OP_ERR and the receiver's QP goes to ERROR; the sender's work
    request completes IBV_WC_REM_OP_ERR and its QP goes to ERROR. (Newer kernels map the
    overflow to a length error instead: docs/interoperability.md.)"""
    g, _ = _need(env)
    data = _pattern(3000, 24)
    for n, (qa, qb), sges, landed in (
            (600, (18, 19), [(0x100, 200), (0x400, 300)], None),
            (2500, (20, 21), [(0x100, 2100)], 2048)):
        a, b, ma, mb = _pair(g, qa, qb, qa, qb)
        g.write_mem(qa, 0, data)
        g.write_mem(qb, 0, b"\xee" * 0x1000)
        before = _counters(g)
        g.post_recv(qb, qb, sges=sges, wr=401)
        g.send(qa, qa, 0, n, wr=402)
        ws, wr_ = g.poll_cq(qa, ms=10000), g.poll_cq(qb, ms=10000)
        facts = (ws and ws["status_name"], wr_ and wr_["status_name"], g.qp_state(qa), g.qp_state(qb))
        assert facts == ("IBV_WC_REM_OP_ERR", "IBV_WC_LOC_QP_OP_ERR", IBV_QPS_ERR, IBV_QPS_ERR), \
            (n, ws, wr_, _counters_delta(g, before))
        assert (ws["wr"], wr_["wr"]) == (402, 401)
        if landed:
            assert g.read_mem(qb, 0x100, 2100) == data[:landed] + b"\xee" * (2100 - landed)

