"""Cycle time base shared by the testbench models.

Convention used by every model in ``tb``: cycle ``k`` is the clock period that
starts at the ``k``-th rising edge after the counter started (the first edge
is cycle 0). Monitors sample at a rising edge, so a valid/ready handshake seen
at the edge that starts cycle ``k + 1`` is recorded as happening in cycle
``k`` (both signals were high during cycle ``k``), and a value a model drives
at that edge is on the bus during cycle ``k + 1``.
"""

import cocotb
from cocotb.simtime import get_sim_time
from cocotb.triggers import RisingEdge
from cocotb.utils import get_sim_steps

from spec.params import CLOCK_PERIOD_NS


class CycleCounter:
    """Counts rising edges of a clock; ``now`` is the current cycle number.

    Parameters:
        clk: clock signal handle (e.g. ``dut.clk``).
        period_ns: clock period, used so that ``now`` is exact even when read
            at a rising edge before this counter's own coroutine has run
            (coroutines woken by the same edge run in no guaranteed order).
    """

    def __init__(self, clk, period_ns=CLOCK_PERIOD_NS):
        if period_ns <= 0:
            raise ValueError(f"clock period must be positive, not {period_ns}")
        self.clk = clk
        self.period_steps = get_sim_steps(period_ns, "ns")
        self.edges = 0           # rising edges counted by the coroutine
        self._t0 = None          # sim time (steps) of edge 0
        self._task = cocotb.start_soon(self._run())

    async def _run(self):
        edge = RisingEdge(self.clk)
        while True:
            await edge
            if self._t0 is None:
                self._t0 = get_sim_time("step")
            self.edges += 1

    @property
    def now(self):
        """Current cycle number (0 before and during the first clock cycle)."""
        if self._t0 is None:
            return 0
        # Derived from time rather than self.edges: race-free at an edge.
        return (get_sim_time("step") - self._t0) // self.period_steps

    def stop(self):
        """Stop counting (``now`` keeps working from sim time)."""
        self._task.cancel()

