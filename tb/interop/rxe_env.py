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

Dropping chosen frames (``drop=``, optional): a set of (direction, index) or a callable
(direction, index, frame) -> bool, the index counted per direction from 0 over the RoCE
frames the link sees ('tx' engine -> rxe, 'rx' rxe -> engine). A dropped frame is not
delivered; it is logged ("DROPPED" in the text log, ``dropped`` list, ``<name>.dropped.pcap``)
and absent from ``log``/``frames()``/``<name>.pcap`` (those hold what crossed the wire).
With drops, what rxe owes is worked out from a small model of its PSN handling
(Linux 6.1 rxe_resp.c check_psn/duplicate_request, rxe_comp.c NAK retry) instead of the
plain count: a request ahead of rxe's expected PSN gets one NAK (0x60) until the expected
PSN comes, later ones none; a duplicate WRITE/SEND packet gets one ACK, a duplicate atomic
one ATOMIC ACK (replay), a duplicate READ its responses; the engine's NAK 0x60 to rxe's
requests is owed rxe's retransmission of every request packet it had sent from that PSN.
Retransmissions on rxe's own timer are owed by the test: ``expect(n)``.

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
from cocotb.triggers import RisingEdge

from spec.formats import AETH, BTH, OFF_BTH, OFF_EXT, RETH, Aeth, Op, unpack
from spec.params import CLOCK_PERIOD_NS
from tb.interop.bridge import UdpBridge, is_roce
from tb.interop.guest import GuestError, RxeGuest
from tb.clock import ClockCycles

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
        drop: optional, frames not to deliver: a set of (direction, index) ('tx'/'rx', index
            per direction from 0 over RoCE frames, dropped ones included) or a callable
            (direction, index, frame) -> bool (see the module's doc).
        track_psn: work out what rxe owes from its PSN model (default: when ``drop`` is given).
        rnr_resends: an RNR NAK from the engine owes rxe's resend (on its RNR timer, in its
            own time: the clock holds until it comes).

    Members:
        log: [(cycle, 'tx'|'rx', frame)] every frame both ways ('tx': engine -> guest).
        unexpected: frames from the guest that arrived while none was owed.
        missing: frames owed that did not come within HOLD_S.
        dropped: [(cycle, direction, index, frame)] the frames the drop filter took.
        seen: {'tx': n, 'rx': n} RoCE frames seen per direction, dropped ones included.
    """

    def __init__(self, env, bridge, name, mtus, drop=None, track_psn=None, rnr_resends=False):
        self.env, self.bridge, self.mtus = env, bridge, dict(mtus)
        d = out_dir()
        self.pcap = CyclePcap(d / f"{name}.pcap")
        self.text = open(d / f"{name}.log", "w", buffering=1)
        self.log = []
        # optional drops (see the module's doc): None keeps the plain behaviour
        if drop is None or callable(drop):
            self._drop = drop
        else:
            chosen = {(dr, int(i)) for dr, i in drop}
            self._drop = lambda direction, index, frame: (direction, index) in chosen
        self.dropped = []                    # [(cycle, direction, index, frame)]
        self.seen = {"tx": 0, "rx": 0}       # RoCE frames seen per direction, dropped ones included
        self.track_psn = (drop is not None) if track_psn is None else track_psn
        self._rsp = {}                       # rxe responder per engine QP's remote QPN: [epsn, nak_sent]
        self._req = {}                       # rxe requester per engine QPN: [request PSNs it sent], last NAK
        self._dpcap = CyclePcap(d / f"{name}.dropped.pcap") if drop is not None else None
        self.owed = 0
        self.rnr_resends = rnr_resends
        self.unexpected = 0
        self.missing = 0
        self.dropped_non_roce = 0
        self._seen = len(env.wire.frames)    # a later link on the same env starts after the earlier frames
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
        if op == Op.ACK and self.rnr_resends \
                and unpack(AETH, frame, OFF_EXT)["syndrome"] >> 5 == Aeth.KIND_RNR:
            return 1
        if op in (Op.ACK, Op.ATOMIC_ACK) or Op.READ_RESP_FIRST <= op <= Op.READ_RESP_ONLY:
            return 0
        return 1 if b["ackreq"] & 0x80 else 0

    def _local_qpn(self, dqpn):
        for q, qp in self.env.qps.items():
            if qp.remote_qpn == dqpn:
                return q
        return None

    def _is_dropped(self, direction, frame):
        """Counts ``frame`` in its direction; True (and logged) when the drop filter takes it."""
        if not is_roce(frame):
            return False
        index = self.seen[direction]
        self.seen[direction] += 1
        if self._drop is None or not self._drop(direction, index, bytes(frame)):
            return False
        self.dropped.append((self.now, direction, index, bytes(frame)))
        if self._dpcap is not None:
            self._dpcap.write(self.now, frame)
        self.text.write(f"{self.now:8d} {'engine->rxe' if direction == 'tx' else 'rxe->engine'} DROPPED "
                        f"#{index} {describe(frame)}\n")
        return True

    def _npsn(self, op, frame):
        """PSNs a request packet takes (a READ REQUEST: one per response packet)."""
        if op == Op.READ_REQUEST:
            length = unpack(RETH, frame, OFF_EXT)["dma_len"]
            mtu = self.mtus.get(self._local_qpn(unpack(BTH, frame, OFF_BTH)["dqpn"]), 1024)
            return max(1, -(-length // mtu))
        return 1

    def _owed_tracked(self, frame):
        """What rxe sends back for ``frame`` (delivered to it), from the PSN model."""
        if not is_roce(frame):
            return 0
        b = unpack(BTH, frame, OFF_BTH)
        op, psn = b["opcode"], b["psn"]
        if op <= Op.READ_REQUEST or op in (Op.COMPARE_SWAP, Op.FETCH_ADD):      # a request to rxe's responder
            st = self._rsp.setdefault(b["dqpn"], [psn, False])
            diff = (psn - st[0]) & 0xFFFFFF
            if diff == 0:                                   # the expected one
                st[0], st[1] = (psn + self._npsn(op, frame)) & 0xFFFFFF, False
                return self._owed_for(frame)
            if diff < 0x800000:                             # ahead: one NAK, then silence
                if st[1]:
                    return 0
                st[1] = True
                return 1
            if op <= Op.WRITE_ONLY_IMM or op in (Op.COMPARE_SWAP, Op.FETCH_ADD):   # duplicate: ACK / replay
                return 1
            return self._npsn(op, frame)                    # duplicate READ: its responses again
        if op == Op.ACK:                                    # the engine's ACK/NAK to rxe's requests
            syn = unpack(AETH, frame, OFF_EXT)["syndrome"]
            st = self._req.get(self._local_qpn(b["dqpn"]))
            if syn != Aeth.NAK_PSN_SEQ or st is None or st[1] == psn:
                return 0
            st[1] = psn
            return len({p for p in st[0] if ((p - psn) & 0xFFFFFF) < 0x800000})
        return 0

    def _note_rx(self, frame):
        """rxe's request PSNs per engine QP (for what the engine's NAK makes it resend)."""
        if self.track_psn and is_roce(frame):
            b = unpack(BTH, frame, OFF_BTH)
            if b["opcode"] <= Op.READ_REQUEST or b["opcode"] in (Op.COMPARE_SWAP, Op.FETCH_ADD):
                st = self._req.setdefault(b["dqpn"], [[], None])
                st[0] = (st[0] + [b["psn"]])[-256:]
                if b["psn"] == st[1]:
                    st[1] = None                # rxe went back to the NAKed PSN: a new NAK counts again

    def _note_tx(self, frame):
        """rxe's expected PSN of a QP starts at the engine's first request (dropped or not)."""
        if self.track_psn and is_roce(frame):
            b = unpack(BTH, frame, OFF_BTH)
            if b["opcode"] <= Op.READ_REQUEST or b["opcode"] in (Op.COMPARE_SWAP, Op.FETCH_ADD):
                self._rsp.setdefault(b["dqpn"], [b["psn"], False])

    def expect(self, n):
        """The guest was just made to send ``n`` RoCE frames: hold the clock until they are in."""
        self.owed += n

    def _take(self, frame):
        self._note_rx(frame)
        if self._is_dropped("rx", frame):
            return
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
                self._note_tx(f)
                if self._is_dropped("tx", f):
                    continue
                self._record("tx", f)
                br.send(f)
                self.owed += self._owed_tracked(f) if self.track_psn else self._owed_for(f)
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

    async def wait_seen(self, direction, n, timeout_cycles=50_000):
        """Until the link has seen ``n`` RoCE frames of ``direction`` in all, dropped ones included."""
        await self.env.wait_for(lambda: self.seen[direction] >= n, timeout_cycles,
                                lambda: f"{n} {direction} frames (seen {self.seen[direction]})")

    def close(self):
        self._task.cancel()
        if self._dpcap is not None:
            self._dpcap.close()
        self.pcap.close()
        self.text.close()


# ---- what every engine-against-rxe test starts with ------------------------------------------
MTU = 1024                         # the default path MTU of the suites (netdev MTU 9000 in the guest:
                                   # 4096 possible too, connect_rc's mtu=)
MTUS = (1024, 4096)                # the path MTUs the MTU matrix (tb/suites/interop_mtu.py) runs at
PD = 5


async def start(dut):
    """(guest, bridge, env, cq): the guest (booted once a process), the engine reset with the
    port's addresses, and its CQ 0. A guest that cannot start fails the test with the reason."""
    from tb.env import NicEnv
    try:
        g, br = shared_guest()
    except GuestError as exc:
        raise AssertionError(str(exc)) from None
    env = await NicEnv(dut, port_mac=mac_int(ENGINE_MAC), port_ip=ip_int(ENGINE_IP)).start()
    cq = await env.cq(0, 6)
    return g, br, env, cq


async def connect_rc(env, g, cq, *, engine_qpn, guest_qp, engine_psn, guest_psn, engine_timeout, rxe_timeout=0,
                     ack_every=16, mtu=MTU, rnr_retry=7, min_rnr=1, engine_kw=None):
    """An RC QP on each side, connected to each other: (the engine's QP, the guest's QP
    record). ``engine_timeout``: the engine's ACK timeout in cycles; ``rxe_timeout``: rxe's
    timer exponent (0: no retransmission); ``mtu``: the path MTU of both (the engine's QP
    context and the guest's RTR path_mtu; the guest's reply is checked to hold it: rxe
    takes the smaller of it and its port's active MTU, 4096 at the guest's netdev MTU 9000);
    ``rnr_retry``: the engine's RNR retry count; ``min_rnr``: the RNR NAK timer code rxe
    sends when it has no receive WQE (1: 10 us); ``engine_kw``: more attributes of the
    engine's QP (``recv``, ``rcq``, ``min_rnr_timer``: its receive queue)."""
    gq = g.create_qp(guest_qp, mtu=mtu, psn=guest_psn)
    qp = await env.qp(engine_qpn, cq, mtu=mtu, start_psn=engine_psn, remote_qpn=gq["qpn"],
                      dmac=mac_int(GUEST_MAC), dip=ip_int(GUEST_IP), uc=False, rq_psn=guest_psn, pd=PD,
                      ack_every=ack_every, timeout=engine_timeout, rnr_retry=rnr_retry, **(engine_kw or {}))
    qp.rnr_retry = rnr_retry
    r = g.connect(guest_qp, rqpn=engine_qpn, rpsn=engine_psn, ip=ENGINE_IP, mac=ENGINE_MAC, mtu=mtu,
                  timeout=rxe_timeout, min_rnr=min_rnr)
    assert r["state"] == "RTS", r
    assert r["mtu"] == mtu and g.ready["port_mtu"] >= mtu, (r, g.ready)
    return qp, gq


def pattern(n, seed):
    """``n`` test bytes, different for each ``seed``."""
    return bytes((i * 29 + seed * 13 + (i >> 8)) & 0xFF for i in range(n))


def bth(f):
    return unpack(BTH, f, OFF_BTH)


def aeth(f):
    """(syndrome, MSN) of an ACK frame."""
    a = unpack(AETH, f, OFF_EXT)
    return a["syndrome"], a["msn"]


def summary(frames):
    """'opcode:PSN ...' of ``frames``, for assertion messages."""
    return " ".join(f"{bth(f)['opcode']:02x}:{bth(f)['psn']:06x}" for f in frames)
