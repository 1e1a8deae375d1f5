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
import os

import pytest

from model.frames import Port, QpContext, build_write_frames
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
    """The model builds frames with BTH PadCnt 0 whatever the payload length (SPEC 6:
    frame = 74 + p bytes); rxe requires PadCnt = (-length) & 3 (IBTA): a 203-byte WRITE ONLY
    from the model gets NAK invalid request and the QP goes to the error state."""
    g, br = _need(env)
    HQ, HPSN = 0x124, 0x700
    q, host = _connect_to_host(g, 3, HQ, HPSN, 0x900, mtu=1024)
    m = g.reg_mr(3, 4096)
    br.drain()
    data = _pattern(203, 6)
    (frame,) = build_write_frames(host, HOST_PORT, m["addr"], m["rkey"], data, HPSN)
    assert (frame[OFF_BTH + 1] >> 4) & 3 == 0 and len(frame) == 74 + 203
    br.send(frame)
    _, p = _recv(br)
    assert (p.opcode, p.dqpn, p.psn, p.aeth) == (Op.ACK, HQ, HPSN, (0x61, 0))   # NAK invalid request
    assert g.read_mem(3, 0, 203) == bytes(203)
    assert g.qp_state(3) == 6                            # IBV_QPS_ERR
