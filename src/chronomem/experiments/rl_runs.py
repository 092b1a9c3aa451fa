"""What the RL experiments (``ballet-rl``, ``popgym``) share: check that the cores can be agents before
anything trains, train one PPO run, average learning curves over seeds, and plot mean return against
frames per core (the curve people look at), written next to report.md.

A scale fixes the frames of every run (DESIGN.md section 5: the same seed gives the same table on any
machine); frames per second are measured and reported, never used to stop a run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

Curve = list[tuple[int, float]]  # (frames, mean episodic return of the episodes ended in that update)


def check_no_time_budget(experiment: str, time_budget: float | None) -> None:
    """RL experiments are fixed by their frame counts; an equal-time comparison is not offered."""
    if time_budget is not None:
        raise ValueError(f"{experiment} is fixed by frame counts and takes no time budget, got {time_budget}")


def check_cores(experiment: str, models: tuple[str, ...], env_id: str, ppo: dict, options: dict[str, dict]) -> None:
    """Build every model's agent once, so that a core that cannot be an agent (one that does not take
    ``done`` inside a call, or keeps no state) stops the run before any training, with a message
    naming the missing piece."""
    from chronomem.envs.make import make_env
    from chronomem.rl.ppo import Args, make_agent

    env = make_env(env_id)
    try:
        for model in models:
            args = Args(env=env_id, core=model, **ppo)
            try:
                make_agent(args, options.get(model, {}), env.observation_space, env.action_space)
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
    training it again (``finished_run``); a run that did not finish trains again from its start, so the
    table is the one an uninterrupted ``chronomem run`` gives."""
    from chronomem.rl.ppo import Args, train

    args = Args(env=env_id, core=model, total_frames=frames, seed=seed, progress=progress,
                out=None if out is None else str(out), **ppo)
    if reuse and out is not None and (result := finished_run(args, options)) is not None:
        return result
    return train(args, options)


def finished_run(args, options: dict):
    """The ``PPOResult`` of the run in ``args.out`` if it finished with exactly these settings, else None.

    Finished: its config.json holds ``args`` (``out`` and ``progress`` aside: a run directory may have
    been moved) and ``options``, and it has the
    checkpoint of its last update. The agent is loaded from that checkpoint, the history from
    metrics.csv, and torch's random state is set to the one saved with it, the state at the end of
    training: what follows (an evaluation that samples actions) draws what it would have drawn after the
    uninterrupted run. A directory that holds a run with other settings is a ValueError, not reused."""
    import dataclasses
    import json
    import math

    import torch

    from chronomem.rl.evaluate import load_agent
    from chronomem.rl.ppo import PPOResult
    from chronomem.train.checkpoint import checkpoint_name, load_config
    from chronomem.train.metrics import read_metrics

    run_dir = Path(args.out)
    if not (run_dir / "config.json").exists():
        return None
    saved = load_config(run_dir)
    asked = json.loads(json.dumps({"args": dataclasses.asdict(args), "core_options": options}))  # as saved
    differ = [key for key in asked["args"]  # where the run lives and how it reports do not change it
              if key not in ("out", "progress") and saved.get("args", {}).get(key) != asked["args"][key]]
    if saved.get("kind") != "ppo" or differ or saved.get("core_options", {}) != asked["core_options"]:
        shown = ", ".join(f"{k}: saved {saved.get('args', {}).get(k)!r}, asked {asked['args'][k]!r}" for k in differ)
        raise ValueError(f"--resume: {run_dir} holds a run with other settings ({shown or 'core options'}); "
                         "resume into the directory of the interrupted run with the same --scale and --seed")
    frames = math.ceil(args.total_frames / args.frames_per_update) * args.frames_per_update
    checkpoint = run_dir / "checkpoints" / checkpoint_name(frames)
    if not (checkpoint / "trainer.pt").exists():
        return None
    agent, _, _ = load_agent(checkpoint, device=args.device)
    trainer = torch.load(checkpoint / "trainer.pt", map_location="cpu", weights_only=True)
    torch.set_rng_state(trainer["rng"]["torch"])
    return PPOResult(agent, frames, float(trainer["seconds"]), read_metrics(run_dir / "metrics.csv"))


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


def plot_curves(panels: dict[str, dict[str, Curve]], path: Path, title: str) -> None:
    """One panel per setting (env or level mixture), one line per core: mean return against frames,
    ``smooth``ed to at most 50 points (results.json keeps every update's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not panels:
        return
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False)
    for ax, (name, lines) in zip(axes.flat, panels.items(), strict=False):
        for model, points in lines.items():
            if points:
                ax.plot(*zip(*smooth(points), strict=True), marker=".", label=model)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("frames")
        ax.set_ylabel("mean return")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if axes.flat[0].get_legend_handles_labels()[0]:
        axes.flat[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
