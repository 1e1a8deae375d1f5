"""`make fuzz`: the project's fuzzer (tb/suites/fuzz.py) on Verilator, 100,000 bad inputs or more.

Runs the four classes one after another with one seed (SEED=, default 1) and the counts
below (N= scales them: N=200000 doubles them), prints per class what it tried and what
it found, a table, and writes build/fuzz/report.json. A class that finds a mismatch
fails with the seed and counts that reproduce it (the same command replays it exactly;
FUZZ_KINDS=<kind,...> narrows a replay to some kinds of input).
"""
import argparse
import json
import os
import time
from pathlib import Path

from tb.runner import run

ROOT = Path(__file__).resolve().parents[1]
# bad inputs per class for N = 100,000 (the receive path takes the most: it runs at line rate)
SHARE = {"receive": 71_000, "responses": 24_000, "wqes": 2_000, "doorbells": 3_000}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=int(os.environ.get("SEED", "1")))
    ap.add_argument("--n", type=int, default=100_000, help="bad inputs in all (split as SHARE)")
    ap.add_argument("--only", help="one class: " + ", ".join(SHARE))
    a = ap.parse_args()
    out = ROOT / "build" / "fuzz"
    out.mkdir(parents=True, exist_ok=True)
    total = sum(SHARE.values())
    rows, failed = [], []
    t_all = time.time()
    for cls, share in SHARE.items():
        if a.only and cls != a.only:
            continue
        count = max(1, share * a.n // total)
        log = out / f"{cls}.log"
        print(f"fuzz {cls}: {count} bad inputs, seed {a.seed} (simulation log: {log}) ...", flush=True)
        t0 = time.time()
        env = {"FUZZ_SEED": str(a.seed), f"FUZZ_{cls.upper()}": str(count), "FUZZ_REPORT": str(out)}
        (out / f"{cls}.json").unlink(missing_ok=True)
        try:
            run("verilator", "tb.suites.fuzz", f"fuzz_{cls}", extra_env=env, log_file=log)
        except (Exception, SystemExit) as e:      # the report says what was found; go on with the others
            failed.append(cls)
            print(f"  {cls}: FAILED ({type(e).__name__})", flush=True)
        rep = out / f"{cls}.json"
        r = json.loads(rep.read_text()) if rep.exists() else {"class": cls, "ok": False, "tried": {}, "found": {}}
        r["seconds"] = round(time.time() - t0, 1)
        rows.append(r)
        print(f"  tried: {', '.join(f'{k} {v}' for k, v in sorted(r['tried'].items()))}")
        print(f"  found: {', '.join(f'{k} {v}' for k, v in sorted(r['found'].items()) if v)}")
        if not r.get("ok"):
            print(f"  MISMATCH: {r.get('error', 'no report')[:400]}")
            print(f"  reproduce: make fuzz SEED={a.seed} N={a.n} (class {cls}); repro: {r.get('repro')}")
    print()
    print(f"{'class':<10} {'bad inputs':>10} {'result':>8} {'seconds':>8}")
    for r in rows:
        print(f"{r['class']:<10} {r.get('bad_inputs', 0):>10} {'clean' if r.get('ok') else 'FAIL':>8} {r['seconds']:>8}")
    n_all = sum(r.get("bad_inputs", 0) for r in rows)
    print(f"{'all':<10} {n_all:>10} {'clean' if not failed else 'FAIL':>8} {time.time() - t_all:>8.1f}")
    (out / "report.json").write_text(json.dumps({"seed": a.seed, "bad_inputs": n_all, "classes": rows,
                                                 "seconds": round(time.time() - t_all, 1)}, indent=1))
    print(f"report: {out / 'report.json'}")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
