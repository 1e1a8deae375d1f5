"""Generate Verilog for the engine: ``python -m rtl.build [outdir]``."""
import re
import sys
from pathlib import Path

from amaranth._toolchain.yosys import find_yosys
from amaranth.back import rtlil

from spec.params import ARRAY_NUM_QPS, QUAD_COUNT

from .top import IbgdaNic

TOP_NAME = "ibgda_nic"
PAIR_TOP_NAME = "ibgda_nic_pair"
# Two engines for the system tests of NICs talking to each other, of fewer QPs than the
# default build (spec.params.ARRAY_NUM_QPS says why).
PAIR_PARAMS = {"num_qps": ARRAY_NUM_QPS}
QUAD_TOP_NAME = "ibgda_nic_quad"
# Four engines through a switch model (all-to-all): the pair's engine, elaborated once for both.
QUAD_PARAMS = {"count": QUAD_COUNT, **PAIR_PARAMS}

_PORT = re.compile(r"^\s*(input|output)\s+(\[\d+:0\]\s+)?(\w+);$", re.M)


def module_ports(text, name):
    """The ports of module ``name`` in Verilog ``text`` as Yosys writes them:
    ``[(direction, width such as "[7:0]" or "", name)]`` in declaration order."""
    start = text.index(f"module {name}(")
    header = text[start:text.index("endmodule", start)]
    return [(d, (w or "").strip(), p) for d, w, p in _PORT.findall(header)]


ENGINE_NAME = "ibgda_nic_engine"

# Yosys turns Amaranth's RTLIL into Verilog, in two flavours from the one RTLIL:
# - ``""``: what Amaranth's own ``verilog.convert`` writes (``build/verilog``, lint,
#   Icarus, waveforms): each register's next value an ``always @*`` process that ends
#   ``if (rst) next = init``;
# - ``"_sdff"``, for Verilator's models: with those processes every register's logic
#   depends on the ``rst`` input, and Verilator re-evaluates all logic that depends on a
#   top-level input at every evaluation of the model (three or more a simulated cycle).
#   Here the processes become multiplexers and ``opt_dff`` moves each synchronous reset
#   into its flip-flop (``always @(posedge clk) if (rst) q <= init; else q <= d;``): the
#   same logic (yosys's equivalence-preserving passes), the reset out of the next-state
#   logic. (The opt_clean before it removes the named wire between the reset multiplexer
#   and the flip-flop, which hides the pattern from opt_dff.) Icarus cannot read it: it
#   takes the functions yosys writes for parallel multiplexers for system functions.
FLAVOURS = {
    "": ("proc -nomux -norom", "memory_collect", "write_verilog -norename"),
    "_sdff": ("proc -norom", "opt_clean", "opt_dff -nodffe", "opt_clean", "memory_collect",
              "write_verilog -norename"),
}


def to_verilog(elaboratable, name):
    """The Verilog of ``elaboratable`` as module ``name``: ``{flavour: text}`` (see
    ``FLAVOURS``), elaborated once."""
    text = rtlil.convert(elaboratable, name=name, emit_src=False)
    yosys = find_yosys(lambda ver: ver >= (0, 40))
    return {flavour: yosys.run(["-q", "-"], "\n".join([f"read_rtlil <<rtlil\n{text}\nrtlil", *script]),
                               ignore_warnings=True)      # (Amaranth's convert ignores them too)
            for flavour, script in FLAVOURS.items()}


def flavour_path(path, flavour):
    """``path`` (``<name>.v``) of flavour ``flavour``: ``<name><flavour>.v``."""
    path = Path(path)
    return path.with_name(f"{path.stem}{flavour}{path.suffix}")


def engine_verilog(engine_cache=None, **params):
    """The Verilog of one engine, module ``ENGINE_NAME``, for the array tops
    (``{flavour: text}``); ``engine_cache``: a file holding it for these parameters and
    sources (with one sibling per flavour; written when missing; the caller keys and
    locks it), so the pair and the quad elaborate it once."""
    if engine_cache is not None and all(flavour_path(engine_cache, f).exists() for f in FLAVOURS):
        return {f: flavour_path(engine_cache, f).read_text() for f in FLAVOURS}
    texts = to_verilog(IbgdaNic(**params), ENGINE_NAME)
    if engine_cache is not None:
        for f, text in texts.items():
            tmp = Path(f"{flavour_path(engine_cache, f)}.tmp")
            tmp.write_text(text)
            tmp.replace(flavour_path(engine_cache, f))
    return texts


def array_verilog(name, count, *, engine_cache=None, **params):
    """Verilog of ``count`` independent engines on one clock, for system tests of NICs
    talking to each other (a cocotb simulation has one top level).

    The engine is written once (module ``ENGINE_NAME``) and a top level ``name``
    instantiates it ``count`` times, NIC i's ports named ``n<i>_<port>`` (``clk`` and
    ``rst`` shared). An Amaranth design holding several engines would be elaborated into
    a copy of every module per engine, which a simulator compiles ``count`` times.
    """
    if not isinstance(count, int) or count < 2:
        raise ValueError(f"count must be an integer >= 2, not {count!r}")
    return {f: _array_of(name, count, text) for f, text in engine_verilog(engine_cache, **params).items()}


def _array_of(name, count, text):
    """``text`` (the engine's Verilog) with the array top ``name`` of ``count`` engines."""
    engine = ENGINE_NAME
    start = text.index(f"module {engine}(")
    ports = module_ports(text, engine)
    # Verilator (with --hierarchical, as tb/runner.py builds these tops) verilates and
    # compiles a hier_block once, however often it is instantiated; without it the engine's
    # code would be generated once per instance (four times the C++ for the quad: a
    # 7-minute build instead of under 2). Other tools ignore the comment.
    body = text.index(");\n", start) + 3
    text = text[:body] + "  /*verilator hier_block*/\n" + text[body:]
    shared = {"clk", "rst"}
    if not shared <= {p for _, _, p in ports}:
        raise RuntimeError(f"module {engine} has no clk/rst ports")
    names = ["clk", "rst"] + [f"n{i}_{p}" for i in range(count) for _, _, p in ports if p not in shared]
    out = [f"\nmodule {name}({', '.join(names)});", "  input clk;", "  input rst;"]
    for i in range(count):
        for d, w, p in ports:
            if p not in shared:
                out.append(f"  {d} {w + ' ' if w else ''}n{i}_{p};")
    for i in range(count):
        conns = ", ".join(f".{p}({p if p in shared else f'n{i}_{p}'})" for _, _, p in ports)
        out.append(f"  {engine} nic{i} ({conns});")
    out.append("endmodule\n")
    return text + "\n".join(out)


def generate(outdir="build/verilog", *, top=TOP_NAME, engine_cache=None, **params):
    """Write the Verilog of ``top`` (``ibgda_nic``: one engine; ``ibgda_nic_pair``: two;
    ``ibgda_nic_quad``: four; ``engine_cache``: see :func:`engine_verilog`), one file per
    flavour (``FLAVOURS``); returns the path of the first, ``<outdir>/<top>.v``."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    if top == TOP_NAME:
        text = to_verilog(IbgdaNic(**params), top)
    elif top == PAIR_TOP_NAME:
        text = array_verilog(top, 2, engine_cache=engine_cache, **(PAIR_PARAMS | params))
    elif top == QUAD_TOP_NAME:
        p = QUAD_PARAMS | params
        text = array_verilog(top, p.pop("count"), engine_cache=engine_cache, **p)
    else:
        raise ValueError(f"unknown top level {top!r}; use {TOP_NAME!r}, {PAIR_TOP_NAME!r} or {QUAD_TOP_NAME!r}")
    for flavour, t in text.items():
        path = flavour_path(out / f"{top}.v", flavour)
        if not path.exists() or path.read_text() != t:      # keep the mtime: simulators rebuild on change
            path.write_text(t)
    return out / f"{top}.v"


if __name__ == "__main__":
    print(generate(*sys.argv[1:]))
