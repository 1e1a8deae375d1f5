"""The testbench GPU posts READ, atomic, DUMP and warp-wide-p WQEs byte for byte as
../shared/VERBS.md lists them (opcode, opmod, ds, WQEBBs, segment offsets), checked here
against hand-packed bytes. (The engine executes none of these yet; issue 16.)"""
import struct
import zlib

import pytest

from tb.gpu import Qp


class _Counter:
    now = 0


class _FakeGpu:
    """The little of GpuModel a Qp uses to post: alloc, write, read, counter."""
    def __init__(self):
        self.mem, self.top, self.counter = {}, 0x10000, _Counter()

    def alloc(self, n, align=64):
        self.top = -(-self.top // align) * align
        base, self.top = self.top, self.top + n
        return base

    def write(self, addr, data):
        for i, b in enumerate(data):
            self.mem[addr + i] = b

    def read(self, addr, n):
        return bytes(self.mem.get(addr + i, 0) for i in range(n))


def _qp():
    return Qp(_FakeGpu(), 0x15, 6, cq=None)


def _ctrl(opcode, index, qpn, ds, fm, opmod=0):
    return struct.pack(">IIBxxBI", opmod << 24 | index << 8 | opcode, qpn << 8 | ds, 0, fm, 0)


def test_read():
    qp = _qp()
    w = qp.post_read(0x1122334455667788, 0xAB, 0x9000, 4096, lkey=0x77)
    assert (w.ds, w.nwqebbs) == (3, 1)
    assert w.wqe[:48] == _ctrl(0x10, 0, 0x15, 3, 0x08) + struct.pack(">QII", 0x1122334455667788, 0xAB, 0) + \
        struct.pack(">IIQ", 4096, 0x77, 0x9000)


def test_ibta_atomics():
    qp = _qp()
    fa = qp.post_atomic(0x12, 0x2000, 0xAB, 5, local_addr=0x9000)
    cs = qp.post_atomic(0x11, 0x2008, 0xAB, 7, 9, local_addr=0x9100, signaled=False)
    assert (fa.ds, fa.nwqebbs, cs.index) == (4, 1, 1)
    assert fa.wqe[16:64] == struct.pack(">QII", 0x2000, 0xAB, 0) + struct.pack(">QQ", 5, 0) + \
        struct.pack(">IIQ", 8, 0x100, 0x9000)
    assert cs.wqe[:16] == _ctrl(0x11, 1, 0x15, 4, 0) and cs.wqe[32:48] == struct.pack(">QQ", 7, 9)


@pytest.mark.parametrize("opcode,nbytes,ops,ds,seg", [
    (0x15, 4, {"add": 0xFFFFFFFC, "field_boundary": 0}, 4, struct.pack(">II8x", 0xFFFFFFFC, 0)),
    (0x14, 4, {"swap": 1, "compare": 2, "swap_mask": 3, "compare_mask": 4}, 4, struct.pack(">IIII", 1, 2, 3, 4)),
    (0x15, 8, {"add": 1, "field_boundary": (1 << 64) - 1}, 4, struct.pack(">QQ", 1, (1 << 64) - 1)),
    (0x14, 8, {"swap": 1, "compare": 2, "swap_mask": 3, "compare_mask": 0}, 5, struct.pack(">QQQQ", 1, 2, 3, 0)),
])
def test_masked_atomics(opcode, nbytes, ops, ds, seg):
    qp = _qp()
    w = qp.post_masked_atomic(opcode, nbytes, 0x3000, 0xAB, ops, local_addr=0x9200)
    assert (w.ds, w.nwqebbs) == (ds, 1 if ds == 4 else 2)
    assert w.wqe[:16] == _ctrl(opcode, 0, 0x15, ds, 0x08, opmod=0x08 if nbytes == 4 else 0x09)
    assert w.wqe[32:32 + len(seg)] == seg
    assert w.wqe[32 + len(seg):48 + len(seg)] == struct.pack(">IIQ", nbytes, 0x100, 0x9200)
    with pytest.raises(ValueError):
        qp.post_masked_atomic(opcode, nbytes, 0x3000, 0xAB, {"add": 1}, local_addr=0x9200)


def test_deepep_signal_dump_and_warp_p():
    qp = _qp()
    s = qp.amo_nonfetch_add(0x4000, 0xAB, -4, scratch=0x9300)       # -(num_tokens_sent) - 1, 3 tokens
    assert s.wqe[:16] == _ctrl(0x15, 0, 0x15, 4, 0x08, opmod=0x08) and s.wqe[32:40] == struct.pack(">II", 0xFFFFFFFC, 0)
    d = qp.post_dump(0x9400)
    assert (d.ds, d.wqe[:16]) == (2, _ctrl(0x23, 1, 0x15, 2, 0x48))
    assert d.wqe[16:32] == struct.pack(">IIQ", 1, 0x100, 0x9400)
    for width, ds, nbb in ((1, 5, 2), (2, 7, 2), (4, 11, 3), (8, 19, 5)):
        w, nop = qp.put_warp_p(0x5000, 0xAB, list(range(32)), width)
        assert (w.ds, w.nwqebbs, w.signaled, nop.signaled, nop.index) == (ds, nbb, False, True, w.index + nbb)
        assert w.wqe[32:36] == struct.pack(">I", 0x80000000 | 32 * width)
        assert w.wqe[36:36 + 32 * width] == b"".join(v.to_bytes(width, "little") for v in range(32))


# NVSHMEM's atomics (tb.gpu.Qp.nvshmem_amo): the WQE form of each op and size as NVSHMEM's
# device code posts it, and that the masked arithmetic of those operands is the op.
_MEANING = {
    "inc": lambda o, v, c, m: (o + 1) & m, "fetch_inc": lambda o, v, c, m: (o + 1) & m,
    "add": lambda o, v, c, m: (o + v) & m, "signal_add": lambda o, v, c, m: (o + v) & m,
    "fetch_add": lambda o, v, c, m: (o + v) & m,
    "xor": lambda o, v, c, m: o ^ v, "fetch_xor": lambda o, v, c, m: o ^ v, "fetch": lambda o, v, c, m: o,
    "set": lambda o, v, c, m: v, "swap": lambda o, v, c, m: v, "signal": lambda o, v, c, m: v,
    "signal_set": lambda o, v, c, m: v, "and": lambda o, v, c, m: o & v, "fetch_and": lambda o, v, c, m: o & v,
    "or": lambda o, v, c, m: o | v, "fetch_or": lambda o, v, c, m: o | v,
    "compare_swap": lambda o, v, c, m: v if o == c else o,
}


def _execute(wqe, nbytes, orig):
    """What a responder does with the WQE's operands (model/read_atomic.py), from its bytes."""
    from model.read_atomic import compare_swap, fetch_add, masked_compare_swap, masked_fetch_add
    from spec.formats import EXT_CS32_SEG, EXT_CS64_SEG, EXT_FA32_SEG, EXT_FA64_SEG, ATOMIC_SEG, unpack
    opcode = wqe[3]
    if opcode == 0x12:
        return fetch_add(orig, unpack(ATOMIC_SEG, wqe, 32)["swap_add"])[0]
    if opcode == 0x11:
        a = unpack(ATOMIC_SEG, wqe, 32)
        return compare_swap(orig, a["swap_add"], a["compare"])[0]
    if opcode == 0x15:
        a = unpack(EXT_FA32_SEG if nbytes == 4 else EXT_FA64_SEG, wqe, 32)
        return masked_fetch_add(orig, a["add"], a["field_boundary"], nbytes)[0]
    a = unpack(EXT_CS32_SEG if nbytes == 4 else EXT_CS64_SEG, wqe, 32)
    return masked_compare_swap(orig, a["swap"], a["compare"], a["swap_mask"], a["compare_mask"], nbytes)[0]


@pytest.mark.parametrize("nbytes", [4, 8])
@pytest.mark.parametrize("op", sorted(_MEANING))
def test_nvshmem_amo(op, nbytes):
    import random
    rnd = random.Random(zlib.crc32(f"{op}{nbytes}".encode()))
    m = (1 << 8 * nbytes) - 1
    qp = _qp()
    for _ in range(20):
        v, c, orig = rnd.getrandbits(8 * nbytes), rnd.getrandbits(8 * nbytes), rnd.getrandbits(8 * nbytes)
        if rnd.random() < 0.5:
            c = orig                                         # a compare-swap that succeeds
        ws = qp.nvshmem_amo(op, nbytes, 0x4000, 0xAB, v, c, local_addr=0x9000)
        w = ws[0]
        opcode, opmod = w.wqe[3], w.wqe[0]
        ibta = nbytes == 8 and op in ("fetch_add", "compare_swap")
        masked_cs = not ibta and op in ("set", "swap", "signal", "signal_set", "and", "fetch_and", "or",
                                         "fetch_or", "compare_swap")
        if ibta:
            assert (opcode, opmod) == ({"fetch_add": 0x12, "compare_swap": 0x11}[op], 0)
        else:
            assert (opcode, opmod) == (0x14 if masked_cs else 0x15, 0x08 if nbytes == 4 else 0x09)
        two = masked_cs and nbytes == 8
        assert (w.ds, w.nwqebbs) == ((5, 2) if two else (4, 1))
        # signaled unless the 2-WQEBB form, which NVSHMEM closes with a signaled NOP
        assert w.wqe[11] & 0x08 == (0 if two else 0x08) and w.wqe[11] & 0xE0 == 0
        assert [x.opcode for x in ws[1:]] == ([0] if two else []) and all(x.signaled for x in ws[1:])
        # the data segment: where the original value lands, the size's bytes
        data = w.wqe[16 * (w.ds - 1):16 * w.ds]
        assert struct.unpack(">IIQ", data) == (nbytes, 0x100, 0x9000)
        assert _execute(w.wqe, nbytes, orig) == _MEANING[op](orig, v, c, m), (op, hex(orig), hex(v), hex(c))


def test_put_signal():
    qp = _qp()
    ws = qp.put_signal(0x5000, 0xAB, 0x9000, 256, 0x6000, 1, "add", scratch=0x9800)
    assert [(w.opcode, w.signaled) for w in ws] == [(0x08, False), (0x15, True)] and ws[1].wqe[0] == 0x09
    ws = qp.put_signal(0x5000, 0xAB, 0x9000, 256, 0x6000, 7, "set", scratch=0x9800)
    assert [(w.opcode, w.signaled, w.nwqebbs) for w in ws] == [(0x08, False, 1), (0x14, False, 2), (0x00, True, 1)]
    with pytest.raises(ValueError):
        qp.signal_op(0x6000, 0xAB, 1, "xor", scratch=0x9800)
