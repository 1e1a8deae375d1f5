"""AXI signatures and helpers for the edges of the engine.

Members are named as in the AXI specification (``awaddr``, ``rvalid``...) so that a
top-level port ``<prefix>_<member>`` matches cocotbext-axi's ``from_prefix``
convention. Signatures are written from the master's point of view; a slave uses
``.flip()``.
"""
from amaranth.lib import enum, wiring
from amaranth.lib.wiring import In, Out

from spec.params import AXI_PAGE, AXI_PAGE_SHIFT

__all__ = ["AxiLiteSignature", "AxiWriteSignature", "AxiReadSignature", "AxiSignature",
           "AxiStreamSignature", "Burst", "Resp", "Cache", "beats_to_page_end",
           "flat_members", "connect_flat"]


class Burst(enum.Enum, shape=2):
    """``AxBURST``: burst type."""
    FIXED = 0b00
    INCR  = 0b01
    WRAP  = 0b10


class Resp(enum.Enum, shape=2):
    """``BRESP``/``RRESP``: response."""
    OKAY   = 0b00
    EXOKAY = 0b01
    SLVERR = 0b10
    DECERR = 0b11


class Cache(enum.Enum, shape=4):
    """``AxCACHE``: the AXI4 memory types whose code is the same for reads and writes."""
    DEVICE_NON_BUFFERABLE               = 0b0000
    DEVICE_BUFFERABLE                   = 0b0001
    NORMAL_NON_CACHEABLE_NON_BUFFERABLE = 0b0010
    NORMAL_NON_CACHEABLE_BUFFERABLE     = 0b0011


def beats_to_page_end(addr, beat_shift):
    """Beats of ``1 << beat_shift`` bytes from ``addr`` to the end of its 4 KiB page.

    The most beats an INCR burst that starts at ``addr`` may have (AXI: no burst crosses
    an ``AXI_PAGE`` boundary); ``addr`` is beat aligned (a block with an unaligned
    address passes the address of the beat that holds it). The gateware side of
    :func:`spec.params.axi_bursts`; the value is ``1..AXI_PAGE >> beat_shift``.
    """
    return (AXI_PAGE - addr[:AXI_PAGE_SHIFT]) >> beat_shift


def _check_width(name, value, allowed=None):
    if not isinstance(value, int) or value <= 0:
        raise TypeError(f"{name} must be a positive integer, not {value!r}")
    if allowed is not None and value not in allowed:
        raise ValueError(f"{name} must be one of {sorted(allowed)}, not {value}")


_DATA_WIDTHS = {8, 16, 32, 64, 128, 256, 512, 1024}


class AxiLiteSignature(wiring.Signature):
    """AXI4-Lite, master view.

    Parameters
    ----------
    addr_width, data_width : int
        Address and data widths in bits (data 32 or 64).
    """
    def __init__(self, *, addr_width, data_width=32):
        _check_width("addr_width", addr_width)
        _check_width("data_width", data_width, {32, 64})
        self.addr_width, self.data_width = addr_width, data_width
        super().__init__({
            "awaddr": Out(addr_width), "awprot": Out(3), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wvalid": Out(1), "wready": In(1),
            "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "araddr": Out(addr_width), "arprot": Out(3), "arvalid": Out(1), "arready": In(1),
            "rdata": In(data_width), "rresp": In(2), "rvalid": In(1), "rready": Out(1),
        })


def _write_members(addr_width, data_width, id_width):
    return {
        "awid": Out(id_width), "awaddr": Out(addr_width), "awlen": Out(8), "awsize": Out(3),
        "awburst": Out(2), "awlock": Out(1), "awcache": Out(4), "awprot": Out(3),
        "awvalid": Out(1), "awready": In(1),
        "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wlast": Out(1),
        "wvalid": Out(1), "wready": In(1),
        "bid": In(id_width), "bresp": In(2), "bvalid": In(1), "bready": Out(1),
    }


def _read_members(addr_width, data_width, id_width):
    return {
        "arid": Out(id_width), "araddr": Out(addr_width), "arlen": Out(8), "arsize": Out(3),
        "arburst": Out(2), "arlock": Out(1), "arcache": Out(4), "arprot": Out(3),
        "arvalid": Out(1), "arready": In(1),
        "rid": In(id_width), "rdata": In(data_width), "rresp": In(2), "rlast": In(1),
        "rvalid": In(1), "rready": Out(1),
    }


class _AxiBase(wiring.Signature):
    def __init__(self, members, addr_width, data_width, id_width):
        _check_width("addr_width", addr_width)
        _check_width("data_width", data_width, _DATA_WIDTHS)
        _check_width("id_width", id_width)
        self.addr_width, self.data_width, self.id_width = addr_width, data_width, id_width
        super().__init__(members)


class AxiWriteSignature(_AxiBase):
    """AXI4 write channels (AW, W, B), master view."""
    def __init__(self, *, addr_width, data_width, id_width=4):
        super().__init__(_write_members(addr_width, data_width, id_width), addr_width, data_width, id_width)


class AxiReadSignature(_AxiBase):
    """AXI4 read channels (AR, R), master view."""
    def __init__(self, *, addr_width, data_width, id_width=4):
        super().__init__(_read_members(addr_width, data_width, id_width), addr_width, data_width, id_width)


class AxiSignature(_AxiBase):
    """Full AXI4 (all five channels), master view."""
    def __init__(self, *, addr_width, data_width, id_width=4):
        members = {**_write_members(addr_width, data_width, id_width),
                   **_read_members(addr_width, data_width, id_width)}
        super().__init__(members, addr_width, data_width, id_width)


class AxiStreamSignature(wiring.Signature):
    """AXI4-Stream with byte keeps, master view; ``user_width`` adds ``tuser``."""
    def __init__(self, *, data_width, user_width=0):
        _check_width("data_width", data_width, _DATA_WIDTHS)
        self.data_width = data_width
        members = {"tdata": Out(data_width), "tkeep": Out(data_width // 8),
                   "tvalid": Out(1), "tready": In(1), "tlast": Out(1)}
        if user_width:
            members["tuser"] = Out(user_width)
        super().__init__(members)


def flat_members(prefix, signature):
    """Top-level port members ``<prefix>_<name>`` for ``signature`` (directions kept)."""
    return {f"{prefix}_{name}": member for name, member in signature.members.items()}


def connect_flat(m, component, prefix, iface):
    """Drive an internal interface from/to the component's flat ``<prefix>_*`` ports.

    ``iface`` has the same signature (same flip) as the flat ports it binds to.
    """
    for name, member in iface.signature.members.items():
        port = getattr(component, f"{prefix}_{name}")
        inner = getattr(iface, name)
        if member.flow == wiring.Out:
            m.d.comb += port.eq(inner)
        else:
            m.d.comb += inner.eq(port)
