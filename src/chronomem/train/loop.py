"""The supervised trainer: one loop for every model and task in chronomem.

Determinism: the batch of step ``s`` is drawn from a generator seeded by ``(seed, rank, s)``, and the
optimizer, scheduler and RNG states are checkpointed, so a run stopped after N steps and resumed
reaches the same weights as an uninterrupted run (on CPU, to float rounding).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from chronomem.config import COMPILE_MODES, setting
from chronomem.progress import Progress, duration
from chronomem.train import distributed
from chronomem.train.checkpoint import CheckpointError, load_config, load_weights, locate_run, save_checkpoint
from chronomem.train.compile import compiled
from chronomem.train.metrics import MetricsLogger, loss_and_accuracy
from chronomem.train.resume import Run, check_new_run, continue_run_dir, restore, restore_optimizer, rng_state

OPTIMIZERS = ("adamw", "rmsprop")
SCHEDULES = ("constant", "linear", "cosine", "rsqrt")
ANNEAL_BY = ("steps", "budget")


@dataclass
class TrainConfig:
    """The trainer's settings; each field is a ``chronomem train`` flag (``chronomem.config.setting``)."""

    steps: int = setting(1000, "training steps; with --resume the new total, to extend a run", resumable=True)
    batch_size: int = setting(32, "sequences per step (per process)")
    lr: float = setting(1e-3, "peak learning rate")
    optimizer: str = setting("adamw", "optimizer", choices=OPTIMIZERS)
    weight_decay: float = setting(0.0, "weight decay (AdamW: decoupled)")
    betas: tuple[float, float] = setting((0.9, 0.999), "AdamW's betas")
    eps: float = setting(1e-8, "the optimizer's epsilon")
    momentum: float = setting(0.0, "RMSprop's momentum")
    warmup: int = setting(0, "linear warmup steps")
    schedule: str = setting("constant", "learning-rate decay after the warmup (rsqrt: lr * sqrt(warmup / step))",
                            choices=SCHEDULES)
    clip: float | None = setting(1.0, "gradient-norm clip; None (on the command line 0) disables it",
                                 zero_is_none="no clipping")
    eval_every: int = setting(0, "steps between validations (0: only the final test)", resumable=True)
    eval_examples: int = setting(512, "examples of each evaluation", resumable=True)
    eval_batch_size: int | None = setting(None, "batch size of evaluations (default: the batch size)",
                                          resumable=True)
    log_every: int = setting(10, "steps between logged training rows", resumable=True)
    checkpoint_every: int = setting(0, "steps between checkpoints (0: only the final one)", resumable=True)
    seed: int = setting(0, "seed of the weights and of every batch")
    out: str | None = setting(None, "run directory (config.json, metrics.csv, checkpoints)")
    time_budget: float | None = setting(
        None, "seconds of training after which the run stops (counted across --resume)", resumable=True)
    # What a decaying schedule counts down: "steps" (to ``steps``), or "budget": whichever of the step
    # count and the fraction of ``time_budget`` spent is further along, so that a run cut by its
    # wall-clock budget also ends at lr 0 (budgeted training, as in Li et al. 2020, "Budgeted training").
    anneal_by: str = setting("steps", "decay the schedule over the steps, or over the time budget when that "
                             "runs out first", choices=ANNEAL_BY)
    progress: bool = setting(True, "show a progress bar or lines on stderr", resumable=True, aliases=("--quiet",))
    device: str | None = setting(None, "cpu, cuda, cuda:1 ... (default: cuda if available)", resumable=True)
    compile: bool = setting(False, "torch.compile the model for the training steps (a GPU's speed-up); the same "
                            "numbers as without it, to float tolerance", resumable=True)
    compile_mode: str = setting("default", "torch.compile's mode with --compile: 'default', 'reduce-overhead' "
                                "(CUDA graphs) or 'max-autotune'", resumable=True, choices=COMPILE_MODES)
    compile_backend: str = setting("inductor", "torch.compile's backend with --compile ('aot_eager': traced and "
                                   "differentiated without generated code, as the CPU tests)", resumable=True)
    compile_cpp_wrapper: bool = setting(False, "with --compile and inductor: the code that calls each graph's "
                                        "kernels in C++, not Python (fewer microseconds per call: an acting "
                                        "step; longer compiles)", resumable=True)

    def __post_init__(self):
        self.betas = tuple(self.betas)
        for name in ("steps", "batch_size", "eval_examples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        for name in ("warmup", "eval_every", "checkpoint_every", "log_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"--lr must be a positive number, got {self.lr}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"--optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"--schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"--compile-mode must be one of {COMPILE_MODES}, got {self.compile_mode!r}")
        if self.anneal_by not in ANNEAL_BY:
            raise ValueError(f"--anneal-by must be one of {ANNEAL_BY}, got {self.anneal_by!r}")
        if self.anneal_by == "budget" and self.time_budget is None:
            raise ValueError("--anneal-by budget needs a time budget (time_budget seconds), got None")
        if self.time_budget is not None and not (self.time_budget > 0 and math.isfinite(self.time_budget)):
            raise ValueError(f"--time-budget must be a positive number of seconds, got {self.time_budget}")
        if self.clip is not None and self.clip <= 0:
            raise ValueError(f"--clip must be > 0 (or None to disable), got {self.clip}")


@dataclass
class ModelSize:
    """The size of the model ``chronomem train`` builds: ``build_model``'s keywords of these names (and
    defaults), saved with the other model options in the spec's ``model_options``."""

    dim: int = setting(64, "width")
    depth: int = setting(2, "layers")
    num_heads: int = setting(4, "attention heads", flag="--heads")

    def __post_init__(self):
        if self.dim < 1 or self.depth < 1 or self.num_heads < 1:
            raise ValueError(f"--dim, --depth and --heads must be >= 1, got {self.dim}, {self.depth}, "
                             f"{self.num_heads}")
        if self.dim % self.num_heads:
            raise ValueError(f"--heads={self.num_heads} must divide --dim={self.dim}")


@dataclass
class TrainResult:
    model: nn.Module
    metrics: dict[str, float]  # final evaluation on the test split
    steps: int
    seconds: float  # training seconds, those before a resume included
    history: list[dict[str, Any]] = field(default_factory=list)
    stopped_early: bool = False


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    # foreach: one kernel per step for all parameters, the same numbers as the per-tensor loop torch
    # picks on a CPU, without its per-parameter overhead
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                                 foreach=True)
    return torch.optim.RMSprop(params, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay, momentum=cfg.momentum,
                               foreach=True)


def make_scheduler(
    optimizer: torch.optim.Optimizer, cfg: TrainConfig, budget_spent: Callable[[], float] | None = None,
    anchor: tuple[int, float] | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over ``warmup`` steps, then constant, linear decay or cosine decay to zero, or
    ``"rsqrt"``: ``lr * sqrt(warmup / step)``, the inverse square root decay of Long Range Arena's
    trainer (``constant * linear_warmup * rsqrt_decay``, with ``lr`` its peak, reached at ``warmup``).

    A decay runs along ``decay_progress`` from ``anchor`` (default: progress 0 at the end of the
    warmup) to progress 1 at ``cfg.steps``. With ``cfg.anneal_by == "budget"``, ``budget_spent()``
    (the fraction of ``cfg.time_budget`` used so far) advances the decay when it is ahead of the steps.
    """
    anchor = (cfg.warmup, 0.0) if anchor is None else anchor

    def factor(step: int) -> float:
        if cfg.warmup and step < cfg.warmup:
            return (step + 1) / cfg.warmup
        if cfg.schedule == "constant":
            return 1.0
        if cfg.schedule == "rsqrt":  # never reaches zero, so neither the step count nor a budget moves it
            return math.sqrt(max(1, cfg.warmup) / max(1, cfg.warmup, step))
        progress = decay_progress(step, cfg.steps, anchor)
        if cfg.anneal_by == "budget" and budget_spent is not None:
            progress = max(progress, budget_spent())
        progress = min(1.0, progress)
        if cfg.schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def decay_progress(step: int, total: int, anchor: tuple[int, float]) -> float:
    """How far a decaying schedule is at ``step`` (0: the peak lr, 1: lr 0), going in a straight line
    from ``anchor = (step_a, progress_a)`` to 1 at ``total``. A run starts with ``(warmup, 0)``; a
    run resumed at step s with a new total continues from ``(s, its progress at s)``, so the lr does
    not jump at the resume and the decay left is spread over the new total."""
    start, done = anchor
    return done + (1.0 - done) * (step - start) / max(1, total - start)


def resumed_anchor(cfg: TrainConfig, step: int, saved_total: int, anchor: tuple[int, float]) -> tuple[int, float]:
    """The schedule's anchor of a run resumed at ``step`` with ``cfg.steps`` as its new total, when its
    checkpoint was decaying towards ``saved_total`` along ``anchor``. A run whose decay had already
    reached lr 0 cannot be extended (every new step would train at lr 0): ValueError."""
    if cfg.steps == saved_total or step <= anchor[0] or cfg.schedule not in ("linear", "cosine"):
        return anchor  # the same total, the warmup not over, or a schedule that ignores the total
    done = min(1.0, decay_progress(step, saved_total, anchor))
    if done >= 1.0:
        raise ValueError(f"steps {cfg.steps}: the run's {cfg.schedule} schedule reached lr 0 at step {step}, so the "
                         "steps added would train at lr 0; start a new run (a constant or rsqrt schedule can be "
                         "extended)")
    return step, done


def loss_terms(task_loss: torch.Tensor, auxiliary_loss: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The terms a training step minimises (their sum), each logged under its name: the task's
    ``loss`` and, when the model returned one, its ``auxiliary_loss`` (the heads' weighted input
    reconstruction, ``chronomem.heads.reconstruction_loss``)."""
    terms = {"loss": task_loss}
    if auxiliary_loss is not None:
        terms["auxiliary_loss"] = auxiliary_loss
    return terms


def batch_generator(seed: int, rank: int, step: int) -> torch.Generator:
    """The generator of one step's batch: a pure function of (seed, rank, step), so resume is exact."""
    return torch.Generator().manual_seed((seed * 1_000_003 + rank) * 1_000_003 + step)


@torch.no_grad()
def evaluate(
    model: nn.Module, task, batch_size: int = 64, num_examples: int = 512, split: str = "test", device=None,
    progress: bool = True,
) -> dict[str, float]:
    """Mean loss and accuracy (%) over the task's fixed ``split`` set. An evaluation that takes
    ``LINE_INTERVAL`` seconds or more shows its progress (``progress=False`` keeps it silent)."""
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    label = f"evaluating on the {split} split of {getattr(task, 'name', type(task).__name__)}"
    reporter = Progress(num_examples, label, progress, unit="example")
    total_loss, correct, count, batches, seen = 0.0, 0, 0, 0, 0
    for batch in task.eval_batches(batch_size, num_examples, split=split):
        batch = batch.to(device)
        logits, _ = model(batch.inputs, mask=batch.mask)
        loss, c, n = loss_and_accuracy(logits, batch, task.kind)
        total_loss, correct, count, batches = total_loss + float(loss), correct + int(c), count + int(n), batches + 1
        seen += batch.inputs.shape[0]
        reporter.update(seen)
    reporter.close(only_if_long=True)
    model.train(was_training)
    return {"loss": total_loss / max(1, batches), "accuracy": 100.0 * correct / max(1, count)}


def train(
    model: nn.Module,
    task,
    cfg: TrainConfig,
    *,
    spec: dict[str, Any] | None = None,
    resume: str | Path | Run | None = None,
) -> TrainResult:
    """Train ``model`` on ``task``. ``spec`` (JSON-able model/task description) goes into config.json.

    With ``cfg.out`` set, checkpoints go to ``cfg.out/checkpoints`` (atomically); ``resume`` (a run
    directory, a checkpoint directory, or the ``Run`` that ``chronomem.train.resume.find_run`` found)
    restores weights, optimizer, scheduler, RNG and step (a run directory killed before its first
    checkpoint starts again from step 0). The run
    then continues in ``cfg.out`` as if never interrupted: checkpoints after the resumed step are set
    aside (``checkpoint.rewind``) and metrics.csv drops the rows logged after it, so no step is
    logged twice and its ``seconds`` column continues from the checkpoint's training time. Without
    ``resume``, ``cfg.out`` must not hold a run yet (``check_new_run``: ValueError).
    """
    run_dir = Path(cfg.out) if cfg.out else None
    check_new_run(run_dir, resume)
    device = distributed.default_device(cfg.device)
    ctx = distributed.setup(device)
    torch.manual_seed(cfg.seed)
    model = model.to(device)
    optimizer = make_optimizer(model, cfg)
    # ``trained``: training seconds up to the current step, those of earlier calls (restored on resume)
    # plus this call's. The time budget counts them all, so a resumed run keeps its budget and its
    # budget-annealed schedule. Read once per step, averaged over ranks, so that every rank anneals
    # alike and stops at the same step.
    seconds_before = trained = 0.0
    anchor = (cfg.warmup, 0.0)  # where the schedule's decay starts (decay_progress)
    start_step = 0
    saved_step = None  # the step of run_dir's newest checkpoint of this run, if any
    restored = restore(resume, model, map_location=device)
    if restored is not None:
        start_step, checkpoint = restored.step, restored.checkpoint
        if start_step > cfg.steps:
            raise ValueError(f"--steps {cfg.steps} is below the step of the checkpoint resumed, {start_step} "
                             f"({checkpoint}); --steps is the run's new total")
        saved_total = int(restored.state.get("total_steps") or _saved_steps(checkpoint, cfg.steps))
        anchor = resumed_anchor(cfg, start_step, saved_total, tuple(restored.state.get("schedule_anchor", anchor)))
    scheduler = make_scheduler(optimizer, cfg, lambda: trained / cfg.time_budget, anchor)
    if restored is not None:
        restore_optimizer(restored, optimizer, scheduler)
        seconds_before = trained = restored.seconds
        if run_dir is not None and checkpoint.parent.resolve() == (run_dir / "checkpoints").resolve():
            saved_step = start_step
    logger = MetricsLogger(run_dir, enabled=ctx.is_main)
    if run_dir is not None and ctx.is_main:
        continue_run_dir(run_dir, logger, restored, {"spec": spec or {}, "train": dataclasses.asdict(cfg)})
    ddp_model = model
    if ctx.distributed:
        # find_unused_parameters: a memory read can skip parameters (e.g. HTM before its first chunk).
        ddp_model = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    # the training steps run compiled (batches of many lengths: torch decides what is dynamic); the
    # evaluations call the model itself
    ddp_model = compiled(ddp_model, cfg.compile, cfg.compile_mode, cfg.compile_backend,
                         cpp_wrapper=cfg.compile_cpp_wrapper)

    history: list[dict[str, Any]] = [] if restored is None else restored.logged()  # the run's, resumed
    eval_bs = cfg.eval_batch_size or cfg.batch_size
    show = cfg.progress and ctx.is_main  # one line per run: the first rank's
    model_name = (spec or {}).get("model", type(model).__name__)
    label = f"{model_name} on {getattr(task, 'name', type(task).__name__)}, seed {cfg.seed}"
    reporter = Progress(cfg.steps, label, show, initial=start_step, time_budget=cfg.time_budget,
                        seconds_before=seconds_before)
    t0 = time.perf_counter()
    window_tokens, window_start = 0, time.perf_counter()
    window_steps, run_terms, run_correct, run_count = 0, {}, 0.0, 0.0
    stopped_early = False
    step = start_step
    model.train()
    asks_auxiliary = bool(getattr(model, "reconstruction", 0.0))  # a head built with reconstruction=w
    while step < cfg.steps:
        # Checked before the step, so a run resumed with its budget spent (one the budget ended) takes none.
        if cfg.time_budget is not None and trained > cfg.time_budget:
            stopped_early = True
            break
        batch = task.sample(cfg.batch_size, batch_generator(cfg.seed, ctx.rank, step)).to(device)
        if asks_auxiliary:
            logits, _, auxiliary = ddp_model(batch.inputs, mask=batch.mask, return_auxiliary=True)
        else:
            logits, _ = ddp_model(batch.inputs, mask=batch.mask)
            auxiliary = None
        loss, correct, count = loss_and_accuracy(logits, batch, task.kind)
        terms = loss_terms(loss, auxiliary)
        optimizer.zero_grad(set_to_none=True)
        sum(terms.values()).backward()
        if cfg.clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        optimizer.step()
        trained = seconds_before + time.perf_counter() - t0
        if cfg.time_budget is not None and ctx.distributed:
            trained = float(distributed.all_reduce_mean(torch.tensor([trained], device=device), ctx)[0])
        scheduler.step()
        step += 1
        for name, value in terms.items():
            run_terms[name] = run_terms.get(name, 0.0) + value.item()
        run_correct, run_count = run_correct + int(correct), run_count + int(count)
        window_tokens += batch.num_tokens * ctx.world_size
        window_steps += 1
        logged = None
        if step % cfg.log_every == 0 or step == cfg.steps:
            # Every rank produces the same terms (one model), so their means reduce in one tensor.
            means = [total / window_steps for total in run_terms.values()]
            stats = distributed.all_reduce_mean(torch.tensor(
                [*means, 100.0 * run_correct / max(1.0, run_count)],
                device=device,  # NCCL reduces only tensors on the GPU
            ), ctx).cpu().tolist()
            elapsed = time.perf_counter() - window_start
            row = {
                "step": step, "split": "train",
                **{name: round(mean, 5) for name, mean in zip(run_terms, stats[:-1], strict=True)},
                "accuracy": round(stats[-1], 3), "lr": scheduler.get_last_lr()[0],
                "tokens_per_second": round(window_tokens / max(elapsed, 1e-9)),
                "seconds": round(trained, 2),  # training seconds since the run began, across resumes
            }
            history.append(row)
            logger.log(row)
            logged = row
            window_steps, run_terms, run_correct, run_count = 0, {}, 0.0, 0.0
            window_tokens, window_start = 0, time.perf_counter()
        reporter.update(step, logged and {"loss": f"{logged['loss']:.4g}", "accuracy": f"{logged['accuracy']:.1f}%"})
        if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps and ctx.is_main:
            validation = evaluate(model, task, eval_bs, cfg.eval_examples, "val", progress=show)
            row = {"step": step, "split": "val", **validation}
            history.append(row)
            logger.log(row)
        if run_dir is not None and ctx.is_main and cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
            save_checkpoint(run_dir, step, model, _trainer_state(step, optimizer, scheduler, trained, cfg, anchor))
            saved_step = step
    seconds = seconds_before + time.perf_counter() - t0
    if run_dir is not None and ctx.is_main and saved_step != step:
        save_checkpoint(run_dir, step, model, _trainer_state(step, optimizer, scheduler, trained, cfg, anchor))
    metrics = evaluate(model, task, eval_bs, cfg.eval_examples, "test", progress=show) if ctx.is_main else {}
    if ctx.is_main:
        row = {"step": step, "split": "test", **metrics, "seconds": round(seconds, 2)}
        history.append(row)
        logger.log(row)
    tests = ", ".join(f"test {k} {v:.4g}" if k == "loss" else f"test {k} {v:.1f}%" for k, v in metrics.items())
    reporter.close(f"{step} steps in {duration(seconds)}{' (time budget reached)' if stopped_early else ''}"
                   + (f": {tests}" if tests else ""))
    logger.close()
    distributed.cleanup(ctx)
    return TrainResult(model, metrics, step, seconds, history, stopped_early)


def _saved_steps(checkpoint: Path, default: int) -> int:
    """The total steps of the run a checkpoint written before ``total_steps`` was saved belongs to: its
    ``config.json``'s (``default`` for a checkpoint outside a run directory)."""
    try:
        return int(load_config(checkpoint.parent.parent)["train"]["steps"])
    except (CheckpointError, KeyError, TypeError):
        return default


def _trainer_state(step: int, optimizer, scheduler, seconds: float, cfg: TrainConfig,
                   anchor: tuple[int, float]) -> dict[str, Any]:
    return {
        "step": step,
        "seconds": seconds,
        "total_steps": cfg.steps,  # with the anchor: the decay this run follows (resumed_anchor)
        "schedule_anchor": list(anchor),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng_state(),
    }


def build(spec: dict[str, Any], progress: bool = True):
    """``(model, task)`` from a JSON-able spec: ``{"model", "model_options", "task", "task_options"}``.
    A task that reports its own long steps (ListOps generates its data at the first batch) is told
    ``progress``; it is not a task option, so it stays out of the spec and config.json."""
    import inspect

    from chronomem.heads import build_model
    from chronomem.registry import get_task

    make_task, options = get_task(spec["task"]), dict(spec.get("task_options", {}))
    if "progress" in inspect.signature(make_task).parameters:
        options["progress"] = progress
    task = make_task(**options)
    model = build_model(spec["model"], task, **spec.get("model_options", {}))
    return model, task


def train_spec(spec: dict[str, Any], cfg: TrainConfig, resume: str | Path | Run | None = None) -> TrainResult:
    """Build from ``spec`` with the seed of ``cfg`` and train; the entry point of ``chronomem train``."""
    torch.manual_seed(cfg.seed)
    model, task = build(spec, progress=cfg.progress)
    return train(model, task, cfg, spec=spec, resume=resume)


def load_run(path: str | Path, device: str | torch.device | None = None) -> tuple[nn.Module, Any, dict[str, Any]]:
    """``(model, task, spec)`` of a trained run, the model in eval mode on ``device`` (default: cuda if
    available). ``path`` is a run directory (its newest checkpoint is loaded) or one of its
    checkpoints, ``RUN/checkpoints/step_N``. The model and task are rebuilt from the spec in
    ``RUN/config.json``; the weights are read with safetensors (never unpickled).

    Evaluating the model on the task (``evaluate``, with the run's ``eval_examples`` and batch size)
    gives the run's final test metrics."""
    run_dir, checkpoint = locate_run(Path(path))
    spec = load_config(run_dir).get("spec") or {}
    if "model" not in spec or "task" not in spec:
        raise CheckpointError(f"{run_dir / 'config.json'} names no model and task (trained by train() without "
                              "spec=...): build the model yourself and load its weights with load_checkpoint")
    if checkpoint is None:
        raise CheckpointError(f"no checkpoint in {run_dir}: expected {run_dir / 'checkpoints' / 'step_N'}")
    model, task = build(spec)
    load_weights(checkpoint, model)
    return model.to(distributed.default_device(device)).eval(), task, spec
