"""Efficiency benchmark: time and memory of every backbone against sequence length, and against peers.

``chronomem bench [--models ...] [--lengths ...] [--mode train|infer|both] [--out DIR] [--quick]``

For each (model, N) a FRESH Python process (``python -m chronomem.bench --worker SPEC``) builds the
backbone from the registry at one shared width and depth (``get_model(name)(dim, depth, num_heads,
causal, **options)``, options from ``SPECS`` below), feeds random ``x [B, N, dim]`` and measures

* seconds per inference pass (``torch.no_grad``) and per training step (forward + backward of
  ``mean(y^2)``, no optimizer): warm-up passes, then timed repeats, median;
* tokens per second (``B * N / seconds``);
* peak resident memory: the child's peak RSS (``VmHWM``, else ``ru_maxrss``) after each phase, the
  baseline after import, model build, input allocation and one training step on the first 64 steps
  (lazy library initialisation), and their difference (inference runs first, so the training
  peak is the maximum of both — a training step needs at least the memory of a pass).

Failures are results, not crashes: an allocation failure (``MemoryError``, torch's "can't allocate
memory", or the hard ``RLIMIT_AS`` net the child sets) or a peak above ``--memory-cap-mb`` is
``"OOM"``; a child that runs past ``--timeout`` is killed and recorded as ``"timeout"``; after either,
larger N of that model and mode are ``"skipped"``. Names not registered (a mechanism not written
yet) are ``"unavailable"``.

Then a least-squares fit of log(seconds) and log(memory) against log(N) per model and mode (points
with 1k <= N <= 32k, or every measured point when fewer than two are in range), ``OUT/results.json``,
``OUT/report.md`` and ``OUT/time.png`` / ``OUT/memory.png`` (log-log).

Peer comparison (``PEERS``): our ``chronomem.htm.HTMAttention`` against other published
implementations of the same read (``htm-pytorch``'s ``HTMAttention``, the ``[bench]`` extra) on
identical shapes. Times are measured side by side in one process (interleaved repeats, median);
peak memory in one fresh process per implementation. Peers that cannot be imported are skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_MODELS = (
    "transformer",
    "transformer-xl",
    "tlb",
    "blrp",
    "htm",
    "relevance-rnn",
    "mem-rnn",
    "lstm",
)
DEFAULT_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
QUICK_LENGTHS = (256, 512, 1024)
FIT_RANGE = (1024, 32768)
TARGET_MODELS = ("tlb", "blrp", "htm", "relevance-rnn")  # issue 6: slopes <= 1.15, >= 5x at 16k
SLOPE_TARGET, SPEEDUP_TARGET, SPEEDUP_N = 1.15, 5.0, 16384
OK, OOM, TIMEOUT, SKIPPED, ERROR, UNAVAILABLE = "ok", "OOM", "timeout", "skipped", "error", "unavailable"
MARK = "@@bench "  # prefix of the worker's result lines on stdout


@dataclass
class ModelSpec:
    """How the benchmark builds and feeds one backbone.

    ``causal``: passed to the builder. ``options``: builder options. ``stream``: feed ``x`` in calls of
    this many steps, passing the state along (the streaming use of a recurrent memory; ``None`` = one
    call over the whole sequence).
    """

    causal: bool = True
    options: dict = field(default_factory=dict)
    stream: int | None = None


# Per-model settings at the shared width/depth. Full attention, TLB and BLRP are the non-causal LRA
# setting; the agent / RNN memories are causal. HTM keeps a fixed ring buffer of 64 chunks of 32 steps
# (the agent setting) and is fed window by window: its whole-sequence mode builds an [N, N] local mask.
SPECS: dict[str, ModelSpec] = {
    "transformer": ModelSpec(causal=False),
    "transformer-xl": ModelSpec(options={"segment_len": 64, "mem_len": 256}),
    "gtrxl": ModelSpec(options={"segment_len": 64, "mem_len": 256}),
    "tlb": ModelSpec(causal=False, options={"chunk_size": 128, "num_state": 32, "self_per_cross": 1}),
    "blrp": ModelSpec(causal=False),
    "htm": ModelSpec(options={"chunk_size": 32, "top_k": 8, "memory_size": 64, "window": 64}, stream=512),
    "relevance-rnn": ModelSpec(options={"buffer_size": 10, "relevant_size": 15}),
    "relevance-lstm": ModelSpec(options={"buffer_size": 10, "relevant_size": 15}),
}


# =============================================================================================
# The worker: one (model, N) in a fresh process
# =============================================================================================


def _maxrss_mb() -> float:
    """Peak resident memory of this process in MiB. On Linux ``VmHWM`` of /proc/self/status: the
    ``ru_maxrss`` of an exec'd child starts at its parent's RSS at fork time, VmHWM does not."""
    hwm = _status_mb("VmHWM")
    if hwm is not None:
        return hwm
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux


def _status_mb(field_name: str, pid: int | str = "self") -> float | None:
    """``VmRSS`` / ``VmSize`` of a process from /proc (Linux), in MiB; None where unavailable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _is_oom(err: BaseException) -> bool:
    text = str(err).lower()
    return (
        isinstance(err, MemoryError)
        or "out of memory" in text
        or "can't allocate" in text
        or "cannot allocate" in text
    )


def _emit(**record) -> None:
    print(MARK + json.dumps(record), flush=True)


def count_flops(model, x) -> int:
    """Floating-point operations of one inference pass ``model(x)``: matmuls and attention, counted by
    ``torch.utils.flop_counter`` (2 per multiply-add; elementwise work is not counted). The counter
    knows the CUDA attention kernels; SDPA on a CPU dispatches to an op it does not, mapped here."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    def cpu_attention(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    mapping = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_attention}
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        model(x)
    return counter.get_total_flops()


def _forward(model, x, stream: int | None):
    """Outputs of one pass, as a list of parts (one per streamed call)."""
    if not stream or x.shape[1] <= stream:
        return [model(x)[0]]
    parts, state = [], None
    for piece in x.split(stream, 1):
        y, state = model(piece, state=state)
        parts.append(y)
    return parts


def worker(spec: dict) -> int:
    """Measure one (model, N); print one ``MARK`` line per phase (see ``run_point``)."""
    import torch

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    if spec.get("plugin"):  # a file that registers extra models (tests use it)
        import runpy

        runpy.run_path(spec["plugin"])
    from chronomem.registry import get_model

    start = time.perf_counter()
    torch.manual_seed(spec.get("seed", 0))
    try:
        model = get_model(spec["model"])(
            dim=spec["dim"],
            depth=spec["depth"],
            num_heads=spec["heads"],
            causal=spec["causal"],
            **spec["options"],
        )
        x = torch.randn(spec["batch"], spec["n"], spec["dim"])
    except Exception as err:  # a bad option or shape: an error result for every phase
        for mode in spec["modes"]:
            _emit(mode=mode, status=ERROR, error=f"{type(err).__name__}: {err}")
        return 0
    params = sum(p.numel() for p in model.parameters())

    def step(train: bool, inp) -> None:
        if train:
            model.zero_grad(set_to_none=True)
            parts = _forward(model, inp, spec["stream"])
            loss = sum(y.float().square().sum() for y in parts) / inp.numel()
            loss.backward()
        else:
            with torch.no_grad():
                _forward(model, inp, spec["stream"])

    try:  # one training step on the first 64 steps: lazy library initialisation lands in the baseline
        step(True, x[:, : min(spec["n"], 64)])
        model.zero_grad(set_to_none=True)
    except Exception as err:
        for mode in spec["modes"]:
            _emit(
                mode=mode, status=OOM if _is_oom(err) else ERROR, error=f"{type(err).__name__}: {err}"[:400]
            )
        return 0
    baseline = _maxrss_mb()
    # Hard safety net: the address space may grow by the cap (twice, plus room for allocator arenas)
    # past what it is now; the cap itself is checked on the measured peak.
    vm = _status_mb("VmSize")
    if spec.get("memory_cap_mb") and vm is not None:
        limit = int((vm + 2 * spec["memory_cap_mb"] + 512) * 2**20)
        try:
            resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
        except (ValueError, OSError):
            pass
    _emit(event="setup", baseline_rss_mb=round(baseline, 1), params=params)

    deadline = start + spec["timeout"] if spec.get("timeout") else math.inf
    for mode in spec["modes"]:  # "infer" before "train": the peak only grows
        model.train(mode == "train")
        try:
            times = []
            for _ in range(spec["warmup"]):
                t0 = time.perf_counter()
                step(mode == "train", x)
                times.append(time.perf_counter() - t0)
            # Timed repeats that fit in 70% of the time left; none fit -> report the warm-up time.
            left = deadline - time.perf_counter()
            repeats = spec["repeats"]
            if times and math.isfinite(left):
                repeats = max(0, min(repeats, int(0.7 * left / max(times[-1], 1e-9))))
            timed = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                step(mode == "train", x)
                timed.append(time.perf_counter() - t0)
            seconds = statistics.median(timed or times)
        except Exception as err:
            status = OOM if _is_oom(err) else ERROR
            _emit(
                mode=mode,
                status=status,
                error=f"{type(err).__name__}: {str(err)[:300]}",
                baseline_rss_mb=round(baseline, 1),
                peak_rss_mb=round(_maxrss_mb(), 1),
            )
            continue
        peak = _maxrss_mb()
        delta = max(peak - baseline, 0.0)
        cap = spec.get("memory_cap_mb")
        _emit(
            mode=mode,
            status=OOM if cap and delta > cap else OK,
            seconds=seconds,
            tokens_per_s=spec["batch"] * spec["n"] / seconds,
            times=[round(t, 6) for t in timed],
            repeats=len(timed),
            baseline_rss_mb=round(baseline, 1),
            peak_rss_mb=round(peak, 1),
            delta_rss_mb=round(delta, 1),
            params=params,
            **({"error": f"peak {delta:.0f} MB above the cap {cap} MB"} if cap and delta > cap else {}),
        )
    return 0


def run_point(spec: dict, timeout: float | None, memory_cap_mb: float | None = None) -> dict[str, dict]:
    """Run ``worker(spec)`` in a fresh process; returns ``{mode: result}`` for every mode in the spec.

    The parent also watches the child's resident memory and kills it past baseline + cap (``"OOM"``);
    past ``timeout`` seconds it kills it (``"timeout"`` for the phases not yet reported).
    """
    env = dict(os.environ, MALLOC_ARENA_MAX="2")
    if spec.get("threads"):
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(spec["threads"])
    spec = dict(spec, timeout=timeout, memory_cap_mb=memory_cap_mb)
    proc = subprocess.Popen(
        [sys.executable, "-m", "chronomem.bench", "--worker", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    records: list[dict] = []
    stderr: list[str] = []

    def read_stdout():
        for line in proc.stdout:
            if line.startswith(MARK):
                records.append(json.loads(line[len(MARK) :]))

    def read_stderr():
        stderr.extend(proc.stderr)

    readers = [
        threading.Thread(target=read_stdout, daemon=True),
        threading.Thread(target=read_stderr, daemon=True),
    ]
    for r in readers:
        r.start()
    start = time.perf_counter()
    killed = None
    while proc.poll() is None:
        if timeout is not None and time.perf_counter() - start > timeout:
            killed = TIMEOUT
        elif memory_cap_mb:
            setup = next((r for r in records if r.get("event") == "setup"), None)
            rss = _status_mb("VmRSS", proc.pid)
            if setup and rss is not None and rss - setup["baseline_rss_mb"] > memory_cap_mb:
                killed = OOM
        if killed:
            proc.kill()
            break
        time.sleep(0.05)
    proc.wait()
    for r in readers:
        r.join(timeout=5)
    results = {r["mode"]: r for r in records if "mode" in r}
    tail = "".join(stderr)[-500:]
    for mode in spec["modes"]:
        if mode in results:
            continue
        if killed == TIMEOUT:
            results[mode] = {"status": TIMEOUT, "error": f"killed after {timeout} s"}
        elif killed == OOM:
            results[mode] = {"status": OOM, "error": f"resident memory above the cap {memory_cap_mb} MB"}
        else:  # died without a result: a signal or an abort; allocation failures count as OOM
            memory = proc.returncode == -9 or "memory" in tail.lower() or "bad_alloc" in tail
            results[mode] = {
                "status": OOM if memory else ERROR,
                "error": f"worker exited with code {proc.returncode}: {tail.strip()[-300:]}",
            }
    setup = next((r for r in records if r.get("event") == "setup"), {})
    for r in results.values():
        r.setdefault("params", setup.get("params"))
    return results


# =============================================================================================
# The sweep, the fits and the report
# =============================================================================================


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


def registered_models() -> set[str]:
    from chronomem.registry import names

    return set(names()["models"])


def sweep(args, log: Callable[[str], Any] = print) -> dict:
    """Every (model, N) point of the benchmark; returns the results dict (without peers)."""
    available = registered_models()
    if args.models == ["all"]:
        models = sorted(available)
    else:
        models = list(dict.fromkeys(args.models))
    modes = ["infer", "train"] if args.mode == "both" else [args.mode]
    specs = {m: SPECS.get(m, ModelSpec()) for m in models}
    for name, key, value in args.model_opt:
        if name in specs:
            specs[name] = ModelSpec(
                specs[name].causal, {**specs[name].options, key: value}, specs[name].stream
            )
    points: list[dict] = []
    unavailable = [m for m in models if m not in available]
    for m in unavailable:
        log(f"{m:16s} unavailable (not registered)")
        points += [
            {"model": m, "n": n, "mode": mode, "status": UNAVAILABLE} for n in args.lengths for mode in modes
        ]
    for m in (m for m in models if m in available):
        alive = list(modes)
        for n in args.lengths:
            if not alive:
                points += [{"model": m, "n": n, "mode": mode, "status": SKIPPED} for mode in modes]
                continue
            spec = {
                "model": m,
                "n": n,
                "modes": alive,
                "dim": args.dim,
                "depth": args.depth,
                "heads": args.heads,
                "batch": args.batch_size,
                "causal": specs[m].causal,
                "options": specs[m].options,
                "stream": specs[m].stream,
                "warmup": args.warmup,
                "repeats": args.repeats,
                "threads": args.threads,
                "seed": args.seed,
                "plugin": args.plugin,
            }
            results = run_point(spec, args.timeout, args.memory_cap_mb)
            for mode in modes:
                if mode not in alive:
                    points.append({"model": m, "n": n, "mode": mode, "status": SKIPPED})
                    continue
                r = results[mode]
                points.append({"model": m, "n": n, "mode": mode, **r})
                if r["status"] != OK:
                    alive.remove(mode)
            log(
                f"{m:16s} N={n:6d}  "
                + "  ".join(_cell(results.get(mode, {"status": SKIPPED}), mode) for mode in modes)
            )
    slopes = {}
    for m in models:
        slopes[m] = {}
        for mode in modes:
            ok = [p for p in points if p["model"] == m and p["mode"] == mode and p["status"] == OK]
            ns = [p["n"] for p in ok]
            slopes[m][mode] = {
                "time": fit_slope(ns, [p["seconds"] for p in ok]),
                "memory": fit_slope(ns, [p["delta_rss_mb"] for p in ok]),
            }
    return {
        "config": {
            "models": models,
            "lengths": list(args.lengths),
            "mode": args.mode,
            "dim": args.dim,
            "depth": args.depth,
            "heads": args.heads,
            "batch_size": args.batch_size,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "threads": args.threads,
            "timeout": args.timeout,
            "memory_cap_mb": args.memory_cap_mb,
            "quick": args.quick,
            "seed": args.seed,
            "fit_range": list(FIT_RANGE),
            "specs": {m: asdict(s) for m, s in specs.items()},
        },
        "points": points,
        "slopes": slopes,
        "unavailable": unavailable,
    }


def _cell(r: dict, mode: str = "") -> str:
    if r.get("status") != OK:
        return f"{mode} {r.get('status')}".strip()
    return f"{mode} {r['seconds']:.3g}s {r['delta_rss_mb']:.0f}MB".strip()


def targets(results: dict) -> dict:
    """Issue 6's targets, evaluated (reported, never asserted)."""
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
        "",
        "Cells: seconds per pass / peak resident memory above the baseline (MB).",
        "",
    ]
    modes = ["infer", "train"] if cfg["mode"] == "both" else [cfg["mode"]]
    by = {(p["model"], p["n"], p["mode"]): p for p in results["points"]}
    for mode in modes:
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
    lines += ["## Targets (issue 6; reported, not asserted)", ""]
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
    if results["unavailable"]:
        lines += [f"Unavailable (not registered): {', '.join(results['unavailable'])}", ""]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def write_plots(out: Path, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = results["config"]
    modes = ["infer", "train"] if cfg["mode"] == "both" else [cfg["mode"]]
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


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


# =============================================================================================
# Peer comparison: HTMAttention against other implementations of the same read
# =============================================================================================


@dataclass
class PeerShape:
    """Issue 6's shapes: B=4, Q=128 queries, M=256 chunks of C=32, top-k 8, D=256 (8 heads of 32)."""

    batch: int = 4
    queries: int = 128
    chunks: int = 256
    chunk_size: int = 32
    top_k: int = 8
    dim: int = 256
    heads: int = 8


def _ours(shape: PeerShape, queries, flat_memory):
    """chronomem.htm.HTMAttention over a full HierarchicalMemory holding ``flat_memory`` in order."""
    from dataclasses import replace

    import torch

    from chronomem.htm import HierarchicalMemory, HTMAttention

    B, M, C, D = shape.batch, shape.chunks, shape.chunk_size, shape.dim
    attn = HTMAttention(D, shape.heads, shape.top_k, C)
    contents = flat_memory.reshape(B, M, C, D)
    memory = replace(
        HierarchicalMemory.empty(B, M, C, D),
        keys=contents.mean(2),
        contents=contents,  # Section 2: the summary key is the chunk mean
        slot_valid=torch.ones(B, M, C, dtype=torch.bool),
        valid=torch.ones(B, M, dtype=torch.bool),
    )
    return attn, lambda q: attn(q, memory)


def _htm_pytorch(shape: PeerShape, queries, flat_memory):
    """``htm_pytorch.HTMAttention`` (PyPI ``htm-pytorch``): memories as one flat [B, M*C, D] sequence."""
    from htm_pytorch import HTMAttention

    attn = HTMAttention(
        dim=shape.dim,
        heads=shape.heads,
        topk_mems=shape.top_k,
        mem_chunk_size=shape.chunk_size,
        dim_head=shape.dim // shape.heads,
    )
    return attn, lambda q: attn(q, flat_memory)


# name -> builder(shape, queries, flat_memory) -> (module, read(queries) -> [B, Q, D]); "chronomem" first.
PEERS: dict[str, Callable] = {"chronomem": _ours, "htm-pytorch": _htm_pytorch}


def _peer_inputs(shape: PeerShape, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(shape.batch, shape.queries, shape.dim, generator=g)
    mem = torch.randn(shape.batch, shape.chunks * shape.chunk_size, shape.dim, generator=g)
    return q, mem


def _peer_step(module, read, q, train: bool) -> None:
    import torch

    if train:
        module.zero_grad(set_to_none=True)
        q = q.detach().requires_grad_(True)
        read(q).square().mean().backward()
    else:
        with torch.no_grad():
            read(q)


def peer_worker(name: str, shape: dict, seed: int) -> int:
    """Peak memory of one implementation in a fresh process: infer, then train."""
    shape = PeerShape(**shape)
    q, mem = _peer_inputs(shape, seed)
    try:
        module, read = PEERS[name](shape, q, mem)
    except ImportError as err:
        _emit(mode="infer", status=UNAVAILABLE, error=str(err))
        return 0
    baseline = _maxrss_mb()
    _emit(event="setup", baseline_rss_mb=round(baseline, 1))
    for mode in ("infer", "train"):
        _peer_step(module, read, q, mode == "train")
        _emit(
            mode=mode,
            status=OK,
            baseline_rss_mb=round(baseline, 1),
            peak_rss_mb=round(_maxrss_mb(), 1),
            delta_rss_mb=round(max(_maxrss_mb() - baseline, 0.0), 1),
        )
    return 0


def compare_peers(
    shape: PeerShape | None = None,
    repeats: int = 5,
    warmup: int = 1,
    threads: int | None = None,
    timeout: float | None = 300,
    seed: int = 0,
    log: Callable[[str], Any] = print,
) -> dict:
    """Time every importable peer side by side (interleaved repeats, median) and measure each one's
    peak memory in a fresh process; ratios are peer / chronomem (> 1: ours is faster / smaller)."""
    import torch

    shape = shape or PeerShape()
    if threads:
        torch.set_num_threads(threads)
    q, mem = _peer_inputs(shape, seed)
    built, unavailable = {}, {}
    for name, builder in PEERS.items():
        try:
            torch.manual_seed(seed)
            built[name] = builder(shape, q, mem)
        except ImportError as err:
            unavailable[name] = str(err)
    times: dict[str, dict[str, list[float]]] = {name: {"infer": [], "train": []} for name in built}
    for mode in ("infer", "train"):
        for i in range(warmup + repeats):
            for name, (module, read) in built.items():  # interleaved: load changes hit everyone alike
                t0 = time.perf_counter()
                _peer_step(module, read, q, mode == "train")
                if i >= warmup:
                    times[name][mode].append(time.perf_counter() - t0)
    env = dict(os.environ, MALLOC_ARENA_MAX="2", **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    memory = {}
    for name in built:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "chronomem.bench",
                "--peer-worker",
                name,
                json.dumps(asdict(shape)),
                str(seed),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
        memory[name] = {
            r["mode"]: r
            for r in (
                json.loads(line[len(MARK) :]) for line in proc.stdout.splitlines() if line.startswith(MARK)
            )
            if "mode" in r
        }
    rows = {}
    for name in built:
        rows[name] = {}
        for mode in ("infer", "train"):
            sec = statistics.median(times[name][mode])
            mb = memory[name].get(mode, {}).get("delta_rss_mb")
            rows[name][mode] = {
                "seconds": sec,
                "delta_rss_mb": mb,
                "times": [round(t, 6) for t in times[name][mode]],
            }
    ref = rows.get("chronomem")
    for name, row in rows.items():
        for mode, r in row.items():
            if ref and name != "chronomem":
                r["time_ratio"] = round(r["seconds"] / ref[mode]["seconds"], 2)
                ours_mb = ref[mode]["delta_rss_mb"]
                r["memory_ratio"] = (
                    round(r["delta_rss_mb"] / ours_mb, 2) if r["delta_rss_mb"] and ours_mb else None
                )
    result = {"shape": asdict(shape), "repeats": repeats, "rows": rows, "unavailable": unavailable}
    for line in peer_report(result):
        log(line)
    return result


def peer_report(peers: dict) -> list[str]:
    s = peers["shape"]
    lines = [
        "## HTMAttention against peers",
        "",
        f"B={s['batch']}, Q={s['queries']} queries, M={s['chunks']} chunks of C={s['chunk_size']}, "
        f"top-k {s['top_k']}, D={s['dim']} ({s['heads']} heads); median of {peers['repeats']} interleaved "
        "repeats; peak memory above the baseline in a fresh process per implementation. "
        "Ratio = peer / chronomem (> 1: chronomem is faster / smaller).",
        "",
        "| implementation | infer s | infer MB | train s | train MB | time ratio (infer / train) "
        "| memory ratio (infer / train) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in peers["rows"].items():
        i, t = row["infer"], row["train"]
        mb = lambda v: "-" if v is None else f"{v:.0f}"
        ratio = lambda a, b: "-" if a is None else f"{a} / {b}"
        lines.append(
            f"| {name} | {i['seconds']:.4f} | {mb(i['delta_rss_mb'])} | {t['seconds']:.4f} | "
            f"{mb(t['delta_rss_mb'])} | {ratio(i.get('time_ratio'), t.get('time_ratio'))} | "
            f"{ratio(i.get('memory_ratio'), t.get('memory_ratio'))} |"
        )
    for name, why in peers.get("unavailable", {}).items():
        lines.append(f"| {name} | not installed ({why}) | | | | | |")
    return lines + [""]


# =============================================================================================
# Command line
# =============================================================================================


def _model_opt(text: str):
    import ast

    try:
        name, rest = text.split(":", 1)
        key, value = rest.split("=", 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--model-opt takes MODEL:KEY=VALUE, got {text!r}") from None
    try:
        value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        pass
    return name, key, value


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="chronomem bench", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--models",
        nargs="+",
        default=None,
        help=f"registry names or 'all' (default: {' '.join(DEFAULT_MODELS)})",
    )
    p.add_argument(
        "--lengths", nargs="+", type=int, default=None, help="sequence lengths N (default 512 .. 32768)"
    )
    p.add_argument("--mode", default="both", choices=["train", "infer", "both"])
    p.add_argument("--out", default="runs/bench", help="output directory (default runs/bench)")
    p.add_argument(
        "--quick", action="store_true", help="tiny width, N in 256..1024, few repeats (~2 minutes)"
    )
    p.add_argument("--dim", type=int, default=None, help="shared width (default 64; quick 32)")
    p.add_argument("--depth", type=int, default=None, help="shared depth (default 2; quick 1)")
    p.add_argument("--heads", type=int, default=None, help="attention heads (default 4; quick 2)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per point (default 3; quick 2)")
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads in each worker (default: torch's)"
    )
    p.add_argument(
        "--memory-cap-mb", type=float, default=8192, help="peak memory above the baseline counted as OOM"
    )
    p.add_argument(
        "--timeout", type=float, default=None, help="seconds per (model, N) process (default 90; quick 30)"
    )
    p.add_argument(
        "--model-opt",
        type=_model_opt,
        action="append",
        default=[],
        metavar="MODEL:KEY=VALUE",
        help="builder option for one model, repeatable (e.g. htm:top_k=4)",
    )
    p.add_argument(
        "--peer",
        choices=["auto", "only", "off"],
        default=None,
        help="HTMAttention peer comparison (about a minute): after the sweep (auto; the default "
        "without --quick), alone (only) or not (off; the default with --quick)",
    )
    p.add_argument(
        "--plugin", default=None, help="a Python file that registers extra models (run in every worker)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--peer-worker", nargs=3, default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker:
        return worker(json.loads(args.worker))
    if args.peer_worker:
        name, shape, seed = args.peer_worker
        return peer_worker(name, json.loads(shape), int(seed))
    quick = args.quick
    args.models = args.models or list(DEFAULT_MODELS)
    args.lengths = sorted(set(args.lengths or (QUICK_LENGTHS if quick else DEFAULT_LENGTHS)))
    args.dim = args.dim or (32 if quick else 64)
    args.depth = args.depth or (1 if quick else 2)
    args.heads = args.heads or (2 if quick else 4)
    args.repeats = args.repeats if args.repeats is not None else (2 if quick else 3)
    args.timeout = args.timeout if args.timeout is not None else (30.0 if quick else 90.0)
    args.peer = args.peer or ("off" if quick else "auto")
    for name, value in (
        ("--dim", args.dim),
        ("--depth", args.depth),
        ("--heads", args.heads),
        ("--batch-size", args.batch_size),
        ("--repeats", args.repeats),
    ):
        if value < 1:
            print(f"chronomem bench: error: {name} must be >= 1, got {value}", file=sys.stderr)
            return 2
    if args.dim % args.heads or min(args.lengths) < 1 or args.timeout <= 0:
        print(
            "chronomem bench: error: --heads must divide --dim, lengths must be >= 1, --timeout > 0",
            file=sys.stderr,
        )
        return 2
    if args.plugin:
        import runpy

        runpy.run_path(args.plugin)  # so the parent sees the plugin's models as registered
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    machine = machine_info()
    if args.peer == "only":
        peers = compare_peers(repeats=args.repeats, warmup=args.warmup, threads=args.threads, seed=args.seed)
        _write_json(out / "peers.json", {"machine": machine, **peers})
        return 0
    results = sweep(args)
    results["machine"] = machine
    results["targets"] = targets(results)
    results["peers"] = None
    if args.peer == "auto":
        results["peers"] = compare_peers(
            repeats=args.repeats, warmup=args.warmup, threads=args.threads, seed=args.seed
        )
    results["seconds"] = round(time.perf_counter() - start, 1)
    _write_json(out / "results.json", results)
    write_report(out, results)
    write_plots(out, results)
    print(
        f"\n{results['seconds']:.0f} s; wrote {out / 'results.json'}, {out / 'report.md'}, "
        f"{out / 'time.png'}, {out / 'memory.png'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
