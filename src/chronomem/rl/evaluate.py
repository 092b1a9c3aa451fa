"""Trained agents: load a PPO run, measure its mean return on any environment with the same
observation and action spaces (MiniGrid's small-to-large transfer), and film an episode as a GIF.

Both show their progress on stderr (``chronomem.progress``: episodes finished, and the environment
steps so far as the sign of life, since episodes played side by side all end near the end) unless
``progress=False``."""

from __future__ import annotations

import contextlib
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chronomem.agents import ActorCritic, heads_watched
from chronomem.envs.make import env_seeds, make_env, make_vector_env
from chronomem.progress import Progress
from chronomem.rl.acting import Acting, Choose, act, drawn, most_likely, obs_map
from chronomem.rl.ppo import Args, make_agent
from chronomem.train.checkpoint import CheckpointError, load_weights
from chronomem.train.distributed import default_device
from chronomem.train.resume import find_run


def load_agent(run: str | Path, env_id: str | None = None, device=None) -> tuple[ActorCritic, Args, Path]:
    """``(agent, args, checkpoint)`` of a PPO run (a run directory: its newest checkpoint; or one of its
    checkpoints), the agent built for ``env_id`` (default: the run's own env) in eval mode."""
    found = find_run(run, kind="ppo")
    run_dir, checkpoint = found.dir, found.checkpoint
    if checkpoint is None:
        raise CheckpointError(f"no checkpoint in {run_dir}: expected {run_dir / 'checkpoints' / 'step_N'}")
    agent, args = built_agent(found.config, env_id)
    load_weights(checkpoint, agent)
    return agent.to(default_device(device)).eval(), args, checkpoint


def built_agent(saved: dict, env_id: str | None = None) -> tuple[ActorCritic, Args]:
    """``(agent, args)`` as a PPO run's config.json (``saved``) builds them, for ``env_id`` (default: the
    run's own env), the weights drawn from torch's generator as it stands (``load_agent`` then loads a
    checkpoint's; seeded with the run's seed, they are the run's before training)."""
    args = Args(**saved["args"])
    env = make_env(env_id or args.env)
    try:
        agent = make_agent(args, saved.get("core_options", {}), env.observation_space, env.action_space)
    finally:
        env.close()
    return agent, args


def _reporter(total: int, label: str, progress: bool) -> Progress:
    return Progress(total, label, progress, unit="episode")


def choose_action(greedy: bool, action_seed: int | None, device) -> Choose:
    """How the evaluation and the GIF act: the most likely action (``greedy``), or one drawn from the
    policy, by a generator of its own seeded with ``action_seed`` (the same draws whatever ran before in
    the process: ``chronomem rl eval --seed``), or by torch's global generator where it is None (the
    experiments' evaluations, which follow their training's draws)."""
    if greedy:
        return most_likely
    if action_seed is None:
        return drawn
    generator = torch.Generator(device=device).manual_seed(action_seed)
    return partial(drawn, generator=generator)


@torch.inference_mode()
def evaluate(agent: ActorCritic, env_id: str, episodes: int = 100, seed: int = 0, num_envs: int = 16,
             greedy: bool = False, progress: bool = True, action_seed: int | None = None,
             **env_options) -> dict[str, Any]:
    """Mean return over ``episodes`` episodes of ``env_id`` (actions sampled, or the most likely with
    ``greedy``; ``action_seed``: ``choose_action``; ``env_options`` go to ``gym.make``, e.g.
    ``max_episode_steps``). Environment i runs a fixed share of the episodes, so short episodes are not
    favoured (counting the first ``episodes`` to end would be). Only the returns and lengths are kept,
    whatever the episodes' length, and each episode's ``success`` where the env reports one at its end
    (``info["final_info"]``: Visual Match's choice, Key-to-Door's door); ``success_rate`` is then theirs,
    else the share of positive returns. An ``ActorCritic`` also reports what its heads read, as means over every
    step played (``agents.heads_watched``): ``core_output_norm``, ``heads_no_gradient_policy`` and
    ``heads_no_gradient_value``."""
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f"--episodes must be a positive integer, got {episodes!r}")
    n = min(num_envs, episodes)
    quota = [episodes // n + (i < episodes % n) for i in range(n)]
    envs = make_vector_env(env_id, n, **env_options)
    reporter = _reporter(episodes, f"evaluating on {env_id}", progress)
    try:
        obs, _ = envs.reset(seed=env_seeds(seed, 0, n))
        device = next(agent.parameters()).device
        state = agent.initial_state(n, device)
        acting = Acting(agent, envs, obs, state, choose=choose_action(greedy, action_seed, device))
        running, lengths = np.zeros(n), np.zeros(n, dtype=np.int64)
        finished: list[list[tuple[float, int, float]]] = [[] for _ in range(n)]  # return, length, success
        counted = steps = 0
        heads: dict[str, float] = {}  # summed over the steps played
        with heads_watched(agent) if isinstance(agent, ActorCritic) else contextlib.nullcontext() as seen:
            while counted < episodes:
                step = acting.step()
                for name, value in (seen or {}).items():  # this step's (the hooks refresh it each call)
                    heads[name] = heads.get(name, 0.0) + value
                running, lengths = running + step.reward, lengths + 1
                done, final = step.done, step.info.get("final_info") or {}
                for i in np.flatnonzero(done):
                    if len(finished[i]) < quota[i]:
                        success = float(final["success"][i]) if final.get("_success", np.zeros(n, bool))[i] else np.nan
                        finished[i].append((float(running[i]), int(lengths[i]), success))
                        counted += 1
                running[done], lengths[done] = 0.0, 0
                steps += n
                reporter.update(counted, {"steps": str(steps)})
    finally:
        envs.close()
    reporter.close(only_if_long=True)
    episodes_seen = [episode for env in finished for episode in env]
    returns, lengths, successes = (np.array(column) for column in zip(*episodes_seen, strict=True))
    reported = not np.isnan(successes).any()
    return {"env": env_id, "episodes": episodes, "return_mean": round(float(returns.mean()), 4),
            "return_std": round(float(returns.std()), 4), "length_mean": round(float(lengths.mean()), 2),
            "success_rate": round(float(successes.mean() if reported else (returns > 0).mean()), 4),
            **{name: round(total / (steps // n), 4) for name, total in heads.items()}}


@torch.inference_mode()
def record_gif(agent: ActorCritic, env_id: str, path: str | Path, seed: int = 0, greedy: bool = False,
               fps: float = 8, progress: bool = True, action_seed: int | None = None,
               **env_options) -> dict[str, Any]:
    """Play one episode of ``env_id`` and write its frames (the env's ``rgb_array`` rendering) to ``path``
    as an animated GIF of ``fps`` frames a second (``action_seed`` and ``env_options`` as in
    ``evaluate``); returns the episode's return and length.

    Each frame goes to the file as soon as it is rendered (``chronomem.rl.gif.GifWriter``), so memory
    stays that of one frame however long the episode; frames smaller than ``MIN_GIF_SIDE`` px on their
    short side are enlarged by an integer factor (Ballet's 108 x 99 px become 540 x 495)."""
    try:
        from chronomem.rl.gif import GifWriter
    except ModuleNotFoundError:
        raise ModuleNotFoundError("--gif needs Pillow: pip install 'chronomem[rl]'") from None
    probe = make_env(env_id, **env_options)
    modes = probe.metadata.get("render_modes", [])
    probe.close()
    if "rgb_array" not in modes:
        raise ValueError(f"--gif: {env_id} renders no rgb_array frames (its render modes: {modes})")
    env = make_env(env_id, render_mode="rgb_array", **env_options)
    reporter = _reporter(1, f"GIF of {env_id}", progress)
    try:
        with GifWriter(path, fps) as gif:
            obs, _ = env.reset(seed=seed)
            gif.append(env.render())
            total, steps, done = 0.0, 0, False
            device = next(agent.parameters()).device
            state, choose = agent.initial_state(1, device), choose_action(greedy, action_seed, device)
            while not done:
                batched = obs_map(lambda x: np.asarray(x)[None], obs)
                action, _, _, state, _ = act(agent, batched, state, choose)
                obs, reward, terminated, truncated, _ = env.step(int(action[0]))
                gif.append(env.render())
                total, steps, done = total + float(reward), steps + 1, terminated or truncated
                reporter.update(int(done), {"steps": str(steps)})
    finally:
        env.close()
    reporter.close(only_if_long=True)
    return {"gif": str(path), "return": round(total, 4), "length": steps}
