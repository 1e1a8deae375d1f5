"""READ and atomics end to end in the golden model: ``RcRequester(remote_ops=True)`` and
``RcResponder(remote_ops=True)`` over ``model.link.simulate``'s lossy links.

The WQEs are the testbench GPU's (tb/gpu.py: NVSHMEM's and DeepEP's forms). Lossless:
every READ's bytes land in the requester's memory, every atomic's original value too,
the remote words equal the atomics applied in order, CQEs in WQE order with the byte
counts. Under each fault kind at 0.1, 1 and 5% (requests and responses alike): every
READ returns the right bytes, every fetch-add is applied exactly once (the final value
is the sum), every CQE arrives, nothing hangs. Access violations: the error CQE, later
WQEs flushed, nothing read or changed remotely.
"""
import random
import zlib

import pytest

from model.cqe import CqContext
from model.frames import Port, QpContext
from model.link import simulate
from model.memory import SparseMemory
from model.mr import MemoryRegion
from model.requester import RcRequester
from model.responder import RcResponder
from spec.formats import Access, CqeOp, WqeOp
from spec.formats import Syndrome as CqeSyndrome
from tests.model.test_gpu_wqe_forms import _FakeGpu
from tb.gpu import Qp

REQ = Port(smac=0x02_00_00_00_00_0A, sip=0x0A00000A)
RSP = Port(smac=0x02_00_00_00_00_0B, sip=0x0A00000B)
PD, MTU = 3, 1024
KEY = (0x01 << 8) | 0x42
REMOTE = 0x4000_0000
LOCAL = 0x8000_0000
CQ_BASE = 0x9000_0000


def make(latency_ns=1000, timeout_ns=20_000):
    local, remote = SparseMemory(), SparseMemory()
    remote.write(REMOTE, bytes((i * 13 + (i >> 7)) & 0xFF for i in range(64 * 1024)))
    remote.write(REMOTE + 0x8000, bytes(16))             # the two counters the fetch-adds add to
    req = RcRequester(REQ, {0: CqContext(0, 10, base=CQ_BASE)}, local.read, remote_ops=True, write_memory=local.write)
    req.add_qp(QpContext(qpn=1, remote_qpn=11, dmac=RSP.smac, dip=RSP.sip, start_psn=0xFFFFF8, mtu=MTU, cqn=0),
               timeout_ns=timeout_ns, retry_cnt=7)
    rsp = RcResponder(RSP, ack_every=4, remote_ops=True, read_memory=remote.read)
    rsp.add_qp(QpContext(qpn=11, remote_qpn=1, dmac=REQ.smac, dip=REQ.sip, start_psn=0xFFFFF8, mtu=MTU), PD)
    rsp.register(MemoryRegion(key=KEY, base=REMOTE, length=1 << 20, pd=PD,
                              access=Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
                              | Access.REMOTE_ATOMIC))
    qp = Qp(_FakeGpu(), 1, 10, cq=None)
    return local, remote, req, rsp, qp


def workload(qp, rnd, n_reads=8, n_adds=24):
    """READs of every size class, fetch-adds (IBTA, masked 4 and 8 bytes) on two counters,
    WRITEs and compare-swaps between them; returns (reads, adds) to check."""
    reads, adds = [], {REMOTE + 0x8000: 0, REMOTE + 0x8008: 0}
    scratch = LOCAL + 0x100000
    for k in range(n_reads + n_adds):
        if k % 4 == 0 and reads.__len__() < n_reads:
            n = rnd.choice([0, 1, 8, 100, MTU, MTU + 1, 3 * MTU + 5])
            src = REMOTE + rnd.randrange(0, 0x6000)
            dst = LOCAL + 0x10000 * len(reads)
            qp.post_read(src, KEY, dst, n)
            reads.append((src, dst, n))
        elif k % 7 == 3:
            qp.post_write(REMOTE + 0xA000 + 64 * k, KEY, inline=b"w" * 8, signaled=False)
        else:
            word = rnd.choice(sorted(adds))
            v = rnd.randrange(1, 1000)
            form = rnd.choice(["ibta", "masked8", "masked4"])
            if form == "ibta":
                qp.post_atomic(WqeOp.ATOMIC_FA, word, KEY, v, local_addr=scratch)
            elif form == "masked8":
                qp.nvshmem_amo("add", 8, word, KEY, v, local_addr=scratch)
            else:
                qp.nvshmem_amo("add", 4, word, KEY, v, local_addr=scratch)     # the low half
            adds[word] += v
            scratch += 8
    qp.post_nop()
    return reads, adds


def check(local, remote, req, res, reads, adds, qp):
    assert not res.hung, "the run hung"
    for src, dst, n in reads:
        assert local.read(dst, n) == remote.read(src, n), f"READ of {n} bytes from {src:#x}"
    for word, total in adds.items():
        assert int.from_bytes(remote.read(word, 8), "little") == total, "fetch-adds applied exactly once"
    signaled = [w for w in qp.posted if w.signaled]
    cqes = list(req.completions)
    assert [c.opcode for c in cqes] == [CqeOp.REQ] * len(signaled)
    assert [c.wqe_counter for c in cqes] == [w.index for w in signaled]


def test_lossless():
    rnd = random.Random(1)
    local, remote, req, rsp, qp = make()
    reads, adds = workload(qp, rnd)
    res = simulate(req, rsp, [(1, w.wqe) for w in qp.posted], memory=remote)
    check(local, remote, req, res, reads, adds, qp)
    byte_cnt = {w.index: w.length for w in qp.posted}
    for c in req.completions:
        assert c.byte_cnt == byte_cnt[c.wqe_counter]
    # each fetch-add's original lands where its data segment says: the running sums
    assert req.counters.data_responses == sum(1 for w in qp.posted if w.opcode in (
        WqeOp.ATOMIC_FA, WqeOp.ATOMIC_MASKED_FA)) + sum(max(1, -(-n // MTU)) for _, _, n in reads)
    assert req.counters.implied_naks == 0 and req.counters.go_back_n == 0


def test_fetched_values_land_as_nvshmem_reads_them():
    """Fetch-adds on one word, 8 then 4 bytes: each original lands in its slot, an 8-byte
    one in host order, a 4-byte one big-endian (NVSHMEM byte-swaps 4-byte results only)."""
    local, remote, req, rsp, qp = make()
    word = REMOTE + 0x8000
    qp.post_atomic(WqeOp.ATOMIC_FA, word, KEY, 0x0102030405060708, local_addr=LOCAL)
    qp.nvshmem_amo("fetch_add", 4, word, KEY, 1, local_addr=LOCAL + 8)
    qp.nvshmem_amo("fetch_add", 4, word, KEY, 1, local_addr=LOCAL + 16)
    res = simulate(req, rsp, [(1, w.wqe) for w in qp.posted], memory=remote)
    assert not res.hung
    assert local.read(LOCAL, 8) == (0).to_bytes(8, "little")
    assert local.read(LOCAL + 8, 4) == (0x05060708).to_bytes(4, "big")
    assert local.read(LOCAL + 16, 4) == (0x05060709).to_bytes(4, "big")
    assert int.from_bytes(remote.read(word, 8), "little") == 0x010203040506070A


def _pattern(rnd, kind, rate, frames=4000):
    out = []
    for i in range(frames):
        if rnd.random() < rate:
            out.append((i, kind, 1) if kind == "reorder" else (i, kind))
    return out


@pytest.mark.parametrize("rate", [0.001, 0.01, 0.05])
@pytest.mark.parametrize("kind", ["drop", "corrupt", "duplicate", "reorder", "delay"])
def test_faults(kind, rate):
    rnd = random.Random(zlib.crc32(f"{kind}{rate}".encode()))
    local, remote, req, rsp, qp = make()
    reads, adds = workload(qp, rnd, n_reads=12, n_adds=60)
    res = simulate(req, rsp, [(1, w.wqe) for w in qp.posted], memory=remote,
                   faults=_pattern(rnd, kind, rate), response_faults=_pattern(rnd, kind, rate))
    check(local, remote, req, res, reads, adds, qp)


def test_access_violations():
    """A READ with a wrong key, then a misaligned atomic on a fresh pair: the error CQE,
    the WQEs after it flushed, nothing changed remotely."""
    for bad in ("read_key", "misaligned"):
        local, remote, req, rsp, qp = make()
        before = remote.read(REMOTE, 64 * 1024)
        qp.post_read(REMOTE, KEY, LOCAL, 64)
        if bad == "read_key":
            qp.post_read(REMOTE, KEY ^ 0x01, LOCAL + 0x1000, 64)
            want = CqeSyndrome.REMOTE_ACCESS_ERR
        else:
            qp.post_atomic(WqeOp.ATOMIC_FA, REMOTE + 0x8004, KEY, 1, local_addr=LOCAL + 0x2000)
            want = CqeSyndrome.REMOTE_INVAL_REQ_ERR
        qp.nvshmem_amo("add", 4, REMOTE + 0x8000, KEY, 5, local_addr=LOCAL + 0x3000)
        qp.post_nop()
        res = simulate(req, rsp, [(1, w.wqe) for w in qp.posted], memory=remote)
        assert not res.hung
        cqes = list(req.completions)
        assert [(c.opcode, c.syndrome) for c in cqes] == [
            (CqeOp.REQ, 0), (CqeOp.REQ_ERR, want), (CqeOp.REQ_ERR, CqeSyndrome.WR_FLUSH_ERR),
            (CqeOp.REQ_ERR, CqeSyndrome.WR_FLUSH_ERR)], bad
        assert remote.read(REMOTE, 64 * 1024) == before
        assert local.read(LOCAL, 64) == remote.read(REMOTE, 64)
