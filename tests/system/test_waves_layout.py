"""docs/waves.gtkw names signals that the simulation dump holds.

Every signal of the GTKWave layout is a path ``ibgda_nic.<instance>....<signal>``; the
dump (``make waves``, Verilator's FST trace) holds the generated Verilog's hierarchy and
names, so each path must name a module of the generated Verilog (Amaranth names the
module of a submodule by its hierarchical path) that declares that signal.
"""
import re

from tb.runner import generated_verilog

DECL = re.compile(r"^\s*(?:input|output|inout|wire|reg)\b[^;]*?\\?(\S+?)\s*(?:=[^;]*)?;", re.M)


def _modules(verilog):
    mods = {}
    for m in re.finditer(r"^module (\\?\S+?)\s*\((.*?)\);\n(.*?)^endmodule", verilog, re.M | re.S):
        name = m.group(1).lstrip("\\")
        mods[name] = {d.lstrip("\\") for d in DECL.findall(m.group(3))}
    return mods


def test_waves_layout_names_real_signals(request):
    root = request.config.rootpath
    paths = [ln.strip() for ln in (root / "docs" / "waves.gtkw").read_text().splitlines()
             if ln.startswith("ibgda_nic")]
    assert len(paths) > 40
    mods = _modules(generated_verilog("ibgda_nic").read_text())     # the simulations' copy
    missing = []
    for p in paths:
        scope, _, sig = p.rpartition(".")
        if sig not in mods.get(scope, ()):
            missing.append(p)
    assert not missing, f"docs/waves.gtkw names signals the design does not have: {missing}"
