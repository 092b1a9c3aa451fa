"""ballet-rl (paper 001 Table 3, Fig. 3): HTM vs Transformer-XL vs LSTM as the memory of an RL agent
on Ballet.

As in the paper (App. B.1) one agent per memory trains on the uniform mixture of the six levels
(``chronomem/Ballet-mixture[-symbolic]-v0``; a scale may train on one level, ``train_level``) and is then
measured on each level of Table 3: the success rate (% of episodes ending on the target dancer; a
time-out scores 0, as in the paper) over ``eval_episodes`` fresh episodes per level, actions sampled.
The paper's number is the mean of the evaluations during the last 1% of training; ours is one
evaluation after training.

Beside the paper's memories, the memoryless agent (``mlp``: chance is its ceiling), and before them the
control (docs/rl.md "Controls and the memoryless agent"): every model trains with the same settings on
the control level where any dancer pays (``ballet_id(level, observation, any_dancer=True)``) and is
evaluated there; learned when >= 90% of its episodes end on a dancer, within the cue's step + 18 steps
on average. The report says at the top when a seed did not learn it.

The agent (``chronomem.rl.ppo``, docs/rl.md "Ballet"): the Ballet encoder, the core, policy and value
MLPs, and the reconstruction loss of the image and the instruction at every step (App. A.1, weight 1).
Deviation: PPO, not the paper's IMPALA with V-trace.

Scales fix the frames per model: ``smoke`` (seconds, tests), ``quick`` (symbolic observations,
CPU-sized agents), ``paper`` (pixels and App. A Table 1's sizes: memory width 512, 4 layers, 8 heads,
HTM chunk 32 and top-k 8, TrXL extra length 256, policy/value MLPs of 512, Adam lr 2e-4, unrolls of 64,
batch 32 trajectories, entropy 1e-3). A core that cannot be an agent (one that does not take ``done``
inside a call) stops the run before anything trains, with a message naming the missing piece.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from chronomem.envs.ballet_world import LEVELS, MIXTURE, ballet_id, cue_step, parse_level
from chronomem.experiments.base import Experiment, select_models
from chronomem.experiments.jobs import SEQUENTIAL, Jobs
from chronomem.experiments.rl_runs import (
    HTM_FLOOR_GATE,
    PPORun,
    check_cores,
    check_no_time_budget,
    control_summary,
    curve,
    mean_curve,
    plot_curves,
    variant_row,
)
from chronomem.registry import register_experiment
from chronomem.report import Claim
from chronomem.rl.settings import check_ppo_settings

TABLE3_LEVELS = ("2_delay16", "8_delay16", "8_delay48")
PAPER = {  # paper 001 Table 3 (% correct, mean of 3 runs)
    "htm": {"2_delay16": 99.8, "8_delay16": 98.1, "8_delay48": 97.2},
    "transformer-xl": {"2_delay16": 96.9, "8_delay16": 65.7, "8_delay48": 49.2},
    "lstm": {"2_delay16": 97.4, "8_delay16": 25.2, "8_delay48": 29.7},
}


@dataclass(frozen=True)
class BalletRLScale:
    """One scale: observations, fixed frames per model, evaluation, the PPO and core settings, the level
    the agents train on, and the control."""

    observation: str  # "symbolic" or "pixels"
    frames: int  # training frames per model and seed
    seeds: int  # runs per model (seed, seed + 1, ...)
    eval_episodes: int  # per level
    ppo: dict = field(default_factory=dict)  # chronomem.rl.ppo.Args fields
    models: dict = field(default_factory=dict)  # core -> its options
    model_ppo: dict = field(default_factory=dict)  # core -> its own changes to ``ppo`` (its settings' winner)
    levels: tuple[str, ...] = TABLE3_LEVELS  # evaluated
    train_level: str = MIXTURE  # trained on: the paper's mixture of the six levels, or one level
    control_level: str = "2_delay16"  # the control: this level where any dancer pays (docs/rl.md)
    control_frames: int = 0  # training frames of each model and seed on the control

    def __post_init__(self):  # a typo or a bad value in the PPO settings fails at import
        check_ppo_settings(self.ppo, type(self).__name__)
        for model, changes in self.model_ppo.items():
            check_ppo_settings({**self.ppo, **changes}, f"{type(self).__name__}, model {model}")

    def ppo_of(self, model: str) -> dict:
        """The PPO settings of ``model``'s runs: ``ppo`` with the model's own changes."""
        return {**self.ppo, **self.model_ppo.get(model, {})}


# Our agent sized for a CPU (docs/rl.md "A Ballet agent sized for a CPU"): width 64, 2 layers, the per-cell
# vision, one step in 8 reconstructed; the paper's HTM chunk and top-k (App. A Table 1) with a memory of
# 40 chunks (> 1024 // 32), TrXL's extra length 256; and the memoryless agent beside them.
CPU_AGENT = dict(dim=64, depth=2, heads=4, hidden=128, visual="cells", reconstruct_every=8)
# htm-memory-gradient: the same HTM with gradients into the chunks a call builds (memory_gradient, a deviation
# from paper 001 Section 2's stop-gradient). The paper leaves what the stored steps keep to its reconstruction
# loss, which the quick agent runs without (it stopped the control); on Visual Match the memory then stayed
# near chance at distractor 5 and learned fast with the gradient (docs/rl.md, "HTM's memory at quick").
# htm-final-norm: HTM with a LayerNorm on its output (final_norm, a deviation; docs/htm.md) and the scale's two
# layers. The paper's layer leaves its output unnormalised: in the two-layer control runs that did not learn,
# and in the one-layer HTM's 15M frames on 2_delay16, it grew to norms of 500-15,000 and saturated every tanh
# unit of the policy and value heads; with the LayerNorm the two-layer agent learned the control in 106k-133k
# frames (docs/rl.md, "Ballet's HTM heads").
# htm-floor-gate-final-norm: the HTM that learned Visual Match at distractor 30 in five seeds of six
# (visual_match.py's row of that name: gradients into its memory, a floor under its relevance, its read gated
# shut at the start and the LayerNorm on its output, each a deviation; docs/htm.md) with the scale's two
# layers and chunks. htm-final-norm keeps the stop-gradient, under which Visual Match's memory stayed near
# chance at distractor 5 (docs/rl.md, "HTM's memory at quick").
CPU_HTM = dict(chunk_size=32, top_k=8, memory_size=40)
CPU_MODELS = {"mlp": dict(), "lstm": dict(), "htm": CPU_HTM,
              "htm-memory-gradient": variant_row("htm", CPU_HTM, memory_gradient=True),
              "htm-final-norm": variant_row("htm", CPU_HTM, final_norm=True),
              "htm-floor-gate-final-norm": variant_row("htm", CPU_HTM, memory_gradient=True, **HTM_FLOOR_GATE,
                                                       final_norm=True),
              "transformer-xl": dict(mem_len=256)}

SCALES = {
    "smoke": BalletRLScale(
        observation="symbolic", frames=16, seeds=1, eval_episodes=2,
        ppo=dict(dim=16, depth=1, heads=2, hidden=16, num_envs=2, num_steps=8, num_minibatches=1,
                 update_epochs=1),
        models={"mlp": {}, "htm": dict(chunk_size=4, memory_size=4, top_k=2), "transformer-xl": dict(mem_len=8),
                "lstm": {}},
        levels=("2_delay16",), control_frames=16),
    # 2_delay16 alone for the one public budget (~15M frames, an LSTM on an easier variant); the
    # settings that learned the control soonest for every core, without the reconstruction loss, which
    # stopped it, and with eight epochs per rollout, without which HTM did not learn it in 400k frames
    # (docs/rl.md "Settings by time to learn"); the control gets twice the 375k frames HTM needed on
    # seed 1; checkpoints every ~0.5M frames for --resume.
    "quick": BalletRLScale(
        observation="symbolic", frames=15_001_600, seeds=1, eval_episodes=200,
        ppo=dict(**CPU_AGENT, num_envs=16, num_steps=128, num_minibatches=8, update_epochs=8, lr=1e-3,
                 ent_coef=0.01, norm_adv=True, timeout="failure", reconstruction=0.0, checkpoint_every=250),
        models=CPU_MODELS, levels=("2_delay16",), train_level="2_delay16", control_frames=819_200,
        # HTM with one layer: with two it learned the control at 375k frames on one seed and not in 819k on
        # another; with one, on 3 seeds of 3 at 37k-80k (benchmarks/ppo_settings.py --control ballet-any-attention)
        model_ppo={"htm": dict(depth=1), "htm-memory-gradient": dict(depth=1)}),
    # The paper's training length is not in its text (only Fig. 3's axis): 1e9 frames is our choice.
    "paper": BalletRLScale(
        observation="pixels", frames=1_000_000_000, seeds=3, eval_episodes=1000,
        ppo=dict(dim=512, depth=4, heads=8, hidden=512, num_envs=32, num_steps=64, num_minibatches=1,
                 update_epochs=1, lr=2e-4, ent_coef=1e-3, checkpoint_every=1000),
        models={"mlp": dict(), "htm": dict(chunk_size=32, top_k=8, memory_size=40),
                "transformer-xl": dict(mem_len=256), "lstm": dict()},
        control_frames=5_000_000),
}


def control_length(level: str) -> int:
    """The control is learned when its episodes end, on average, within this many steps: the cue's step
    and 18 more (a dancer stands 3 steps from the start; sampled actions stray)."""
    return cue_step(*parse_level(level)) + 18


@dataclass(frozen=True)
class BalletRun:
    """One core and seed: its PPO run and its evaluation on each level (the job of ``Jobs.map``); on the
    control (``control``) the evaluation is on the control's env."""

    run: PPORun
    scale: BalletRLScale
    progress: bool  # of the evaluations
    control: bool = False


def _train_and_evaluate(job: BalletRun) -> tuple[dict, int]:
    """Train one agent, then measure its success on each level (on the control: on the control's env):
    its row of ``extra[model]["runs"]`` (``extra["control"]``) and its number of parameters."""
    from chronomem.rl.evaluate import evaluate

    s, seed = job.scale, job.run.seed
    result = job.run.train()
    envs = {s.control_level: job.run.env_id} if job.control else {
        level: ballet_id(level, s.observation) for level in s.levels}
    measured = {level: evaluate(result.agent, env_id, s.eval_episodes, seed=10_000 + seed,
                                num_envs=min(16, s.eval_episodes), progress=job.progress)
                for level, env_id in envs.items()}
    row = {"seed": seed, "frames": result.frames, "train_seconds": round(result.seconds, 1),
           "frames_per_second": round(result.frames / max(result.seconds, 1e-9)),
           "success": {level: 100 * m["success_rate"] for level, m in measured.items()},
           "length": {level: m["length_mean"] for level, m in measured.items()},
           "curve": curve(result.history)}  # the seed band of learning_curves.png
    if job.control:
        row["learned"] = (row["success"][s.control_level] >= 90
                          and row["length"][s.control_level] <= control_length(s.control_level))
    return row, sum(p.numel() for p in result.agent.parameters())


def _run(scale: str, out: Path, seed: int, models: tuple[str, ...] | None = None,
         time_budget: float | None = None, resume: bool = False, progress: bool = True,
         jobs: Jobs = SEQUENTIAL) -> dict:
    check_no_time_budget("ballet-rl", time_budget)
    s = SCALES[scale]
    chosen = select_models(s.models, models, "ballet-rl")
    train_env = ballet_id(s.train_level, s.observation)
    control_env = ballet_id(s.control_level, s.observation, any_dancer=True)
    for model in chosen:  # before anything trains
        check_cores("ballet-rl", (model,), train_env, s.ppo_of(model), s.models)
    out = Path(out)
    seeds = range(seed, seed + s.seeds)
    show = progress and scale != "smoke"

    def job(env_id: str, frames: int, model: str, run_seed: int, where: Path, control: bool) -> BalletRun:
        run = PPORun(env_id, model, s.models[model], s.ppo_of(model), frames, run_seed,
                     str(where / f"{model}-seed{run_seed}"), show, resume)
        return BalletRun(run, s, progress, control)

    # the controls first: they are short, and the table below them means nothing unless they are learned
    controls = [job(control_env, s.control_frames, m, r, out / "control", True) for m in chosen for r in seeds
                if s.control_frames]
    runs = [job(train_env, s.frames, m, r, out, False) for m in chosen for r in seeds]
    done = iter(jobs.map(_train_and_evaluate, [*controls, *runs]))
    control_rows = {m: [next(done)[0] for _ in seeds] for m in chosen} if controls else {}
    results, per_seed, extra, curves = {}, {}, {}, {}
    for model in chosen:
        info, parameters = [], 0
        for _ in seeds:
            row, parameters = next(done)
            info.append(row)
        results[model] = {level: round(sum(r["success"][level] for r in info) / len(info), 1) for level in s.levels}
        per_seed[model] = {level: [r["success"][level] for r in info] for level in s.levels}
        curves[model] = mean_curve([row["curve"] for row in info])
        extra[model] = {"runs": info, "parameters": parameters}
    extra["curves"] = curves
    config = {"scale": scale, **asdict(s), "train_env": train_env, "models": list(chosen)}
    produced = {"results": results, "per_seed": per_seed, "config": config, "extra": extra}
    if control_rows:
        config["control_env"] = control_env
        extra["control"] = control_rows
        produced["control"] = control_summary(
            f"`{control_env}` (any dancer pays)", s.control_frames, "success (%): episodes ending on a dancer",
            f"success >= 90% and episodes of at most {control_length(s.control_level)} steps on average "
            f"({s.eval_episodes} evaluation episodes)",
            {m: [r["success"][s.control_level] for r in rows] for m, rows in control_rows.items()},
            {m: [r["learned"] for r in rows] for m, rows in control_rows.items()})
    plot_learning_curves({"scale": scale, "config": config, "extra": extra}, out / "learning_curves.png")
    return produced


def mixture_chance_return() -> float:
    """The training mixture's mean return of a policy that walks onto a dancer picked at random: reward 1
    with probability 1/n on a level of n dancers, the mixture's levels drawn uniformly (App. B.1)."""
    return float(np.mean([1 / parse_level(level)[0] for level in LEVELS]))


def plot_learning_curves(results: dict, path: Path) -> None:
    """learning_curves.png from a results dict (the run's, or a results.json read back): the training
    episodes' mean return (the level mixture, or the one level trained on) of each core against frames,
    mean over seeds with a band from the lowest to the highest seed, and the return of walking onto a
    random dancer dashed; beside it, where the run had one, the same on the control (any dancer pays)."""
    extra, config = results["extra"], results["config"]
    models = extra["curves"]
    panel = {model: [run["curve"] for run in extra[model]["runs"] if "curve" in run] or [points]
             for model, points in models.items()}  # the stored mean where no seed's curve was kept
    stored_means = any("curve" not in run for model in models for run in extra[model]["runs"])
    level = config.get("train_level", MIXTURE)
    if level == MIXTURE:
        name, chance = f"training episodes: the level mixture ({config['observation']})", mixture_chance_return()
    else:
        name, chance = f"training episodes: {level} ({config['observation']})", 1 / parse_level(level)[0]
    panels, chances = {name: panel}, {name: chance}
    if extra.get("control"):
        control = f"control: {config['control_level']}, any dancer pays"
        panels[control] = {model: [run["curve"] for run in rows] for model, rows in extra["control"].items()}
    plot_curves(panels, path, f"ballet-rl ({results['scale']}): mean episodic return against frames",
                chance=chances, chance_label="chance: onto a random dancer (1/n)",
                ylim=(0, 1), seeds=config["seeds"] if stored_means else None)


def plot_run_in_progress(run_dir: Path, path: Path, level: str = "2_delay16") -> None:
    """learning_curve.png of a run not finished yet (no results.json): each model's training return
    against frames from its ``metrics.csv`` (``MODEL-seedS/``, the control's under ``control/``), one panel
    for the level and one for the control, chance dashed.

        python -c "from chronomem.experiments.ballet_rl import plot_run_in_progress as p; p('runs/x', 'c.png')"
    """
    from chronomem.train.metrics import read_metrics

    run_dir = Path(run_dir)

    def curves(where: Path) -> dict:
        found: dict[str, list] = {}
        for metrics in sorted(where.glob("*-seed*/metrics.csv")):
            found.setdefault(metrics.parent.name.rsplit("-seed", 1)[0], []).append(curve(read_metrics(metrics)))
        return found

    panels = {f"training episodes: {level}": curves(run_dir), f"control: {level}, any dancer pays":
              curves(run_dir / "control")}
    plot_curves({name: lines for name, lines in panels.items() if lines}, Path(path),
                f"ballet-rl (in progress): mean episodic return against frames ({run_dir.name})",
                chance={name: 1 / parse_level(level)[0] for name in panels},
                chance_label="chance: onto a random dancer (1/n)", ylim=(0, 1))


BALLET_RL = register_experiment(
    Experiment(
        name="ballet-rl",
        description="Ballet as an RL task: HTM vs Transformer-XL vs LSTM agents trained with PPO (paper 001 "
        "Table 3), a memoryless agent (`mlp`) beside them and a control that needs no memory above them.",
        run=_run,
        paper=PAPER,
        metric="success rate (%) on the level",
        paper_source="paper 001 Table 3 (IMPALA agents, mean of 3 runs, evaluations in the last 1% of training)",
        notes="Ours: PPO (not IMPALA/V-trace), one evaluation after training of `eval_episodes` episodes per "
        "level, actions sampled; a time-out counts as a failure (as in the paper). Chance is 1/n (50% with 2 "
        "dancers, 12.5% with 8), where the memoryless agent (`mlp`) must stay. The control: the same level "
        "where any dancer pays (no memory needed), trained with the same settings first; a table whose "
        "control was not learned says nothing about memory. Quick: 2_delay16 alone, trained and evaluated "
        "(the paper trains on the mixture of six levels), symbolic observations, CPU-sized agents (the "
        "per-cell vision; docs/rl.md, 'A Ballet agent sized for a CPU'), the settings that learned the "
        "control soonest (docs/rl.md 'Settings by time to learn'): deviations, no reconstruction loss and "
        "the time-out a failure to the learner too; paper: pixels, the paper's sizes and the mixture. "
        "learning_curves.png: mean return of the training episodes against frames, mean over seeds with a "
        "band from the lowest to the highest seed; dashed, the return of walking onto a random dancer.",
        chance={level: 100 / parse_level(level)[0] for level in LEVELS},
        # Table 3 on the 8-dancer levels: HTM 98.1 / 97.2, above Transformer-XL 65.7 / 49.2, above the LSTM
        # 25.2 / 29.7. Below them, what any memory result needs first: a memory above no memory.
        claims=(Claim("HTM above Transformer-XL with 8 dancers", "htm", "transformer-xl",
                      settings=("8_delay16", "8_delay48")),
                Claim("Transformer-XL above the LSTM with 8 dancers", "transformer-xl", "lstm",
                      settings=("8_delay16", "8_delay48")),
                *(Claim(f"{name} above the memoryless agent", model, "mlp", settings=TABLE3_LEVELS)
                  for model, name in (("htm", "HTM"), ("transformer-xl", "Transformer-XL"), ("lstm", "The LSTM"),
                                      ("htm-memory-gradient", "HTM with gradients into its memory (a deviation)"),
                                      ("htm-final-norm", "HTM with a LayerNorm on its output (a deviation)"),
                                      ("htm-floor-gate-final-norm", "HTM with Visual Match's deviations (gradients "
                                       "into its memory, a relevance floor, a gated read, a LayerNorm on its "
                                       "output)")))),
    )
)
