"""AckBuilder (+ IcrcInserter) against model/parse.py build_response, and TxMux (ACKs merged into the
data beat stream at frame boundaries only), in Amaranth's simulator."""
import gc
import random
import warnings

import pytest
from amaranth.back import verilog
from amaranth.hdl import Elaboratable, Module, UnusedElaboratable
from amaranth.lib import wiring

from model.frames import Port, QpContext, build_write_frames
from model.parse import build_response
from model.read_atomic import build_atomic_ack
from rtl.responder.ack_builder import ACK_FRAME_LEN, ATOMIC_ACK_FRAME_LEN, AckBuilder
from rtl.port.icrc_inserter import IcrcInserter
from rtl.common.tx_beat import TxBeat
from rtl.port.tx_mux import TxMux
from spec.formats import Aeth
from spec.params import DATA_BYTES
from tests.blocks.helpers import run
from tests.blocks.test_blocks import _beats

BEAT = DATA_BYTES
NQ, NC = 1024, 64
SYNDROMES = (Aeth.ACK, Aeth.NAK_PSN_SEQ, Aeth.NAK_INVALID_REQ, Aeth.NAK_REMOTE_ACCESS, Aeth.NAK_REMOTE_OP)


def _run(dut, bench):
    run(dut, bench)


# ---- AckBuilder -> IcrcInserter ----------------------------------------------------------
class _AckPath(Elaboratable):
    def __init__(self):
        self.ack = AckBuilder(num_qps=NQ, num_cqs=NC)
        self.icrc = IcrcInserter(num_qps=NQ, num_cqs=NC)

    def elaborate(self, platform):
        m = Module()
        m.submodules.ack, m.submodules.icrc = self.ack, self.icrc
        wiring.connect(m, self.ack.frames, self.icrc.i)
        return m


def _requests(rnd, n):
    """Random requests: (fields for AckRequest, port_mac, port_ip, golden frame)."""
    out = []
    for k in range(n):
        req = {"dmac": rnd.randrange(1 << 48), "dip": rnd.randrange(1 << 32), "dest_qp": rnd.randrange(1 << 24),
               "src_qpn": rnd.randrange(NQ), "psn": rnd.randrange(1 << 24),
               "syndrome": SYNDROMES[k % len(SYNDROMES)] if k < 10 else rnd.choice(SYNDROMES),
               "msn": rnd.randrange(1 << 24), "atomic": 0, "orig": 0}
        if k in (1, 5) or (k > 10 and rnd.random() < 0.2):
            # an ATOMIC ACKNOWLEDGE (alone in its transfer)
            req.update(atomic=1, syndrome=Aeth.ACK, orig=rnd.choice([rnd.randrange(1 << 64), (1 << 64) - 1]))
        if k == 0:
            req.update(psn=(1 << 24) - 1, msn=(1 << 24) - 1, dest_qp=(1 << 24) - 1, src_qpn=NQ - 1)
        mac, ip = rnd.randrange(1 << 48), rnd.randrange(1 << 32)
        out.append(_with_port(req, mac, ip))
    return out


def _with_port(req, mac, ip):
    """(req, mac, ip, the golden frame of req sent from port mac/ip)."""
    qp = QpContext(qpn=req["src_qpn"], remote_qpn=req["dest_qp"], dmac=req["dmac"], dip=req["dip"])
    if req["atomic"]:
        want = build_atomic_ack(qp, Port(smac=mac, sip=ip), req["psn"], req["msn"], req["orig"])
        assert len(want) == ATOMIC_ACK_FRAME_LEN
    else:
        want = build_response(qp, Port(smac=mac, sip=ip), req["psn"], req["syndrome"], req["msn"])
        assert len(want) == ACK_FRAME_LEN
    return req, mac, ip, want


def _groups(rnd, reqs):
    """The requests as transfers of one or two (the first few single, then pairs, then random)."""
    out, k = [], 0
    while k < len(reqs):
        n = 1 if k < 3 else 2 if k < 9 else rnd.choice([1, 2])
        if reqs[k][0]["atomic"] or (k + 1 < len(reqs) and reqs[k + 1][0]["atomic"]):
            n = 1                   # an ATOMIC ACK fills half a beat and more: it goes alone
        g = reqs[k:k + n]
        if len(g) == 2:             # one port sends both
            g[1] = _with_port(g[1][0], g[0][1], g[0][2])
        out.append(g)
        k += n
    return out


def _ack_bench(ack, out, groups, n_full, rnd, log):
    """Transfers 0..n_full-1 offered every cycle with the output always ready, the rest with
    random gaps and random output stalls. ``log`` collects ``took`` (cycle each transfer was
    taken), ``mid`` (AckBuilder beats: data and the fixed fields) and ``out`` (beats out: the
    one or two frames, with their cycle)."""
    mid = ack.frames
    fields = ("nbytes", "last", "frame", "flen", "sop_hi", "end_hi", "flen_hi", "cpl_valid")

    async def bench(ctx):
        i = cycle = 0
        on = False                   # transfer i offered and not yet taken: keep it
        while len(log["out"]) < len(groups):
            assert cycle < 20 * len(groups), "ACK path stopped"
            stalls = len(log["out"]) >= n_full
            on = i < len(groups) and (on or i < n_full or rnd.random() < 0.7)
            ctx.set(ack.requests.valid, on)
            if on:
                ctx.set(ack.requests.p.as_value(), 0)
                ctx.set(ack.requests.p.second, len(groups[i]) == 2)
                for k, (req, mac, ip, _) in enumerate(groups[i]):
                    for name, v in req.items():
                        ctx.set(getattr(ack.requests.p.p[k], name), v)
                    ctx.set(ack.port_mac, mac)           # one port: the pair's share it
                    ctx.set(ack.port_ip, ip)
            ctx.set(out.ready, not stalls or rnd.random() < 0.5)
            await ctx.delay(1e-12)
            if ctx.get(ack.requests.valid) and ctx.get(ack.requests.ready):
                log["took"].append(cycle)
                i, on = i + 1, False
            if ctx.get(mid.valid) and ctx.get(mid.ready):
                log["mid"].append((ctx.get(mid.p.data).to_bytes(BEAT, "little"),
                                   tuple(ctx.get(getattr(mid.p, f)) for f in fields)))
            if ctx.get(out.valid) and ctx.get(out.ready):
                assert ctx.get(out.p.last) and ctx.get(out.p.frame)
                raw = ctx.get(out.p.data).to_bytes(BEAT, "little")
                frames = [raw[:ctx.get(out.p.nbytes)]]
                if ctx.get(out.p.sop_hi):
                    assert ctx.get(out.p.end_hi)
                    frames.append(raw[64:64 + ctx.get(out.p.flen_hi)])
                log["out"].append((frames, cycle))
            await ctx.tick()
            cycle += 1
    return bench


def _check_ack_log(groups, n_full, log, latency, icrc_filled):
    assert len(log["took"]) == len(log["mid"]) == len(log["out"]) == len(groups)
    for k, (g, (raw, fields), (got, _)) in enumerate(zip(groups, log["mid"], log["out"])):
        wants = [w for _, _, _, w in g]
        L = len(wants[0])
        # the frames with the 4 ICRC bytes zero, at lanes 0 and 64, the rest of the beat zero
        beat = (wants[0][:-4] + bytes(4) + (bytes(64 - L) + wants[1][:-4] + bytes(64 - L + 4) if len(g) == 2
                                            else bytes(BEAT - L)))
        assert raw == beat, f"transfer {k}: beat\n{raw.hex()}\n!= model\n{beat.hex()}"
        two = int(len(g) == 2)
        # nbytes last frame flen sop_hi end_hi flen_hi cpl_valid
        assert fields == (L, 1, 1, L, two, two, L * two, 0), f"transfer {k}: {fields}"
        if icrc_filled:
            assert got == wants, f"transfer {k}: frames\n{[f.hex() for f in got]}\n!= model\n{[w.hex() for w in wants]}"
    # full rate: one transfer per cycle from the first, each beat ``latency`` cycles later
    assert log["took"][:n_full] == list(range(n_full))
    assert [c for _, c in log["out"][:n_full]] == [c + latency for c in range(n_full)]


@pytest.mark.parametrize("seed", [41, 42])
def test_ack_builder_matches_model(seed):
    """AckBuilder alone, many requests, one or two per transfer: every beat holds
    build_response's frames (at lanes 0 and 64) with the 4 ICRC bytes zero, the rest of the
    beat zero and the fixed fields; one transfer per cycle at full rate (registered: one
    cycle later), in order with none lost or doubled under random stalls."""
    rnd = random.Random(seed)
    n_full = 200
    groups = _groups(rnd, _requests(rnd, 1200))
    dut = AckBuilder(num_qps=NQ, num_cqs=NC)
    log = {"took": [], "mid": [], "out": []}
    _run(dut, _ack_bench(dut, dut.frames, groups, n_full, rnd, log))
    _check_ack_log(groups, n_full, log, latency=1, icrc_filled=False)


def test_ack_builder_with_icrc_matches_model():
    """AckBuilder -> IcrcInserter: frames byte-identical to build_response (ICRC included, also
    of the frame at lane 64 of a pair's beat), one transfer per cycle at full rate, then under
    random stalls. (The ICRC unit is slow in this simulator: ~0.1 s a cycle, hence fewer
    requests than above.)"""
    rnd = random.Random(43)
    n_full = 12
    groups = _groups(rnd, _requests(rnd, 60))
    dut = _AckPath()
    log = {"took": [], "mid": [], "out": []}
    _run(dut, _ack_bench(dut.ack, dut.icrc.o, groups, n_full, rnd, log))
    _check_ack_log(groups, n_full, log, latency=2, icrc_filled=True)


def test_block_arguments():
    """num_qps/num_cqs are checked, with the name and the value in the message."""
    with warnings.catch_warnings():
        # a constructor that raises leaves an object Amaranth would report as unused
        warnings.simplefilter("ignore", UnusedElaboratable)
        for cls in (AckBuilder, TxMux):
            for bad in (0, 1, 1.5, "8", None, True, 1 << 25):
                with pytest.raises(ValueError, match=r"num_qps must be an int in 2\.\.2\*\*24, not"):
                    cls(num_qps=bad, num_cqs=4)
                with pytest.raises(ValueError, match="num_cqs"):
                    cls(num_qps=4, num_cqs=bad)
        gc.collect()


def test_verilog_conversion():
    for dut in (AckBuilder(num_qps=NQ, num_cqs=NC), TxMux(num_qps=NQ, num_cqs=NC)):
        text = verilog.convert(dut, name=type(dut).__name__.lower())
        assert "module" in text


# ---- TxMux ---------------------------------------------------------------------------------
LAYOUT = TxBeat(NQ, NC)


def _pack(**fields):
    return LAYOUT.const(fields).as_value().value


def _data_stream(rnd):
    """The packet builder's beats for random WRITE frames (64-byte segments: frames packed at
    lane 64 behind short tails), cut into groups by marker beats; completions on some last
    beats. Returns the TxBeat payloads as ints."""
    qp = QpContext(qpn=5, remote_qpn=0x4321, dmac=0x020000000002, dip=0x0A000002, mtu=1024)
    port = Port(smac=0x020000000001, sip=0x0A000001)
    beats = []
    for g in range(80):
        frames = []
        for _ in range(rnd.randrange(0, 6)):
            p = rnd.choice([0, 8, 40, 60, 100, 150, 180, 250, 400, 1500])
            frames += build_write_frames(qp, port, 0x1000, 7, bytes(rnd.randrange(256) for _ in range(p)),
                                         rnd.randrange(1 << 24))
        for data, n, last, flen, sop_hi, flen_hi in (_beats(frames, True) if frames else []):
            cpl = rnd.random() < 0.5 and last
            beats.append(_pack(data=data, nbytes=n, last=last, frame=1, flen=flen, sop_hi=sop_hi,
                               flen_hi=flen_hi, cpl_valid=cpl,
                               cpl={"qpn": rnd.randrange(NQ), "index": rnd.randrange(1 << 16)} if cpl else {}))
        for _ in range(rnd.choice([0, 0, 1, 2])):
            beats.append(_pack(frame=0, last=1, cpl_valid=1,
                               cpl={"qpn": rnd.randrange(NQ), "cqn": rnd.randrange(NC), "error": 1}))
    return beats


def _fields(value):
    """The control bits of a TxBeat payload int."""
    return {name: (value >> LAYOUT[name].offset) & 1 for name in ("last", "frame", "sop_hi")}


def _opens(value):
    f = _fields(value)
    return bool(f["frame"]) and bool(f["sop_hi"] or not f["last"])


def _mux_bench(dut, data, acks, rnd, *, p_data, p_ack, p_ready, log):
    """Sources that hold a beat until taken (stream rule), a sink with random ready. ``log``
    gets one entry per cycle: (o.valid, o.ready, o.p, data.valid, data.ready, data.p,
    acks.valid, acks.ready, acks.p)."""
    async def bench(ctx):
        i = j = 0
        cycle = 0
        d_on = a_on = False          # a beat is offered and not yet taken: keep it
        while i < len(data) or j < len(acks):
            assert cycle < 10 * (len(data) + len(acks)) + 100, "mux stopped"
            d_on = i < len(data) and (d_on or rnd.random() < p_data)
            a_on = j < len(acks) and (a_on or rnd.random() < p_ack)
            ctx.set(dut.data.valid, d_on)
            if d_on:
                ctx.set(dut.data.p.as_value(), data[i])
            ctx.set(dut.acks.valid, a_on)
            if a_on:
                ctx.set(dut.acks.p.as_value(), acks[j])
            ctx.set(dut.o.ready, rnd.random() < p_ready)
            await ctx.delay(1e-12)
            entry = tuple(ctx.get(s) for s in (dut.o.valid, dut.o.ready, dut.o.p.as_value(),
                                               dut.data.valid, dut.data.ready, dut.data.p.as_value(),
                                               dut.acks.valid, dut.acks.ready, dut.acks.p.as_value()))
            log.append(entry)
            if entry[3] and entry[4]:
                i, d_on = i + 1, False
            if entry[6] and entry[7]:
                j, a_on = j + 1, False
            await ctx.tick()
            cycle += 1
    return bench


@pytest.mark.parametrize("seed", [1, 2])
def test_tx_mux_merges_acks_at_boundaries(seed):
    """Data beats leave in order and unchanged, every ACK leaves once and unchanged, only at a
    data frame boundary (never inside a frame, never after a sop_hi beat), ACKs first at a
    boundary, and a beat offered under a stall stays until it is taken."""
    rnd = random.Random(seed)
    data = _data_stream(rnd)
    assert any(_fields(b)["sop_hi"] for b in data) and any(not _fields(b)["frame"] for b in data)
    acks = [_pack(data=rnd.randrange(1 << 496), nbytes=ACK_FRAME_LEN, last=1, frame=1, flen=ACK_FRAME_LEN)
            for _ in range(len(data) // 3)]
    dut = TxMux(num_qps=NQ, num_cqs=NC)
    log = []
    _run(dut, _mux_bench(dut, data, acks, rnd, p_data=0.8, p_ack=0.3, p_ready=0.7, log=log))

    out, prev = [], None
    frame_open = False
    last_data = None                 # the last data beat out
    held_by_sop_hi = after_marker = 0
    for t, (ov, ordy, op, dv, drdy, dp, av, ardy, ap) in enumerate(log):
        took_d, took_a = dv and drdy, av and ardy
        assert not (took_d and took_a), f"cycle {t}: both inputs taken"
        shown = "d" if ov and dv and op == dp else "a" if ov and av and op == ap else None
        assert shown or not ov, f"cycle {t}: output beat is neither input's"
        if av and not frame_open:
            # ACK first at a boundary, unless a data beat was already on the (stalled) output
            assert shown == "a" or (prev is not None and prev[3] == "d" and not prev[1]), \
                f"cycle {t}: data beat before a waiting ACK at a frame boundary"
        if ov and ordy:
            assert took_d or took_a, f"cycle {t}: output beat from no input"
            assert op == (dp if took_d else ap), f"cycle {t}: beat changed on the way"
            out.append(("d" if took_d else "a", op))
        else:
            assert not (took_d or took_a), f"cycle {t}: an input beat taken without an output transfer"
        if prev is not None and prev[0] and not prev[1]:
            assert ov and op == prev[2], f"cycle {t}: a stalled output beat changed or vanished"
        if took_a:
            assert not frame_open, f"cycle {t}: ACK inside a data frame"
            after_marker += last_data is not None and not _fields(last_data)["frame"]
        if av and frame_open and _fields(last_data)["sop_hi"]:
            held_by_sop_hi += 1
        if took_d:
            frame_open = _opens(dp)
            last_data = dp
        prev = (ov, ordy, op, shown)
    assert [v for s, v in out if s == "d"] == data
    assert [v for s, v in out if s == "a"] == acks
    # the cases of interest happened: an ACK waited behind a sop_hi beat, ACKs followed markers,
    # and ACKs were interleaved with the data rather than all before or after it
    assert held_by_sop_hi > 0 and after_marker > 0
    kinds = "".join(s for s, _ in out)
    assert "dad" in kinds


def test_tx_mux_without_acks_is_a_wire():
    """With no ACKs the output is the data stream, cycle by cycle (valid, payload, ready)."""
    rnd = random.Random(9)
    data = _data_stream(rnd)
    dut = TxMux(num_qps=NQ, num_cqs=NC)
    log = []
    _run(dut, _mux_bench(dut, data, [], rnd, p_data=0.8, p_ack=0, p_ready=0.7, log=log))
    for t, (ov, ordy, op, dv, drdy, dp, av, ardy, ap) in enumerate(log):
        assert (ov, drdy) == (dv, ordy), f"cycle {t}: valid/ready not passed through"
        assert op == dp, f"cycle {t}: payload not passed through"
        assert not ardy or not av
    assert sum(1 for e in log if e[0] and e[1]) == len(data)


def test_tx_mux_two_acks_in_a_beat_close_the_frame():
    """A beat of two ACK frames (the second at lane 64 and ending there too: ``sop_hi`` =
    ``end_hi`` = 1) leaves no ACK frame open: the data frames waiting behind it go next.
    (The mux took ``sop_hi`` alone for an open frame and gave the output to the responder
    until its next single-frame beat, which may never come: the requester's frames then
    waited for ever. The 4-NIC switch run with faults hung so: a duplicated request's two
    ACKs left together as the responder's last beat, and the go-back's resend never left.)"""
    pair = _pack(data=(1 << 496) - 1, nbytes=ACK_FRAME_LEN, last=1, frame=1, flen=ACK_FRAME_LEN,
                 sop_hi=1, end_hi=1, flen_hi=ACK_FRAME_LEN)
    data = _data_stream(random.Random(3))[:40]
    dut = TxMux(num_qps=NQ, num_cqs=NC)
    log = []
    # the pair goes first (the data arrive from the next cycle on), then only data
    _run(dut, _pair_then_data(dut, pair, data, log))
    out = [(dv and drdy, av and ardy) for ov, ordy, op, dv, drdy, dp, av, ardy, ap in log]
    assert sum(a for _, a in out) == 1
    assert sum(d for d, _ in out) == len(data), "data beats held behind a two-ACK beat"


def _pair_then_data(dut, pair, data, log, limit=200):
    """The two-ACK beat on ``acks`` in the first cycle, ``data`` offered from the second on,
    the output always ready; ``log`` as :func:`_mux_bench`'s. Stops when the data are out or
    after ``limit`` cycles."""
    async def bench(ctx):
        i, cycle = 0, 0
        ctx.set(dut.o.ready, 1)
        while i < len(data) and cycle < limit:
            ctx.set(dut.acks.valid, cycle == 0)
            ctx.set(dut.acks.p.as_value(), pair if cycle == 0 else 0)
            ctx.set(dut.data.valid, cycle > 0)
            ctx.set(dut.data.p.as_value(), data[i])
            await ctx.delay(1e-12)
            entry = tuple(ctx.get(s) for s in (dut.o.valid, dut.o.ready, dut.o.p.as_value(),
                                               dut.data.valid, dut.data.ready, dut.data.p.as_value(),
                                               dut.acks.valid, dut.acks.ready, dut.acks.p.as_value()))
            log.append(entry)
            i += bool(entry[3] and entry[4])
            await ctx.tick()
            cycle += 1
    return bench
