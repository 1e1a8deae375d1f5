"""`make profile`: where a simulation's wall time goes (issue 47, point 1).

Runs the default scenario (`make sim`'s job; `WHAT=bench`: one `make bench` point, 4 KiB
WRITEs from 8 QPs; `WHAT=quad`: one four-engine `make seeds` point, the 8-byte all-to-all
of 4 nodes) with cocotb's Python profiler on, then splits the test's wall time into:

- the simulator and the C side of its interface: the wall time no Python code ran in (the
  Verilator or Icarus model evaluating cycles, VPI/GPI scheduling its callbacks);
- the simulator interface, Python side: the calls that read and write signals (cocotb's
  handles and the simulator module's getters and setters, the logic-value conversions);
- the cocotb scheduler (triggers, tasks);
- each Python model of the testbench (by file: `tb/memory.py`, `tb/wire.py`, ...), the
  golden model (`model/`), scapy and the AXI libraries, by the time spent in their own
  code (cProfile's tottime).

A profile, not a test: cProfile slows the Python side (the split is its shares of a slower
run; the speed line is that run's), and figures move with the machine's load. The table
goes to the terminal, build/profile/profile.json, and cProfile's own file
(build/profile/run/cocotb.pstat: `python -m pstats` reads it).
"""
import argparse
import json
import shutil
import os
import pstats
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rtl.build import QUAD_TOP_NAME, TOP_NAME
from scripts.run_sim import default_sim
from tb.runner import SIMULATORS, SimulationFailed, run

# what -> (cocotb module, top, its environment, the record holding cycles and wall time)
TARGETS = {
    "scenario": ("tb.suites.scenario", TOP_NAME, {"IBGDA_SIM_OUT": "{out}"}, "summary.json"),
    "bench": ("tb.suites.bench", TOP_NAME,
              {"IBGDA_BENCH_OUT": "{out}", "BENCH_POINTS": json.dumps(
                  [{"size": 4096, "qps": 8, "batch": 32, "latency_ns": 1000, "msgs": 32}])},
              "write_4096B_8qp_b32_1000ns.json"),
    "quad": ("tb.suites.seeds", QUAD_TOP_NAME,
             {"IBGDA_SEEDS_OUT": "{out}", "SEEDS_POINTS": json.dumps(
                 [{"workload": "a2a", "path": "ibgda", "nodes": 4, "size": 8}])}, None),
}

# (group, test on the profiled function's file name), first match wins
GROUPS = [
    ("simulator interface (Python side)", lambda f: "/cocotb/handle.py" in f or "/cocotb/types/" in f
     or f.startswith("~") and "cocotb.simulator" in f),
    ("cocotb scheduler", lambda f: "/cocotb/" in f or "/cocotb_tools/" in f),
    ("scapy (frames built and checked)", lambda f: "/scapy/" in f),
    ("cocotbext-axi, cocotb-bus (AXI masters, streams)", lambda f: "/cocotbext/" in f or "/cocotb_bus/" in f),
    ("golden model (model/)", lambda f: "/model/" in f and str(ROOT) in f),
    ("spec/", lambda f: "/spec/" in f and str(ROOT) in f),
]


def group_of(path, func):
    key = f"~ {func}" if path == "~" else path
    for name, test in GROUPS:
        if test(key):
            return name
    if str(ROOT / "tb") in path:
        return str(Path(path).relative_to(ROOT))
    if path == "~":
        return "Python builtins"
    return "other Python"


def split(pstat_file, wall):
    """{group: seconds of own time} and the Python total, from a cProfile dump."""
    stats = pstats.Stats(str(pstat_file)).stats
    groups, total = {}, 0.0
    for (path, _line, func), (_cc, _nc, tottime, _ct, _callers) in stats.items():
        g = group_of(path, func)
        groups[g] = groups.get(g, 0.0) + tottime
        total += tottime
    groups["simulator and its C interface (no Python running)"] = max(0.0, wall - total)
    return groups, total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sim", default=os.environ.get("SIM") or None, choices=SIMULATORS)
    ap.add_argument("--what", default=os.environ.get("WHAT") or "scenario", choices=sorted(TARGETS))
    args = ap.parse_args()
    sim = args.sim or default_sim()
    out = ROOT / "build" / "profile" / args.what
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    run_dir = out / "run"
    module, top, env, record = TARGETS[args.what]
    env = {k: v.replace("{out}", str(out)) for k, v in env.items()}
    print(f"profile: {args.what} on {sim} with cocotb's profiler ...", flush=True)
    try:
        run(sim, module, "default_scenario" if args.what == "scenario" else None, top=top, test_dir=run_dir,
            log_file=out / "sim.log", extra_env={**env, "COCOTB_ENABLE_PROFILING": "1"})
    except SimulationFailed as e:
        sys.exit(f"profile: FAILED: {', '.join(e.failed)} (see {out / 'sim.log'})")
    pstat = run_dir / "cocotb.pstat"
    if not pstat.exists():
        sys.exit(f"profile: cocotb wrote no profile ({pstat})")
    if record == "summary.json":
        summary = json.loads((out / record).read_text())
        wall, cycles = summary["wall_s"], summary["sim_cycles"]
    else:
        recs = [json.loads(f.read_text()) for f in sorted(out.glob("*.json")) if record in (None, f.name)]
        speed = recs[0]["sim_speed"]
        wall, cycles = speed["wall_s"], speed["cycles"]
    groups, py_total = split(pstat, wall)
    rows = sorted(groups.items(), key=lambda kv: -kv[1])
    print(f"\n{cycles:.0f} cycles in {wall:.1f} s wall: {cycles / wall:.0f} cycles/s on {sim} (profiler on); "
          f"Python {py_total:.1f} s of it")
    print(f"{'where':58s} {'s':>8s} {'share':>7s} {'us/cycle':>9s}")
    for name, sec in rows:
        if sec < 0.005 * wall:
            continue
        print(f"{name:58s} {sec:8.2f} {100 * sec / wall:6.1f}% {1e6 * sec / cycles:9.1f}")
    small = sum(sec for _, sec in rows if sec < 0.005 * wall)
    if small:
        print(f"{'(the rest, each under 0.5%)':58s} {small:8.2f} {100 * small / wall:6.1f}%")
    report = {"simulator": sim, "what": args.what, "sim_cycles": cycles, "wall_s": wall,
              "cycles_per_s": cycles / wall, "python_s": py_total, "groups_s": dict(rows)}
    (out / "profile.json").write_text(json.dumps(report, indent=2))
    print(f"\nreport: {out / 'profile.json'}; cProfile's dump: {pstat}")


if __name__ == "__main__":
    main()
