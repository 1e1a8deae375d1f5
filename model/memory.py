"""Byte memory of the models and testbenches: ``SparseMemory`` (4 KiB pages, zero where never written).

One class for the golden model (``model.link.simulate``, the requester's payload reads) and
the cocotb GPU memory (``tb.memory.DmaMemory``'s backing store).
"""

__all__ = ["PAGE", "SparseMemory"]

PAGE = 4096


class SparseMemory:
    """Byte-addressed memory in 4 KiB pages, zero where never written.

    Members: pages ({page number: bytearray}).
    """
    PAGE = PAGE

    def __init__(self):
        self.pages = {}

    def write(self, addr, data):
        """Store ``data`` (bytes-like) at byte address ``addr`` (>= 0)."""
        if addr < 0:
            raise ValueError(f"negative address {addr:#x}")
        data = memoryview(bytes(data))
        pos = 0
        while pos < len(data):
            page, off = divmod(addr + pos, PAGE)
            n = min(PAGE - off, len(data) - pos)
            buf = self.pages.get(page)
            if buf is None:
                buf = self.pages[page] = bytearray(PAGE)
            buf[off:off + n] = data[pos:pos + n]
            pos += n

    def read(self, addr, n):
        """``n`` bytes from byte address ``addr`` (zeros where never written)."""
        if addr < 0 or n < 0:
            raise ValueError(f"bad read addr={addr:#x} n={n}")
        out = bytearray()
        while len(out) < n:
            page, off = divmod(addr + len(out), PAGE)
            k = min(PAGE - off, n - len(out))
            buf = self.pages.get(page)
            out += buf[off:off + k] if buf is not None else bytes(k)
        return bytes(out)
