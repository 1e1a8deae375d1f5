"""``HostPath``: what the host writes, wired: the control registers (CPU, AXI4-Lite) and
the UAR doorbells (GPU, AXI4 writes), whose events wait in a queue for the QP table."""
from amaranth.hdl import *
from amaranth.lib import wiring

from spec import params as P
from rtl.common.passthrough import forward, members
from rtl.common.records import DoorbellEvent
from rtl.common.stream import StreamFifo
from rtl.host.control_registers import ControlRegisters
from rtl.host.doorbell_decoder import DoorbellDecoder

__all__ = ["HostPath"]

DOORBELL_QUEUE = 16         # doorbell events waiting for the QP table


class HostPath(wiring.Component):
    """The control registers and the doorbell decoder (pure wiring).

    Parameters
    ----------
    num_qps, num_cqs : int
        Sizes of the QP and CQ tables.

    Members
    -------
    csr_bus : In(AxiLiteSignature)
        The control path (top-level ``s_axil``).
    db_bus : In(AxiWriteSignature)
        The UAR doorbell BAR (top-level ``s_axi_db``).
    doorbells : Out(stream.Signature(DoorbellEvent))
        Accepted doorbells, in order, for the QP table.
    db_accepted, db_dropped : Out(1)
        The decoder's counter strobes.
    port_mac, port_ip, qp_*, cq_*, mr*, counter_inc
        The control registers' staged contexts, commit strobes and counters
        (:class:`~rtl.host.control_registers.ControlRegisters`).
    """
    def __init__(self, *, num_qps, num_cqs):
        self._csr = ControlRegisters(num_qps=num_qps, num_cqs=num_cqs, pd_bits=P.PD_BITS)
        self._db = DoorbellDecoder(num_qps=num_qps)
        self._db_fifo = StreamFifo(DoorbellEvent(num_qps), DOORBELL_QUEUE)
        self._csr_ports = {n: n for n in self._csr.signature.members if n != "bus"} | {"csr_bus": "bus"}
        super().__init__(members(self._csr, self._csr_ports)
                         | members(self._db, {"db_bus": "bus", "db_accepted": "accepted", "db_dropped": "dropped"})
                         | members(self._db_fifo, {"doorbells": "o"}))

    def elaborate(self, platform):
        m = Module()
        m.submodules.csr = self._csr
        m.submodules.doorbell = self._db
        m.submodules.db_fifo = self._db_fifo
        forward(m, self, self._csr, self._csr_ports)
        forward(m, self, self._db, {"db_bus": "bus", "db_accepted": "accepted", "db_dropped": "dropped"})
        wiring.connect(m, self._db.events, self._db_fifo.i)
        forward(m, self, self._db_fifo, {"doorbells": "o"})
        return m
