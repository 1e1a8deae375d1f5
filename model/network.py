"""Network model for reliable-connection tests: links with fault injection, a switch.

Pure Python, no cocotb, so it runs in plain unit tests (tests/model/test_network_model.py)
and, inside a cocotb test, between each NIC's TX wire model (tb/wire.py) and its MAC RX.

Time:
    Cycles of the 500 MHz core clock (2 ns). Wire time is counted in bytes, 100 bytes
    a cycle at 400 Gb/s (SPEC section 6): cycle ``c`` is the instant ``100 * c``. A frame
    of L captured bytes (Ethernet header through ICRC, no FCS, as ``WireFrame.data``)
    costs ``wire_bytes(L) = L + 24`` bytes of wire time (FCS 4, preamble/SFD 8, IFG 12).

Link timing:
    A frame is *sent* at cycle ``c`` when its last wire byte has left the sender by then:
    its wire end is ``100 * c``, or ``end_bytes`` when the sender knows it exactly
    (``WireFrame.end_bytes``). One frame at a time: it ends no earlier than the previous
    frame's end plus its own wire bytes. It arrives at the far end of a link of latency
    ``d`` at ``ceil(end / 100) + d``, the first cycle by which all of it is in.

Faults (``FaultSpec``):
    Applied where the frame enters the link, at most one per frame, chosen by a seeded
    ``random.Random`` per link (or by an explicit pattern), so a run is reproducible and
    a golden model can predict it. ``drop``: the frame takes its wire time but never
    arrives. ``corrupt``: one bit after the Ethernet header flips (the IPv4 checksum or
    the ICRC catches it). ``duplicate``: a copy follows right behind the frame.
    ``reorder``: the frame is held until ``reorder_depth`` later frames were sent (or
    ``reorder_timeout_cycles`` passed), then goes right behind. ``delay``: the frame is
    held ``delay_cycles`` and then sent; frames sent meanwhile overtake it.

Driving it from cocotb (sketch):
    every cycle ``now``: for each NIC p, each ``WireFrame`` f of p's ``Wire400G`` not yet
    sent with ``f.end_bytes <= 100 * now``: ``net.send(p, f.data, now, end_bytes=f.end_bytes)``;
    then for each ``Delivery`` d in ``net.receive(p, now)``: put ``d.frame`` on p's MAC RX.
    It is a cycle-stepped model: time only moves on. Sends on a link come in cycle
    order and never before the link's last poll; polls (``deliver``, ``step``,
    ``receive``) come in cycle order and may lag the sends, so a unit test can queue a
    whole traffic plan and then run it. Stepping every cycle or only at
    ``next_event_cycle()`` gives the same frames at the same cycles.
"""

import heapq
import numbers
import random
from collections import deque
from dataclasses import dataclass, field

from model.frames import mac_bytes
from spec.formats import (BTH_LEN, ETH_LEN, ETHERTYPE_IPV4, ICRC_LEN, IP_PROTO_UDP, IPV4_LEN,
                          OFF_BTH, OFF_IP, OFF_UDP, ROCEV2_UDP_PORT)
from spec.params import WIRE_BYTES_PER_CYCLE, wire_bytes

__all__ = [
    "FAULT_KINDS", "BYTES_PER_CYCLE", "FaultSpec", "FaultEvent", "Delivery", "SwitchDrop",
    "Link", "BackToBack", "Switch", "Network", "cycle_of_bytes", "flip_bit", "corruption_check",
]

BYTES_PER_CYCLE = int(WIRE_BYTES_PER_CYCLE)       # 100 wire bytes per 2 ns cycle at 400G
FAULT_KINDS = ("drop", "corrupt", "reorder", "duplicate", "delay")
_COUNTER_NAMES = ("sent", "delivered", "dropped", "corrupted", "reordered", "duplicated", "delayed")
COUNTER_OF = {"drop": "dropped", "corrupt": "corrupted", "reorder": "reordered",
               "duplicate": "duplicated", "delay": "delayed"}
# RoCEv2 bytes that neither the IPv4 header checksum nor the ICRC covers (the ICRC masks
# them, SPEC section 5): a flip there would pass unnoticed (or set FECN/BECN), so random
# corruption avoids them and every injected corruption is one the receiver can count.
_UNCHECKED_BYTES = ((OFF_UDP + 6, 2), (OFF_BTH + 4, 1))
_SWITCH_COUNTERS = ("rx_frames", "forwarded", "tx_frames", "tail_drops", "unrouted")


# ---- helpers -----------------------------------------------------------------------
def cycle_of_bytes(t):
    """First cycle at or after wire time ``t`` (bytes): ``ceil(t / 100)``."""
    return -(-t // BYTES_PER_CYCLE)


def _int(name, v, lo):
    if type(v) is int and v >= lo:          # the common case, kept cheap: called per frame
        return v
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {v!r}")
    v = int(v)
    if v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    return v


def _seed(seed):
    # None would seed from the OS: the model must be reproducible.
    if isinstance(seed, bool) or not isinstance(seed, (int, str)):
        raise ValueError(f"seed must be an int or a str, got {seed!r}")
    return seed


def _frame(frame):
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise ValueError(f"frame must be bytes, got {type(frame).__name__}")
    frame = bytes(frame)
    if len(frame) <= ETH_LEN:
        raise ValueError(f"frame of {len(frame)} bytes has nothing after its {ETH_LEN}-byte Ethernet header")
    return frame


def flip_bit(frame, bit):
    """``frame`` with bit ``bit`` inverted.

    Bits count from the most significant bit of byte 0 (a big-endian bit string):
    bit ``b`` is byte ``b // 8``, mask ``0x80 >> (b % 8)``.
    """
    if not 0 <= bit < 8 * len(frame):
        raise ValueError(f"bit {bit} is outside a frame of {len(frame)} bytes")
    b = bytearray(frame)
    b[bit // 8] ^= 0x80 >> (bit % 8)
    return bytes(b)


def corruption_check(bit):
    """Which receiver check catches a flip of ``bit`` in a RoCEv2 frame.

    Returns ``"ipv4"`` for a bit of the IPv4 header (its header checksum fails; TOS,
    TTL and the checksum itself are masked out of the ICRC), ``"ethernet"`` for the
    Ethernet header (only the FCS, which the model does not carry) and ``"icrc"``
    otherwise (UDP, BTH, extension headers, payload, the ICRC itself).
    """
    if bit < 8 * OFF_IP:
        return "ethernet"
    if bit < 8 * (OFF_IP + IPV4_LEN):
        return "ipv4"
    return "icrc"


def _is_rocev2(frame):
    return (len(frame) >= OFF_BTH + BTH_LEN + ICRC_LEN
            and int.from_bytes(frame[12:14], "big") == ETHERTYPE_IPV4
            and frame[OFF_IP + 9] == IP_PROTO_UDP
            and int.from_bytes(frame[OFF_UDP + 2:OFF_UDP + 4], "big") == ROCEV2_UDP_PORT)


def _random_bit(rng, frame):
    """A bit after the Ethernet header, skipping RoCEv2 bytes no check covers."""
    skip = _UNCHECKED_BYTES if _is_rocev2(frame) else ()
    n = 8 * (len(frame) - ETH_LEN - sum(w for _, w in skip))
    bit = 8 * ETH_LEN + rng.randrange(n)
    for off, width in skip:                 # sorted, disjoint: shift past each skipped range
        if bit >= 8 * off:
            bit += 8 * width
    return bit


# ---- fault description -------------------------------------------------------------
@dataclass(frozen=True)
class FaultSpec:
    """Faults injected on one link.

    At most one fault hits a frame: one uniform draw per frame picks drop, corrupt,
    reorder, duplicate, delay or nothing, so the rates must add up to at most 1, and a
    fault kind's count over n frames is binomial(n, rate).

    Parameters:
        drop, corrupt, reorder, duplicate, delay: probability per frame, each in [0, 1].
        delay_cycles: how long a delayed frame is held (cycles, >= 0).
        reorder_depth: how many later frames pass a reordered one (>= 1).
        reorder_timeout_cycles: a reordered frame is let go after this many cycles
            even if fewer frames followed it, so a quiet link never keeps it (>= 0).
        pattern: explicit faults instead of random ones: an iterable of
            ``(frame_index, kind)`` or ``(frame_index, kind, arg)``; ``arg`` is the bit
            to flip for ``corrupt`` (see ``flip_bit``; default: a random one), the depth
            for ``reorder`` and the cycles for ``delay`` (defaults: the fields above);
            ``drop`` and ``duplicate`` take none. Frame indices count the frames sent on
            the link from 0. All rates must be 0 when a pattern is given.

    Members:
        pattern: None or the validated pattern as a tuple of ``(index, kind, arg)``
            sorted by index (``arg`` None when not given).
        rates: dict kind -> rate.
        lossless: True when no fault can happen.
    """
    drop: float = 0.0
    corrupt: float = 0.0
    reorder: float = 0.0
    duplicate: float = 0.0
    delay: float = 0.0
    delay_cycles: int = 100
    reorder_depth: int = 3
    reorder_timeout_cycles: int = 500
    pattern: object = None

    def __post_init__(self):
        for kind in FAULT_KINDS:
            r = getattr(self, kind)
            # the chained comparison is False for NaN too
            if isinstance(r, bool) or not isinstance(r, numbers.Real) or not 0.0 <= r <= 1.0:
                raise ValueError(f"FaultSpec.{kind} must be a rate in [0, 1], got {r!r}")
        total = sum(getattr(self, k) for k in FAULT_KINDS)
        if total > 1.0 + 1e-12:
            raise ValueError(f"FaultSpec rates add up to {total:g} > 1 (a frame takes at most one fault)")
        _int("FaultSpec.delay_cycles", self.delay_cycles, 0)
        _int("FaultSpec.reorder_depth", self.reorder_depth, 1)
        _int("FaultSpec.reorder_timeout_cycles", self.reorder_timeout_cycles, 0)
        if self.pattern is not None:
            if total > 0:
                raise ValueError("FaultSpec: give either rates or a pattern, not both")
            object.__setattr__(self, "pattern", self._check_pattern(self.pattern))

    @staticmethod
    def _check_pattern(pattern):
        if isinstance(pattern, (str, bytes)):
            raise ValueError("FaultSpec.pattern must be an iterable of (index, kind[, arg]) tuples")
        out, seen = [], set()
        for entry in pattern:
            if not isinstance(entry, (tuple, list)) or len(entry) not in (2, 3):
                raise ValueError(f"FaultSpec.pattern entry {entry!r} is not (index, kind[, arg])")
            index = _int("FaultSpec.pattern frame index", entry[0], 0)
            kind = entry[1]
            if kind not in FAULT_KINDS:
                raise ValueError(f"FaultSpec.pattern: unknown fault kind {kind!r} (one of {', '.join(FAULT_KINDS)})")
            if index in seen:
                raise ValueError(f"FaultSpec.pattern: frame {index} has more than one fault")
            seen.add(index)
            arg = entry[2] if len(entry) == 3 else None
            if arg is not None:
                if kind in ("drop", "duplicate"):
                    raise ValueError(f"FaultSpec.pattern: {kind} takes no argument, got {arg!r}")
                if kind == "corrupt":
                    arg = _int("FaultSpec.pattern corrupt bit", arg, 8 * ETH_LEN)
                elif kind == "reorder":
                    arg = _int("FaultSpec.pattern reorder depth", arg, 1)
                else:
                    arg = _int("FaultSpec.pattern delay cycles", arg, 0)
            out.append((index, kind, arg))
        return tuple(sorted(out))

    @property
    def rates(self):
        return {k: getattr(self, k) for k in FAULT_KINDS}

    @property
    def lossless(self):
        return not self.pattern and not any(self.rates.values())


@dataclass(frozen=True)
class FaultEvent:
    """One injected fault, as logged by a ``Link``.

    Members:
        index: the frame's index on the link (0 = first frame sent).
        kind: one of ``FAULT_KINDS``.
        cycle: the cycle the frame was sent.
        detail: the flipped bit (corrupt), the depth (reorder), the cycles (delay), else None.
    """
    index: int
    kind: str
    cycle: int
    detail: object = None


@dataclass(frozen=True)
class Delivery:
    """A frame at the far end of a link.

    Members:
        frame: the bytes (corrupted ones as received).
        cycle: arrival cycle: all of the frame is in by then.
        end_bytes: wire time (bytes) at the receiver when its last wire byte arrived;
            ``cycle == cycle_of_bytes(end_bytes)``.
        index: the frame's index on the link it came over.
        copy: True for the second copy of a duplicated frame.
        fault: the fault kind that touched it (``corrupt``, ``reorder``, ``delay``,
            ``duplicate``; both copies of a duplicate) or None.
    """
    frame: bytes
    cycle: int
    end_bytes: int
    index: int
    copy: bool = False
    fault: object = None


@dataclass
class _Held:
    frame: bytes
    index: int
    kind: str
    release_cycle: int
    frames_left: object            # None: released by time only (delay)
    seq: int


# ---- link --------------------------------------------------------------------------
class Link:
    """One direction of a 400 Gb/s cable, with fault injection.

    Parameters:
        latency_cycles: propagation delay from the sender's wire end to the receiver
            (cycles, >= 0; 5 ns per metre of fibre is 2.5 cycles).
        faults: a ``FaultSpec`` (None: no faults).
        seed: int or str; fixes the fault draws (same seed, same frames: same faults).
        name: a label for logs and error messages.

    Members:
        latency_cycles, faults, seed, name: as given.
        now: the latest cycle ``send`` or ``deliver`` was called with. Sends must come
            at ``now`` or later; polls (``deliver``) in non-decreasing cycles, possibly
            behind the sends (frames may be queued ahead, then polled).
        counters: dict ``sent``, ``delivered``, ``dropped``, ``corrupted``, ``reordered``,
            ``duplicated``, ``delayed`` (a duplicate is delivered twice: ``delivered ==
            sent - dropped + duplicated`` once the link is empty).
        log: list of ``FaultEvent`` in the order the faults were injected.
    """

    def __init__(self, latency_cycles=0, faults=None, seed=0, *, name="link"):
        self.latency_cycles = _int(f"{name}: latency_cycles", latency_cycles, 0)
        if faults is None:
            faults = FaultSpec()
        if not isinstance(faults, FaultSpec):
            raise ValueError(f"{name}: faults must be a FaultSpec or None, got {faults!r}")
        self.faults = faults
        self.seed = _seed(seed)
        self.name = name
        # Two streams: which frames are hit depends on the seed and the frame count only,
        # not on the frames' lengths (which the bit choice consumes draws for).
        self._rng_fault = random.Random(f"fault:{seed!r}")
        self._rng_arg = random.Random(f"arg:{seed!r}")
        self._pattern = {i: (k, a) for i, k, a in faults.pattern} if faults.pattern is not None else None
        self._thresholds = []
        acc = 0.0
        for kind in FAULT_KINDS:
            if getattr(faults, kind) > 0:
                acc += getattr(faults, kind)
                self._thresholds.append((acc, kind))
        self.now = 0
        self._polled = 0                # last cycle given to deliver
        self.counters = dict.fromkeys(_COUNTER_NAMES, 0)
        self.log = []
        self._free = None               # wire end (bytes) of the last frame on the wire
        self._wire = deque()            # Delivery, in arrival order
        self._held = []                 # _Held, in hold order
        self._hold_seq = 0

    def __repr__(self):
        return f"Link({self.name!r}, latency={self.latency_cycles}, in flight={self.in_flight})"

    # ---- time ----
    def _advance(self, cycle, what):
        # A send may not go behind anything the link has already done (a held frame let
        # go, a poll). A poll may lag the sends: what was due by then is already placed,
        # since every send first lets go the held frames due by its cycle.
        cycle = _int(f"{self.name}: {what} cycle", cycle, 0)
        last = self.now if what == "send" else self._polled
        if cycle < last:
            raise ValueError(f"{self.name}: {what} at cycle {cycle} is before the link's "
                             f"{'current' if what == 'send' else 'last polled'} cycle {last} "
                             f"(calls must come in cycle order)")
        self._release_due(cycle)
        self.now = max(self.now, cycle)
        if what == "deliver":
            self._polled = cycle
        return cycle

    def _release_due(self, cycle):
        while self._held:
            due = [h for h in self._held if h.release_cycle <= cycle]
            if not due:
                return
            h = min(due, key=lambda h: (h.release_cycle, h.seq))
            self._release(h, BYTES_PER_CYCLE * h.release_cycle)

    def _release(self, h, ready):
        self._held.remove(h)
        self._place(h.frame, h.index, ready, fault=h.kind)

    def _place(self, frame, index, ready, *, lost=False, copy=False, fault=None):
        # One frame at a time on the wire: it ends no earlier than the last one's end
        # plus its own wire bytes, whatever the sender claims.
        wb = wire_bytes(len(frame))
        end = ready if self._free is None else max(ready, self._free + wb)
        self._free = end
        if lost:
            return
        arrival = end + BYTES_PER_CYCLE * self.latency_cycles
        self._wire.append(Delivery(frame, cycle_of_bytes(arrival), arrival, index, copy, fault))

    # ---- faults ----
    def _choose(self, index):
        if self._pattern is not None:
            return self._pattern.get(index, (None, None))
        if not self._thresholds:
            return None, None
        u = self._rng_fault.random()
        for acc, kind in self._thresholds:
            if u < acc:
                return kind, None
        return None, None

    # ---- API ----
    def send(self, frame, cycle, *, end_bytes=None):
        """Put a frame on the link.

        Parameters:
            frame: frame bytes (Ethernet header through ICRC, no FCS).
            cycle: the cycle by which its last byte has left the sender.
            end_bytes: its exact wire end in bytes if known (``WireFrame.end_bytes``);
                at most ``100 * cycle``. Default ``100 * cycle``.

        Returns the frame's index on the link.
        """
        frame = _frame(frame)
        cycle = self._advance(cycle, "send")
        if end_bytes is None:
            ready = BYTES_PER_CYCLE * cycle
        else:
            ready = _int(f"{self.name}: end_bytes", end_bytes, 0)
            if ready > BYTES_PER_CYCLE * cycle:
                raise ValueError(f"{self.name}: a frame ending at wire byte {ready} has not left "
                                 f"the sender by cycle {cycle} (byte {BYTES_PER_CYCLE * cycle})")
        index = self.counters["sent"]
        self.counters["sent"] += 1
        kind, arg = self._choose(index)
        waiting = [h for h in self._held if h.frames_left is not None] if self._held else ()   # this frame passes them
        spec = self.faults
        detail = None
        if kind is None:
            self._place(frame, index, ready)
        elif kind == "drop":
            self._place(frame, index, ready, lost=True)    # lost on the cable: its wire time is spent
        elif kind == "corrupt":
            detail = arg if arg is not None else _random_bit(self._rng_arg, frame)
            frame = flip_bit(frame, detail)
            self._place(frame, index, ready, fault=kind)
        elif kind == "duplicate":
            self._place(frame, index, ready, fault=kind)
            self._place(frame, index, ready, copy=True, fault=kind)
        else:
            if kind == "reorder":
                detail = arg if arg is not None else spec.reorder_depth
                held = _Held(frame, index, kind, cycle + spec.reorder_timeout_cycles, detail, self._hold_seq)
            else:
                detail = arg if arg is not None else spec.delay_cycles
                held = _Held(frame, index, kind, cycle + detail, None, self._hold_seq)
            self._hold_seq += 1
            self._held.append(held)
        if kind is not None:
            self.counters[COUNTER_OF[kind]] += 1
            self.log.append(FaultEvent(index, kind, cycle, detail))
        for h in waiting:
            h.frames_left -= 1
            if h.frames_left == 0:
                self._release(h, ready)                     # right behind the frame that passed it
        self._release_due(cycle)                            # delay 0 / timeout 0
        return index

    def deliver(self, cycle):
        """Frames that have arrived by ``cycle`` and were not delivered yet.

        Returns a list of ``Delivery`` in arrival order (each with its arrival cycle,
        which is earlier than ``cycle`` when the caller polls late).
        """
        cycle = self._advance(cycle, "deliver")
        out = []
        while self._wire and self._wire[0].cycle <= cycle:
            out.append(self._wire.popleft())
        self.counters["delivered"] += len(out)
        return out

    def next_event_cycle(self):
        """Cycle of the next arrival or release of a held frame, None when idle."""
        times = [h.release_cycle for h in self._held]
        if self._wire:
            times.append(self._wire[0].cycle)
        return min(times) if times else None

    @property
    def in_flight(self):
        """Frames sent and not delivered yet (held ones included, lost ones not)."""
        return len(self._wire) + len(self._held)

    @property
    def idle(self):
        return not self._wire and not self._held

    def fault_pattern(self):
        """The injected faults as ``[(index, kind), ...]`` (compare with ``FaultSpec.pattern``)."""
        return [(e.index, e.kind) for e in self.log]


# ---- fabrics -----------------------------------------------------------------------
def _resolve_faults(faults, keys, name):
    """Map each link id to its FaultSpec.

    ``keys`` maps ``("tx", port)``/``("rx", port)`` to a link id (two keys may name the
    same link, as in a back-to-back cable).
    """
    ids = sorted(set(keys.values()))
    if faults is None or isinstance(faults, FaultSpec):
        return {i: faults for i in ids}
    if not isinstance(faults, dict):
        raise ValueError(f"{name}: faults must be None, a FaultSpec or a dict {{('tx'|'rx', port): FaultSpec}}")
    out = dict.fromkeys(ids)
    given = {}
    for key, spec in faults.items():
        if key not in keys:
            raise ValueError(f"{name}: no link {key!r}; links are {sorted(keys)}")
        if spec is not None and not isinstance(spec, FaultSpec):
            raise ValueError(f"{name}: faults[{key!r}] must be a FaultSpec, got {spec!r}")
        i = keys[key]
        if i in given:
            raise ValueError(f"{name}: {key!r} and {given[i]!r} are the same link")
        given[i] = key
        out[i] = spec
    return out


class _Fabric:
    """Send / step / receive shared by ``BackToBack`` and ``Switch``.

    Subclasses set ``num_ports``, ``tx_links``, ``rx_links`` and implement ``step`` and
    ``next_event_cycle``.
    """

    def _fabric_init(self, num_ports):
        self.num_ports = num_ports
        self.now = 0
        self._rx = [deque() for _ in range(num_ports)]

    def _check_port(self, port):
        if isinstance(port, bool) or not isinstance(port, numbers.Integral) or not 0 <= port < self.num_ports:
            raise ValueError(f"port must be 0..{self.num_ports - 1}, got {port!r}")
        return int(port)

    def _begin_step(self, cycle):
        cycle = _int("step cycle", cycle, 0)
        if cycle < self.now:
            raise ValueError(f"step at cycle {cycle} is before the current cycle {self.now}")
        return cycle

    def send(self, port, frame, cycle, *, end_bytes=None):
        """Frame sent by the endpoint on ``port`` (see ``Link.send``); returns its index on that link."""
        return self.tx_links[self._check_port(port)].send(frame, cycle, end_bytes=end_bytes)

    def receive(self, port, cycle=None):
        """Frames delivered to the endpoint on ``port`` and not taken yet.

        Parameters:
            port: endpoint port.
            cycle: if given, first ``run_until(cycle)``.

        Returns a list of ``Delivery`` in arrival order.
        """
        port = self._check_port(port)
        if cycle is not None:
            self.run_until(cycle)
        out = list(self._rx[port])
        self._rx[port].clear()
        return out

    def run_until(self, cycle):
        """Advance to ``cycle``, stepping only at cycles where something happens."""
        cycle = self._begin_step(cycle)
        while True:
            e = self.next_event_cycle()
            if e is None or e >= cycle:
                break
            t = max(e, self.now)
            self.step(t)
            if self.next_event_cycle() == t:        # everything due by t must be done by step(t)
                raise RuntimeError(f"network model: event at cycle {t} not consumed")
        self.step(cycle)

    def drain(self, max_cycles=10_000_000):
        """Run until nothing is in flight; returns the cycle reached.

        Raises RuntimeError if that takes more than ``max_cycles`` from now.
        """
        limit = self.now + max_cycles
        while (e := self.next_event_cycle()) is not None:
            if e > limit:
                raise RuntimeError(f"network not drained after {max_cycles} cycles")
            self.run_until(max(e, self.now))
        return self.now

    def _collect_links(self):
        self._links = []
        for link in list(self.tx_links) + list(self.rx_links):
            if all(link is not other for other in self._links):
                self._links.append(link)

    @property
    def links(self):
        """Every Link of the fabric, once each (tx links first, in port order)."""
        return list(self._links)

    def fault_log(self):
        """dict link name -> list of ``FaultEvent``."""
        return {link.name: list(link.log) for link in self._links}

    def pending(self, port):
        """Frames delivered to ``port`` and not taken by ``receive`` yet."""
        return len(self._rx[self._check_port(port)])


class BackToBack(_Fabric):
    """Two endpoints (ports 0 and 1) joined by a cable: one ``Link`` each way.

    Parameters:
        latency_cycles: propagation delay of both directions (cycles).
        faults: None, a ``FaultSpec`` for both directions, or a dict keyed by
            ``("tx", p)`` (the link port p sends on) or ``("rx", p)`` (the link port p
            receives from; ``("rx", 1)`` is ``("tx", 0)``).
        seed: int or str; each link's seed is derived from it and the link's name.

    Members:
        tx_links[p], rx_links[p]: the Link port p sends on / receives from
            (``tx_links[0] is rx_links[1]``); names "0->1" and "1->0".
        now: the last cycle stepped.
    """

    def __init__(self, latency_cycles=10, faults=None, seed=0):
        _seed(seed)
        self._fabric_init(2)
        keys = {("tx", 0): 0, ("rx", 1): 0, ("tx", 1): 1, ("rx", 0): 1}
        specs = _resolve_faults(faults, keys, "BackToBack")
        names = ("0->1", "1->0")
        self.tx_links = [Link(latency_cycles, specs[i], f"{seed}/{names[i]}", name=names[i]) for i in (0, 1)]
        self.rx_links = [self.tx_links[1], self.tx_links[0]]
        self._collect_links()

    def step(self, cycle):
        """Advance to ``cycle``: deliver what has arrived into the receive buffers."""
        cycle = self._begin_step(cycle)
        for p in (0, 1):
            self._rx[p].extend(self.rx_links[p].deliver(cycle))
        self.now = cycle

    def next_event_cycle(self):
        times = [t for t in (link.next_event_cycle() for link in self.tx_links) if t is not None]
        return min(times) if times else None

    @property
    def idle(self):
        return all(link.idle for link in self.tx_links)


@dataclass(frozen=True)
class SwitchDrop:
    """A frame the switch dropped.

    Members:
        cycle: cycle it reached the output queue (tail drop) or arrived (unrouted).
        in_port: ingress port. out_port: egress port, None when unrouted.
        reason: "tail_drop" or "unrouted". frame: the bytes.
    """
    cycle: int
    in_port: int
    out_port: object
    reason: str
    frame: bytes = field(repr=False)


class _OutPort:
    def __init__(self):
        self.tx_free = 0                # wire end (bytes) of the last frame scheduled on the port
        self.queue = deque()            # (wire end, length) of frames in the output buffer
        self.queue_bytes = 0
        self.handoff = deque()          # (send cycle, frame, wire end) not yet on the egress link


class Switch(_Fabric):
    """Store-and-forward Ethernet switch with 400 Gb/s ports and output queues.

    A frame fully received on an ingress link at cycle a is looked up by destination
    MAC and reaches its output queue at ``a + latency_cycles``. Each output port sends
    its queue in FIFO order at 400G: a frame starts at ``max(100 * (a + latency), end of
    the previous frame)``. A frame occupies ``len(frame)`` bytes of its output queue
    from then until its last wire byte has left; one that does not fit in
    ``queue_bytes`` is dropped (tail drop). Frames reaching queues in the same cycle go
    in ingress-port order. No FCS: a corrupted frame is forwarded like any other.
    A destination MAC not in the table is dropped and counted (``unrouted``); a frame
    for the ingress port's own MAC goes back out of it.

    Parameters:
        table: dict MAC -> port (MAC as int, 6 bytes or "aa:bb:..."; see ``mac_bytes``).
        num_ports: number of ports (default: the highest port of ``table`` + 1).
        latency_cycles: forwarding latency (cycles, >= 0).
        queue_bytes: output queue depth per port in frame bytes (>= 0).
        link_latency_cycles: latency of every port's links (cycles, >= 0).
        faults: None, a ``FaultSpec`` for every link, or a dict keyed by ``("tx", p)``
            (endpoint p to the switch) and ``("rx", p)`` (switch to endpoint p).
        seed: int or str; each link's seed is derived from it and the link's name.

    Members:
        table: dict 6-byte MAC -> port. num_ports, latency_cycles, queue_bytes.
        tx_links[p]: Link from endpoint p into the switch ("p->sw").
        rx_links[p]: Link from the switch to endpoint p ("sw->p").
        port_counters[p]: dict ``rx_frames`` (from tx_links[p]), ``unrouted`` (of those),
            ``forwarded`` (accepted in p's output queue), ``tail_drops`` (refused by it),
            ``tx_frames`` (put on rx_links[p]), ``max_queue_bytes``.
        drops: list of ``SwitchDrop``.
        now: the last cycle stepped.
    """

    def __init__(self, table, num_ports=None, *, latency_cycles=100, queue_bytes=256 * 1024,
                 link_latency_cycles=10, faults=None, seed=0):
        _seed(seed)
        if not isinstance(table, dict):
            raise ValueError(f"table must be a dict MAC -> port, got {table!r}")
        norm = {}
        for mac, port in table.items():
            m = mac_bytes(mac)
            if m in norm:
                raise ValueError(f"table: MAC {m.hex(':')} appears twice")
            norm[m] = _int(f"table[{m.hex(':')}]", port, 0)
        if num_ports is None:
            if not norm:
                raise ValueError("give num_ports or a non-empty table")
            num_ports = max(norm.values()) + 1
        num_ports = _int("num_ports", num_ports, 1)
        for m, port in norm.items():
            if port >= num_ports:
                raise ValueError(f"table: MAC {m.hex(':')} on port {port}, but the switch has {num_ports} ports")
        self.table = norm
        self.latency_cycles = _int("latency_cycles", latency_cycles, 0)
        self.queue_bytes = _int("queue_bytes", queue_bytes, 0)
        _int("link_latency_cycles", link_latency_cycles, 0)
        self._fabric_init(num_ports)
        keys = {}
        for p in range(num_ports):
            keys[("tx", p)] = 2 * p
            keys[("rx", p)] = 2 * p + 1
        specs = _resolve_faults(faults, keys, "Switch")
        self.tx_links, self.rx_links = [], []
        for p in range(num_ports):
            up, down = f"{p}->sw", f"sw->{p}"
            self.tx_links.append(Link(link_latency_cycles, specs[2 * p], f"{seed}/{up}", name=up))
            self.rx_links.append(Link(link_latency_cycles, specs[2 * p + 1], f"{seed}/{down}", name=down))
        self._collect_links()
        self.port_counters = [dict.fromkeys(_SWITCH_COUNTERS, 0) | {"max_queue_bytes": 0}
                              for _ in range(num_ports)]
        self.drops = []
        self._out = [_OutPort() for _ in range(num_ports)]
        self._fwd = []                  # heap of (ready cycle, in port, arrival end, seq, out port, frame)
        self._seq = 0

    @property
    def counters(self):
        """Switch counters summed over ports (``max_queue_bytes``: the largest)."""
        total = dict.fromkeys(_SWITCH_COUNTERS, 0)
        for c in self.port_counters:
            for k in _SWITCH_COUNTERS:
                total[k] += c[k]
        total["max_queue_bytes"] = max(c["max_queue_bytes"] for c in self.port_counters)
        return total

    def _ingress(self, port, d):
        self.port_counters[port]["rx_frames"] += 1
        out = self.table.get(d.frame[:6])
        if out is None:
            self.port_counters[port]["unrouted"] += 1
            self.drops.append(SwitchDrop(d.cycle, port, None, "unrouted", d.frame))
            return
        # same-cycle frames reach the queues in ingress-port order, then arrival order
        heapq.heappush(self._fwd, (d.cycle + self.latency_cycles, port, d.end_bytes, self._seq, out, d.frame))
        self._seq += 1

    def _enqueue(self, ready, in_port, out, frame):
        q = self._out[out]
        c = self.port_counters[out]
        t = BYTES_PER_CYCLE * ready
        while q.queue and q.queue[0][0] <= t:       # frames whose last byte has left by now
            q.queue_bytes -= q.queue.popleft()[1]
        n = len(frame)
        if q.queue_bytes + n > self.queue_bytes:
            c["tail_drops"] += 1
            self.drops.append(SwitchDrop(ready, in_port, out, "tail_drop", frame))
            return
        end = max(t, q.tx_free) + wire_bytes(n)
        q.tx_free = end
        q.queue.append((end, n))
        q.queue_bytes += n
        c["forwarded"] += 1
        c["max_queue_bytes"] = max(c["max_queue_bytes"], q.queue_bytes)
        q.handoff.append((cycle_of_bytes(end), frame, end))

    def step(self, cycle):
        """Advance to ``cycle``.

        Order within a step: ingress arrivals by ``cycle`` are routed; frames whose
        forwarding latency is over reach their output queues (by ready cycle, then
        ingress port); frames whose last byte has left an output port by ``cycle`` go
        on its egress link; arrivals at the endpoints go to the receive buffers. Every
        time comes from the frames' own cycles, so stepping every cycle or only at
        ``next_event_cycle`` gives the same result.
        """
        cycle = self._begin_step(cycle)
        for p in range(self.num_ports):
            for d in self.tx_links[p].deliver(cycle):
                self._ingress(p, d)
        while self._fwd and self._fwd[0][0] <= cycle:
            ready, in_port, _, _, out, frame = heapq.heappop(self._fwd)
            self._enqueue(ready, in_port, out, frame)
        for p in range(self.num_ports):
            q = self._out[p]
            while q.handoff and q.handoff[0][0] <= cycle:
                sent, frame, end = q.handoff.popleft()
                self.rx_links[p].send(frame, sent, end_bytes=end)
                self.port_counters[p]["tx_frames"] += 1
            self._rx[p].extend(self.rx_links[p].deliver(cycle))
        self.now = cycle

    def next_event_cycle(self):
        times = [t for t in (link.next_event_cycle() for link in self._links) if t is not None]
        if self._fwd:
            times.append(self._fwd[0][0])
        times += [q.handoff[0][0] for q in self._out if q.handoff]
        return min(times) if times else None

    @property
    def idle(self):
        return not self._fwd and all(not q.handoff for q in self._out) and all(link.idle for link in self._links)


class Network(Switch):
    """N endpoints (NICs), endpoint i on switch port i.

    Parameters:
        macs: the endpoints' MAC addresses, in port order (int, 6 bytes or string).
        **kwargs: ``Switch`` parameters (latency_cycles, queue_bytes,
            link_latency_cycles, faults, seed).

    Members:
        macs: list of 6-byte MACs; ``port_of(mac)`` gives an endpoint's port.
        Everything of ``Switch``.
    """

    def __init__(self, macs, **kwargs):
        macs = [mac_bytes(m) for m in macs]
        if not macs:
            raise ValueError("Network needs at least one endpoint MAC")
        if len(set(macs)) != len(macs):
            raise ValueError("Network: two endpoints have the same MAC")
        self.macs = macs
        super().__init__({m: i for i, m in enumerate(macs)}, len(macs), **kwargs)

    def port_of(self, mac):
        m = mac_bytes(mac)
        if m not in self.table:
            raise ValueError(f"no endpoint with MAC {m.hex(':')}")
        return self.table[m]

