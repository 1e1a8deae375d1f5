"""`make interop`: the RTL engine and the golden model's frames against Linux's Soft-RoCE
(rdma_rxe) in a qemu guest (tests/interop, the full suite: IBGDA_INTEROP_FULL=1 adds the
path-MTU matrix at 1024 and 4096, tests/interop/conftest.py; ``make test`` runs the short
one), then every frame both ways of the engine's tests in one capture,
build/interop/wire.pcap (each test's own stays beside the run:
build/sim_verilator/runs/interop*/<test>.pcap; the frames the bridge dropped on purpose are
in <test>.dropped.pcap there, not in wire.pcap)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main():
    rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/interop"],
                         cwd=ROOT, env={**os.environ, "IBGDA_INTEROP_FULL": "1"})
    runs = ROOT / "build" / "sim_verilator" / "runs"
    files = [f for d in ("interop", "interop_drops", "interop_mtu") for f in sorted((runs / d).glob("*.pcap"))
             if not f.name.endswith(".dropped.pcap")]     # (frames the bridge dropped: beside, not on the wire)
    out = ROOT / "build" / "interop"
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(out / "wire.pcap", "wb") as w:
        for k, f in enumerate(files):
            data = f.read_bytes()              # one nanosecond pcap a test (tb.interop.rxe_env.CyclePcap)
            w.write(data if k == 0 else data[24:])
            n, off = 0, 24
            while off + 16 <= len(data):
                off += 16 + int.from_bytes(data[off + 8:off + 12], "little")
                n += 1
            rows.append((f.stem, n))
    width = max([len(s) for s, _ in rows] + [4])
    print(f"\n{'test':<{width}}  frames (both ways)")
    for stem, n in rows:
        print(f"{stem:<{width}}  {n}")
    print(f"interop: {sum(n for _, n in rows)} frames of {len(rows)} engine tests in {out / 'wire.pcap'}"
          f" (pytest {'passed' if rc == 0 else 'FAILED'})")
    sys.exit(rc)


if __name__ == "__main__":
    main()
