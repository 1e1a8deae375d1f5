"""`make seeds` (QUICK=1: a subset): IBGDA against IBRC on the same RTL, the published table rerun.

Runs the workloads of tb/suites/seeds.py on two RTL engines back to back and four through
the switch model, for IBGDA and both IBRC proxies, as independent tasks of a Dask
distributed scheduler (a local cluster of JOBS worker processes by default, or the one at
SCHEDULER=tcp://host:8786), fits the cluster model (model/cluster.py) to the RTL points,
prints the table beside the published figures, and writes build/seeds/results.json and
the plots.
"""
import argparse
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from rtl.build import PAIR_TOP_NAME, QUAD_TOP_NAME
from spec import costs as C

PATHS = C.PATHS
SIZES = [8, 64, 256, 1024]
A2A_SIZES = [8, 1024, 8192, 65536]


def points(quick):
    """The RTL points: a list of ``tb.suites.seeds`` point dicts."""
    out = []
    for path in PATHS:
        gda = path == "ibgda"
        # message rate: 8-byte p from many warps (IBGDA) / enough to keep the proxy busy
        out.append({"workload": "rate", "path": path, "warps": 128 if gda else 16, "qpp": 4 if gda else 8,
                    "ops": (256 if not quick else 64) if gda else (32 if not quick else 16)})
        if gda:     # the same with turns of 4 x 128 WQEBBs (QP weight 4): the wire either way since
                    # a turn reads past its cut only what the QPs' largest WQE needs (QP_MAX_WQEBBS)
            out.append({"workload": "rate", "path": path, "warps": 128, "qpp": 4, "weight": 4,
                        "ops": 256 if not quick else 64})
        out.append({"workload": "coalesce", "path": path, "warps": 126 if gda else 16, "qpp": 63 if gda else 8,
                    "groups": (16 if not quick else 4) if gda else 4})
        for size in (SIZES if not quick else [8, 1024]):
            out.append({"workload": "bw", "path": path, "size": size, "warps": 64 if gda else 16,
                        "qpp": 16 if gda else 8, "ops": (64 if gda else 16) if not quick else (32 if gda else 8)})
        out.append({"workload": "latency", "path": path})
        for nodes in (2, 4):
            for size in (A2A_SIZES if not quick else [8, 65536]):
                out.append({"workload": "a2a", "path": path, "nodes": nodes, "size": size})
        for mode in ("small", "bulk"):
            out.append({"workload": "jacobi", "path": path, "nodes": 4, "mode": mode,
                        "halo": 512 if not quick else 128, "iters": 2})
        out.append({"workload": "moe", "path": path, "nodes": 4, "tokens": 128 if not quick else 8,
                    "hidden": 7168, "experts": 32, "topk": 8})
    if not quick:
        # the MoE dispatch and combine with 256 KiB switch queues: incast drops, go-back-N
        out.append({"workload": "moe", "path": "ibgda", "nodes": 4, "tokens": 32, "hidden": 7168, "experts": 32,
                    "topk": 8, "queue_kib": 256})
        # one QP shared by 1, 8 and 128 warps, against a QP per warp (the "many blocks on one
        # QP" slowdown), and how the GPU's costs move the rate
        for warps, qpp in ((1, 1), (8, 1), (128, 1), (8, 8), (32, 32)):
            out.append({"workload": "rate", "path": "ibgda", "warps": warps, "qpp": qpp, "ops": 4096 // warps + 32
                        if warps < 128 else 64})
        for k, v in (("atomic_ns", 400.0), ("atomic_ns", 50.0), ("pcie_ns", 1000.0), ("pcie_ns", 250.0)):
            out.append({"workload": "rate", "path": "ibgda", "warps": 8, "qpp": 1, "ops": 512, "gpu": {k: v}})
        for k, v in (("doorbell_ns", 400.0), ("doorbell_ns", 100.0), ("build_ns", 200.0)):
            out.append({"workload": "rate", "path": "ibrc", "warps": 16, "qpp": 8, "ops": 16, "proxy": {k: v}})
    return out


def run_points(pts, sim="verilator"):
    """Run ``pts`` (all of one node count) in one simulator process; return their records
    (a Dask task: see scripts/tasks.py)."""
    from scripts.tasks import run_suite
    from tb.suites.seeds import point_name
    nodes = {p.get("nodes", 2) for p in pts}
    if len(nodes) != 1:
        raise ValueError("one task runs points of one node count")
    top = QUAD_TOP_NAME if nodes == {4} else PAIR_TOP_NAME
    res = run_suite(sim, "tb.suites.seeds", top, "SEEDS_POINTS", pts, "IBGDA_SEEDS_OUT")
    files = res["files"]
    recs = []
    for p in pts:
        f = f"{point_name(p)}.json"
        recs.append(json.loads(files[f]) if f in files else
                    {"point": point_name(p), "failed": next((x for x in res["failed"] if x["point"] == p),
                                                           {"test": "?", "point": p, "why": ["wrote no result"]})})
    return recs


def run_all(pts, *, sim="verilator", client=None, say=print):
    """Every point through ``client`` (None: serially here), light ones packed into
    tasks; records in the order of ``pts``."""
    from scripts.tasks import map_tasks
    from tb.suites.seeds import point_name
    groups = tasks(pts) if client is not None else [[k] for k in range(len(pts))]
    res = map_tasks(client, run_points, [([pts[k] for k in ks], sim) for ks in groups],
                    [", ".join(point_name(pts[k]) for k in ks) for ks in groups], say=say)
    got = {}
    for ks, recs in zip(groups, res):
        got.update(zip(ks, recs))
    return [got[k] for k in range(len(pts))]


def tasks(pts, unit=4):
    """The points as tasks: the heaviest first (so the last to finish are short), the light
    ones of one node count packed into tasks of about ``unit`` weight (each simulator start
    costs seconds)."""
    order = sorted(range(len(pts)), key=lambda k: -_weight(pts[k]))
    out, open_ = [], {}
    for k in order:
        n = pts[k].get("nodes", 2)
        if _weight(pts[k]) >= unit:
            out.append([k])
            continue
        cur = open_.setdefault(n, [])
        cur.append(k)
        if sum(_weight(pts[j]) for j in cur) >= unit:
            out.append(cur)
            open_[n] = []
    return out + [ks for ks in open_.values() if ks]


def _weight(p):
    w = {"moe": 50, "jacobi": 10, "a2a": 3}.get(p["workload"], 1)
    return w * (2 if p.get("nodes", 2) == 4 else 1) * (4 if p["path"] == "ibrc" else 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", default=bool(os.environ.get("QUICK")))
    ap.add_argument("--scheduler", default=os.environ.get("SCHEDULER") or None,
                    help="a Dask scheduler address (tcp://host:8786); default: a local cluster")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS") or os.cpu_count() or 2))
    ap.add_argument("--serial", action="store_true", help="no scheduler: one point after another here")
    ap.add_argument("--report-only", action="store_true",
                    help="no simulation: the table and plots again from build/seeds/records.json")
    args = ap.parse_args()
    out = ROOT / "build" / "seeds"
    out.mkdir(parents=True, exist_ok=True)
    from scripts.seeds_report import report
    if args.report_only:
        saved = json.loads((out / "records.json").read_text())
        report(saved["records"], out, quick=saved["quick"])
        return
    for f in list(out.glob("*.png")) + list(out.glob("results.json")):
        f.unlink()
    from tb.runner import build
    pts = points(args.quick)
    for top in (PAIR_TOP_NAME, QUAD_TOP_NAME):      # build once here, before the workers share it
        build("verilator", top=top)
    where = "serially" if args.serial else (f"on {args.scheduler}" if args.scheduler else
                                             f"on a local Dask cluster of {args.jobs} workers")
    print(f"seeds: {len(pts)} RTL points{' (QUICK)' if args.quick else ''} {where} ...", flush=True)
    from scripts.tasks import client_for
    client = cluster = None
    if not args.serial:
        client, cluster = client_for(args.scheduler, args.jobs)
    try:
        recs = run_all(pts, client=client)
    finally:
        if client:
            client.close()
        if cluster:
            cluster.close()
    failed = [r for r in recs if "failed" in r]
    if failed:
        # a point whose checks failed has no figure, so no table either: the run fails, naming each
        (out / "failed.json").write_text(json.dumps([r["failed"] for r in failed], indent=1))
        print(f"seeds: FAILED: {len(failed)} of {len(recs)} points failed their checks (build/seeds/failed.json):")
        for r in failed:
            print(f"  {r['point']}: {r['failed']['test']}")
            for line in r["failed"]["why"]:
                print(f"    {line[:300]}")
        raise SystemExit(1)
    (out / "records.json").write_text(json.dumps({"quick": args.quick, "records": recs}, indent=1))
    res = report(recs, out, quick=args.quick)
    from scripts.tasks import print_speed
    print_speed(recs)
    over = [c["what"] for c in (res["model"]["checks"] or []) if not c["ok"]]
    if over:
        print(f"seeds: FAILED: the cluster model is off by more than 5% at {len(over)} of "
              f"{len(res['model']['checks'])} points: {'; '.join(over)}")
        raise SystemExit(1)
    print(f"seeds: all {len(recs)} points passed their checks; the cluster model within 5% of every one it predicts")


if __name__ == "__main__":
    main()
