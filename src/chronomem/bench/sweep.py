"""The scaling sweep: time and peak memory of every backbone against the sequence length N.

For each (model, N) a fresh process (``worker.measure``) builds the backbone from the registry at one
shared width and depth (``registry.build_backbone(name, dim=, depth=, num_heads=, causal=, **options)``, options from
``SPECS``), feeds random ``x [B, N, dim]`` and measures

* seconds per inference pass (``torch.no_grad``) and per training step (forward + backward of
  ``mean(y^2)``, no optimizer): warm-up passes, then timed repeats, median;
* tokens per second (``B * N / seconds``);
* peak resident memory above the baseline (``worker``); the baseline comes after import, model
  build, input allocation and one training step on the first 64 steps (lazy library
  initialisation). Inference runs first, so the training peak is the maximum of both: a training
  step needs at least the memory of a pass.

After an ``"OOM"``, ``"timeout"`` or ``"error"`` at some N, larger N of that model and mode are
``"skipped"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from chronomem.bench.worker import OK, measure, time_calls

SKIPPED = "skipped"
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


def registered_models() -> list[str]:
    from chronomem.registry import names

    return list(names()["models"])


def resolve_models(requested: Iterable[str] | None, flag: str = "--models") -> list[str]:
    """The models to benchmark: ``DEFAULT_MODELS`` for None, every registered model for ``["all"]``,
    else the named ones in order without repeats. An unknown name raises ValueError naming it (and
    ``flag``, the argument it came from) and listing the registered models."""
    available = registered_models()
    if requested is None:
        requested = DEFAULT_MODELS
    requested = list(requested)
    if requested == ["all"]:
        return sorted(available)
    unknown = [m for m in requested if m not in available]
    if unknown or not requested:
        raise ValueError(
            f"{flag}: unknown model(s) {', '.join(map(repr, unknown)) or '(none given)'}; "
            f"valid models: {', '.join(sorted(available))} (or 'all')"
        )
    return list(dict.fromkeys(requested))


# =============================================================================================
# One (model, N): the job run in the measuring process
# =============================================================================================


def _forward(model, x, stream: int | None):
    """Outputs of one pass, as a list of parts (one per streamed call)."""
    if not stream or x.shape[1] <= stream:
        return [model(x)[0]]
    parts, state = [], None
    for piece in x.split(stream, 1):
        y, state = model(piece, state=state)
        parts.append(y)
    return parts


def backbone_job(spec: dict, meter) -> None:
    """Measure one (model, N), one phase per mode (``worker.measure``'s job)."""
    import torch

    if spec.get("plugin"):  # a file that registers extra models (tests use it)
        import runpy

        runpy.run_path(spec["plugin"])
    from chronomem.registry import build_backbone

    torch.manual_seed(spec.get("seed", 0))
    try:
        model = build_backbone(
            spec["model"],
            dim=spec["dim"],
            depth=spec["depth"],
            num_heads=spec["heads"],
            causal=spec["causal"],
            **spec["options"],
        )
        x = torch.randn(spec["batch"], spec["n"], spec["dim"])
    except Exception as err:  # a bad option or shape: an error result for every phase
        meter.fail(err)
        return
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
        meter.fail(err)
        return
    meter.set_baseline(params=params)

    def phase(mode: str) -> dict:
        seconds, timed = time_calls(lambda: step(mode == "train", x), spec["warmup"], spec["repeats"],
                                    meter.deadline)
        return {
            "seconds": seconds,
            "tokens_per_s": spec["batch"] * spec["n"] / seconds,
            "times": [round(t, 6) for t in timed],
            "repeats": len(timed),
        }

    for mode in spec["modes"]:  # "infer" before "train": the peak only grows
        model.train(mode == "train")
        meter.run(mode, lambda mode=mode: phase(mode))


def run_point(spec: dict, timeout: float | None, memory_cap_mb: float | None = None) -> dict[str, dict]:
    """Measure one (model, N) in a fresh process; returns ``{mode: result}`` for every mode in the spec."""
    results = measure("chronomem.bench.sweep:backbone_job", spec, spec["modes"], timeout=timeout,
                      memory_cap_mb=memory_cap_mb, threads=spec.get("threads"))
    for r in results.values():
        r.setdefault("params", None)
    return results


# =============================================================================================
# The sweep
# =============================================================================================


def sweep(args, log: Callable[[str], Any] = print) -> dict:
    """Every (model, N) point of the benchmark: ``{"config", "points"}``. ``args``: the parsed command
    line (``args.models`` already resolved by ``resolve_models``)."""
    models = list(args.models)
    modes = ["infer", "train"] if args.mode == "both" else [args.mode]
    specs = {m: SPECS.get(m, ModelSpec()) for m in models}
    for name, key, value in args.model_opt:
        if name in specs:
            specs[name] = ModelSpec(
                specs[name].causal, {**specs[name].options, key: value}, specs[name].stream
            )
    points: list[dict] = []
    for m in models:
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
            "specs": {m: asdict(s) for m, s in specs.items()},
        },
        "points": points,
    }


def _cell(r: dict, mode: str = "") -> str:
    if r.get("status") != OK:
        return f"{mode} {r.get('status')}".strip()
    return f"{mode} {r['seconds']:.3g}s {r['delta_rss_mb']:.0f}MB".strip()
