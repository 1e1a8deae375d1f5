"""`make fuzz`: the project's fuzzer (tb/suites/fuzz.py) on Verilator, 100,000 bad inputs or more.

Runs the four classes one after another with one seed (SEED=, default 1) and the counts
below (N= scales them: N=200000 doubles them), prints per class what it tried and what
it found, a table, and writes build/fuzz/report.json. A class that finds a mismatch
fails with the seed and counts that reproduce it (the same command replays it exactly;
FUZZ_KINDS=<kind,...> narrows a replay to some kinds of input). A class that fails fails
the run: the table and its total say FAIL, the last line names the classes and the
command that replays each, report.json has them under "failed", and the exit code is 1.
``--wrong-model`` runs against a deliberately wrong expectation (the receive class's
model is told one preloaded byte of GPU memory other than it is): the self-test that a
disagreement fails the run (tests/system/test_fuzz.py).
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
    ap.add_argument("--wrong-model", action="store_true",
                    help="self-test: the receive class's model expects one wrong byte (the run must fail)")
    ap.add_argument("--out", default=str(ROOT / "build" / "fuzz"), help="where the logs and report.json go")
    a = ap.parse_args()
    if a.only and a.only not in SHARE:
        ap.error(f"--only takes one of {', '.join(SHARE)}, not {a.only!r}")
    out = Path(a.out).resolve()        # (the simulation runs in its own folder)
    out.mkdir(parents=True, exist_ok=True)
    total = sum(SHARE.values())
    rows = []
    t_all = time.time()
    for cls, share in SHARE.items():
        if a.only and cls != a.only:
            continue
        count = max(1, share * a.n // total)
        log = out / f"{cls}.log"
        print(f"fuzz {cls}: {count} bad inputs, seed {a.seed} (simulation log: {log}) ...", flush=True)
        t0 = time.time()
        env = {"FUZZ_SEED": str(a.seed), f"FUZZ_{cls.upper()}": str(count), "FUZZ_REPORT": str(out)}
        if a.wrong_model:
            env["FUZZ_WRONG_MODEL"] = "1"
        (out / f"{cls}.json").unlink(missing_ok=True)
        crashed = None
        try:
            run("verilator", "tb.suites.fuzz", f"fuzz_{cls}", extra_env=env, log_file=log)
        except (Exception, SystemExit) as e:      # the report says what was found; go on with the others
            crashed = f"{type(e).__name__}: {e}"
        rep = out / f"{cls}.json"
        r = json.loads(rep.read_text()) if rep.exists() else {"class": cls, "ok": False, "tried": {}, "found": {},
                                                               "error": "the simulation wrote no report"}
        if crashed and r.get("ok"):       # a report that says clean from a run that failed: not clean
            r["ok"], r["error"] = False, f"the simulation failed after its report: {crashed}"
        r["seconds"] = round(time.time() - t0, 1)
        r["replay"] = (f".venv/bin/python -m scripts.run_fuzz --seed {a.seed} --n {a.n} --only {cls}"
                       + (" --wrong-model" if a.wrong_model else ""))
        rows.append(r)
        print(f"  tried: {', '.join(f'{k} {v}' for k, v in sorted(r['tried'].items()))}")
        print(f"  found: {', '.join(f'{k} {v}' for k, v in sorted(r['found'].items()) if v)}")
        if not r.get("ok"):
            print(f"  {cls}: FAIL: {r.get('error', 'no report')[:400]}")
            print(f"  replay: {r['replay']}; repro: {r.get('repro')}")
        print(f"  {cls}: {'clean' if r.get('ok') else 'FAIL'} in {r['seconds']} s", flush=True)
    failed = [r["class"] for r in rows if not r.get("ok")]
    print()
    print(f"{'class':<10} {'bad inputs':>10} {'result':>8} {'seconds':>8}")
    for r in rows:
        print(f"{r['class']:<10} {r.get('bad_inputs', 0):>10} {'clean' if r.get('ok') else 'FAIL':>8} {r['seconds']:>8}")
    n_all = sum(r.get("bad_inputs", 0) for r in rows)
    print(f"{'all':<10} {n_all:>10} {'FAIL' if failed else 'clean':>8} {time.time() - t_all:>8.1f}")
    (out / "report.json").write_text(json.dumps({
        "seed": a.seed, "bad_inputs": n_all, "ok": not failed, "failed": failed,
        "replay": {r["class"]: r["replay"] for r in rows if not r.get("ok")}, "classes": rows,
        "seconds": round(time.time() - t_all, 1)}, indent=1))
    print(f"report: {out / 'report.json'}")
    if failed:
        print(f"fuzz: FAILED: {len(failed)} of {len(rows)} classes ({', '.join(failed)}); replay with: "
              + "; ".join(r["replay"] for r in rows if not r.get("ok")))
        raise SystemExit(1)
    print(f"fuzz: all {len(rows)} classes clean ({n_all} bad inputs, seed {a.seed})")


if __name__ == "__main__":
    main()
