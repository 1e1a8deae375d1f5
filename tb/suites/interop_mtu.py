"""The engine against Linux Soft-RoCE (rdma_rxe, in a qemu guest) at path MTU 1024 and 4096
(the full matrix: ``make interop`` runs it, ``make test`` only tb/suites/interop.py's
``mtu4096_both_ways``; see tests/interop/conftest.py).

At each MTU (the engine's QP context and the guest's RTR path_mtu; the guest's netdev MTU is
9000, so rxe's active path MTU is 4096): the engine WRITEs 4 B, 1000 B and 3 x MTU + 4 B to
rxe; rxe WRITEs 1 B, 203 B and 3 x MTU + 5 B to the engine (rxe pads); the engine READs 3 x
MTU + 5 B of rxe (rxe's READ RESPONSEs padded); rxe READs 3 x MTU + 8 B of the engine; a
FETCH_ADD and a COMPARE_SWAP each way. The cases are tb/interop/mtu_cases.py (what each
checks is written there); each test resets the engine and makes its own QPs.

``engine_odd_lengths_mtu*``: the engine WRITEs 1 B, 203 B and 3 x MTU + 5 B and answers
rxe's READ of 3 x MTU + 5 B, checked against IBTA's padding (the engine pads its last
packets since finding 1 of docs/interoperability.md was fixed; rxe NAKs an unpadded WRITE).
"""
import cocotb

from tb.interop import mtu_cases as C
from tb.interop.rxe_env import start


async def _writes_engine(dut, mtu, sizes, name):
    g, br, env, cq = await start(dut)
    await C.engine_writes(g, br, env, cq, name=name, mtu=mtu, sizes=sizes, engine_qpn=1, engine_psn=0xFFFFFE)


async def _writes_rxe(dut, mtu, name):
    g, br, env, cq = await start(dut)
    await C.rxe_writes(g, br, env, cq, name=name, mtu=mtu, sizes=[1, 203, 3 * mtu + 5], engine_qpn=2,
                       guest_psn=0xFFFFFD)


async def _reads_engine(dut, mtu, name):
    g, br, env, cq = await start(dut)
    await C.engine_reads(g, br, env, cq, name=name, mtu=mtu, n=3 * mtu + 5, engine_qpn=3, engine_psn=0x00ABC0)


async def _reads_rxe(dut, mtu, n, name):
    g, br, env, cq = await start(dut)
    await C.rxe_reads(g, br, env, cq, name=name, mtu=mtu, n=n, engine_qpn=4, guest_psn=0x7FFFFE)


async def _atomics(dut, mtu, name):
    g, br, env, cq = await start(dut)
    await C.atomics(g, br, env, cq, name=name, mtu=mtu, engine_qpn=5)


async def _odd_lengths(dut, mtu, name):
    """The engine's WRITEs and READ RESPONSEs of lengths that are not multiples of 4."""
    g, br, env, cq = await start(dut)
    await C.rxe_reads(g, br, env, cq, name=name + "_read", mtu=mtu, n=3 * mtu + 5, engine_qpn=4, guest_psn=0x10)
    await C.engine_writes(g, br, env, cq, name=name, mtu=mtu, sizes=[1, 203, 3 * mtu + 5], engine_qpn=1,
                          engine_psn=0x20)


@cocotb.test()
async def engine_writes_mtu1024(dut):
    await _writes_engine(dut, 1024, [4, 1000, 3 * 1024 + 4], "engine_writes_mtu1024")


@cocotb.test()
async def rxe_writes_mtu1024(dut):
    await _writes_rxe(dut, 1024, "rxe_writes_mtu1024")


@cocotb.test()
async def engine_reads_mtu1024(dut):
    await _reads_engine(dut, 1024, "engine_reads_mtu1024")


@cocotb.test()
async def rxe_reads_mtu1024(dut):
    await _reads_rxe(dut, 1024, 3 * 1024 + 8, "rxe_reads_mtu1024")


@cocotb.test()
async def atomics_mtu1024(dut):
    await _atomics(dut, 1024, "atomics_mtu1024")


@cocotb.test()
async def engine_odd_lengths_mtu1024(dut):
    await _odd_lengths(dut, 1024, "engine_odd_lengths_mtu1024")


@cocotb.test()
async def engine_writes_mtu4096(dut):
    await _writes_engine(dut, 4096, [4, 1000, 3 * 4096 + 4], "engine_writes_mtu4096")


@cocotb.test()
async def rxe_writes_mtu4096(dut):
    await _writes_rxe(dut, 4096, "rxe_writes_mtu4096")


@cocotb.test()
async def engine_reads_mtu4096(dut):
    await _reads_engine(dut, 4096, "engine_reads_mtu4096")


@cocotb.test()
async def rxe_reads_mtu4096(dut):
    await _reads_rxe(dut, 4096, 3 * 4096 + 8, "rxe_reads_mtu4096")


@cocotb.test()
async def atomics_mtu4096(dut):
    await _atomics(dut, 4096, "atomics_mtu4096")


@cocotb.test()
async def engine_odd_lengths_mtu4096(dut):
    await _odd_lengths(dut, 4096, "engine_odd_lengths_mtu4096")
