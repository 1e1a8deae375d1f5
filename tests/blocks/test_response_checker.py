"""ResponseChecker: a received ACK/NAK is passed on only when it belongs to its QP.

A reference of the checker's per-QP state, written here from the block's docstring and
``model.requester.RcRequester.on_response`` (not from the RTL): the QP's configuration
(peer MAC/IPv4, UC, state) from every commit; the acknowledged PSN, the last PSN-sequence
NAK and the failure by a fatal NAK from the responses that passed; the failure by the
tracker's ``failed`` strobe; the highest PSN sent from the packet notes (a note of an
older PSN, a go-back-N resend, does not lower it). A create resets all but the
configuration it sets: nothing sent or acknowledged before ``start_psn``.

Timing, as the docstring gives it: a pair taken in cycle t is decided in t+1 on the
state after every event up to t (commits, ``failed`` strobes, the responses decided
before it, lane 0 before lane 1), except packet notes, which count from the cycle after
theirs (a note of t for pairs taken in t+1); a commit in t+1 of the QP drops it
(``qp_state``); ``dropped`` says the reasons in t+1 and ``o`` carries the records that
passed, packed to the front, in t+2.

Checked cycle by cycle against the reference: ``i.ready`` and ``commit.ready`` are 1,
``dropped`` per reason, ``o.valid``, ``o.p.second`` and the records on ``o``. Random
runs (pairs of one QP, back-to-back pairs of one QP, repeats, forged peers, full QPNs,
commits, notes going back, ``failed`` strobes, start PSNs just before the 2^24 wrap);
directed cases for each reason, checked against literal outcomes too; a PSN window
across the wrap.

Not covered by the random runs: a ``failed`` strobe in the cycle of a create (its own
directed test), and syndromes with bit 7 set (reserved; the block decodes bits 6:5 and
compares the whole byte with ``Aeth.NAK_PSN_SEQ``, the model takes ``syndrome >> 5``).
"""
import random
from dataclasses import dataclass, field

import pytest

from rtl.common.records import AckRecord, Response
from rtl.requester.response_checker import ResponseChecker
from spec.formats import Aeth, QpState, RESPONSE_DROP_NAMES
from tests.blocks.helpers import run

MASK = (1 << 24) - 1
HALF = 1 << 23
NAMES = RESPONSE_DROP_NAMES
FATAL = (Aeth.NAK_INVALID_REQ, Aeth.NAK_REMOTE_ACCESS, Aeth.NAK_REMOTE_OP)


def peer(q, salt=0):
    """A QP's peer (dmac, dip)."""
    return 0x0200_0000_0000 | salt << 16 | q, 0x0A00_0000 | salt << 16 | q


def resp(q, psn, syn=Aeth.ACK, msn=0, mac_ip=None):
    """A response from ``mac_ip`` (the QP's default peer if None)."""
    smac, sip = peer(q & 0xFFFF) if mac_ip is None else mac_ip
    return (q, psn & MASK, syn, msn, smac, sip)


def commit(q, create=False, start_psn=0, state=QpState.RTS, uc=0, mac_ip=None):
    dmac, dip = peer(q) if mac_ip is None else mac_ip
    return dict(qpn=q, create=int(create), start_psn=start_psn & MASK, dmac=dmac, dip=dip, uc=uc, state=state)


def behind(a, b):
    """``a`` at or before ``b`` (mod 2^24)."""
    return ((b - a) & MASK) < HALF


@dataclass
class Dyn:
    acked: int = 0
    nak_valid: bool = False
    nak_psn: int = 0
    failed: bool = False       # by a fatal NAK


@dataclass
class Ref:
    """The checker's decisions and per-QP state (RAMs start zeroed: state RESET)."""
    qb: int
    cfg: dict = field(default_factory=dict)      # qpn -> commit dict
    dyn: dict = field(default_factory=dict)      # qpn -> Dyn
    fail: set = field(default_factory=set)       # failed by the tracker's strobe
    hw: dict = field(default_factory=dict)       # qpn -> highest PSN sent

    def commit(self, c):
        q = c["qpn"]
        self.cfg[q] = c
        if c["create"]:
            self.dyn[q] = Dyn(acked=(c["start_psn"] - 1) & MASK)
            self.hw[q] = (c["start_psn"] - 1) & MASK
            self.fail.discard(q)

    def note(self, q, psn):
        if not behind(psn, self.hw.get(q, 0)):
            self.hw[q] = psn

    def failed(self, q):
        self.fail.add(q)

    def decide(self, r, commit_q):
        """The reason index ``r`` is dropped for, or None (passed, the state updated)."""
        q, psn, syn = r[0], r[1], r[2]
        if q >> self.qb:
            return NAMES.index("unknown_qp")
        c = self.cfg.get(q, dict(dmac=0, dip=0, uc=0, state=QpState.RESET))
        d = self.dyn.setdefault(q, Dyn())
        kind = syn >> 5 & 3
        if c["uc"]:
            return NAMES.index("not_rc")
        if c["state"] != QpState.RTS or d.failed or q in self.fail or q == commit_q:
            return NAMES.index("qp_state")
        if r[4] != c["dmac"] or r[5] != c["dip"]:
            return NAMES.index("wrong_peer")
        if kind == Aeth.KIND_RESERVED:
            return NAMES.index("bad_aeth")
        if not behind(psn, self.hw.get(q, 0)):
            return NAMES.index("psn_ahead")
        if behind(psn, d.acked):
            return NAMES.index("stale")
        no_progress = (psn - 1) & MASK == d.acked
        if syn == Aeth.NAK_PSN_SEQ and no_progress and d.nak_valid and d.nak_psn == psn:
            return NAMES.index("duplicate_nak")
        if kind == Aeth.KIND_ACK:
            d.acked, d.nak_valid = psn, False
        elif kind in (Aeth.KIND_NAK, Aeth.KIND_RNR):         # both acknowledge every PSN before theirs
            if not no_progress:
                d.acked, d.nak_valid = (psn - 1) & MASK, False
            if syn == Aeth.NAK_PSN_SEQ:
                d.nak_valid, d.nak_psn = True, psn
            elif kind == Aeth.KIND_NAK:                      # (an RNR NAK fails nothing here)
                d.failed = True
        return None


def _pack(layout, values):
    """The bits of a ``StructLayout`` value given as a tuple in field order (one
    ``ctx.set`` of the whole payload: the simulator is slow per call)."""
    v = 0
    for (name, f), x in zip(layout, values):
        v |= (x & ((1 << f.width) - 1)) << f.offset
    return v


def _unpack(layout, v):
    return tuple(v >> f.offset & ((1 << f.width) - 1) for _, f in layout)


def _run(num_qps, events, cycles):
    """Simulate ``cycles`` cycles; ``events(t, ref)`` gives the inputs of cycle t, a dict
    with any of ``pair`` (list of 1 or 2 responses), ``junk`` (the unused lane-1
    payload), ``commit``, ``note`` ((qpn, psn)), ``failed`` (qpn). Checks every cycle
    against the reference; returns the outcome of each response, in order:
    (cycle taken, response, reason name or "pass")."""
    dut = ResponseChecker(num_qps=num_qps)
    qb = max(1, (num_qps - 1).bit_length())
    ref = Ref(qb)
    outcomes = []
    pair_in = dut.i.p.shape()
    lane_off = [pair_in["p"].offset + k * Response.size for k in range(2)]
    pair_out = dut.o.p.shape()
    lane_size = pair_out["p"].shape.size // 2       # CheckedResponse: the AckRecord first
    out_off = [pair_out["p"].offset + k * lane_size for k in range(2)]
    commit_layout = dut.commit.p.shape()
    note_layout = dut.packets.shape()
    failed_layout = dut.failed.shape()

    async def bench(ctx):
        pending, pending_t = [], 0      # the pair taken last cycle, decided this cycle
        delayed_note = None             # last cycle's note: counts from this cycle on
        expect_o = []                   # records passed last cycle: on ``o`` this cycle
        for t in range(cycles):
            ev = events(t, ref)
            pair = ev.get("pair") or []
            lanes = pair + [ev.get("junk", resp(0, 0, 0))] * (2 - len(pair))
            ctx.set(dut.i.valid, bool(pair))
            ctx.set(dut.i.p.as_value(), (len(pair) == 2) << pair_in["second"].offset
                    | sum(_pack(Response, r) << off for r, off in zip(lanes, lane_off)))
            c = ev.get("commit")
            ctx.set(dut.commit.valid, c is not None)
            ctx.set(dut.commit.p.as_value(), _pack(commit_layout, [c[n] for n, _ in commit_layout]) if c else 0)
            note = ev.get("note")
            ctx.set(dut.packets.as_value(), _pack(note_layout, (1, *note)) if note else 0)
            fq = ev.get("failed")
            ctx.set(dut.failed.as_value(), _pack(failed_layout, (1, fq)) if fq is not None else 0)

            assert ctx.get(dut.i.ready) and ctx.get(dut.commit.ready), f"cycle {t}: input held"
            # the output: the records passed in the decision of last cycle
            ov = ctx.get(dut.o.valid)
            assert ov == bool(expect_o), f"cycle {t}: o.valid {ov}, expected {expect_o}"
            if ov:
                op = ctx.get(dut.o.p.as_value())
                assert op >> pair_out["second"].offset & 1 == (len(expect_o) == 2), \
                    f"cycle {t}: o.second, expected {expect_o}"
                got = [_unpack(AckRecord, op >> out_off[k]) for k in range(len(expect_o))]
                assert got == expect_o, f"cycle {t}: o carries {got}, expected {expect_o}"
            # the decision of the pair taken last cycle (lane 0, then lane 1 on its result)
            commit_q = c["qpn"] if c else None
            reasons = [ref.decide(r, commit_q) for r in pending]
            counts = [0] * len(NAMES)
            for x in reasons:
                if x is not None:
                    counts[x] += 1
            dropped = ctx.get(dut.dropped.as_value())
            got_counts = [dropped >> 2 * j & 3 for j in range(len(NAMES))]
            assert got_counts == counts, (f"cycle {t}: dropped {dict(zip(NAMES, got_counts))}, expected "
                                          f"{dict(zip(NAMES, counts))} for {pending} -> {reasons}")
            expect_o = [r[:4] for r, x in zip(pending, reasons) if x is None]
            outcomes.extend([(pending_t, r, "pass" if x is None else NAMES[x]) for r, x in zip(pending, reasons)])
            # this cycle's events, in the order the block sees them
            if delayed_note is not None:
                ref.note(*delayed_note)
            if c is not None:
                ref.commit(c)
            if fq is not None:
                ref.failed(fq)
            delayed_note = note
            pending, pending_t = pair, t
            await ctx.tick()

    run(dut, bench)
    return outcomes


# ---- random runs ---------------------------------------------------------------------

class Traffic:
    """Random inputs of a few QPs, aimed at the reference's PSN window (so that many
    responses pass and every check is hit)."""
    def __init__(self, rnd, num_qps, qps):
        self.rnd, self.num_qps, self.qps = rnd, num_qps, qps
        self.qb = max(1, (num_qps - 1).bit_length())
        self.peers = {}
        self.last = {}                      # qpn -> the last response made for it
        self.init = [commit(q, create=True, start_psn=self._start(), mac_ip=self._peer(q)) for q in qps]

    def _start(self):
        return self.rnd.choice([self.rnd.randrange(1 << 24), MASK - self.rnd.randrange(40), self.rnd.randrange(20)])

    def _peer(self, q, new=False):
        if new or q not in self.peers:
            self.peers[q] = peer(q, self.rnd.randrange(4))
        return self.peers[q]

    def response(self, ref, q=None):
        rnd = self.rnd
        q = rnd.choice(self.qps) if q is None else q
        if q in self.last and rnd.random() < 0.2:
            return self.last[q]                       # a repeat (a duplicate ACK or NAK)
        d = ref.dyn.get(q, Dyn())
        hw = ref.hw.get(q, 0)
        x = rnd.random()
        if x < 0.35:
            psn = d.acked + rnd.randrange(-1, 4)
        elif x < 0.55:
            psn = hw + rnd.randrange(-2, 3)
        elif x < 0.97:
            psn = d.acked + rnd.randrange(((hw - d.acked) & MASK) % HALF + 1)
        else:
            psn = rnd.randrange(1 << 24)
        x = rnd.random()
        if x < 0.5:
            syn = Aeth.ACK
        elif x < 0.53:
            syn = rnd.randrange(32)                   # an ACK of another credit count
        elif x < 0.8:
            syn = Aeth.NAK_PSN_SEQ
        elif x < 0.802:
            syn = rnd.choice(FATAL + (0x64 | rnd.randrange(4),))     # fails the QP
        elif x < 0.9:
            syn = Aeth.RNR_NAK | rnd.randrange(32)
        else:
            syn = 0x40 | rnd.randrange(32)            # the reserved kind
        mac_ip = self._peer(q)
        x = rnd.random()
        if x < 0.03:
            mac_ip = (mac_ip[0] ^ 1 << rnd.randrange(48), mac_ip[1])
        elif x < 0.06:
            mac_ip = (mac_ip[0], mac_ip[1] ^ 1 << rnd.randrange(32))
        qpn = q
        x = rnd.random()
        if x < 0.03:
            qpn = q | rnd.randrange(1, 1 << (24 - self.qb)) << self.qb      # the QPN's upper bits
        elif x < 0.05:
            qpn = rnd.choice([p for p in range(self.num_qps) if p not in self.qps])   # never created
        r = (qpn, psn & MASK, syn, rnd.randrange(1 << 24), *mac_ip)
        self.last[q] = r
        return r

    def events(self, t, ref):
        rnd = self.rnd
        if t < len(self.init):
            return {"commit": self.init[t]}
        ev = {}
        if rnd.random() < 0.75:
            r0 = self.response(ref)
            pair = [r0]
            if rnd.random() < 0.6:
                x = rnd.random()
                if x < 0.15:
                    pair.append(r0)                   # the same record twice
                elif x < 0.55:
                    pair.append(self.response(ref, r0[0] & (self.num_qps - 1)))  # the same QP
                else:
                    pair.append(self.response(ref))
            ev["pair"] = pair
        ev["junk"] = self.response(ref)               # lane 1 when ``second`` is 0: ignored
        if rnd.random() < 0.03:
            q = rnd.choice(self.qps)
            x = rnd.random()
            if x < 0.5:
                ev["commit"] = commit(q, create=True, start_psn=self._start(), mac_ip=self._peer(q, new=True))
            else:
                state = QpState.RTS if rnd.random() < 0.85 else rnd.choice([s for s in range(7) if s != QpState.RTS])
                uc = int(rnd.random() < 0.08)
                ev["commit"] = commit(q, state=state, uc=uc, mac_ip=self._peer(q, new=rnd.random() < 0.2))
        if rnd.random() < 0.6:
            q = rnd.choice(self.qps)
            hw = ref.hw.get(q, 0)
            x = rnd.random()
            step = rnd.randrange(1, 4) if x < 0.8 else -rnd.randrange(0, 12)   # going back: a resend
            ev["note"] = (q, (hw + step) & MASK)
        if rnd.random() < 0.001:
            q = rnd.choice(self.qps)
            c = ev.get("commit")
            if not (c and c["create"]):               # (with a create: test_failed_strobe_during_create)
                ev["failed"] = q
        return ev


def _random_run(num_qps, qps, seed, cycles):
    rnd = random.Random(seed)
    tr = Traffic(rnd, num_qps, qps)
    outcomes = _run(num_qps, tr.events, cycles)
    hits = {n: 0 for n in ("pass",) + NAMES}
    for _, _, x in outcomes:
        hits[x] += 1
    return outcomes, hits


@pytest.mark.parametrize("num_qps,nq,seed", [(16, 1, 1), (16, 3, 2), (16, 6, 3), (1024, 4, 4)])
def test_response_checker_random(num_qps, nq, seed):
    rnd = random.Random(seed)
    qps = rnd.sample(range(num_qps), nq)
    outcomes, hits = _random_run(num_qps, qps, seed, 2000)
    # the run reached every outcome, and many passed
    assert all(v > 0 for v in hits.values()), hits
    assert hits["pass"] > len(outcomes) // 5, hits


# ---- directed cases ------------------------------------------------------------------

def _script(steps):
    """Events from a list: one dict per cycle (``{}`` an idle cycle)."""
    steps = list(steps) + [{}, {}, {}]
    return (lambda t, ref: steps[t]), len(steps)


def _outcomes(num_qps, steps):
    events, n = _script(steps)
    return [(r[0], r[1], r[2], x) for _, r, x in _run(num_qps, events, n)]


def _expect(got, want):
    """``want``: (qpn, psn, syndrome, outcome) per response, in order."""
    assert len(got) == len(want), got
    for k, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"response {k}: {g}, expected {w}"


A, SEQ, RNR, INV = Aeth.ACK, Aeth.NAK_PSN_SEQ, Aeth.RNR_NAK, Aeth.NAK_INVALID_REQ


def _setup():
    """QP 1 RC in RTS from PSN 100 with 100..104 sent; QP 2 UC; QP 3 in RTR; QP 4 RTS
    from 500 with 500..501 sent."""
    return [{"commit": commit(1, create=True, start_psn=100)},
            {"commit": commit(2, create=True, start_psn=7, uc=1)},
            {"commit": commit(3, create=True, start_psn=9, state=QpState.RTR)},
            {"commit": commit(4, create=True, start_psn=500)},
            *({"note": (1, p)} for p in range(100, 105)),
            {"note": (4, 500)}, {"note": (4, 501)}, {}]


def test_each_reason():
    steps = _setup() + [{"pair": [r]} for r in [
        resp(1 | 1 << 4, 101),                        # upper QPN bits: unknown
        resp(1 | 1 << 23, 101),
        resp(2, 7),                                   # UC
        resp(3, 9),                                   # not RTS
        resp(5, 0),                                   # never created: state RESET
        resp(1, 101, mac_ip=(peer(1)[0] ^ 1, peer(1)[1])),     # wrong MAC
        resp(1, 101, mac_ip=(peer(1)[0], peer(1)[1] ^ 1 << 31)),  # wrong IPv4
        resp(1, 101, syn=0x40),                       # reserved AETH kind
        resp(1, 101, syn=0x5F),
        resp(1, 105),                                 # after the last PSN sent
        resp(1, 100 + HALF),
        resp(1, 99),                                  # before the first: acknowledged
        resp(1, 99 - HALF + 10),
        resp(1, 100, syn=RNR),                        # RNR NAK: passes, moves nothing
        resp(1, 100, syn=RNR),
        resp(1, 100, syn=SEQ),                        # NAK of 100: nothing new acknowledged
        resp(1, 100, syn=SEQ),                        # the same again: duplicate
        resp(1, 100, syn=0x00),                       # an ACK (credit 0) of 100
        resp(1, 100, syn=A),                          # stale now
        resp(1, 101, syn=SEQ),                        # NAK 101 (no progress past 100)
        resp(1, 101, syn=SEQ),                        # duplicate
        resp(1, 103, syn=SEQ),                        # progress: acknowledges 102
        resp(1, 102, syn=SEQ),                        # a NAK of an acknowledged PSN: stale
        resp(1, 103, syn=SEQ),                        # duplicate
        resp(1, 104, syn=A),                          # everything
        resp(1, 104, syn=SEQ),                        # stale
        resp(1, 104, syn=A),                          # stale
    ]]
    _expect(_outcomes(16, steps), [
        (17, 101, A, "unknown_qp"), (1 | 1 << 23, 101, A, "unknown_qp"),
        (2, 7, A, "not_rc"), (3, 9, A, "qp_state"), (5, 0, A, "qp_state"),
        (1, 101, A, "wrong_peer"), (1, 101, A, "wrong_peer"),
        (1, 101, 0x40, "bad_aeth"), (1, 101, 0x5F, "bad_aeth"),
        (1, 105, A, "psn_ahead"), (1, 100 + HALF, A, "psn_ahead"),
        (1, 99, A, "stale"), (1, (99 - HALF + 10) & MASK, A, "stale"),
        (1, 100, RNR, "pass"), (1, 100, RNR, "pass"),
        (1, 100, SEQ, "pass"), (1, 100, SEQ, "duplicate_nak"),
        (1, 100, 0x00, "pass"), (1, 100, A, "stale"),
        (1, 101, SEQ, "pass"), (1, 101, SEQ, "duplicate_nak"),
        (1, 103, SEQ, "pass"), (1, 102, SEQ, "stale"), (1, 103, SEQ, "duplicate_nak"),
        (1, 104, A, "pass"), (1, 104, SEQ, "stale"), (1, 104, A, "stale"),
    ])


def test_order_of_checks():
    """A response failing several checks is counted under the first."""
    bad = (peer(2)[0] ^ 4, peer(2)[1])
    steps = _setup() + [{"pair": [r]} for r in [
        resp(2 | 1 << 4, 7, syn=0x40, mac_ip=bad),    # unknown before all
        resp(2, 7, syn=0x40, mac_ip=bad),             # UC before not RTS... (QP 2 is in RTS)
        resp(3, 9, syn=0x40, mac_ip=bad),             # not RTS before the peer
        resp(1, 200, syn=0x40, mac_ip=bad),           # the peer before the AETH
        resp(1, 200, syn=0x40),                       # the AETH before the PSN
        resp(1, 200, syn=SEQ),                        # ahead
    ]] + [{"commit": commit(2, state=QpState.ERR, uc=1)}, {"pair": [resp(2, 7)]}]
    _expect(_outcomes(16, steps), [
        (18, 7, 0x40, "unknown_qp"), (2, 7, 0x40, "not_rc"), (3, 9, 0x40, "qp_state"),
        (1, 200, 0x40, "wrong_peer"), (1, 200, 0x40, "bad_aeth"), (1, 200, SEQ, "psn_ahead"),
        (2, 7, A, "not_rc"),
    ])


def test_qp_state_failures():
    """Not RTS: a fatal NAK, the tracker's ``failed`` strobe (from the cycle the pair is
    taken on), a commit of the QP in the decision cycle; a create clears each, a modify
    back to RTS does not clear a failure. (A pair is decided in the cycle after it is
    taken: the idle cycles keep the commits out of the decision cycles but where meant.)"""
    steps = _setup() + [
        {"pair": [resp(1, 101, syn=INV)]},            # fatal: acknowledges 100, fails QP 1
        {"pair": [resp(1, 102)]}, {},                 # back to back: decided on the failure
        {"commit": commit(1)},                        # modify to RTS: still failed
        {"pair": [resp(1, 102)]}, {},
        {"commit": commit(1, create=True, start_psn=300)}, {"note": (1, 300)}, {},
        {"pair": [resp(1, 300)]},                     # a fresh QP
        {"failed": 4},                                # the tracker fails QP 4
        {"pair": [resp(4, 500)]}, {},
        {"commit": commit(4)}, {},
        {"pair": [resp(4, 500)]}, {},                 # modify: still failed
        {"commit": commit(4, create=True, start_psn=500)}, {"note": (4, 500)}, {"note": (4, 501)}, {},
        {"pair": [resp(4, 500)]},                     # created again: takes responses
        {"pair": [resp(4, 501)]},
        {"failed": 4},                                # in 501's decision cycle: too late for it
        {"pair": [resp(4, 501)]}, {},
        {"commit": commit(4, create=True, start_psn=500)}, {"note": (4, 500)}, {},
        {"pair": [resp(4, 500)], "failed": 4},        # in the cycle the pair is taken: in time
        {"note": (1, 301)}, {},
        {"pair": [resp(1, 301)]},
        {"commit": commit(1)},                        # a commit in the decision cycle: dropped
        {"pair": [resp(1, 301)], "commit": commit(1)},    # taken in a commit's cycle: reads it
        {"note": (1, 302)}, {},
        {"pair": [resp(1, 302)]},
        {"commit": commit(2)},                        # another QP's commit: no effect
        {"note": (1, 303)}, {},
        {"pair": [resp(1, 303, syn=SEQ), resp(1, 303)]},
        {"commit": commit(1, create=True, start_psn=300)},   # both lanes
    ]
    _expect(_outcomes(16, steps), [
        (1, 101, INV, "pass"), (1, 102, A, "qp_state"), (1, 102, A, "qp_state"), (1, 300, A, "pass"),
        (4, 500, A, "qp_state"), (4, 500, A, "qp_state"), (4, 500, A, "pass"), (4, 501, A, "pass"),
        (4, 501, A, "qp_state"), (4, 500, A, "qp_state"),
        (1, 301, A, "qp_state"), (1, 301, A, "pass"), (1, 302, A, "pass"),
        (1, 303, SEQ, "qp_state"), (1, 303, A, "qp_state"),
    ])


def test_pairs_of_one_qp():
    """Two responses of one QP in a pair: lane 1 decides on lane 0's result, and the pair
    after it (back to back) on both; the records passed on packed to the front."""
    steps = _setup() + [
        {"pair": [resp(1, 101), resp(1, 101)]},                  # the second is stale
        {"pair": [resp(1, 101), resp(1, 102)]},                  # back to back: stale, pass
        {"pair": [resp(1, 103, syn=SEQ), resp(1, 103, syn=SEQ)]},   # duplicate
        {"pair": [resp(1, 103, syn=SEQ), resp(4, 501)]},         # duplicate (back to back), pass
        {"pair": [resp(1, 103, syn=INV), resp(1, 104)]},         # fatal: fails the QP for lane 1
        {},
        {"pair": [resp(1, 104)]}, {},
        {"commit": commit(1, create=True, start_psn=100)},
        *({"note": (1, p)} for p in range(100, 105)), {},
        {"pair": [resp(1, 99), resp(1, 100)]},                   # stale, pass: packed to the front
        {"pair": [resp(1, 102, syn=SEQ), resp(1, 105)]},         # pass, ahead
        {"pair": [resp(1, 102, syn=SEQ), resp(1, 102, syn=SEQ)]},   # a pair of duplicates
        {"pair": [resp(1, 102, syn=SEQ), resp(1, 103)]},         # duplicate, pass
        {"pair": [resp(1, 104), resp(1, 104, syn=SEQ)]},         # pass, stale
        {"pair": [resp(1, 104)]},                                # stale
    ]
    _expect(_outcomes(16, steps), [
        (1, 101, A, "pass"), (1, 101, A, "stale"),
        (1, 101, A, "stale"), (1, 102, A, "pass"),
        (1, 103, SEQ, "pass"), (1, 103, SEQ, "duplicate_nak"),
        (1, 103, SEQ, "duplicate_nak"), (4, 501, A, "pass"),
        (1, 103, INV, "pass"), (1, 104, A, "qp_state"),
        (1, 104, A, "qp_state"),
        (1, 99, A, "stale"), (1, 100, A, "pass"),
        (1, 102, SEQ, "pass"), (1, 105, A, "psn_ahead"),
        (1, 102, SEQ, "duplicate_nak"), (1, 102, SEQ, "duplicate_nak"),
        (1, 102, SEQ, "duplicate_nak"), (1, 103, A, "pass"),
        (1, 104, A, "pass"), (1, 104, SEQ, "stale"),
        (1, 104, A, "stale"),
    ])


def test_packet_notes():
    """The highest PSN sent: raised by each newer note, not lowered by a resend's older
    one (nor by one more than 2^23 ahead); a note counts for the pairs taken from the
    cycle after it on; a create replaces the note of the cycle before it."""
    steps = [{"commit": commit(1, create=True, start_psn=100)}, {},
             {"pair": [resp(1, 100)]},                     # nothing sent: ahead
             {"note": (1, 100)},
             {"pair": [resp(1, 100)], "note": (1, 101)},   # the note of the cycle before counts
             {"pair": [resp(1, 102)], "note": (1, 102)},   # the note of this cycle not yet
             {"pair": [resp(1, 101)], "note": (1, 100)},   # a resend of 100 ...
             {"pair": [resp(1, 102)], "note": (1, 103)},   # ... does not lower it
             {"note": (1, 104)}, {"note": (1, 99)}, {"note": (1, 50)}, {"note": (1, 103)}, {},
             {"pair": [resp(1, 104)]},
             {"pair": [resp(1, 105)]},
             {"note": (1, 104 + HALF + 1)}, {},            # 2^23 - 1 behind: older
             {"pair": [resp(1, 105)]},
             {"note": (1, 104 + HALF - 1)}, {},            # 2^23 - 1 ahead: newer
             {"pair": [resp(1, 104 + HALF - 1), resp(1, 104 + HALF)]},
             {"note": (1, 5000)},
             {"commit": commit(1, create=True, start_psn=7)},
             {},
             {"pair": [resp(1, 6, syn=RNR), resp(1, 7, syn=RNR)]},
             ]
    _expect(_outcomes(16, steps), [
        (1, 100, A, "psn_ahead"), (1, 100, A, "pass"), (1, 102, A, "psn_ahead"), (1, 101, A, "pass"),
        (1, 102, A, "pass"), (1, 104, A, "pass"), (1, 105, A, "psn_ahead"), (1, 105, A, "psn_ahead"),
        (1, 104 + HALF - 1, A, "pass"), (1, 104 + HALF, A, "psn_ahead"),
        (1, 6, RNR, "stale"), (1, 7, RNR, "psn_ahead"),
    ])


def test_failed_strobe_during_create():
    """A ``failed`` strobe for one QP in the cycle another QP is created still fails it."""
    steps = _setup() + [
        {"failed": 4, "commit": commit(1, create=True, start_psn=100)},
        {"pair": [resp(4, 500)]},
    ]
    _expect(_outcomes(16, steps), [(4, 500, A, "qp_state")])


def test_psn_window_across_wrap():
    """A QP created just before 2^24: its PSN window runs across the wrap."""
    start = MASK - 3
    steps = [{"commit": commit(6, create=True, start_psn=start)}]
    steps += [{"note": (6, p & MASK)} for p in range(start, start + 8)]     # MASK-3 .. 3
    steps += [{"note": (6, MASK - 1)}, {"note": (6, 0)}, {}]                # resends: no lower
    steps += [{"pair": [r]} for r in [
        resp(6, 4), resp(6, 3 + HALF), resp(6, MASK - 4), resp(6, 4 - HALF),
        resp(6, MASK - 1), resp(6, MASK - 2), resp(6, MASK),
        resp(6, 1, syn=SEQ), resp(6, 1, syn=SEQ), resp(6, 0, syn=SEQ),
        resp(6, 3), resp(6, 2), resp(6, MASK)]]
    _expect(_outcomes(16, steps), [
        (6, 4, A, "psn_ahead"), (6, 3 + HALF, A, "psn_ahead"), (6, MASK - 4, A, "stale"),
        (6, (4 - HALF) & MASK, A, "stale"),
        (6, MASK - 1, A, "pass"), (6, MASK - 2, A, "stale"), (6, MASK, A, "pass"),
        (6, 1, SEQ, "pass"), (6, 1, SEQ, "duplicate_nak"), (6, 0, SEQ, "stale"),
        (6, 3, A, "pass"), (6, 2, A, "stale"), (6, MASK, A, "stale"),
    ])
    # random traffic of one QP across the wrap
    rnd = random.Random(7)
    tr = Traffic(rnd, 16, [6])
    tr.init = [commit(6, create=True, start_psn=MASK - 60, mac_ip=tr._peer(6))]
    tr._start = lambda: MASK - rnd.randrange(80)
    seen = []

    def events(t, ref):
        seen.append(ref.dyn.get(6, Dyn()).acked)
        return tr.events(t, ref)
    outcomes = _run(16, events, 800)
    assert sum(x == "pass" for _, _, x in outcomes) > 100
    assert any(a > MASK - 100 for a in seen) and any(a < 100 for a in seen), "the window crossed the wrap"
