"""Two RC endpoints of the golden model over a lossy link: ``simulate`` with an explicit fault pattern.

The link is ``model.network.Link``, the one link and fault model of the project (the
cocotb pair environments drive the same class): one ``Link`` per direction, 2 ns cycles,
100 wire bytes a cycle, serialisation by ``spec.params.wire_bytes``, the fault pattern a
``FaultSpec(pattern=...)``. This module only runs the endpoints around it (their events
in ns, the links polled at their ``next_event_cycle``); it has no timing rule of its own.

Contents:
    FAULT_KINDS                 fault kinds a pattern may name (model.network's)
    CORRUPT_BIT                 the bit a "corrupt" entry without an argument flips
    LinkRecord, SimResult
    simulate                    a requester and a responder back to back over a lossy link
"""

from collections import Counter
from dataclasses import dataclass
import heapq

from spec.formats import BTH_LEN, OFF_BTH
from spec.params import CLOCK_PERIOD_NS, wire_bytes
from model.memory import SparseMemory
from model.network import BYTES_PER_CYCLE, FAULT_KINDS, FaultSpec, Link, cycle_of_bytes
from model.requester import RcRequester
from model.responder import RcResponder

__all__ = ["CORRUPT_BIT", "FAULT_KINDS", "LinkRecord", "SimResult", "simulate"]


NS_PER_CYCLE = int(CLOCK_PERIOD_NS)               # 2: the Link's cycle (500 MHz core clock)
_BYTES_PER_NS = BYTES_PER_CYCLE // NS_PER_CYCLE   # 50 wire bytes per ns at 400 Gb/s
# The last bit of the BTH (the PSN's least significant bit): in every RoCEv2 frame, covered
# by the ICRC only, so the receiver drops a frame corrupted there as bad_icrc (a random bit,
# the Link's default, may hit the IPv4 header or a UDP field and be dropped for another reason).
CORRUPT_BIT = 8 * (OFF_BTH + BTH_LEN) - 1


@dataclass
class LinkRecord:
    """One frame put on a link.

    Members:
        direction: "req" (requester to responder) or "resp"; index: its number on that
        link (what a fault pattern names); time: when the endpoint put it on the link, the
        start of its transmission unless earlier frames still hold the wire (ns);
        arrival: when it (its first copy, for a duplicate) arrived at the far end, faults
        included (ns, an even number: the Link's arrival cycle x 2), None if it was dropped
        or had not arrived when the run stopped; frame: the bytes as sent (before a
        corruption); fault: the fault kind applied, or None.
    """
    direction: str
    index: int
    time: int
    arrival: object
    frame: bytes
    fault: object = None


@dataclass
class SimResult:
    """Outcome of ``simulate``.

    Members:
        end_time: time of the last event (ns); hung: the run hit max_events/max_time_ns or
        ended with work left; events: loop steps (a post, a poll of the links at one
        cycle, an ACK-timer firing).
        records: every LinkRecord in transmission order (both directions).
        writes: ``[(time, qpn, psn, addr, bytes)]`` performed in the responder's memory.
        faults: {"req"/"resp": Counter of the fault kinds applied (the Links' fault logs)}.
        memory: the responder's memory (SparseMemory or the object passed in).
        rx: every RxResult of the responder, in arrival order.
        links: {"req"/"resp": the model.network.Link of that direction (counters, log)}.
    """
    end_time: int
    hung: bool
    events: int
    records: list
    writes: list
    faults: dict
    memory: object
    rx: list
    links: dict = None


def _pattern(faults, name):
    """``faults`` as FaultSpec pattern entries; a "corrupt" without its bit gets CORRUPT_BIT."""
    out, seen = [], {}
    for item in faults:
        if not (isinstance(item, (tuple, list)) and len(item) in (2, 3)):
            raise ValueError(f"{name}: each fault must be (frame index, kind) or (frame index, kind, arg), "
                             f"got {item!r}")
        idx, kind = item[0], item[1]
        if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
            raise ValueError(f"{name}: frame index must be an int >= 0, got {idx!r}")
        if kind not in FAULT_KINDS:
            raise ValueError(f"{name}: fault kind must be one of {FAULT_KINDS}, got {kind!r}")
        if idx in seen:
            raise ValueError(f"{name}: frame {idx} has two faults ({seen[idx]}, {kind})")
        seen[idx] = kind
        if kind == "corrupt" and (len(item) == 2 or item[2] is None):
            item = (idx, kind, CORRUPT_BIT)
        out.append(tuple(item))
    return out


def _ns_to_cycles(name, v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v % NS_PER_CYCLE:
        raise ValueError(f"{name} must be an even int >= 0 (ns, a whole number of {NS_PER_CYCLE} ns cycles), "
                         f"got {v!r}")
    return v // NS_PER_CYCLE


class _Side:
    """One direction: the Link and the records of the frames put on it."""

    def __init__(self, direction, link, records):
        self.direction, self.link, self.records = direction, link, records
        self.by_index = {}

    def send(self, now, frame):
        # The endpoint starts the frame at ``now``: its last wire byte leaves at
        # 50 * now + wire_bytes; the Link keeps frames back to back and applies the
        # faults. A send may not go behind the Link's current cycle (a longer frame
        # handed over earlier may still be on the wire): the hand-over cycle is then the
        # Link's, the wire end stays exact.
        end = _BYTES_PER_NS * now + wire_bytes(len(frame))
        log = self.link.log
        n = len(log)
        idx = self.link.send(frame, max(cycle_of_bytes(end), self.link.now), end_bytes=end)
        kind = log[n].kind if len(log) > n else None
        rec = LinkRecord(self.direction, idx, now, None, frame, kind)
        self.records.append(rec)
        self.by_index[idx] = rec

    def deliver(self, cycle):
        out = self.link.deliver(cycle)
        for d in out:
            if not d.copy:
                self.by_index[d.index].arrival = NS_PER_CYCLE * d.cycle
        return out


def simulate(requester, responder, posts, faults=(), response_faults=(), *, latency_ns=1000, delay_ns=None,
             reorder_window_ns=None, memory=None, max_events=1_000_000, max_time_ns=10 ** 12, recv_posts=()):
    """Run a requester and a responder back to back over a lossy link.

    The link is ``model.network.Link``, one per direction, with a
    ``FaultSpec(pattern=...)`` built from ``faults`` / ``response_faults``.

    Parameters:
        requester: RcRequester; responder: RcResponder (QPs paired by the contexts:
            requester ctx.remote_qpn = responder ctx.qpn and the reverse).
        posts: iterable of ``(qpn, wqe_bytes)`` (posted at time 0, in order) or
            ``(time_ns, qpn, wqe_bytes)``.
        faults: fault pattern of the requester-to-responder link, entries
            ``(frame index, kind)`` or ``(frame index, kind, arg)`` as in
            ``model.network.FaultSpec.pattern`` (so the pattern of a cocotb pair run can
            be passed unchanged); the index counts every frame put on that link (first
            transmissions and retransmissions) from 0. Kinds (``FAULT_KINDS``; the rules
            are ``model.network.Link``'s):
              drop       the frame takes its wire time and never arrives;
              corrupt    bit ``arg`` flips (``model.network.flip_bit``); without ``arg``,
                         ``CORRUPT_BIT`` (the last bit of the BTH: the receiver drops it
                         as bad_icrc);
              duplicate  a second copy follows right behind the first (one frame time later);
              reorder    held until ``arg`` (default 1) later frames of that link were
                         sent, then sent right behind the last of them; if fewer are sent
                         within reorder_window_ns, sent alone when the window ends;
              delay      held ``arg`` cycles (default delay_ns / 2) and then sent; frames
                         sent meanwhile overtake it.
        response_faults: the same for the responder-to-requester link (ACKs, NAKs).
        latency_ns: one-way latency of each link after serialisation (the Link's
            ``latency_cycles`` = latency_ns / 2).
        delay_ns: hold time of a "delay" fault without its own ``arg`` (default
            4 x latency_ns).
        reorder_window_ns: how long a "reorder" frame waits for its followers (default
            delay_ns; the Link's ``reorder_timeout_cycles`` = reorder_window_ns / 2).
        memory: object with ``write(addr, bytes)`` for the responder's writes (default a new
            SparseMemory); with two-sided verbs the responder's ``read_memory`` must read
            it (its receive queues and doorbell records are there).
        recv_posts: receive WQEs posted on the responder's side, ``(time_ns, poster,
            scatter_lists)`` each: ``poster`` a ``model.recv_queue.RecvPoster`` writing
            into ``memory``, ``scatter_lists`` a list of WQEs' scatter lists, posted (WQEs
            and then the doorbell record) at ``time_ns``, before the posts and frames of
            that instant.
        max_events, max_time_ns: stop and report ``hung`` beyond these.
        latency_ns, delay_ns and reorder_window_ns must be even (whole 2 ns cycles).

    Time model: every time reported (records, writes, end_time) and every endpoint time
    (posts, ACK timers: ``timeout_ns``) is in ns; the links run in cycles of 2 ns, so a
    frame arrives at an even ns (its Link arrival cycle x 2). A frame put on a link at
    ``t`` ns starts at wire byte 50 * t and costs ``wire_bytes(len)`` bytes of wire
    (400 Gb/s with preamble, FCS and gap); frames go out in order on each link, back to
    back. The endpoints take no time (a response or retransmission leaves when its cause
    arrives). At one instant: posts first, then the frames arriving in that cycle
    (responder side, then requester side), then the requester's ACK timers due then.
    The run ends when no frame is in flight or held and no timer is armed.

    Returns a SimResult; counters are on the endpoints and the Links.
    """
    if not isinstance(requester, RcRequester) or not isinstance(responder, RcResponder):
        raise ValueError("simulate needs an RcRequester and an RcResponder")
    for name, v in (("max_events", max_events), ("max_time_ns", max_time_ns)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
    latency = _ns_to_cycles("latency_ns", latency_ns)
    delay_ns = 4 * latency_ns if delay_ns is None else delay_ns
    delay = _ns_to_cycles("delay_ns", delay_ns)
    window = _ns_to_cycles("reorder_window_ns", delay_ns if reorder_window_ns is None else reorder_window_ns)
    mem = SparseMemory() if memory is None else memory
    records = []
    sides = {}
    for direction, name, pattern in (("req", "faults", faults), ("resp", "response_faults", response_faults)):
        entries = _pattern(pattern, name)
        try:
            spec = FaultSpec(pattern=entries, delay_cycles=delay, reorder_depth=1, reorder_timeout_cycles=window)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
        sides[direction] = _Side(direction, Link(latency, spec, name=direction), records)
    fwd, rev = sides["req"], sides["resp"]
    rposts = []
    for seq, item in enumerate(recv_posts):
        if not (isinstance(item, (tuple, list)) and len(item) == 3):
            raise ValueError(f"a receive post must be (time_ns, poster, scatter_lists), got {item!r}")
        t, poster, lists = item
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"receive post time must be an int >= 0, got {t!r}")
        if poster.memory is not mem:
            raise ValueError("a receive post's RecvPoster must write into the simulation's memory")
        heapq.heappush(rposts, (t, seq, poster, list(lists)))
    pending = []
    for seq, item in enumerate(posts):
        if len(item) == 2:
            t, (qpn, wqe) = 0, item
        elif len(item) == 3:
            t, qpn, wqe = item
        else:
            raise ValueError(f"a post must be (qpn, wqe_bytes) or (time_ns, qpn, wqe_bytes), got {item!r}")
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"post time must be an int >= 0, got {t!r}")
        heapq.heappush(pending, (t, seq, qpn, bytes(wqe)))
    writes, rx = [], []
    now = events = 0
    hung = False
    while True:
        t_post = pending[0][0] if pending else None
        t_recv = rposts[0][0] if rposts else None
        cycles = [c for c in (fwd.link.next_event_cycle(), rev.link.next_event_cycle()) if c is not None]
        t_link = NS_PER_CYCLE * min(cycles) if cycles else None
        t_to = requester.next_deadline()
        times = [t for t in (t_recv, t_post, t_link, t_to) if t is not None]
        if not times:
            break
        t = min(times)
        if events >= max_events or t > max_time_ns:
            hung = True
            break
        events += 1
        now = max(now, t)
        if t_recv == t:
            _, _, poster, lists = heapq.heappop(rposts)
            poster.post(*lists)
        elif t_post == t:
            _, _, qpn, wqe = heapq.heappop(pending)
            for pkt in requester.post(qpn, wqe, now):
                fwd.send(now, pkt.frame)
        elif t_link == t:
            cycle = t // NS_PER_CYCLE
            # Both links polled at the cycle first: a frame sent in answer arrives later.
            to_resp, to_req = fwd.deliver(cycle), rev.deliver(cycle)
            for d in to_resp:
                r = responder.receive(d.frame)
                rx.append(r)
                for addr, chunk in r.writes:
                    mem.write(addr, chunk)
                    writes.append((now, r.qpn, r.psn, addr, chunk))
                for f in r.frames_out:          # an ACK/NAK, an ATOMIC ACK, a READ's responses
                    rev.send(now, f)
            for d in to_req:
                for pkt in requester.on_response(d.frame, now).retransmit:
                    fwd.send(now, pkt.frame)
        else:
            tx, _ = requester.on_timeout(now)
            for pkt in tx:
                fwd.send(now, pkt.frame)
    hung = hung or not requester.idle()
    counts = {d: Counter(e.kind for e in s.link.log) for d, s in sides.items()}
    return SimResult(end_time=now, hung=hung, events=events, records=records, writes=writes,
                     faults=counts, memory=mem, rx=rx, links={d: s.link for d, s in sides.items()})
