"""Two RC endpoints of the golden model over a lossy link: ``simulate`` with an explicit fault pattern.

The fault kinds (``FAULT_KINDS``) and the corrupt rule (one bit flips: ``flip_bit``) are
``model.network``'s, whose ``Link`` the cocotb pair environments drive; this link keeps its
own time base (ns) and its drop/duplicate/reorder/delay timing (see ``simulate``).

Contents:
    FAULT_KINDS                 fault kinds a pattern may name (model.network's)
    LinkRecord, SimResult
    simulate                    a requester and a responder back to back over a lossy link
"""

from collections import Counter
from dataclasses import dataclass
import heapq

from spec.formats import ICRC_LEN
from spec.params import WIRE_GBPS, wire_bytes
from model.memory import SparseMemory
from model.network import FAULT_KINDS, flip_bit
from model.requester import RcRequester
from model.responder import RcResponder

__all__ = ["FAULT_KINDS", "LinkRecord", "SimResult", "simulate"]


_BYTES_PER_NS = WIRE_GBPS // 8          # 50 bytes per ns at 400 Gb/s


@dataclass
class LinkRecord:
    """One frame put on a link.

    Members:
        direction: "req" (requester to responder) or "resp"; index: its number on that
        link (what a fault pattern names); time: start of transmission (ns); arrival: when
        it arrives without a delay or reorder fault (ns), None if dropped; frame: the bytes
        as sent (before a corruption); fault: the fault kind applied, or None.
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
        ended with work left; events: events processed.
        records: every LinkRecord in transmission order (both directions).
        writes: ``[(time, qpn, psn, addr, bytes)]`` performed in the responder's memory.
        faults: {"req"/"resp": Counter of the fault kinds applied}.
        memory: the responder's memory (SparseMemory or the object passed in).
        rx: every RxResult of the responder, in arrival order.
    """
    end_time: int
    hung: bool
    events: int
    records: list
    writes: list
    faults: dict
    memory: object
    rx: list


def _fault_map(faults, name):
    m = {}
    for item in faults:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ValueError(f"{name}: each fault must be (frame index, kind), got {item!r}")
        idx, kind = item
        if not isinstance(idx, int) or idx < 0:
            raise ValueError(f"{name}: frame index must be an int >= 0, got {idx!r}")
        if kind not in FAULT_KINDS:
            raise ValueError(f"{name}: fault kind must be one of {FAULT_KINDS}, got {kind!r}")
        if idx in m:
            raise ValueError(f"{name}: frame {idx} has two faults ({m[idx]}, {kind})")
        m[idx] = kind
    return m


class _Link:
    """One direction of the wire: 400 Gb/s serialisation, fixed latency, faults by index."""

    def __init__(self, direction, faults, latency, delay, window, sim):
        self.direction, self.faults, self.latency, self.delay, self.window = direction, faults, latency, delay, window
        self.sim = sim
        self.count = 0
        self.free_at = 0
        self.held = None           # (token, frame) of a "reorder" frame waiting for the next one

    def send(self, now, frame):
        idx = self.count
        self.count += 1
        start = max(now, self.free_at)
        self.free_at = start + -(-wire_bytes(len(frame)) // _BYTES_PER_NS)
        arrival = self.free_at + self.latency
        kind = self.faults.get(idx)
        rec = LinkRecord(self.direction, idx, start, None if kind == "drop" else arrival, frame, kind)
        self.sim.records.append(rec)
        if kind:
            self.sim.fault_counts[self.direction][kind] += 1
        # A held frame arrives right after the frame sent behind it: the two swap.
        if self.held is not None:
            self.sim.deliver(self.direction, arrival + 1, self.held[1])
            self.held = None
        if kind == "drop":
            return
        if kind == "corrupt":
            # model.network's rule (one bit flips, ``flip_bit``), at the first bit of the last
            # byte before the ICRC: covered by the ICRC only, so the receiver's drop reason is
            # bad_icrc for every frame (all frames are >= 62 bytes, headers 54).
            frame = flip_bit(frame, 8 * (len(frame) - ICRC_LEN - 1))
        if kind == "delay":
            arrival += self.delay
        if kind == "reorder":
            token = object()
            self.held = (token, frame)
            # No frame follows within the window: it arrives late, alone.
            self.sim.schedule(arrival + self.window, "release", (self, token))
            return
        self.sim.deliver(self.direction, arrival, frame)
        if kind == "duplicate":
            self.sim.deliver(self.direction, arrival + 1, frame)

    def release(self, token, now):
        if self.held is not None and self.held[0] is token:
            self.sim.deliver(self.direction, now, self.held[1])
            self.held = None


class _Sim:
    def __init__(self):
        self.heap = []
        self.seq = 0
        self.records = []
        self.fault_counts = {"req": Counter(), "resp": Counter()}

    def schedule(self, t, kind, data):
        heapq.heappush(self.heap, (t, self.seq, kind, data))
        self.seq += 1

    def deliver(self, direction, t, frame):
        self.schedule(t, "to_resp" if direction == "req" else "to_req", frame)


def simulate(requester, responder, posts, faults=(), response_faults=(), *, latency_ns=1000, delay_ns=None,
             reorder_window_ns=None, memory=None, max_events=1_000_000, max_time_ns=10 ** 12):
    """Run a requester and a responder back to back over a lossy link.

    Parameters:
        requester: RcRequester; responder: RcResponder (QPs paired by the contexts:
            requester ctx.remote_qpn = responder ctx.qpn and the reverse).
        posts: iterable of ``(qpn, wqe_bytes)`` (posted at time 0, in order) or
            ``(time_ns, qpn, wqe_bytes)``.
        faults: fault pattern of the requester-to-responder link, ``[(frame index, kind)]``;
            the index counts every frame put on that link (first transmissions and
            retransmissions) from 0. Kinds (``FAULT_KINDS``):
              drop       the frame never arrives;
              corrupt    the first bit of the byte before the ICRC flips (model.network.flip_bit;
                         the receiver drops it: bad_icrc);
              duplicate  a second copy arrives 1 ns after the first;
              reorder    it arrives 1 ns after the next frame of that link (or
                         reorder_window_ns late if none is sent by then);
              delay      it arrives delay_ns late.
        response_faults: the same for the responder-to-requester link (ACKs, NAKs).
        latency_ns: one-way latency of each link (after serialisation at 400 Gb/s, with
            preamble, FCS and gap: ``spec.params.wire_bytes``).
        delay_ns: extra latency of a "delay" fault (default 4 x latency_ns).
        reorder_window_ns: how long a "reorder" frame waits for a follower (default delay_ns).
        memory: object with ``write(addr, bytes)`` for the responder's writes (default a new
            SparseMemory).
        max_events, max_time_ns: stop and report ``hung`` beyond these.

    Time model: frames go out in order on each link, back to back at 400 Gb/s; the
    endpoints take no time (a response or retransmission leaves when its cause arrives);
    the requester's ACK timers fire at their deadlines (an arrival at the same instant is
    handled first). The run ends when no frame is in flight and no timer is armed.

    Returns a SimResult; counters are on the endpoints.
    """
    if not isinstance(requester, RcRequester) or not isinstance(responder, RcResponder):
        raise ValueError("simulate needs an RcRequester and an RcResponder")
    for name, v in (("latency_ns", latency_ns), ("max_events", max_events), ("max_time_ns", max_time_ns)):
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
    delay = 4 * latency_ns if delay_ns is None else delay_ns
    window = delay if reorder_window_ns is None else reorder_window_ns
    for name, v in (("delay_ns", delay), ("reorder_window_ns", window)):
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
    mem = SparseMemory() if memory is None else memory
    sim = _Sim()
    fwd = _Link("req", _fault_map(faults, "faults"), latency_ns, delay, window, sim)
    rev = _Link("resp", _fault_map(response_faults, "response_faults"), latency_ns, delay, window, sim)
    for item in posts:
        if len(item) == 2:
            t, (qpn, wqe) = 0, item
        elif len(item) == 3:
            t, qpn, wqe = item
        else:
            raise ValueError(f"a post must be (qpn, wqe_bytes) or (time_ns, qpn, wqe_bytes), got {item!r}")
        if not isinstance(t, int) or t < 0:
            raise ValueError(f"post time must be an int >= 0, got {t!r}")
        sim.schedule(t, "post", (qpn, bytes(wqe)))
    writes, rx = [], []
    now = events = 0
    hung = False
    while True:
        t_ev = sim.heap[0][0] if sim.heap else None
        t_to = requester.next_deadline()
        if t_ev is None and t_to is None:
            break
        if events >= max_events or min(t for t in (t_ev, t_to) if t is not None) > max_time_ns:
            hung = True
            break
        events += 1
        if t_ev is not None and (t_to is None or t_ev <= t_to):
            now, _, kind, data = heapq.heappop(sim.heap)
            if kind == "post":
                for pkt in requester.post(data[0], data[1], now):
                    fwd.send(now, pkt.frame)
            elif kind == "to_resp":
                r = responder.receive(data)
                rx.append(r)
                for addr, chunk in r.writes:
                    mem.write(addr, chunk)
                    writes.append((now, r.qpn, r.psn, addr, chunk))
                if r.response is not None:
                    rev.send(now, r.response)
            elif kind == "to_req":
                for pkt in requester.on_response(data, now).retransmit:
                    fwd.send(now, pkt.frame)
            else:  # release of a held "reorder" frame
                link, token = data
                link.release(token, now)
        else:
            now = t_to
            tx, _ = requester.on_timeout(now)
            for pkt in tx:
                fwd.send(now, pkt.frame)
    hung = hung or not requester.idle()
    return SimResult(end_time=now, hung=hung, events=events, records=sim.records, writes=writes,
                     faults=sim.fault_counts, memory=mem, rx=rx)
