"""Build the engine once per simulator and run cocotb modules against it."""
import fcntl
import hashlib
import os
import re
import shutil
from pathlib import Path

from cocotb_tools.runner import get_runner

from rtl.build import generate, TOP_NAME

ROOT = Path(__file__).resolve().parents[1]

SIMULATORS = ("icarus", "verilator")
VERILATOR_CACHE = Path(os.environ.get("IBGDA_CACHE", Path.home() / ".cache" / "ibgda-nic"))


def find_verilator():
    """Path to a Verilator >= 5.036: the one `make setup` built, else the one on PATH."""
    for cand in sorted(VERILATOR_CACHE.glob("verilator-*/bin"), reverse=True):
        if (cand / "verilator").exists():
            return cand
    which = shutil.which("verilator")
    return Path(which).parent if which else None


def cocotb_tests(module):
    """Names of the ``@cocotb.test()`` coroutines written out in ``tb/suites/<module>.py``."""
    names = re.findall(r"@cocotb\.test\(\)\nasync def (\w+)", (ROOT / "tb" / "suites" / f"{module}.py").read_text())
    if not names:
        raise RuntimeError(f"no cocotb tests found in tb/suites/{module}.py")
    return names


def require(sim):
    """Fail (not skip) with a clear message when a simulator is missing."""
    if sim == "icarus":
        if not shutil.which("iverilog"):
            raise RuntimeError("Icarus Verilog (iverilog) is not installed: run `make setup`")
    elif sim == "verilator":
        path = find_verilator()
        if path is None:
            raise RuntimeError("Verilator >= 5.036 is not installed: run `make setup`")
        if str(path) not in os.environ["PATH"].split(os.pathsep):
            os.environ["PATH"] = f"{path}{os.pathsep}{os.environ['PATH']}"
    else:
        raise ValueError(f"unknown simulator {sim!r}; use one of {SIMULATORS}")


def build_dir(sim, waves=False, top=TOP_NAME):
    # ibgda_nic -> sim_<sim>, ibgda_nic_pair -> sim_<sim>_pair, ...
    suffix = top[len(TOP_NAME):] if top.startswith(TOP_NAME) else f"_{top}"
    return ROOT / "build" / f"sim_{sim}{suffix}{'_waves' if waves else ''}"


_KICK = re.compile(r"^(\s*)reg (\\\$auto\$verilog_backend\S+)\s+= 0;$", re.M)
# ``always @*`` whose only statement stores a constant: no input, so Icarus never runs it
_CONST_ALWAYS = re.compile(r"^(\s*)always @\*\n\s*(\S[^=\n]*?) = (\d+'[hbd][0-9a-fA-FxXzZ_]+);$", re.M)


def icarus_kick(path):
    """Make Icarus run every combinational block once at start-up.

    Yosys guards each ``always @*`` with a dummy register initialised to 0 so that
    simulators evaluate the block at time 0; Icarus sees no event on it and leaves
    such outputs X until an input changes. Toggling the register at 1 ns wakes them.
    A block that only stores a constant has no input at all: it becomes ``initial``.
    """
    text = path.read_text()
    text = _KICK.sub(lambda m: f"{m.group(1)}reg {m.group(2)}  = 0;\n"
                               f"{m.group(1)}initial #1 {m.group(2)}  = 1;", text)
    # and a block that only stores a constant becomes an initial store
    text = _CONST_ALWAYS.sub(lambda m: f"{m.group(1)}initial {m.group(2)} = {m.group(3)};", text)
    out = path.with_name(path.stem + "_icarus.v")
    if not out.exists() or out.read_text() != text:
        out.write_text(text)
    return out


def _source_hash():
    h = hashlib.sha256()
    for d in ("rtl", "spec"):           # every source file, subfolders too
        for f in sorted((ROOT / d).rglob("*.py")):
            h.update(str(f.relative_to(ROOT)).encode() + f.read_bytes())
    return h.hexdigest()


def _generate_once(outdir, top):
    """Elaborate the design only when its sources changed (elaboration takes seconds)."""
    stamp = outdir / ".source-hash"
    digest = _source_hash()
    verilog = outdir / f"{top}.v"
    if not (verilog.exists() and stamp.exists() and stamp.read_text() == digest):
        verilog = generate(outdir, top=top)
        stamp.write_text(digest)
    return verilog


def build(sim, *, waves=False, top=TOP_NAME):
    """Generate the Verilog of ``top`` and compile it for ``sim`` (skipped when up to date)."""
    require(sim)
    bdir = build_dir(sim, waves, top)
    bdir.mkdir(parents=True, exist_ok=True)
    with open(bdir.parent / f".{bdir.name}.lock", "w") as lock:   # pytest-xdist workers build once
        fcntl.flock(lock, fcntl.LOCK_EX)
        verilog = _generate_once(bdir / "rtl", top)
        if sim == "icarus":
            verilog = icarus_kick(verilog)
        runner = get_runner(sim)
        args = []
        if sim == "verilator":
            args = ["-Wno-fatal", "-Wno-WIDTH", "-Wno-UNOPTFLAT", "-O3", "--x-assign", "fast",
                    "--x-initial", "fast"]
            if waves:
                args += ["--trace-fst", "--trace-structs"]
            elif top != TOP_NAME:
                args.append("--hierarchical")       # the engine's hier_block, compiled once
        runner.build(sources=[verilog], hdl_toplevel=top, build_dir=bdir, build_args=args,
                     timescale=("1ns", "1ps"), waves=waves, always=False)
    return runner, bdir


def run(sim, module, testcase=None, *, waves=False, extra_env=None, test_dir=None, top=TOP_NAME):
    runner, bdir = build(sim, waves=waves, top=top)
    env = dict(extra_env or {})
    test_dir = Path(test_dir) if test_dir else bdir / "runs" / (testcase or module.rsplit(".", 1)[-1])
    test_dir.mkdir(parents=True, exist_ok=True)
    return runner.test(hdl_toplevel=top, test_module=module, testcase=testcase, build_dir=bdir,
                       test_dir=test_dir, waves=waves, extra_env=env)
