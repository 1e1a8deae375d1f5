"""The fault-injection matrix of the two-NIC regressions (no cocotb import: pytest reads it too)."""
KINDS = ("drop", "corrupt", "duplicate", "reorder", "delay")
RATES = (0.01, 0.05)
SEED = 7


def test_name(kind, rate):
    return f"faults_{kind}_{str(rate).replace('.', 'p')}"


NAMES = [test_name(k, r) for k in KINDS for r in RATES]
