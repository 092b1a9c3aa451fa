"""transfer-copy (paper 004 Table 1) and denoise (paper 004 Table 2): relevancy screening vs full memory.

* ``transfer-copy``: train on Copy at T=100, evaluate on fresh sequences at T = 100, 200, 400, 2000,
  5000 (RelevanceRNN, RelevanceLSTM, MemRNN, LSTM).
* ``denoise``: train and evaluate on Denoise at each T (paper: 100, 300, 500, 1000, 2000).

Authors' settings (their code, bhargav104/MemoryNets; docs/relevance.md): hidden 128, nu=10 /
rho=15 on Copy, nu=15 / rho=15 on Denoise, batch 10, RMSprop lr 1e-3, gradient clipping 1.0.
Tokens go through the heads' embedding (equivalent to the authors' one-hot input times U).

Memory: every transfer evaluation runs in a fresh process measured by the benchmark's worker
(``chronomem.bench.worker``, as ``chronomem bench`` measures its backbones): peak resident memory
(``VmHWM``) above a baseline taken once the model is built and its weights loaded. A run whose peak
above the baseline passes ``cap_mb``, or that cannot allocate, is reported as ``"OOM"`` (as the paper
reports MemRNN), and ``extra["peak_memory_mb"]`` / ``extra["delta_memory_mb"]`` hold the peak and the
peak above the baseline of every T that ran, so linear vs quadratic growth shows. For denoise, one
training step at each T is probed the same way before training (MemRNN's saved activations grow as
T^2): a model whose step does not fit is ``"OOM"`` at that T.

With ``jobs`` (``chronomem run --jobs K``) a model is one job: its training and its measured
evaluations (transfer-copy), or its T's one after the other (denoise), which stop at the first OOM.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from chronomem.bench.worker import OK, OOM, measure
from chronomem.experiments.base import Experiment, Scale, select_models
from chronomem.experiments.jobs import SEQUENTIAL, Jobs
from chronomem.registry import register_experiment
from chronomem.report import Claim

# --------------------------------------------------------------------------------------------
# Paper numbers (accuracy on the 10 output symbols, %)
# --------------------------------------------------------------------------------------------

PAPER_TRANSFER = {  # paper 004 Table 1
    "relevance-rnn": {"T=100": 100.0, "T=200": 99.0, "T=400": 99.0, "T=2000": 99.0, "T=5000": 99.0},
    "relevance-lstm": {"T=100": 100.0, "T=200": 99.0, "T=400": 99.0, "T=2000": 99.0, "T=5000": 99.0},
    "mem-rnn": {"T=100": 99.0, "T=200": 99.0, "T=400": 99.0, "T=2000": 92.0, "T=5000": "OOM"},
    "lstm": {"T=100": 99.0, "T=200": 64.0, "T=400": 48.0, "T=2000": 19.0, "T=5000": 14.0},
}
PAPER_DENOISE = {  # paper 004 Table 2
    "relevance-rnn": {"T=100": 100.0, "T=300": 99.0, "T=500": 99.0, "T=1000": 99.0, "T=2000": 99.0},
    "relevance-lstm": {"T=100": 100.0, "T=300": 99.0, "T=500": 99.0, "T=1000": 99.0, "T=2000": 99.0},
    "mem-rnn": {"T=100": 99.0, "T=300": 99.0, "T=500": 99.0, "T=1000": 99.0, "T=2000": "OOM"},
    "lstm": {"T=100": 82.0, "T=300": 41.0, "T=500": 33.0, "T=1000": 21.0, "T=2000": 15.0},
}


def model_options(model: str, hidden: int, nu: int, rho: int) -> dict:
    if model in ("relevance-rnn", "relevance-lstm"):
        return {"dim": hidden, "buffer_size": nu, "relevant_size": rho}
    if model in ("mem-rnn", "mem-lstm"):
        return {"dim": hidden}
    return {"dim": hidden, "depth": 1}  # lstm baseline


# --------------------------------------------------------------------------------------------
# Scales
# --------------------------------------------------------------------------------------------

TRANSFER_MODELS = ("relevance-rnn", "relevance-lstm", "mem-rnn", "lstm")


@dataclass(frozen=True, kw_only=True)
class RelevanceScale(Scale):
    """The authors' training (docs/relevance.md): hidden 128, batch 10, RMSprop lr 1e-3 (alpha 0.99, torch's
    default), clip 1.0."""

    hidden: int = 128
    lr: float = 1e-3
    optimizer: str = "rmsprop"
    batch_size: int = 10
    eval_batch: int = 50  # sequences per evaluation batch
    cap_mb: int  # peak memory (MB) above the baseline of a measured process before it counts as OOM
    models: tuple[str, ...] = TRANSFER_MODELS


@dataclass(frozen=True, kw_only=True)
class TransferScale(RelevanceScale):
    train_T: int  # trained on Copy at this T...
    eval: dict[int, int]  # ...and evaluated at each T on this many sequences
    eval_examples: int = 16  # of the training run's own test (transfer-copy: eval's count at train_T)


@dataclass(frozen=True, kw_only=True)
class DenoiseScale(RelevanceScale):
    T: tuple[int, ...]  # trained and evaluated at each of these T


TRANSFER_SCALES = {
    "smoke": TransferScale(train_T=10, eval={10: 8, 40: 8}, hidden=16, steps=3, batch_size=4, eval_batch=8,
                           cap_mb=4096),
    # About a minute of training on 2 cores (~10 steps/s), plus the evaluations up to T=2000.
    "tour": TransferScale(train_T=100, eval={100: 200, 200: 200, 400: 100, 2000: 20}, steps=600, cap_mb=2048,
                          models=("relevance-rnn",)),
    # 7,000 steps: what RelevanceRNN reached in the 13 minutes this scale was sized for (one core).
    "quick": TransferScale(train_T=100, eval={100: 500, 200: 500, 400: 200, 2000: 50, 5000: 20}, steps=7_000,
                           cap_mb=2048),
    "paper": TransferScale(train_T=100, eval={100: 10_000, 200: 10_000, 400: 10_000, 2000: 10_000, 5000: 10_000},
                           steps=100_000, eval_batch=100, cap_mb=16_384),
}
DENOISE_SCALES = {
    "smoke": DenoiseScale(T=(5,), hidden=16, steps=3, batch_size=4, eval_examples=8, cap_mb=4096,
                          models=("relevance-rnn", "mem-rnn")),
    # 2,500 steps per T: the ~13 minutes per model the two T's took under this scale's former 400 s
    # each (RelevanceRNN ~9 steps/s at T=100, ~4.5 at T=200).
    "quick": DenoiseScale(T=(100, 200), steps=2_500, eval_examples=500, cap_mb=4096),
    "paper": DenoiseScale(T=(100, 300, 500, 1000, 2000), steps=100_000, eval_examples=10_000, cap_mb=16_384),
}


# --------------------------------------------------------------------------------------------
# Memory-capped subprocess: evaluation of a trained run (or one training step of a new model)
# --------------------------------------------------------------------------------------------


def capped_job(request: dict, meter) -> None:
    """Evaluation, or one training step, of a model in the measuring process (``run_capped``)."""
    import torch

    from chronomem.heads import build_model
    from chronomem.registry import get_task
    from chronomem.train import evaluate, load_checkpoint
    from chronomem.train.metrics import loss_and_accuracy

    try:
        task = get_task(request["task"])(**request["task_options"])
        torch.manual_seed(0)
        net = build_model(request["model"], task, **request["model_options"])
        if request.get("run"):  # a run directory: the weights of its newest checkpoint (safetensors)
            load_checkpoint(request["run"], net)
    except Exception as err:  # a bad option or a missing file: reported, and raised by run_capped
        meter.fail(err)
        return
    meter.set_baseline()

    def train_step() -> None:  # forward + backward at this length
        batch = task.sample(request["batch_size"], torch.Generator().manual_seed(0))
        logits, _ = net(batch.inputs)
        loss, _, _ = loss_and_accuracy(logits, batch, task.kind)
        loss.backward()

    if request["mode"] == "eval":
        meter.run("eval", lambda: evaluate(net, task, request["batch_size"], request["num_examples"]))
    else:
        meter.run("train", train_step)


def run_capped(request: dict, timeout: float | None = None) -> dict:
    """Run ``capped_job`` in a fresh process (one thread) under ``request["cap_mb"]``; returns the
    worker's record: ``status`` ``"ok"`` or ``"OOM"``, ``baseline_rss_mb``, ``peak_rss_mb``,
    ``delta_rss_mb`` (when measured) and ``accuracy`` and ``loss`` for an evaluation. Any other failure raises."""
    phase = request["mode"]
    record = measure("chronomem.experiments.relevance:capped_job", request, [phase], timeout=timeout,
                     memory_cap_mb=request["cap_mb"], threads=1)[phase]
    if record["status"] not in (OK, OOM):
        raise RuntimeError(f"memory-capped {phase} of {request['model']} failed ({record['status']}): "
                           f"{record.get('error')}")
    return record


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def _train(model: str, task, options: dict, s: RelevanceScale, seed: int, time_budget: float | None,
           progress: bool, out: Path, resume: bool, eval_examples: int | None = None):
    """Train ``model`` on ``task`` in the run directory ``out`` (``resume``: continue the run it holds,
    ``chronomem run --resume``); its final test evaluation reads ``eval_examples`` (default the
    scale's) in batches of the scale's ``eval_batch``, as ``run_capped``'s evaluations do, so that
    the same test set gives the same accuracy in the run's summary line and in the table."""
    import torch

    from chronomem.heads import build_model
    from chronomem.train import train
    from chronomem.train.resume import rejoin

    eval_examples = eval_examples or s.eval_examples
    cfg = s.train_config(seed, time_budget, progress, eval_examples=eval_examples,
                         eval_batch_size=min(s.eval_batch, eval_examples), out=str(out))
    torch.manual_seed(seed)
    net = build_model(model, task, **options)
    spec = {"model": model, "model_options": options, "task": task.name,
            "task_options": {k: v for k, v in task.describe().items() if k != "name"}}
    cfg, run = rejoin(cfg, spec) if resume else (cfg, None)
    result = train(net, task, cfg, spec=spec, resume=run)
    info = {"train_seconds": round(result.seconds, 1), "steps": result.steps,
            "stopped_early": result.stopped_early, "train_T_accuracy": result.metrics["accuracy"],
            "parameters": sum(p.numel() for p in net.parameters())}
    return result.model, info


# --------------------------------------------------------------------------------------------
# transfer-copy
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelRun:
    """Everything one model's runs (training, then its evaluations or its T's) need: the job of ``Jobs.map``."""

    model: str
    options: dict
    scale: RelevanceScale
    seed: int
    time_budget: float | None
    progress: bool
    out: str  # the experiment's directory: each training run gets its own inside
    resume: bool = False  # continue the runs it holds (chronomem run --resume)


def _transfer_model(job: ModelRun) -> tuple[dict, dict, dict, dict]:
    """Train ``job.model`` on Copy at the scale's ``train_T`` and evaluate it at each T in a measured
    process; its row of results, peaks, deltas and run information."""
    from chronomem.tasks.copy import CopyTask

    s, model, options = job.scale, job.model, job.options
    run = Path(job.out) / model
    _, info = _train(model, CopyTask(seq_len=s.train_T), options, s, job.seed, job.time_budget, job.progress,
                     run, job.resume, s.eval.get(s.train_T))
    results: dict[str, Any] = {}
    peaks, deltas = {}, {}
    oom = False
    for T, n in sorted(s.eval.items()):
        key = f"T={T}"
        if oom:  # memory only grows with T
            results[key] = "OOM"
            continue
        start = time.perf_counter()
        answer = run_capped({"mode": "eval", "task": "copy", "task_options": {"seq_len": T},
                             "model": model, "model_options": options, "run": str(run),
                             "cap_mb": s.cap_mb, "batch_size": min(s.eval_batch, n),
                             "num_examples": n})
        if answer["status"] == OOM:
            oom = True
            results[key] = "OOM"
            info["oom_at"] = T
            continue
        results[key] = round(answer["accuracy"], 2)
        peaks[key] = answer["peak_rss_mb"]
        deltas[key] = answer["delta_rss_mb"]
        info.setdefault("eval_seconds", {})[key] = round(time.perf_counter() - start, 1)
        info["baseline_mb"] = answer["baseline_rss_mb"]
    info["run"] = run.name  # the run directory in OUT: the trained model, for a look at what it does
    return results, peaks, deltas, info


def _run_models(scale: str, out: Path, seed: int, models: tuple[str, ...] | None = None,
                time_budget: float | None = None, progress: bool = True, jobs: Jobs = SEQUENTIAL,
                resume: bool = False, *, model_job, scales: dict, name: str, nu: int, memory_note: str) -> dict:
    """An experiment of this module: each of the scale's models (or ``models``) through ``model_job``
    (``_transfer_model`` or ``_denoise_model``: its row of results, peaks, deltas and run information),
    ``jobs.map`` over the models. ``nu`` is the buffer, 15 the relevant set; ``memory_note`` says in
    results.json what the memory columns measure."""
    s = scales[scale]
    configs = {m: model_options(m, s.hidden, nu=nu, rho=15) for m in select_models(s.models, models, name)}
    runs = [ModelRun(model, options, s, seed, time_budget, progress, str(out), resume)
            for model, options in configs.items()]
    results, peaks, deltas, info = {}, {}, {}, {}
    for model, row in zip(configs, jobs.map(model_job, runs), strict=True):
        results[model], peaks[model], deltas[model], info[model] = row
    config = {"scale": asdict(s), "models": configs, "nu": nu, "rho": 15}
    extra = {"peak_memory_mb": peaks, "delta_memory_mb": deltas, "runs": info, "memory_note": memory_note}
    return {"results": results, "config": config, "extra": extra}


TRANSFER = register_experiment(
    Experiment(
        name="transfer-copy",
        description="Transfer Copy: train on Copy at T=100, evaluate at longer T (paper 004 Table 1).",
        run=partial(_run_models, model_job=_transfer_model, scales=TRANSFER_SCALES, name="transfer-copy", nu=10,
                    memory_note="peak resident memory (MB) of the evaluation process, including the interpreter "
                    "and torch (runs[model].baseline_mb), and the peak above that baseline (delta); OOM = the "
                    "peak above the baseline passed cap_mb or could not be allocated"),
        paper=PAPER_TRANSFER,
        metric="accuracy on the 10 copied symbols (%)",
        paper_source="paper 004 Table 1",
        chance=100 / 8,  # each symbol one of 8 (tasks/copy.py)
        # Table 1: RelevanceRNN keeps 99% at every T beyond the training T=100, where the LSTM falls to
        # 64, 48, 19 and 14 (MemRNN's OOM at 5000 is about memory, which extra.delta_memory_mb measures).
        claims=(Claim("RelevanceRNN transfers to longer sequences than it was trained on; the LSTM does not",
                      "relevance-rnn", "lstm", settings=("T=200", "T=400", "T=2000", "T=5000")),),
        notes="Evaluations run in fresh processes measured as `chronomem bench` measures (docs/benchmarks.md); "
              "OOM means the evaluation's peak memory above its baseline passed config cap_mb. "
              "extra.delta_memory_mb shows the growth with T. "
              "Quick scale trains each model 7,000 steps (the paper trains far longer).",
        scales=("smoke", "tour", "quick", "paper"),
    )
)


# --------------------------------------------------------------------------------------------
# denoise
# --------------------------------------------------------------------------------------------


def _denoise_model(job: ModelRun) -> tuple[dict, dict, dict, dict]:
    """``job.model`` at each of the scale's T: one training step probed in a measured process, then
    trained and evaluated (from the first T whose step does not fit on: ``"OOM"``)."""
    from chronomem.tasks.denoise import DenoiseTask

    s, model, options = job.scale, job.model, job.options
    results: dict[str, Any] = {}
    peaks, deltas, info = {}, {}, {}
    oom = False
    for T in s.T:
        key = f"T={T}"
        probe = None if oom else run_capped(
            {"mode": "train", "task": "denoise", "task_options": {"seq_len": T}, "model": model,
             "model_options": options, "run": None, "cap_mb": s.cap_mb, "batch_size": s.batch_size})
        if oom or probe["status"] == OOM:
            oom = True
            results[key] = "OOM"
            continue
        peaks[key] = probe["peak_rss_mb"]
        deltas[key] = probe["delta_rss_mb"]
        _, row = _train(model, DenoiseTask(seq_len=T), options, s, job.seed, job.time_budget, job.progress,
                        Path(job.out) / model / key, job.resume)
        results[key] = round(row.pop("train_T_accuracy"), 2)
        info[key] = row
    return results, peaks, deltas, info


DENOISE = register_experiment(
    Experiment(
        name="denoise",
        description="Denoise: copy 10 symbols scattered among T steps, trained and evaluated at each T "
                    "(paper 004 Table 2).",
        run=partial(_run_models, model_job=_denoise_model, scales=DENOISE_SCALES, name="denoise", nu=15,
                    memory_note="peak resident memory (MB) of one training step (forward + backward) at each T "
                    "in a fresh process, and the peak above its baseline (delta); OOM = the peak above the "
                    "baseline passed cap_mb or could not be allocated"),
        paper=PAPER_DENOISE,
        metric="accuracy on the 10 output symbols (%)",
        paper_source="paper 004 Table 2",
        chance=100 / 8,  # each symbol one of 8 (tasks/denoise.py)
        # Table 2: RelevanceRNN 99-100% at every T, the LSTM 82% at T=100 falling to 15% at T=2000.
        claims=(Claim("RelevanceRNN denoises better than the LSTM", "relevance-rnn", "lstm"),),
        notes="Quick scale runs T = 100 and 200 only, 2,500 training steps per model and T. "
              "One training step per T is probed first in a fresh process measured as `chronomem bench` "
              "measures (OOM: peak above the baseline past config cap_mb).",
    )
)
