"""Memory regions: the responder's memory-key check (golden model of rtl/responder/mr_table.py).

A region is found by its key's index (``key >> 8``, mlx5 style: the low byte is a
variant tag that must match too). A request is allowed when the region is valid, the
full key matches, the protection domains match, the region grants every right asked
for, and ``[addr, addr + length)`` lies inside ``[base, base + length)``. A zero-length
request needs no region (IBA: the R_Key of a zero-length transfer is not checked).
"""
from dataclasses import dataclass

from spec.formats import MrCheck


@dataclass(frozen=True)
class MemoryRegion:
    key: int
    base: int
    length: int
    access: int
    pd: int
    valid: bool = True


def check(region, key, addr, length, access, pd):
    """The MrCheck outcome of a request against ``region`` (None: no region at that index)."""
    if length == 0:
        return MrCheck.OK
    if region is None or not region.valid or region.key != key:
        return MrCheck.BAD_KEY
    if region.pd != pd:
        return MrCheck.PD
    if access & ~region.access:
        return MrCheck.RIGHTS
    if addr < region.base or addr + length > region.base + region.length:
        return MrCheck.BOUNDS
    return MrCheck.OK
