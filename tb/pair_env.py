"""Two NICs in RTL joined by a cable model (``ibgda_nic_pair``): the RC regressions' environment.

Each NIC gets its own GPU memory, GPU, CPU control and MAC models (a :class:`NicEnv`
on its ``n<i>_`` ports). Frames leaving one NIC's MAC TX cross a
``tb.network.BackToBack`` link (latency, optional faults) and enter the other's MAC RX
at the cycle the link delivers them.
"""
import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge

from rtl.build import PAIR_PARAMS
from spec import params as P
from tb.clock import CycleCounter
from tb.env import NicEnv
from tb.network import BackToBack
from tb.wire import BYTES_PER_CYCLE

NIC_MACS = (0x02_00_00_00_0A_01, 0x02_00_00_00_0B_01)
NIC_IPS = (0x0A00_0001, 0x0A00_0002)        # 10.0.0.1, 10.0.0.2


class NicPairEnv:
    """NIC 0 and NIC 1 back to back.

    Parameters
    ----------
    dut : the cocotb handle of ``ibgda_nic_pair``.
    latency_cycles : int
        One-way cable latency.
    faults : None, a ``tb.network.FaultSpec`` for both directions, or a dict as
        ``BackToBack`` takes.
    seed : int
        Seed of the fault draws.
    **nic_kw
        Passed to both ``NicEnv`` (e.g. ``dma_latency``).

    Members
    -------
    nics : the two ``NicEnv``.
    net : the ``BackToBack`` link model (its counters and fault log).
    """
    def __init__(self, dut, *, latency_cycles=100, faults=None, seed=0, **nic_kw):
        self.dut = dut
        self.nics = [NicEnv(dut, prefix=f"n{i}_", port_mac=NIC_MACS[i], port_ip=NIC_IPS[i],
                            num_qps=PAIR_PARAMS["num_qps"], **nic_kw) for i in range(2)]
        self.net = BackToBack(latency_cycles=latency_cycles, faults=faults, seed=seed)

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
        """Every cycle: new frames of each MAC TX onto the link, delivered ones into MAC RX."""
        seen = [0, 0]
        edge = RisingEdge(self.dut.clk)
        while True:
            await edge
            now = self.counter.now
            for i, nic in enumerate(self.nics):
                frames = nic.wire.frames
                while seen[i] < len(frames):
                    f = frames[seen[i]]
                    seen[i] += 1
                    # the MAC holds a frame until its wire time has run: it has left by the
                    # cycle holding its last wire byte
                    self.net.send(i, f.data, -(-f.end_bytes // BYTES_PER_CYCLE), end_bytes=f.end_bytes)
            for j, nic in enumerate(self.nics):
                for d in self.net.receive(j, now):
                    nic.rx.send(d.frame, cycle=max(d.cycle, now))

    async def connect(self, a, qa, b, qb, *, cq_a, cq_b, mtu=P.DEFAULT_MTU, psn_a=None, psn_b=None, pd=0,
                      ack_every=1, log_depth=8, **reliability):
        """Create RC QP ``qa`` on NIC ``a`` and QP ``qb`` on NIC ``b``, connected to each other.

        ``reliability``: ``timeout`` (cycles) and ``retry_cnt`` of both QPs."""
        na, nb = self.nics[a], self.nics[b]
        psn_a = (0x1000 * qa + 3) & 0xFFFFFF if psn_a is None else psn_a
        psn_b = (0x2000 * qb + 5) & 0xFFFFFF if psn_b is None else psn_b
        qp_a = await na.qp(qa, cq_a, log_depth=log_depth, mtu=mtu, start_psn=psn_a, remote_qpn=qb, uc=False,
                           dmac=nb.port_mac, dip=nb.port_ip, rq_psn=psn_b, pd=pd, ack_every=ack_every,
                           **reliability)
        qp_b = await nb.qp(qb, cq_b, log_depth=log_depth, mtu=mtu, start_psn=psn_b, remote_qpn=qa, uc=False,
                           dmac=na.port_mac, dip=na.port_ip, rq_psn=psn_a, pd=pd, ack_every=ack_every,
                           **reliability)
        return qp_a, qp_b
