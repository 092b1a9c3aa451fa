"""The sweep's slopes, scaling targets, machine description, ``report.md`` and log-log plots."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
from pathlib import Path
from typing import Any

from chronomem.bench.peers import peer_report
from chronomem.bench.sweep import SKIPPED
from chronomem.bench.worker import OK, OOM, TIMEOUT
from chronomem.threads import summarize

FIT_RANGE = (1024, 32768)
# Scaling targets of the efficient memories, evaluated on the training step and reported, never
# asserted: time and memory grow at most like N^1.15, and at N=16k a step is at least 5x faster than
# full attention's.
TARGET_MODELS = ("tlb", "blrp", "htm", "relevance-rnn")
SLOPE_TARGET, SPEEDUP_TARGET, SPEEDUP_N = 1.15, 5.0, 16384


def fit_slope(
    ns: list[float], values: list[float], lo: int = FIT_RANGE[0], hi: int = FIT_RANGE[1]
) -> dict | None:
    """Least-squares slope of log(value) against log(N) over ``lo <= N <= hi`` (all points if fewer than
    two fall in range). Non-positive values are left out. None if fewer than two points remain."""
    pts = [(n, v) for n, v in zip(ns, values, strict=True) if v is not None and v > 0]
    inside = [(n, v) for n, v in pts if lo <= n <= hi]
    pts = inside if len(inside) >= 2 else pts
    if len(pts) < 2 or len({n for n, _ in pts}) < 2:
        return None
    lx = [math.log(n) for n, _ in pts]
    ly = [math.log(v) for _, v in pts]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    slope = sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)
    return {
        "slope": round(slope, 3),
        "range": [min(n for n, _ in pts), max(n for n, _ in pts)],
        "points": len(pts),
    }


def _modes(config: dict) -> list[str]:
    return ["infer", "train"] if config["mode"] == "both" else [config["mode"]]


def slopes(results: dict) -> dict:
    """``{model: {mode: {"time": fit, "memory": fit}}}`` over the measured (``"ok"``) points."""
    out = {}
    for m in results["config"]["models"]:
        out[m] = {}
        for mode in _modes(results["config"]):
            ok = [p for p in results["points"] if p["model"] == m and p["mode"] == mode and p["status"] == OK]
            ns = [p["n"] for p in ok]
            out[m][mode] = {
                "time": fit_slope(ns, [p["seconds"] for p in ok]),
                "memory": fit_slope(ns, [p["delta_rss_mb"] for p in ok]),
            }
    return out


def targets(results: dict) -> dict:
    """The scaling targets (``TARGET_MODELS`` above), evaluated on the training step."""
    out = {"slopes": {}, "speedup": {}}
    for m in TARGET_MODELS:
        s = results["slopes"].get(m, {}).get("train")
        if not s:
            continue
        out["slopes"][m] = {
            kind: None if s[kind] is None else {**s[kind], "met": s[kind]["slope"] <= SLOPE_TARGET}
            for kind in ("time", "memory")
        }
    train = {(p["model"], p["n"]): p for p in results["points"] if p["mode"] == "train"}
    for m in TARGET_MODELS:
        ours = [n for (mm, n), p in train.items() if mm == m and p["status"] == OK]
        if not ours:
            continue
        ref = train.get(("transformer", SPEEDUP_N))
        if ref and ref["status"] == OK and (m, SPEEDUP_N) in train and train[(m, SPEEDUP_N)]["status"] == OK:
            ratio = ref["seconds"] / train[(m, SPEEDUP_N)]["seconds"]
            out["speedup"][m] = {"n": SPEEDUP_N, "ratio": round(ratio, 2), "met": ratio >= SPEEDUP_TARGET}
        elif ref and ref["status"] in (TIMEOUT, OOM, SKIPPED):
            out["speedup"][m] = {
                "n": SPEEDUP_N,
                "ratio": None,
                "met": (m, SPEEDUP_N) in train and train[(m, SPEEDUP_N)]["status"] == OK,
                "note": f"transformer {ref['status']} at N={SPEEDUP_N}",
            }
        else:  # N=16k not in this run: the largest N both measured, for information
            both = [n for n in ours if train.get(("transformer", n), {}).get("status") == OK]
            if both:
                n = max(both)
                ratio = train[("transformer", n)]["seconds"] / train[(m, n)]["seconds"]
                out["speedup"][m] = {
                    "n": n,
                    "ratio": round(ratio, 2),
                    "met": None,
                    "note": f"N={SPEEDUP_N} not measured; ratio at N={n}",
                }
    return out


def machine_info() -> dict:
    import torch

    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "processor": platform.processor() or platform.machine(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            info["processor"] = names[0]
        info["memory_gb"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
        info["load_average"] = [round(v, 2) for v in os.getloadavg()]
    except (OSError, ValueError):
        pass
    return info


def write_report(out: Path, results: dict) -> None:
    cfg, mach = results["config"], results["machine"]
    lines = [
        "# chronomem efficiency benchmark",
        "",
        f"Width {cfg['dim']}, depth {cfg['depth']}, {cfg['heads']} heads, batch {cfg['batch_size']}; "
        f"{cfg['warmup']} warm-up + up to {cfg['repeats']} timed repeats (median); "
        f"threads {cfg['threads'] or 'default'}; timeout {cfg['timeout']} s; "
        f"memory cap {cfg['memory_cap_mb']} MB. Each (model, N) in a fresh process.",
        f"Machine: {mach.get('processor')}, {mach.get('cpu_count')} CPUs, torch {mach.get('torch')}, "
        f"load average at start {mach.get('load_average')}. Total {results['seconds']:.0f} s.",
    ]
    if results.get("conditions"):  # runs written before the conditions were recorded have none
        lines.append(f"Conditions: {summarize(results['conditions'])}.")
    lines += [
        "",
        "Cells: seconds per pass / peak resident memory above the baseline (MB).",
        "",
    ]
    by = {(p["model"], p["n"], p["mode"]): p for p in results["points"]}
    for mode in _modes(cfg):
        title = "Training step (forward + backward)" if mode == "train" else "Inference pass (no_grad)"
        lines += [
            f"## {title}",
            "",
            "| model | " + " | ".join(str(n) for n in cfg["lengths"]) + " | time slope | memory slope |",
            "|---" * (len(cfg["lengths"]) + 3) + "|",
        ]
        for m in cfg["models"]:
            cells = []
            for n in cfg["lengths"]:
                p = by.get((m, n, mode), {"status": "?"})
                cells.append(
                    f"{p['seconds']:.3g} s / {p['delta_rss_mb']:.0f} MB" if p["status"] == OK else p["status"]
                )
            s = results["slopes"].get(m, {}).get(mode, {})
            fmt = lambda f: "-" if not f else f"{f['slope']:.2f} ({f['range'][0]}-{f['range'][1]})"
            lines.append(
                f"| {m} | " + " | ".join(cells) + f" | {fmt(s.get('time'))} | {fmt(s.get('memory'))} |"
            )
        lines.append("")
    t = results.get("targets", {})
    lines += [
        "## Scaling targets of the efficient memories (reported, not asserted)",
        "",
        f"Training step: time and memory slopes against N at most {SLOPE_TARGET}; at N={SPEEDUP_N} at least "
        f"{SPEEDUP_TARGET}x faster than the full-attention transformer.",
        "",
    ]
    for m, s in t.get("slopes", {}).items():
        for kind, v in s.items():
            if v:
                lines.append(
                    f"- {m} training {kind} slope {v['slope']:.2f} over N={v['range'][0]}-{v['range'][1]} "
                    f"(target <= {SLOPE_TARGET}): {'met' if v['met'] else 'NOT met'}"
                )
    for m, v in t.get("speedup", {}).items():
        ratio = "n/a" if v["ratio"] is None else f"{v['ratio']:.2f}x"
        verdict = {True: "met", False: "NOT met", None: "not evaluated"}[v["met"]]
        lines.append(
            f"- {m} training step vs full-attention transformer at N={v['n']}: {ratio} "
            f"(target >= {SPEEDUP_TARGET}x at N={SPEEDUP_N}): {verdict}"
            + (f" — {v['note']}" if v.get("note") else "")
        )
    lines.append("")
    if results.get("peers"):
        lines += peer_report(results["peers"])
    (out / "report.md").write_text("\n".join(lines) + "\n")


def write_plots(out: Path, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = results["config"]
    modes = _modes(cfg)
    for kind, key, ylabel in (
        ("time", "seconds", "seconds per pass"),
        ("memory", "delta_rss_mb", "peak RSS - baseline (MB)"),
    ):
        fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.5), squeeze=False)
        for ax, mode in zip(axes[0], modes, strict=True):
            for m in cfg["models"]:
                pts = [
                    p
                    for p in results["points"]
                    if p["model"] == m and p["mode"] == mode and p["status"] == OK and p[key] > 0
                ]
                if pts:
                    ax.plot([p["n"] for p in pts], [p[key] for p in pts], marker="o", label=m)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length N")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{mode}: {kind} vs N")
            ax.grid(True, which="both", alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / f"{kind}.png", dpi=100)
        plt.close(fig)


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)
