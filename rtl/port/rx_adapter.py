"""``MacRxAdapter``: the MAC RX AXI-Stream (32-byte frame starts, rtl/common/rx_beat.py,
docs/interfaces.md) as :func:`~rtl.common.rx_beat.RxBeat` beats."""
from amaranth.hdl import *
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from rtl.common.axi import AxiStreamSignature
from rtl.common.rx_beat import RxBeat, QUARTER, QUARTERS
from spec.params import DATA_BYTES

__all__ = ["MacRxAdapter"]

BEAT = DATA_BYTES             # 128 bytes
assert BEAT == QUARTER * QUARTERS


class MacRxAdapter(wiring.Component):
    """Decodes the MAC RX quarter format into receive beats, without latency.

    ``tuser[q]`` (a frame starts at lane ``32 q``) and ``tuser[4 + q]`` (a frame ends in
    quarter q) pass as ``sop`` and ``eop``; ``tlast`` (a frame ends in this beat) says
    nothing more and is dropped. ``ebytes[q]`` is the count of contiguous ``tkeep`` ones
    from lane ``32 q`` within the quarter, for every quarter (32 on a full one, 0 when
    lane ``32 q`` is not kept: with ``eop[q]`` a malformed end the checker refuses); it
    means something only with ``eop[q]``. No state; back-pressure passes straight through.

    Members
    -------
    i : In(AxiStreamSignature(data_width=1024, user_width=8))
        MAC RX (``tdata``, ``tkeep``, ``tvalid``, ``tready``, ``tlast``, ``tuser``), sink.
    o : Out(stream.Signature(RxBeat()))
        The same beats with ``sop``, ``eop`` and ``ebytes``; ``icrc_ok`` = 0.
    """
    def __init__(self):
        super().__init__({"i": In(AxiStreamSignature(data_width=8 * BEAT, user_width=2 * QUARTERS)),
                          "o": Out(stream.Signature(RxBeat(BEAT)))})

    def elaborate(self, platform):
        m = Module()
        for q in range(QUARTERS):
            # The quarter's lanes without keep, and a stop one past its end so that a full
            # quarter counts 32; the lowest of them (one-hot) is the count.
            gaps = Signal(QUARTER + 1, name=f"gaps{q}")
            m.d.comb += gaps.eq(Cat(~self.i.tkeep[QUARTER * q:QUARTER * (q + 1)], 1))
            lowest = Signal(QUARTER + 1, name=f"lowest{q}")
            m.d.comb += lowest.eq(gaps & (~gaps + 1))
            m.d.comb += self.o.p.ebytes[q].eq(
                Cat(*[Cat(*[lowest[j] for j in range(QUARTER + 1) if (j >> b) & 1]).any()
                      for b in range(6)]))

        m.d.comb += [
            self.o.valid.eq(self.i.tvalid),
            self.i.tready.eq(self.o.ready),
            self.o.p.data.eq(self.i.tdata),
            self.o.p.sop.eq(self.i.tuser[:QUARTERS]),
            self.o.p.eop.eq(self.i.tuser[QUARTERS:]),
        ]
        return m
