"""What the RL experiments (``ballet-rl``, ``popgym``) share: check that the cores can be agents before
anything trains, train one PPO run, average learning curves over seeds, and plot mean return against
frames per core (the curve people look at), written next to report.md.

A scale fixes the frames of every run (DESIGN.md section 5: the same seed gives the same table on any
machine); frames per second are measured and reported, never used to stop a run.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

Curve = list[tuple[int, float]]  # (frames, mean episodic return of the episodes ended in that update)


def check_no_time_budget(experiment: str, time_budget: float | None) -> None:
    """RL experiments are fixed by their frame counts; an equal-time comparison is not offered."""
    if time_budget is not None:
        raise ValueError(f"{experiment} is fixed by frame counts and takes no time budget, got {time_budget}")


def row_core(model: str, options: dict) -> tuple[str, dict]:
    """The core and its builder's options of one row of an RL table. A row is a core by its own name
    (``"htm": {...}``), or a variant of one that names its core among its options (``"htm-final-norm":
    {"core": "htm", "final_norm": True, ...}``: a deviation shown as its own row beside the paper's)."""
    options = dict(options)
    core = options.pop("core", model)
    if not isinstance(core, str):
        raise TypeError(f"row {model!r}: its option 'core' must name a registered core (a str), got {core!r}")
    return core, options


# HTM's relevance floor and its read gated shut at the start (deviations, docs/htm.md), as the Visual Match,
# Key-to-Door and Ballet rows named htm-floor-gate* take them.
HTM_FLOOR_GATE = dict(relevance_floor=0.6, read_gate=0.0)


def variant_row(core: str, options: dict, **changes) -> dict:
    """The options of a row that is ``core`` with ``options`` and ``changes`` (the format ``row_core`` reads)."""
    return dict(core=core, **options, **changes)


def check_cores(experiment: str, models: tuple[str, ...], env_id: str, ppo: dict, options: dict[str, dict]) -> None:
    """Build every model's agent once, so that a core that cannot be an agent (one that does not take
    ``done`` inside a call, or keeps no state) stops the run before any training, with a message
    naming the missing piece."""
    from chronomem.envs.make import make_env
    from chronomem.rl.ppo import Args, make_agent

    env = make_env(env_id)
    try:
        for model in models:
            core, core_options = row_core(model, options.get(model, {}))
            args = Args(env=env_id, core=core, **ppo)
            try:
                make_agent(args, core_options, env.observation_space, env.action_space)
            except ValueError as err:
                raise ValueError(f"{experiment}: model {model!r} cannot be trained as an agent yet: {err}") from None
    finally:
        env.close()


def takes_done(model: str, env_id: str, ppo: dict, options: dict) -> str | None:
    """None if ``model`` can be an agent's memory, else the reason it cannot."""
    try:
        check_cores("", (model,), env_id, ppo, {model: options})
    except ValueError as err:
        return str(err).split(": ", 1)[-1]
    return None


def ppo_run(env_id: str, model: str, options: dict, ppo: dict, frames: int, seed: int, out: Path | None,
            progress: bool, reuse: bool = False):
    """One PPO run of ``frames`` frames; returns ``chronomem.rl.ppo.PPOResult``.

    ``reuse`` (``chronomem run --resume``): if ``out`` holds this run finished, load it instead of
    training it again (``finished_run``). A run cut short continues from its last checkpoint (a scale
    whose runs are long saves one every ``checkpoint_every`` updates); the environments restart with new
    seeds there and the memory empty, so a continued run is not the uninterrupted one step for step
    (``chronomem.rl.ppo.train``). One cut before its first checkpoint trains again from its start."""
    from chronomem.rl.ppo import Args, train
    from chronomem.train.resume import find_run

    core, options = row_core(model, options)
    args = Args(env=env_id, core=core, total_frames=frames, seed=seed, progress=progress,
                out=None if out is None else str(out), name=model if model != core else None, **ppo)
    if reuse and out is not None:
        if (result := finished_run(args, options)) is not None:
            return result
        if (Path(out) / "config.json").exists():  # this very run, cut short (finished_run checked its settings)
            run = find_run(out, kind="ppo")
            if run.checkpoint is not None:
                return train(args, options, resume=run)
            shutil.rmtree(out)
    return train(args, options)


@dataclass(frozen=True)
class PPORun:
    """The arguments of one ``ppo_run``, picklable: the job an RL experiment hands ``Jobs.map``
    (``chronomem.experiments.jobs``), whose job function trains it (``train()``) and keeps what the
    table needs (the agent stays in the process that trained it)."""

    env_id: str
    model: str
    options: dict
    ppo: dict
    frames: int
    seed: int
    out: str | None
    progress: bool
    reuse: bool = False

    def train(self):
        return ppo_run(self.env_id, self.model, self.options, self.ppo, self.frames, self.seed,
                       None if self.out is None else Path(self.out), self.progress, self.reuse)


BOOKKEEPING = ("out", "progress", "checkpoint_every", "name")  # Args fields a finished run may differ in


def finished_run(args, options: dict):
    """The ``PPOResult`` of the run in ``args.out`` if it finished with exactly these settings, else None.

    Finished: its config.json holds ``args`` (``BOOKKEEPING`` aside: a run directory may have been moved,
    and a checkpoint interval added since) and ``options`` (``chronomem.train.resume.differences``), and
    it has the checkpoint of its last update. The agent is loaded from that checkpoint, the history from
    metrics.csv, and torch's random state is set to the one saved with it, the state at the end of
    training: what follows (an evaluation that samples actions) draws what it would have drawn after the
    uninterrupted run. A directory that holds a run with other settings is a ValueError, not reused."""
    import dataclasses

    import torch

    from chronomem.rl.evaluate import load_agent
    from chronomem.rl.ppo import PPOResult
    from chronomem.train.checkpoint import checkpoint_name
    from chronomem.train.metrics import read_metrics
    from chronomem.train.resume import differences, find_run, set_rng_state

    run_dir = Path(args.out)
    if not (run_dir / "config.json").exists():
        return None
    saved = find_run(run_dir, kind="ppo").config
    # where the run lives, how it reports and how often it saved do not change what it learned
    asked = {key: value for key, value in dataclasses.asdict(args).items() if key not in BOOKKEEPING}
    # a setting added to Args since the run was saved ran at its default (e.g. recurrence: whole rollouts)
    saved_args = {**dataclasses.asdict(type(args)()), **saved["args"]}
    # a run trains whole updates, its learning rate annealed over them: totals that round up to the same
    # updates ran the same run (a scale's 6,000,000 frames and a `chronomem rl train` of 6,000,640)
    for settings in (asked, saved_args):
        settings["total_frames"] = frames_trained(settings)
    differ = differences(asked, saved_args)
    if differ or differences({"core_options": options}, saved):
        shown = ", ".join(f"{key}: saved {old!r}, asked {new!r}" for key, (new, old) in differ.items())
        raise ValueError(f"--resume: {run_dir} holds a run with other settings ({shown or 'core options'}); "
                         "resume into the directory of the interrupted run with the same --scale and --seed")
    frames = frames_trained(asked)
    checkpoint = run_dir / "checkpoints" / checkpoint_name(frames)
    if not (checkpoint / "trainer.pt").exists():
        return None
    agent, _, _ = load_agent(checkpoint, device=args.device)
    trainer = torch.load(checkpoint / "trainer.pt", map_location="cpu", weights_only=True)
    set_rng_state(trainer["rng"])  # the CPU generator and, where the run used one, the GPU's
    return PPOResult(agent, frames, float(trainer["seconds"]), read_metrics(run_dir / "metrics.csv"))


def frames_trained(settings: dict) -> int:
    """The frames a PPO run of these ``Args`` fields trains: ``total_frames`` rounded up to whole updates."""
    per_update = settings["num_envs"] * settings["num_steps"]
    return math.ceil(settings["total_frames"] / per_update) * per_update


EVALUATION_FILE = "evaluation.json"  # a run's kept evaluation, beside its config.json


def weights_digest(module) -> str:
    """SHA-256 of a module's state (names and bytes): two agents share it only if their weights are equal."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def kept_evaluation(out: Path | None, agent, settings: dict[str, Any], evaluate: Callable[[], Any],
                    reuse: bool) -> Any:
    """``evaluate()`` of a trained ``agent``, kept in ``OUT/evaluation.json`` with ``settings`` and the
    agent's ``weights_digest``. Resumed (``reuse``: ``chronomem run --resume``), a run whose file holds
    the same settings and weights is not evaluated again: MemLSTM's DoorKey-16x16 evaluation takes about
    10 minutes a run, and an experiment cut by a session's end resumes every finished run. Only for an
    evaluation that seeds its own draws, whose result does not depend on what ran before it; the
    result must be plain JSON (it is compared read back)."""
    from chronomem.experiments.base import write_json_atomic

    if out is None:
        return evaluate()
    saved, key = Path(out) / EVALUATION_FILE, {"settings": settings, "weights": weights_digest(agent)}
    if reuse and saved.exists():
        kept = json.loads(saved.read_text())
        if {name: kept.get(name) for name in key} == json.loads(json.dumps(key)):
            return kept["result"]
    result = evaluate()
    write_json_atomic(saved, {**key, "result": result})
    return result


def control_summary(task: str, frames: int, metric: str, threshold: str, per_seed: dict[str, list],
                    learned: dict[str, list[bool]]) -> dict:
    """results.json's ``control`` (rendered by ``chronomem.report.control_markdown``): the task with its
    memory demand removed, the frames each model trained on it with the run's settings, ``metric`` per
    model and seed, the ``threshold`` in words, and whether each seed met it."""
    return {"task": task, "frames": frames, "metric": metric, "threshold": threshold, "per_seed": per_seed,
            "learned": learned}


def curve(history: list[dict[str, Any]]) -> Curve:
    return [(int(row["step"]), float(row["return_mean"])) for row in history if "return_mean" in row]


def mean_curve(curves: list[Curve]) -> Curve:
    """The mean over seeds at each logged frame count that every seed has."""
    common = set.intersection(*(set(dict(c)) for c in curves)) if curves else set()
    return [(f, round(float(np.mean([dict(c)[f] for c in curves])), 4)) for f in sorted(common)]


def max_mean_return(history: list[dict[str, Any]]) -> float | None:
    """POPGym's metric (MMER): the maximum over training of the mean episodic return, here of the
    episodes ended during each update (None if no episode ended)."""
    returns = [r for _, r in curve(history)]
    return max(returns) if returns else None


def smooth(points: Curve, bins: int = 50) -> Curve:
    """At most ``bins`` points: consecutive updates averaged in equal groups (the last frame count of
    each group). An update in which a few long episodes ended (Ballet: 1,024 frames, ~4 episodes) is
    too noisy to read alone."""
    size = max(1, -(-len(points) // bins))
    groups = [points[i:i + size] for i in range(0, len(points), size)]
    return [(group[-1][0], float(np.mean([r for _, r in group]))) for group in groups]


def seed_band(curves: list[Curve], bins: int = 50) -> list[tuple[int, float, float, float]]:
    """``(frames, mean, lowest, highest)`` over seeds, each seed ``smooth``ed alike: restricted first to
    the frame counts every seed logged (as ``mean_curve``), so the groups of updates line up."""
    curves = [c for c in curves if c]
    if not curves:
        return []
    common = set.intersection(*(set(dict(c)) for c in curves))
    smoothed = [smooth([(f, r) for f, r in c if f in common], bins) for c in curves]
    band = []
    for at in zip(*smoothed, strict=True):
        values = [r for _, r in at]
        band.append((at[0][0], float(np.mean(values)), min(values), max(values)))
    return band


def random_return(env_id: str, episodes: int = 500, seed: int = 0) -> float:
    """The mean episodic return of a policy drawing every action uniformly: ``episodes`` episodes,
    seeded from ``seed`` (the same number on every call and machine). The reference line of the
    learning curves: a core whose curve stays on it has learned nothing."""
    from chronomem.envs.make import make_env

    env = make_env(env_id)
    env.action_space.seed(seed)
    returns = []
    try:
        for episode in range(episodes):
            env.reset(seed=seed + episode)
            total, done = 0.0, False
            while not done:
                _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
                total, done = total + float(reward), terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return round(float(np.mean(returns)), 4)


def seeds_alike(counts: dict[str, int]) -> bool:
    """Whether every core has as many seeds (they differ where runs joined other seeds of some cores:
    ``chronomem.report.join_runs``)."""
    return len(set(counts.values())) <= 1


def core_labels(counts: dict[str, int]) -> dict[str, str]:
    """Each core's legend label from its count of seeds: its name where every core has as many
    (``seeds_alike``), else its name and its count."""
    alike = seeds_alike(counts)
    return {model: model if alike else f"{model} ({count} seeds)" for model, count in counts.items()}


def plot_curves(panels: dict[str, dict[str, list[Curve]]], path: Path, title: str,
                chance: dict[str, float] | None = None, chance_label: str = "random policy",
                ylim: tuple[float, float] | None = None, seeds: int | None = None,
                ylabel: str = "mean episodic return") -> None:
    """One panel per setting (env or level mixture), one colour per core: the mean return over its seeds
    (``panels[setting][core]``: one curve per seed) against frames, ``smooth``ed to at most 50 points
    (results.json keeps every update's), a band from the lowest to the highest seed, and ``chance``'s
    return of the setting as a dashed line. Panels share the y-axis (``ylim``, if given, for all): the
    same quantity is read on the same scale; each has its own frames (a control runs shorter than the
    task, a longer episode longer). One legend, outside the panels; where the cores have other counts of
    seeds (runs joined with other seeds of some), each line's label gives its count. ``seeds``: how many seeds
    each line averages, when only their mean curve is given (results written before the per-seed curves
    were kept): the legend says so, and there is no band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    if not panels:
        return
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    # 100 dpi: at least 850 px wide (constrained layout keeps the figure's size); room for the legend below.
    fig, axes = plt.subplots(rows, columns, figsize=(max(8.5, 3.8 * columns), 1.9 + 2.8 * rows),
                             squeeze=False, sharey=True, layout="constrained")
    colours = {}  # one colour per core across panels
    given = max((len(c) for lines in panels.values() for c in lines.values()), default=0)
    counts = {}  # each core's seeds: they differ where runs of other seeds of some cores were joined
    for lines in panels.values():
        for model, curves in lines.items():
            counts[model] = max(counts.get(model, 0), len(curves))
    labels, alike = core_labels(counts), seeds_alike(counts)
    for ax, (name, lines) in zip(axes.flat, panels.items(), strict=False):
        for model, curves in lines.items():
            points = seed_band(curves)
            if not points:
                continue
            colour = colours.setdefault(model, f"C{len(colours)}")
            frames, mean, low, high = zip(*points, strict=True)
            ax.plot(frames, mean, color=colour, linewidth=1.3, label=labels[model])
            if len(curves) > 1:
                ax.fill_between(frames, low, high, color=colour, alpha=0.15, linewidth=0)
        if chance and name in chance:
            # Above the curves: a curve lying on it is a core that learned nothing.
            ax.axhline(chance[name], color="black", linestyle="--", linewidth=1, zorder=3, label=chance_label)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
    for i in range(len(panels), rows * columns):  # an empty slot: the panel above it shows the frames
        axes.flat[i].axis("off")
        axes.flat[i - columns].xaxis.set_tick_params(labelbottom=True)
        axes.flat[i - columns].set_xlabel("frames")
    if ylim is not None:
        axes.flat[0].set_ylim(*ylim)  # shared by every panel
    for ax in axes.flat:
        ax.xaxis.set_major_formatter(FuncFormatter(
            lambda x, _: f"{x / 1e6:g}M" if abs(x) >= 1e6 else f"{x / 1000:g}k" if x else "0"))
    for ax in axes[-1][:len(panels) - (rows - 1) * columns]:
        ax.set_xlabel("frames")
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    handles = {}  # one entry per label, from whichever panel drew it
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        seeds = seeds or given
        what = ("mean over each core's seeds, band: lowest to highest seed" if not alike else
                f"mean over {seeds} seeds, band: lowest to highest seed" if given > 1 else
                f"mean over {seeds} seeds (per-seed curves not stored: no band)" if seeds > 1 else
                "one seed per core")
        # Below the panels, so it covers no data and no title.
        fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncol=min(len(handles), 4),
                   fontsize=8, title=what, title_fontsize=8)
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    plt.close(fig)
