"""MAC TX + 400 Gb/s wire model on the DUT's ``m_axis_tx`` stream.

Pacing rule (docs/interfaces.md, "MAC TX and the wire"): wire time runs in
byte units, cycle c spans [100c, 100c+100). A frame of L captured bytes costs
``wire_bytes(L)`` = L + 24. A beat is accepted in cycle c only when the last
frame that ended has left the wire by 100*(c+1); a frame starts at
max(100c, previous end). So a first beat waits for the wire and the other beats
of a frame that started at lane 0 always pass.

Segments: ``tuser[0]`` = 1 on a beat means the current frame ends in lanes 0..63
(tkeep lanes 0..n-1) and the next frame starts at lane 64 (tkeep lanes 64..127); with
``tuser[1]`` = 1 as well, that frame also ends in this beat (tkeep lanes 64..64+m-1):
two whole frames of at most 64 bytes in one beat (the NIC's ACK pairs).
"""

import struct
from dataclasses import dataclass

import cocotb
from cocotb.triggers import Event, First, RisingEdge
from cocotbext.axi import AxiStreamBus

from spec.params import DATA_BYTES, SEGMENT_BYTES as SEGMENT, WIRE_BYTES_PER_CYCLE, WIRE_GBPS, wire_bytes

from .clock import ClockCycles, CycleCounter, EdgeModel
from .memory import sig_high, sig_uint

BYTES_PER_CYCLE = int(WIRE_BYTES_PER_CYCLE)
NS_PER_BYTE = 8 / WIRE_GBPS              # 0.02 ns at 400 Gb/s
PCAP_MAGIC_NS = 0xA1B23C4D
LINKTYPE_ETHERNET = 1


class WireProtocolError(Exception):
    """The DUT broke an AXI4-Stream rule of the MAC TX port."""


@dataclass
class WireFrame:
    """One frame as sent on the wire.

    Fields: ``data`` (captured bytes, no FCS); ``first_cycle``/``last_cycle``
    (cycles of the first and last beat handshakes); ``start_bytes``/``end_bytes``
    (wire time in byte units, end = start + wire_bytes(len)).
    """
    data: bytes
    first_cycle: int
    last_cycle: int
    start_bytes: int
    end_bytes: int

    @property
    def start_ns(self):
        """Wire start time in ns (1 byte = 0.02 ns)."""
        return self.start_bytes * NS_PER_BYTE

    @property
    def end_ns(self):
        return self.end_bytes * NS_PER_BYTE

    def __len__(self):
        return len(self.data)


def write_pcap(path, frames):
    """Write ``frames`` (objects with ``data`` and ``start_ns``) as a nanosecond pcap.

    Parameters:
        path: output file path.
        frames: iterable of frames; timestamps are start_ns rounded to integer ns.
    """
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", PCAP_MAGIC_NS, 2, 4, 0, 0, 65535, LINKTYPE_ETHERNET))
        for fr in frames:
            ts = int(round(fr.start_ns))
            sec, nsec = divmod(ts, 1_000_000_000)
            f.write(struct.pack("<IIII", sec, nsec, len(fr.data), len(fr.data)))
            f.write(fr.data)


class Wire400G(EdgeModel):
    """Drives ``tready`` of the MAC TX stream by the 400G wire rule and records frames.

    Parameters:
        dut: DUT handle with ``<prefix>_tdata/tkeep/tvalid/tready/tlast``, ``clk``, ``rst``.
        counter: shared :class:`~tb.clock.CycleCounter` (one is made if None).
        prefix: stream signal prefix.
        strict: raise :class:`WireProtocolError` on a bad tkeep (else log and
            count in ``protocol_errors``).
    """

    def __init__(self, dut, counter=None, *, prefix="m_axis_tx", strict=True):
        self.dut = dut
        self.clk = dut.clk
        self.rst = getattr(dut, "rst", None)
        self.counter = counter if counter is not None else CycleCounter(dut.clk)
        self.strict = strict
        self.log = dut._log.getChild("wire")
        self.bus = AxiStreamBus.from_prefix(dut, prefix)
        for name in ("tvalid", "tready", "tlast"):
            if not hasattr(self.bus, name):
                raise ValueError(f"{prefix}_{name} is missing")
        self._tkeep = getattr(self.bus, "tkeep", None)
        self._tuser = getattr(self.bus, "tuser", None)
        self.bus_bytes = len(self.bus.tdata) // 8
        if self.bus_bytes != DATA_BYTES:
            raise ValueError(f"{prefix}_tdata is {self.bus_bytes} bytes wide, expected {DATA_BYTES}")

        self.frames = []
        self.protocol_errors = 0
        self.underrun_cycles = 0        # wire cycles frames lost to stalls inside them
        self.prev_end = 0               # wire end (bytes) of the last frame
        self._cur = None                # bytearray of the frame being received
        self._first_cycle = 0
        self._start = 0
        self._event = Event()
        self._ready = 0
        self.bus.tready.value = 0
        self._attach(self.counter)

    def _error(self, msg):
        self.protocol_errors += 1
        self.log.error(msg)
        if self.strict:
            raise WireProtocolError(msg)

    def _drive_ready(self, v):
        if v != self._ready:
            self.bus.tready.value = v
            self._ready = v

    def edge(self, now):
        """Edge ``now``: take cycle ``now - 1``'s beat, drive ``tready`` for cycle ``now``."""
        bus = self.bus
        full = (1 << self.bus_bytes) - 1
        c = now - 1
        if self.rst is not None and sig_high(self.rst):
            self._cur = None
            self._drive_ready(0)
            self.stay_awake()
            return
        valid = sig_high(bus.tvalid)
        if self._ready and valid:
            keep = sig_uint(self._tkeep) if self._tkeep is not None else full
            last = sig_high(bus.tlast)
            user = sig_uint(self._tuser) if self._tuser is not None else 0
            second, both = bool(user & 1), bool(user & 2)
            raw = sig_uint(bus.tdata).to_bytes(self.bus_bytes, "little")
            hi = keep >> SEGMENT
            if both and not second:
                self._error(f"tuser {user:#x}: bit 1 (frame at lane 64 ends here) without bit 0 (cycle {c})")
                both = False
            if second:
                # the current frame ends in lanes 0..63, the next starts at lane 64
                lo = keep & ((1 << SEGMENT) - 1)
                hi_ok = (hi != 0 and not hi & (hi + 1)) if both else hi == (1 << SEGMENT) - 1
                if not last or not hi_ok or lo == 0 or lo & (lo + 1):
                    self._error(f"tuser {user:#x} beat: tlast {last}, tkeep {keep:#x} is not "
                                f"(lanes 0..n-1 of 64) + lanes 64..{'64+m-1' if both else '127'} (cycle {c})")
                keep = lo
            elif not last and keep != full:
                self._error(f"tkeep {keep:#x} not all ones on a non-last beat (cycle {c})")
            elif keep == 0 or keep & (keep + 1):
                self._error(f"tkeep {keep:#x} on the last beat is not contiguous from lane 0 (cycle {c})")
            data = raw[:keep.bit_length()]
            if self._cur is None:
                self._begin(c)
                self._cur = bytearray(data)
            else:
                self._cur += data
            if last:
                self._end(c)
            if second:
                self._begin(c)
                self._cur = bytearray(raw[SEGMENT:SEGMENT + hi.bit_length()] if both else raw[SEGMENT:])
                if both:
                    self._end(c)
        # Back-pressure: a beat goes in cycle c only when the last frame that ended
        # leaves the wire by the end of c. A frame's first beat thus waits for the
        # wire; later beats of a frame that started at lane 0 always pass.
        self._drive_ready(int(self.prev_end <= BYTES_PER_CYCLE * (now + 1)))
        # Asleep while nothing can pass: tready high and tvalid low (until tvalid rises),
        # or tready low (until the edge that raises it: no beat passes meanwhile).
        if self._ready:
            if valid:
                return self.stay_awake()
            return self.may_sleep(now, watch=[bus.tvalid] + ([self.rst] if self.rst is not None else []))
        self.may_sleep(now, -(-self.prev_end // BYTES_PER_CYCLE) - 1, [self.rst] if self.rst is not None else [])

    def _end(self, c):
        # A frame whose beats stalled (tvalid low inside it) leaves no earlier than its
        # last beat: the stall is counted (``underrun_cycles``), its wire end moved behind
        # it. Without a stall the end is start + wire bytes, which is always later.
        end = self._start + wire_bytes(len(self._cur))
        if end < BYTES_PER_CYCLE * c:
            if not self.underrun_cycles:
                self.log.warning(f"a {len(self._cur)}-byte frame stalled inside (last beat in cycle {c}): "
                                 f"a real MAC would underrun (counted in underrun_cycles)")
            self.underrun_cycles += -(-(BYTES_PER_CYCLE * c - end) // BYTES_PER_CYCLE)
            end = BYTES_PER_CYCLE * c
        frame = WireFrame(bytes(self._cur), self._first_cycle, c, self._start, end)
        self.frames.append(frame)
        self.prev_end = frame.end_bytes
        self._cur = None
        self._event.set()

    def _begin(self, c):
        self._first_cycle = c
        self._start = max(BYTES_PER_CYCLE * c, self.prev_end)

    async def wait_frames(self, n, timeout_cycles=100_000):
        """Wait until at least ``n`` frames were received in total.

        Raises TimeoutError (saying how many came) after ``timeout_cycles``.
        """
        end = self.counter.now + timeout_cycles
        while len(self.frames) < n:
            left = end - self.counter.now
            if left <= 0:
                raise TimeoutError(f"wire: waited {timeout_cycles} cycles for {n} frames, "
                                   f"got {len(self.frames)}")
            self._event.clear()
            timer = cocotb.start_soon(ClockCycles(self.clk, left))
            await First(self._event.wait(), timer)
            if not timer.done():
                timer.cancel()
        return self.frames[:n]

    # ---- statistics -----------------------------------------------------------------
    def _slice(self, first, last):
        frames = self.frames[first:last]
        if not frames:
            raise ValueError(f"no frames in [{first}:{last}] (have {len(self.frames)})")
        return frames

    def throughput(self, first=0, last=None, *, wire=False):
        """Gb/s over frames[first:last], from the first start to the last end.

        ``wire=False`` counts captured frame bytes; ``wire=True`` counts wire
        bytes (frame + 24), which gives 400.0 on a saturated wire.
        """
        frames = self._slice(first, last)
        span = frames[-1].end_bytes - frames[0].start_bytes
        total = sum(wire_bytes(len(f.data)) if wire else len(f.data) for f in frames)
        return total * WIRE_GBPS / span

    def packet_rate(self, first=0, last=None):
        """Million frames per second over frames[first:last] (first start to last end)."""
        frames = self._slice(first, last)
        span_ns = frames[-1].end_ns - frames[0].start_ns
        return len(frames) / span_ns * 1e3

    def utilization(self, first=0, last=None):
        """Fraction of wire time used over frames[first:last]."""
        return self.throughput(first, last, wire=True) / WIRE_GBPS

    def write_pcap(self, path):
        """Write all frames to a nanosecond pcap (Ethernet, no FCS, ts = start_ns)."""
        write_pcap(path, self.frames)
