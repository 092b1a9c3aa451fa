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

from chronomem.train import distributed, progress
from chronomem.train.checkpoint import find_checkpoint, load_checkpoint, rewind, save_checkpoint, save_config
from chronomem.train.metrics import MetricsLogger, loss_and_accuracy

OPTIMIZERS = ("adamw", "rmsprop")
SCHEDULES = ("constant", "linear", "cosine", "rsqrt")
ANNEAL_BY = ("steps", "budget")


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    optimizer: str = "adamw"
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    momentum: float = 0.0  # RMSprop only
    warmup: int = 0
    schedule: str = "constant"
    clip: float | None = 1.0
    eval_every: int = 0  # 0: evaluate only at the end
    eval_examples: int = 512
    eval_batch_size: int | None = None
    log_every: int = 10
    checkpoint_every: int = 0  # 0: only the final checkpoint (when out is set)
    seed: int = 0
    out: str | None = None
    time_budget: float | None = None  # seconds of training; stops early (and says so) when exceeded
    # What a decaying schedule counts down: "steps" (to ``steps``), or "budget": whichever of the step
    # count and the fraction of ``time_budget`` spent is further along, so that a run cut by its
    # wall-clock budget also ends at lr 0 (budgeted training, as in Li et al. 2020, "Budgeted training").
    anneal_by: str = "steps"
    progress: bool = True
    device: str | None = None

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
        if self.anneal_by not in ANNEAL_BY:
            raise ValueError(f"--anneal-by must be one of {ANNEAL_BY}, got {self.anneal_by!r}")
        if self.anneal_by == "budget" and self.time_budget is None:
            raise ValueError("--anneal-by budget needs a time budget (time_budget seconds), got None")
        if self.time_budget is not None and not (self.time_budget > 0 and math.isfinite(self.time_budget)):
            raise ValueError(f"--time-budget must be a positive number of seconds, got {self.time_budget}")
        if self.clip is not None and self.clip <= 0:
            raise ValueError(f"--clip must be > 0 (or None to disable), got {self.clip}")


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
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    return torch.optim.RMSprop(params, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay, momentum=cfg.momentum)


def make_scheduler(
    optimizer: torch.optim.Optimizer, cfg: TrainConfig, budget_spent: Callable[[], float] | None = None
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over ``warmup`` steps, then constant, linear decay or cosine decay to zero, or
    ``"rsqrt"``: ``lr * sqrt(warmup / step)``, the inverse square root decay of Long Range Arena's
    trainer (``constant * linear_warmup * rsqrt_decay``, with ``lr`` its peak, reached at ``warmup``).

    With ``cfg.anneal_by == "budget"``, ``budget_spent()`` (the fraction of ``cfg.time_budget`` used
    so far) advances the decay when it is ahead of the step count.
    """

    def factor(step: int) -> float:
        if cfg.warmup and step < cfg.warmup:
            return (step + 1) / cfg.warmup
        if cfg.schedule == "constant":
            return 1.0
        if cfg.schedule == "rsqrt":  # never reaches zero, so neither the step count nor a budget moves it
            return math.sqrt(max(1, cfg.warmup) / max(1, cfg.warmup, step))
        progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        if cfg.anneal_by == "budget" and budget_spent is not None:
            progress = max(progress, budget_spent())
        progress = min(1.0, progress)
        if cfg.schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def batch_generator(seed: int, rank: int, step: int) -> torch.Generator:
    """The generator of one step's batch: a pure function of (seed, rank, step), so resume is exact."""
    return torch.Generator().manual_seed((seed * 1_000_003 + rank) * 1_000_003 + step)


@torch.no_grad()
def evaluate(
    model: nn.Module, task, batch_size: int = 64, num_examples: int = 512, split: str = "test", device=None
) -> dict[str, float]:
    """Mean loss and accuracy (%) over the task's fixed ``split`` set."""
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    total_loss, correct, count, batches = 0.0, 0, 0, 0
    for batch in task.eval_batches(batch_size, num_examples, split=split):
        batch = batch.to(device)
        logits, _ = model(batch.inputs, mask=batch.mask)
        loss, c, n = loss_and_accuracy(logits, batch, task.kind)
        total_loss, correct, count, batches = total_loss + float(loss), correct + int(c), count + int(n), batches + 1
    model.train(was_training)
    return {"loss": total_loss / max(1, batches), "accuracy": 100.0 * correct / max(1, count)}


def train(
    model: nn.Module,
    task,
    cfg: TrainConfig,
    *,
    spec: dict[str, Any] | None = None,
    resume: str | Path | None = None,
) -> TrainResult:
    """Train ``model`` on ``task``. ``spec`` (JSON-able model/task description) goes into config.json.

    With ``cfg.out`` set, checkpoints go to ``cfg.out/checkpoints`` (atomically); ``resume`` (a run
    directory or a checkpoint directory) restores weights, optimizer, scheduler, RNG and step. The run
    then continues in ``cfg.out`` as if never interrupted: checkpoints after the resumed step are set
    aside (``checkpoint.rewind``) and metrics.csv drops the rows logged after it, so no step is
    logged twice and its ``seconds`` column continues from the checkpoint's training time. Without
    ``resume``, metrics.csv in ``cfg.out`` is started anew.
    """
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
    scheduler = make_scheduler(optimizer, cfg, lambda: trained / cfg.time_budget)
    run_dir = Path(cfg.out) if cfg.out else None
    start_step = 0
    saved_step = None  # the step of run_dir's newest checkpoint of this run, if any
    if resume is not None:
        checkpoint = find_checkpoint(Path(resume))
        state = load_checkpoint(checkpoint, model, map_location=device)
        start_step = int(state["step"])
        if start_step > cfg.steps:
            raise ValueError(f"--steps {cfg.steps} is below the step of the checkpoint resumed, {start_step} "
                             f"({checkpoint}); --steps is the run's new total")
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"]["torch"])
        seconds_before = trained = float(state.get("seconds", 0.0))  # absent in older checkpoints
        if run_dir is not None and checkpoint.parent.resolve() == (run_dir / "checkpoints").resolve():
            saved_step = start_step
    logger = MetricsLogger(run_dir, enabled=ctx.is_main)
    if run_dir is not None and ctx.is_main:
        if resume is not None:
            rewind(run_dir, start_step)
        logger.rewind(start_step)  # a new run (step 0) starts the file anew
        save_config(run_dir, {"spec": spec or {}, "train": dataclasses.asdict(cfg)})
    ddp_model = model
    if ctx.distributed:
        # find_unused_parameters: a memory read can skip parameters (e.g. HTM before its first chunk).
        ddp_model = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)

    history: list[dict[str, Any]] = []
    eval_bs = cfg.eval_batch_size or cfg.batch_size
    show, prefix = progress.wanted(cfg.progress)
    model_name = (spec or {}).get("model", type(model).__name__)
    label = f"{model_name} on {getattr(task, 'name', type(task).__name__)}, seed {cfg.seed}"
    reporter = progress.Progress(cfg.steps, start_step, f"{prefix}: {label}" if prefix else label,
                                 show and ctx.is_main, cfg.time_budget, seconds_before)
    t0 = time.perf_counter()
    window_tokens, window_start = 0, time.perf_counter()
    window_steps, run_loss, run_correct, run_count, run_auxiliary = 0, 0.0, 0.0, 0.0, 0.0
    stopped_early = False
    step = start_step
    model.train()
    while step < cfg.steps:
        batch = task.sample(cfg.batch_size, batch_generator(cfg.seed, ctx.rank, step)).to(device)
        logits, _ = ddp_model(batch.inputs, mask=batch.mask)
        loss, correct, count = loss_and_accuracy(logits, batch, task.kind)
        auxiliary = getattr(model, "auxiliary_loss", None)  # e.g. the heads' input reconstruction
        optimizer.zero_grad(set_to_none=True)
        (loss if auxiliary is None else loss + auxiliary).backward()
        if cfg.clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        optimizer.step()
        trained = seconds_before + time.perf_counter() - t0
        if cfg.time_budget is not None and ctx.distributed:
            trained = float(distributed.all_reduce_mean(torch.tensor([trained], device=device), ctx)[0])
        scheduler.step()
        step += 1
        run_loss, run_correct, run_count = run_loss + loss.item(), run_correct + int(correct), run_count + int(count)
        run_auxiliary += 0.0 if auxiliary is None else auxiliary.item()
        window_tokens += batch.num_tokens * ctx.world_size
        window_steps += 1
        logged = None
        if step % cfg.log_every == 0 or step == cfg.steps:
            stats = distributed.all_reduce_mean(torch.tensor(
                [run_loss / window_steps, 100.0 * run_correct / max(1.0, run_count), run_auxiliary / window_steps],
                device=device,  # NCCL reduces only tensors on the GPU
            ), ctx).cpu()
            elapsed = time.perf_counter() - window_start
            row = {
                "step": step, "split": "train", "loss": round(float(stats[0]), 5),
                "accuracy": round(float(stats[1]), 3), "lr": scheduler.get_last_lr()[0],
                "tokens_per_second": round(window_tokens / max(elapsed, 1e-9)),
                "seconds": round(trained, 2),  # training seconds since the run began, across resumes
            }
            if auxiliary is not None:  # the weighted auxiliary loss, logged apart from the task loss
                row["auxiliary_loss"] = round(float(stats[2]), 5)
            history.append(row)
            logger.log(row)
            logged = row
            window_steps, run_loss, run_correct, run_count, run_auxiliary = 0, 0.0, 0.0, 0.0, 0.0
            window_tokens, window_start = 0, time.perf_counter()
        reporter.update(step, *((logged["loss"], logged["accuracy"]) if logged else ()))
        if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps and ctx.is_main:
            row = {"step": step, "split": "val", **evaluate(model, task, eval_bs, cfg.eval_examples, "val")}
            history.append(row)
            logger.log(row)
        if run_dir is not None and ctx.is_main and cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
            save_checkpoint(run_dir, step, model, _trainer_state(step, optimizer, scheduler, trained))
            saved_step = step
        if cfg.time_budget is not None and trained > cfg.time_budget and step < cfg.steps:
            stopped_early = True
            break
    seconds = seconds_before + time.perf_counter() - t0
    if run_dir is not None and ctx.is_main and saved_step != step:
        save_checkpoint(run_dir, step, model, _trainer_state(step, optimizer, scheduler, trained))
    metrics = evaluate(model, task, eval_bs, cfg.eval_examples, "test") if ctx.is_main else {}
    if ctx.is_main:
        row = {"step": step, "split": "test", **metrics, "seconds": round(seconds, 2)}
        history.append(row)
        logger.log(row)
    reporter.close(step, seconds, metrics, stopped_early)
    logger.close()
    distributed.cleanup(ctx)
    return TrainResult(model, metrics, step, seconds, history, stopped_early)


def _trainer_state(step: int, optimizer, scheduler, seconds: float) -> dict[str, Any]:
    return {
        "step": step,
        "seconds": seconds,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": {"torch": torch.get_rng_state()},
    }


def build(spec: dict[str, Any]):
    """``(model, task)`` from a JSON-able spec: ``{"model", "model_options", "task", "task_options"}``."""
    from chronomem.heads import build_model
    from chronomem.registry import get_task

    task = get_task(spec["task"])(**spec.get("task_options", {}))
    model = build_model(spec["model"], task, **spec.get("model_options", {}))
    return model, task


def train_spec(spec: dict[str, Any], cfg: TrainConfig, resume: str | Path | None = None) -> TrainResult:
    """Build from ``spec`` with the seed of ``cfg`` and train; the entry point of ``chronomem train``."""
    torch.manual_seed(cfg.seed)
    model, task = build(spec)
    return train(model, task, cfg, spec=spec, resume=resume)
