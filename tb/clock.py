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
from cocotb.triggers import RisingEdge, Timer
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
        self._t0 = None          # sim time (steps) of edge 0
        self._task = cocotb.start_soon(self._run())

    async def _run(self):
        # Only edge 0's time is needed: ``now`` follows from sim time, so the counter
        # does not wake Python at every edge.
        await RisingEdge(self.clk)
        self._t0 = get_sim_time("step")

    @property
    def now(self):
        """Current cycle number (0 before and during the first clock cycle)."""
        if self._t0 is None:
            return 0
        # Derived from time: race-free at an edge.
        return (get_sim_time("step") - self._t0) // self.period_steps

    def stop(self):
        """Stop counting (``now`` keeps working from sim time)."""
        self._task.cancel()



async def ClockCycles(clk, n, period_ns=CLOCK_PERIOD_NS):
    """Wait for ``n`` rising edges of ``clk``, as cocotb's ``ClockCycles`` does, but with
    Python woken twice, not ``n`` times: at the first edge, then half a period before the
    last (a timer), then at the last. ``clk`` must run at ``period_ns`` (the engine's
    clock); the time at the last edge is checked, so a clock of another period fails
    here instead of shifting a test's cycles."""
    if n <= 3:
        for _ in range(n):
            await RisingEdge(clk)
        return
    await RisingEdge(clk)
    period = get_sim_steps(period_ns, "ns")
    first = get_sim_time("step")
    await Timer((n - 2) * period + period // 2, "step")
    await RisingEdge(clk)
    if get_sim_time("step") - first != (n - 1) * period:
        raise RuntimeError(f"ClockCycles: {clk._path} does not run at {period_ns} ns "
                           f"({n} edges took {get_sim_time('step') - first} steps after the first)")
