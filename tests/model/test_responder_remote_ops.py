"""The golden RC responder's READ and atomics (``RcResponder(remote_ops=True)``).

READs of every size class answered from memory at the MTU with AETH and MSN; atomics of
every form executed on memory with their ATOMIC ACK; the checks (rights, bounds, key,
PD, alignment) and their NAKs; duplicates: a READ executed again from its own PSN, an
atomic answered from the record and never executed twice, a forgotten one unanswered;
and the default responder still refusing them (bad_opcode), as the engine does.
"""
import pytest

from model.frames import Port, QpContext
from model.mr import MemoryRegion
from model.parse import parse_frame
from model.read_atomic import (build_atomic_request, build_masked_atomic_request, build_read_request,
                               build_read_responses, masked_fetch_add)
from model.responder import RcResponder
from model.icrc import icrc
from spec.formats import OFF_EXT, Access, Aeth, MrCheck, Op, QpState

PD, MTU = 5, 1024
REQ_PORT = Port(smac=0x02_00_00_00_00_01, sip=0x0A000001)
RSP_PORT = Port(smac=0x02_00_00_00_00_02, sip=0x0A000002)
KEY_RW = (0x01 << 8) | 0x11
KEY_RO = (0x02 << 8) | 0x22
KEY_OTHER_PD = (0x03 << 8) | 0x33
BASE = 0x1000_0000


class Memory:
    def __init__(self):
        self.b = bytearray(1 << 16)

    def read(self, addr, n):
        return bytes(self.b[addr - BASE:addr - BASE + n])

    def write(self, addr, data):
        self.b[addr - BASE:addr - BASE + len(data)] = data


def setup(resources=16):
    mem = Memory()
    for i in range(len(mem.b)):
        mem.b[i] = (i * 7 + (i >> 8)) & 0xFF
    rsp = RcResponder(RSP_PORT, remote_ops=True, read_memory=mem.read, responder_resources=resources)
    ctx = QpContext(qpn=0x20, remote_qpn=0x10, dmac=REQ_PORT.smac, dip=REQ_PORT.sip, start_psn=0xFFFFF0, mtu=MTU)
    rsp.add_qp(ctx, PD)
    rsp.register(MemoryRegion(key=KEY_RW, base=BASE, length=0x8000, pd=PD,
                              access=Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC))
    rsp.register(MemoryRegion(key=KEY_RO, base=BASE + 0x8000, length=0x1000, pd=PD, access=Access.REMOTE_WRITE))
    rsp.register(MemoryRegion(key=KEY_OTHER_PD, base=BASE + 0x9000, length=0x1000, pd=PD + 1,
                              access=Access.REMOTE_READ | Access.REMOTE_ATOMIC))
    # the requester's view: its QP 0x10 sends to 0x20
    req = QpContext(qpn=0x10, remote_qpn=0x20, dmac=RSP_PORT.smac, dip=RSP_PORT.sip, mtu=MTU)
    return mem, rsp, ctx, req


def feed(rsp, mem, frame):
    r = rsp.receive(frame)
    for addr, data in r.writes:
        mem.write(addr, data)
    return r


def test_reads_of_every_size():
    mem, rsp, ctx, req = setup()
    psn, msn = ctx.start_psn, 0
    for n in (0, 1, 8, MTU - 1, MTU, MTU + 1, 3 * MTU + 5):
        va = BASE + 0x100 + n
        r = feed(rsp, mem, build_read_request(req, REQ_PORT, va, KEY_RW, n, psn))
        msn += 1
        want = build_read_responses(ctx, RSP_PORT, mem.read(va, n), psn, msn)
        assert r.accepted and r.response is None and r.read_responses == want, n
        assert len(want) == max(1, -(-n // MTU))
        ops = [parse_frame(f, {Op.READ_RESP_FIRST, Op.READ_RESP_MIDDLE, Op.READ_RESP_LAST, Op.READ_RESP_ONLY})[0]
               for f in want]
        assert b"".join(o.payload for o in ops) == mem.read(va, n)
        assert all((o.aeth is None) == (o.opcode == Op.READ_RESP_MIDDLE) for o in ops)
        psn = (psn + len(want)) & 0xFFFFFF
        assert rsp.qp_info(ctx.qpn)["epsn"] == psn and rsp.qp_info(ctx.qpn)["msn"] == msn


@pytest.mark.parametrize("key,va,n,status", [
    (KEY_RO, BASE + 0x8000, 8, MrCheck.RIGHTS),                 # no REMOTE_READ
    (KEY_RW, BASE + 0x7FF0, 32, MrCheck.BOUNDS),                 # past the region's end
    (KEY_RW ^ 0x01, BASE, 8, MrCheck.BAD_KEY),                   # wrong variant byte
    (KEY_OTHER_PD, BASE + 0x9000, 8, MrCheck.PD),                # another PD
])
def test_read_access_errors(key, va, n, status):
    mem, rsp, ctx, req = setup()
    r = feed(rsp, mem, build_read_request(req, REQ_PORT, va, key, n, ctx.start_psn))
    assert not r.accepted and r.reason == "access_error" and r.mr_status == status and not r.read_responses
    assert parse_frame(r.response)[0].aeth[0] == Aeth.NAK_REMOTE_ACCESS
    assert rsp.qp_info(ctx.qpn)["state"] == QpState.ERR


def test_atomics_of_every_form():
    mem, rsp, ctx, req = setup()
    psn, msn = ctx.start_psn, 0
    cases = [
        (Op.FETCH_ADD, 8, BASE + 0x200, dict(swap_add=5, compare=0)),
        (Op.COMPARE_SWAP, 8, BASE + 0x200, dict(swap_add=0x1234, compare=0)),            # fails: not equal
        (Op.MASKED_FETCH_ADD, 4, BASE + 0x204, [0xFFFFFFFF, 0x80808080]),           # field-wise
        (Op.MASKED_COMPARE_SWAP, 4, BASE + 0x208, [0xAB, 0, 0xFF, 0]),                    # compare_mask 0: set
        (Op.MASKED_FETCH_ADD, 8, BASE + 0x210, [1, 0]),
        (Op.MASKED_COMPARE_SWAP, 8, BASE + 0x218, [7, 0, (1 << 64) - 1, 0]),
    ]
    for op, size, va, args in cases:
        before = int.from_bytes(mem.read(va, size), "little")
        if isinstance(args, dict):
            if op == Op.COMPARE_SWAP:
                args = dict(args, compare=before)          # succeeds
            f = build_atomic_request(req, REQ_PORT, op, va, KEY_RW, args["swap_add"], args["compare"], psn)
        else:
            f = build_masked_atomic_request(req, REQ_PORT, op, va, KEY_RW, args, size, psn)
        r = feed(rsp, mem, f)
        msn += 1
        assert r.accepted and r.response_kind == "ack", op
        ack = parse_frame(r.response, {Op.ATOMIC_ACK})[0]
        assert (ack.opcode, ack.psn, ack.aeth, ack.orig) == (Op.ATOMIC_ACK, psn, (Aeth.ACK, msn), before)
        after = int.from_bytes(mem.read(va, size), "little")
        if op == Op.FETCH_ADD:
            assert after == before + 5
        elif op == Op.COMPARE_SWAP:
            assert after == 0x1234
        elif op == Op.MASKED_FETCH_ADD and size == 4:
            assert after == masked_fetch_add(before, 0xFFFFFFFF, 0x80808080, 4)[0]
        elif op == Op.MASKED_COMPARE_SWAP and size == 4:
            assert after == (before & ~0xFF | 0xAB) & 0xFFFFFFFF
        elif op == Op.MASKED_FETCH_ADD:
            assert after == (before + 1) % (1 << 64)
        else:
            assert after == 7
        psn = (psn + 1) & 0xFFFFFF


@pytest.mark.parametrize("op,va,key,reason,nak", [
    (Op.FETCH_ADD, BASE + 0x204, KEY_RW, "invalid_request", Aeth.NAK_INVALID_REQ),      # 8-byte atomic at 4 mod 8
    (Op.FETCH_ADD, BASE + 0x8000, KEY_RO, "access_error", Aeth.NAK_REMOTE_ACCESS),       # no REMOTE_ATOMIC
    (Op.COMPARE_SWAP, BASE + 0x9000, KEY_OTHER_PD, "access_error", Aeth.NAK_REMOTE_ACCESS),
])
def test_atomic_errors(op, va, key, reason, nak):
    mem, rsp, ctx, req = setup()
    before = mem.read(BASE, 0x10000 - 0x10)
    f = bytearray(build_atomic_request(req, REQ_PORT, op, va & ~7, key, 1, 0, ctx.start_psn))
    f[OFF_EXT:OFF_EXT + 8] = va.to_bytes(8, "big")           # (the builder refuses a misaligned one)
    f[-4:] = icrc(bytes(f[:-4]))
    r = feed(rsp, mem, bytes(f))
    assert not r.accepted and r.reason == reason and not r.writes
    assert parse_frame(r.response)[0].aeth[0] == nak and rsp.qp_info(ctx.qpn)["state"] == QpState.ERR
    assert mem.read(BASE, 0x10000 - 0x10) == before


def test_duplicates():
    mem, rsp, ctx, req = setup(resources=4)
    psn = ctx.start_psn
    va = BASE + 0x300
    first = feed(rsp, mem, build_atomic_request(req, REQ_PORT, Op.FETCH_ADD, va, KEY_RW, 10, 0, psn))
    value = mem.read(va, 8)
    # the ATOMIC ACK was lost: the same request again is answered by the same ACK, not executed
    again = feed(rsp, mem, build_atomic_request(req, REQ_PORT, Op.FETCH_ADD, va, KEY_RW, 10, 0, psn))
    assert again.reason == "psn_duplicate" and again.response == first.response and not again.writes
    assert mem.read(va, 8) == value
    # a 3-packet READ, its last response lost: the requester asks again from that PSN
    rd_psn = (psn + 1) & 0xFFFFFF
    n = 3 * MTU
    r = feed(rsp, mem, build_read_request(req, REQ_PORT, BASE + 0x1000, KEY_RW, n, rd_psn))
    assert len(r.read_responses) == 3
    later = feed(rsp, mem, build_read_request(req, REQ_PORT, BASE + 0x1000 + 2 * MTU, KEY_RW, MTU,
                                              (rd_psn + 2) & 0xFFFFFF))
    assert later.reason == "psn_duplicate"
    want = build_read_responses(ctx, RSP_PORT, mem.read(BASE + 0x1000 + 2 * MTU, MTU), (rd_psn + 2) & 0xFFFFFF,
                                rsp.qp_info(ctx.qpn)["msn"])
    assert later.read_responses == want
    # a duplicate READ whose key no longer checks (out of bounds) is an access error
    bad = feed(rsp, mem, build_read_request(req, REQ_PORT, BASE + 0x7F00, KEY_RW, 2 * MTU, (rd_psn + 1) & 0xFFFFFF))
    assert bad.reason == "access_error" and not bad.read_responses


def test_forgotten_duplicates():
    """With 4 responder resources, four more atomics push the first out: its duplicate is
    dropped unanswered (never executed again). A READ needs no record: its duplicate is
    executed again however old (the current memory, the current MSN)."""
    mem, rsp, ctx, req = setup(resources=4)
    psn, va = ctx.start_psn, BASE + 0x300
    assert feed(rsp, mem, build_atomic_request(req, REQ_PORT, Op.FETCH_ADD, va, KEY_RW, 10, 0, psn)).accepted
    rd_psn = (psn + 1) & 0xFFFFFF
    assert feed(rsp, mem, build_read_request(req, REQ_PORT, BASE, KEY_RW, 8, rd_psn)).accepted
    p = (rd_psn + 1) & 0xFFFFFF
    for k in range(4):
        assert feed(rsp, mem, build_atomic_request(req, REQ_PORT, Op.FETCH_ADD, va, KEY_RW, 1, 0, p)).accepted
        p = (p + 1) & 0xFFFFFF
    value = mem.read(va, 8)
    old = feed(rsp, mem, build_atomic_request(req, REQ_PORT, Op.FETCH_ADD, va, KEY_RW, 10, 0, psn))
    assert old.reason == "psn_duplicate" and old.response is None and mem.read(va, 8) == value
    old_read = feed(rsp, mem, build_read_request(req, REQ_PORT, BASE, KEY_RW, 8, rd_psn))
    assert old_read.reason == "psn_duplicate"
    assert old_read.frames_out == build_read_responses(ctx, RSP_PORT, mem.read(BASE, 8), rd_psn,
                                                       rsp.qp_info(ctx.qpn)["msn"])
    # the last four are still remembered
    recent = feed(rsp, mem, build_atomic_request(req, REQ_PORT, Op.FETCH_ADD, va, KEY_RW, 1, 0, (p - 1) & 0xFFFFFF))
    assert recent.response is not None and mem.read(va, 8) == value


def test_default_responder_refuses_them():
    mem, _, ctx, req = setup()
    rsp = RcResponder(RSP_PORT)
    rsp.add_qp(ctx, PD)
    for f in (build_read_request(req, REQ_PORT, BASE, KEY_RW, 8, ctx.start_psn),
              build_atomic_request(req, REQ_PORT, Op.FETCH_ADD, BASE, KEY_RW, 1, 0, ctx.start_psn)):
        r = rsp.receive(f)
        assert r.reason == "bad_opcode" and r.response is None
    with pytest.raises(ValueError):
        RcResponder(RSP_PORT, remote_ops=True)
