"""MAC RX model: frames from the 400 Gb/s wire into the DUT's ``s_axis_rx`` stream.

The beat format is that of MAC TX (docs/interfaces.md, "MAC TX and the wire"): a
frame starts at lane 0, or at lane 64 behind a last beat of at most 64 bytes when it
is longer than 68 bytes (``tuser`` = 1 on that beat), so the NIC receives exactly the
beat stream a peer's MAC TX sends. The MAC is store-and-forward: a frame is handed over
once its last byte has arrived, and then beat after beat without gaps. Frames arrive
at the cycles the caller gives (from a link or switch model), or back to back at the
400G wire rate.
"""
from collections import deque

import cocotb
from cocotb.triggers import RisingEdge
from cocotbext.axi import AxiStreamBus

from spec.params import DATA_BYTES, SEGMENT_BYTES as SEGMENT, WIRE_BYTES_PER_CYCLE, wire_bytes

from .clock import CycleCounter
from .memory import sig_high

BYTES_PER_CYCLE = int(WIRE_BYTES_PER_CYCLE)
LANE64_MIN_FRAME = 69       # the transmit rule: only a frame of more than 68 bytes goes at lane 64


class MacRx400G:
    """Drives the MAC RX stream from a queue of frames.

    Parameters:
        dut: DUT handle with ``<prefix>_tdata/tkeep/tvalid/tready/tlast/tuser``, ``clk``, ``rst``.
        counter: shared :class:`~tb.clock.CycleCounter` (one is made if None).
        prefix: stream signal prefix.

    Members:
        sent: [(frame bytes, first beat cycle, last beat cycle)] handed over.
        stall_cycles: cycles a beat waited for ``tready`` (a real MAC cannot wait: the
            regressions assert it stays 0 at line rate).
    """

    def __init__(self, dut, counter=None, *, prefix="s_axis_rx"):
        self.dut = dut
        self.clk = dut.clk
        self.rst = getattr(dut, "rst", None)
        self.counter = counter if counter is not None else CycleCounter(dut.clk)
        self.bus = AxiStreamBus.from_prefix(dut, prefix)
        self.bus_bytes = len(self.bus.tdata) // 8
        if self.bus_bytes != DATA_BYTES:
            raise ValueError(f"{prefix}_tdata is {self.bus_bytes} bytes wide, expected {DATA_BYTES}")
        self.queue = deque()            # (frame, cycle from which it may be handed over)
        self.sent = []
        self.stall_cycles = 0
        self.wire_end = 0               # arrival end (bytes) of the last frame queued at line rate
        self._cur = None                # [frame, position, first cycle]
        self._beat = None               # (frames ending in this beat, frame starting at lane 64)
        self.bus.tvalid.value = 0
        self._task = cocotb.start_soon(self._run())

    def send(self, frame, cycle=None):
        """Queue ``frame`` (bytes, Ethernet header through ICRC, no FCS).

        ``cycle``: when its last byte has arrived; None: back to back at the 400G wire
        rate behind the frames queued so far (starting now).
        """
        frame = bytes(frame)
        if len(frame) < 1:
            raise ValueError("empty frame")
        if cycle is None:
            start = max(self.wire_end, BYTES_PER_CYCLE * self.counter.now)
            self.wire_end = start + wire_bytes(len(frame))
            cycle = -(-self.wire_end // BYTES_PER_CYCLE)
        self.queue.append((frame, cycle))

    @property
    def idle(self):
        return not self.queue and self._cur is None and self._beat is None

    def _ready_frame(self, now):
        return self.queue[0][0] if self.queue and self.queue[0][1] <= now else None

    def _make_beat(self, now):
        """The next beat: (tdata, tkeep, tlast, tuser) and its bookkeeping, or None."""
        if self._cur is None:
            frame = self._ready_frame(now)
            if frame is None:
                return None
            self.queue.popleft()
            self._cur = [frame, 0, now]
        frame, pos, _ = self._cur
        left = len(frame) - pos
        if left > DATA_BYTES:
            data = frame[pos:pos + DATA_BYTES]
            self._cur[1] += DATA_BYTES
            return int.from_bytes(data, "little"), (1 << DATA_BYTES) - 1, 0, 0, None
        data = frame[pos:]
        keep = (1 << left) - 1
        nxt = self._ready_frame(now)
        if left <= SEGMENT and nxt is not None and len(nxt) >= LANE64_MIN_FRAME:
            self.queue.popleft()
            head = nxt[:SEGMENT]
            word = int.from_bytes(data, "little") | int.from_bytes(head, "little") << (8 * SEGMENT)
            keep |= ((1 << SEGMENT) - 1) << SEGMENT
            return word, keep, 1, 1, nxt
        return int.from_bytes(data, "little"), keep, 1, 0, None

    async def _run(self):
        edge = RisingEdge(self.clk)
        bus = self.bus
        while True:
            await edge
            now = self.counter.now
            c = now - 1
            if self.rst is not None and sig_high(self.rst):
                bus.tvalid.value = 0
                self._beat = None
                continue
            if self._beat is not None:
                if not sig_high(bus.tready):
                    self.stall_cycles += 1
                    continue
                last, nxt = self._beat
                self._beat = None
                if last:
                    frame, _, first = self._cur
                    self.sent.append((frame, first, c))
                    self._cur = [nxt, SEGMENT, c] if nxt is not None else None
            beat = self._make_beat(now)
            if beat is None:
                bus.tvalid.value = 0
                continue
            word, keep, last, user, nxt = beat
            bus.tdata.value = word
            bus.tkeep.value = keep
            bus.tlast.value = last
            bus.tuser.value = user
            bus.tvalid.value = 1
            self._beat = (last, nxt)
