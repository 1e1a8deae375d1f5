"""Ports of a wiring level that stand for ports of the blocks inside it.

A role's wiring file (``rtl/<role>/path.py``) is a Component whose ports are some of its
blocks' ports, unchanged: :func:`members` copies their signature members (optionally
renamed) and :func:`forward` connects each outer port to the inner one, by flow, with no
logic in between (a port of the wiring level is a wire, never a register).
"""
from amaranth.hdl import Module
from amaranth.lib import wiring

__all__ = ["members", "forward", "WiringLevel"]


def members(block, names):
    """Signature members of ``block`` for a wrapper: ``names`` maps each outer name to the
    block's member name (an iterable of names keeps them)."""
    names = names if isinstance(names, dict) else {n: n for n in names}
    sig = block.signature.members
    return {outer: sig[inner] for outer, inner in names.items()}


def forward(m, outer, block, names):
    """Connect the ports ``names`` (as in :func:`members`) of the wrapper ``outer`` to those
    of ``block``: interfaces with ``wiring.connect``, plain ports with a comb assignment
    in the direction of their flow."""
    names = names if isinstance(names, dict) else {n: n for n in names}
    for outer_name, inner_name in names.items():
        member = block.signature.members[inner_name]
        mine, theirs = getattr(outer, outer_name), getattr(block, inner_name)
        if member.is_signature:
            wiring.connect(m, wiring.flipped(mine), theirs)
        elif member.flow == wiring.Out:
            m.d.comb += mine.eq(theirs)
        else:
            m.d.comb += theirs.eq(mine)


class WiringLevel(wiring.Component):
    """Base of a role's wiring file: ``blocks`` (submodule name -> Component) and ``ports``
    (a list of (block, names) as in :func:`members`) that become the level's own ports;
    ``extra`` adds ports the level drives itself. :meth:`wire` returns the module with the
    blocks added and those ports forwarded; the subclass connects the blocks to each other."""
    def __init__(self, blocks, ports, extra=None):
        self._blocks, self._ports = blocks, ports
        sig = {}
        for block, names in ports:
            sig |= members(block, names)
        super().__init__(sig | (extra or {}))

    def wire(self):
        m = Module()
        for name, block in self._blocks.items():
            m.submodules[name] = block
        for block, names in self._ports:
            forward(m, self, block, names)
        return m
