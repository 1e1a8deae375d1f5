"""Generate Verilog for the engine: ``python -m rtl.build [outdir]``."""
import sys
from pathlib import Path

from amaranth.back import verilog

from .top import IbgdaNic
from .nic_array import NicArray

TOP_NAME = "ibgda_nic"
PAIR_TOP_NAME = "ibgda_nic_pair"
# Two engines for the system tests of NICs talking to each other; fewer QPs keep the
# RAMs (and the simulators' memory) small, the logic is the same.
PAIR_PARAMS = {"num_qps": 64}
QUAD_TOP_NAME = "ibgda_nic_quad"
# Four engines through a switch model (all-to-all): 16 QPs each, the same logic.
QUAD_PARAMS = {"count": 4, "num_qps": 16}


def generate(outdir="build/verilog", *, top=TOP_NAME, **params):
    """Write the Verilog of ``top`` (``ibgda_nic``: one engine; ``ibgda_nic_pair``: two;
    ``ibgda_nic_quad``: four)."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    if top == TOP_NAME:
        design = IbgdaNic(**params)
    elif top == PAIR_TOP_NAME:
        design = NicArray(2, **(PAIR_PARAMS | params))
    elif top == QUAD_TOP_NAME:
        design = NicArray(**(QUAD_PARAMS | params))
    else:
        raise ValueError(f"unknown top level {top!r}; use {TOP_NAME!r}, {PAIR_TOP_NAME!r} or {QUAD_TOP_NAME!r}")
    text = verilog.convert(design, name=top, emit_src=False)
    path = out / f"{top}.v"
    if not path.exists() or path.read_text() != text:      # keep the mtime: simulators rebuild on change
        path.write_text(text)
    return path


if __name__ == "__main__":
    print(generate(*sys.argv[1:]))
