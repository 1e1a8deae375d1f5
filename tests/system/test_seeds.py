"""Small versions of the `make seeds` workloads (tb/suites/seeds.py) with deterministic checks.

Each workload checks inside what it delivered (every byte in the peers' memories, every
signal, count and flag exact) and fails the cocotb test otherwise; here the records are
checked too (operation counts, doorbells, the proxy's requests). Nothing here asserts a
rate or a latency: those are benchmark figures (`make seeds`).

Verilator runs every workload on two engines and the four-engine ones (a2a, jacobi, moe)
through the switch model too, over the three paths. Icarus runs three small points on two
engines, the GPU path and the proxy path (every workload there took 47 s of the 12-minute
budget; the four-engine design is not built for Icarus: its switch regression runs on
Verilator).
"""
import json

import pytest

from scripts.run_seeds import run_all, run_points
from tb.suites.seeds import moe_routing

TINY_MOE = {"workload": "moe", "tokens": 4, "hidden": 512, "experts": 8, "topk": 2, "warps": 4}
PAIR = [
    {"workload": "rate", "path": "ibgda", "warps": 4, "qpp": 2, "ops": 64},
    {"workload": "rate", "path": "ibrc", "warps": 2, "qpp": 2, "ops": 4},
    {"workload": "coalesce", "path": "ibgda", "warps": 2, "qpp": 2, "groups": 2},
    {"workload": "bw", "path": "ibrc_mt", "size": 1024, "warps": 4, "qpp": 4, "ops": 8},
    {"workload": "latency", "path": "ibgda"},
    {"workload": "a2a", "path": "ibrc", "size": 100},
    {"workload": "jacobi", "path": "ibgda", "mode": "small", "halo": 64, "iters": 2},
    {**TINY_MOE, "path": "ibrc_mt"},
]
QUAD = [
    {"workload": "a2a", "path": "ibgda", "nodes": 4, "size": 5000},
    {"workload": "jacobi", "path": "ibrc_mt", "nodes": 4, "mode": "bulk", "halo": 64, "iters": 2},
    {**TINY_MOE, "path": "ibgda", "nodes": 4},
]
ICARUS = [
    {"workload": "a2a", "path": "ibgda", "size": 8},
    {"workload": "rate", "path": "ibrc", "warps": 1, "qpp": 1, "ops": 2},
    {"workload": "latency", "path": "ibrc"},
]


def _check(p, r):
    assert "failed" not in r, r.get("failed")
    assert r["workload"] == p["workload"] and r["path"] == p["path"]
    if p["workload"] == "rate":
        assert r["ops"] == p["warps"] * p["ops"]
        if p["path"] == "ibgda":
            # one submission a warp-wide call of 32 lanes; no more doorbells than submissions
            assert r["submissions"] == p["warps"] * -(-p["ops"] // 32)
            assert 1 <= r["gpu_doorbells"] == r["doorbells_at_nic"] <= r["submissions"]
        else:
            assert r["proxy_doorbells"] == r["doorbells_at_nic"] and r["submissions"] == 0
    elif p["workload"] == "coalesce":
        assert r["elements"] == p["warps"] * p["groups"] * 32
    elif p["workload"] == "bw":
        assert r["ops"] == p["warps"] * p["ops"]
        if p["path"] != "ibgda":
            # batches of up to 32 requests, a doorbell per QP of a batch
            assert r["proxy_doorbells"] == r["doorbells_at_nic"] >= r["proxy_batches"]
    elif p["workload"] == "latency":
        assert all(v >= 0 for v in r["stages_ns"].values())
        assert r["post_to_quiet_ns"] == pytest.approx(sum(r["stages_ns"].values()))
    elif p["workload"] == "a2a":
        assert len(r["per_pe_ns"]) == p.get("nodes", 2) and max(r["per_pe_ns"]) == r["latency_ns"]
    elif p["workload"] == "moe":
        route = moe_routing(p["tokens"], p["experts"], p["topk"], p.get("nodes", 2))
        per = p["experts"] // p.get("nodes", 2)
        want = [sum(e // per != i for t in route[i] for e in t) for i in range(p.get("nodes", 2))]
        assert r["messages_per_pe"] == want


@pytest.mark.parametrize("sim,pts", [("verilator", PAIR), ("verilator", QUAD), ("icarus", ICARUS)],
                         ids=["verilator-pair", "verilator-quad", "icarus-pair"])
def test_seeds_small(sim, pts):
    recs = run_points(pts, sim)
    for p, r in zip(pts, recs):
        _check(p, r)


def test_seeds_dask_equals_serial():
    """A local Dask cluster of two workers runs a small sweep; its records equal the serial run's."""
    from dask.distributed import Client, LocalCluster
    pts = [{"workload": "rate", "path": "ibgda", "warps": 2, "qpp": 2, "ops": 32},
           {"workload": "a2a", "path": "ibrc_mt", "size": 256}]
    serial = run_all(pts, client=None, say=lambda *_: None)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=40) as cluster, Client(cluster) as client:
        assert len(client.scheduler_info()["workers"]) == 2
        dist = run_all(pts, client=client, say=lambda *_: None)
    # (each record's ``sim_speed`` is the run's wall time, not a result: left out)
    def results(recs):
        return json.dumps([{k: v for k, v in r.items() if k != "sim_speed"} for r in recs], sort_keys=True)
    assert all("sim_speed" in r for r in serial + dist)
    assert results(dist) == results(serial)
