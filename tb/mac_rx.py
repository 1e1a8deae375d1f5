"""MAC RX model: frames from the 400 Gb/s wire into the DUT's ``s_axis_rx`` stream.

The beat format (docs/interfaces.md, "MAC RX") starts frames on 32-byte boundaries:
``tuser`` bit q flags a frame start at lane ``32 q``, bit ``4 + q`` a frame end in
quarter q, ``tkeep`` the frame bytes (tb/rx_quarters.py builds the beats). The MAC is
store-and-forward: a frame is handed over once its last byte has arrived, and then
beat after beat without gaps; a frame that is ready when a beat is built starts in its
first free quarter. Frames arrive at the cycles the caller gives (from a link or
switch model), or back to back at the 400G wire rate.
"""
from collections import deque

import cocotb
from cocotb.triggers import Event, First, RisingEdge
from cocotbext.axi import AxiStreamBus

from spec.params import DATA_BYTES, RX_MAX_FRAME, WIRE_BYTES_PER_CYCLE, wire_bytes

from .clock import ClockCycles, CycleCounter
from .memory import IDLE_FOREVER, IDLE_MIN, sig_high
from .rx_quarters import QuarterPacker

BYTES_PER_CYCLE = int(WIRE_BYTES_PER_CYCLE)


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
        self._packer = QuarterPacker()
        self._open = deque()            # [frame, first beat cycle] of frames started, not ended
        self._beat = None               # (beat on the bus, frames starting in it)
        self._queued = Event()          # a frame was queued (wakes the idle model)
        self.bus.tvalid.value = 0
        self._task = cocotb.start_soon(self._run())

    def send(self, frame, cycle=None):
        """Queue ``frame`` (bytes, Ethernet header through ICRC, no FCS).

        ``cycle``: when its last byte has arrived; None: back to back at the 400G wire
        rate behind the frames queued so far (starting now).
        """
        frame = bytes(frame)
        if not 1 <= len(frame) <= RX_MAX_FRAME:
            raise ValueError(f"a MAC hands over frames of 1..{RX_MAX_FRAME} bytes, not {len(frame)}")
        if cycle is None:
            start = max(self.wire_end, BYTES_PER_CYCLE * self.counter.now)
            self.wire_end = start + wire_bytes(len(frame))
            cycle = -(-self.wire_end // BYTES_PER_CYCLE)
        self.queue.append((frame, cycle))
        self._queued.set()

    @property
    def idle(self):
        return not self.queue and not self._packer.busy and self._beat is None

    async def _run(self):
        edge = RisingEdge(self.clk)
        bus = self.bus
        at_edge = False
        while True:
            if not at_edge:
                await edge
            at_edge = False
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
                beat, started = self._beat
                self._beat = None
                self._open.extend([f, c] for f in started)
                for _ in beat.ended:
                    frame, first = self._open.popleft()
                    self.sent.append((frame, first, c))
            started = []

            def peek():
                return self.queue[0][0] if self.queue and self.queue[0][1] <= now else None

            def pop():
                started.append(self.queue.popleft()[0])

            beat = self._packer.beat(peek, pop)
            if beat is None:
                bus.tvalid.value = 0
                at_edge = await self._sleep(now)
                continue
            bus.tdata.value = beat.data
            bus.tkeep.value = beat.keep
            bus.tlast.value = beat.last
            bus.tuser.value = beat.user
            bus.tvalid.value = 1
            self._beat = (beat, started)

    async def _sleep(self, now):
        """With no beat on the bus and none to build: sleep until a frame is queued, the
        queued one's ready edge, or the reset, instead of waking at every edge. True when
        it woke at an edge still to be handled. (A frame queued while asleep is looked at
        from the next edge on, as it was when this ran at every edge before the sender.)"""
        if self._packer.busy or (self.rst is not None and sig_high(self.rst)):
            return False
        due = self.queue[0][1] if self.queue else IDLE_FOREVER
        if due - now < IDLE_MIN:
            return False
        self._queued.clear()
        watch = [self._queued.wait()] + ([RisingEdge(self.rst)] if self.rst is not None else [])
        timed = None
        if due != IDLE_FOREVER:
            timed = cocotb.start_soon(ClockCycles(self.clk, due - now))
            watch.append(timed)
        await First(*watch)
        if timed is None:
            return False
        if not timed.done():
            timed.cancel()
            return False
        return True
