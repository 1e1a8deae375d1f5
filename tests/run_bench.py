"""`make bench`: run the throughput points of tb/bench.py and print the table."""
import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.run_sim import default_sim        # noqa: E402
from tests.sim import SIMULATORS, run        # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sim", default=os.environ.get("SIM") or None, choices=SIMULATORS)
    args = ap.parse_args()
    sim = args.sim or default_sim()
    out = ROOT / "build" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("*.json"):
        f.unlink()
    sizes = os.environ.get("BENCH_SIZES", "8,64,256,1024,4096,16384")
    env = {"IBGDA_BENCH_OUT": str(out), "BENCH_SIZES": sizes}
    print(f"running {len(sizes.split(','))} points on {sim} ...", flush=True)
    run(sim, "tb.bench", None, extra_env=env, test_dir=out / "run")
    recs = sorted((json.loads(f.read_text()) for f in out.glob("write_*.json")), key=lambda r: r["payload_bytes"])
    (out / "results.json").write_text(json.dumps(recs, indent=2))
    print(f"\n{'payload':>8} {'QPs':>4} {'msgs':>5} {'M msg/s':>9} {'goodput Gb/s':>13} "
          f"{'wire limit':>11} {'ratio':>6} {'model Gb/s':>11}")
    for r in recs:
        print(f"{r['payload_bytes']:>8} {r['qps']:>4} {r['messages']:>5} {r['messages_per_s'] / 1e6:>9.1f} "
              f"{r['goodput_gbps']:>13.1f} {r['wire_limit_goodput_gbps']:>11.1f} {r['ratio_to_wire_limit']:>6.2f} "
              f"{r['golden_model_goodput_gbps']:>11.1f}")
    print(f"\nresults: {out / 'results.json'} (pcaps beside it)")


if __name__ == "__main__":
    main()
