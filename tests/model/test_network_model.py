"""Unit tests of the network model (model/network.py): links, faults, back-to-back, switch.

No simulator. Expected cycles are worked out by hand from SPEC section 6 (100 wire
bytes a cycle, a frame of L bytes costs L + 24); fault counts are held to binomial
bounds and to the link's own log; frames are realistic RoCEv2 WRITEs from the golden
model.
"""

import functools
import math
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from model.frames import Port, QpContext, build_write_frames
from model.icrc import icrc, ipv4_checksum
from model.network import (FAULT_KINDS, BackToBack, Delivery, FaultSpec, Link, Network, Switch,
                           corruption_check, cycle_of_bytes, flip_bit)

MACS = [0x02_00_00_00_00_10 + i for i in range(4)]
IPS = [f"10.0.0.{i + 1}" for i in range(4)]


@functools.lru_cache(maxsize=None)
def _frames(src, dst, sizes, psn, mtu):
    qp = QpContext(qpn=0x100 + src, remote_qpn=0x200 + dst, dmac=MACS[dst], dip=IPS[dst], mtu=mtu)
    port = Port(smac=MACS[src], sip=IPS[src])
    out = []
    for n, size in enumerate(sizes):
        payload = bytes((n + i) & 0xFF for i in range(size))
        msg = build_write_frames(qp, port, 0x10000 + 0x1000 * n, 0x1234, payload, psn + len(out))
        out += msg
    return tuple(out)


def frames_between(src, dst, sizes, psn=0, mtu=4096):
    """RDMA WRITE frames from endpoint ``src`` to ``dst``, one message per size."""
    return list(_frames(src, dst, tuple(sizes), psn, mtu))


# a pool of distinct frames: WRITE ONLY of several sizes and FIRST/MIDDLE/LAST at MTU 1024
POOL = frames_between(0, 1, [8, 24, 64, 150, 256, 1000, 4096]) + frames_between(0, 1, [3000], psn=50, mtu=1024)
SMALL = frames_between(0, 1, [8])[0]        # 82 bytes: 106 wire bytes
BIG = frames_between(0, 1, [4096])[0]       # 4170 bytes: 4194 wire bytes


def wb(frame):
    return len(frame) + 24


def test_frame_sizes_from_spec():
    assert len(SMALL) == 74 + 8 and len(BIG) == 74 + 4096
    assert cycle_of_bytes(0) == 0 and cycle_of_bytes(1) == 1 and cycle_of_bytes(100) == 1 and cycle_of_bytes(101) == 2


# ---- FaultSpec -------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    (dict(drop=-0.1), "drop must be a rate"),
    (dict(corrupt=1.5), "corrupt must be a rate"),
    (dict(reorder=float("nan")), "reorder must be a rate"),
    (dict(duplicate="0.1"), "duplicate must be a rate"),
    (dict(delay=True), "delay must be a rate"),
    (dict(drop=0.6, corrupt=0.5), "add up to"),
    (dict(delay_cycles=-1), "delay_cycles must be >= 0"),
    (dict(delay_cycles=1.5), "delay_cycles must be an int"),
    (dict(reorder_depth=0), "reorder_depth must be >= 1"),
    (dict(reorder_timeout_cycles=-5), "reorder_timeout_cycles must be >= 0"),
    (dict(drop=0.1, pattern=[(1, "drop")]), "either rates or a pattern"),
    (dict(pattern=[(1, "lose")]), "unknown fault kind"),
    (dict(pattern=[(1, "drop"), (1, "delay")]), "more than one fault"),
    (dict(pattern=[(-1, "drop")]), "frame index must be >= 0"),
    (dict(pattern=[(1,)]), "is not"),
    (dict(pattern="drop"), "iterable"),
    (dict(pattern=[(1, "corrupt", 8 * 14 - 1)]), "corrupt bit must be >= 112"),
    (dict(pattern=[(1, "drop", 3)]), "takes no argument"),
    (dict(pattern=[(1, "reorder", 0)]), "reorder depth must be >= 1"),
])
def test_faultspec_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FaultSpec(**kwargs)


def test_faultspec_accepts():
    assert FaultSpec().lossless and FaultSpec(pattern=[]).lossless
    s = FaultSpec(drop=0.2, corrupt=0.2, reorder=0.2, duplicate=0.2, delay=0.2)
    assert s.rates == dict.fromkeys(FAULT_KINDS, 0.2) and not s.lossless
    p = FaultSpec(pattern=[(9, "delay", 7), (2, "corrupt"), [5, "reorder", 1]])
    assert p.pattern == ((2, "corrupt", None), (5, "reorder", 1), (9, "delay", 7))


# ---- one link, no faults -------------------------------------------------------------
def test_lossless_link_timing_by_hand():
    link = Link(latency_cycles=7)
    assert link.send(SMALL, 10) == 0     # ends at byte 1000 -> in at cycle 10 + 7
    assert link.send(BIG, 10) == 1       # handed over in the same cycle: ends 1000 + 4194 = 5194
    assert link.send(SMALL, 20) == 2     # wire busy until 5194: ends 5194 + 106 = 5300
    assert link.deliver(16) == []
    got = link.deliver(17)
    assert [(d.index, d.cycle, d.end_bytes) for d in got] == [(0, 17, 1700)]
    assert link.next_event_cycle() == 52 + 7
    with pytest.raises(ValueError, match="before the link's current cycle 20"):
        link.send(SMALL, 16)                 # a cycle-stepped model: time only moves on
    assert link.send(SMALL, 100) == 3    # wire idle again: ends 10000
    got = link.deliver(200)
    assert [(d.index, d.cycle, d.end_bytes) for d in got] == [(1, 59, 5894), (2, 60, 6000), (3, 107, 10700)]
    assert [d.frame for d in got] == [BIG, SMALL, SMALL]
    assert not any(d.copy or d.fault for d in got)
    assert link.counters == dict(sent=4, delivered=4, dropped=0, corrupted=0, reordered=0,
                                 duplicated=0, delayed=0)
    assert link.log == [] and link.idle and link.next_event_cycle() is None


def test_link_exact_wire_end_and_rate_limit():
    # A sender pacing at exactly 400G (end_bytes from its wire model) is never pushed back.
    link = Link(latency_cycles=3)
    end = 0
    for k in range(50):
        end += wb(SMALL)
        link.send(SMALL, cycle_of_bytes(end), end_bytes=end)
    got = link.deliver(10_000)
    assert [d.end_bytes for d in got] == [106 * (k + 1) + 300 for k in range(50)]
    assert [d.cycle for d in got] == [math.ceil(106 * (k + 1) / 100) + 3 for k in range(50)]
    # A sender handing over 1000 frames at once is held to the wire rate.
    link = Link(latency_cycles=0)
    frames = [POOL[i % len(POOL)] for i in range(1000)]
    for f in frames:
        link.send(f, 0)
    got = link.deliver(10**6)
    ends = [d.end_bytes for d in got]
    assert all(b - a == wb(f) for a, b, f in zip(ends, ends[1:], frames[1:]))
    assert got[-1].cycle == math.ceil(sum(wb(f) for f in frames[1:]) / 100)


@pytest.mark.parametrize("call, match", [
    (lambda link: link.send(SMALL, 4), "before the link's current cycle 5"),
    (lambda link: (link.deliver(7), link.deliver(6)), "before the link's last polled cycle 7"),
    (lambda link: link.send(SMALL, 6, end_bytes=601), "has not left the sender"),
    (lambda link: link.send(SMALL[:14], 6), "nothing after"),
    (lambda link: link.send("abc", 6), "must be bytes"),
    (lambda link: link.send(SMALL, -1), "must be >= 0"),
])
def test_link_rejects(call, match):
    link = Link(1)
    link.send(SMALL, 5)
    with pytest.raises(ValueError, match=match):
        call(link)


def test_link_constructor_rejects():
    with pytest.raises(ValueError, match="latency_cycles must be >= 0"):
        Link(-1)
    with pytest.raises(ValueError, match="faults must be a FaultSpec"):
        Link(1, faults={"drop": 0.1})
    with pytest.raises(ValueError, match="seed must be"):
        Link(1, seed=None)


# ---- faults at a rate ------------------------------------------------------------------
def run_link(spec, n, seed=1, latency=5, load=0.5):
    """Send ``n`` pool frames offering ``load`` x 400G; return (link, sent frames, deliveries)."""
    link = Link(latency, spec, seed)
    sent = []
    t = 0
    for i in range(n):
        f = POOL[i % len(POOL)]
        t += int(wb(f) / load)
        assert link.send(f, cycle_of_bytes(t)) == i
        sent.append(f)
    got = link.deliver(link.now + sum(wb(f) for f in sent) // 100 + 10_000)
    assert link.idle
    return link, sent, got


def check_consistency(link, sent, got):
    """Counters equal the log, and every delivered frame is explained by the log."""
    spec = link.faults
    c = link.counters
    by_kind = {k: [e for e in link.log if e.kind == k] for k in FAULT_KINDS}
    for kind, counter in zip(FAULT_KINDS, ("dropped", "corrupted", "reordered", "duplicated", "delayed")):
        assert c[counter] == len(by_kind[kind])
    assert len({e.index for e in link.log}) == len(link.log)            # one fault per frame
    assert c["sent"] == len(sent)
    assert c["delivered"] == len(got) == len(sent) - c["dropped"] + c["duplicated"]
    counts = Counter(d.index for d in got)
    dropped = {e.index for e in by_kind["drop"]}
    duplicated = {e.index for e in by_kind["duplicate"]}
    assert counts == Counter({i: 2 if i in duplicated else 1 for i in range(len(sent)) if i not in dropped})
    corrupted = {e.index: e.detail for e in by_kind["corrupt"]}
    for d in got:
        if d.index in corrupted:
            assert d.frame == flip_bit(sent[d.index], corrupted[d.index])
        else:
            assert d.frame == sent[d.index]
    # arrivals are serialised: each ends at least its wire bytes after the previous one
    assert all(b.end_bytes - a.end_bytes >= wb(b.frame) for a, b in zip(got, got[1:]))
    pos = {}
    for k, d in enumerate(got):
        pos.setdefault(d.index, []).append(k)
    held = {e.index for e in by_kind["reorder"] + by_kind["delay"]}
    for e in by_kind["reorder"]:
        # the next `depth` frames that were not held themselves went ahead of it
        for j in range(e.index + 1, min(e.index + e.detail + 1, len(sent))):
            if j in pos and j not in held:
                assert pos[j][0] < pos[e.index][0], (e, j)
    for e in by_kind["delay"]:
        d = got[pos[e.index][0]]
        assert d.cycle >= e.cycle + e.detail + link.latency_cycles and d.fault == "delay"
    for i in duplicated:
        a, b = (got[k] for k in pos[i])
        assert not a.copy and b.copy and b.end_bytes == a.end_bytes + wb(a.frame)
    return by_kind


@pytest.mark.parametrize("rate", [0.001, 0.01, 0.05])
@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_fault_rate_within_bounds(kind, rate):
    n = max(10_000, int(50 / rate))
    link, sent, got = run_link(FaultSpec(**{kind: rate}, delay_cycles=40), n, seed=f"{kind}-{rate}")
    by_kind = check_consistency(link, sent, got)
    k = len(by_kind[kind])
    mean, sd = n * rate, math.sqrt(n * rate * (1 - rate))
    assert abs(k - mean) <= 5 * sd, f"{kind} at {rate}: {k} faults in {n} frames, expected {mean:.0f} +- {5 * sd:.0f}"
    assert all(len(v) == 0 for kind2, v in by_kind.items() if kind2 != kind)


def test_all_faults_at_once():
    spec = FaultSpec(drop=0.02, corrupt=0.02, reorder=0.02, duplicate=0.02, delay=0.02,
                     delay_cycles=300, reorder_depth=5)
    link, sent, got = run_link(spec, 20_000, seed=99, load=1.5)     # over-driven: the wire paces
    by_kind = check_consistency(link, sent, got)
    for kind in FAULT_KINDS:
        assert abs(len(by_kind[kind]) - 400) <= 5 * math.sqrt(400 * 0.98), kind
    # reordering and delay permute the frames; the multiset is kept
    delivered = Counter(d.frame for d in got if d.fault != "corrupt")
    lost = {e.index for e in by_kind["drop"] + by_kind["corrupt"]}
    expected = Counter(sent[i] for i in range(len(sent)) if i not in lost)
    expected.update(sent[e.index] for e in by_kind["duplicate"])
    assert delivered == expected
    assert [d.index for d in got] != sorted(d.index for d in got)


# ---- each fault kind, explicit -----------------------------------------------------------
def test_drop_never_arrives_and_keeps_others_timing():
    _, _, ref = run_link(None, 40)
    link, sent, got = run_link(FaultSpec(pattern=[(2, "drop"), (5, "drop"), (39, "drop")]), 40)
    check_consistency(link, sent, got)
    assert [d.index for d in got] == [i for i in range(40) if i not in (2, 5, 39)]
    assert got == [d for d in ref if d.index not in (2, 5, 39)]     # same bytes, same cycles
    assert link.counters["dropped"] == 3 and link.fault_pattern() == [(2, "drop"), (5, "drop"), (39, "drop")]
    # a frame lost on the cable still took its wire time: a burst behind it is not sped up
    link = Link(0, FaultSpec(pattern=[(1, "drop")]))
    for f in (SMALL, BIG, SMALL):
        link.send(f, 10)
    assert [(d.index, d.end_bytes) for d in link.deliver(100)] == [(0, 1000), (2, 1000 + 4194 + 106)]


def test_duplicate_arrives_twice_right_behind():
    link = Link(latency_cycles=4, faults=FaultSpec(pattern=[(1, "duplicate")]))
    link.send(SMALL, 10)
    link.send(BIG, 10)      # ends 1000 + 4194 = 5194, its copy 5194 + 4194 = 9388
    link.send(SMALL, 11)    # behind the copy: 9388 + 106 = 9494
    got = link.deliver(1000)
    assert [(d.index, d.copy, d.fault, d.end_bytes, d.cycle) for d in got] == [
        (0, False, None, 1400, 14), (1, False, "duplicate", 5594, 56), (1, True, "duplicate", 9788, 98),
        (2, False, None, 9894, 99)]
    assert got[1].frame == got[2].frame == BIG
    assert link.counters["duplicated"] == 1 and link.counters["delivered"] == 4


def test_corrupt_flips_exactly_one_bit_after_ethernet_header():
    link, sent, got = run_link(FaultSpec(corrupt=1.0), 600, seed=5)
    assert link.counters["corrupted"] == 600 and len(got) == 600
    bits = []
    for d, e in zip(got, link.log):
        orig = sent[d.index]
        diff = int.from_bytes(orig, "big") ^ int.from_bytes(d.frame, "big")
        assert diff and diff & (diff - 1) == 0                      # exactly one bit
        bit = 8 * len(orig) - diff.bit_length()                      # big-endian bit number
        assert bit == e.detail and bit >= 8 * 14 and d.frame[:14] == orig[:14]
        # the receiver can tell: the IPv4 checksum or the ICRC no longer matches
        ip_bad = ipv4_checksum(d.frame[14:34]) != int.from_bytes(d.frame[24:26], "big")
        icrc_bad = icrc(d.frame[:-4]) != d.frame[-4:]
        assert corruption_check(bit) in ("ipv4", "icrc")
        assert ip_bad if corruption_check(bit) == "ipv4" else icrc_bad, (bit, len(orig))
        bits.append(bit)
    assert len(set(bits)) > 400                                     # spread over the frames
    assert min(bits) < 8 * 34 and max(bits) > 8 * 1000              # headers and payloads hit


def test_corrupt_explicit_bit():
    bit = 8 * 60 + 3
    link = Link(0, FaultSpec(pattern=[(0, "corrupt", bit)]))
    link.send(SMALL, 0)
    (d,) = link.deliver(10)
    assert d.frame[60] == SMALL[60] ^ 0x10 and d.frame[:60] == SMALL[:60] and d.frame[61:] == SMALL[61:]
    assert link.log[0].detail == bit and d.fault == "corrupt"
    link = Link(0, FaultSpec(pattern=[(0, "corrupt", 8 * len(SMALL))]))
    with pytest.raises(ValueError, match="outside a frame"):
        link.send(SMALL, 0)


def test_reorder_holds_frame_behind_depth_frames():
    link = Link(2, FaultSpec(pattern=[(3, "reorder", 2), (8, "reorder")], reorder_depth=3,
                             reorder_timeout_cycles=50))
    for i in range(10):
        link.send(SMALL, 5 * i)            # frame i ends at 500 i
    got = link.deliver(1000)
    # 3 waits for 4 and 5 and goes right behind 5 (sent at cycle 25): ends 2500 + 106.
    # 8 waits for 3 frames, only 9 follows: let go at 40 + 50 = cycle 90.
    assert [d.index for d in got] == [0, 1, 2, 4, 5, 3, 6, 7, 9, 8]
    at = {d.index: d for d in got}
    assert at[3].end_bytes == 2500 + 106 + 200 and at[3].cycle == 27 + 2 and at[3].fault == "reorder"
    assert at[8].end_bytes == 9000 + 200 and at[8].cycle == 92
    assert at[6].cycle == 32 and at[9].cycle == 47                   # the others are untouched
    assert Counter(d.frame for d in got) == Counter([SMALL] * 10)
    assert [(e.index, e.kind, e.detail) for e in link.log] == [(3, "reorder", 2), (8, "reorder", 3)]


def test_delay_holds_one_frame_and_lets_others_pass():
    link = Link(1, FaultSpec(pattern=[(1, "delay"), (4, "delay", 0)], delay_cycles=12))
    for i in range(6):
        link.send(SMALL, 5 * i)
    got = link.deliver(100)
    # 1 (sent at 5) is put on the wire at cycle 17, after 2 (cycle 10) and 3 (cycle 15)
    assert [(d.index, d.cycle) for d in got] == [(0, 1), (2, 11), (3, 16), (1, 18), (4, 21), (5, 26)]
    assert link.counters["delayed"] == 2
    # held frames due together leave in the order they were held; else by due cycle
    link = Link(0, FaultSpec(pattern=[(0, "delay", 20), (1, "delay", 19), (2, "delay", 40), (3, "delay", 5)]))
    for i, f in enumerate((SMALL, BIG, SMALL, BIG)):
        link.send(f, i)
    got = link.deliver(1000)
    assert [(d.index, d.end_bytes) for d in got] == [(3, 800), (0, 2000), (1, 2000 + 4194), (2, 6194 + 106)]


def test_explicit_pattern_applied_exactly():
    rng = random.Random(3)
    idx = rng.sample(range(2000), 120)
    pattern = [(i, FAULT_KINDS[k % 5]) for k, i in enumerate(idx)]
    link, sent, got = run_link(FaultSpec(pattern=pattern, delay_cycles=25), 2000, load=0.3)
    assert link.fault_pattern() == sorted(pattern)
    check_consistency(link, sent, got)
    for kind in FAULT_KINDS:
        assert link.counters[{"drop": "dropped", "corrupt": "corrupted", "reorder": "reordered",
                              "duplicate": "duplicated", "delay": "delayed"}[kind]] == 24
    # the pattern does not depend on the seed
    link2, _, got2 = run_link(FaultSpec(pattern=pattern, delay_cycles=25), 2000, load=0.3, seed=12345)
    assert link2.fault_pattern() == link.fault_pattern()
    assert [(d.index, d.cycle) for d in got2] == [(d.index, d.cycle) for d in got]


def test_determinism_of_a_seed():
    spec = FaultSpec(drop=0.03, corrupt=0.03, reorder=0.03, duplicate=0.03, delay=0.03)
    a = run_link(spec, 3000, seed=7)
    b = run_link(spec, 3000, seed=7)
    c = run_link(spec, 3000, seed=8)
    assert a[0].log == b[0].log and a[2] == b[2]
    assert a[0].log != c[0].log
    # which frames are hit depends on the seed and the count only, not on the frames
    link = Link(5, spec, 7)
    for i in range(3000):
        link.send(SMALL, 2 * i)
    assert [(e.index, e.kind) for e in link.log] == a[0].fault_pattern()


# ---- back to back --------------------------------------------------------------------------
def test_back_to_back():
    net = BackToBack(latency_cycles=6, faults={("tx", 1): FaultSpec(pattern=[(0, "drop"), (2, "duplicate")])},
                     seed=4)
    assert net.tx_links[0] is net.rx_links[1] and net.tx_links[1].name == "1->0"
    ab = frames_between(0, 1, [8, 100, 4096])
    ba = frames_between(1, 0, [8, 8, 8, 8])
    for i, f in enumerate(ab):
        net.send(0, f, 20 + i)
    for i, f in enumerate(ba):
        net.send(1, f, 20 + 2 * i)
    assert net.receive(1, 25) == []
    got1 = net.receive(1, 26)
    assert [(d.cycle, d.end_bytes) for d in got1] == [(26, 2600)]
    got1 += net.receive(1, 200)
    # 100-byte payload: 174 bytes, ends 2100 -> max(2100, 2000 + 198) = 2198; 4096: 2198 + 4194
    assert [(d.cycle, d.end_bytes) for d in got1] == [(26, 2600), (28, 2798), (70, 6992)]
    assert [d.frame for d in got1] == ab
    got0 = net.receive(0, 200)
    assert [(d.index, d.copy) for d in got0] == [(1, False), (2, False), (2, True), (3, False)]
    assert net.tx_links[1].counters["dropped"] == 1 and net.tx_links[0].log == []
    assert net.idle and net.fault_log() == {"0->1": [], "1->0": net.tx_links[1].log}


def test_fault_keys_rejected():
    with pytest.raises(ValueError, match="same link"):
        BackToBack(faults={("tx", 0): FaultSpec(), ("rx", 1): FaultSpec()})
    with pytest.raises(ValueError, match="no link"):
        BackToBack(faults={("tx", 2): FaultSpec()})
    with pytest.raises(ValueError, match="must be a FaultSpec"):
        Network(MACS, faults={("rx", 0): 0.1})
    with pytest.raises(ValueError, match="port must be"):
        Network(MACS).send(4, SMALL, 0)
    with pytest.raises(ValueError, match="on port 5"):
        Switch({MACS[0]: 5}, num_ports=4)
    with pytest.raises(ValueError, match="appears twice"):
        Switch({MACS[0]: 0, "02:00:00:00:00:10": 1})
    with pytest.raises(ValueError, match="same MAC"):
        Network([MACS[0], MACS[0]])


# ---- switch -----------------------------------------------------------------------------
def test_switch_single_frame_and_contention_by_hand():
    net = Network(MACS, latency_cycles=20, link_latency_cycles=5, queue_bytes=1 << 20)
    f = frames_between(0, 1, [8])[0]
    net.send(0, f, 10)
    # in at 15, queued at 35, on the wire 3500..3606, sent at cycle 37, in at 42
    got = net.receive(1, 100)
    assert [(d.cycle, d.end_bytes, d.frame) for d in got] == [(42, 4106, f)]
    assert net.port_counters[1]["tx_frames"] == 1 and net.port_counters[0]["rx_frames"] == 1
    # three ports send a 4 KiB frame to port 3 in the same cycle: they leave one after another
    big = [frames_between(p, 3, [4096])[0] for p in range(3)]
    for p in range(3):
        net.send(p, big[p], 200)
    got = net.receive(3, 1000)
    start = 100 * (200 + 5 + 20)
    assert [d.end_bytes for d in got] == [start + 4194 * k + 500 for k in (1, 2, 3)]
    assert [d.frame for d in got] == big                               # ingress-port order
    assert net.port_counters[3]["max_queue_bytes"] == 3 * 4170


def test_switch_tail_drop_by_hand():
    net = Network(MACS, latency_cycles=0, link_latency_cycles=0, queue_bytes=2 * 4170)
    big = [frames_between(p, 3, [4096])[0] for p in range(3)]
    for p in range(3):
        net.send(p, big[p], 100)
    # the third does not fit behind two 4170-byte frames
    net.send(2, big[2], 100 + 42)      # ends 14200, queued at 142: the first left at 10000 + 4194
    got = net.receive(3, 1000)
    assert [d.frame for d in got] == [big[0], big[1], big[2]]
    assert [d.end_bytes for d in got] == [14194, 18388, 22582]
    assert net.port_counters[3]["tail_drops"] == 1 and net.port_counters[3]["forwarded"] == 3
    (drop,) = net.drops
    assert (drop.cycle, drop.in_port, drop.out_port, drop.reason, drop.frame) == (100, 2, 3, "tail_drop", big[2])


def test_switch_all_to_all_four_ports():
    net = Network(MACS, latency_cycles=50, link_latency_cycles=8, seed=3)
    sent = {}                        # (src, dst) -> frames in send order
    ends = [0] * 4
    for rnd in range(30):
        for src in range(4):
            for dst in range(4):
                if dst == src:
                    continue
                f = frames_between(src, dst, [8 + 97 * ((rnd + dst) % 11)], psn=rnd)[0]
                ends[src] += wb(f)                                 # each port sends at 400G
                net.send(src, f, cycle_of_bytes(ends[src]), end_bytes=ends[src])
                sent.setdefault((src, dst), []).append(f)
    net.drain()
    assert net.idle
    for dst in range(4):
        got = net.receive(dst)
        for src in range(4):
            if src != dst:
                mine = [d.frame for d in got if d.frame[6:12] == MACS[src].to_bytes(6, "big")]
                assert mine == sent[(src, dst)]                     # routed, once, in order
        assert all(d.frame[:6] == MACS[dst].to_bytes(6, "big") for d in got)
        assert all(b.end_bytes - a.end_bytes >= wb(b.frame) for a, b in zip(got, got[1:]))
        assert len(got) == 90 and net.port_counters[dst]["tx_frames"] == 90
        # the output is fed at 3 x 1/3 of the line rate: some frames queue behind others
        assert any(b.end_bytes - a.end_bytes == wb(b.frame) for a, b in zip(got, got[1:]))
    assert net.counters["tail_drops"] == 0 and net.counters["unrouted"] == 0


def test_switch_oversubscribed_output_tail_drops():
    depth = 32 * 1024
    lat, fwd = 4, 10
    net = Network(MACS, latency_cycles=fwd, link_latency_cycles=lat, queue_bytes=depth)
    ready = {}                       # frame -> cycle it reaches the output queue
    ends = [0] * 3
    n = 0
    for rnd in range(200):
        for src in range(3):
            f = frames_between(src, 3, [200 + 300 * ((rnd * 3 + src) % 7)], psn=rnd)[0]
            ends[src] += wb(f)
            net.send(src, f, cycle_of_bytes(ends[src]), end_bytes=ends[src])
            ready[f] = cycle_of_bytes(ends[src]) + lat + fwd
            n += 1
    net.drain()
    got = net.receive(3)
    c = net.port_counters[3]
    assert c["tail_drops"] > n // 2 and c["forwarded"] == len(got) == n - c["tail_drops"]
    assert c["max_queue_bytes"] <= depth and len(net.drops) == c["tail_drops"]
    # the output runs back to back once the queue has filled
    gaps = [b.end_bytes - a.end_bytes - wb(b.frame) for a, b in zip(got, got[1:])]
    assert all(g >= 0 for g in gaps) and gaps[5:].count(0) == len(gaps) - 5
    # every accepted frame found room and every drop found the queue full, rebuilt from
    # the output times: a frame holds its bytes from its ready cycle until its last byte
    # has left the port; frames ready in the same cycle go in ingress-port order
    src_of = {MACS[p].to_bytes(6, "big"): p for p in range(4)}
    held = [(ready[d.frame], src_of[d.frame[6:12]], d.end_bytes - 100 * lat, len(d.frame)) for d in got]
    for k, (r, _, _, ln) in enumerate(held):
        assert sum(x[3] for x in held[:k] if x[2] > 100 * r) + ln <= depth
    for d in net.drops:
        queued = sum(x[3] for x in held if (x[0], x[1]) < (d.cycle, d.in_port) and x[2] > 100 * d.cycle)
        assert queued + len(d.frame) > depth


def test_unrouted_frame_is_dropped():
    net = Switch({MACS[0]: 0, MACS[1]: 1}, latency_cycles=1, link_latency_cycles=1)
    stray = frames_between(0, 2, [8])[0]      # MACS[2] is not in the table
    net.send(0, stray, 0)
    net.drain()
    assert net.receive(1) == [] and net.port_counters[0]["unrouted"] == 1
    assert net.drops[0].reason == "unrouted" and net.drops[0].out_port is None


def network_traffic(net, step_every_cycle):
    """Fixed all-to-all traffic with faults; returns every delivery per port."""
    plan = []
    for rnd in range(40):
        for src in range(4):
            dst = 3 if rnd % 2 and src != 3 else (src + 1 + rnd % 3) % 4     # port 3 is oversubscribed
            plan.append((3 * rnd + src % 2, src, frames_between(src, dst, [8 + 61 * (rnd % 9)], psn=rnd)[0]))
    plan.sort(key=lambda x: x[0])
    out = [[] for _ in range(4)]
    horizon = plan[-1][0] + 2000
    if step_every_cycle:
        k = 0
        for cycle in range(horizon):
            while k < len(plan) and plan[k][0] == cycle:
                net.send(plan[k][1], plan[k][2], cycle)
                k += 1
            net.step(cycle)
            for p in range(4):
                out[p] += net.receive(p)
    else:
        for cycle, src, f in plan:
            net.run_until(cycle)
            net.send(src, f, cycle)
        net.run_until(horizon)
        for p in range(4):
            out[p] = net.receive(p)
    assert net.idle
    return out


def test_network_stepping_does_not_change_results():
    def make():
        spec = FaultSpec(drop=0.05, corrupt=0.05, reorder=0.05, duplicate=0.05, delay=0.05,
                         delay_cycles=30, reorder_depth=2, reorder_timeout_cycles=40)
        return Network(MACS, latency_cycles=30, link_latency_cycles=3, queue_bytes=1500,
                       faults=spec, seed="s")
    a_net, b_net = make(), make()
    a = network_traffic(a_net, step_every_cycle=True)
    b = network_traffic(b_net, step_every_cycle=False)
    assert a == b and a_net.fault_log() == b_net.fault_log()
    assert sum(len(v) for v in a_net.fault_log().values()) > 20
    assert a_net.counters == b_net.counters and a_net.counters["tail_drops"] > 0
    assert all(isinstance(d, Delivery) for port in a for d in port)


def test_network_faults_per_link_end_to_end():
    net = Network(MACS[:3], latency_cycles=10, link_latency_cycles=2, seed=11,
                  faults={("tx", 0): FaultSpec(drop=0.05), ("rx", 2): FaultSpec(duplicate=0.05)})
    names = [link.name for link in net.links]
    assert names == ["0->sw", "1->sw", "2->sw", "sw->0", "sw->1", "sw->2"]
    for i in range(2000):
        net.send(0, frames_between(0, 2, [8 + i % 50], psn=i % 64)[0], 3 * i)
        net.send(1, frames_between(1, 2, [8], psn=i % 64)[0], 3 * i)
    net.drain()
    got = net.receive(2)
    up, down = net.tx_links[0], net.rx_links[2]
    assert 50 <= up.counters["dropped"] <= 150 and 150 <= down.counters["duplicated"] <= 250
    assert net.port_counters[2]["tx_frames"] == 4000 - up.counters["dropped"]
    assert len(got) == 4000 - up.counters["dropped"] + down.counters["duplicated"]
    assert down.counters["duplicated"] == len(down.log) and up.counters["dropped"] == len(up.log)
    assert all(not link.log for link in net.links if link not in (up, down))
    assert net.counters["tail_drops"] == 0


def test_model_runs_without_cocotb():
    """model.network must import outside a simulator (plain pytest, the golden model)."""
    code = "import sys, model.network; assert 'cocotb' not in sys.modules, 'model.network imported cocotb'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
