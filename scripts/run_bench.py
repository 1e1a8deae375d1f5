"""`make bench` (QUICK=1 for a small subset): sweeps of the engine on the simulated 400G wire.

The points run as tasks of a Dask cluster (a local one of JOBS workers, or SCHEDULER=
tcp://host:8786), as `make seeds`'s do.

Sweeps: payload size 8 B..64 KiB (8 QPs); QPs 1..1024 (8-byte inline); doorbell batch
1, 4, 32; GPU-memory latency 0.25, 1, 2 us. Prints a table, writes
build/bench/results.json (one record per point), a pcap per point and two plots.
"""
import argparse
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from rtl.build import PAIR_TOP_NAME, TOP_NAME
from spec import params as P
from scripts.run_sim import default_sim
from scripts.tasks import client_for, map_tasks, print_speed, run_suite
from tb.runner import SIMULATORS, build

# 64..190 B: frames of 138..264 bytes, the sizes a one-frame-per-beat bus cannot carry at wire rate
SIZES = [8, 64, 100, 150, 190, 256, 1024, 4096, 16384, 65536]
QPS = [1, 2, 4, 8, 16, 32, 64, 256, 1024]


def points(quick):
    def pt(size, qps=8, batch=32, latency_ns=1000):
        # Long enough for the steady state: several times the 512 WQEs a round trip holds.
        msgs = max(4, min(64, (256 * 1024) // max(size, 1) // qps, 2048 // qps)) if quick else \
            max(8, min(512, (2 * 1024 * 1024) // size // qps, 8192 // qps))
        return {"size": size, "qps": qps, "batch": batch, "latency_ns": latency_ns, "msgs": msgs}
    if quick:
        out = [pt(s) for s in (8, 150, 16384)] + [pt(8, q) for q in (1, 16)] + [pt(8, batch=4)] \
            + [pt(4096, latency_ns=250)]
        out += [{"kind": "latency", "latency_ns": 1000},
                {"kind": "share", "weights": [1, 2, 4], "window": 20_000, "latency_ns": 1000}]
    else:
        out = [pt(s) for s in SIZES] + [pt(8, q) for q in QPS if q != 8] \
            + [pt(8, batch=b) for b in (1, 4)] + [pt(4096, latency_ns=l) for l in (250, 2000)] \
            + [pt(8, latency_ns=l) for l in (250, 2000)]
        out += [{"kind": "latency", "latency_ns": l} for l in (250, 1000)]
        out += [{"kind": "share", "weights": [1, 1, 1, 1], "window": 100_000, "latency_ns": 1000},
                {"kind": "share", "weights": [1, 2, 4], "window": 50_000, "latency_ns": 1000}]
    return out + rx_points(quick) + atomic_points(quick)


def atomic_points(quick):
    """8-byte FETCH_ADDs received at line rate (kind "atomic"): to one word, and each to a
    word of its own, 64 peer QPs, 1 us GPU memory."""
    n = 2000 if quick else 6000
    return [{"kind": "atomic", "words": w, "qps": 64, "frames": n, "latency_ns": 1000} for w in (1, n)]


def rx_points(quick):
    """Receive floods (kind "rx"): every frame size class that needs more than one frame
    per cycle, and the WRITE sizes around the one-request-per-cycle boundary."""
    n = 2000 if quick else 6000
    if quick:
        return [{"kind": "rx", "flood": "garbage", "size": 65, "frames": n},
                {"kind": "rx", "flood": "ack", "size": 62, "frames": n, "qps": 1},
                {"kind": "rx", "flood": "write", "size": 74, "frames": n, "qps": 2}]
    return ([{"kind": "rx", "flood": "garbage", "size": s, "frames": n} for s in (60, 64, 65, 73, 97)]
            + [{"kind": "rx", "flood": "ack", "size": 62, "frames": n, "qps": q} for q in (1, 2, 16)]
            + [{"kind": "rx", "flood": "write", "size": s, "frames": n, "qps": q}
               for s in (74, 75, 76, 82) for q in (1, 2)]
            # 1-byte WRITEs each to its own line: one QP's writes take one port at a time
            + [{"kind": "rx", "flood": "write", "size": 75, "frames": n, "qps": q, "stride": 256} for q in (1, 2)])


def pair_points(quick):
    """Two-node points (tb/suites/bench_pair.py): RC with the responder in the loop, lossless and lossy."""
    if quick:
        return [{"size": 4096, "qps": 4, "msgs": 32, "loss": l} for l in (0, 0.01)] \
            + [{"size": 7168, "qps": 4, "msgs": 32, "loss": 0, "signal": "count", "batch": 8}] + read_points(quick) \
            + two_sided_points(quick)
    # DeepEP's low-latency pattern: per peer, batches of token WRITEs, each followed by a
    # 4-byte masked fetch-add on the peer's count
    deepep = [{"size": s, "qps": 8, "msgs": 96, "loss": 0, "signal": "count", "batch": 8} for s in (4096, 7168)]
    return [{"size": 4096, "qps": 4, "msgs": 128, "loss": l} for l in (0, 0.001, 0.01)] \
        + [{"size": 1024, "qps": 4, "msgs": 256, "loss": 0}, {"size": 8, "qps": 4, "msgs": 1024, "loss": 0}] + deepep \
        + read_points(quick) + two_sided_points(quick)


def two_sided_points(quick):
    """8-byte SENDs and WRITEs with immediate between two engines (kinds "send" and
    "write_imm" of tb/suites/bench_pair.py), receive CQE included: target >= 400 M/s each."""
    n = 128 if quick else 512
    return [{"kind": k, "size": 8, "qps": 16, "msgs": n} for k in ("send", "write_imm")]


def read_points(quick):
    """RDMA READs end to end (kind "read" of tb/suites/bench_pair.py): 8-byte READs over 64
    QPs (the message rate; 16 rounds of each QP's 16 READs in flight, so the steady rate is
    the middle half's, past the first round), and 1 KiB .. 64 KiB (the response direction's
    goodput), on as many QPs as keep 16 KiB each in flight (16 READs of 1 KiB, 4 of 4 KiB)."""
    if quick:
        return [{"kind": "read", "size": 8, "qps": 64, "msgs": 16}, {"kind": "read", "size": 4096, "qps": 4, "msgs": 16}]
    def goodput(size):
        qps = max(4, 16384 // size)
        return {"kind": "read", "size": size, "qps": qps, "msgs": max(8, min(64, (2 << 20) // size // qps))}
    # (64 QPs are the target's; 96 show the rate once 16 READs a QP cover the round trip)
    return [{"kind": "read", "size": 8, "qps": 64, "msgs": 256}, {"kind": "read", "size": 8, "qps": 96, "msgs": 256}] + \
        [goodput(s) for s in (1024, 2048, 4096, 8192, 16384, 65536)]


def _plot(path, title, xlabel, ylabel, x, series, *, base=10, hline=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, y, style in series:
        ax.semilogx(x, y, style, base=base, label=label)
    if hline:
        ax.axhline(hline[0], color="k", ls="--", label=hline[1])
    top = max([max(y) for _, y, _ in series] + ([hline[0]] if hline else []))
    ax.set_ylim(0, 1.12 * top)             # from zero: a dip of a few percent looks like one
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plots(recs, out):
    size = sorted((r for r in recs if r["qps"] == 8 and r["doorbell_batch"] == 32 and r["dma_latency_ns"] == 1000),
                  key=lambda r: r["payload_bytes"])
    if size:
        _plot(out / "goodput_vs_size.png", "Goodput vs payload size (8 QPs, 1 us GPU memory)",
              "RDMA WRITE payload (bytes)", "goodput (Gb/s)", [r["payload_bytes"] for r in size],
              [("ibgda-nic", [r["goodput_gbps"] for r in size], "o-"),
               ("400G wire limit", [r["wire_limit_goodput_gbps"] for r in size], "k--")])
    qps = sorted((r for r in recs if r["payload_bytes"] == 8 and r["doorbell_batch"] == 32
                  and r["dma_latency_ns"] == 1000), key=lambda r: r["qps"])
    if qps:
        _plot(out / "msgrate_vs_qps.png", "Message rate vs QPs", "QPs", "messages/s (millions)",
              [r["qps"] for r in qps], [("ibgda-nic, 8 B inline", [r["messages_per_s"] / 1e6 for r in qps], "o-")],
              base=2, hline=(471.7, "400G wire limit (471.7 M/s)"))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sim", default=os.environ.get("SIM") or None, choices=SIMULATORS)
    ap.add_argument("--quick", action="store_true", default=bool(os.environ.get("QUICK")))
    ap.add_argument("--scheduler", default=os.environ.get("SCHEDULER") or None,
                    help="a Dask scheduler address (tcp://host:8786); default: a local cluster")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS") or os.cpu_count() or 2))
    args = ap.parse_args()
    sim = args.sim or default_sim()
    out = ROOT / "build" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    for f in list(out.glob("*.json")) + list(out.glob("*.pcap")) + list(out.glob("*.png")):
        f.unlink()
    pts, ppts = points(args.quick), pair_points(args.quick)
    # the points as tasks of a Dask cluster (scripts/tasks.py): each a share of one suite's
    # points in one simulator process, its files returned as data
    k = max(1, 2 * args.jobs)
    jobs = [("tb.suites.bench", TOP_NAME, "BENCH_POINTS", pts[i::k], "IBGDA_BENCH_OUT") for i in range(k)] + \
        [("tb.suites.bench_pair", PAIR_TOP_NAME, "BENCH_PAIR_POINTS", ppts[i::k], "IBGDA_BENCH_OUT") for i in range(k)]
    jobs = [j for j in jobs if j[3]]
    for top in (TOP_NAME, PAIR_TOP_NAME):          # build once here, before the workers share it
        build(sim, top=top)
    where = f"on {args.scheduler}" if args.scheduler else f"on a local Dask cluster of {args.jobs} workers"
    print(f"running {len(pts)} one-NIC and {len(ppts)} two-node points on {sim}{' (QUICK)' if args.quick else ''} "
          f"as {len(jobs)} tasks {where} ...", flush=True)
    client, cluster = client_for(args.scheduler, args.jobs)
    try:
        res = map_tasks(client, run_suite, [(sim,) + j for j in jobs],
                        [f"{j[0].split('.')[-1]}: {len(j[3])} points" for j in jobs])
    finally:
        client.close()
        if cluster:
            cluster.close()
    failed = []
    for r in res:
        for name, data in r["files"].items():
            (out / name).write_bytes(data)
        failed += r["failed"]
    pairs = [json.loads(f.read_text()) for f in sorted(out.glob("pair_*.json"))]
    reads = [r for r in pairs if r["kind"] == "pair_read"]
    two_sided = [r for r in pairs if r["kind"] in ("pair_send", "pair_write_imm")]
    pairs = [r for r in pairs if r["kind"] == "pair"]
    recs = [json.loads(f.read_text()) for f in sorted(out.glob("write_*.json"))]
    recs.sort(key=lambda r: (r["dma_latency_ns"], r["doorbell_batch"], r["qps"], r["payload_bytes"]))
    shares = [json.loads(f.read_text()) for f in sorted(out.glob("share_*.json"))]
    lats = [json.loads(f.read_text()) for f in sorted(out.glob("latency_*.json"))]
    rxs = [json.loads(f.read_text()) for f in sorted(out.glob("rx_*.json"))]
    atomics = [json.loads(f.read_text()) for f in sorted(out.glob("atomic_*.json"))]
    (out / "results.json").write_text(json.dumps(recs + lats + shares + rxs + atomics + pairs + reads + two_sided, indent=2))
    print(f"\n{'payload':>8} {'QPs':>4} {'batch':>5} {'DMA ns':>6} {'msgs':>6} {'M msg/s':>8} {'Gb/s':>7} "
          f"{'limit':>7} {'ratio':>6} {'model Gb/s':>10}")
    for r in recs:
        print(f"{r['payload_bytes']:>8} {r['qps']:>4} {r['doorbell_batch']:>5} {r['dma_latency_ns']:>6} "
              f"{r['messages']:>6} {r['messages_per_s'] / 1e6:>8.1f} {r['goodput_gbps']:>7.1f} "
              f"{r['wire_limit_goodput_gbps']:>7.1f} {r['ratio_to_wire_limit']:>6.3f} "
              f"{r['golden_model_goodput_gbps']:>10.1f}")
    for r in lats:
        print(f"\nlatency, idle engine, GPU-memory round trip {r['dma_round_trip_cycles']} cycles "
              f"({r['dma_latency_ns']} ns): doorbell -> first byte on the wire")
        for case, c in r["cases"].items():
            model = f" (cycle model {c['cycle_model']})"
            print(f"  {case:<22} {c['db_to_first_byte_cycles']:>5} cycles{model}")
    for r in shares:
        got = ", ".join(f"{s_:.4f}" for s_ in r["shares"])
        ideal = ", ".join(f"{s_:.4f}" for s_ in r["ideal_shares"])
        print(f"\nscheduler shares, weights {r['weights']}, {r['window_frames']} frames: {got} "
              f"(ideal {ideal}; largest error {100 * r['max_share_error']:.2f}%)")
    if rxs:
        print("\nreceive floods at the 400G line rate (MAC RX; rate 1.000 = never held back):")
        print(f"{'kind':>8} {'bytes':>6} {'QPs':>4} {'stride':>6} {'frames':>7} {'M frames/s':>10} {'rate':>6} "
              f"{'stalls':>7}")
        for r in sorted(rxs, key=lambda r: (r["flood"], r["frame_bytes"], r["qps"], r.get("stride", 64))):
            fps = r["frames"] / (r["cycles"] * P.CLOCK_PERIOD_NS) * 1e3
            stride = r.get("stride", 64) if r["flood"] == "write" else "-"
            print(f"{r['flood']:>8} {r['frame_bytes']:>6} {r['qps']:>4} {stride:>6} {r['frames']:>7} {fps:>10.1f} "
                  f"{r['ratio_to_line_rate']:>6.3f} {r['mac_rx_stall_cycles']:>7}")
    if atomics:
        print("\n8-byte FETCH_ADDs at the responder, requests at line rate, 1 us GPU memory "
              "(estimate: one a cycle to one word; words in flight / round trip to distinct ones):")
        print(f"{'words':>6} {'QPs':>4} {'atomics':>7} {'M/s':>7} {'steady':>7} {'estimate':>8} {'wire limit':>10} "
              f"{'RX stalls':>9}")
        for r in sorted(atomics, key=lambda r: r["words"]):
            print(f"{r['words']:>6} {r['qps']:>4} {r['atomics']:>7} {r['atomics_per_s'] / 1e6:>7.1f} "
                  f"{r['steady_atomics_per_s'] / 1e6:>7.1f} {r['estimate_per_s'] / 1e6:>8.1f} "
                  f"{r['request_wire_limit_per_s'] / 1e6:>10.1f} {r['mac_rx_stall_cycles']:>9}")
    if pairs:
        print("\ntwo nodes, RC, responder in the loop (cable 100 cycles each way, loss on both directions):")
        print("(signal count/n: DeepEP's pattern, a masked fetch-add on the peer's count after every n "
              "tokens; wire ratio: payload goodput over NIC 0's wire span against its frames back to back)")
        print(f"{'payload':>8} {'QPs':>4} {'signal':>9} {'msgs':>6} {'loss':>6} {'Gb/s':>7} {'M msg/s':>8} "
              f"{'steady':>7} {'wire ratio':>10} {'vs lossless':>11} {'frames':>7} {'dropped':>8} {'NAKs':>5} "
              f"{'retx':>5} {'timeouts':>8}")
        base = {r["payload_bytes"]: r["goodput_gbps"] for r in pairs if r["loss"] == 0 and not r.get("signal")}
        for r in sorted(pairs, key=lambda r: (-r["payload_bytes"], bool(r.get("signal")), r["loss"])):
            ratio = r["goodput_gbps"] / base[r["payload_bytes"]] if r["payload_bytes"] in base else float("nan")
            sig = f"count/{r['batch']}" if r.get("signal") else "-"
            print(f"{r['payload_bytes']:>8} {r['qps']:>4} {sig:>9} {r['messages']:>6} {r['loss']:>6g} "
                  f"{r['goodput_gbps']:>7.1f} "
                  f"{r['messages_per_s'] / 1e6:>8.1f} {(r.get('steady_frames_per_s') or 0) / 1e6:>7.1f} "
                  f"{r['ratio_to_wire_limit']:>10.4f} {ratio:>11.3f} {r['frames_sent']:>7} "
                  f"{sum(r['dropped'].values()):>8} {r['naks']:>5} {r['retransmits']:>5} {r['timeouts']:>8}")
    if reads:
        print("\nRDMA READs, two nodes (cable 100 cycles each way, 1 us GPU memory at both ends; response ratio: "
              "READ RESPONSE wire time over their span; estimate: model.timing.read_rate_estimate; underrun: wire "
              "cycles READ RESPONSEs stalled inside a frame, where a real MAC would underrun):")
        print(f"{'payload':>8} {'QPs':>4} {'READs':>6} {'M READs/s':>9} {'steady':>7} {'Gb/s':>7} {'resp limit':>10} "
              f"{'resp ratio':>10} {'estimate':>8} {'bound':>14} {'req limit':>9} {'underrun':>8}")
        for r in sorted(reads, key=lambda r: (r["payload_bytes"], r["qps"])):
            print(f"{r['payload_bytes']:>8} {r['qps']:>4} {r['reads']:>6} {r['reads_per_s'] / 1e6:>9.1f} "
                  f"{(r['steady_requests_per_s'] or 0) / 1e6:>7.1f} {r['goodput_gbps']:>7.1f} "
                  f"{r['response_wire_limit_gbps']:>10.1f} {r['response_ratio_to_wire_limit']:>10.4f} "
                  f"{r['estimate_reads_per_s'] / 1e6:>8.1f} {r['estimate_bound']:>14} "
                  f"{r['request_wire_limit_per_s'] / 1e6:>9.1f} {r['underrun_cycles']['responses']:>8}")
    if two_sided:
        print("\ntwo-sided verbs, two nodes (cable 100 cycles each way, 1 us GPU memory; M msg/s from NIC 0's "
              "first frame to NIC 1's last receive CQE; target >= 400 M/s):")
        print(f"{'verb':>10} {'payload':>8} {'QPs':>4} {'msgs':>6} {'frame':>6} {'M msg/s':>8} {'steady':>7} "
              f"{'wire limit':>10}")
        for r in sorted(two_sided, key=lambda r: r["kind"]):
            print(f"{r['kind'][5:]:>10} {r['payload_bytes']:>8} {r['qps']:>4} {r['messages']:>6} {r['frame_bytes']:>6} "
                  f"{r['messages_per_s'] / 1e6:>8.1f} {(r['steady_frames_per_s'] or 0) / 1e6:>7.1f} "
                  f"{r['wire_limit_per_s'] / 1e6:>10.1f}")
    plots(recs, out)
    print_speed(recs + lats + shares + rxs + atomics + pairs + reads + two_sided)
    print(f"\nresults: {out / 'results.json'}; plots and one pcap per point beside it")
    (out / "failed.json").write_text(json.dumps(failed, indent=1))
    if failed:
        # a point whose checks failed wrote no figure: the run fails, naming each
        print(f"\nbench: FAILED: {len(failed)} of {len(pts) + len(ppts)} points failed their checks "
              f"(build/bench/failed.json):")
        for f in failed:
            print(f"  {f['test']}: {json.dumps(f['point'])}")
            for line in f["why"]:
                print(f"    {line[:300]}")
        raise SystemExit(1)
    print(f"bench: all {len(pts) + len(ppts)} points passed their checks")


if __name__ == "__main__":
    main()
