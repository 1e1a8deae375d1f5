"""Byte memory of the models and testbenches: ``SparseMemory`` (4 KiB pages, zero where never written)."""

__all__ = ["SparseMemory"]


class SparseMemory:
    """Byte-addressed memory in 4 KiB pages, zero where never written.

    Members: pages ({page number: bytearray}).
    """
    PAGE = 4096

    def __init__(self):
        self.pages = {}

    def write(self, addr, data):
        """Store ``data`` at ``addr``."""
        data = bytes(data)
        if addr < 0:
            raise ValueError(f"address must be >= 0, got {addr}")
        i = 0
        while i < len(data):
            pg, off = divmod(addr + i, self.PAGE)
            n = min(self.PAGE - off, len(data) - i)
            page = self.pages.setdefault(pg, bytearray(self.PAGE))
            page[off:off + n] = data[i:i + n]
            i += n

    def read(self, addr, n):
        """``n`` bytes from ``addr`` (zeros where never written)."""
        out = bytearray()
        while len(out) < n:
            pg, off = divmod(addr + len(out), self.PAGE)
            k = min(self.PAGE - off, n - len(out))
            page = self.pages.get(pg)
            out += page[off:off + k] if page is not None else bytes(k)
        return bytes(out)

