"""The fault-injection matrix of the two-NIC regressions (no cocotb import: pytest reads it too)."""
from model.network import FAULT_KINDS as KINDS

RATES = (0.001, 0.01, 0.05)
SEED = 7


def messages(rate):
    """WRITEs per QP: enough frames that a 0.1% rate still injects faults (about 2000 frames)."""
    return 192 if rate < 0.005 else 48


def test_name(kind, rate):
    return f"faults_{kind}_{str(rate).replace('.', 'p')}"


NAMES = [test_name(k, r) for k in KINDS for r in RATES]
