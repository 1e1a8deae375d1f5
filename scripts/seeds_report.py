"""The table, results.json and plots of `make seeds` from its RTL records (scripts/run_seeds.py)."""
import json
from pathlib import Path

from model.cluster import ClusterModel, Fabric
from spec import costs as C

PATHS = C.PATHS
NODES = [2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096, 16384, 100_000]
EPS = [4, 8, 16, 32, 64, 128, 256]
DEEPEP = {16: (118, 195), 32: (155, 273), 64: (173, 314), 128: (192, 369)}   # us, SPEC section 7


def _find(recs, **kw):
    """Records with these fields, at the defaults otherwise (no tweaked costs, QP weight 1,
    the deep switch queues)."""
    kw = {"weight": 1, **kw}
    out = [r for r in recs if all(r.get(k, 1 if k == "weight" else None) == v for k, v in kw.items())
           and not r.get("tweaked")
           and r.get("queue_kib") in (None, 4096)]
    return out


def _one(recs, **kw):
    got = _find(recs, **kw)
    return got[0] if got else None


def _ratio(a, b):
    return a / b if a and b else None


def _fmt(v, unit=""):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if abs(v) >= 100:
        return f"{v:,.0f}{unit}"
    return f"{v:.3g}{unit}"


def rows(recs, model):
    """The table: (figure, published, ibgda, ibrc, ibrc_mt, ratio, parts)."""
    out = []
    rate = {p: _one(recs, workload="rate", path=p, warps=128 if p == "ibgda" else 16) for p in PATHS}
    r = {p: (rate[p] or {}).get("ops_per_s") for p in PATHS}
    steady = (rate["ibgda"] or {}).get("steady_ops_per_s")
    w4 = _one(recs, workload="rate", path="ibgda", warps=128, weight=4) or {}
    out.append(("message rate, 8 B nvshmem_p, 128 warps, 4 QPs (M ops/s)", "100+ (IBRC < 2)",
                f"{_fmt(r['ibgda'] and r['ibgda'] / 1e6)} ({_fmt(steady and steady / 1e6)} steady); QP weight 4: "
                f"{_fmt(w4.get('ops_per_s', 0) / 1e6)} ({_fmt((w4.get('steady_ops_per_s') or 0) / 1e6)} steady)",
                f"{_fmt(r['ibrc'] and r['ibrc'] / 1e6)} (input)", _fmt(r["ibrc_mt"] and r["ibrc_mt"] / 1e6),
                _ratio(r["ibgda"], r["ibrc"]),
                "IBGDA: the 400G wire (steady: the 471.7 M limit; overall: the start and the last quiet); "
                "IBRC: the proxy's "
                f"{C.PROXY.per_op_ns:.0f} ns a request (calibrated)"))
    co = {p: _one(recs, workload="coalesce", path=p) for p in PATHS}
    c = {p: (co[p] or {}).get("elements_per_s") for p in PATHS}
    cs = (co["ibgda"] or {}).get("steady_elements_per_s")
    out.append(("warp-coalesced p, 32 x 8 B a WRITE (M elements/s)", "1000+",
                f"{_fmt(c['ibgda'] and c['ibgda'] / 1e6)} ({_fmt(cs and cs / 1e6)} steady)",
                _fmt(c["ibrc"] and c["ibrc"] / 1e6), _fmt(c["ibrc_mt"] and c["ibrc_mt"] / 1e6),
                _ratio(c["ibgda"], c["ibrc"]),
                "IBGDA: the WQE parser: 8 cycles a group (5 WQEBBs one a cycle, 2 for the inline data's "
                "2nd and 3rd beats, 1 for the NOP): 62.5 M groups/s at most; wire limit "
                f"{_fmt((co['ibgda'] or {}).get('wire_limit_elements_per_s', 0) / 1e6)} M"))
    ratios = []
    for size in sorted({x["size"] for x in _find(recs, workload="bw")}):
        g = {p: (_one(recs, workload="bw", path=p, size=size) or {}).get("goodput_gbps") for p in PATHS}
        ratios.append((size, _ratio(g["ibgda"], g["ibrc"]), g))
    if ratios:
        worst = min(ratios, key=lambda t: t[1] or 1e9)
        out.append(("small-message bandwidth < 1 KiB, IBGDA / IBRC", "> 5x",
                    ", ".join(f"{s} B: {_fmt(g['ibgda'])} Gb/s" for s, _, g in ratios),
                    ", ".join(f"{_fmt(g['ibrc'])}" for s, _, g in ratios),
                    ", ".join(f"{_fmt(g['ibrc_mt'])}" for s, _, g in ratios),
                    f"{worst[1]:.0f}x at {worst[0]} B (least)" if worst[1] else None,
                    "IBRC: one request per put through the proxy; IBGDA: the wire above 256 B"))
    for nodes in (2, 4):
        for size in (8, 65536):
            a = {p: (_one(recs, workload="a2a", path=p, nodes=nodes, size=size) or {}).get("latency_ns") for p in PATHS}
            if any(a.values()):
                out.append((f"all-to-all latency, {nodes} RTL nodes, {size} B a pair (us)",
                            "< 100 vs > 200" if (nodes, size) == (4, 65536) else "",
                            _fmt(a["ibgda"] and a["ibgda"] / 1e3), _fmt(a["ibrc"] and a["ibrc"] / 1e3),
                            _fmt(a["ibrc_mt"] and a["ibrc_mt"] / 1e3), _ratio(a["ibrc"], a["ibgda"]),
                            "the first message's latency (posting, PCIe, WQE fetch) and the wire"))
    if model:
        for nodes in (128, 1024):
            a = {p: model.a2a_ns(p, nodes, 8192, Fabric()) for p in model.paths()}
            out.append((f"all-to-all latency, model, {nodes} nodes, 8 KiB a pair (us)", "< 100 vs > 200",
                        _fmt(a.get("ibgda", 0) / 1e3), _fmt(a.get("ibrc", 0) / 1e3), _fmt(a.get("ibrc_mt", 0) / 1e3),
                        _ratio(a.get("ibrc"), a.get("ibgda")),
                        "IBGDA: the 400G wire ((N-1) x 8 KiB); IBRC: the proxy's time a request"))
    jr = {}
    for p in PATHS:
        s, b = _one(recs, workload="jacobi", path=p, mode="small"), _one(recs, workload="jacobi", path=p, mode="bulk")
        jr[p] = _ratio(s and s["ns_per_iter"], b and b["ns_per_iter"])
    out.append(("Jacobi halo as small p's / as one put (time ratio)", "IBRC 5x, IBGDA ~1x",
                _fmt(jr["ibgda"], "x"), _fmt(jr["ibrc"], "x"), _fmt(jr["ibrc_mt"], "x"), None,
                "IBRC: one proxy request per element; IBGDA: posting by many warps at the engine's rate"))
    for p_ in ("dispatch_ns", "combine_ns"):
        m = {p: (_one(recs, workload="moe", path=p) or {}).get(p_) for p in PATHS}
        if any(m.values()):
            tok = (_one(recs, workload="moe", path="ibgda") or {}).get("tokens")
            out.append((f"MoE {p_[:-3]}, EP4 RTL, {tok} tokens, hidden 7168, top-8 (us)", "",
                        _fmt(m["ibgda"] and m["ibgda"] / 1e3), _fmt(m["ibrc"] and m["ibrc"] / 1e3),
                        _fmt(m["ibrc_mt"] and m["ibrc_mt"] / 1e3), _ratio(m["ibrc"], m["ibgda"]),
                        "the 400G wire (7.4 KB FP8 / 14 KB BF16 tokens) against the proxy's requests"))
    if model:
        for ep in (16, 64):
            got = {p: model.moe_ns(p, ep, experts=256, fabric=Fabric()) for p in model.paths()}
            pub = DEEPEP[ep]
            out.append((f"MoE dispatch / combine, model, EP{ep}, 128 tokens (us)",
                        f"DeepEP {pub[0]} / {pub[1]}",
                        " / ".join(_fmt(v / 1e3) for v in got.get("ibgda", (0, 0))),
                        " / ".join(_fmt(v / 1e3) for v in got.get("ibrc", (0, 0))),
                        " / ".join(_fmt(v / 1e3) for v in got.get("ibrc_mt", (0, 0))),
                        _ratio(got.get("ibrc", (0,))[0], got.get("ibgda", (0,))[0]),
                        "1 NIC a rank (DeepEP's EP16 is 2 nodes of 8 GPUs, half its traffic on NVLink)"))
    return out


def sweeps(recs):
    """The posting sweeps: warps sharing QPs, and the GPU's and the proxy's costs moved one at
    a time (rows: what, M ops/s overall, M ops/s steady, doorbells at the NIC)."""
    out = []
    for r in sorted((r for r in recs if r["workload"] == "rate" and r["path"] == "ibgda" and not r.get("tweaked")
                     and r.get("weight", 1) == 1), key=lambda r: (r["qps"], r["warps"])):
        out.append((f"IBGDA, {r['warps']} warps on {r['qps']} QP{'s' if r['qps'] > 1 else ''}", r["ops_per_s"] / 1e6,
                    (r.get("steady_ops_per_s") or 0) / 1e6, r["doorbells_at_nic"]))
    base = {k: v for k, v in C.GPU.as_dict().items()}
    for r in (r for r in recs if r["workload"] == "rate" and r.get("tweaked")):
        moved = {k: v for k, v in (r["gpu_costs"] or {}).items() if base.get(k) != v}
        pmoved = {k: v for k, v in (r["proxy_costs"] or {}).items() if C.proxy_costs(r["path"]).as_dict().get(k) != v} \
            if r["path"] != "ibgda" else {}
        what = ", ".join(f"{k} {v:g} (default {base[k]:g})" for k, v in moved.items()) or \
            ", ".join(f"{k} {v:g} (default {C.proxy_costs(r['path']).as_dict()[k]:g})" for k, v in pmoved.items())
        out.append((f"{C.PATH_LABELS[r['path']]}, {r['warps']} warps on {r['qps']} QPs, {what}", r["ops_per_s"] / 1e6,
                    (r.get("steady_ops_per_s") or 0) / 1e6, r["doorbells_at_nic"]))
    return out


# How far the cluster model may be from an RTL point it predicts (a check: `make seeds`
# fails past it)
MODEL_TOLERANCE = 0.05


def checks(recs, model):
    """The model against every RTL all-to-all and MoE point: (what, rtl_ns, model_ns, error)."""
    out = []
    for r in _find(recs, workload="a2a"):
        m = model.a2a_ns(r["path"], r["nodes"], r["size"])
        rtl = r.get("landed_ns", r["latency_ns"])
        out.append((f"a2a {r['path']} {r['nodes']} nodes {r['size']} B (signal landed)", rtl, m, m / rtl - 1))
    for r in _find(recs, workload="moe"):
        d, c = model.moe_ns(r["path"], r["nodes"], tokens=r["tokens"], hidden=r["hidden"], topk=r["topk"],
                            experts=r["experts"], sent=r["messages_per_pe"], received=r.get("received_per_pe"),
                            qpp=r.get("qpp", 4))
        out.append((f"moe dispatch {r['path']} EP{r['nodes']}", r["dispatch_ns"], d, d / r["dispatch_ns"] - 1))
        out.append((f"moe combine {r['path']} EP{r['nodes']}", r["combine_ns"], c, c / r["combine_ns"] - 1))
    return out


def _save(fig, axes, path, legend_size=None):
    """Grid and legend on every axis, then the PNG."""
    import matplotlib.pyplot as plt
    for a in axes:
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plots(recs, model, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    styles = {"ibgda": "o-", "ibrc": "s--", "ibrc_mt": "^-."}
    lab = C.PATH_LABELS
    # 1. rate and bandwidth vs size
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for p in PATHS:
        pts = sorted(_find(recs, workload="bw", path=p), key=lambda r: r["size"])
        if pts:
            a1.loglog([r["size"] for r in pts], [r["ops_per_s"] / 1e6 for r in pts], styles[p], label=lab[p])
            a2.loglog([r["size"] for r in pts], [r["goodput_gbps"] for r in pts], styles[p], label=lab[p])
    a1.set(xlabel="put size (bytes)", ylabel="M puts/s", title="Message rate vs size (2 RTL nodes)")
    a2.set(xlabel="put size (bytes)", ylabel="Gb/s", title="Bandwidth vs size (2 RTL nodes)")
    _save(fig, (a1, a2), out / "rate_bw_vs_size.png")
    # 2. all-to-all latency vs nodes
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in PATHS:
        for size, ls in ((8, ":"), (8192, "-")):
            if model and p in model.paths():
                ax.loglog(NODES, [model.a2a_ns(p, n, size, Fabric() if n > 4 else None) / 1e3 for n in NODES], ls,
                          label=f"{lab[p]}, {size} B (model)")
        rtl = sorted(_find(recs, workload="a2a", path=p, size=8), key=lambda r: r["nodes"])
        if rtl:
            ax.loglog([r["nodes"] for r in rtl], [r["latency_ns"] / 1e3 for r in rtl], styles[p][0], ms=7,
                      label=f"{lab[p]}, 8 B (RTL)")
    ax.set(xlabel="nodes", ylabel="all-to-all latency (us)", title="All-to-all: RTL points and the model")
    _save(fig, (ax,), out / "a2a_vs_nodes.png", 6)
    # 3. Jacobi
    fig, ax = plt.subplots(figsize=(6, 4))
    vals = []
    for p in PATHS:
        s, b = _one(recs, workload="jacobi", path=p, mode="small"), _one(recs, workload="jacobi", path=p, mode="bulk")
        vals.append(s["ns_per_iter"] / b["ns_per_iter"] if s and b else 0)
    ax.bar([lab[p] for p in PATHS], vals)
    ax.axhline(1, color="k", ls="--")
    ax.set(ylabel="small / bulk time", title="Jacobi halo: small messages against one bulk put")
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(out / "jacobi_ratio.png", dpi=110)
    plt.close(fig)
    # 4. MoE vs EP
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in PATHS:
        if model and p in model.paths():
            d = [model.moe_ns(p, ep, experts=max(256, ep) if ep > 4 else 32, fabric=Fabric() if ep > 4 else None)
                 for ep in EPS]
            ax.semilogx(EPS, [x[0] / 1e3 for x in d], "-", base=2, label=f"{lab[p]} dispatch (model)")
            ax.semilogx(EPS, [x[1] / 1e3 for x in d], "--", base=2, label=f"{lab[p]} combine (model)")
        r = _one(recs, workload="moe", path=p)
        if r:
            ax.plot([r["nodes"]] * 2, [r["dispatch_ns"] / 1e3, r["combine_ns"] / 1e3], styles[p][0], ms=7,
                    label=f"{lab[p]} RTL ({r['tokens']} tokens)")
    ax.plot(list(DEEPEP), [v[0] for v in DEEPEP.values()], "kx", ms=8, label="DeepEP dispatch (published)")
    ax.plot(list(DEEPEP), [v[1] for v in DEEPEP.values()], "k+", ms=8, label="DeepEP combine (published)")
    ax.set_yscale("log")
    ax.set(xlabel="EP size", ylabel="latency (us)", title="MoE low-latency dispatch / combine, 128 tokens")
    _save(fig, (ax,), out / "moe_vs_ep.png", 6)
    # 5. where an IBGDA message's time goes
    r = _one(recs, workload="latency", path="ibgda")
    if r:
        fig, ax = plt.subplots(figsize=(8, 3))
        left = 0
        for k, v in r["stages_ns"].items():
            ax.barh([0], [v], left=left, label=f"{k}: {v:.0f} ns")
            left += v
        ax.set(yticks=[], xlabel="ns", title="One 8-byte IBGDA put_signal, post to CQE seen (2 RTL nodes)")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2)
        fig.tight_layout()
        fig.savefig(out / "ibgda_message_time.png", dpi=110)
        plt.close(fig)


def report(recs, out, *, quick=False):
    out = Path(out)
    try:
        model = ClusterModel(recs)
    except ValueError as e:
        print(f"no cluster model: {e}")
        model = None
    table = rows(recs, model)
    chk = checks(recs, model) if model else []
    w = [max(len(str(_fmt(x) if not isinstance(x, str) else x)) for x in col) for col in zip(*table)] if table else []
    heads = ("figure", "published", "IBGDA", "IBRC 1 thread", "IBRC 4 threads", "IBGDA gain", "what decides it")
    print()
    print(" | ".join(h for h in heads))
    for row in table:
        gain = row[5] if isinstance(row[5], str) else f"{row[5]:.1f}x" if row[5] else "-"
        cells = [row[0], row[1] or "", row[2], row[3], row[4], gain, row[6]]
        print(" | ".join(str(c) for c in cells))
    sw = sweeps(recs)
    if sw:
        print("\nposting sweeps, 8-byte p to one peer (M ops/s overall, steady; doorbells the NIC took):")
        for what, a, b, d in sw:
            print(f"  {what:<78} {a:8.1f} {b:8.1f} {d:6}")
    if chk:
        print("\nthe cluster model against the RTL points (fitted from the latency and rate points only):")
        for what, rtl, mod, err in chk:
            print(f"  {what:<34} RTL {rtl / 1e3:9.2f} us  model {mod / 1e3:9.2f} us  {100 * err:+6.1f}%")
        worst = max(abs(e) for *_, e in chk)
        over = [what for what, _, _, err in chk if abs(err) > MODEL_TOLERANCE]
        print(f"  largest error {100 * worst:.1f}% (check: within {100 * MODEL_TOLERANCE:.0f}% at every point: "
              + (f"FAILED at {len(over)}: {'; '.join(over)})" if over else "met)"))
    res = {"quick": quick, "points": recs, "table": [dict(zip(heads, r)) for r in table],
           "sweeps": [{"what": a, "ops_per_s": b * 1e6, "steady_ops_per_s": c * 1e6, "doorbells": d} for a, b, c, d in sw],
           "model": {"fitted": model.fitted() if model else None, "fabric": Fabric().__dict__,
                     "checks": [{"what": a, "rtl_ns": b, "model_ns": c, "error": d, "ok": abs(d) <= MODEL_TOLERANCE}
                                for a, b, c, d in chk],
                     "a2a_ns": {p: {n: {s: model.a2a_ns(p, n, s, Fabric() if n > 4 else None) for s in (8, 8192, 65536)}
                                    for n in NODES} for p in model.paths()} if model else None,
                     "moe_ns": {p: {ep: model.moe_ns(p, ep, experts=max(256, ep) if ep > 4 else 32,
                                                     fabric=Fabric() if ep > 4 else None) for ep in EPS}
                                for p in model.paths()} if model else None},
           "inputs": {"gpu_costs": C.GPU.as_dict(), "proxy": C.PROXY.as_dict(), "proxy_mt": C.PROXY_MT.as_dict(),
                      "calibrated": "the single proxy thread's step costs (to NVSHMEM's published 1.7-2 M ops/s)"}}
    (out / "results.json").write_text(json.dumps(res, indent=2, default=str))
    plots(recs, model, out)
    print(f"\nresults: {out / 'results.json'}; plots beside it")
    return res
