"""The project's fuzzer (cocotb): bad inputs of every kind, mixed with good work, held to
the golden model. ``make fuzz`` runs it with 100,000 inputs or more (scripts/run_fuzz.py);
``make test`` runs a few thousand of them on Verilator (tests/system/test_fuzz.py).

Four classes, one cocotb test each; every input is drawn from ``random.Random(seed)``, so
a seed and the counts reproduce a run exactly:

- ``fuzz_receive``: frames at MAC RX at the 400G line rate, the responder side: random
  bytes, runts, bit flips, single header fields mutated with the checksums fixed (so
  the frame reaches the check for that field), PSNs behind and ahead, frames over the
  MTU, for QPs not ready, from sources that are not the QP's peer, of opcodes the engine
  does not take, with a bad key or out of bounds, ACK/NAKs for the requester side, all
  among in-order WRITEs from three peers. Oracle: ``RcResponder``.
- ``fuzz_responses``: forged ACK/NAKs for RC QPs with WRITEs outstanding (QPN, source,
  state, AETH, PSN ahead or stale, repeated NAKs, frame-level faults), in bursts at line
  rate between good ACKs. Oracle: ``RcRequester``.
- ``fuzz_wqes``: WQEs of random opcode, ds 0..63 and segment shape, one per QP followed
  by a good NOP, in rounds over 256 QPs. Oracle: ``EngineModel``.
- ``fuzz_doorbells``: UAR writes of random offset, page, QPN field, width, burst length
  and producer index (stale, over the depth, good), on QPs whose rings hold NOPs.
  Oracle: the doorbell rule (``doorbell_verdict`` below, the QP table's) and EngineModel.

Each test checks: nothing hangs (the work the model predicts completes), no byte is
written outside the accepted payloads and the CQs, the counters equal the model's, good
work is byte-exact, and MAC RX is never held back. It writes what it tried and found to
``$FUZZ_REPORT/<class>.json``; on a mismatch it also writes the seed and the inputs up to
the first difference (``repro``) and fails.
"""
import copy
import json
import os
import random
from collections import Counter, deque
from types import SimpleNamespace
from pathlib import Path

import cocotb

from model.cqe import CqContext
from model.frames import Port, QpContext, build_nop_wqe, build_write_frames, ip_bytes, mac_bytes
from model.icrc import icrc, ipv4_checksum
from model.memory import SparseMemory
from model.read_atomic import (build_atomic_ack, build_atomic_request, build_masked_atomic_request, build_read_request,
                               build_read_responses)
from model.parse import ATOMIC_OPCODES, _patch_bth, build_rc_packet, build_response, parse_frame
from model.requester import RcRequester
from model.responder import RcResponder
from spec import formats as F
from spec import params as P
from spec.formats import Aeth, Op, QpState, WqeOp
from tb.env import ENGINE_VERBS, NicEnv, PORT_IP, PORT_MAC, peer_ip, peer_mac
from tb.rc_env import DST, KEY, KEY_ATOMIC, KEY_PD, KEY_RO, PD, REGION_LEN, REGIONS, match_coalesced, not_roce
from tb.clock import ClockCycles

NEVER = 1 << 31


def _count(name, default):
    return int(os.environ.get(f"FUZZ_{name.upper()}", default))


def _seed():
    return int(os.environ.get("FUZZ_SEED", "1"))


class Report:
    """What a class tried (by kind) and found; written as JSON for scripts/run_fuzz.py."""
    def __init__(self, name, seed):
        self.name, self.seed = name, seed
        self.tried, self.found = Counter(), Counter()
        self.extra = {}

    def bad(self):
        """Bad inputs tried (the kinds named "good..." are the good work mixed in)."""
        return sum(v for k, v in self.tried.items() if not k.startswith("good"))

    def write(self, ok, error=None, repro=None):
        out = Path(os.environ.get("FUZZ_REPORT", "."))
        out.mkdir(parents=True, exist_ok=True)
        rec = {"class": self.name, "seed": self.seed, "ok": ok, "bad_inputs": self.bad(),
               "tried": dict(self.tried), "found": dict(self.found), **self.extra}
        if error:
            rec["error"] = error
        if repro is not None:
            rec["repro"] = repro
        (out / f"{self.name}.json").write_text(json.dumps(rec, indent=1, sort_keys=True))

    async def run(self, body):
        try:
            await body()
        except AssertionError as e:
            self.write(False, str(e)[:2000], getattr(e, "repro", None))
            raise
        self.write(True)


def _refresh(f):
    """Recompute the IPv4 checksum and the ICRC of an edited RoCEv2 frame."""
    b = bytearray(f[:-4])
    if len(b) >= 34:
        b[24:26] = b"\0\0"
        b[24:26] = ipv4_checksum(bytes(b[14:34])).to_bytes(2, "big")
    return bytes(b) + icrc(bytes(b))


# Header fields a mutation may set (offset, width), the checksums fixed afterwards.
FIELDS = {"dmac": (0, 6), "smac": (6, 6), "ethertype": (12, 2), "ver_ihl": (14, 1), "ip_len": (16, 2),
          "flags_frag": (20, 2), "proto": (23, 1), "sip": (26, 4), "dip": (30, 4), "dport": (36, 2),
          "udp_len": (38, 2), "opcode": (42, 1), "bth_flags": (43, 1), "pkey": (44, 2), "dqpn": (47, 3),
          "ackreq": (50, 1), "psn": (51, 3), "reth_va": (54, 8), "reth_rkey": (62, 4), "reth_len": (66, 4)}


def _set_field(f, name, rnd):
    off, w = FIELDS[name]
    if off + w > len(f) - 4:
        return None
    b = bytearray(f)
    b[off:off + w] = rnd.randrange(1 << (8 * w)).to_bytes(w, "big")
    return _refresh(bytes(b))


# ---- class 1: receive frames --------------------------------------------------------------
READ_SPAN = 0x3E000         # READs read [DST, DST + READ_SPAN): preloaded, below every write
RX_KINDS = ("random_bytes", "runt", "bit_flip", "field", "psn_behind", "psn_ahead", "over_mtu", "qp_not_ready",
            "wrong_peer", "other_opcode", "bad_key", "tver", "response", "atomic", "read")
REMOTE_OPS = ATOMIC_OPCODES | {Op.READ_REQUEST}       # the requests that hold a responder resource
ANSWER_OPS = frozenset(F.READ_RESPONSE_OPS + (Op.ATOMIC_ACK,))   # answers, for the requester side (with ACKs)

# Frames on which `make fuzz` once found the engine and the model apart, replayed by
# ``fuzz_found_cases`` on every regression: (seed, what it was, the frame).
FOUND = [
    (1, "a 118-byte ATOMIC ACK (a WRITE whose opcode a mutation made 0x12): bad_length at the port; the "
        "responder model called it bad_opcode (it parsed only its own opcodes)",
     "020000000001020000010001080045000068000040004011b832c0a80101c0a80001c10112b7005400001210ffff000000018044ef6c"
     "00000000200534730000215a0000002b643a8527220e068abfc23a1dfaf11d306bd2b9f06dfcb5657e46ec352b88d3c2e0c6d86968"
     "e6de5395ed39006ace6d3a"),
]


def receive_plan(seed, n, kinds_on=RX_KINDS):
    """The inputs of ``fuzz_receive`` for ``seed`` and ``n`` bad frames, made without a
    simulator (a mismatch can be replayed and reduced against the model alone): a
    namespace of ``setup`` (the responder QPs: QpContext and ACK count), ``frames``,
    ``acks`` (indices of the frames that go to the requester side), ``kinds`` (each
    frame's kind), ``pattern`` (GPU memory's preloaded READ range), ``answer_before``
    (``run_and_check``'s: the frames that wait for a READ's or atomic's answer),
    ``make_model`` and ``rep`` (the Report with what was tried)."""
    rep = Report("receive", seed)
    rnd = random.Random(seed)
    setup, peers, va = [], {}, {}
    for q, mtu in ((1, 256), (2, 1024), (3, 4096)):
        start, every = rnd.randrange(1 << 24), rnd.choice([1, 2, 4])
        # (the RNR NAK's timer code, the same for both: SENDs get RNR NAKs, no receive queue)
        setup.append((QpContext(qpn=q, remote_qpn=0x100 + q, dmac=peer_mac(q), dip=peer_ip(q), start_psn=start,
                                mtu=mtu, min_rnr_timer=q), every))
        peers[q] = QpContext(qpn=0x100 + q, remote_qpn=q, dmac=PORT_MAC, dip=PORT_IP, start_psn=start, mtu=mtu)
        va[q] = DST + 0x40000 * q

    def make_model(image=None):
        # the engine executes READs and atomics: the model does too, on its image of GPU memory;
        # and SENDs (two-sided verbs): these QPs have no receive queue, so a SEND that passes
        # the PSN and opcode-sequence checks gets an RNR NAK, as the engine's
        image = SparseMemory() if image is None else image
        # (answer_at_once=False: the engine answers READs and atomics a GPU-memory read or
        # more later, so a QP's new ones hold its responder resources until answered; the
        # generator sends a READ or atomic that would find them all held only once the
        # oldest one's answer is on the wire: ``answer_before``)
        m = RcResponder(Port(smac=PORT_MAC, sip=PORT_IP), remote_ops=True, two_sided=True, read_memory=image.read,
                        answer_at_once=False)
        for ctx, every in setup:
            m.add_qp(ctx, PD, ack_every=every)
        for r in REGIONS:
            m.register(r)
        return m
    # The generator keeps its own model, so good frames carry the PSN the QP expects next
    # and no bad frame is one that would end a QP (a fatal error is tested elsewhere: with
    # the QP gone no good work would be left to check).
    gen = [make_model()]
    psn = {}

    class _Psn(dict):
        def __getitem__(self, q):
            return gen[0].qp_info(q)["epsn"]

        def __setitem__(self, q, v):
            pass
    psn = _Psn()

    def good(q, size=None):
        ctx = peers[q]
        size = rnd.choice([0, 1, 4, 8, 30, 64, 200, ctx.mtu, ctx.mtu + 7]) if size is None else size
        fr = build_write_frames(ctx, Port(smac=peer_mac(q), sip=peer_ip(q)), va[q], KEY,
                                bytes(rnd.randrange(256) for _ in range(size)), psn[q])
        psn[q] = (psn[q] + len(fr)) & 0xFFFFFF
        va[q] += size + rnd.randrange(1, 64)
        if va[q] > DST + 0x40000 * q + 0x3F000:
            va[q] = DST + 0x40000 * q
        return fr

    def bad(kind):
        q = rnd.choice(list(peers))
        ctx = peers[q]
        port = Port(smac=peer_mac(q), sip=peer_ip(q))
        base = build_write_frames(ctx, port, va[q], KEY, bytes(rnd.randrange(256) for _ in range(rnd.randrange(64))),
                                  psn[q])[0]
        if kind == "random_bytes":
            return bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 200)))
        if kind == "runt":
            return base[:rnd.randrange(1, len(base))]
        if kind == "bit_flip":
            b = bytearray(base)
            b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
            return bytes(b)
        if kind == "field":
            return _set_field(base, rnd.choice(list(FIELDS)), rnd) or base[:20]
        if kind in ("psn_behind", "psn_ahead"):
            d = rnd.randrange(1, 1 << 22)
            p = (psn[q] - d if kind == "psn_behind" else psn[q] + d) & 0xFFFFFF
            return build_write_frames(ctx, port, va[q], KEY, b"p" * rnd.randrange(16), p)[0]
        if kind == "over_mtu":
            return build_rc_packet(ctx, port, Op.WRITE_ONLY, psn[q], b"o" * (ctx.mtu + rnd.randrange(1, 64)),
                                   (va[q], KEY, ctx.mtu + 64))
        if kind == "qp_not_ready":
            other = QpContext(qpn=0x104, remote_qpn=rnd.choice([4, 9, 0x3FF, 0x1234]), dmac=PORT_MAC, dip=PORT_IP,
                              mtu=1024)
            return build_write_frames(other, Port(smac=peer_mac(4), sip=peer_ip(4)), DST, KEY, b"n" * 8, 0)[0]
        if kind == "wrong_peer":
            wrong = Port(smac=peer_mac(q) ^ (rnd.randrange(1, 256) << rnd.choice([0, 40])),
                         sip=peer_ip(q)) if rnd.random() < 0.5 else Port(smac=peer_mac(q), sip=peer_ip(q) ^ 0x1000)
            return build_write_frames(ctx, wrong, va[q], KEY, b"w" * 8, psn[q])[0]
        if kind == "other_opcode":
            op = rnd.choice([Op.SEND_ONLY, Op.SEND_FIRST, Op.READ_REQUEST, 0x03, 0x13, 0x14, 0x64, 0xC0, 0xFF])
            return _refresh(base[:42] + bytes([op]) + base[43:])
        if kind == "atomic":
            # an atomic request of any form, mostly in sequence and allowed (executed: GPU
            # memory must end as the model's), else behind (a retry), ahead, misaligned,
            # without the right or out of bounds (fatal ones are not sent, as below)
            p = psn[q] if rnd.random() < 0.8 else (psn[q] + rnd.choice([-1, -2, 1, 5])) & 0xFFFFFF
            key = KEY_ATOMIC if rnd.random() < 0.85 else rnd.choice([KEY, KEY_RO, KEY_PD, KEY_ATOMIC + 1])
            nbytes = rnd.choice([4, 8])
            addr = DST + 0x3F000 + rnd.randrange(64) * nbytes
            if rnd.random() < 0.05:
                addr += rnd.choice([1, 2, 4])
            if rnd.random() < 0.03:
                addr = DST + REGION_LEN - rnd.choice([0, 4])
            op = rnd.choice([Op.FETCH_ADD, Op.COMPARE_SWAP, Op.MASKED_FETCH_ADD, Op.MASKED_COMPARE_SWAP])
            w = lambda: rnd.randrange(1 << (8 * nbytes))
            if op in (Op.FETCH_ADD, Op.COMPARE_SWAP):
                return build_atomic_request(ctx, port, op, addr, key, rnd.randrange(1 << 64), rnd.randrange(1 << 64),
                                            p, aligned=False)
            n_ops = 2 if op == Op.MASKED_FETCH_ADD else 4
            return build_masked_atomic_request(ctx, port, op, addr, key, [w() for _ in range(n_ops)], nbytes, p,
                                               aligned=False)
        if kind == "read":
            # a READ REQUEST, mostly in sequence and allowed (its responses byte for byte),
            # else behind (executed again), ahead, without the right or out of bounds. It
            # reads the preloaded range below the atomics' words, which no WRITE or atomic
            # touches: a WRITE after a READ of its QP may land before the READ's payload is
            # read (docs/architecture.md, "READ at the responder"), which the model's order
            # does not predict.
            p = psn[q] if rnd.random() < 0.8 else (psn[q] + rnd.choice([-1, -3, 2, 9])) & 0xFFFFFF
            key = KEY_RO if rnd.random() < 0.9 else rnd.choice([KEY, KEY_PD, KEY_RO + 1])
            n = rnd.choice([0, 1, 8, 64, ctx.mtu, ctx.mtu + 1, 3 * ctx.mtu + 5])
            addr = DST + rnd.randrange(READ_SPAN - 4 * ctx.mtu)
            if rnd.random() < 0.03:
                addr = DST + REGION_LEN - rnd.randrange(1, 16)
            return build_read_request(ctx, port, addr, key, n, p)
        if kind == "bad_key":
            return None        # handled by the caller (it kills the QP: rare, and then re-creates)
        if kind == "tver":
            return _patch_bth(base, flags=(base[43] & 0xF0) | rnd.randrange(1, 16))
        if kind == "response":
            back = QpContext(qpn=0x100 + q, remote_qpn=rnd.choice([q, q | 0x400, 77]), dmac=PORT_MAC, dip=PORT_IP,
                             mtu=1024)
            return build_response(back, port, rnd.randrange(1 << 24), rnd.choice([0x1F, 0x60, 0x61, 0x62, 0x20]),
                                  rnd.randrange(1 << 24))
        raise ValueError(kind)

    nic_port = Port(smac=PORT_MAC, sip=PORT_IP)
    frames, acks, kinds = [], [], []
    held = {q: deque() for q in peers}     # per QP: the frames (indices) of the READs and atomics holding a resource
    answer_before = {}
    rep.extra["waits_for_an_answer"] = 0
    while sum(rep.tried.values()) < n:
        if rnd.random() < 0.35:
            for f in good(rnd.choice(list(peers))):
                assert gen[0].receive(f).accepted
                frames.append(f)
                kinds.append("good")
            continue
        kind = rnd.choice(kinds_on)
        if kind == "bad_key":
            continue        # the access-error path is fatal to the QP: covered by rc_access_errors
        f = bad(kind)
        pp, _ = parse_frame(f, None, nic_port)
        # (a mutation may make a READ RESPONSE or an ATOMIC ACK, which go to the requester side too)
        rr, _ = parse_frame(f, ANSWER_OPS, nic_port)
        if kind == "response" or (pp is not None and pp.opcode == Op.ACK) or rr is not None:
            acks.append(len(frames))          # a good ACK/NAK (a mutation may make one): the requester's
        else:
            q = pp.dqpn if pp is not None and pp.opcode in REMOTE_OPS else None
            if q in held and gen[0].resources_held(q) >= P.MAX_DEST_RD_ATOMIC:
                # every responder resource of the QP held: this frame waits for the oldest's answer
                answer_before.setdefault(len(frames), []).append((q, held[q].popleft()))
                gen[0].answers_sent(q, 1)
                rep.extra["waits_for_an_answer"] += 1
            trial = gen[0].fork()
            r = trial.receive(f)
            if any(q_.state == QpState.ERR for q_ in trial.qps.values()):
                rep.found["fatal (not sent)"] += 1
                continue
            gen[0] = trial
            if r.accepted and r.opcode in REMOTE_OPS:
                held[r.qpn].append(len(frames))
        rep.tried[kind] += 1
        frames.append(f)
        kinds.append(kind)
    rep.extra["good_frames"] = kinds.count("good")
    pattern = bytes(rnd.randrange(256) for _ in range(READ_SPAN))
    return SimpleNamespace(rep=rep, setup=setup, frames=frames, acks=acks, kinds=kinds, pattern=pattern,
                           make_model=make_model, answer_before=answer_before)


async def _receive_env(dut, plan):
    """The NIC with the receive class's QPs (``plan.setup``), a QP not ready (4) and the
    regions; returns (env, its CQ)."""
    env = await NicEnv(dut).start()
    cq = await env.cq(0, 6)
    for ctx, every in plan.setup:
        await env.qp(ctx.qpn, cq, mtu=ctx.mtu, remote_qpn=ctx.remote_qpn, rq_psn=ctx.start_psn, pd=PD,
                     ack_every=every, min_rnr_timer=ctx.min_rnr_timer)
    await env.qp(4, cq, mtu=1024, remote_qpn=0x104, rq_psn=0, pd=PD, state=QpState.INIT)   # not ready
    for r in REGIONS:
        await env.ctl.register_mr(r.key, r.base, r.length, r.access, r.pd)
    return env, cq


@cocotb.test()
async def fuzz_receive(dut):
    """Bad frames among in-order WRITEs at line rate: memory, ACK frames and counters as
    ``RcResponder``; nothing written outside the accepted payloads; MAC RX never held."""
    seed, n = _seed(), _count("receive", 2000)
    kinds_on = os.environ.get("FUZZ_KINDS", ",".join(RX_KINDS)).split(",")     # FUZZ_KINDS narrows a replay
    plan = receive_plan(seed, n, kinds_on)
    rep, frames, acks, kinds = plan.rep, plan.frames, plan.acks, plan.kinds
    env, cq = await _receive_env(dut, plan)

    async def body():
        from tb.rc_env import run_and_check
        try:
            image = SparseMemory()
            env.mem.write(DST, plan.pattern)
            image.write(DST, plan.pattern)
            if os.environ.get("FUZZ_WRONG_MODEL"):
                # the self-test of scripts/run_fuzz.py: the model is told one preloaded
                # byte other than GPU memory holds, so its expectation is wrong
                image.write(DST + 5, bytes([plan.pattern[5] ^ 0x5A]))
            expect, c = await run_and_check(env, plan.make_model(image), frames, acks=acks, image=image,
                                            answer_before=plan.answer_before)
        except AssertionError as e:
            e.repro = {"seed": seed, "count": n, "note": "rerun with FUZZ_SEED/FUZZ_RECEIVE to replay",
                       "frames": len(frames)}
            raise
        skip = set(acks)
        taken = [k for i, k in enumerate(kinds) if i not in skip]       # the frames the responder saw
        for e, k in zip(expect, taken):
            if k != "good":
                rep.found[e.reason or "accepted"] += 1
        rep.found["ack_received (for the requester side)"] = len(acks)
        assert all(e.accepted for e, k in zip(expect, taken) if k == "good"), "a good frame was not accepted"
        _no_stray_writes(env, [w for e in expect for w in e.writes], [cq])
        rep.extra["mac_rx_stalls"] = env.rx.stall_cycles
        assert env.rx.stall_cycles == 0, f"MAC RX waited {env.rx.stall_cycles} cycles"
    await rep.run(body)


@cocotb.test()
async def fuzz_found_cases(dut):
    """Every frame on which the fuzzer once found the engine and the model apart
    (``FOUND``), at the receive class's QPs, then a good WRITE on each: ACK frames,
    memory and every counter as the model's."""
    plan = receive_plan(1, 0)
    env, cq = await _receive_env(dut, plan)
    frames = [bytes.fromhex(h) for _, _, h in FOUND]
    nic_port = Port(smac=PORT_MAC, sip=PORT_IP)
    acks = [k for k, f in enumerate(frames) if parse_frame(f, ANSWER_OPS | {Op.ACK}, nic_port)[0] is not None]
    for ctx, _ in plan.setup:
        peer = QpContext(qpn=ctx.remote_qpn, remote_qpn=ctx.qpn, dmac=PORT_MAC, dip=PORT_IP, start_psn=ctx.start_psn,
                         mtu=ctx.mtu)
        frames += build_write_frames(peer, Port(smac=ctx.dmac, sip=ctx.dip), DST + 0x40000 * ctx.qpn, KEY,
                                     bytes(range(40)), ctx.start_psn)
    from tb.rc_env import run_and_check
    await run_and_check(env, plan.make_model(), frames, acks=acks)


def _no_stray_writes(env, accepted, cqs):
    """Every byte any AXI write stored (its strobes) lies in an accepted payload or a CQ buffer."""
    import bisect
    ok = sorted([(a, a + len(d)) for a, d in accepted if d]
                + [(cq.base, cq.base + cq.depth * F.CQE_SIZE) for cq in cqs])
    merged = []
    for s_, e_ in ok:
        if merged and s_ <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e_)
        else:
            merged.append([s_, e_])
    starts = [m[0] for m in merged]
    for a, n in env.mem.stored:
        i = bisect.bisect_right(starts, a) - 1
        if i < 0 or a + n > merged[i][1]:
            raise AssertionError(f"{n} bytes written at {a:#x}, outside every accepted payload and CQ")


# ---- class 2: forged responses ------------------------------------------------------------
RESP_KINDS = ("unknown_qp", "not_rc", "qp_state", "wrong_peer", "bad_aeth", "psn_ahead", "stale", "bad_version",
              "bad_pkey", "bad_icrc", "bad_length")


@cocotb.test()
async def fuzz_responses(dut):
    """Bursts of forged ACK/NAKs and ATOMIC ACKNOWLEDGEs at line rate between good ACKs,
    for RC QPs with WRITEs outstanding: each dropped and counted by reason as
    ``RcRequester`` says, nothing
    changed; the good ACKs complete the WRITEs, CQE for CQE (bytes) as the model."""
    seed, n = _seed(), _count("responses", 1500)
    rep = Report("responses", seed)
    rnd = random.Random(seed ^ 0x5151)
    env = await NicEnv(dut).start()
    cq = await env.cq(0, 12)
    # remote_ops: the engine takes ATOMIC ACKNOWLEDGEs (nothing here is atomic, so the
    # model never writes: a forged one must be dropped before it could)
    def no_write(addr, data):
        raise AssertionError(f"a forged response wrote {len(data)} bytes at {addr:#x}")
    model = RcRequester(Port(smac=PORT_MAC, sip=PORT_IP), {0: CqContext(0, 12, base=cq.base)}, env.mem.read,
                        remote_ops=True, write_memory=no_write)
    rcs = [await env.qp(q, cq, mtu=1024, uc=False, timeout=NEVER) for q in (1, 2, 3, 4)]
    uc = await env.qp(5, cq, mtu=1024)
    dead = await env.qp(6, cq, mtu=1024, uc=False, timeout=NEVER)
    for qp in rcs + [dead]:
        model.add_qp(QpContext(qpn=qp.qpn, remote_qpn=qp.remote_qpn, dmac=qp.dmac, dip=qp.dip,
                               start_psn=qp.start_psn, mtu=1024, cqn=0, user_index=qp.user_index), timeout_ns=NEVER)
    per_qp = 120

    async def post_round():
        """120 8-byte WRITEs on each RC QP (every 15th and the last signaled); their frames."""
        out = []
        for qp in rcs:
            for k in range(per_qp):
                w = qp.post_write(DST + 0x10000 * qp.qpn + 16 * k, KEY, inline=bytes([qp.qpn, k & 0xFF]) * 4,
                                  signaled=k % 15 == 14 or k == per_qp - 1)
                out += [t.frame for t in model.post(qp.qpn, w.wqe)]
            await qp.ring_nvshmem()
        return out
    first = await post_round()
    w = dead.post_write(DST, KEY, inline=b"d" * 8)
    first += [t.frame for t in model.post(dead.qpn, w.wqe)]
    await dead.ring_nvshmem()
    for k in range(4):
        uc.post_write(DST + 0x80000 + 16 * k, KEY, inline=b"u" * 8)
    await uc.ring_nvshmem()
    await env.wire.wait_frames(len(first) + 4, timeout_cycles=100_000)
    await env.ctl.modify_qp(dead.qpn, state=QpState.ERR)
    model.modify(dead.qpn, QpState.ERR)
    uc_cqes = 4

    def peer_of(q):
        return QpContext(qpn=0x1000 + q, remote_qpn=q, dmac=PORT_MAC, dip=PORT_IP, mtu=1024), \
            Port(smac=peer_mac(q), sip=peer_ip(q))

    def window(q):
        i = model.qp_info(q)
        return (i["una"] - 1) & 0xFFFFFF, (i["next_psn"] - 1) & 0xFFFFFF      # acked, last sent

    def forged(kind):
        qp = rnd.choice(rcs)
        q = qp.qpn
        ctx, port = peer_of(q)
        acked, last = window(q)
        syn = rnd.choice([Aeth.ACK, 0x00, 0x1F, Aeth.NAK_PSN_SEQ, Aeth.NAK_INVALID_REQ, Aeth.NAK_REMOTE_ACCESS,
                          Aeth.NAK_REMOTE_OP, 0x64, 0x20])
        psn = (acked + rnd.randrange(1, 4)) & 0xFFFFFF if ((last - acked) & 0xFFFFFF) >= 3 else last
        if kind == "unknown_qp":
            ctx = QpContext(qpn=ctx.qpn, remote_qpn=q | (rnd.randrange(1, 1 << 14) << 10), dmac=PORT_MAC,
                            dip=PORT_IP, mtu=1024)
        elif kind == "not_rc":
            ctx, port = peer_of(uc.qpn)
        elif kind == "qp_state":
            ctx, port = peer_of(dead.qpn)
            psn = dead.start_psn
        elif kind == "wrong_peer":
            port = Port(smac=peer_mac(q) ^ (1 << rnd.randrange(48)), sip=peer_ip(q)) if rnd.random() < 0.5 else \
                Port(smac=peer_mac(q), sip=peer_ip(q) ^ (1 << rnd.randrange(32)))
        elif kind == "bad_aeth":
            syn = rnd.choice([0x40, 0x5F, 0x80, 0x9F, 0xE0, 0xC1, 0xFF])
        elif kind == "psn_ahead":
            psn = (last + rnd.randrange(1, 1 << 23)) & 0xFFFFFF
        elif kind == "stale":
            psn = (acked - rnd.randrange(0, 1 << 22)) & 0xFFFFFF
            syn = rnd.choice([Aeth.ACK, Aeth.NAK_PSN_SEQ, Aeth.NAK_REMOTE_ACCESS, Aeth.NAK_INVALID_REQ])
        pick = rnd.random()
        if kind not in ("bad_aeth", "bad_length") and pick < 0.2:
            # as a READ RESPONSE (any of the four, up to an MTU of payload): the same checks
            # (nothing is read here, so none may write)
            fs = build_read_responses(ctx, port, bytes(rnd.randrange(256) for _ in range(rnd.randrange(3 * 1024))),
                                      0, rnd.randrange(1 << 24), mtu=1024)
            f = _patch_bth(rnd.choice(fs), psn=psn)
        elif kind != "bad_aeth" and pick < 0.4:
            # as an ATOMIC ACKNOWLEDGE: it passes the same checks (nothing atomic is
            # outstanding, but each of these is dropped before that matters)
            f = build_atomic_ack(ctx, port, psn, rnd.randrange(1 << 24), rnd.randrange(1 << 64))
            if kind == "bad_length":
                f = _refresh(f[:rnd.randrange(58, 70)])
                return f
        else:
            f = build_response(ctx, port, psn, syn, rnd.randrange(1 << 24))
        if kind == "bad_version":
            f = _patch_bth(f, flags=rnd.randrange(1, 16))
        elif kind == "bad_pkey":
            f = _patch_bth(f, pkey=rnd.choice([0, 0x7FFF, 0x8001, 0x1234]))
        elif kind == "bad_icrc":
            b = bytearray(f)     # a bit of the DestQP, PSN or AETH (BTH byte 4 is masked out of the ICRC)
            b[rnd.randrange(47, 58)] ^= 1 << rnd.randrange(8)
            f = bytes(b)
        elif kind == "bad_length":
            f = _refresh(f[:rnd.randrange(58, 62)])
        return f

    resp_kinds = os.environ.get("FUZZ_KINDS", ",".join(RESP_KINDS)).split(",")     # FUZZ_KINDS narrows a replay
    responses = 0
    while sum(rep.tried.values()) < n:
        for _ in range(rnd.randrange(1, 64)):
            kind = rnd.choice(resp_kinds)
            f = forged(kind)
            out = model.on_response(f, 0)
            want = "unknown_qp" if kind == "not_rc" else kind        # the model knows no UC QP
            if out.reason != want:
                e = AssertionError(f"generator: a {kind} response the model calls {out.reason!r}")
                e.repro = {"seed": seed, "kind": kind, "frame": f.hex()}
                raise e
            rep.tried[kind] += 1
            env.rx.send(f)
            responses += 1
        # a good ACK of a few more PSNs of one QP
        open_qps = [qp for qp in rcs if window(qp.qpn)[0] != window(qp.qpn)[1]]
        if not open_qps:                 # everything acknowledged: post another round
            before = len(env.wire.frames)
            new = await post_round()
            await env.wire.wait_frames(before + len(new), timeout_cycles=100_000)
            first += new
            continue
        qp = rnd.choice(open_qps)
        acked, last = window(qp.qpn)
        psn = (acked + rnd.randrange(1, 9)) if ((last - acked) & 0xFFFFFF) > 8 else last
        ctx, port = peer_of(qp.qpn)
        f = build_response(ctx, port, psn & 0xFFFFFF, Aeth.ACK, 0)
        out = model.on_response(f, 0)
        assert out.reason is None and out.kind == "ack", out
        env.rx.send(f)
        responses += 1
        await ClockCycles(dut.clk, 100)
    for qp in rcs:                               # acknowledge the rest
        acked, last = window(qp.qpn)
        if acked != last:
            ctx, port = peer_of(qp.qpn)
            f = build_response(ctx, port, last, Aeth.ACK, 0)
            assert model.on_response(f, 0).reason is None
            env.rx.send(f)
            responses += 1

    async def body():
        while not env.rx.idle:
            await ClockCycles(dut.clk, 64)
        want = [c.cqe for c in model.completions]
        try:
            got = await cq.poll(len(want) + uc_cqes, 20_000)
        except TimeoutError as e:
            c = await env.ctl.read_counters()
            raise AssertionError(f"{e}; CQE writes seen {len(env.cqe_writes())}, counters "
                                 f"{ {k: v for k, v in c.items() if v} }") from None
        # per QP, in order (the order between QPs in the shared CQ is the ACKs' timing: the
        # dead QP's flush CQE, written when it moves to ERR, among the others' releases)
        for q in sorted({x.qpn for x in model.completions} | {x.qpn for x in got if x.qpn != uc.qpn}):
            rc_got = [x.raw for x in got if x.qpn == q]
            want_q = [x.cqe for x in model.completions if x.qpn == q]
            if rc_got != want_q:
                c = await env.ctl.read_counters()
                k = next((k for k, (a, b) in enumerate(zip(rc_got, want_q)) if a != b), min(len(rc_got), len(want_q)))
                show = [(x.qpn, x.wqe_counter, x.opcode, x.syndrome) for x in got if x.qpn == q][max(0, k - 2):k + 3]
                wshow = [(x.qpn, x.wqe_counter, x.opcode, x.syndrome) for x in model.completions
                         if x.qpn == q][max(0, k - 2):k + 3]
                raise AssertionError(f"CQEs of RC QP {q} differ from the model's at {k}: RTL {show}, model {wshow}; "
                                     f"counters { {n_: v for n_, v in c.items() if v} }")
        await ClockCycles(dut.clk, 2000)
        assert cq.try_poll() is None, "a CQE the model does not write"
        assert len(env.wire.frames) == len(first) + 4, f"{len(env.wire.frames) - len(first) - 4} frames resent"
        assert sorted(f.data for f in env.wire.frames if f.data in set(first)) == sorted(first)
        c = await env.ctl.read_counters()
        drops = Counter(model.counters.dropped_responses)
        drops["unknown_qp"] -= rep.tried["not_rc"]
        drops["not_rc"] = rep.tried["not_rc"]
        want_c = {f"resp_{k}": drops.get(k, 0) for k in F.RESPONSE_DROP_NAMES}
        for k in ("bad_version", "bad_pkey", "bad_icrc", "bad_length"):
            want_c[f"rx_{k}"] = drops.get(k, 0)
        want_c["rx_ack_received"] = responses - sum(drops.get(k, 0) for k in ("bad_version", "bad_pkey", "bad_icrc",
                                                                            "bad_length"))
        diff = {k: (c[k], v) for k, v in want_c.items() if c[k] != v}
        for k, v in want_c.items():
            if k.startswith(("resp_", "rx_bad")):
                rep.found[k] = c[k]
        rep.extra["good_acks"] = responses - sum(rep.tried.values())
        rep.extra["cqes"] = len(want)
        assert not diff, f"counters (RTL, model) that differ: {diff}"
        rep.extra["mac_rx_stalls"] = env.rx.stall_cycles
        assert env.rx.stall_cycles == 0, f"MAC RX waited {env.rx.stall_cycles} cycles"
    await rep.run(body)


# ---- class 3: WQEs -----------------------------------------------------------------------
def _wqe_case(rnd, payload_addr):
    """A WQE body of a random opcode, ds and segment shape (what a buggy or hostile GPU
    thread might write); valid ones read at most 4 KiB."""
    op = rnd.choice([WqeOp.NOP, WqeOp.RDMA_WRITE] * 3 + [WqeOp.RDMA_WRITE_IMM, WqeOp.SEND, WqeOp.RDMA_READ,
                                                         WqeOp.ATOMIC_CS, WqeOp.ATOMIC_FA, 0x23, rnd.randrange(256)])
    ds = rnd.choice([rnd.randrange(64), rnd.randrange(6), rnd.choice([15, 16, 17, 60, 61, 62, 63])])
    shape = rnd.choice(["pointer", "inline", "none", "random"])
    body = (0x3000_0000 + 64 * rnd.randrange(1024)).to_bytes(8, "big") + KEY.to_bytes(4, "big") + bytes(4)
    if shape == "pointer":
        body += rnd.choice([0, 1, 8, 100, 1000, 4096]).to_bytes(4, "big") + (0x100).to_bytes(4, "big") \
            + payload_addr.to_bytes(8, "big")
    elif shape == "inline":
        k = rnd.choice([0, 1, 4, 12, 13, 28, 29, 60, 100, 220, rnd.randrange(300)])
        body += (k | F.INLINE_FLAG).to_bytes(4, "big") + bytes(rnd.randrange(256) for _ in range(k))
    elif shape == "random":
        body = bytes(rnd.randrange(256) for _ in range(rnd.randrange(16 * 63)))
    return op, ds, shape, body


@cocotb.test()
async def fuzz_wqes(dut):
    """WQEs of random opcode, ds 0..63 and segment shape, each on its own QP and followed
    by a good NOP, in rounds of 128 QPs (re-created each round): frames and CQEs as
    ``EngineModel`` (which are malformed, where the QP stops, every wqe_counter)."""
    from model.frames import parse_wqe
    from tb.gpu import Qp
    seed, n = _seed(), _count("wqes", 300)
    rep = Report("wqes", seed)
    rnd = random.Random(seed ^ 0x3A3A)
    env = await NicEnv(dut, dma_latency=40).start()
    addr, _ = env.payload(4096)
    nq = 128
    done = 0
    totals = {"packets": 0, "cqes": 0, "error_cqes": 0}
    while rep.bad() < n:
        cq = await env.cq(0, 10)
        env.wire.frames.clear()
        env.qps = {}
        for q in range(nq):
            if q not in env.ctl._qp_regs:
                qp = await env.qp(q, cq, log_depth=5, mtu=rnd.choice([256, 1024, 4096]))
            else:                                    # the same context, a new ring: 5 register writes
                qp = Qp(env.gpu, q, 5, cq)
                regs = env.ctl._qp_regs[q]
                for r_, v in (("QP_NUM", q), ("QP_SQ_BASE_LO", qp.sq_base & 0xFFFF_FFFF),
                              ("QP_SQ_BASE_HI", qp.sq_base >> 32), ("QP_REMOTE_QPN", regs["QP_REMOTE_QPN"]),
                              ("QP_START_PSN", regs["QP_START_PSN"]), ("QP_MTU", regs["QP_MTU"]),
                              ("QP_DMAC_LO", regs["QP_DMAC_LO"]), ("QP_DMAC_HI", regs["QP_DMAC_HI"]),
                              ("QP_DIP", regs["QP_DIP"]), ("QP_USER_INDEX", regs["QP_USER_INDEX"])):
                    await env.ctl.write_reg(r_, v)
                await env.ctl.write_reg("QP_COMMIT", 1)
                regs.update(QP_SQ_BASE_LO=qp.sq_base & 0xFFFF_FFFF, QP_SQ_BASE_HI=qp.sq_base >> 32)
                old = env.gpu.qps.get(q)
                qp.user_index = old.user_index
                env.gpu.qps[q] = qp
                qp.mtu, qp.start_psn = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}[regs["QP_MTU"]], regs["QP_START_PSN"]
                qp.remote_qpn, qp.dmac, qp.dip = regs["QP_REMOTE_QPN"], old.dmac, old.dip
            env.qps[q] = qp
            while True:
                op, ds, shape, body = _wqe_case(rnd, addr)
                nbb = max(1, -(-ds // 4))
                w = parse_wqe(((_ctrl_for(q, op, ds) + body)[:64 * nbb]).ljust(64 * 16, b"\0"), **ENGINE_VERBS)
                if not w.valid or w.length <= 4096:
                    break
            qp.post_raw(op, ds, body)
            qp.post_nop()
            rep.tried[f"{'good' if w.valid else 'malformed'} {_op_name(op)}"] += 1
            await qp.ring_nvshmem()
        done += len(env.qps)

        async def round_check():
            pred = env.check(await env.drain(100_000))
            for k in ("packets", "cqes", "error_cqes"):
                totals[k] += getattr(pred.totals, k)
            rep.found["error CQEs"] += pred.totals.error_cqes
            rep.found["frames"] += pred.totals.packets
        try:
            await round_check()
        except AssertionError as e:
            e.repro = {"seed": seed, "round_first_case": done - len(env.qps), "count": n}
            rep.write(False, str(e)[:2000], e.repro)
            raise
    c = await env.ctl.read_counters()
    got = {k: c[k] for k in totals}
    if got != totals:
        rep.write(False, f"counters (RTL, model): {got} {totals}", {"seed": seed, "count": n})
        raise AssertionError(f"counters (RTL, model): {got} {totals}")
    rep.write(True)


def _ctrl_for(q, op, ds):
    return (op | (0 << 8)).to_bytes(4, "big") + ((q << 8) | ds).to_bytes(4, "big") + bytes([0, 0, 0, 8]) + bytes(4)


def _op_name(op):
    names = {v: k for k, v in vars(WqeOp).items() if not k.startswith("_")}
    return names.get(op, "opcode 0x%02x" % op)


# ---- class 4: doorbells -----------------------------------------------------------------
DB_KINDS = ("good", "good (repeat)", "stale", "over_depth", "qp_not_rts", "offset", "partial", "qpn_field", "page",
            "burst", "blueflame_long")


@cocotb.test()
async def fuzz_doorbells(dut):
    """UAR writes of random offset, page, QPN field, width, burst length and producer index
    among good doorbells, on QPs whose rings hold NOPs: each counted once, as applied or
    dropped by reason (the QP table's rule); the work done is exactly the good doorbells'
    (CQEs as ``EngineModel``), nothing replayed."""
    from model.engine import EngineModel
    seed, n = _seed(), _count("doorbells", 400)
    rep = Report("doorbells", seed)
    rnd = random.Random(seed ^ 0xDB)
    env = await NicEnv(dut, dma_latency=40).start()
    cq = await env.cq(0, 12)
    depth_log = 6
    qps = [await env.qp(q, cq, log_depth=depth_log) for q in range(1, 9)]
    idle = await env.qp(9, cq, log_depth=depth_log, state=QpState.INIT)
    depth = 1 << depth_log
    for qp in qps + [idle]:                      # every slot holds a signaled NOP
        for s in range(depth):
            env.gpu.write(qp.sq_base + 64 * s, build_nop_wqe(s, qp.qpn, True))
    pi = {qp.qpn: 0 for qp in qps}
    posts = []                                   # (qpn, wqe) in the order executed per QP

    def db8(qpn, limit, qpn_field=None):
        qf = qpn if qpn_field is None else qpn_field
        return (((limit & 0xFFFF) << 8).to_bytes(4, "big") + (qf << 8).to_bytes(4, "big"))

    expect = Counter()
    db = env.gpu.db_master
    while rep.bad() < n:
        kind = rnd.choice(DB_KINDS)
        qp = rnd.choice(qps)
        q = qp.qpn
        base = q << F.UAR_PAGE_SHIFT
        off = rnd.choice([F.UAR_DB_OFFSET, F.UAR_DB_OFFSET_ALT])
        if kind.startswith("good"):
            k = 0 if kind == "good (repeat)" else rnd.randrange(1, 9)
            for p in range(pi[q], pi[q] + k):
                posts.append((q, build_nop_wqe(p & 0xFFFF, q, True)))
            pi[q] += k
            await db.write(base | off, db8(q, pi[q]))
            expect["applied"] += 1
        elif kind == "stale":
            await db.write(base | off, db8(q, pi[q] - rnd.randrange(1, 1 << 15)))
            expect["stale"] += 1
        elif kind == "over_depth":
            await db.write(base | off, db8(q, pi[q] + depth + rnd.randrange(1, (1 << 15) - depth)))
            expect["over_depth"] += 1
        elif kind == "qp_not_rts":
            await db.write((idle.qpn << F.UAR_PAGE_SHIFT) | off, db8(idle.qpn, rnd.randrange(1, 8)))
            expect["qp_not_rts"] += 1
        else:
            if kind == "offset":
                bad_off = rnd.choice([o for o in range(0, 4096 - 8, 8) if o not in (F.UAR_DB_OFFSET, F.UAR_DB_OFFSET_ALT)])
                await db.write(base | bad_off, db8(q, pi[q]))
            elif kind == "partial":
                w = rnd.choice([1, 2, 4, 6, 7])
                await db.write(base | off | rnd.choice([0, 8 - w]), db8(q, pi[q])[:w])
            elif kind == "qpn_field":
                await db.write(base | off, db8(q, pi[q], qpn_field=q ^ rnd.choice([1, 7, 1023, 0xFFFFFF])))
            elif kind == "page":
                page = rnd.randrange(env.num_qps, 1 << (32 - F.UAR_PAGE_SHIFT))
                await db.write((page << F.UAR_PAGE_SHIFT) | off, db8(page & 0xFFFFFF, 1))
            elif kind == "burst":
                beats = rnd.choice([2, 3, 5, 7, 9, 16])
                await db.write(base | off, db8(q, pi[q]) + bytes(8 * (beats - 1)))
            elif kind == "blueflame_long":
                ctrl = (((pi[q] & 0xFFFF) << 8).to_bytes(4, "big") + ((q << 8) | rnd.randrange(5, 64)).to_bytes(4, "big"))
                await db.write(base | off, ctrl + bytes(56))
            expect["bad_write"] += 1
        rep.tried[kind] += 1

    async def body():
        eng = EngineModel(Port(PORT_MAC, PORT_IP), {qp.qpn: QpContext(qpn=qp.qpn, remote_qpn=qp.remote_qpn,
                          dmac=qp.dmac, dip=qp.dip, sq_base=qp.sq_base, log_depth=depth_log, cqn=0,
                          start_psn=qp.start_psn, mtu=qp.mtu, user_index=qp.user_index) for qp in qps},
                          {0: CqContext(0, 12, base=cq.base)}, env.mem.read, **ENGINE_VERBS)
        for q, wqe in posts:
            eng.post(q, wqe)
        env.engine = eng
        want = eng.result().totals.cqes
        await env.wait_for(lambda: len(env.cqe_writes()) >= want, 100_000, f"{want} CQEs")
        await ClockCycles(dut.clk, 2000)
        env.check_cqes()
        assert not env.wire.frames, "NOPs send no frame"
        c = await env.ctl.read_counters()
        got = {"applied": c["doorbells"], **{k: c[f"db_{k}"] for k in F.DOORBELL_DROP_NAMES}}
        wantc = {"applied": expect["applied"], **{k: expect[k] for k in F.DOORBELL_DROP_NAMES}}
        rep.found.update(got)
        rep.extra["cqes"] = want
        assert got == wantc, f"doorbell counters (RTL, expected): {({k: (got[k], wantc[k]) for k in got if got[k] != wantc[k]})}"
        assert c["doorbells_dropped"] == sum(expect[k] for k in F.DOORBELL_DROP_NAMES)
    await rep.run(body)
