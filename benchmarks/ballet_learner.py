"""One learner step of the Ballet agent, paper 001's CNN against the CPU-sized agent, and the share of
it that the reconstruction (App. A.1) takes.

A learner step is one replay of a minibatch, ``[16 envs, 64 steps]`` of the symbolic level mixture,
forward and backward, with the LSTM core of ballet-rl's quick scale (width 64, 2 layers). Each agent is
timed with its reconstruction loss and without it (``reconstruction=0``); the difference is the
decoder's share. Median of ``--repeats`` steps after two of warm-up, one thread (docs/rl.md, "A Ballet
agent sized for a CPU").

    python benchmarks/ballet_learner.py [--repeats 6]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from chronomem.threads import Measured

ENV = "chronomem/Ballet-mixture-symbolic-v0"
AGENTS = {"paper 001's CNN, every step reconstructed": dict(visual="cnn"),
          "per-cell encoder, one step in 8 reconstructed": dict(visual="cells", reconstruct_every=8)}


def minibatch(envs, steps: int) -> dict:
    obs, _ = envs.reset(seed=0)
    frames = [obs]
    for _ in range(steps - 1):
        obs, *_ = envs.step(envs.action_space.sample())
        frames.append(obs)
    return {key: torch.as_tensor(np.stack([f[key] for f in frames], 1)) for key in frames[0]}


def learner_step_seconds(args, envs, batch: dict, repeats: int) -> float:
    from chronomem.rl.ppo import make_agent

    torch.manual_seed(0)
    agent = make_agent(args, {}, envs.single_observation_space, envs.single_action_space)
    state, done = agent.initial_state(envs.num_envs), torch.zeros(batch["instruction"].shape, dtype=torch.bool)
    times = []
    for i in range(repeats + 2):
        start = time.perf_counter()
        logits, values, _, auxiliary = agent(batch, state, done=done, return_auxiliary=True)
        loss = logits.mean() + values.mean()
        if auxiliary is not None:
            loss = loss + auxiliary
        loss.backward()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict:
    from chronomem.envs.make import make_vector_env
    from chronomem.rl.ppo import Args

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    envs = make_vector_env(ENV, args.envs)
    batch = minibatch(envs, args.steps)
    rows = {}
    with Measured(threads=1, log=print):
        for name, options in AGENTS.items():
            settings = dict(env=ENV, core="lstm", dim=64, depth=2, heads=4, hidden=128, **options)
            with_loss = learner_step_seconds(Args(**settings), envs, batch, args.repeats)
            without = learner_step_seconds(Args(**settings, reconstruction=0.0), envs, batch, args.repeats)
            rows[name] = {"ms": 1000 * with_loss, "ms_without_reconstruction": 1000 * without,
                          "reconstruction_share": (with_loss - without) / with_loss}
            print(f"{name}: {1000 * with_loss:.1f} ms a learner step, {1000 * without:.1f} ms without the "
                  f"reconstruction: the reconstruction is {100 * rows[name]['reconstruction_share']:.0f}%", flush=True)
    first, second = rows.values()
    print(f"learner step, CPU-sized / CNN: {second['ms'] / first['ms']:.3f} ({first['ms'] / second['ms']:.1f}x faster)")
    envs.close()
    return rows


if __name__ == "__main__":
    main()
