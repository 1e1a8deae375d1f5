"""What the posting agents cost: GPU warps (IBGDA) and CPU proxy threads (IBRC).

One source for the GPU model (``tb/nvshmem.py``), the proxy model (``tb/proxy.py``) and the
cluster model (``model/cluster.py``). Times are in ns. The defaults are published
measurements where one exists (the source beside each); the proxy's step costs are
*calibrated*: chosen so one proxy thread posts at NVSHMEM's published IBRC rate, about
1.7-2 M operations/s (SPEC section 7; NVIDIA's IBGDA blog measured 1.7 M ops/s of
nvshmem_p over IBRC on A100 + ConnectX-6). That rate is an *input* of every IBRC figure;
everything derived from it (bandwidth ratios, latencies, the Jacobi ratio) is a result.
"""
from dataclasses import asdict, dataclass, fields, replace


def _positive(obj):
    for f in fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ValueError(f"{type(obj).__name__}.{f.name} must be a number >= 0, not {v!r}")


class _Costs:
    """What both cost records share: a copy with some fields changed, a dict, checks."""
    def __post_init__(self):
        _positive(self)

    def with_(self, **kw):
        return replace(self, **kw)

    def as_dict(self):
        return asdict(self)


@dataclass(frozen=True)
class GpuCosts(_Costs):
    """What a GPU warp pays to post through IBGDA (NVSHMEM's device code, VERBS.md section 2).

    Parameters
    ----------
    atomic_ns : a dependent atomic on a word in GPU memory (L2): the slot reservation
        (atomicAdd on resv_head), each step of the in-order ready marking (atomicCAS on
        ready_head) and the post_send lock: taken as one L2 round trip, 146 ns on A100-80GB
        (about 205 cycles at 1.41 GHz; RRZE-HPC gpu-benches, gpu-latency pointer chase;
        H100 142 ns). No published atomic latency was found; this is the L2 hit.
    wqe_write_ns : one thread writes one 64-byte WQEBB (four 16-byte stores, posted);
        the 32 lanes of a warp write their WQEs at once.
    store_ns : one 4-byte store (the doorbell record).
    fence_ns : the release ordering of the doorbell-record and UAR stores (NVSHMEM stores
        them with st.release): until earlier stores are visible in L2, one L2 round trip.
    mmio_issue_ns : the thread issues the 8-byte UAR store (posted; the thread goes on).
    pcie_ns : a posted store from the GPU reaches the NIC (or host memory) across the
        PCIe switch: 0.5 us one way, half the 1 us read round trip of SPEC section 8 (no
        published one-way figure for a GPU's MMIO store was found).
    poll_ns : one poll of a word the NIC writes (a CQE, a signal): a volatile load that
        misses to HBM, 380 ns on A100-80GB (536 cycles; the same benchmark; H100 347 ns).
    """
    atomic_ns: float = 146.0
    wqe_write_ns: float = 20.0
    store_ns: float = 10.0
    fence_ns: float = 146.0
    mmio_issue_ns: float = 10.0
    pcie_ns: float = 500.0
    poll_ns: float = 380.0


@dataclass(frozen=True)
class ProxyCosts(_Costs):
    """What a CPU proxy thread pays per step (IBRC: NVSHMEM's proxy; with ``threads`` > 1
    and ``batch`` > 1 the multi-threaded, batching proxies of UCCL-EP and pplx fabric-lib).

    Parameters
    ----------
    request_ns : the GPU thread writes a request into the host-memory ring (a 16-64 byte
        posted store and a system fence) before it goes on; the request reaches host
        memory ``GpuCosts.pcie_ns`` later.
    poll_ns : the proxy reads a ring slot the GPU wrote (a cache miss to DRAM, about 100 ns
        on a server CPU).
    build_ns : the proxy builds one WQE in host memory (ibv_post_send's work).
    doorbell_ns : the doorbell record store, sfence and the uncached 8-byte MMIO store to
        the NIC's UAR (back-to-back uncached 8-byte MMIO stores leave a Xeon 50-300 ns
        apart: Intel community forum, "Why do MemReq TLPs take 100s nanoseconds to be
        generated after MMIO writes?").
    cq_poll_ns : one poll of the thread's CQ, which the NIC writes (a cache miss); it
        sees the completions of all the thread's QPs.
    complete_ns : the proxy writes a completion count into GPU memory (a posted store
        through a BAR mapping); the GPU sees it ``GpuCosts.pcie_ns`` later.
    threads : proxy threads (each owns a share of the QPs and its own request ring).
    batch : requests a thread drains per poll of its ring; one doorbell per QP per batch.

    The single-thread defaults add to 570 ns per operation (1.75 M ops/s): calibrated to
    the published IBRC rate, not measured here.
    """
    request_ns: float = 40.0
    poll_ns: float = 100.0
    build_ns: float = 100.0
    doorbell_ns: float = 200.0
    cq_poll_ns: float = 100.0
    complete_ns: float = 70.0
    threads: int = 1
    batch: int = 1

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.threads, int) or self.threads < 1 or not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"threads and batch must be integers >= 1, not {self.threads!r} / {self.batch!r}")

    @property
    def per_op_ns(self):
        """One thread's time per operation when every poll finds one request."""
        return self.poll_ns + self.build_ns + self.doorbell_ns + self.cq_poll_ns + self.complete_ns


GPU = GpuCosts()
PROXY = ProxyCosts()
# the multi-threaded, batching proxy: UCCL-EP runs 4 proxy threads per GPU (kNumProxyThs),
# each draining every new command of its rings and posting them per destination as one
# chain (one doorbell), at most 32 in flight in low-latency mode (arXiv 2512.19849 and its
# code); pplx fabric-lib chains up to 4 WRs per ibv_post_send (arXiv 2510.27656)
PROXY_MT = ProxyCosts(threads=4, batch=32)
PATHS = ("ibgda", "ibrc", "ibrc_mt")
PATH_LABELS = {"ibgda": "IBGDA", "ibrc": "IBRC (1 proxy thread)", "ibrc_mt": "IBRC (4 threads, batched)"}


def proxy_costs(path):
    """The proxy of an IBRC path name."""
    return {"ibrc": PROXY, "ibrc_mt": PROXY_MT}[path]
