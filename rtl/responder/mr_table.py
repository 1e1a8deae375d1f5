"""Memory-region table: the responder's check of a remote key, bounds, rights and PD."""
from amaranth.hdl import *
from amaranth.lib import wiring, data, stream
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from spec.formats import MKEY_VARIANT_BITS, MrCheck

__all__ = ["MemoryRegionTable", "MrEntry"]


def MrEntry(pd_bits):
    return data.StructLayout({
        "valid": unsigned(1), "key": unsigned(32), "base": unsigned(64), "length": unsigned(64),
        "access": unsigned(4),          # spec.formats.Access bits
        "pd": unsigned(pd_bits),
    })


class MemoryRegionTable(wiring.Component):
    """Registered memory regions in one RAM, and a one-request-per-cycle key check.

    A request names a key, an address range, the rights it needs and the PD of the QP it
    came on; the answer (``spec.formats.MrCheck``) says whether the access may proceed,
    in the cycle after the request is taken (the RAM read; the compare is on its output). The rules are those
    of ``model/mr.py``: the key's index (``key >> 8``) selects the region, the whole key,
    the PD and the rights must match and the range must lie inside the region; a
    zero-length request is allowed without a region. A request passes its ``tag``
    through, so the caller can match answers to its own state.

    Parameters
    ----------
    num_mrs : int
        Regions in the table (a power of two >= 2).
    pd_bits : int
        Width of a protection-domain number.
    tag_bits : int
        Width of the caller's tag.

    Members
    -------
    commit : In(stream.Signature(...))
        ``index`` and ``region`` (``MrEntry``): register or deregister (``valid`` = 0) a
        region. A request taken in the same cycle still sees the old entry.
    requests : In(stream.Signature(...))
        ``key``, ``addr``, ``length``, ``access``, ``pd``, ``tag``.
    results : Out(stream.Signature(...))
        ``status`` (MrCheck) and ``tag``, in request order.
    """
    def __init__(self, *, num_mrs=1024, pd_bits=24, tag_bits=16):
        if num_mrs < 2 or num_mrs & (num_mrs - 1):
            raise ValueError(f"num_mrs must be a power of two >= 2, not {num_mrs!r}")
        if num_mrs > 1 << (32 - MKEY_VARIANT_BITS):
            raise ValueError(f"num_mrs must fit the key's {32 - MKEY_VARIANT_BITS}-bit index, not {num_mrs}")
        if not 1 <= pd_bits <= 32:
            raise ValueError(f"pd_bits must be 1..32, not {pd_bits!r}")
        self.num_mrs, self.pd_bits, self.tag_bits = num_mrs, pd_bits, tag_bits
        index_bits = (num_mrs - 1).bit_length()
        super().__init__({
            "commit": In(stream.Signature(data.StructLayout({"index": unsigned(index_bits),
                                                             "region": MrEntry(pd_bits)}))),
            "requests": In(stream.Signature(data.StructLayout({
                "key": unsigned(32), "addr": unsigned(64), "length": unsigned(32), "access": unsigned(4),
                "pd": unsigned(pd_bits), "tag": unsigned(tag_bits)}))),
            "results": Out(stream.Signature(data.StructLayout({"status": unsigned(3),
                                                               "tag": unsigned(tag_bits)}))),
        })

    def elaborate(self, platform):
        m = Module()
        index_bits = (self.num_mrs - 1).bit_length()
        m.submodules.ram = ram = Memory(shape=MrEntry(self.pd_bits), depth=self.num_mrs, init=[])
        wr = ram.write_port()
        rd = ram.read_port()
        m.d.comb += [
            wr.en.eq(self.commit.valid), wr.addr.eq(self.commit.p.index), wr.data.eq(self.commit.p.region),
            self.commit.ready.eq(1),
        ]

        # One stage: the request whose region the RAM has read; its answer waits there for
        # ``results.ready`` (the RAM output holds while the read port is not enabled).
        req = Signal.like(self.requests.p)
        full = Signal()
        take = Signal()
        m.d.comb += [
            self.requests.ready.eq(~full | self.results.ready),
            take.eq(self.requests.valid & self.requests.ready),
            rd.addr.eq(self.requests.p.key[MKEY_VARIANT_BITS:MKEY_VARIANT_BITS + index_bits]),
            rd.en.eq(self.requests.ready),
        ]
        mr = rd.data
        status = Signal(3)
        with m.If(req.length == 0):
            m.d.comb += status.eq(MrCheck.OK)
        with m.Elif(~mr.valid | (mr.key != req.key)):
            m.d.comb += status.eq(MrCheck.BAD_KEY)
        with m.Elif(mr.pd != req.pd):
            m.d.comb += status.eq(MrCheck.PD)
        with m.Elif((req.access & ~mr.access) != 0):
            m.d.comb += status.eq(MrCheck.RIGHTS)
        with m.Elif((req.addr < mr.base) | (req.addr + req.length > mr.base + mr.length)):
            m.d.comb += status.eq(MrCheck.BOUNDS)
        with m.Else():
            m.d.comb += status.eq(MrCheck.OK)

        m.d.comb += [self.results.valid.eq(full), self.results.p.status.eq(status),
                     self.results.p.tag.eq(req.tag)]
        with m.If(take):
            m.d.sync += [req.eq(self.requests.p), full.eq(1)]
        with m.Elif(self.results.valid & self.results.ready):
            m.d.sync += full.eq(0)
        return m
