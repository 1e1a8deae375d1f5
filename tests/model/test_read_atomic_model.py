"""READ and atomic frames (model/read_atomic.py) against scapy and hand-packed bytes, and
the atomics' arithmetic against references written from the mlx5 documentation's
pseudo-code, field by field (not bit by bit, as the model does)."""
import random
import struct

import pytest

from model.frames import Port, QpContext
from model.read_atomic import (
    build_atomic_ack, build_atomic_request, build_masked_atomic_request, build_read_request,
    build_read_responses, compare_swap, fetch_add, masked_compare_swap, masked_fetch_add,
)
from spec.formats import OFF_EXT, Op
from tb.roce_check import check_frame

PORT = Port(smac=0x020000000001, sip="192.168.0.1")
QP = QpContext(qpn=0x21, remote_qpn=0x4567, dmac=0x020000000002, dip="192.168.0.2", mtu=1024)


def test_read_request_frame():
    f = build_read_request(QP, PORT, 0x1122334455667788, 0xABCD0102, 3000, 0x7FFFFE)
    d = check_frame(f)                                  # headers, lengths, ICRC by scapy
    assert (d["opcode"], d["psn"], d["dqpn"], d["ackreq"]) == (0x0C, 0x7FFFFE, 0x4567, 1)
    assert d["payload"] == struct.pack(">QII", 0x1122334455667788, 0xABCD0102, 3000)   # the RETH
    assert len(f) == OFF_EXT + 16 + 4


def test_read_responses_split_and_aeth():
    data = bytes(random.Random(1).randrange(256) for _ in range(2500))
    fs = build_read_responses(QP, PORT, data, 0xFFFFFF, 77)
    ds = [check_frame(f) for f in fs]
    assert [d["opcode"] for d in ds] == [0x0D, 0x0E, 0x0F]
    assert [d["psn"] for d in ds] == [0xFFFFFF, 0, 1]              # one PSN each, from the request's
    aeth = struct.pack(">I", 0x1F << 24 | 77)
    assert ds[0]["payload"] == aeth + data[:1024]                   # AETH on FIRST
    assert ds[1]["payload"] == data[1024:2048]                      # none on MIDDLE
    assert ds[2]["payload"] == aeth + data[2048:]                   # and on LAST
    assert all(d["ackreq"] == 0 for d in ds)
    only = check_frame(build_read_responses(QP, PORT, b"xyz", 5, 1)[0])
    assert (only["opcode"], only["payload"]) == (0x10, struct.pack(">I", 0x1F << 24 | 1) + b"xyz")
    empty = check_frame(build_read_responses(QP, PORT, b"", 5, 1)[0])
    assert (empty["opcode"], len(empty["payload"])) == (0x10, 4)


def test_ibta_atomic_frames():
    f = check_frame(build_atomic_request(QP, PORT, Op.FETCH_ADD, 0x1000, 0x55, 7, 0, 9))
    assert (f["opcode"], f["ackreq"]) == (0x14, 1)
    assert f["payload"] == struct.pack(">QIQQ", 0x1000, 0x55, 7, 0)   # the 28-byte AtomicETH
    f = check_frame(build_atomic_request(QP, PORT, Op.COMPARE_SWAP, 0x2008, 0x55, 0xAA, 0xBB, 9))
    assert f["opcode"] == 0x13 and f["payload"] == struct.pack(">QIQQ", 0x2008, 0x55, 0xAA, 0xBB)
    with pytest.raises(ValueError):
        build_atomic_request(QP, PORT, Op.FETCH_ADD, 0x1004, 0x55, 1, 0, 9)      # not 8-byte aligned
    a = check_frame(build_atomic_ack(QP, PORT, 9, 3, 0x0123456789ABCDEF))
    assert a["opcode"] == 0x12 and a["payload"] == struct.pack(">IQ", 0x1F << 24 | 3, 0x0123456789ABCDEF)


def test_masked_atomic_frames():
    f = check_frame(build_masked_atomic_request(QP, PORT, Op.MASKED_FETCH_ADD, 0x1004, 0x55,
                                                (0xFFFFFFFF, 0), 4, 3))
    assert f["opcode"] == 0xC1 and f["opcode"] >> 5 == 0b110         # the manufacturer-specific range
    assert f["payload"] == struct.pack(">QIB3xQQQQ", 0x1004, 0x55, 2, 0xFFFFFFFF, 0, 0, 0)
    f = check_frame(build_masked_atomic_request(QP, PORT, Op.MASKED_COMPARE_SWAP, 0x1008, 0x55,
                                                (1, 2, 3, 4), 8, 3))
    assert f["opcode"] == 0xC0 and f["payload"] == struct.pack(">QIB3xQQQQ", 0x1008, 0x55, 3, 1, 2, 3, 4)
    for bad in (dict(raddr=0x1002, nbytes=4), dict(raddr=0x1000, nbytes=2)):
        with pytest.raises(ValueError):
            build_masked_atomic_request(QP, PORT, Op.MASKED_FETCH_ADD, bad["raddr"], 0x55, (1, 0), bad["nbytes"], 0)


def _fields(boundary, bits):
    """(lo, hi) bit ranges of the fields a boundary word makes: a set bit ends a field."""
    out, lo = [], 0
    for i in range(bits):
        if boundary >> i & 1 or i == bits - 1:
            out.append((lo, i))
            lo = i + 1
    return out


def _ref_masked_fa(orig, add, boundary, nbytes):
    new = 0
    for lo, hi in _fields(boundary, 8 * nbytes):
        mask = (1 << (hi - lo + 1)) - 1
        new |= (((orig >> lo) & mask) + ((add >> lo) & mask) & mask) << lo
    return new


def test_masked_fetch_add():
    rnd = random.Random(7)
    for nbytes in (4, 8):
        top = (1 << 8 * nbytes) - 1
        for _ in range(300):
            o, a, b = (rnd.randrange(top + 1) for _ in range(3))
            assert masked_fetch_add(o, a, b, nbytes) == (_ref_masked_fa(o, a, b, nbytes), o)
        o, a = rnd.randrange(top + 1), rnd.randrange(top + 1)
        assert masked_fetch_add(o, a, 0, nbytes)[0] == (o + a) & top          # boundary 0: a plain add
        assert masked_fetch_add(o, a, top, nbytes)[0] == o ^ a                # all ones: XOR (NVSHMEM)
    # DeepEP's count: a 4-byte add of -(tokens + 1), two's complement
    assert masked_fetch_add(10, (-(3 + 1)) & 0xFFFFFFFF, 0, 4) == (6, 10)
    assert fetch_add((1 << 64) - 1, 2) == (1, (1 << 64) - 1)


def test_masked_compare_swap():
    rnd = random.Random(8)
    for nbytes in (4, 8):
        top = (1 << 8 * nbytes) - 1
        for _ in range(300):
            o, s, c, sm, cm = (rnd.randrange(top + 1) for _ in range(5))
            if rnd.random() < 0.5:
                c = (o & cm) | (c & ~cm & top)                               # make half of them match
            match = all((o >> i & 1) == (c >> i & 1) for i in range(8 * nbytes) if cm >> i & 1)
            want = sum(((s if sm >> i & 1 else o) >> i & 1) << i for i in range(8 * nbytes)) if match else o
            assert masked_compare_swap(o, s, c, sm, cm, nbytes) == (want, o)
        o, v = rnd.randrange(top + 1), rnd.randrange(top + 1)
        assert masked_compare_swap(o, v, 0, top, 0, nbytes)[0] == v          # set / swap: compare_mask 0
        assert masked_compare_swap(o, 0, 0, v, 0, nbytes)[0] == o & ~v & top  # and with ~v
        assert masked_compare_swap(o, top, 0, v, 0, nbytes)[0] == o | v       # or with v
    assert compare_swap(5, 9, 5) == (9, 5) and compare_swap(5, 9, 6) == (5, 5)
