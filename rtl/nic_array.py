"""Several engines in one design, for system tests of NICs talking to each other."""
from amaranth.hdl import *
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from .top import IbgdaNic

__all__ = ["NicArray"]


class NicArray(wiring.Component):
    """``count`` independent :class:`IbgdaNic` engines on one clock, ports prefixed ``n<i>_``.

    The NICs share nothing but ``clk`` and ``rst``: the testbench connects NIC i's MAC
    TX to NIC j's MAC RX through its link or switch model, and gives each its own GPU
    memory, doorbells and control path. A cocotb simulation has one top level, so this
    wrapper is how two or more RTL engines meet.

    Parameters
    ----------
    count : int
        Number of NICs (>= 2).
    **params
        Passed to every :class:`IbgdaNic` (e.g. ``num_qps``).

    Members
    -------
    n<i>_<port> : the ports of NIC i, as ``IbgdaNic`` names them.
    """
    def __init__(self, count=2, **params):
        if not isinstance(count, int) or count < 2:
            raise ValueError(f"count must be an integer >= 2, not {count!r}")
        self.count = count
        self.nics = [IbgdaNic(**params) for _ in range(count)]
        members = {}
        for i, nic in enumerate(self.nics):
            for name, member in nic.signature.members.items():
                members[f"n{i}_{name}"] = member
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        for i, nic in enumerate(self.nics):
            m.submodules[f"nic{i}"] = nic
            for name, member in nic.signature.members.items():
                outer, inner = getattr(self, f"n{i}_{name}"), getattr(nic, name)
                if member.flow == Out:
                    m.d.comb += outer.eq(inner)
                else:
                    m.d.comb += inner.eq(outer)
        return m
