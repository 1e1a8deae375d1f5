"""Cycle time base shared by the testbench models.

Convention used by every model in ``tb``: cycle ``k`` is the clock period that
starts at the ``k``-th rising edge after the counter started (the first edge
is cycle 0). Monitors sample at a rising edge, so a valid/ready handshake seen
at the edge that starts cycle ``k + 1`` is recorded as happening in cycle
``k`` (both signals were high during cycle ``k``), and a value a model drives
at that edge is on the bus during cycle ``k + 1``.
"""

import os

import cocotb
from cocotb.simtime import get_sim_time
from cocotb.triggers import First, RisingEdge, Timer
from cocotb.utils import get_sim_steps

from spec.params import CLOCK_PERIOD_NS


IDLE_MIN = 4                # a model sleeps after this many idle edges, for this many at least
IDLE_FOREVER = float("inf")
# IBGDA_TB_SLEEP=0: the models never sleep (stepped at every edge, as before issue 47);
# test_scenario holds the two to the same handshakes, cycle for cycle
SLEEP = os.environ.get("IBGDA_TB_SLEEP", "1") != "0"


class CycleCounter:
    """Counts rising edges of a clock; ``now`` is the current cycle number; steps the
    per-cycle models attached to it (:class:`EdgeModel`).

    Parameters:
        clk: clock signal handle (e.g. ``dut.clk``).
        period_ns: clock period, used so that ``now`` is exact even when read
            at a rising edge before this counter's own coroutine has run
            (coroutines woken by the same edge run in no guaranteed order).

    The models are stepped by one coroutine at every edge, in the order they were
    attached, as their own coroutines ran when each woke at every edge: started before
    any test's, they run first at an edge, so a frame or burst a test looks at in that
    edge is already recorded. A model asleep costs a comparison at an edge.
    """

    def __init__(self, clk, period_ns=CLOCK_PERIOD_NS):
        if period_ns <= 0:
            raise ValueError(f"clock period must be positive, not {period_ns}")
        self.clk = clk
        self.period_steps = get_sim_steps(period_ns, "ns")
        self._t0 = None          # sim time (steps) of edge 0
        self._models = []
        self._task = cocotb.start_soon(self._run())

    def attach(self, model):
        """Step ``model`` (an :class:`EdgeModel`) at every edge it is awake at, from the
        next edge on."""
        self._models.append(model)
        if self._task.done():
            self._task = cocotb.start_soon(self._dispatch())

    async def _run(self):
        await RisingEdge(self.clk)
        self._t0 = get_sim_time("step")
        if self._models:
            self._step()
            await self._dispatch()

    async def _dispatch(self):
        # One coroutine wakes at every edge while models are attached (it stays first in
        # line at each edge; a model's own coroutine, woken inside an edge, would be
        # resumed at the next one after the tests' coroutines): the models asleep are
        # skipped, the others stepped.
        edge = RisingEdge(self.clk)
        while True:
            await edge
            self._step()

    def _step(self):
        now = self.now
        for m in self._models:
            if m._due is None:
                m.edge(now)
            elif m._woken or now >= m._due:
                m._wake_up()
                m.edge(now)

    @property
    def now(self):
        """Current cycle number (0 before and during the first clock cycle)."""
        if self._t0 is None:
            return 0
        # Derived from time: race-free at an edge.
        return (get_sim_time("step") - self._t0) // self.period_steps


class EdgeModel:
    """A testbench model stepped at clock edges by a :class:`CycleCounter`: ``edge(now)``
    handles edge ``now`` (samples the handshakes of cycle ``now - 1``, drives cycle
    ``now``). After an edge it may call :meth:`may_sleep`: it is then not stepped again
    before edge ``due`` unless one of ``watch`` rises or :meth:`wake` is called (a frame
    queued); then it is stepped from the next edge on. Stepping a model at an edge it
    could have slept through is always right; sleeping is only allowed while nothing
    can happen at its ports."""

    def _attach(self, counter):
        self._due = None            # None: step at every edge; else the edge to wake at
        self._woken = False
        self._watcher = None
        self._idle_edges = 0
        self._counter = counter
        counter.attach(self)

    def may_sleep(self, now, due=IDLE_FOREVER, watch=()):
        """Edge ``now`` found nothing to do and nothing due before edge ``due``: after
        ``IDLE_MIN`` such edges in a row, sleep until ``due`` or a rise of ``watch``."""
        if due - now < IDLE_MIN or not SLEEP:
            self._idle_edges = 0
            return
        self._idle_edges += 1
        if self._idle_edges >= IDLE_MIN:
            self._due = due
            if watch:
                self._watcher = cocotb.start_soon(self._watch(watch))

    def stay_awake(self):
        """The edge handled had work: the idle count starts again."""
        self._idle_edges = 0

    async def _watch(self, signals):
        await First(*(RisingEdge(s) for s in signals))
        self.wake()

    def wake(self):
        """Step from the next edge on (called while asleep: a rise, a frame queued)."""
        if self._due is not None:
            self._woken = True

    def _wake_up(self):
        self._due = None
        self._woken = False
        self._idle_edges = 0
        if self._watcher is not None:
            if not self._watcher.done():
                self._watcher.cancel()
            self._watcher = None


async def ClockCycles(clk, n, period_ns=CLOCK_PERIOD_NS):
    """Wait for ``n`` rising edges of ``clk``, as cocotb's ``ClockCycles`` does, but with
    Python woken three times, not ``n``: at the first edge, then half a period before the
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
