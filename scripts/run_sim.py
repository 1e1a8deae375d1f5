"""`make sim` / `make waves`: run the default scenario (or TEST=...) and print its summary."""
import argparse
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from tb.runner import SIMULATORS, SimulationFailed, find_verilator, run


def default_sim():
    """The fastest simulator available: Verilator, else Icarus."""
    if find_verilator() is not None:
        return "verilator"
    if shutil.which("iverilog"):
        return "icarus"
    sys.exit("no simulator found: run `make setup`")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sim", default=os.environ.get("SIM") or None, choices=SIMULATORS)
    ap.add_argument("--waves", action="store_true")
    ap.add_argument("--test", default=os.environ.get("TEST") or None,
                    help="a cocotb test of tb/suites/nic.py instead of the default scenario")
    args = ap.parse_args()
    sim = args.sim or default_sim()
    out = ROOT / "build" / ("waves" if args.waves else "sim")
    out.mkdir(parents=True, exist_ok=True)
    for old in list((out / "run").glob("*.fst")) + list((out / "run").glob("*.vcd")):
        old.unlink()                      # never report a stale dump
    module, case = ("tb.suites.nic", args.test) if args.test else ("tb.suites.scenario", "default_scenario")
    env = {"IBGDA_SIM_OUT": str(out)}
    try:
        run(sim, module, case, waves=args.waves, extra_env=env, test_dir=out / "run")
    except SimulationFailed as e:
        sys.exit(f"sim: FAILED: {', '.join(e.failed)} (the simulation's output above says why)")
    summary = out / "summary.txt"
    if not args.test and summary.exists():
        print()
        print(summary.read_text(), end="")
        print(f"  simulator          {sim}")
        print(f"  frames             {out / 'wire.pcap'}")
    if args.waves:
        waves = sorted((out / "run").glob("*.fst")) + sorted((out / "run").glob("*.vcd"))
        if not waves:
            sys.exit("no waveform file was written")
        print(f"waveforms: {waves[-1]}")
        print(f"GTKWave:   gtkwave {waves[-1]} {ROOT / 'docs' / 'waves.gtkw'}")


if __name__ == "__main__":
    main()
