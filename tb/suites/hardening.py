"""System regressions of what the engine takes from outside (cocotb): responses and
requests that do not belong, held to the golden model.

Every forged frame here is a case that changed QP state before the checks existed
(issue 15): each must now be dropped, counted by reason and change nothing, while the
good responses mixed in still complete the work exactly as ``RcRequester`` does.
"""
import cocotb

from model.cqe import CqContext
from model.frames import Port, QpContext, build_write_frames
from model.parse import _patch_bth, build_response
from model.requester import RcRequester
from model.responder import RcResponder
from spec.formats import Aeth, QpState, RESPONSE_DROP_NAMES, Syndrome
from tb.env import NicEnv, PORT_IP, PORT_MAC, peer_ip, peer_mac
from tb.rc_env import DST, KEY, PD, REGIONS
from tb.clock import ClockCycles

NEVER = 1 << 31          # ACK timeout (cycles / ns): no timer fires in these tests


def _peer(q, *, qpn=None, mac=None, ip=None):
    """What the peer of our QP ``q`` sends from: its context (DestQP ``qpn``, default ``q``)
    and port (default the QP's peer addresses)."""
    ctx = QpContext(qpn=0x1000 + q, remote_qpn=q if qpn is None else qpn, dmac=PORT_MAC, dip=PORT_IP, mtu=1024)
    return ctx, Port(smac=peer_mac(q) if mac is None else mac, sip=peer_ip(q) if ip is None else ip)


def response(q, psn, syndrome=Aeth.ACK, msn=0, **where):
    ctx, port = _peer(q, **where)
    return build_response(ctx, port, psn & 0xFFFFFF, syndrome, msn)


@cocotb.test()
async def responses_that_do_not_belong(dut):
    """Forged and stale ACK/NAKs among good ones: each dropped, counted by reason, nothing
    changed; the good ones complete the WRITEs as the model does (CQEs, go-back-N frames)."""
    env = await NicEnv(dut).start()
    cq, cq_uc = await env.cq(0, 6), await env.cq(1, 6)
    rc, uc, rc_err = (await env.qp(5, cq, mtu=1024, uc=False, timeout=NEVER),
                      await env.qp(6, cq_uc, mtu=1024),
                      await env.qp(7, cq, mtu=1024, uc=False, timeout=NEVER))
    model = RcRequester(Port(smac=PORT_MAC, sip=PORT_IP), {0: CqContext(0, 6, base=cq.base)}, env.mem.read)
    for qp in (rc, rc_err):
        model.add_qp(QpContext(qpn=qp.qpn, remote_qpn=qp.remote_qpn, dmac=qp.dmac, dip=qp.dip,
                               start_psn=qp.start_psn, mtu=1024, cqn=0, user_index=qp.user_index), timeout_ns=NEVER)
    expect = []
    for qp, sizes in ((rc, (8, 1500, 16)), (rc_err, (24,)), (uc, (4, 4, 4))):
        for n in sizes:
            addr, _ = env.payload(n, seed=n)
            w = qp.post_write(DST + 0x100 * n, KEY, local_addr=addr, length=n)
            if qp is not uc:
                expect += [t.frame for t in model.post(qp.qpn, w.wqe)]
        await qp.ring_nvshmem()
    await env.wire.wait_frames(len(expect) + 3, timeout_cycles=20_000)
    sent = [f.data for f in env.wire.frames]
    assert sorted(f for f in sent if f in expect) == sorted(expect), "first transmissions differ from the model's"
    assert len((await cq_uc.poll(3, timeout_cycles=2000))) == 3           # UC: complete when sent

    s = rc.start_psn                  # QP 5 sent s (8 B), s+1 and s+2 (1500 B), s+3 (16 B)
    t = rc_err.start_psn
    cases = [
        (response(5, s + 3, qpn=0x405), "unknown_qp"),          # only the low 10 bits are QP 5
        (response(5, s + 3, ip=peer_ip(5) ^ 1), "wrong_peer"),
        (response(5, s + 3, mac=peer_mac(5) ^ 0x100), "wrong_peer"),
        (_patch_bth(response(5, s + 3), flags=0x01), "bad_version"),
        (_patch_bth(response(5, s + 3), pkey=0x1234), "bad_pkey"),
        (response(5, s + 8), "psn_ahead"),                      # an ACK of nothing sent yet
        (response(5, s + 4, Aeth.NAK_PSN_SEQ), "psn_ahead"),    # a NAK of a PSN never sent
        (response(5, s, msn=1), None),                          # good: the 8-byte WRITE completes
        (response(5, s, Aeth.NAK_REMOTE_ACCESS), "stale"),      # a NAK of an acknowledged PSN
        (response(5, s - 1), "stale"),
        (response(5, s + 1, 0x40), "bad_aeth"),
        (response(5, s + 2, Aeth.NAK_PSN_SEQ, msn=1), None),    # good: acks s+1, resends s+2, s+3
        (response(5, s + 2, Aeth.NAK_PSN_SEQ, msn=1), "duplicate_nak"),
        (response(6, uc.start_psn, Aeth.NAK_PSN_SEQ), "not_rc"),   # a finished UC QP
        (response(6, uc.start_psn + 1, Aeth.NAK_REMOTE_ACCESS), "not_rc"),
        ("modify", None),                                       # QP 7 to ERR through the control path
        (response(7, t), "qp_state"),
        (response(5, s + 3, msn=3), None),                      # good: the rest completes
    ]
    resent = []
    for frame, reason in cases:
        if frame == "modify":
            await env.ctl.modify_qp(7, state=QpState.ERR)
            model.modify(7, QpState.ERR)
            continue
        before = len(env.wire.frames)
        if frame[OFF_DQPN:OFF_DQPN + 3] == (6).to_bytes(3, "big"):
            got, out = "not_rc", None                           # no model takes a UC QP's responses
        else:
            out = model.on_response(frame, 0)
            got = out.reason
        assert got == reason, f"the model says {got!r} for a case meant to be {reason!r}"
        env.rx.send(frame)
        await ClockCycles(dut.clk, 400)
        if out is not None and out.retransmit:
            await env.wire.wait_frames(before + len(out.retransmit), timeout_cycles=20_000)
            resent += [t.frame for t in out.retransmit]
        await ClockCycles(dut.clk, 400)
    new = [f.data for f in env.wire.frames[len(sent):]]
    assert new == resent, f"{len(new)} frames after the first transmissions, the model resends {len(resent)}"
    assert len(resent) == 2

    want = [(c.opcode, c.qpn, c.wqe_counter, c.byte_cnt, c.syndrome) for c in model.completions]
    cqes = await cq.poll(len(want), 4000)
    got = [(c.opcode, c.qpn, c.wqe_counter, c.byte_cnt, c.syndrome) for c in cqes]
    assert got == want, f"CQEs {got}, the model writes {want}"
    assert [c.raw for c in cqes] == [c.cqe for c in model.completions]
    # three WRITEs completed, and QP 7's outstanding one flushed by its move to ERR
    assert len(want) == 4 and [(w[1], w[4]) for w in want if w[4]] == [(7, Syndrome.WR_FLUSH_ERR)], want
    await ClockCycles(dut.clk, 2000)
    assert cq.try_poll() is None and cq_uc.try_poll() is None, "a CQE the model does not write"
    c = await env.ctl.read_counters()
    drops = dict(model.counters.dropped_responses)
    want_c = {f"resp_{n}": drops.get(n, 0) for n in RESPONSE_DROP_NAMES}
    want_c["resp_not_rc"] = 2
    want_c.update(rx_bad_version=1, rx_bad_pkey=1, rx_ack_received=len(cases) - 3)
    diff = {k: (c[k], v) for k, v in want_c.items() if c[k] != v}
    assert not diff, f"counters (RTL, expected) that differ: {diff}"


OFF_DQPN = 14 + 20 + 8 + 5           # BTH DestQP: Ethernet, IPv4, UDP, then BTH byte 5


@cocotb.test()
async def requests_that_do_not_belong(dut):
    """WRITE requests from a source that is not the QP's peer (IPv4 or MAC), with TVer 1, and
    to a QP moved to ERR through the control path: none executed, each counted; the model
    (``RcResponder``) agrees frame by frame."""
    env = await NicEnv(dut).start()
    cq = await env.cq(0, 6)
    model = RcResponder(Port(smac=PORT_MAC, sip=PORT_IP))
    peers = {}
    for q in (1, 2):
        await env.qp(q, cq, mtu=1024, remote_qpn=0x100 + q, rq_psn=0x10, pd=PD)
        model.add_qp(QpContext(qpn=q, remote_qpn=0x100 + q, dmac=peer_mac(q), dip=peer_ip(q), start_psn=0x10,
                               mtu=1024), PD)
        peers[q] = QpContext(qpn=0x100 + q, remote_qpn=q, dmac=PORT_MAC, dip=PORT_IP, start_psn=0x10, mtu=1024)
    for r in REGIONS:
        await env.ctl.register_mr(r.key, r.base, r.length, r.access, r.pd)
        model.register(r)

    def write(q, psn, data, va, port=None):
        port = port or Port(smac=peer_mac(q), sip=peer_ip(q))
        (f,) = build_write_frames(peers[q], port, va, KEY, data, psn)
        return f

    frames = [
        (write(1, 0x10, b"A" * 8, DST), None),
        (write(1, 0x11, b"B" * 8, DST + 64, Port(smac=peer_mac(1), sip=peer_ip(2))), "wrong_peer"),
        (write(1, 0x11, b"C" * 8, DST + 128, Port(smac=peer_mac(2), sip=peer_ip(1))), "wrong_peer"),
        (_patch_bth(write(1, 0x11, b"D" * 8, DST + 192), flags=0x03), "bad_version"),
        (write(1, 0x11, b"E" * 8, DST + 256), None),
        (write(2, 0x10, b"F" * 8, DST + 512), None),
        ("modify", None),                                       # QP 2 to ERR
        (write(2, 0x11, b"G" * 8, DST + 576), "qp_not_ready"),
        (write(1, 0x12, b"H" * 8, DST + 320), None),
    ]
    acks = []
    image = {}
    for f, reason in frames:
        if f == "modify":
            await env.ctl.modify_qp(2, state=QpState.ERR)
            model.modify(2, QpState.ERR)
            continue
        e = model.receive(f)
        assert e.reason == reason, f"the model says {e.reason!r} for a case meant to be {reason!r}"
        for addr, data in e.writes:
            image.update({addr + i: b for i, b in enumerate(data)})
        if e.response is not None:
            acks.append(e.response)
        env.rx.send(f)
        await ClockCycles(dut.clk, 300)
    await env.wire.wait_frames(len(acks), timeout_cycles=5000)
    await ClockCycles(dut.clk, 300)
    assert [f.data for f in env.wire.frames] == acks, "ACK frames differ from the model's"
    span = env.mem.read(DST, 1024)
    for a in range(DST, DST + 1024):
        assert span[a - DST] == image.get(a, 0), f"GPU memory at {a:#x}: {span[a - DST]:#04x}"
    c = await env.ctl.read_counters()
    want = {"rx_accepted": model.counters.accepted, "rx_wrong_peer": 2, "rx_bad_version": 1, "rx_qp_not_ready": 1}
    assert model.counters.dropped["wrong_peer"] == 2 and model.counters.dropped["qp_not_ready"] == 1
    diff = {k: (c[k], v) for k, v in want.items() if c[k] != v}
    assert not diff, f"counters (RTL, expected) that differ: {diff}"


CONTROL_BOUND = 16      # cycles from a register write's AW to its B, under any receive traffic


@cocotb.test()
async def control_path_under_receive_flood(dut):
    """A line-rate stream of 74-byte WRITEs for a QP that does not exist, and then for a
    live QP, while the CPU creates and modifies QPs, creates a CQ and registers a memory
    region: every register write (QP_COMMIT, QP_MODIFY, CQ_COMMIT, MR_COMMIT included)
    completes within CONTROL_BOUND cycles, MAC RX is never held back, and the frames are
    handled as the model says."""
    n = 2000 if cocotb.SIM_NAME.lower().startswith("verilator") else 300
    env = await NicEnv(dut).start()
    cq = await env.cq(0, 6)
    await env.qp(1, cq, mtu=1024, remote_qpn=0x101, rq_psn=0, pd=PD)
    for r in REGIONS:
        await env.ctl.register_mr(r.key, r.base, r.length, r.access, r.pd)
    ghost = QpContext(qpn=0x177, remote_qpn=0x77, dmac=PORT_MAC, dip=PORT_IP, mtu=1024)
    live = QpContext(qpn=0x101, remote_qpn=1, dmac=PORT_MAC, dip=PORT_IP, mtu=1024)
    frames = [build_write_frames(ghost, Port(smac=peer_mac(0x77), sip=peer_ip(0x77)), DST, KEY, b"", k)[0]
              for k in range(n)]
    frames += [build_write_frames(live, Port(smac=peer_mac(1), sip=peer_ip(1)), DST + 16 * k, KEY, b"", k)[0]
               for k in range(n)]
    for f in frames:
        env.rx.send(f)
    latencies = []
    orig = env.ctl.write_reg

    async def timed(addr, value, **kw):
        t0 = env.counter.now
        await orig(addr, value, **kw)
        latencies.append((env.counter.now - t0, addr))
    env.ctl.write_reg = timed
    await ClockCycles(dut.clk, 50)
    k = 0
    while not env.rx.idle:
        k += 1
        await env.qp(8 + k % 8, cq, mtu=1024, uc=False, rq_psn=k)
        await env.ctl.modify_qp(8 + k % 8, weight=2)
        await env.cq(1 + k % 4, 4)
        await env.ctl.register_mr(KEY + 0x100 * k, DST, 4096, REGIONS[0].access, PD)
    env.ctl.write_reg = orig
    await ClockCycles(dut.clk, 500)
    worst = max(latencies)
    dut._log.info(f"{len(frames)} frames, {len(latencies)} register writes ({k} rounds), worst {worst[0]} cycles "
                  f"(at {worst[1]}), MAC RX stalls {env.rx.stall_cycles}")
    assert k >= 2, "the flood ended before the control path was exercised"
    assert worst[0] <= CONTROL_BOUND, f"a register write took {worst[0]} cycles under receive traffic"
    assert env.rx.stall_cycles == 0, f"MAC RX waited {env.rx.stall_cycles} cycles"
    c = await env.ctl.read_counters()
    assert (c["rx_qp_not_ready"], c["rx_accepted"], c["acks_sent"] + c["acks_coalesced"]) == (n, n, n), c
