"""GF(2) matrices of the reflected CRC-32 (zlib polynomial) used by the ICRC unit.

The CRC register starts at zero; the initial value of all ones is applied by
inverting the first 32 message bits instead (equivalent for a linear CRC), so
that zero bytes in front of the message leave the register at zero. Trailing
zero bytes are removed afterwards with the inverse of the zero-byte step.

Shared by the transmit unit (``icrc_inserter``) and the receive check
(``icrc_checker``): the matrices, ``apply`` (a matrix times a signal) and the
byte masks of a frame's first segment (``first_segment_masks``).
"""
from functools import lru_cache

from amaranth.hdl import C, Cat

from spec import formats as F

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


def apply(cols, value, width):
    """GF(2) matrix (columns as 32-bit masks) times ``value``: a 32-bit value of XOR trees."""
    out = []
    for i in range(32):
        taps = [value[j] for j in range(width) if (cols[j] >> i) & 1]
        out.append(Cat(*taps).xor() if taps else C(0, 1))
    return Cat(*out)


def first_segment_masks(nbytes):
    """Masks, as ints over the bits of a frame's first ``nbytes`` bytes, for its first beat.

    Returns ``(first_mask, first_zero, ones)``: the message is
    ``(data & first_mask & ~first_zero) | ones``. ``first_mask`` drops the bytes in
    front of the message (byte ``ICRC_START`` on); ``first_zero`` clears prefix bytes
    0..3 (0xFF xor the all-ones initial register, see the module docstring); ``ones``
    sets prefix bytes 4..7 and the variant fields of ``ICRC_MASKED``. All lie in the
    first 64 bytes, so they fit a frame that starts at lane 64 when shifted there.
    """
    start = 8 * F.ICRC_START
    first_mask = ((1 << (8 * nbytes)) - 1) & ~((1 << start) - 1)
    first_zero = ((1 << 32) - 1) << start
    ones = 0xFFFFFFFF << (8 * (F.ICRC_START + 4))
    for o, width in F.ICRC_MASKED:
        ones |= ((1 << (8 * width)) - 1) << (8 * o)
    return first_mask, first_zero, ones
