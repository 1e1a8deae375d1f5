"""A closed-form cluster model fitted to the RTL runs of ``make seeds``.

Every per-message cost comes from an RTL record (``tb/suites/seeds.py``), none is set by
hand: the one-message latency of each path (``latency``: an 8-byte put_signal on two idle
engines, posting included), the engine's steady message rate (``rate``, IBGDA, 8 bytes)
and each proxy's operation rate (``rate``, IBRC paths). The 400G wire arithmetic is
``spec.params``'; the fabric is a parameter set (:class:`Fabric`): a two-tier Clos of 400G
links, output-queued switches of ``hop_ns`` each (260 ns by default).

A PE that sends ``m`` messages of ``s`` bytes (each a WRITE, maybe with a signal behind it)
finishes at ``latency(s) + (m - 1) * max(post, wire)``: the first message's latency, then
one message per the slower of the posting agent's time per message and the 400G wire's.
In an all-to-all every receiver takes as many as every sender sends, and with output
queues and senders that spread their messages over the receivers (as warps per peer
do) the ingress side serialises no longer than the egress side: the model takes that
bound. Where it stops holding: senders whose orders line up (every PE to PE 0 first: an
incast at one output queue), lossy fabrics, congestion control (the next transport issue),
and QP counts beyond the NIC's (at 1024 peers and more, a real system uses DC or UD).
"""
from dataclasses import dataclass

from spec import costs as C
from spec import params as P
from tb.nvshmem import DB_BATCH

WRITE_OVERHEAD = 74          # Eth + IP + UDP + BTH + RETH + ICRC, no FCS (SPEC section 6)
ATOMIC_FRAME = 86            # a masked fetch-add request frame (AtomicETH), no FCS


def wire_ns(frame_len):
    return P.wire_bytes(frame_len) * 8 / P.WIRE_GBPS


def write_wire_ns(size, mtu=4096):
    """Wire time of one RDMA WRITE of ``size`` bytes (MTU-sized packets)."""
    packets = max(1, -(-size // mtu))
    return packets * wire_ns(WRITE_OVERHEAD) + size * 8 / P.WIRE_GBPS


@dataclass(frozen=True)
class Fabric:
    """A two-tier Clos of 400G links.

    Parameters
    ----------
    hop_ns : one switch (forwarding latency).
    link_ns : one cable (propagation and PHY).
    leaf_ports : hosts under one leaf switch (the rest of its ports go up).
    """
    hop_ns: float = 260.0
    link_ns: float = 40.0
    leaf_ports: int = 32

    def one_way_ns(self, nodes):
        """Mean extra latency of a message between two of ``nodes`` hosts: one switch and
        two links within a leaf, three switches and four links across the spine."""
        if nodes <= 2:
            return 2 * self.link_ns + self.hop_ns
        same = min(self.leaf_ports, nodes) - 1
        frac_local = same / (nodes - 1)
        local = 2 * self.link_ns + self.hop_ns
        spine = 4 * self.link_ns + 3 * self.hop_ns
        return frac_local * local + (1 - frac_local) * spine


class ClusterModel:
    """Fitted per path from RTL records.

    Parameters
    ----------
    recs : the records of ``make seeds`` (dicts, ``workload`` and ``path`` keys).
    rtl_fabric_ns : {2: ns, 4: ns}, the one-way fabric latency of the RTL runs
        (``tb.pair_env``: a 100-cycle cable; the switch model's 50-cycle hop and two
        20-cycle links).
    dma_ns : the GPU memory read latency of the runs (SPEC's 1 us): what a signal that
        finds its word in the responder's atomic cache does not wait for.
    """
    def __init__(self, recs, *, rtl_fabric_ns=None, dma_ns=P.DMA_READ_LATENCY_NS):
        self.rtl_fabric_ns = rtl_fabric_ns or {2: 100 * P.CLOCK_PERIOD_NS, 4: 90 * P.CLOCK_PERIOD_NS}
        self.dma_ns = dma_ns
        self.latency, self.post_ns = {}, {}
        self.gpu = C.GPU                       # the GPU's costs of the runs (an input, section 1)
        for r in recs:
            if r["workload"] == "latency" and r["path"] == "ibgda" and r.get("gpu_costs"):
                self.gpu = C.GPU.with_(**r["gpu_costs"])
            if r["workload"] == "latency" and r.get("size", 8) == 8:
                # what is left once the RTL fabric's one-way latency is taken out; to the
                # signal's store (the RTL a2a points are compared at theirs: a poll every
                # poll_ns quantises what a GPU sees)
                self.latency[r["path"]] = r.get("post_to_signal_landed_ns", r["post_to_signal_ns"]) \
                    - self.rtl_fabric_ns[2]
        rates = {}
        for r in recs:
            if r["workload"] == "rate" and not r.get("tweaked"):
                best = r.get("steady_ops_per_s") if r["path"] == "ibgda" else r["ops_per_s"]
                rates[r["path"]] = max(rates.get(r["path"], 0), best or r["ops_per_s"])
        for path, rate in rates.items():
            self.post_ns[path] = 1e9 / rate        # per operation (a request, or a WQE)
        missing = [p for p in ("ibgda",) if p not in self.latency or p not in self.post_ns]
        if missing:
            raise ValueError(f"no latency or rate record for {missing}")

    def paths(self):
        return sorted(set(self.latency) & set(self.post_ns))

    def fitted(self):
        return {p: {"latency_ns": self.latency[p], "post_ns_per_op": self.post_ns[p]} for p in self.paths()}

    # ---- the closed forms ---------------------------------------------------------------------
    def _per_msg(self, path, size, wqes):
        """Time per message at the sender: the posting agent's (IBGDA: the engine takes one
        WQE per ``post_ns``; a proxy: one request per ``post_ns``) or the wire's."""
        post = self.post_ns[path] * (wqes if path == "ibgda" else 1)
        wire = write_wire_ns(size) + (wire_ns(ATOMIC_FRAME) if wqes > 1 else 0)
        return max(post, wire)

    def send(self, path, size, msgs, fabric_ns, wqes=1):
        """A PE's ``msgs`` messages of ``size`` bytes until the last is seen at its target.

        With a signal behind each (``wqes`` 2), message k lands at ``k * per + first``,
        except that the responder's atomic unit keeps the signal word on chip after the
        first signal to it: later ones skip its read from GPU memory (``dma_ns``), but
        none lands before the one ahead of it."""
        first = self.latency[path] + fabric_ns + write_wire_ns(size) - write_wire_ns(8)
        per = self._per_msg(path, size, wqes)
        if wqes == 1:
            return first + max(0, msgs - 1) * per
        land = first
        for k in range(1, int(msgs)):
            land = max(land, k * per + first - self.dma_ns)
        return land

    def batch_wait_ns(self, path, warps_per_qp, submissions):
        """What NVSHMEM's doorbell batching adds before a QP's first message when
        ``warps_per_qp`` warps post ``submissions`` to it back to back (IBGDA only).

        A submission rings when it is the newest on its QP or completes a batch of
        ``DB_BATCH``; with two or more warps racing, the one marking ready has always been
        overtaken by another's reservation, so the first doorbell waits for a whole batch.
        Submissions on a QP follow each other at the ready-marking chain's pace: a warp's
        reservation, WQE write and ready CAS over the warps, or one CAS each, the slower."""
        if path != "ibgda" or warps_per_qp < 2:
            return 0.0
        g = self.gpu
        each = max((2 * g.atomic_ns + g.wqe_write_ns) / warps_per_qp, g.atomic_ns)
        return (min(DB_BATCH, submissions) - 1) * each

    def a2a_ns(self, path, nodes, size, fabric=None):
        """All-to-all of ``size`` bytes per pair (put_signal) on ``nodes`` PEs."""
        f = self.rtl_fabric_ns[nodes] if fabric is None else fabric.one_way_ns(nodes)
        return self.send(path, size, nodes - 1, f, wqes=2)

    def moe_ns(self, path, ep, *, tokens=128, hidden=7168, topk=8, experts=None, fabric=None, sent=None,
               received=None, qpp=4):
        """DeepEP low-latency dispatch and combine on ``ep`` PEs: (dispatch_ns, combine_ns).

        The busiest PE decides: the most token messages one PE sends or receives (``sent``
        and ``received`` per PE when a run's routing is known; else the expected maximum of
        ``ep`` PEs' received counts under uniform routing, mean + sigma * sqrt(2 ln ep)).
        The combine's warps, one an (expert, source) pair, share the ``qpp`` QPs to each
        source: where two or more post to one QP, its first doorbell waits for a batch
        (:meth:`batch_wait_ns`)."""
        import math
        from tb.suites.seeds import moe_sizes
        experts = experts or max(32, ep)
        dsz, csz = moe_sizes(hidden)
        f = self.rtl_fabric_ns[ep] if fabric is None else fabric.one_way_ns(ep)
        if sent is not None and received is not None:
            msgs = max(max(sent), max(received))
        else:
            mean = tokens * topk * (ep - 1) / ep
            msgs = mean + math.sqrt(mean * (1 - 1 / ep)) * math.sqrt(2 * math.log(ep))
        counts = experts * (ep - 1) / ep
        disp = self.send(path, dsz, msgs, f) + counts * self._per_msg(path, 8, 1)
        per_pe = experts // ep
        comb = self.send(path, csz, msgs, f) + min(counts, msgs) * self._per_msg(path, 8, 1) \
            + self.batch_wait_ns(path, per_pe // min(qpp, per_pe), msgs / ((ep - 1) * min(qpp, per_pe)))
        return disp, comb

