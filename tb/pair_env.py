"""NICs in RTL joined by a network model: the RC regressions' environments.

:class:`NicNetEnv`: the NICs of a multi-engine top level (``ibgda_nic_pair``,
``ibgda_nic_quad``) on a ``model.network`` fabric, NIC i on port i. :class:`NicPairEnv`:
two NICs and a ``BackToBack`` cable. :class:`NicSwitchEnv`: NICs through a ``Switch``.

Each NIC gets its own GPU memory, GPU, CPU control and MAC models (a :class:`NicEnv`
on its ``n<i>_`` ports). Frames leaving a NIC's MAC TX enter the fabric at the cycle
their last wire byte has left, and enter the destination NIC's MAC RX at the cycle the
fabric delivers them.
"""
import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge

from spec import params as P
from spec.formats import ETH_MIN_FRAME
from tb.clock import ClockCycles, CycleCounter
from tb.env import NicEnv
from model.network import BackToBack, Switch
from tb.wire import BYTES_PER_CYCLE

NIC_MACS = tuple(0x02_00_00_00_0A_01 + (i << 8) for i in range(4))   # 02:00:00:00:0a:01, 0b:01, ...
NIC_IPS = tuple(0x0A00_0001 + i for i in range(4))                 # 10.0.0.1 .. 10.0.0.4


class NicNetEnv:
    """``count`` NICs of a multi-engine top level (``rtl.build.array_verilog``) on a
    fabric, NIC i on port i.

    Parameters
    ----------
    dut : the cocotb handle of the top level (ports ``n<i>_<port>``).
    count : int
        NICs used (the first ``count`` of the top level).
    net : a ``model.network`` fabric (``BackToBack``, ``Switch``) with ``count`` ports.
    num_qps : int
        QPs per NIC of the build.
    mac_pad : bool
        The MACs pad what a NIC sends to Ethernet's 60 bytes (zeros behind the ICRC, as an
        IEEE 802.3 MAC does): a frame shorter than that (a 0-byte SEND is 58 bytes; the
        engine leaves the padding to its MAC) enters the fabric 60 bytes long. Default
        off: the frames as the NIC sent them.
    **nic_kw
        Passed to every ``NicEnv`` (e.g. ``dma_latency``).

    Members
    -------
    nics : the ``NicEnv`` of each NIC.
    net : the fabric (its counters and fault log).
    """
    def __init__(self, dut, count, net, *, num_qps, mac_pad=False, **nic_kw):
        if not 2 <= count <= len(NIC_MACS):
            raise ValueError(f"count must be 2..{len(NIC_MACS)}, not {count!r}")
        self.dut = dut
        self.mac_pad = mac_pad
        self.nics = [NicEnv(dut, prefix=f"n{i}_", port_mac=NIC_MACS[i], port_ip=NIC_IPS[i],
                            num_qps=num_qps, **nic_kw) for i in range(count)]
        self.net = net

    async def start(self):
        dut = self.dut
        Clock(dut.clk, P.CLOCK_PERIOD_NS, unit="ns").start()
        dut.rst.value = 1
        self.counter = CycleCounter(dut.clk)
        for nic in self.nics:
            nic.attach(self.counter)
        await ClockCycles(dut.clk, 8)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        for nic in self.nics:
            await nic.configure()
        self._bridge_task = cocotb.start_soon(self._bridge())
        return self

    async def _bridge(self):
        """Every cycle: new frames of each MAC TX onto the fabric, delivered ones into MAC RX."""
        seen = [0] * len(self.nics)
        edge = RisingEdge(self.dut.clk)
        while True:
            await edge
            now = self.counter.now
            for i, nic in enumerate(self.nics):
                frames = nic.wire.frames
                while seen[i] < len(frames):
                    f = frames[seen[i]]
                    seen[i] += 1
                    data = f.data
                    if self.mac_pad and len(data) < ETH_MIN_FRAME:
                        data += bytes(ETH_MIN_FRAME - len(data))
                    # the MAC holds a frame until its wire time has run: it has left by the
                    # cycle holding its last wire byte
                    self.net.send(i, data, -(-f.end_bytes // BYTES_PER_CYCLE), end_bytes=f.end_bytes)
            for j, nic in enumerate(self.nics):
                for d in self.net.receive(j, now):
                    nic.rx.send(d.frame, cycle=max(d.cycle, now))

    async def connect(self, a, qa, b, qb, *, cq_a, cq_b, mtu=P.DEFAULT_MTU, psn_a=None, psn_b=None, pd=0,
                      ack_every=1, log_depth=8, b_kw=None, **reliability):
        """Create RC QP ``qa`` on NIC ``a`` and QP ``qb`` on NIC ``b``, connected to each other.

        ``reliability``: ``timeout`` (cycles) and ``retry_cnt`` of both QPs, and any other
        attribute ``NicEnv.qp`` takes (``weight``, ``max_wqebbs``); ``b_kw``: attributes of
        QP ``qb`` only (``recv``, ``rcq``: its receive queue and CQ)."""
        na, nb = self.nics[a], self.nics[b]
        psn_a = (0x1000 * qa + 3) & 0xFFFFFF if psn_a is None else psn_a
        psn_b = (0x2000 * qb + 5) & 0xFFFFFF if psn_b is None else psn_b
        qp_a = await na.qp(qa, cq_a, log_depth=log_depth, mtu=mtu, start_psn=psn_a, remote_qpn=qb, uc=False,
                           dmac=nb.port_mac, dip=nb.port_ip, rq_psn=psn_b, pd=pd, ack_every=ack_every,
                           **reliability)
        qp_b = await nb.qp(qb, cq_b, log_depth=log_depth, mtu=mtu, start_psn=psn_b, remote_qpn=qa, uc=False,
                           dmac=na.port_mac, dip=na.port_ip, rq_psn=psn_a, pd=pd, ack_every=ack_every,
                           **{**reliability, **(b_kw or {})})
        return qp_a, qp_b


class NicPairEnv(NicNetEnv):
    """NIC 0 and NIC 1 of ``ibgda_nic_pair`` back to back.

    Parameters
    ----------
    dut : the cocotb handle of ``ibgda_nic_pair``.
    latency_cycles : int
        One-way cable latency.
    faults : None, a ``model.network.FaultSpec`` for both directions, or a dict as
        ``BackToBack`` takes.
    seed : int
        Seed of the fault draws.
    **nic_kw
        Passed to ``NicNetEnv`` (``mac_pad``) and to both ``NicEnv`` (e.g. ``dma_latency``).
    """
    def __init__(self, dut, *, latency_cycles=100, faults=None, seed=0, **nic_kw):
        super().__init__(dut, 2, BackToBack(latency_cycles=latency_cycles, faults=faults, seed=seed),
                         num_qps=P.ARRAY_NUM_QPS, **nic_kw)


class NicSwitchEnv(NicNetEnv):
    """The four NICs of ``ibgda_nic_quad`` through a 400G ``Switch`` (output queues).

    Parameters
    ----------
    dut : the cocotb handle of ``ibgda_nic_quad``.
    latency_cycles : int
        Forwarding latency of the switch; link_latency_cycles: of each cable.
    queue_bytes : int
        Output queue per port.
    faults : None, a ``FaultSpec`` for every link, or a dict as ``Switch`` takes.
    seed : int
        Seed of the fault draws.
    """
    def __init__(self, dut, *, latency_cycles=50, link_latency_cycles=20, queue_bytes=256 * 1024, faults=None,
                 seed=0, **nic_kw):
        count = P.QUAD_COUNT
        net = Switch({NIC_MACS[i]: i for i in range(count)}, count, latency_cycles=latency_cycles,
                     queue_bytes=queue_bytes, link_latency_cycles=link_latency_cycles, faults=faults, seed=seed)
        super().__init__(dut, count, net, num_qps=P.ARRAY_NUM_QPS, **nic_kw)
