"""babyai and babyai-multi (paper 003 Sec. 4.2, Fig. 3): behaviour cloning, Transformer vs Transformer + TLB.

Both models are an ``InstructedPolicy`` (``chronomem.agents``) around a causal core of the same width
and the same number of self-attention layers: the Transformer with the instruction token before the
sequence of states, TLB (one ``[1 x self, 1 x cross]`` group per layer) with it at the start of every
chunk. They are trained by the supervised trainer (``chronomem.train``) on the BabyAI bot's demos
(``chronomem.tasks.babyai``: cached on disk, reused by the next run) to predict the bot's action at
every step. Every ``eval_every`` steps the model acts: it plays ``episodes`` fresh episodes of each
level (seeds apart from the demos'), one step at a time with its state carried, taking the most likely
action; the success rate is the share of episodes that reach the goal within the level's step limit.
The curve is success rate against training steps (and demos seen = steps x batch size), mean and
spread over the seeds.

The paper's claim (Fig. 3): "Transformer and Transformer + TLB achieve almost similar performance at
convergence. However, Transformer + TLB is much more sample efficient, converging much faster" (single
task, BossLevel), and in the multi-task setting TLB "converges faster and also outperforms the
Transformer". The paper gives its curves as a figure only: there are no numbers to copy.

``quick`` (one level) uses GoToSeq, not BossLevel: docs/babyai.md says why and how it was sized.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from chronomem.experiments.base import Experiment, Scale, select_models
from chronomem.experiments.jobs import SEQUENTIAL, Jobs
from chronomem.registry import register_experiment
from chronomem.report import Claim
from chronomem.tasks.babyai import LEVELS, MULTI_TASK

MODELS = ("transformer", "tlb")  # the paper's two models
EVAL_SEED = 1_000_000_000  # evaluation episodes are seeded apart from every demo
CLAIM = ("Paper 003 (Sec. 4.2, Fig. 3): Transformer + TLB converges faster than the Transformer (sample "
         "efficiency) and is about equal at convergence on BossLevel; in the multi-task setting it converges "
         "faster and ends higher.")


@dataclass(frozen=True, kw_only=True)
class BabyAIScale(Scale):
    levels: tuple[str, ...]  # names of LEVELS; several: one model on all of them (multi-task)
    demos: int  # bot episodes per level (failures dropped)
    held_out: int  # of them, kept for the trainer's per-step action accuracy
    eval_every: int  # steps between success-rate evaluations (and at the end)
    episodes: int  # evaluation episodes per level and evaluation
    seeds: int  # runs per model: seeds seed, seed + 1, ...
    dim: int = 128
    depth: int = 4  # self-attention layers of both models
    num_heads: int = 4
    chunk_size: int = 16  # TLB's K: the instruction and 15 states
    num_state: int = 8  # TLB's N
    eval_max_steps: int | None = None  # cap on an evaluation episode (smoke only; None: the level's limit)


def _scales(levels: tuple[str, ...], quick_levels: tuple[str, ...], quick_episodes: int,
            quick_seeds: int, quick_eval_every: int) -> dict[str, BabyAIScale]:
    multi = len(levels) > 1
    smoke = BabyAIScale(levels=("GoToObj", "GoToLocal") if multi else ("GoToLocal",), demos=12, held_out=2,
                        steps=4, batch_size=4, lr=1e-3, eval_examples=2, eval_every=2, episodes=3, seeds=2,
                        dim=16, depth=2, num_heads=2, chunk_size=4, num_state=2, eval_max_steps=8)
    # Sized by measurement (docs/babyai.md, "Sizing quick"); the one-level scale's seeds and episodes by the
    # noise of its first run (docs/babyai.md, "How many seeds and episodes").
    quick = BabyAIScale(levels=quick_levels, demos=3000 // len(quick_levels), held_out=50 // len(quick_levels) + 1,
                        steps=2000, batch_size=16, lr=5e-4, warmup=100, eval_examples=50, eval_every=quick_eval_every,
                        episodes=quick_episodes, seeds=quick_seeds, dim=64, depth=2)
    # Paper 003 gives no demo count in the text we have; BabyAI's bot-demo sets (Chevalier-Boisvert et al.
    # 2019) hold 1M episodes for BossLevel: 100k per level here, a GPU-sized budget.
    paper = BabyAIScale(levels=levels, demos=100_000, held_out=500, steps=100_000, batch_size=64, lr=3e-4,
                        warmup=1000, eval_examples=500, eval_every=5000, episodes=500, seeds=3, dim=512, depth=6,
                        num_heads=8)
    return {"smoke": smoke, "quick": quick, "paper": paper}


SCALES = _scales(("BossLevel",), ("GoToSeq",), quick_episodes=200, quick_seeds=4, quick_eval_every=500)
MULTI_SCALES = _scales(MULTI_TASK, MULTI_TASK, quick_episodes=10, quick_seeds=3, quick_eval_every=400)


def cache_dir() -> Path:
    """Where demos are cached: ``$CHRONOMEM_CACHE/babyai`` (default ``~/.cache/chronomem/babyai``), so that
    every run, whatever its output directory, reuses them."""
    root = os.environ.get("CHRONOMEM_CACHE") or Path.home() / ".cache" / "chronomem"
    return Path(root) / "babyai"


def model_options(model: str, s: BabyAIScale) -> dict[str, Any]:
    """The core's options: same width, heads and number of self-attention layers for both."""
    if model == "transformer":
        return {"depth": s.depth}
    return {"depth": s.depth, "self_per_cross": 1, "chunk_size": s.chunk_size, "num_state": s.num_state}


def build_policy(model: str, s: BabyAIScale):
    from chronomem.agents import InstructedPolicy
    from chronomem.envs.minigrid import VOCAB_SIZE
    from chronomem.registry import build_backbone
    from chronomem.tasks.babyai import MAX_WORDS, NUM_ACTIONS

    core = build_backbone(model, dim=s.dim, num_heads=s.num_heads, causal=True, **model_options(model, s))
    placement = "sequence" if model == "transformer" else "chunk"
    return InstructedPolicy(core, s.dim, NUM_ACTIONS, VOCAB_SIZE, MAX_WORDS, placement)


# --------------------------------------------------------------------------------------------
# Evaluation by acting
# --------------------------------------------------------------------------------------------


def success_rate(policy, level: str, episodes: int, seed: int = EVAL_SEED, max_steps: int | None = None) -> float:
    """The share of ``episodes`` fresh episodes of ``level`` (seeds ``seed, seed + 1, ...``) in which
    ``policy`` reaches the goal within the level's step limit (and ``max_steps``, if given), acting one
    step at a time with its state carried and the most likely action (``chronomem.rl.acting.Acting``).
    The episodes run side by side as one batch; a finished row's env idles (``one_episode``) while the
    others go on."""
    from chronomem.checks import check_positive
    from chronomem.rl.acting import Acting, most_likely
    from chronomem.tasks.babyai import level_vector_env

    check_positive(episodes, "episodes")
    envs = level_vector_env(level, episodes, one_episode=True)
    was_training = policy.training
    try:
        obs, _ = envs.reset(seed=[seed + i for i in range(episodes)])
        first = next(iter(policy.parameters()), None)
        device = torch.device("cpu") if first is None else first.device
        policy.eval()
        acting = Acting(policy, envs, obs, policy.initial_state(episodes, device), choose=most_likely)
        running, success, steps = np.ones(episodes, bool), np.zeros(episodes, bool), 0
        while running.any() and (max_steps is None or steps < max_steps):
            step = acting.step()
            success[running] = (step.terminated & (step.reward > 0))[running]
            running &= ~step.done
            steps += 1
    finally:
        policy.train(was_training)
        envs.close()
    return float(success.mean())


class RandomPolicy(nn.Module):
    """The reference of the success rates: an action drawn uniformly at every step. Its state is the
    random generator (seeded by ``seed``), carried like a model's; an episode's end changes nothing."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self.seed = seed

    def initial_state(self, batch_size: int, device=None) -> RandomState:
        return RandomState(torch.Generator().manual_seed(self.seed))

    def forward(self, features, state: RandomState):
        from chronomem.tasks.babyai import NUM_ACTIONS

        logits = torch.rand(features.shape[0], NUM_ACTIONS, generator=state.generator)
        return logits[:, None], state


@dataclass(frozen=True)
class RandomState:
    """``RandomPolicy``'s state: its generator, which an episode's end leaves as it is."""

    generator: torch.Generator

    def reset(self, done) -> RandomState:
        return self


# --------------------------------------------------------------------------------------------
# One run: train, stopping every eval_every steps to act
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    model: str
    seed: int
    scale: BabyAIScale
    out: str
    progress: bool
    resume: bool = False  # continue the run ``out`` holds (chronomem run --resume)


def load_task(s: BabyAIScale, workers: int = 1, progress: bool = False):
    from chronomem.tasks.babyai import BabyAIDemos, load_demos

    demos = [load_demos(level, s.demos, 0, cache_dir(), workers, progress) for level in s.levels]
    return BabyAIDemos(demos, s.held_out)


def run_job(job: Job) -> dict[str, Any]:
    """Train one model for the scale's steps; the success rates at every ``eval_every`` steps and at the end.

    After each evaluation the curve so far goes to ``OUT/curve.json``. Resumed (``job.resume``), the
    job skips the evaluations that file holds and continues training from the run's checkpoint
    (``chronomem.train.resume.rejoin``: the run must be this one); each segment restores torch's random
    state from its checkpoint, so the curve is the uninterrupted one."""
    import torch

    from chronomem.experiments.base import write_json_atomic
    from chronomem.train import train
    from chronomem.train.resume import rejoin

    s = job.scale
    task = load_task(s)  # cached by the parent process
    torch.manual_seed(job.seed)
    policy = build_policy(job.model, s)
    spec = {"model": job.model, "model_options": model_options(job.model, s), "task": "babyai",
            "task_options": task.describe()}
    ends = [*range(s.eval_every, s.steps, s.eval_every), s.steps]
    saved = Path(job.out) / "curve.json"
    curve, seconds = [], 0.0
    if job.resume and saved.exists():
        kept = json.loads(saved.read_text())
        curve, seconds = kept["curve"], kept["train_seconds"]
    for end in ends[len(curve):]:
        cfg = s.train_config(job.seed, steps=end, out=job.out, progress=job.progress, log_every=50)
        cfg, run = rejoin(cfg, spec) if job.resume or curve else (cfg, None)
        result = train(policy, task, cfg, spec=spec, resume=run)
        rates = {level: success_rate(policy, level, s.episodes, EVAL_SEED + 10_000 * job.seed, s.eval_max_steps)
                 for level in s.levels}
        curve.append({"step": end, "demos_seen": end * s.batch_size, "success": rates,
                      "mean": round(float(np.mean(list(rates.values()))), 4),
                      "action_accuracy": round(result.metrics["accuracy"], 2)})
        seconds = round(result.seconds, 1)
        write_json_atomic(saved, {"curve": curve, "train_seconds": seconds})
    return {"model": job.model, "seed": job.seed, "curve": curve, "train_seconds": seconds,
            "parameters": sum(p.numel() for p in policy.parameters())}


def _run(scale: str, out: Path, seed: int, models=None, time_budget=None, progress: bool = True,
         jobs: Jobs = SEQUENTIAL, resume: bool = False, *, scales: dict[str, BabyAIScale], name: str) -> dict:
    import time

    from chronomem.experiments.rl_runs import check_no_time_budget

    check_no_time_budget(name, time_budget)
    s = scales[scale]
    chosen = select_models(MODELS, models, name)
    start = time.perf_counter()
    task = load_task(s, jobs.processes, progress)  # generate (or read) the demos once, in parallel
    demo_seconds = time.perf_counter() - start
    runs = [Job(model, seed + i, s, str(Path(out) / "runs" / model / f"seed_{seed + i}"), progress, resume)
            for model in chosen for i in range(s.seeds)]
    rows = jobs.map(run_job, runs)
    curves = {m: mean_curve([r["curve"] for r in rows if r["model"] == m]) for m in chosen}
    random = {level: success_rate(RandomPolicy(seed), level, s.episodes, EVAL_SEED, s.eval_max_steps)
              for level in s.levels}
    random_mean = round(float(np.mean(list(random.values()))), 4)
    results = {m: {f"step {p['step']}": round(100 * p["mean"], 1) for p in curves[m]} for m in chosen}
    per_seed = {m: {f"step {p['step']}": [round(100 * v, 2) for v in p["seeds"]] for p in curves[m]} for m in chosen}
    config = {"scale": dataclasses.asdict(s), "levels": {level: LEVELS[level] for level in s.levels},
              "models": {m: model_options(m, s) for m in chosen}, "eval_seed": EVAL_SEED,
              "demo_cache": str(cache_dir())}
    extra = {"claim": CLAIM, "claim_check": claim_check(curves), "curves": curves, "runs": rows,
             "random_policy": {"success": random, "mean": random_mean}, "plot": "success.png",
             "demos": {"episodes": task.describe()["episodes"], "failures": [d.failures for d in task.demos],
                       "seconds_to_load_or_generate": round(demo_seconds, 1)}}
    plot_from_results({"experiment": name, "scale": scale, "config": config, "extra": extra}, Path(out) / "success.png")
    return {"results": results, "per_seed": per_seed, "paper": {}, "config": config, "extra": extra}


def claim_check(curves: dict[str, list[dict]]) -> dict[str, Any] | None:
    """The issue's reading of the claim at our scale: TLB's mean success at or above the Transformer's at
    every evaluation step (None unless both ran); the differences in percentage points."""
    if not {"transformer", "tlb"} <= set(curves):
        return None
    gaps = [round(100 * (t["mean"] - r["mean"]), 1) for t, r in zip(curves["tlb"], curves["transformer"], strict=True)]
    return {"tlb_minus_transformer_points": gaps, "tlb_at_or_above_at_every_step": all(g >= 0 for g in gaps)}


def mean_curve(curves: list[list[dict]]) -> list[dict]:
    """Per evaluation step: the mean success rate over the seeds, its min and max, and every seed's."""
    points = []
    for at in zip(*curves, strict=True):
        values = [p["mean"] for p in at]
        points.append({"step": at[0]["step"], "demos_seen": at[0]["demos_seen"],
                       "mean": round(float(np.mean(values)), 4), "min": min(values), "max": max(values),
                       "seeds": values})
    return points


def plot_from_results(results: dict, path: Path) -> None:
    """success.png from a results dict (the run's, or a results.json read back)."""
    levels = results["config"]["scale"]["levels"]
    title = f"{results['experiment']} ({results['scale']}): success rate by acting on {', '.join(levels)}"
    plot_success(results["extra"]["curves"], path, title, results["extra"]["random_policy"]["mean"])


def plot_success(curves: dict[str, list[dict]], path: Path, title: str, random: float | None = None) -> None:
    """Success rate (%) against training steps (demos seen on the top axis): the mean over seeds, a band
    from the lowest to the highest seed, a random policy's success (dashed) and the paper's claim under
    the plot. The legend sits right of the axes, the title wraps: nothing covers a curve or is cut off."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4.8), layout="constrained")  # 850 px wide at 100 dpi
    seeds = 0
    for model, points in curves.items():
        if not points:
            continue
        seeds = max(seeds, len(points[0]["seeds"]))
        steps = [p["step"] for p in points]
        ax.plot(steps, [100 * p["mean"] for p in points], marker=".", label=model)
        ax.fill_between(steps, [100 * p["min"] for p in points], [100 * p["max"] for p in points], alpha=0.2)
    if random is not None:
        ax.axhline(100 * random, color="grey", linestyle="--", linewidth=1,
                   label=f"random policy ({100 * random:.0f}%)")
    ax.set_xlabel("training steps")
    ax.set_ylabel("success rate (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    first = next((points for points in curves.values() if points), None)
    if first and first[0]["step"]:
        per_step = first[0]["demos_seen"] / first[0]["step"]
        top = ax.secondary_xaxis("top", functions=(lambda x: x * per_step, lambda x: x / per_step))
        top.set_xlabel("demos seen")
    what = f"mean over {seeds} seeds\nband: lowest to highest seed" if seeds > 1 else "one seed"
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, fontsize=8, title=what,
              title_fontsize=8)
    fig.suptitle(textwrap.fill(title, 80), fontsize=10)
    # The claim under the axes: the layout leaves it the bottom of the figure.
    fig.get_layout_engine().set(rect=(0, 0.08, 1, 0.92))
    fig.text(0.01, 0.01, textwrap.fill(CLAIM, 150), fontsize=7, va="bottom")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def random_policy_levels(results: dict) -> dict[str, float] | None:
    """The random policy's success (%) at every evaluation step of a run: the floor of its table."""
    random = results.get("extra", {}).get("random_policy")
    if random is None:
        return None
    return {setting: round(100 * random["mean"], 1) for row in results["results"].values() for setting in row}


# Fig. 3, read as the claim_check in extra reads it: TLB at or above the Transformer at every evaluation step
# (faster to learn, about equal at convergence); with several levels it also ends higher: above at every step.
CLAIMS = {
    "babyai": Claim("Transformer + TLB learns at least as fast as the Transformer (Fig. 3, one level)", "tlb",
                    "transformer", at_least=True),
    "babyai-multi": Claim("Transformer + TLB learns faster and ends higher than the Transformer (Fig. 3, multi-task)",
                          "tlb", "transformer"),
}


def _experiment(name: str, scales: dict[str, BabyAIScale], what: str) -> Experiment:
    return register_experiment(Experiment(
        name=name,
        description=f"Behaviour cloning on BabyAI bot demos ({what}): Transformer vs Transformer + TLB of the same "
                    "width and depth; success rate by acting, mean over seeds, at every evaluation step "
                    "(success.png: the curves with seed bands).",
        run=lambda scale, out, seed, models=None, time_budget=None, progress=True, jobs=SEQUENTIAL, resume=False: _run(
            scale, out, seed, models, time_budget, progress, jobs, resume, scales=scales, name=name),
        metric="success rate (%) by acting, mean over seeds",
        paper_source="paper 003 Fig. 3 (curves only, no numbers to copy)",
        notes=CLAIM,
        chance=random_policy_levels,
        chance_label="random policy",
        claims=(CLAIMS[name],),
    ))


BABYAI = _experiment("babyai", SCALES, "one level: BossLevel; quick: GoToSeq")
BABYAI_MULTI = _experiment("babyai-multi", MULTI_SCALES, "one model on the paper's 8 levels")
