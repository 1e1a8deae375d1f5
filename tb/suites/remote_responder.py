"""System regressions of READ and atomics with the NIC as responder (cocotb).

The peers are golden requesters' frames (``model.read_atomic`` builds them) sent into the
NIC's MAC RX; the golden responder (``RcResponder(remote_ops=True)``) takes the same frames
on an image of GPU memory, and the NIC's READ responses, ATOMIC ACKs, ACKs and NAKs, its
GPU memory and its counters must equal the model's. Plain numbers back the model up (a sum of
fetch-adds, the originals of a chain), so it cannot agree with itself.
"""
import random
import zlib

import cocotb
from cocotb.triggers import RisingEdge

from model.frames import build_write_frames
from model.memory import SparseMemory
from model.read_atomic import build_atomic_request, build_masked_atomic_request, build_read_request
from spec import params as P
from spec.formats import AETH, OFF_BTH, OFF_EXT, Aeth, Op, unpack, BTH
from tb.rc_env import DST, KEY, KEY_ATOMIC, KEY_PD, KEY_RO, REGION_LEN, peer_port, responder_env, run_and_check

WORDS = DST + 0x8_0000                # the atomics' words


class Peer:
    """One peer requester's frames, PSN by PSN."""
    def __init__(self, ctx, q):
        self.ctx, self.q, self.psn = ctx, q, ctx.start_psn

    def _next(self, frames):
        self.psn = (self.psn + len(frames)) & 0xFFFFFF
        return frames

    def write(self, va, data, key=KEY):
        return self._next(build_write_frames(self.ctx, peer_port(self.q), va, key, data, self.psn))

    def read(self, va, length, key=KEY_RO):
        n = max(1, -(-length // self.ctx.mtu))          # one PSN per response packet
        f = build_read_request(self.ctx, peer_port(self.q), va, key, length, self.psn)
        self.psn = (self.psn + n) & 0xFFFFFF
        return [f]

    def fetch_add(self, va, add, key=KEY_ATOMIC):
        return self._next([build_atomic_request(self.ctx, peer_port(self.q), Op.FETCH_ADD, va, key, add, 0,
                                                self.psn, aligned=False)])

    def compare_swap(self, va, swap, compare, key=KEY_ATOMIC):
        return self._next([build_atomic_request(self.ctx, peer_port(self.q), Op.COMPARE_SWAP, va, key, swap,
                                                compare, self.psn)])

    def masked(self, op, va, operands, nbytes, key=KEY_ATOMIC):
        return self._next([build_masked_atomic_request(self.ctx, peer_port(self.q), op, va, key, operands, nbytes,
                                                       self.psn, aligned=False)])


def _atomic_acks(frames):
    """(PSN, original) of each ATOMIC ACK among ``frames``."""
    out = []
    for f in frames:
        if f[OFF_BTH] == Op.ATOMIC_ACK:
            out.append((unpack(BTH, f, OFF_BTH)["psn"], int.from_bytes(f[OFF_EXT + 4:OFF_EXT + 12], "big")))
    return out


def _init(env, image, words):
    for va, v in words.items():
        env.mem.write(va, v.to_bytes(8, "little"))
        image.write(va, v.to_bytes(8, "little"))


@cocotb.test()
async def responder_atomics_every_form(dut):
    """Every atomic form on 3 QPs between WRITEs: IBTA FETCH_ADD and COMPARE_SWAP, the
    masked fetch-add and compare-swap on 4 and 8 bytes, to words of their own and to one
    word all three QPs add to; retries of atomics already executed (answered from the
    replay record, never applied again); a gap. Then each QP's violations: no atomic
    right, another PD, out of bounds, misaligned (the QP goes to the error state). The
    ATOMIC ACKs and ACK/NAKs, GPU memory and counters equal the golden responder's."""
    rnd = random.Random(zlib.crc32(b"responder_atomics_every_form"))
    image = SparseMemory()
    env, model, peers = await responder_env(dut, rnd, {1: 1024, 2: 1024, 3: 4096, 4: 256},
                                            {1: 1, 2: 4, 3: 8, 4: 1}, image=image)
    shared = WORDS
    own = {q: WORDS + 0x100 * q for q in peers}
    init = {shared: 1000}
    for q in peers:
        for i in range(8):
            init[own[q] + 8 * i] = rnd.randrange(1 << 64)
    _init(env, image, init)
    ps = {q: Peer(ctx, q) for q, (ctx, _) in peers.items()}
    streams = {q: [] for q in peers}
    adds = []
    for q, p in ps.items():
        if q == 4:
            continue                                  # (QP 4 only for the out-of-bounds atomic)
        s = streams[q]
        base = own[q]
        for k in range(3):
            s.append(p.write(DST + 0x1000 * q + 0x200 * k, bytes(rnd.randrange(256) for _ in range(rnd.choice([8, 300])))))
            v = rnd.randrange(1, 100)
            adds.append(v)
            s.append(p.masked(Op.MASKED_FETCH_ADD, shared, (v, 0), 4))
        s.append(p.fetch_add(base, 0x1_0000_0001))
        s.append(p.compare_swap(base + 8, 0x5555, init[base + 8]))          # compares equal: swapped
        s.append(p.compare_swap(base + 16, 0x6666, init[base + 16] ^ 1))    # does not
        s.append(p.masked(Op.MASKED_FETCH_ADD, base + 24, (0x0101_0101_0101_0101, 0x8080_8080_8080_8080), 8))
        s.append(p.masked(Op.MASKED_FETCH_ADD, base + 36, (0xFFFF_FFFF, 0x8000_8000), 4))   # high half
        s.append(p.masked(Op.MASKED_COMPARE_SWAP, base + 40, (0x1234_5678, 0, 0xFFFF_0000, 0), 4))
        s.append(p.masked(Op.MASKED_COMPARE_SWAP, base + 48, (0xAB << 56, init[base + 48], 0xFF << 56,
                                                              (1 << 64) - 1), 8))
        s.append(p.fetch_add(base + 56, 7))
    frames = []
    while any(streams.values()):
        q = rnd.choice([q for q, s in streams.items() if s])
        frames += streams[q].pop(0)
    # retries: atomics already executed, answered again from the replay record
    retried = [f for f in frames if f[OFF_BTH] in (Op.FETCH_ADD, Op.MASKED_FETCH_ADD)][-6:]
    frames += retried
    # a gap on QP 2: a fetch-add arrives before the one it follows (NAK PSN sequence
    # error, dropped), then both in order
    p2 = ps[2]
    first = p2.fetch_add(own[2] + 56, 1)
    ahead = p2.fetch_add(own[2] + 56, 2)
    frames += ahead + first + ahead
    # the violations: each QP goes to the error state, its word untouched
    frames += ps[1].fetch_add(own[1], 1, key=KEY_RO)                    # no remote-atomic right
    frames += ps[2].fetch_add(own[2], 1, key=KEY_PD)                    # another PD
    frames += ps[3].fetch_add(own[3] + 4, 1)                            # misaligned
    frames += ps[4].masked(Op.MASKED_FETCH_ADD, DST + REGION_LEN, (1, 0), 4)   # out of bounds
    frames += ps[3].fetch_add(own[3], 1)                                # QP 3 is in error now
    expect, c = await run_and_check(env, model, frames, image=image, settle=2000)
    # plain numbers: the shared word is the sum; each QP's words as computed by hand
    u = lambda a, n=8: int.from_bytes(env.mem.read(a, n), "little")
    assert u(shared, 4) == 1000 + sum(adds)
    for q in (1, 2, 3):
        b = own[q]
        assert u(b) == (init[b] + 0x1_0000_0001) % (1 << 64)
        assert u(b + 8) == 0x5555 and u(b + 16) == init[b + 16]
        assert u(b + 56) == (init[b + 56] + 7 + (3 if q == 2 else 0)) % (1 << 64)
    acks = _atomic_acks([f.data for f in env.wire.frames])
    assert len(acks) == 3 * 11 + len(retried) + 2, len(acks)
    reasons = [e.reason for e in expect]
    assert reasons.count("access_error") == 3 and reasons.count("invalid_request") == 1, reasons
    assert c["rx_psn_duplicate"] == len(retried)


@cocotb.test()
async def signal_after_data(dut):
    """Put-with-signal and DeepEP's count/flag protocol with atomic signals, into a GPU
    memory whose writes land only at their write response, 1..80 cycles after it on each
    of the two write ports: on 3 QPs, token WRITEs (8 B .. 7 KiB) then a 4-byte masked
    fetch-add of 1 on the QP's count (DeepEP) or an 8-byte FETCH_ADD on a flag
    (NVSHMEM's signal_op). A watcher reads memory every cycle: a count of n is never
    visible before the first n batches' data (the atomic unit reads its word only once
    the write issuer has every earlier write's response; without that fence the counts
    overtake their data). Memory, ATOMIC ACKs and counters as the model's."""
    rnd = random.Random(zlib.crc32(b"signal_after_data"))
    image = SparseMemory()
    env, model, peers = await responder_env(dut, rnd, {1: 4096, 2: 4096, 3: 1024}, {1: 1, 2: 4, 3: 8},
                                            image=image, b_latency=(1, 80), visible_at_b=True)
    n = 12 if cocotb.SIM_NAME.lower().startswith("verilator") else 4
    ps = {q: Peer(ctx, q) for q, (ctx, _) in peers.items()}
    count = {q: DST + 0xF_0000 + 0x100 * q for q in peers}     # (above every batch)
    batches = {q: [] for q in peers}           # per QP: the (va, data) of each batch
    streams = {q: [] for q in peers}
    for q, p in ps.items():
        for k in range(n):
            batch, frames = [], []
            for t in range(rnd.randrange(1, 4)):
                size = rnd.choice([8, 64, 300, 4096, 7168])
                va = DST + 0x4_2000 * (q - 1) + 0x5800 * k + 0x1C80 * t + rnd.randrange(64)     # no overlaps
                data = bytes(rnd.randrange(1, 256) for _ in range(size))
                frames += p.write(va, data)
                batch.append((va, data))
            frames += (p.masked(Op.MASKED_FETCH_ADD, count[q], (1, 0), 4) if q != 2
                       else p.fetch_add(count[q], 1))
            batches[q].append(batch)
            streams[q].append(frames)
    frames = []
    while any(streams.values()):
        q = rnd.choice([q for q, s in streams.items() if s])
        frames += streams[q].pop(0)
    early = []

    async def watch():
        while True:
            await RisingEdge(dut.clk)
            for q in peers:
                seen = int.from_bytes(env.mem.read(count[q], 4), "little")
                for batch in batches[q][:seen]:
                    for va, data in batch:
                        if env.mem.read(va, len(data)) != data:
                            early.append((q, seen, hex(va), env.counter.now))
    watcher = cocotb.start_soon(watch())
    await run_and_check(env, model, frames, image=image, settle=6000)
    watcher.cancel()
    assert not early, f"{len(early)} times a count was visible before its data, first {early[0]}"
    for q in peers:
        assert int.from_bytes(env.mem.read(count[q], 4), "little") == n


@cocotb.test()
async def responder_reads(dut):
    """READ REQUESTs on 3 QPs (MTU 256, 1024, 4096) between WRITEs and atomics: 0 bytes to
    9000 (up to 36 response packets), unaligned, a READ of what a WRITE before it on the
    QP wrote (it sees the WRITE); duplicates, whole and resumed from a middle PSN (executed
    again from there, the current MSN); a gap; then each QP's violations (no read right,
    out of bounds: NAK remote access, QP to error). Every READ RESPONSE byte for byte, in
    order with the ACKs and ATOMIC ACKs, memory and counters as the golden responder's.
    Reads are fast (8 cycles) and write responses slow (20..120 cycles, a write landing at
    its response). Each QP's first two requests are a WRITE and a READ of what it wrote, so
    the READ reaches memory before the WRITE lands unless the READ fence holds it (with the
    fence removed the READ returns the old bytes and the test fails)."""
    rnd = random.Random(zlib.crc32(b"responder_reads"))
    image = SparseMemory()
    env, model, peers = await responder_env(dut, rnd, {1: 256, 2: 1024, 3: 4096}, {1: 1, 2: 4, 3: 8},
                                            image=image, b_latency=(20, 120), visible_at_b=True, dma_latency=8)
    src = DST + 0xC_0000
    data = bytes(rnd.randrange(256) for _ in range(0x2_0000))
    env.mem.write(src, data)
    image.write(src, data)
    ps = {q: Peer(ctx, q) for q, (ctx, _) in peers.items()}
    streams = {q: [] for q in peers}
    reads = []                                        # (q, frames) of each READ, for retries
    wdata, wpsn = {}, {}                              # per QP: a WRITE's data, the PSN of the READ of it
    head = []
    for q, p in ps.items():
        # first of all, a READ of what the WRITE just before it wrote (it waits for it to land)
        wva = DST + 0x8000 * q + 0x33
        wdata[q] = bytes(rnd.randrange(256) for _ in range(2 * p.ctx.mtu + 7))
        head += p.write(wva, wdata[q])
        wpsn[q] = p.psn
        head += p.read(wva, 2 * p.ctx.mtu + 7)
    for q, p in ps.items():
        s = streams[q]
        mtu = p.ctx.mtu
        for k, n in enumerate([8, 0, 1, mtu - 1, mtu, mtu + 1, 3 * mtu + 5, 9000, 64]):
            va = src + 0x6000 * (q - 1) + rnd.randrange(0x3000)
            f = p.read(va, n)
            reads.append((q, f))
            s.append(f)
            if k % 3 == 1:
                s.append(p.write(DST + 0x1000 * q + 0x100 * k, bytes(rnd.randrange(256) for _ in range(300))))
            if k == 4:
                s.append(p.fetch_add(WORDS + 0x100 * q, 5))
    frames = head
    while any(streams.values()):
        q = rnd.choice([q for q, s in streams.items() if s])
        frames += streams[q].pop(0)
    # duplicates: whole READs again, and one resumed from its third response packet (the
    # requester's go-back-N after a lost response)
    for q, f in rnd.sample(reads, 5):
        frames += f
    big = next(f for q_, f in reads if q_ == 2 and len(f) == 1
               and int.from_bytes(f[0][OFF_EXT + 12:OFF_EXT + 16], "big") == 3 * 1024 + 5)[0]
    va = int.from_bytes(big[OFF_EXT:OFF_EXT + 8], "big")
    psn = unpack(BTH, big, OFF_BTH)["psn"]
    frames.append(build_read_request(peers[2][0], peer_port(2), va + 2 * 1024, KEY_RO, 1024 + 5,
                                     (psn + 2) & 0xFFFFFF))
    # a gap on QP 1: a READ ahead of a WRITE it follows (NAK PSN sequence error), then both
    p1 = ps[1]
    first = p1.write(DST + 0x1F00, b"g" * 40)
    ahead = p1.read(src, 16)
    frames += ahead + first + ahead
    # violations: each QP to the error state, nothing read
    frames += ps[1].read(src, 8, key=KEY)                            # no remote-read right
    frames += ps[2].read(DST + REGION_LEN - 8, 16)                   # out of bounds
    frames += ps[3].read(src, 8, key=KEY_PD)                         # another PD, no right
    frames += ps[3].read(src, 8)                                     # QP 3 is in error now
    expect, c = await run_and_check(env, model, frames, image=image, settle=2000)
    got = [f.data for f in env.wire.frames]
    n_resp = sum(1 for f in got if Op.READ_RESP_FIRST <= f[OFF_BTH] <= Op.READ_RESP_ONLY)
    assert n_resp == sum(len(e.read_responses) for e in expect) > 100, n_resp
    reasons = [e.reason for e in expect]
    assert reasons.count("access_error") == 3, reasons
    # plain bytes: the READ after its WRITE returned the WRITE's data
    for q in peers:
        seen = {}
        for f in got:
            b = unpack(BTH, f, OFF_BTH)
            if b["dqpn"] == 0x100 + q and Op.READ_RESP_FIRST <= b["opcode"] <= Op.READ_RESP_ONLY:
                off = OFF_EXT + (0 if b["opcode"] == Op.READ_RESP_MIDDLE else 4)
                pad = (b["flags"] >> 4) & 3                  # the IBTA pad, zero bytes before the ICRC
                assert f[len(f) - 4 - pad:-4] == bytes(pad)
                seen.setdefault(b["psn"], f[off:len(f) - 4 - pad])
        assert b"".join(seen[(wpsn[q] + i) & 0xFFFFFF] for i in range(3)) == wdata[q]


@cocotb.test()
async def responder_resources(dut):
    """Responder resources (max_dest_rd_atomic, set per QP at create): with 1 us GPU memory
    no answer leaves while a burst arrives, so every new READ and atomic of the burst holds
    one. QP 1 (16, the default): 17 READs, the 17th NAKed invalid request (QP to error).
    QP 2 (4): READs and atomics mixed, a duplicate READ (executed again, holds none), then a
    5th new one NAKed. QP 3 (2): two READs; once their answers have left, a READ and an
    atomic are taken again, then a WRITE (holds none) and a third READ, NAKed. QP 4 (1):
    WRITEs between, a READ, and its duplicate, then a fetch-add NAKed. The NIC's frames,
    memory and counters equal the golden responder's (``answer_at_once=False``)."""
    rnd = random.Random(zlib.crc32(b"responder_resources"))
    image = SparseMemory()
    limits = {1: 16, 2: 4, 3: 2, 4: 1}
    env, model, peers = await responder_env(dut, rnd, {1: 1024, 2: 1024, 3: 4096, 4: 256}, {1: 1, 2: 1, 3: 1, 4: 1},
                                            image=image, resources={2: 4, 3: 2, 4: 1}, answer_at_once=False,
                                            dma_latency=P.DMA_READ_LATENCY_CYCLES)
    src = DST + 0xC_0000
    data = bytes(rnd.randrange(256) for _ in range(0x1_0000))
    env.mem.write(src, data)
    image.write(src, data)
    _init(env, image, {WORDS + 0x100 * q: 0x100 * q for q in peers})
    ps = {q: Peer(ctx, q) for q, (ctx, _) in peers.items()}
    rd = lambda q, n=8: ps[q].read(src + 0x1000 * q + rnd.randrange(0x800), n)
    burst1, burst2 = [], []
    burst1 += [f for _ in range(17) for f in rd(1)]                             # QP 1: 17 > 16
    q2 = [rd(2), ps[2].fetch_add(WORDS + 0x200, 3), rd(2, 3000),
          ps[2].masked(Op.MASKED_FETCH_ADD, WORDS + 0x208, (1, 0), 4)]
    burst1 += [f for fs in q2 for f in fs]
    burst1 += q2[2]                                                              # a duplicate: no resource
    burst1 += ps[2].compare_swap(WORDS + 0x210, 1, 0)                          # 5th: NAK
    burst1 += rd(3) + rd(3, 5000)                                                # QP 3: 2 of 2
    burst1 += ps[4].write(DST + 0x4000, b"w" * 300) + rd(4) + ps[4].write(DST + 0x4200, b"v" * 20)
    burst2 += rd(3) + ps[3].fetch_add(WORDS + 0x300, 9)                          # freed: 2 of 2 again
    burst2 += ps[3].write(DST + 0x3000, b"x" * 64) + rd(3)                       # 3rd: NAK
    q4 = rd(4, 600)
    burst2 += q4 + q4 + ps[4].fetch_add(WORDS + 0x400, 1)                        # (QP 4: 1 of 1, a dup, NAK)
    frames = burst1 + burst2
    expect, c = await run_and_check(env, model, frames, image=image, answered_at=[len(burst1)], settle=2000)
    reasons = [e.reason for e in expect]
    assert reasons.count("invalid_request") == 4, reasons
    for q in peers:                       # the NAKed request of each QP: its last new READ/atomic
        naks = [f.data for f in env.wire.frames if unpack(BTH, f.data, OFF_BTH)["dqpn"] == 0x100 + q
                and f.data[OFF_BTH] == Op.ACK and unpack(AETH, f.data, OFF_EXT)["syndrome"] == Aeth.NAK_INVALID_REQ]
        assert len(naks) == 1, (q, len(naks))
    u = lambda a, n=8: int.from_bytes(env.mem.read(a, n), "little")
    assert u(WORDS + 0x200) == 0x200 + 3 and u(WORDS + 0x300) == 0x300 + 9
    assert u(WORDS + 0x210) == 0 and u(WORDS + 0x400) == 0x400       # the NAKed atomics did nothing
    assert c["rx_psn_duplicate"] == 2
