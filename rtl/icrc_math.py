"""GF(2) matrices of the reflected CRC-32 (zlib polynomial) used by the ICRC unit.

The CRC register starts at zero; the initial value of all ones is applied by
inverting the first 32 message bits instead (equivalent for a linear CRC), so
that zero bytes in front of the message leave the register at zero. Trailing
zero bytes are removed afterwards with the inverse of the zero-byte step.
"""
from functools import lru_cache

POLY = 0xEDB88320


def step(reg, bit):
    reg ^= bit
    return (reg >> 1) ^ (POLY if reg & 1 else 0)


def unstep_zero(reg):
    """Inverse of ``step(reg, 0)``: the POLY xor is visible in bit 31."""
    if reg >> 31:
        return ((reg ^ POLY) << 1) | 1
    return reg << 1


def crc_bits(reg, word, nbits):
    for i in range(nbits):
        reg = step(reg, (word >> i) & 1)
    return reg


@lru_cache(maxsize=None)
def update_matrices(nbits):
    """Columns of A (state) and B (data) with ``reg' = A.reg ^ B.data``: lists of 32-bit masks."""
    a = [crc_bits(1 << i, 0, nbits) for i in range(32)]
    # By linearity, data bit j alone is one step on a zero register followed by
    # (nbits - 1 - j) zero steps.
    effect, r = [], step(0, 1)
    for _ in range(nbits):
        effect.append(r)
        r = step(r, 0)
    b = [effect[nbits - 1 - j] for j in range(nbits)]
    return tuple(a), tuple(b)


@lru_cache(maxsize=None)
def unshift_matrix(nbytes):
    """Columns of the map that removes ``nbytes`` trailing zero bytes from the register."""
    cols = []
    for i in range(32):
        reg = 1 << i
        for _ in range(8 * nbytes):
            reg = unstep_zero(reg)
        cols.append(reg & 0xFFFFFFFF)
    return tuple(cols)
