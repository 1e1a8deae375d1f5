"""The fault-injection matrix of the RC regressions (no cocotb import: pytest reads it too).

Two suites run it, each cell a cocotb test ``faults_<kind>_<rate>``: tb/suites/pair.py
(two engines, WRITEs, READs, atomics, SENDs and WRITEs with immediate) and
tb/suites/two_sided.py (one engine, the golden responder with receive queues as its peer).
``make test`` runs both on Verilator; ``make faults`` runs every cell on both simulators
(``cases``).
"""
import os

from model.network import COUNTER_OF, FAULT_KINDS as KINDS

RATES = (0.001, 0.01, 0.05)
SEED = 7
PEER_SEED = 3
SIMULATORS = ("icarus", "verilator")


def messages(rate):
    """WRITEs per QP of the two-engine cells: enough frames that a 0.1% rate still
    injects faults (about 2000 frames)."""
    return 192 if rate < 0.005 else 48


def peer_messages(rate):
    """Messages per QP (two QPs) of the golden-peer cells: at 0.1%, about 500 frames to the peer."""
    return 192 if rate < 0.005 else 64


def test_name(kind, rate):
    return f"faults_{kind}_{str(rate).replace('.', 'p')}"


def counter(kind):
    """The ``Link`` counter that counts faults of ``kind``."""
    return COUNTER_OF[kind]


def define_tests(namespace, body, seed, doc):
    """One cocotb test per cell in ``namespace`` (a suite's ``globals()``), each awaiting
    ``body(dut, kind, rate, seed)``; ``doc``: its docstring, formatted with kind and percent."""
    import cocotb

    def make(kind, rate):
        async def test(dut):
            await body(dut, kind, rate, seed)
        test.__name__ = test.__qualname__ = test_name(kind, rate)
        test.__doc__ = doc.format(kind=kind, percent=f"{100 * rate:g}")
        return cocotb.test()(test)
    for kind in KINDS:
        for rate in RATES:
            namespace[test_name(kind, rate)] = make(kind, rate)


def cases(icarus_rates=()):
    """``(sim, test)`` pairs for pytest. ``make test``: every cell on Verilator, the cells
    at ``icarus_rates`` on Icarus too. ``make faults`` sets IBGDA_FAULT_SIMS (simulator
    names, space-separated): every cell on each of them."""
    env = os.environ.get("IBGDA_FAULT_SIMS")
    if env is None:
        return [("verilator", n) for n in NAMES] + \
            [("icarus", test_name(k, r)) for k in KINDS for r in RATES if r in icarus_rates]
    sims = env.split()
    if not sims or any(s not in SIMULATORS for s in sims):
        raise ValueError(f"IBGDA_FAULT_SIMS={env!r}: give some of {SIMULATORS}, space-separated")
    return [(s, n) for s in sims for n in NAMES]


NAMES = [test_name(k, r) for k in KINDS for r in RATES]
