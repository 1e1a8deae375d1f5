"""IBRC: CPU proxy threads that post on the GPU's behalf (NVSHMEM's proxy; with several
threads and batching, the proxies of UCCL-EP and pplx fabric-lib).

A GPU warp's operation becomes a request: the warp writes it into a ring in host memory
(``ProxyCosts.request_ns``; it arrives ``GpuCosts.pcie_ns`` later). A proxy thread polls its
ring, builds each request's WQEs in the QP's send queue, writes the doorbell record and
rings the NIC's doorbell (one per QP per batch), polls the QPs' CQs and writes a
completion count into GPU memory, which the GPU's ``quiet`` polls. The engine is the same
RTL and takes the same doorbells and WQE fetches; only the posting agent differs.

QPs are shared out over the threads by QP number (each thread owns its QPs' rings and
CQs, as UCCL-EP's proxies own their channels); one poll of a thread's CQ sees the
completions of all its QPs (as one ibv_poll_cq on a CQ the QPs share).
"""
from collections import deque

import cocotb
from cocotb.triggers import Event

from spec import params as P
from tb.gpu import be32
from tb.nvshmem import cycles, spend


class Proxy:
    """The proxy threads of one PE.

    Parameters
    ----------
    pe : the ``tb.nvshmem.Pe`` it serves. costs : ``spec.costs.ProxyCosts``.

    Members
    -------
    posted, batches, doorbells, cq_polls : counts of what the threads did.
    """
    def __init__(self, pe, costs):
        self.pe, self.costs = pe, costs
        self.rings = [deque() for _ in range(costs.threads)]
        self.wake = [Event() for _ in range(costs.threads)]
        self.owned = [[] for _ in range(costs.threads)]
        self.posted = self.batches = self.doorbells = self.cq_polls = 0
        self._state = {}                # SharedQp -> its proxy bookkeeping

    def _st(self, sq):
        st = self._state.get(sq)
        if st is None:
            st = self._state[sq] = {"requested": 0, "pending": deque(), "completed": 0, "visible": deque(),
                                    "seen": 0}
            self.owned[sq.qp.qpn % self.costs.threads].append(sq)
        return st

    def start(self):
        self._tasks = [cocotb.start_soon(self._thread(t)) for t in range(self.costs.threads)]

    # ---- GPU side ---------------------------------------------------------------------
    async def request(self, pe, sq, build):
        """The warp's side of one operation: write the request (``build(qp, signaled)``
        posts its WQEs) into the host ring."""
        st = self._st(sq)
        await spend(self.costs.request_ns)
        st["requested"] += 1
        t = sq.qp.qpn % self.costs.threads
        self.rings[t].append((pe.now() + cycles(pe.costs.pcie_ns), sq, build))
        self.wake[t].set()
        return None

    def done(self, sq):
        """What the GPU sees: the completion count the proxy wrote has reached its requests."""
        st = self._st(sq)
        now = self.pe.now()
        while st["visible"] and st["visible"][0][0] <= now:
            st["seen"] = st["visible"].popleft()[1]
        return st["seen"] >= st["requested"]

    # ---- CPU side -----------------------------------------------------------------------
    async def _thread(self, t):
        c, pe = self.costs, self.pe
        ring = self.rings[t]
        while True:
            now = pe.now()
            batch = []
            while ring and ring[0][0] <= now and len(batch) < c.batch:
                batch.append(ring.popleft())
            if batch:
                await spend(c.poll_ns)                     # the ring slots the GPU wrote
                touched = []
                for _, sq, build in batch:
                    while sq.qp.pi + 8 - sq.cons > sq.qp.depth:   # ring nearly full: wait on its CQ
                        await spend(c.cq_poll_ns)
                        pe.poll_cq(sq)
                    await spend(c.build_ns)
                    wqes = build(sq.qp, True)
                    st = self._st(sq)
                    st["pending"].append(wqes[-1].index)
                    for w in wqes:
                        sq.ends[w.index] = w.index + w.nwqebbs
                    if sq not in touched:
                        touched.append(sq)
                    self.posted += 1
                for sq in touched:                          # one doorbell per QP per batch
                    pi = sq.qp.pi & 0xFFFF
                    pe.nic.mem.write(sq.qp.dbr_addr, be32(pi))
                    await spend(c.doorbell_ns)
                    pe._post_doorbell(sq.qp.qpn, be32(pi << 8) + be32(sq.qp.qpn << 8), delay_ns=0)
                    self.doorbells += 1
                self.batches += 1
            progressed = False
            busy = [sq for sq in self.owned[t] if self._state[sq]["pending"]]
            if busy:
                await spend(c.cq_poll_ns)                   # one poll of the thread's CQ: all its QPs
                self.cq_polls += 1
            for sq in busy:
                st = self._state[sq]
                k = pe.poll_cq(sq)
                if k is None:
                    continue
                n = 0
                while st["pending"] and (k - st["pending"][0]) & 0xFFFF < 0x8000:
                    st["pending"].popleft()
                    n += 1
                if n:
                    st["completed"] += n
                    await spend(c.complete_ns)              # the QP's count, into GPU memory
                    st["visible"].append((pe.now() + cycles(pe.costs.pcie_ns), st["completed"]))
                    progressed = True
            if not batch and not progressed:
                waiting = any(self._state[sq]["pending"] for sq in self.owned[t])
                if not ring and not waiting:
                    self.wake[t].clear()
                    await self.wake[t].wait()
                elif ring and ring[0][0] > pe.now() and not waiting:
                    await spend((ring[0][0] - pe.now()) * P.CLOCK_PERIOD_NS)   # nothing to poll until it lands
                else:
                    await spend(c.poll_ns)
