"""System regressions of the receive side (cocotb): the NIC as RC responder.

A peer requester is played by the golden model (model/frames.py): its frames enter on
MAC RX at the 400G line rate, with duplicates, gaps and go-back-N resends, damaged
frames, access violations and frames for QPs that are not ready mixed in. The model
responder (``RcResponder``) sees the same frames; the NIC's ACK/NAK frames on MAC TX,
the bytes in GPU memory and the receive counters must equal its.
"""
import random

from cocotb.triggers import RisingEdge

import cocotb

from model.frames import QpContext, build_rc_frame, build_write_frames
from model.parse import build_response
from spec.formats import Aeth, Op
from tb.env import PORT_IP, PORT_MAC
from model.memory import SparseMemory
from model.read_atomic import build_atomic_request, build_read_request
from tb.rc_env import DST, KEY, KEY_ATOMIC, KEY_RO, match_coalesced, peer_port, traffic, responder_env, run_and_check, not_roce
from tb.clock import ClockCycles

@cocotb.test()
async def responder_writes_with_faults(dut):
    """WRITEs of every shape from 3 peer QPs with faults mixed in: ACK/NAK frames, memory and counters as the model."""
    rnd = random.Random(5)
    env, model, peers = await responder_env(dut, rnd, {1: 256, 2: 1024, 3: 512}, {1: 1, 2: 2, 3: 4})
    frames = traffic(rnd, peers, 6)
    expect, c = await run_and_check(env, model, frames)
    reasons = {e.reason for e in expect}
    for r in (None, "psn_duplicate", "psn_out_of_order", "access_error", "qp_not_ready", "bad_address"):
        assert r in reasons, f"the traffic did not exercise {r}"
    dut._log.info(f"{len(frames)} frames, counters {c}, MAC RX stalls {env.rx.stall_cycles}")


@cocotb.test()
async def responder_line_rate(dut):
    """Back-to-back WRITEs of all sizes at the 400G line rate: MAC RX is never held back."""
    rnd = random.Random(9)
    env, model, peers = await responder_env(dut, rnd, {1: 4096, 3: 1024}, {1: 8, 3: 1})
    frames = traffic(rnd, peers, 8, faults=False, aligned=True)
    await run_and_check(env, model, frames)
    assert env.rx.stall_cycles == 0, f"MAC RX waited {env.rx.stall_cycles} cycles"


@cocotb.test()
async def rx_every_frame_size(dut):
    """Every frame size from 60 to 300 bytes (and longer ones), back to back at the 400G
    line rate: floods of 1500 frames for each size up to 75 bytes (not-RoCE frames; 62-byte
    ACKs, 74-byte WRITE ONLYs without payload and 75-byte ones with 1 byte, each the first
    half of one QP, then alternating between two QPs, so that two QPs' ACKs or requests
    end in one beat), which need more than one frame per cycle and would outrun a path
    taking one (its buffers hold about 100 such frames; each such WRITE is answered by
    its own ACK, each 1-byte one is its own write: a quarter each to one byte, to
    consecutive bytes, 256 bytes apart and at random, so the last value of a byte shows
    the order), runs of 16 WRITE ONLYs of each size from 76 bytes (2-226 payload bytes,
    alternating between two QPs), then a random mix. MAC RX is never held back, and ACK frames, memory and
    counters equal the model's. Icarus runs about 50 cycles a second on this design, so there the floods
    are 40 frames, the runs 1 and the mix 40 (the same checks on a shorter stream)."""
    rnd = random.Random(11)
    flood, run, mix = (1500, 16, 400) if cocotb.SIM_NAME.lower().startswith("verilator") else (40, 1, 40)
    env, model, peers = await responder_env(dut, rnd, {1: 4096, 3: 1024}, {1: 8, 3: 1})
    psn = {q: ctx.start_psn for q, (ctx, _) in peers.items()}
    va = [DST]

    def write(q, p, at=None):
        ctx, _ = peers[q]
        # no IBTA pad, so that every frame size occurs (a peer that does not pad; the
        # receive path takes such frames, docs/interoperability.md)
        (f,) = build_write_frames(ctx, peer_port(q), va[0] if at is None else at, KEY,
                                  bytes(rnd.randrange(256) for _ in range(p)), psn[q], pad=False)
        psn[q] = (psn[q] + 1) & 0xFFFFFF
        if at is None:
            va[0] += p + rnd.randrange(1, 64)
        return f

    def one_byte_at(k):
        # 1-byte WRITEs (75-byte frames, 1.01 a cycle): a quarter of the flood each to one
        # byte, to consecutive bytes, 256 bytes apart, at random (above what va[0] reaches)
        j = k % (flood // 4)
        return [DST + 0xE0005, DST + 0xE1000 + j, DST + 0xE2003 + 256 * j,
                DST + 0xFA000 + rnd.randrange(0x6000)][min(3, 4 * k // flood)]

    def ack(q):
        ctx, _ = peers[q]
        return build_response(QpContext(qpn=ctx.qpn, remote_qpn=q, dmac=PORT_MAC, dip=PORT_IP, mtu=ctx.mtu),
                              peer_port(q), rnd.randrange(1 << 24), Aeth.ACK, rnd.randrange(1 << 24))

    def frame(n, k):
        if n == 62:
            return ack(1 if k < flood // 2 or k % 2 else 3)
        if n == 74:
            return write(1 if k < flood // 2 or k % 2 else 3, 0)
        if n == 75:
            return write(1 if k < flood // 2 or k % 2 else 3, 1, one_byte_at(k))
        if n < 74:
            return not_roce(n, k)
        return write(1 if k % 2 or n > 74 + 1024 else 3, n - 74)       # QP 3's MTU is 1024

    frames = [frame(n, k) for n in list(range(60, 301)) + [512, 1024, 1500, 1098]
              for k in range(flood if n <= 75 else run)]
    for k in range(mix):                     # a mix of every kind and size
        n = rnd.choice([rnd.randrange(60, 200), 62, rnd.randrange(74, 90)])
        frames.append(frame(n, k))
    acks = [k for k, f in enumerate(frames) if len(f) == 62]
    await run_and_check(env, model, frames, acks=acks)
    dut._log.info(f"{len(frames)} frames, MAC RX stalls {env.rx.stall_cycles}")
    assert env.rx.stall_cycles == 0, f"MAC RX waited {env.rx.stall_cycles} cycles"


@cocotb.test()
async def duplicate_flood(dut):
    """A flood of duplicate WRITEs, each owed its own ACK (the ACK of the last accepted
    PSN), back to back at the 400G line rate: 0-byte ones (74 bytes, 1.02 a cycle) to one
    QP, then to two QPs alternating, then 1-byte ones: MAC RX is never held back, and
    every ACK frame is the model's, one for one. Icarus: 60 frames per part."""
    rnd = random.Random(13)
    n = 1000 if cocotb.SIM_NAME.lower().startswith("verilator") else 60
    env, model, peers = await responder_env(dut, rnd, {1: 1024, 3: 1024}, {1: 1, 3: 1})
    firsts = {q: build_write_frames(ctx, peer_port(q), DST + 0x1000 * q, KEY, b"a" * 8, ctx.start_psn)[0]
              for q, (ctx, _) in peers.items()}
    dup0 = {q: build_write_frames(ctx, peer_port(q), DST + 0x1000 * q, KEY, b"", ctx.start_psn)[0]
            for q, (ctx, _) in peers.items()}
    dup1 = {q: build_write_frames(ctx, peer_port(q), DST + 0x1000 * q, KEY, b"b", ctx.start_psn)[0]
            for q, (ctx, _) in peers.items()}
    frames = list(firsts.values()) + [dup0[1]] * n + [dup0[1 + 2 * (k % 2)] for k in range(n)] \
        + [dup1[1 + 2 * (k % 2)] for k in range(n)]
    await run_and_check(env, model, frames)
    dut._log.info(f"{len(frames)} frames, MAC RX stalls {env.rx.stall_cycles}")
    assert env.rx.stall_cycles == 0, f"MAC RX waited {env.rx.stall_cycles} cycles"


@cocotb.test()
async def duplicate_flood_while_sending(dut):
    """The same flood of 0-byte duplicate WRITEs while the NIC sends 4 KiB WRITEs of its
    own at the line rate: the ACKs take their turn at data frame boundaries."""
    rnd = random.Random(17)
    n = 1500 if cocotb.SIM_NAME.lower().startswith("verilator") else 60
    env, model, peers = await responder_env(dut, rnd, {1: 1024}, {1: 1})
    ctx, _ = peers[1]
    first = build_write_frames(ctx, peer_port(1), DST, KEY, b"a" * 8, ctx.start_psn)[0]
    dup = build_write_frames(ctx, peer_port(1), DST, KEY, b"", ctx.start_psn)[0]
    sender = await env.qp(9, env.cqs[0], mtu=4096)
    addr, _ = env.payload(4096)
    for k in range(40):
        sender.post_write(0x5000_0000 + 0x1000 * k, 0x99, local_addr=addr, length=4096, signaled=False)
    await sender.ring_nvshmem()
    await ClockCycles(dut.clk, 1500)                 # the data frames are flowing
    frames = [first] + [dup] * n
    expect = [model.receive(f) for f in frames]
    for f in frames:
        env.rx.send(f)
    while not env.rx.idle:
        await ClockCycles(dut.clk, 64)
    await ClockCycles(dut.clk, 3000)
    acks = [f.data for f in env.wire.frames if len(f.data) == 62]
    merged = match_coalesced(acks, [e.response for e in expect if e.response is not None])
    c = await env.ctl.read_counters()
    assert (c["acks_sent"], c["acks_coalesced"]) == (len(acks), merged), c
    dut._log.info(f"{len(frames)} frames, MAC RX stalls {env.rx.stall_cycles}, {len(acks)} ACKs "
                  f"({merged} coalesced), {len(env.wire.frames) - len(acks)} data frames")
    assert env.rx.stall_cycles == 0, f"MAC RX waited {env.rx.stall_cycles} cycles"
    assert merged > 0


@cocotb.test()
async def put_with_signal_ordering(dut):
    """NVSHMEM's put-with-signal as the NIC's responder sees it: on each of 3 QPs, data
    WRITEs (1 to 300 bytes) then an 8-byte flag WRITE to another line, back to back at
    line rate, into a GPU memory whose writes land only at their write response, after
    a random 1..80 cycles per burst on each of the two write ports. A watcher reads the
    memory every cycle: a flag is never visible before the data it signals (the write
    issuer keeps a QP's writes on one port while any is in flight; without that rule
    the flags overtake their data, found so). Memory, ACKs and counters as the model's."""
    rnd = random.Random(21)
    env, model, peers = await responder_env(dut, rnd, {1: 1024, 2: 1024, 3: 1024}, {1: 1, 2: 4, 3: 8},
                                            b_latency=(1, 80), visible_at_b=True)
    n = 40 if cocotb.SIM_NAME.lower().startswith("verilator") else 8
    psn = {q: ctx.start_psn for q, (ctx, _) in peers.items()}
    frames, signals = [], []
    for k in range(n):
        for q, (ctx, _) in peers.items():
            size = rnd.choice([1, 4, 8, 64, 200, 300])
            data_va = DST + 0x10000 * q + 0x200 * k + rnd.randrange(64)
            data = bytes(rnd.randrange(256) for _ in range(size))
            flag_va = DST + 0x80000 + 0x1000 * q + 8 * k
            flag = (k + 1).to_bytes(8, "little")
            for va, payload in ((data_va, data), (flag_va, flag)):
                fs = build_write_frames(ctx, peer_port(q), va, KEY, payload, psn[q])
                psn[q] = (psn[q] + len(fs)) & 0xFFFFFF
                frames += fs
            signals.append((data_va, data, flag_va, flag))
    early = []

    async def watch():
        while True:
            await RisingEdge(dut.clk)
            for data_va, data, flag_va, flag in signals:
                if env.mem.read(flag_va, 8) == flag and env.mem.read(data_va, len(data)) != data:
                    early.append((hex(flag_va), env.counter.now))
    watcher = cocotb.start_soon(watch())
    # (8 bursts in flight per port at up to 80 cycles each: the last writes land late)
    await run_and_check(env, model, frames, settle=6000)
    watcher.cancel()
    assert not early, f"{len(early)} times a flag was visible before its data, first {early[0]}"
    dut._log.info(f"{len(frames)} frames, {len(signals)} put-with-signals")



def _flood_frames(peers, kind, n, count):
    """``count`` frames of ``n`` bytes of one kind, back to back (no IBTA pad: every size)."""
    q = {"dup_last": 1, "dup_only": 1, "rnr": 2, "ahead": 3, "read": 4, "atomic": 5, "rnr_empty": 6,
         "rnr_prime": 6}[kind]
    ctx, _ = peers[q]
    port = peer_port(q)
    if kind == "dup_last":          # duplicate WRITE LASTs (58 bytes + payload): ACK each
        return [build_rc_frame(ctx, port, Op.WRITE_LAST, ctx.start_psn - 3, bytes(n - 58), pad=False)] * count
    if kind == "dup_only":          # duplicate WRITE ONLYs (74 bytes + payload): ACK each
        return [build_write_frames(ctx, port, DST, KEY, bytes(n - 74), ctx.start_psn - 2, pad=False)[0]] * count
    if kind == "rnr":               # SEND ONLYs (58 bytes + payload) to a QP without receive queue: RNR NAK each
        return [build_rc_frame(ctx, port, Op.SEND_ONLY, ctx.start_psn, bytes(n - 58), pad=False)] * count
    if kind in ("rnr_empty", "rnr_prime"):  # the same to a QP whose receive queue has nothing posted
        return [build_rc_frame(ctx, port, Op.SEND_ONLY, ctx.start_psn, bytes(n - 58), pad=False)] * count
    if kind == "ahead":             # WRITE LASTs with a PSN ahead: one sequence NAK, then silent drops
        return [build_rc_frame(ctx, port, Op.WRITE_LAST, ctx.start_psn + 5 + k % 7, bytes(n - 58), pad=False)
                for k in range(count)]
    if kind == "read":              # duplicate READ requests (74 bytes), each executed again
        return [build_read_request(ctx, port, DST + 0x100, KEY_RO, 8, ctx.start_psn)] * count
    if kind == "atomic":            # duplicate FETCH_ADDs (86 bytes), answered from the replay record
        return [build_atomic_request(ctx, port, Op.FETCH_ADD, DST + 0x800, KEY_ATOMIC, 5, 0, ctx.start_psn)] * count
    raise ValueError(kind)


# (kind, frame sizes): every size from the kind's smallest (60 bytes: 2 payload bytes
# behind a BTH) to 100, then FLOOD_LARGE. Frames under 76 bytes arrive more than one a
# cycle: 600 of each size, more than the receive path's buffers hold, so that a path taking
# one a cycle would hold MAC RX back (before RxKeepJoin discarded frames still went through
# the resegmenter and the payload writer: 1,000 duplicate WRITE LASTs of 60 bytes held it
# back 132 cycles); 100 of each larger size (they arrive at most one a cycle).
FLOOD_SIZES = [("dup_only", range(74, 101)), ("rnr", range(60, 101)), ("rnr_empty", range(60, 101)),
               ("dup_last", range(60, 101)),
               ("ahead", range(60, 101)), ("read", [74]), ("atomic", [86])]
FLOOD_LARGE = [120, 200, 314, 1058]


def _flood_count(n, verilator):
    if not verilator:
        return 4
    return 600 if n < 76 else 100


@cocotb.test()
async def small_frame_floods(dut):
    """Floods of frames that are not executed, or executed without payload, at the 400G
    line rate, size by size: duplicate WRITE ONLYs and WRITE LASTs (an ACK each),
    SEND ONLYs to a QP without a receive queue (an RNR NAK each: issue 46, 2,000 of them
    held MAC RX back 5,964 cycles, a RecvQueue lookup per RNR NAK), WRITE LASTs with a
    PSN ahead (one sequence NAK, then silent drops), duplicate READ requests (executed
    again) and duplicate FETCH_ADDs (answered from the replay record). Every size from
    the kind's smallest (60 bytes, 74 for a WRITE ONLY) to 100 bytes, then 120, 200, 314
    and 1058 bytes (``FLOOD_SIZES``, counts ``_flood_count``): MAC RX is never held back,
    and the responses, memory and counters equal the model's. Icarus: 4 frames a part."""
    rnd = random.Random(23)
    verilator = cocotb.SIM_NAME.lower().startswith("verilator")
    image = SparseMemory()
    mtus = dict.fromkeys(range(1, 7), 1024)
    env, model, peers = await responder_env(dut, rnd, mtus, dict.fromkeys(mtus, 1), image=image, two_sided=True,
                                            recv_qps=(6,))
    # the READ and the atomic executed once, so that the floods are their duplicates
    frames = [build_read_request(peers[4][0], peer_port(4), DST + 0x100, KEY_RO, 8, peers[4][0].start_psn)]
    frames.append(build_atomic_request(peers[5][0], peer_port(5), Op.FETCH_ADD, DST + 0x800, KEY_ATOMIC, 5, 0,
                                       peers[5][0].start_psn))
    parts, answer_before = {}, {}
    for kind, sizes in FLOOD_SIZES:
        for n in list(sizes) + (FLOOD_LARGE if len(sizes) > 1 else []):
            if kind == "rnr_empty":
                # one SEND first, alone, and its RNR NAK awaited: a QP not asked for a read
                # round trip is not polled, so its first SEND waits for a read of the record
                # (as the first SEND to a QP whose posts are not known does); the flood
                # behind it is answered from the polled record
                parts[len(frames)] = f"rnr_prime:{n}"
                answer_before[len(frames) + 1] = [(6, len(frames))]
                frames += _flood_frames(peers, "rnr_prime", n, 1)
            parts[len(frames)] = f"{kind}:{n}"
            frames += _flood_frames(peers, kind, n, _flood_count(n, verilator))
    await run_and_check(env, model, frames, image=image, parts=parts, settle=2000,
                        answer_before=answer_before)
    stalled = {k: v for k, v in env.part_stalls.items() if v}
    dut._log.info(f"{len(frames)} frames, MAC RX stalls {env.rx.stall_cycles}: {stalled}")
    assert env.rx.stall_cycles == 0, f"MAC RX waited {env.rx.stall_cycles} cycles: {stalled}"
