"""System regressions of the transmit engine (cocotb), each held to the golden model."""
import cocotb

from spec.formats import BTH, INLINE_FLAG, OFF_BTH, CqeOp, Syndrome, WqeOp, QpState, read_field
from spec import params as P
from tb.env import NicEnv
from tb.clock import ClockCycles


async def env_with(dut, nqps=1, *, cq_depth=6, sq_depth=8, mtu=4096, collapsed=False, shared_cq=False, **kw):
    env = await NicEnv(dut, **kw).start()
    qps = []
    for q in range(nqps):
        cqn = 0 if shared_cq else q
        cq = env.cqs.get(cqn) or await env.cq(cqn, cq_depth, collapsed)
        qps.append(await env.qp(q, cq, log_depth=sq_depth, mtu=mtu))
    return env, qps


@cocotb.test()
async def single_pointer_write(dut):
    """One 64-byte RDMA WRITE from GPU memory, NVSHMEM doorbell, one CQE."""
    env, (qp,) = await env_with(dut)
    addr, _ = env.payload(64)
    qp.post_write(0x7000_0000, 0x1234, local_addr=addr, length=64)
    await qp.ring_nvshmem()
    pred = env.check(await env.drain())
    env.check_cycles()
    await env.check_counters(pred)
    assert len(env.wire.frames) == 1 and len(env.wire.frames[0].data) == 74 + 64


@cocotb.test()
async def inline_writes(dut):
    """Inline WRITEs of 1..12 bytes (one WQEBB) and longer (up to 4 WQEBBs)."""
    env, (qp,) = await env_with(dut, sq_depth=8)
    sizes = list(range(1, 13)) + [13, 28, 29, 60, 92, 93, 124, 150, 200, 220]
    for i, n in enumerate(sizes):
        qp.post_write(0x1000 * i, 0x55, inline=bytes((i + j) & 0xFF for j in range(n)))
        await qp.ring_nvshmem()
    pred = env.check(await env.drain())
    env.check_cycles()
    await env.check_counters(pred)
    assert [len(f.data) for f in env.wire.frames] == [74 + n + (-n & 3) for n in sizes]    # the IBTA pad


@cocotb.test()
async def sends_and_write_imm(dut):
    """SEND, SEND with immediate and WRITE with immediate, from pointers, inline and of 0
    bytes, one packet and several (MTU 256): frames byte for byte, CQEs and cycles as the
    models', and the opcodes, ImmDt and pad checked by hand."""
    env, (qp,) = await env_with(dut, sq_depth=8, mtu=256)
    sizes = [1, 8, 255, 256, 257, 700]
    want = []                                  # (BTH opcodes, the ImmDt of the last or None, pad of the last)
    for i, n in enumerate(sizes):
        addr, _ = env.payload(n)
        imm = 0xA0B0C000 + i
        if i % 2:
            qp.post_send(local_addr=addr, length=n, imm=imm)
        else:
            qp.post_send(local_addr=addr, length=n)
        qp.post_write(0x8000_0000 + 0x1000 * i, 0x77, local_addr=addr, length=n, opcode=WqeOp.RDMA_WRITE_IMM,
                      imm=imm)
        k = -(-n // 256)
        first = (0x04, 0x05)[i % 2]                         # SEND ONLY / ONLY_IMM
        if k > 1:
            want.append(([0x00] + [0x01] * (k - 2) + [(0x02, 0x03)[i % 2]], imm if i % 2 else None, -n & 3))
            want.append(([0x06] + [0x07] * (k - 2) + [0x09], imm, -n & 3))
        else:
            want.append(([first], imm if i % 2 else None, -n & 3))
            want.append(([0x0B], imm, -n & 3))
        await qp.ring_nvshmem()
    qp.post_send(inline=b"hello, receiver")                # 15 bytes inline: SEND ONLY, pad 1
    qp.post_send(imm=0x1234_5678)                          # 0 bytes: SEND ONLY_IMM, header only
    qp.post_write(0x9000_0000, 0x77, inline=b"imm!", opcode=WqeOp.RDMA_WRITE_IMM, imm=7)
    want += [([0x04], None, 1), ([0x05], 0x1234_5678, 0), ([0x0B], 7, 0)]
    await qp.ring_nvshmem()
    pred = env.check(await env.drain())
    env.check_cycles()
    await env.check_counters(pred)
    frames = [f.data for f in env.wire.frames]
    at = 0
    for ops, imm, pad in want:
        fs = frames[at:at + len(ops)]
        at += len(ops)
        assert [f[OFF_BTH] for f in fs] == ops
        last = fs[-1]
        hdr = OFF_BTH + 12 + (16 if last[OFF_BTH] in (0x0A, 0x0B) else 0)
        assert (last[OFF_BTH + 1] >> 4) & 3 == pad
        if imm is not None:
            assert int.from_bytes(last[hdr:hdr + 4], "big") == imm
    assert at == len(frames)


@cocotb.test()
async def long_inline_writes(dut):
    """Inline WRITEs up to the ds field's limit (ds 63: 16 WQEBBs, 972 bytes), NVSHMEM's
    warp-wide p of 32 x 8 bytes (ds 19, 5 WQEBBs) among them, at MTU 4096 (one packet)
    and at MTU 256 (up to 4 packets, each cut from the WQE's beats): frames byte for byte
    and CQEs as the model's."""
    env, (big,) = await env_with(dut, 1, sq_depth=10)
    small_mtu = await env.qp(2, env.cqs[0], log_depth=10, mtu=256)
    sizes = [221, 256, 257, 300, 476, 477, 600, 972]
    for i, n in enumerate(sizes):
        for qp in (big, small_mtu):
            qp.post_write(0x10000 * i, 0x55, inline=bytes((3 * i + j) & 0xFF for j in range(n)))
            await qp.ring_nvshmem()
    warp = big.post_write(0x90000, 0x55, inline=bytes(range(256)), signaled=False)   # 32 x 8 B
    big.post_nop()                                         # NVSHMEM's trailing NOP
    await big.ring_nvshmem()
    assert warp.ds == 19 and warp.nwqebbs == 5
    pred = env.check(await env.drain())
    await env.check_counters(pred)
    assert pred.totals.packets == len(sizes) + sum(-(-n // 256) for n in sizes) + 1
    assert pred.totals.error_cqes == 0


@cocotb.test()
async def multi_packet_writes(dut):
    """Messages across the path MTU: FIRST/MIDDLE/LAST, unaligned sources, three MTUs, PSN wrap."""
    env = await NicEnv(dut).start()
    cq = await env.cq(0, 6)
    cases = []
    for q, mtu in enumerate((256, 1024, 4096)):
        qp = await env.qp(q, cq, mtu=mtu, start_psn=0xFFFFF0 if mtu == 256 else None)   # PSN wraps at 2**24
        for length, offset in ((mtu - 1, 3), (mtu, 0), (mtu + 1, 127), (3 * mtu + 5, 65), (10000, 1)):
            addr, _ = env.payload(length, offset=offset, seed=length)
            qp.post_write(0x10_0000_0000 + length, 0xBEEF, local_addr=addr, length=length)
            cases.append((q, length))
        await qp.ring_nvshmem()
    pred = env.check(await env.drain(400_000))
    env.check_cycles()
    await env.check_counters(pred)


@cocotb.test()
async def many_qps(dut):
    """64 QPs at once, each with its own CQ, doorbells back to back."""
    env, qps = await env_with(dut, 64, cq_depth=2, sq_depth=4)
    for qp in qps:
        addr, _ = env.payload(32 + qp.qpn, seed=qp.qpn)
        qp.post_write(0x2000 * qp.qpn, qp.qpn, local_addr=addr, length=32 + qp.qpn)
        qp.post_write(0x2000 * qp.qpn + 64, qp.qpn, inline=bytes([qp.qpn]) * 8)
    for qp in qps:
        await qp.ring_nvshmem()
    pred = env.check(await env.drain(400_000))
    env.check_cycles()
    await env.check_counters(pred)
    assert len({f.data[42 + 5:42 + 8] for f in env.wire.frames}) == 64      # every destination QP


@cocotb.test()
async def ring_wrap(dut):
    """SQ of 8 WQEBBs and CQ of 4 CQEs wrapped several times, a WQE across the SQ end."""
    env, (qp,) = await env_with(dut, cq_depth=2, sq_depth=3)
    posted = 0
    for rnd in range(6):
        # 1-WQEBB and 3-WQEBB WQEs so that some wrap the ring end
        qp.post_write(0x100 * rnd, 1, inline=bytes(range(8)))
        qp.post_write(0x100 * rnd + 8, 2, inline=bytes(range(100)))
        qp.post_write(0x100 * rnd + 16, 3, inline=bytes(range(4)))
        posted += 3
        await qp.ring_nvshmem()
        await qp.cq.poll(3, timeout_cycles=20_000)
    pred = env.check(await env.drain())
    env.check_cycles()
    await env.check_counters(pred)
    owners = [c.owner for c in qp.cq.cqes]
    assert owners == [(k >> 2) & 1 for k in range(posted)], owners


@cocotb.test()
async def doorbell_coalescing(dut):
    """One doorbell for 32 WQEs; then a storm of doorbells faster than the engine: none lost."""
    env, qps = await env_with(dut, 4, sq_depth=8)
    qp = qps[0]
    for i in range(32):
        qp.post_write(0x40 * i, 9, inline=bytes([i]) * 8, signaled=(i == 31))
    await qp.ring_nvshmem()
    # storm: every QP rings after every post, the doorbells back to back
    for i in range(16):
        for q in qps[1:]:
            q.post_write(0x40 * i, 7, inline=bytes([i, q.qpn]) * 4)
            await q.ring_nvshmem()
    pred = env.check(await env.drain())
    env.check_cycles()
    c = await env.check_counters(pred)
    assert c["doorbells"] == 1 + 16 * 3


@cocotb.test()
async def doorbell_forms(dut):
    """rdma-core doorbells (ctrl words of the last WQE, both BlueFlame halves) and NVSHMEM ones."""
    env, (a, b) = await env_with(dut, 2)
    for i in range(3):
        a.post_write(0x100 * i, 1, inline=bytes(range(40)))      # 2 WQEBBs: ds = 6
        await a.ring_rdma_core(alternate=bool(i & 1))
    a.post_write(0x900, 1, inline=bytes(range(4)))
    a.post_write(0xA00, 1, inline=bytes(range(200)))            # last WQE of 4 WQEBBs
    await a.ring_rdma_core()
    for i in range(3):
        b.post_write(0x100 * i, 2, inline=bytes(range(8)))
    await b.ring_nvshmem()
    pred = env.check(await env.drain())
    env.check_cycles()
    await env.check_counters(pred)


@cocotb.test()
async def collapsed_cq(dut):
    """NVSHMEM style: collapsed CQ, CQ_UPDATE on the last WQE of each batch, polled by wqe_counter."""
    env, (qp,) = await env_with(dut, collapsed=True, cq_depth=0)
    for batch in range(3):
        for i in range(8):
            addr, _ = env.payload(16, seed=i)
            w = qp.post_write(0x80 * i, 4, local_addr=addr, length=16, signaled=(i == 7))
        await qp.ring_nvshmem()
        cqe = await qp.cq.poll_counter(w.index, timeout_cycles=20_000)
        assert cqe.opcode == CqeOp.REQ and cqe.wqe_counter == w.index
    pred = env.check(await env.drain())
    env.check_cycles()
    await env.check_counters(pred)


@cocotb.test()
async def nop_and_error_wqes(dut):
    """NOP completes without a packet; an unsupported opcode gives an error CQE and fails that
    QP only: its later WQEs complete with WR_FLUSH_ERR, signaled or not, and send nothing."""
    env, (a, b) = await env_with(dut, 2)
    a.post_nop(signaled=True)
    a.post_write(0x10, 1, inline=b"ok")
    a.post_write(0x20, 1, inline=b"bad", opcode=WqeOp.ATOMIC_FA)   # not supported yet
    a.post_write(0x30, 1, inline=b"never", signaled=False)
    a.post_nop(signaled=False)
    await a.ring_nvshmem()
    b.post_write(0x40, 2, inline=b"other QP goes on")
    await b.ring_nvshmem()
    pred = env.check(await env.drain())
    await env.check_counters(pred)
    errors = [c for c in a.cq.cqes] if a.cq.cqes else []
    cqes = await a.cq.poll(5, timeout_cycles=1000)
    assert [(c.opcode, c.syndrome, c.wqe_counter, c.wqe_opcode) for c in cqes] == [
        (CqeOp.REQ, 0, 0, WqeOp.NOP), (CqeOp.REQ, 0, 1, WqeOp.RDMA_WRITE),
        (CqeOp.REQ_ERR, Syndrome.LOCAL_QP_OP_ERR, 2, WqeOp.ATOMIC_FA),
        (CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR, 3, WqeOp.RDMA_WRITE), (CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR, 4, WqeOp.NOP)]
    assert {c.user_index for c in cqes} == {a.user_index} and a.user_index != b.user_index   # QP_USER_INDEX
    assert not any(b"never" in f.data for f in env.wire.frames)


@cocotb.test()
async def dump_consistency_point(dut):
    """NVSHMEM's quiet with consistency: a DUMP (ds 2, one byte of a local buffer, fence
    0x40, CQ_UPDATE) between WRITEs. It sends nothing, reads its byte of GPU memory after
    the payload reads of every WQE before it (one read port, in order), and completes as
    a REQ CQE of byte count 0 with opcode 0x23, after the WQEs before it and before those
    after; frames and CQEs as the model. A DUMP of another ds, or with an inline segment,
    is malformed (LOCAL_QP_OP_ERR) and flushes what follows."""
    env, (a, b) = await env_with(dut, 2)
    src, _ = env.payload(300)
    scratch = env.gpu.alloc(128, 128) + 77
    a.post_write(0x1000, 1, local_addr=src, length=300)
    a.post_write(0x2000, 1, inline=b"tiny", signaled=False)
    a.post_dump(scratch)
    a.post_write(0x3000, 1, local_addr=src, length=40)
    await a.ring_nvshmem()
    b.post_raw(WqeOp.DUMP, 1)                                        # no data segment
    b.post_nop()
    await b.ring_nvshmem()
    pred = env.check(await env.drain())
    await env.check_counters(pred)
    cqes = await a.cq.poll(3, timeout_cycles=1000)
    assert [(c.opcode, c.wqe_counter, c.byte_cnt, c.wqe_opcode) for c in cqes] == [
        (CqeOp.REQ, 0, 300, WqeOp.RDMA_WRITE), (CqeOp.REQ, 2, 0, WqeOp.DUMP), (CqeOp.REQ, 3, 40, WqeOp.RDMA_WRITE)]
    bad = await b.cq.poll(2, timeout_cycles=1000)
    assert [(c.opcode, c.syndrome, c.wqe_opcode) for c in bad] == [
        (CqeOp.REQ_ERR, Syndrome.LOCAL_QP_OP_ERR, WqeOp.DUMP), (CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR, WqeOp.NOP)]
    # the DUMP's read: one beat holding its byte, after the first WRITE's payload reads
    # and before the last WRITE's
    reads = [r for r in env.mem.reads if r.addr <= scratch < r.addr + r.length]
    assert len(reads) == 1 and reads[0].beats == 1, reads
    payload = [r for r in env.mem.reads if src <= r.addr < src + 300]
    order = sorted(payload + reads, key=lambda r: r.start_cycle)
    assert order.index(reads[0]) == len(order) - 2, [(hex(r.addr), r.start_cycle) for r in order]
    assert len(env.wire.frames) == 3


@cocotb.test()
async def qp_state_machine(dut):
    """The QP state machine through QP_MODIFY (UC QP 0; QP 1 untouched carries on):
    transitions verbs does not allow are answered SLVERR and change nothing; moved to ERR,
    every WQE posted completes with WR_FLUSH_ERR, signaled or not, and sends nothing;
    RESET drops doorbells; RESET -> INIT -> RTR -> RTS starts the send queue afresh at
    index 0 with the PSN staged for RTS. Frames and CQEs as the model
    (``EngineModel.modify``), counters too."""
    env, (a, b) = await env_with(dut, 2)
    a.post_write(0x10, 1, inline=b"first")
    await a.ring_nvshmem()
    await env.drain()
    refused = 0
    for state in (QpState.INIT, QpState.RTR, QpState.SQD):          # not from RTS
        assert not await env.modify_qp(a, state), f"RTS -> {state} must be refused"
        refused += 1
    assert await env.modify_qp(a, QpState.RTS)                        # RTS -> RTS: taken
    assert await env.modify_qp(a, QpState.ERR)
    a.post_nop(signaled=True)
    a.post_write(0x20, 1, inline=b"never", signaled=False)
    a.post_write(0x30, 1, inline=b"never either")
    await a.ring_nvshmem()
    b.post_write(0x40, 2, inline=b"other QP")
    await b.ring_nvshmem()
    await env.drain()
    assert not await env.modify_qp(a, QpState.RTS), "ERR -> RTS must be refused"
    refused += 1
    assert await env.modify_qp(a, QpState.RESET)
    a.post_write(0x50, 1, inline=b"dropped")                         # a QP in RESET takes no doorbell
    await a.ring_nvshmem()
    await ClockCycles(dut.clk, 300)
    assert not await env.modify_qp(a, QpState.RTR), "RESET -> RTR must be refused"
    refused += 1
    for state, psn in ((QpState.INIT, None), (QpState.RTR, None), (QpState.RTS, 0xFFFFFE)):
        assert await env.modify_qp(a, state, start_psn=psn), f"to {state}"
    a.post_write(0x60, 1, inline=b"again")
    a.post_write(0x70, 1, inline=b"x" * 8)
    await a.ring_nvshmem()
    pred = env.check(await env.drain())
    await env.check_counters(pred)
    c = await env.ctl.read_counters()
    assert (c["qp_modify_rejected"], c["db_qp_not_rts"]) == (refused, 1), c
    cqes = await a.cq.poll(6, timeout_cycles=1000)
    assert [(c_.opcode, c_.syndrome, c_.wqe_counter) for c_ in cqes] == [
        (CqeOp.REQ, 0, 0), (CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR, 1), (CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR, 2),
        (CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR, 3), (CqeOp.REQ, 0, 0), (CqeOp.REQ, 0, 1)]
    psns = [read_field(BTH, "psn", f.data, OFF_BTH) for f in env.wire.frames
            if read_field(BTH, "dqpn", f.data, OFF_BTH) == a.remote_qpn]
    assert psns == [a.start_psn, 0xFFFFFE, 0xFFFFFF], [hex(p) for p in psns]
    assert not any(b"never" in f.data or b"dropped" in f.data for f in env.wire.frames)


@cocotb.test()
async def bad_doorbells(dut):
    """Doorbells at a wrong offset, with a QPN not matching the page, or to a QP not in RTS: dropped."""
    env, (a,) = await env_with(dut, 1)
    cq = env.cqs[0]
    await env.gpu.create_qp(5, 4, cq, remote_qpn=0x1005, dmac=1, dip=1, state=QpState.INIT)
    a.post_write(0x10, 1, inline=b"x")
    a.write_dbr()
    good = a.pi
    await env.gpu.doorbell(0, bytes([0, 0, good, 0, 0, 0, 0, 0]), offset=0x808)     # wrong offset
    await env.gpu.doorbell(0, bytes([0, 0, good, 0, 0, 0, 3, 0]))                   # QPN 3 on page 0
    await env.gpu.doorbell(5, bytes([0, 0, 1, 0, 0, 0, 5, 0]))                      # QP 5 is in INIT
    await ClockCycles(dut.clk, 2000)
    assert len(env.wire.frames) == 0
    c = await env.ctl.read_counters()
    # each dropped doorbell counted once, by reason, and never as applied (the one to the
    # QP in INIT was counted both ways before the QP table's drops had their own strobe)
    assert c["doorbells_dropped"] == 3 and c["doorbells"] == 0, c
    assert (c["db_bad_write"], c["db_qp_not_rts"]) == (2, 1), c
    await a.ring_nvshmem()
    pred = env.check(await env.drain())


async def _isolated(dut, cases, mtu, dma_latency):
    env, (qp,) = await env_with(dut, mtu=mtu, dma_latency=dma_latency)
    posted = []
    for kind, n, offset in cases:
        if kind == "pointer":
            addr, _ = env.payload(n, offset=offset)
            w = qp.post_write(0x100, 1, local_addr=addr, length=n)
        else:
            w = qp.post_write(0x100, 1, inline=bytes(range(n)))
        await qp.ring_nvshmem()
        await qp.cq.poll(1, timeout_cycles=20 * dma_latency + 20_000)
        await ClockCycles(dut.clk, 50)
        posted.append(w)
    env.check(await env.drain())
    env.check_cycles()
    rows = env.check_timing(posted)
    for (kind, n, offset), row in zip(cases, rows):
        dut._log.info("%-7s %5d B (offset %3d): doorbell->first byte %4d cycles, doorbell->CQE %4d cycles",
                      kind, n, offset, row["db_to_first_beat"], row["db_to_cqe"])


@cocotb.test()
async def isolated_latency(dut):
    """Doorbell-to-wire and doorbell-to-CQE cycles of isolated WQEs equal the model's, exactly (1 us DMA)."""
    await _isolated(dut, [("pointer", 64, 0), ("inline", 8, 0), ("pointer", 1000, 5), ("inline", 150, 0),
                          ("inline", 220, 0), ("pointer", 0, 0), ("pointer", 9000, 5), ("pointer", 20000, 0)],
                    4096, 500)


@cocotb.test()
async def isolated_latency_small_mtu(dut):
    """The same with a 256-byte MTU (many packets, wire-paced) and a 100-cycle DMA latency."""
    await _isolated(dut, [("pointer", 256, 0), ("pointer", 1000, 100), ("inline", 200, 0), ("pointer", 5000, 77)],
                    256, 100)


@cocotb.test()
async def back_to_back_stream(dut):
    """8 QPs of back-to-back WRITEs (1 us DMA, MTU 1024): every frame and CQE at the cycle model's cycle."""
    from spec.params import wire_bytes
    env, qps = await env_with(dut, 8, sq_depth=8, collapsed=True, cq_depth=0, mtu=1024)
    sizes = [4096, 2000, 1024, 3000, 777, 4096, 1500, 2500, 4000, 1100, 3333, 2048, 900, 4096, 1234, 3900]
    for qp in qps:
        for i, n in enumerate(sizes):
            addr, _ = env.payload(n, offset=(qp.qpn * 29 + i * 7) % 128, seed=qp.qpn * 16 + i)
            qp.post_write(0x1000_0000 * qp.qpn + 0x10000 * i, 7, local_addr=addr, length=n,
                          signaled=(i % 8 == 7))
    for qp in qps:
        await qp.ring_nvshmem()
    pred = env.check(await env.drain())
    await env.check_counters(pred)
    env.check_cycles()
    got = env.wire.frames
    span = got[-1].end_bytes - got[0].start_bytes
    busy = sum(wire_bytes(len(f.data)) for f in got)
    assert busy / span > 0.98, f"the wire idled: busy {busy} of {span} byte-times"
    dut._log.info("%d frames: wire busy %d of %d byte-times (%.1f%%), goodput %.1f Gb/s", len(got), busy, span,
                  100 * busy / span, pred.totals.payload_bytes * 8 / (span * 8 / 400))


def _runs(frames):
    """The wire's frames as runs of one QP: [(qpn, frames in a row)]."""
    runs = []
    for f in frames:
        q = read_field(BTH, "dqpn", f.data, OFF_BTH) - 0x1000
        if runs and runs[-1][0] == q:
            runs[-1][1] += 1
        else:
            runs.append([q, 1])
    return runs


@cocotb.test()
async def weighted_share(dut):
    """Weights 1:2:4 (set through QP_MODIFY): turns of 1, 2 and 4 quanta of WQEs in a row, shares 1:2:4."""
    from spec.params import QUANTUM_WQEBBS
    weights = (1, 2, 4)
    rounds = 8                           # the first turns (FIRST_TURN_WQEBBS) take most of one
    env, qps = await env_with(dut, 3, sq_depth=12, collapsed=True, cq_depth=0, dma_latency=250)
    for qp, w in zip(qps, weights):
        await env.set_weight(qp, w)
        for i in range(rounds * w * QUANTUM_WQEBBS):
            qp.post_write(0x1000 * i, 1, inline=bytes([qp.qpn, i & 0xFF] * 4), signaled=(i % 32 == 31))
    for qp in qps:
        await qp.ring_nvshmem()          # all posted: every QP is backlogged from the start
    pred = env.check(await env.drain())
    env.check_cycles()
    runs = _runs(env.wire.frames)
    # Once every QP is backlogged the frames come in turns of weight x quantum, in QP order:
    # the longest stretch of such turns must hold at least 5 whole rounds.
    best = cur = []
    for q, n in runs:
        turn = n == weights[q] * QUANTUM_WQEBBS
        in_order = len(cur) < 3 and q not in [c[0] for c in cur] or len(cur) >= 3 and q == cur[-3][0]
        cur = cur + [(q, n)] if turn and in_order else ([(q, n)] if turn else [])
        best = max(best, cur, key=len)
    assert len(best) >= 15, f"no 5 whole rounds of weighted turns: runs {runs}"
    best = best[:len(best) // 3 * 3]     # whole rounds
    counts = [sum(n for q, n in best if q == k) for k in range(3)]
    dut._log.info("%d weighted turns in a row: frames per QP %s; runs %s", len(best), counts, runs)
    for c, w in zip(counts, weights):
        assert abs(c / counts[0] - w) / w < 0.02, counts


@cocotb.test()
async def straddling_wqes(dut):
    """WQEs of 1-4 WQEBBs across quantum ends (read past the quantum, skip after), and a doorbell
    that stops inside a WQE (the WQE waits, is fetched again after the next doorbell)."""
    env, (qp, qp1) = await env_with(dut, 2, sq_depth=10, dma_latency=200)
    sizes = [8, 100, 60, 180, 8, 150, 92, 220] * 12
    for i, n in enumerate(sizes):
        qp.post_write(0x1000 * i, 2, inline=bytes((i + j) & 0xFF for j in range(n)), signaled=(i % 16 == 15))
    await qp.ring_nvshmem()                      # one doorbell: many quantum-clamped bursts
    for i in range(8):
        qp1.post_write(0x2000 * i, 3, inline=bytes(range(100)), signaled=True)     # 3 WQEBBs each
    mid = qp1.pi - 2
    await qp1.ring_raw(bytes([0, (mid >> 8) & 0xFF, mid & 0xFF, 0, 0, 0, 1, 0]))   # limit inside the last WQE
    await ClockCycles(dut.clk, 1500)
    assert len([f for f in env.wire.frames if read_field(BTH, "dqpn", f.data, OFF_BTH) == 0x1001]) == 7
    await qp1.ring_nvshmem()
    pred = env.check(await env.drain())
    env.check_cycles()
    await env.check_counters(pred)


@cocotb.test()
async def straddling_wqes_short_reach(dut):
    """A QP created for WQEs of at most 2 WQEBBs (QP_MAX_WQEBBS 2) that posts 1-4: a turn cut by
    the quantum reads one WQEBB past the cut, so a larger WQE across it runs past the burst, is
    cut, and is fetched again with the next turn (the bursts behind it are dropped)."""
    env = await NicEnv(dut, dma_latency=200).start()
    cq = await env.cq(0, 6)
    qp = await env.qp(0, cq, log_depth=10, max_wqebbs=2)
    sizes = [8, 100, 60, 180, 8, 150, 92, 220] * 24
    for i, n in enumerate(sizes):
        qp.post_write(0x1000 * i, 2, inline=bytes((i + j) & 0xFF for j in range(n)), signaled=(i % 16 == 15))
    await qp.ring_nvshmem()                      # one doorbell: many quantum-clamped bursts
    pred = env.check(await env.drain())
    env.check_cycles()
    await env.check_counters(pred)


@cocotb.test()
async def byte_bound_turns(dut):
    """A turn ends once its WQEs carry weight x TURN_BYTES (16 KiB) of payload: two QPs of
    8 KiB WRITEs, weights 1 and 2, after a warm-up that lets the parser learn their bounds
    (2 and 4 WQEs), alternate two and four messages a turn; 8-byte WRITEs after them
    double the bounds turn by turn (a bounded turn that carries less) until they go in
    long turns again. Frames at the cycle model's cycles."""
    env = await NicEnv(dut).start()
    cq = await env.cq(0, 8)
    qps = [await env.qp(q, cq, log_depth=9, weight=1 + q) for q in range(2)]
    size = 8192

    def post(qp, n, length):
        for i in range(n):
            if length > 28:
                addr, _ = env.payload(length, seed=qp.qpn * 1000 + len(qp.posted))
                qp.post_write(0x10_0000_0000 + len(qp.posted) * length, 0xBEEF, local_addr=addr, length=length,
                              signaled=i == n - 1)
            else:
                qp.post_write(0x10_0000_0000 + len(qp.posted) * 64, 0xBEEF, inline=bytes([i]) * length,
                              signaled=i == n - 1)
    for phase, (n, length) in enumerate(((4, size), (96, size), (200, 8))):
        for qp in qps:
            post(qp, n, length)
        for qp in qps:
            await qp.ring_nvshmem()
        await env.drain(2_000_000)
    pred = env.check(await env.drain())
    env.check_cycles()
    await env.check_counters(pred)
    # runs of one QP's messages on the wire, per phase (8 KiB: 2 frames a message)
    owner = [(read_field(BTH, "dqpn", f.data, OFF_BTH), len(f.data) > 1000) for f in env.wire.frames]
    big = [q - 0x1000 for q, b in owner if b][8 * 2:]    # phase 2's frames (after the warm-up's)
    small = [q for q, b in owner if not b]
    def runs(seq):                                    # [(QP, frames in a row)]
        out, k = [], 1
        for a, b in zip(seq, seq[1:]):
            if a == b:
                k += 1
            else:
                out.append((a, k))
                k = 1
        return out + [(seq[-1], k)]
    big_runs = runs(big)
    assert len(big) == 2 * 96 * 2, len(big)
    # QP 1 four messages (8 frames) a turn, QP 0 two (4) between them; QP 0 had two turns
    # before QP 1's doorbell was in, and sends its rest alone
    assert [k for q, k in big_runs if q == 1] == [8] * 24, big_runs
    assert [k for q, k in big_runs if q == 0][1:-1] == [4] * 23, big_runs
    small_runs = runs(small)
    # the bounds double, each a fetch pipeline's worth of turns (~16) after the last:
    # QP 0's turns 2, then 4, then 8, QP 1's 4 then 8, before each QP's rest (QP 0's
    # first small turn is its big phase's last, 4 frames)
    def steps(q, skip):
        ks = [k for p, k in small_runs if p == q][skip:-1]
        return [k for i, k in enumerate(ks) if i == 0 or k != ks[i - 1]]
    assert steps(0x1000, 1) == [2, 4, 8], small_runs
    assert steps(0x1001, 0) == [4, 8], small_runs


@cocotb.test()
async def blueflame(dut):
    """BlueFlame: a one-WQEBB WQE stored with its doorbell goes out without a read of the
    send queue, doorbell to first byte <= 32 cycles; when the QP has work queued the store
    counts as a plain doorbell and the WQE is fetched in order."""
    env, (qp, busy) = await env_with(dut, 2, sq_depth=8)
    rows = []
    for i, n in enumerate((8, 1, 12, 28)):
        w = qp.post_write(0x100 * i, 9, inline=bytes(range(i, i + n)))
        reads = len(env.mem.reads)
        cycle = await qp.ring_blueflame()
        await qp.cq.poll(1, timeout_cycles=5000)
        first = next(f for f in env.wire.frames if f.first_cycle >= cycle)
        assert [r for r in env.mem.reads[reads:] if r.id == 0] == [], "BlueFlame WQE was read from memory"
        rows.append(first.first_cycle - cycle)
        assert first.first_cycle - cycle <= 32, rows
        await ClockCycles(dut.clk, 20)
    # A busy QP: WQEs queued before the BlueFlame store, which must then wait its turn.
    for i in range(40):
        busy.post_write(0x10000 + 0x100 * i, 9, inline=bytes([i] * 8), signaled=(i % 8 == 7))
    await busy.ring_nvshmem()
    busy.post_write(0x20000, 9, inline=bytes(8))
    await busy.ring_blueflame()
    pred = env.check(await env.drain())
    env.check_cycles()
    await env.check_counters(pred)
    dut._log.info("BlueFlame doorbell -> first byte on the wire: %s cycles", rows)


def _write_body(ds, *, inline=None):
    """The segments after the ctrl segment of an RDMA WRITE: a remote address, then a
    pointer to 8 bytes of GPU memory (or ``inline`` data), zero padded to ``ds``."""
    body = (0x3000_0000 + 64 * ds).to_bytes(8, "big") + (0x77).to_bytes(4, "big") + bytes(4)
    if inline is not None:
        body += (len(inline) | INLINE_FLAG).to_bytes(4, "big") + inline
    else:
        body += (8).to_bytes(4, "big") + (0x100).to_bytes(4, "big") + (0x4000_0000).to_bytes(8, "big")
    return body + bytes(max(0, 16 * (ds - 1) - len(body)))


@cocotb.test()
async def wqe_sizes(dut):
    """Every ds value 0..63 of a NOP and of a pointer WRITE (and inline WRITEs whose ds
    does not fit their data), each on its own QP and followed by a NOP: the engine and the
    model agree on which are malformed (an error CQE, then the NOP after it flushes at the
    position the ds claims: ``max(1, ceil(ds / 4))`` WQEBBs on) and, for the good
    ones, on the WQE's size in WQEBBs (the NOP after it completes at its position); a
    WQE whose ctrl index field is wrong completes with its position as wqe_counter.
    Icarus runs a dozen ds values (the edges), Verilator all."""
    verilator = cocotb.SIM_NAME.lower().startswith("verilator")
    dss = range(64) if verilator else (0, 1, 2, 3, 4, 5, 15, 16, 17, 60, 61, 63)
    env = await NicEnv(dut).start()
    cq = await env.cq(0, 10)
    cases = [(WqeOp.NOP, ds, b"") for ds in dss] + [(WqeOp.RDMA_WRITE, ds, _write_body(ds)) for ds in dss]
    cases += [(WqeOp.RDMA_WRITE, ds, _write_body(ds, inline=b"x" * 20)) for ds in (3, 4, 5)]   # 20 B needs ds 4
    for q, (op, ds, body) in enumerate(cases):
        qp = await env.qp(q, cq, log_depth=6)
        qp.post_raw(op, ds, body)
        qp.post_nop()
        await qp.ring_nvshmem()
    wrong = await env.qp(len(cases), cq, log_depth=6)
    wrong.post_raw(WqeOp.NOP, 1, index=0x1234)            # its wqe_counter is 0, its position
    wrong.post_nop()
    await wrong.ring_nvshmem()
    pred = env.check(await env.drain())
    await env.check_counters(pred)
    # Which are good, stated here (not taken from the model): a NOP of ds 1..63, a WRITE
    # of ds 2 (no data) or 3..2 + REQUESTER_GATHER (a pointer, then empty segments: a
    # gather list), the inline WRITE whose data fills its ds (4).
    npoint = 2 * len(dss)
    good = {q for q, (op, ds, _) in enumerate(cases[:npoint])
            if (op == WqeOp.NOP and 1 <= ds <= 63) or (op == WqeOp.RDMA_WRITE and 2 <= ds <= 2 + P.REQUESTER_GATHER)}
    good.add(npoint + 1)
    bad = len(cases) - len(good)                          # each: its error CQE and the NOP's flush
    assert (pred.totals.error_cqes, pred.totals.flushed_wqes) == (2 * bad, bad), (pred.totals, bad)
    by_qp = {}
    for c in await cq.poll(pred.totals.cqes, 1000):
        by_qp.setdefault(c.qpn, []).append(c)
    for q, (op, ds, _) in enumerate(cases):
        if q in good:                                     # the NOP after it, at its position
            assert [c.wqe_counter for c in by_qp[q]] == [0, max(1, -(-ds // 4))], (q, op, ds)
        else:
            assert [(c.wqe_counter, c.opcode, c.syndrome) for c in by_qp[q]] == \
                [(0, CqeOp.REQ_ERR, Syndrome.LOCAL_QP_OP_ERR),
                 (max(1, -(-ds // 4)), CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR)], (q, op, ds)
    assert [c.wqe_counter for c in by_qp[len(cases)]] == [0, 1]


@cocotb.test()
async def stale_and_over_depth_doorbells(dut):
    """Doorbells behind the QP's producer index, or more than the send-queue depth past
    it, are dropped and counted once each (also two within a few cycles); they never
    replay the ring, and good work goes on after them exactly as the model says."""
    env, (qp,) = await env_with(dut, 1, sq_depth=4)               # a ring of 16 WQEBBs
    for k in range(12):
        qp.post_write(0x1000 * k, 0x55, inline=bytes([k]) * 8)
    await qp.ring_nvshmem()
    await env.drain()
    pi = qp.pi                                                   # 12: every WQE done
    ring = qp.ring_raw
    db = lambda limit: (((limit & 0xFFFF) << 8).to_bytes(4, "big") + (qp.qpn << 8).to_bytes(4, "big"))  # noqa: E731
    await ring(db(pi - 12))                  # stale: the whole ring again
    await ring(db(pi - 1))                   # stale by one
    await ring(db(pi + 17))                  # 17 WQEBBs past the fetch index: more than the ring
    await ring(db(pi + 0x7000))              # far ahead (not behind: less than 2^15)
    await ring(db(pi))                       # no new work: applied, nothing sent
    await ClockCycles(dut.clk, 2000)
    assert len(env.wire.frames) == 12, f"{len(env.wire.frames) - 12} frames replayed"
    c = await env.ctl.read_counters()
    got = {k: c[k] for k in ("doorbells", "doorbells_dropped", "db_stale", "db_over_depth", "db_bad_write")}
    assert got == {"doorbells": 2, "doorbells_dropped": 4, "db_stale": 2, "db_over_depth": 2, "db_bad_write": 0}, got
    # two drops close together, one by the QP table (stale) and one by the decoder (a bad
    # offset), started 0..9 cycles apart so that for some gap both strobes fall in one
    # cycle: each is counted, always
    page = qp.qpn << 12
    for gap in range(10):
        first = cocotb.start_soon(env.gpu.db_master.write(page | 0x800, db(pi - 3)))
        await ClockCycles(dut.clk, gap)
        await env.gpu.db_master.write(page | 0x808, db(pi))
        await first
    await ClockCycles(dut.clk, 200)
    c = await env.ctl.read_counters()
    assert (c["doorbells_dropped"], c["db_stale"], c["db_bad_write"], c["doorbells"]) == (24, 12, 10, 2), c
    for k in range(12, 16):                  # and the QP goes on
        qp.post_write(0x1000 * k, 0x55, inline=bytes([k]) * 8)
    await qp.ring_nvshmem()
    pred = env.check(await env.drain())
    await env.check_counters(pred)


def _payloads(frames):
    """The payload of each request frame (after BTH, RETH and ImmDt; before pad and ICRC)."""
    reth_ops, imm_ops = (0x06, 0x0A, 0x0B), (0x03, 0x05, 0x09, 0x0B)
    out = []
    for f in frames:
        op = f[OFF_BTH]
        start = OFF_BTH + 12 + (16 if op in reth_ops else 0) + (4 if op in imm_ops else 0)
        out.append(f[start:len(f) - 4 - ((f[OFF_BTH + 1] >> 4) & 3)])
    return out


@cocotb.test()
async def gather_lists(dut):
    """Gather lists of 2, 3 and 4 pointer segments (``REQUESTER_GATHER``) on WRITE, WRITE
    with immediate, SEND and SEND with immediate at MTU 256: odd lengths and addresses, empty
    segments (also first, also all), segments across 4 KiB, packets spanning segments and a
    segment spanning packets, 4 segments inside one beat, one-segment WQEs between them.
    Frames and CQEs as the golden model's, cycles as the cycle model's, and each message's
    payload, taken from its frames, the concatenation of its segments' bytes."""
    env, (qp,) = await env_with(dut, sq_depth=8, mtu=256)
    cases = [   # (opcode, [(length, offset from a 4 KiB boundary)])
        (WqeOp.RDMA_WRITE, [(300, 4096 - 37), (77, 5)]),
        (WqeOp.RDMA_WRITE_IMM, [(1, 127), (0, 3), (513, 64)]),
        (WqeOp.SEND, [(100, 17), (200, 4096 - 100), (0, 0), (333, 91)]),
        (WqeOp.SEND_IMM, [(3, 1), (5, 2), (7, 3), (11, 4)]),
        (WqeOp.RDMA_WRITE, [(256, 0), (256, 128)]),
        (WqeOp.RDMA_WRITE, [(64, 64)]),                          # one segment between them
        (WqeOp.SEND, [(0, 5), (40, 9)]),
        (WqeOp.RDMA_WRITE, [(0, 1), (0, 2), (0, 3), (0, 4)]),    # 0 bytes: a header-only packet
        (WqeOp.RDMA_WRITE_IMM, [(5000, 1234), (129, 4096 - 1), (2, 126)]),
        (WqeOp.SEND, [(255, 1), (1, 0), (256, 0), (3, 125)]),
    ]
    want = []
    for i, (op, segs) in enumerate(cases):
        gl, data = [], b""
        for k, (n, off) in enumerate(segs):
            addr, d = env.payload(n, align=4096, offset=off, seed=7 * i + k)
            gl.append((addr, n))
            data += d
        if op in (WqeOp.SEND, WqeOp.SEND_IMM):
            qp.post_send(segments=gl, imm=0xC0DE0000 + i if op == WqeOp.SEND_IMM else None)
        else:
            qp.post_write(0x5000_0000 + 0x10000 * i, 0x99, segments=gl, opcode=op, imm=0xD00D0000 + i)
        want.append(data)
        if i % 3 == 2:
            await qp.ring_nvshmem()
    await qp.ring_nvshmem()
    pred = env.check(await env.drain())
    env.check_cycles()
    await env.check_counters(pred)
    payloads = _payloads([f.data for f in env.wire.frames])
    at = 0
    for data in want:
        k = max(1, -(-len(data) // 256))
        assert b"".join(payloads[at:at + k]) == data, f"message {want.index(data)}: payload is not its gather list"
        at += k
    assert at == len(payloads)


@cocotb.test()
async def gather_list_too_long(dut):
    """A data WQE of 5 pointer segments, one more than ``REQUESTER_GATHER``, is malformed
    (LOCAL_QP_OP_ERR, no packet) and fails its QP (the WQEs after it flush); 4 before it
    on the same QP and on another QP go on. Frames and CQEs as the golden model's."""
    env, (a, b) = await env_with(dut, 2, sq_depth=8, mtu=256)
    segs = [env.payload(10 + k, offset=k)[0] for k in range(5)]
    a.post_write(0x100, 1, segments=[(s, 10 + k) for k, s in enumerate(segs[:4])])
    a.post_write(0x200, 1, segments=[(s, 10 + k) for k, s in enumerate(segs)])
    a.post_send(segments=[(s, 10 + k) for k, s in enumerate(segs[:2])], signaled=False)
    a.post_nop(signaled=False)
    await a.ring_nvshmem()
    b.post_send(segments=[(s, 10 + k) for k, s in enumerate(segs)])
    b.post_send(segments=[(s, 10 + k) for k, s in enumerate(segs[1:])])
    await b.ring_nvshmem()
    pred = env.check(await env.drain())
    await env.check_counters(pred)
    cqes = await a.cq.poll(4, timeout_cycles=1000)
    assert [(c.opcode, c.syndrome, c.wqe_counter) for c in cqes] == [
        (CqeOp.REQ, 0, 0), (CqeOp.REQ_ERR, Syndrome.LOCAL_QP_OP_ERR, 2),     # 2 WQEBBs each
        (CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR, 4), (CqeOp.REQ_ERR, Syndrome.WR_FLUSH_ERR, 5)]
    assert [c.opcode for c in await b.cq.poll(2, timeout_cycles=1000)] == [CqeOp.REQ_ERR, CqeOp.REQ_ERR]
    assert len(env.wire.frames) == 1
