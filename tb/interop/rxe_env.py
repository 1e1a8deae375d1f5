"""The RTL engine joined to Linux Soft-RoCE (rdma_rxe, in a qemu guest) as its RoCEv2 peer.

``RxeLink`` connects a running ``tb.env.NicEnv`` to the guest's virtual wire
(``tb.interop.bridge.UdpBridge``, one datagram = one Ethernet frame without FCS):

* every frame the engine sends on MAC TX (``env.wire.frames``) is forwarded to the guest
  in the cycle its last beat is seen;
* every frame from the guest is driven into MAC RX (``env.rx.send``) and logged with the
  cycle it entered.

Determinism (see /work/shared/INTEROP.md, "Joining it to a simulated engine"): the guest
runs in wall time, the simulator far slower. The link therefore holds the simulated clock
(blocks the simulator on the socket, in slices of ``SLICE_S`` up to ``HOLD_S`` in all)
whenever the engine is owed frames by the guest:

* after forwarding a frame that rxe answers (a request with AckReq: one ACK; a READ
  REQUEST: one READ RESPONSE per path-MTU packet; an 8-byte atomic: one ATOMIC ACK),
* after ``expect(n)``: the test has just made the guest send ``n`` RoCE frames
  (e.g. rxe's WRITE of 4 packets).

All the owed frames are collected before the clock moves on and go into MAC RX back to
back at the 400G line rate from that cycle: what the engine sees does not depend on how
fast qemu ran. Frames nobody waits for (there should be none) are taken without holding,
at whatever cycle they are found, and counted in ``unexpected``.

Every frame both ways goes to a pcap (timestamps: the cycle x 2 ns, the engine's clock)
and to a text log (cycle, direction, opcode, QPN, PSN, pad count, length). The guest's
other frames (IPv6 neighbour discovery, MLD: wall-clock timed) never reach the engine and
are only counted (``dropped_non_roce``), so that the logs of two runs are identical.

The guest itself: ``shared_guest()`` boots one ``RxeGuest`` per process (the cocotb
simulation runs every test of the suite in one process: one boot) and keeps the error
when it cannot start, so that every test fails with that reason.
"""
import atexit
import os
import struct
import time
from pathlib import Path

import cocotb
from cocotb.triggers import ClockCycles, RisingEdge

from spec.formats import BTH, OFF_BTH, OFF_EXT, RETH, Op, unpack
from spec.params import CLOCK_PERIOD_NS
from tb.interop.bridge import UdpBridge, is_roce
from tb.interop.guest import GuestError, RxeGuest

# the engine's port and the guest, on one /24
ENGINE_MAC, ENGINE_IP = "02:00:00:00:00:01", "10.0.0.1"
GUEST_MAC, GUEST_IP = "02:00:00:00:00:02", "10.0.0.2"

SLICE_S = 0.1          # one bounded wait on the socket (wall seconds)
HOLD_S = 10.0          # longest the clock is held for frames owed by the guest (wall seconds)


def mac_int(mac):
    return int(mac.replace(":", ""), 16)


def ip_int(ip):
    a, b, c, d = (int(x) for x in ip.split("."))
    return (a << 24) | (b << 16) | (c << 8) | d


def out_dir():
    """Where the suite writes its pcap, logs and the guest's console: $IBGDA_INTEROP_OUT
    (set by tests/interop/test_engine_rxe.py to the run's build folder), else the cwd
    (cocotb runs the simulation in the test folder)."""
    d = Path(os.environ.get("IBGDA_INTEROP_OUT") or os.getcwd())
    d.mkdir(parents=True, exist_ok=True)
    return d


# ---- one guest per process ----------------------------------------------------------------
class _Shared:
    guest = None
    bridge = None
    error = None
    tried = False


def shared_guest():
    """(RxeGuest, UdpBridge) booted once for the process; raises GuestError with the reason
    (the first attempt's, on every later call) when the guest cannot start."""
    s = _Shared
    if not s.tried:
        s.tried = True
        d = out_dir()
        try:
            s.bridge = UdpBridge()
            s.guest = RxeGuest(s.bridge.port, s.bridge.guest_port, mac=GUEST_MAC, ip=GUEST_IP + "/24",
                               mtu=9000, peer_ip=ENGINE_IP, peer_mac=ENGINE_MAC,
                               log_path=d / "guest_console.log",
                               accel=os.environ.get("IBGDA_RXE_ACCEL", "tcg"))
        except (GuestError, OSError) as exc:
            s.error = f"rxe guest could not start: {exc}"
            if s.bridge is not None:
                s.bridge.close()
                s.bridge = None
            s.guest = None
        atexit.register(_close_shared)
    if s.error:
        raise GuestError(s.error)
    return s.guest, s.bridge


def _close_shared():
    s = _Shared
    if s.guest is not None:
        s.guest.close(quiet=True)
        s.guest = None
    if s.bridge is not None:
        s.bridge.close()
        s.bridge = None


# ---- pcap with cycle time stamps --------------------------------------------------------------
class CyclePcap:
    """A nanosecond pcap written frame by frame (flushed: readable when a test fails)."""

    def __init__(self, path):
        self.f = open(path, "wb")
        self.f.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1))   # ns, DLT_EN10MB
        self.f.flush()

    def write(self, cycle, frame):
        ns = int(cycle * CLOCK_PERIOD_NS)
        sec, nsec = divmod(ns, 1_000_000_000)
        self.f.write(struct.pack("<IIII", sec, nsec, len(frame), len(frame)) + bytes(frame))
        self.f.flush()

    def close(self):
        self.f.close()


def describe(frame):
    """'op=0x0a dqpn=0x11 psn=0x123 ackreq=1 len=330' for a RoCE frame, else its EtherType."""
    if not is_roce(frame) or len(frame) < OFF_BTH + 12:
        return f"non-RoCE ethertype=0x{frame[12:14].hex()} len={len(frame)}"
    b = unpack(BTH, frame, OFF_BTH)
    return (f"op=0x{b['opcode']:02x} dqpn=0x{b['dqpn']:x} psn=0x{b['psn']:x} ackreq={b['ackreq'] >> 7} "
            f"padcnt={(b['flags'] >> 4) & 3} len={len(frame)}")


# ---- the link -----------------------------------------------------------------------------
class RxeLink:
    """Joins ``env`` (a started NicEnv) to the guest through ``bridge``.

    Parameters:
        env: the NicEnv (its ``wire`` collects MAC TX frames, its ``rx`` drives MAC RX).
        bridge: the UdpBridge qemu's ``-netdev dgram`` talks to.
        name: file stem of this test's pcap and log in ``out_dir()``.
        mtus: {engine QPN: path MTU} (READ REQUESTs are owed one response per MTU).

    Members:
        log: [(cycle, 'tx'|'rx', frame)] every frame both ways ('tx': engine -> guest).
        unexpected: frames from the guest that arrived while none was owed.
        missing: frames owed that did not come within HOLD_S.
    """

    def __init__(self, env, bridge, name, mtus):
        self.env, self.bridge, self.mtus = env, bridge, dict(mtus)
        d = out_dir()
        self.pcap = CyclePcap(d / f"{name}.pcap")
        self.text = open(d / f"{name}.log", "w", buffering=1)
        self.log = []
        self.owed = 0
        self.unexpected = 0
        self.missing = 0
        self.dropped_non_roce = 0
        self._seen = 0
        bridge.drain()                       # nothing left over from an earlier test
        self._task = cocotb.start_soon(self._pump())

    @property
    def now(self):
        return self.env.counter.now

    def _record(self, direction, frame):
        self.log.append((self.now, direction, bytes(frame)))
        self.pcap.write(self.now, frame)
        self.text.write(f"{self.now:8d} {'engine->rxe' if direction == 'tx' else 'rxe->engine'} {describe(frame)}\n")

    def _owed_for(self, frame):
        """Frames rxe sends back for ``frame`` from the engine."""
        if not is_roce(frame):
            return 0
        b = unpack(BTH, frame, OFF_BTH)
        op = b["opcode"]
        if op == Op.READ_REQUEST:
            length = unpack(RETH, frame, OFF_EXT)["dma_len"]
            mtu = self.mtus.get(self._local_qpn(b["dqpn"]), 1024)
            return max(1, -(-length // mtu))
        if op in (Op.FETCH_ADD, Op.COMPARE_SWAP):
            return 1
        if op in (Op.ACK, Op.ATOMIC_ACK) or Op.READ_RESP_FIRST <= op <= Op.READ_RESP_ONLY:
            return 0
        return 1 if b["ackreq"] & 0x80 else 0

    def _local_qpn(self, dqpn):
        for q, qp in self.env.qps.items():
            if qp.remote_qpn == dqpn:
                return q
        return None

    def expect(self, n):
        """The guest was just made to send ``n`` RoCE frames: hold the clock until they are in."""
        self.owed += n

    def _take(self, frame):
        self._record("rx", frame)
        self.env.rx.send(frame)               # back to back at line rate from this cycle

    async def _pump(self):
        env, br = self.env, self.bridge
        while True:
            await RisingEdge(env.dut.clk)
            # engine -> guest, as soon as the last beat is seen
            while self._seen < len(env.wire.frames):
                f = env.wire.frames[self._seen].data
                self._seen += 1
                self._record("tx", f)
                br.send(f)
                self.owed += self._owed_for(f)
            # guest -> engine: everything owed before the clock moves on, the rest as found
            if self.owed:
                end = time.monotonic() + HOLD_S
                while self.owed:
                    left = end - time.monotonic()
                    if left <= 0:
                        self.missing += self.owed
                        self.text.write(f"{self.now:8d} !! {self.owed} frame(s) owed by rxe did not come "
                                        f"within {HOLD_S} s\n")
                        self.owed = 0
                        break
                    f = br.recv(min(SLICE_S, left))
                    if f is None:
                        continue
                    if not is_roce(f):
                        self.dropped_non_roce += 1
                        continue
                    self.owed -= 1
                    self._take(f)
            while (f := br.recv(0)) is not None:
                if not is_roce(f):
                    self.dropped_non_roce += 1
                    continue
                self.unexpected += 1
                self.text.write(f"{self.now:8d} !! unexpected frame from rxe (none owed)\n")
                self._take(f)

    def frames(self, direction, opcodes=None):
        """Frames of one direction ('tx' engine->rxe, 'rx' rxe->engine), optionally only these opcodes."""
        return [f for _, d, f in self.log if d == direction
                and (opcodes is None or (is_roce(f) and f[OFF_BTH] in opcodes))]

    async def settle(self, cycles=200):
        """Let the engine finish what it is doing (MAC RX empty, then ``cycles`` more)."""
        while not self.env.rx.idle:
            await ClockCycles(self.env.dut.clk, 8)
        await ClockCycles(self.env.dut.clk, cycles)

    async def wait_tx(self, n, timeout_cycles=50_000):
        """Until the engine has sent ``n`` frames in all (since the link started)."""
        await self.env.wait_for(lambda: len(self.frames("tx")) >= n, timeout_cycles,
                                lambda: f"{n} frames from the engine (got {len(self.frames('tx'))})")

    def close(self):
        self._task.cancel()
        self.pcap.close()
        self.text.close()
