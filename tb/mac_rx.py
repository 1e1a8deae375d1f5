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

from cocotbext.axi import AxiStreamBus

from spec.params import DATA_BYTES, RX_MAX_FRAME, WIRE_BYTES_PER_CYCLE, wire_bytes

from .clock import IDLE_FOREVER, CycleCounter, EdgeModel
from .memory import sig_high
from .rx_quarters import QuarterPacker

BYTES_PER_CYCLE = int(WIRE_BYTES_PER_CYCLE)


class MacRx400G(EdgeModel):
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
        self._tvalid = False
        self.bus.tvalid.value = 0
        self._attach(self.counter)

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
        self.wake()

    @property
    def idle(self):
        return not self.queue and not self._packer.busy and self._beat is None

    def edge(self, now):
        """Edge ``now``: see whether cycle ``now - 1``'s beat was taken, drive cycle ``now``'s."""
        bus = self.bus
        c = now - 1
        if self.rst is not None and sig_high(self.rst):
            bus.tvalid.value = 0
            self._tvalid = False
            self._beat = None
            return self.stay_awake()
        if self._beat is not None:
            if not sig_high(bus.tready):
                self.stall_cycles += 1
                return self.stay_awake()
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
            if self._tvalid:
                bus.tvalid.value = 0
                self._tvalid = False
            # asleep until a frame is queued (send wakes it), the queued one's edge, or the reset
            if self._packer.busy:
                return self.stay_awake()
            return self.may_sleep(now, self.queue[0][1] if self.queue else IDLE_FOREVER,
                                  [self.rst] if self.rst is not None else [])
        bus.tdata.value = beat.data
        bus.tkeep.value = beat.keep
        bus.tlast.value = beat.last
        bus.tuser.value = beat.user
        bus.tvalid.value = 1
        self._tvalid = True
        self._beat = (beat, started)
        self.stay_awake()
