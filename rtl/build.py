"""Generate Verilog for the engine: ``python -m rtl.build [outdir]``."""
import sys
from pathlib import Path

from amaranth.back import verilog

from .top import IbgdaNic

TOP_NAME = "ibgda_nic"


def generate(outdir="build/verilog", **params):
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    top = IbgdaNic(**params)
    text = verilog.convert(top, name=TOP_NAME, emit_src=False)
    path = out / f"{TOP_NAME}.v"
    if not path.exists() or path.read_text() != text:      # keep the mtime: simulators rebuild on change
        path.write_text(text)
    return path


if __name__ == "__main__":
    print(generate(*sys.argv[1:]))
