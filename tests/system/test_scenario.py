"""The default scenario (`make sim`) on both simulators, and its capture decoded by tshark."""
import json
import shutil
import subprocess

import pytest

from tb.runner import ROOT, SIMULATORS, run


@pytest.mark.parametrize("sim", SIMULATORS)
def test_default_scenario(sim):
    out = ROOT / "build" / f"test_scenario_{sim}"
    shutil.rmtree(out, ignore_errors=True)
    run(sim, "tb.suites.scenario", "default_scenario", extra_env={"IBGDA_SIM_OUT": str(out)}, test_dir=out / "run")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["messages"] == 80 and summary["cqes"] == 48
    assert summary["sim_cycles"] > summary["cycles"] and summary["simulator"].lower().startswith(sim[:4])
    pcap = out / "wire.pcap"

    tshark = shutil.which("tshark")
    assert tshark, "tshark is not installed: run `make setup`"
    fields = subprocess.run([tshark, "-r", str(pcap), "-T", "fields", "-e", "frame.protocols",
                             "-e", "infiniband.bth.opcode", "-e", "_ws.malformed", "-e", "_ws.expert.severity"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    rows = [line.split("\t") for line in fields if line.strip()]
    assert len(rows) == summary["packets"], f"tshark read {len(rows)} frames, the run sent {summary['packets']}"
    for i, (protocols, opcode, malformed, severity) in enumerate(rows):
        assert "infiniband" in protocols, f"frame {i + 1} not decoded as RoCE: {protocols}"
        assert opcode in {"6", "7", "8", "10"}, f"frame {i + 1}: BTH opcode {opcode}"
        assert not malformed and not severity, f"frame {i + 1}: tshark reports malformed/expert {malformed} {severity}"


def test_sleeping_models_change_nothing():
    """The testbench's models sleep through idle edges (tb/clock.py, EdgeModel): the same
    scenario with them stepped at every edge (IBGDA_TB_SLEEP=0) must record the same
    handshakes (every AXI burst's cycles, every frame's bytes and cycles, every doorbell)."""
    records = {}
    for sleep in ("1", "0"):
        out = ROOT / "build" / f"test_scenario_sleep{sleep}"
        shutil.rmtree(out, ignore_errors=True)
        run("verilator", "tb.suites.scenario", "default_scenario",
            extra_env={"IBGDA_SIM_OUT": str(out), "IBGDA_TB_SLEEP": sleep}, test_dir=out / "run")
        records[sleep] = json.loads((out / "handshakes.json").read_text())
    awake, asleep = records["0"], records["1"]
    assert len(awake["reads"]) > 100 and len(awake["frames"]) == 152 and len(awake["writes"]) >= 48
    for kind in awake:
        assert asleep[kind] == awake[kind], f"{kind} differ when the models sleep: first at " \
            f"{next(i for i, (a, b) in enumerate(zip(asleep[kind], awake[kind])) if a != b) if len(asleep[kind]) == len(awake[kind]) else 'the count'}"
