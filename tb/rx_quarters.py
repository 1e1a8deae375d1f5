"""The MAC RX beat format (32-byte frame starts), built beat by beat.

One definition of how frames are packed into ``s_axis_rx`` beats, shared by the cocotb
MAC RX model (tb/mac_rx.py) and the block tests of the receive path: a frame starts at
the first free quarter (32 bytes) of a beat and runs through the following beats
without gaps. A frame takes at least two quarters (behind a frame of 32 bytes or less
one quarter stays empty), and a frame of 32 bytes or less never starts in the last
quarter: so a beat holds at most two frame starts and two frame ends. ``tuser`` bit q
flags a start at lane ``32 q``, bit ``4 + q`` an end in quarter q; ``tkeep`` marks the
frame bytes.
"""
QUARTER = 32
QUARTERS = 4
BEAT = QUARTER * QUARTERS


class QuarterBeat:
    """One beat: ``data``/``keep`` as integers (lane 0 in the low bits), ``sop``/``eop``
    4-bit masks, ``ended``: the frames that end in it, in order."""
    __slots__ = ("data", "keep", "sop", "eop", "ended")

    def __init__(self):
        self.data = self.keep = self.sop = self.eop = 0
        self.ended = []

    @property
    def last(self):
        return int(self.eop != 0)

    @property
    def user(self):
        return self.sop | self.eop << QUARTERS

    def ebytes(self, q):
        """Bytes of the frame ending in quarter q (0 without an end there)."""
        if not self.eop >> q & 1:
            return 0
        return bin(self.keep >> (QUARTER * q) & ((1 << QUARTER) - 1)).count("1")


class QuarterPacker:
    """Packs frames into MAC RX beats as they become ready.

    ``beat(peek, pop)`` builds the next beat: the rest of the frame in progress, then,
    while quarters are free, the frames that may start now: ``peek()`` returns the next
    one (or None), ``pop()`` takes it. Returns None when there is nothing to send.
    """
    def __init__(self):
        self._cur = None        # (frame, position)
        self._gap = 0           # quarters that must stay empty before the next start

    @property
    def busy(self):
        return self._cur is not None

    def beat(self, peek, pop):
        b = QuarterBeat()
        q = 0
        if self._cur is not None:
            frame, pos = self._cur
            q = self._place(b, frame, pos, 0)
        while q < QUARTERS:
            if self._gap:
                skip = min(self._gap, QUARTERS - q)
                q += skip
                self._gap -= skip
                continue
            frame = peek()
            if frame is None:
                break
            frame = bytes(frame)
            if not frame:
                raise ValueError("empty frame")
            if len(frame) <= QUARTER and q == QUARTERS - 1:
                break           # it would be a third frame end in this beat
            pop()
            b.sop |= 1 << q
            q = self._place(b, frame, 0, q)
        if b.sop == 0 and b.eop == 0 and self._cur is None and not b.keep:
            return None
        return b

    def _place(self, b, frame, pos, q):
        """Put ``frame[pos:]`` from quarter q on; returns the next free quarter."""
        room = (QUARTERS - q) * QUARTER
        part = frame[pos:pos + room]
        lane = q * QUARTER
        b.data |= int.from_bytes(part, "little") << (8 * lane)
        b.keep |= ((1 << len(part)) - 1) << lane
        if pos + len(part) < len(frame):
            self._cur = (frame, pos + len(part))
            return QUARTERS
        self._cur = None
        end_q = q + (len(part) - 1) // QUARTER
        b.eop |= 1 << end_q
        b.ended.append(frame)
        # a frame takes at least two quarters: after a one-quarter frame, one stays empty
        self._gap = 1 if len(frame) <= QUARTER else 0
        return end_q + 1


def pack(frames):
    """All ``frames`` back to back: the list of :class:`QuarterBeat`."""
    frames = list(frames)
    pos = [0]

    def peek():
        return frames[pos[0]] if pos[0] < len(frames) else None

    def pop():
        pos[0] += 1

    packer = QuarterPacker()
    beats = []
    while True:
        b = packer.beat(peek, pop)
        if b is None:
            return beats
        beats.append(b)
