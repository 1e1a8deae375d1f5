"""Independent simulation points as tasks of Dask's distributed scheduler (`make seeds`,
`make bench`).

A task runs a list of points of one cocotb suite in one simulator process (the design is
built once per machine, under tb.runner's lock) in a temporary folder and returns the
files the points wrote, as data: a worker on another machine needs only its own checkout
where `make setup` ran. By default the tasks go to a local cluster of ``jobs`` worker
processes; ``scheduler`` (tcp://host:8786) sends them to a running Dask cluster.
"""
import time
from pathlib import Path


def run_suite(sim, module, top, points_env, points, out_env):
    """Run ``points`` (a list of dicts) of ``tb.suites.<module>`` on ``top``; return
    ``{"files": {file name: bytes}, "failed": [{"test", "point", "why"}, ...]}``: what they wrote into
    ``out_env``'s folder, and the points whose test failed (their checks, or the
    simulation died), so that a runner reports every failed point, not just the first."""
    import json
    import tempfile
    from tb.runner import SimulationFailed, run
    with tempfile.TemporaryDirectory(prefix="ibgda_task_") as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        failed = []
        try:
            run(sim, module, None, top=top, test_dir=Path(tmp) / "run", log_file=Path(tmp) / "log.txt",
                extra_env={out_env: str(out), points_env: json.dumps(points)})
        except SimulationFailed as e:
            log = (Path(tmp) / "log.txt").read_text(errors="replace").splitlines()
            why = [line.strip() for line in log if "Error" in line][-3:]       # the assertions' lines
            for name in e.failed:       # <suite>_<k>: the k-th point (tb/suites/__init__.py point_tests)
                k = name.rsplit("_", 1)[-1]
                point = points[int(k)] if k.isdigit() and int(k) < len(points) else None
                failed.append({"test": f"{module}.{name}", "point": point, "why": why})
        return {"files": {f.name: f.read_bytes() for f in sorted(out.iterdir()) if f.is_file()}, "failed": failed}


def client_for(scheduler, jobs):
    """(client, cluster): of the scheduler at ``scheduler``, or of a new local cluster of
    ``jobs`` single-threaded worker processes (cluster None when not ours)."""
    from dask.distributed import Client, LocalCluster
    if scheduler:
        return Client(scheduler), None
    cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True, dashboard_address=None,
                           silence_logs=40)
    return Client(cluster), cluster


def map_tasks(client, fn, args, labels, say=print):
    """``fn(*a)`` for every ``a`` of ``args`` as Dask tasks (or here, one after another,
    when ``client`` is None), with a line of progress as each ends; results in order."""
    t0 = time.time()
    if client is None:
        out = []
        for i, (a, lab) in enumerate(zip(args, labels), 1):
            out.append(fn(*a))
            say(f"[{i}/{len(args)}] {lab} ({time.time() - t0:.0f} s)")
        return out
    from dask.distributed import as_completed
    futs = {client.submit(fn, *a, pure=False, key=f"ibgda-{i}-{lab[:60]}"): i
            for i, (a, lab) in enumerate(zip(args, labels))}
    got = {}
    for n, fut in enumerate(as_completed(futs), 1):
        i = futs[fut]
        got[i] = fut.result()
        say(f"[{n}/{len(args)}] {labels[i]} ({time.time() - t0:.0f} s)")
    return [got[i] for i in range(len(args))]


def print_speed(recs, say=print):
    """The simulation's speed at each point (``sim_speed`` of ``tb.suites.point_tests``): a
    table, slowest first (issue 47's measure: a benchmark figure, not a check)."""
    rows = [(r.get("point", "?"), r["sim_speed"]) for r in recs if isinstance(r, dict) and r.get("sim_speed")]
    if not rows:
        return
    say(f"\nsimulation speed per point (engine cycles per wall second, {rows[0][1]['simulator']}):")
    say(f"{'point':<48} {'cycles':>9} {'wall s':>7} {'cycles/s':>9}")
    for name, sp in sorted(rows, key=lambda r: r[1]["cycles_per_s"]):
        say(f"{name[:48]:<48} {sp['cycles']:>9.0f} {sp['wall_s']:>7.1f} {sp['cycles_per_s']:>9.0f}")
