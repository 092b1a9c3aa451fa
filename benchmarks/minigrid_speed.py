"""A MiniGrid agent's frame on one CPU thread, before and after its two fast paths, side by side.

On DoorKey-5x5 with ``benchmarks/ppo_peer.py``'s LSTM agent and settings (16 envs x 128 steps, 4 epochs of
8 minibatches), each part timed in alternating repeats, medians shown:

* **view**: one observation's 7x7 view, MiniGrid's ``gen_obs`` (slice, rotate, occlude, encode) against
  ``chronomem.envs.wrappers.agent_view`` (``make_env``'s ``view="fast"``), over the states of a random
  episode;
* **envs**: one step of the 16 envs (``SyncVectorEnv`` with ``make_env``'s wrappers), per frame, with
  ``view="minigrid"`` and ``view="fast"``;
* **encoder**: the encoder's forward and backward on one minibatch (2 envs x 128 steps) with
  ``cell_impl="reference"`` and ``"auto"`` (folded: ``chronomem.ops.embed_conv``);
* **update**: a whole PPO update of 2,048 frames (the rollout collected and learned) as it ran before
  both (MiniGrid's view, the reference encoder) and now; its split into env, acting and learning.

    OMP_NUM_THREADS=1 python benchmarks/minigrid_speed.py [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from chronomem.threads import Measured

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling script, also when loaded as a module
from cell_map import timed  # noqa: E402  (the median of repeats after a warm-up)

ENV = "MiniGrid-DoorKey-5x5-v0"


def view_states(steps: int):
    """A DoorKey env and the agent's positions and directions along a random episode."""
    import gymnasium as gym
    import minigrid  # noqa: F401

    env = gym.make(ENV)
    env.reset(seed=0)
    rng, states = np.random.default_rng(0), []
    for _ in range(steps):
        base = env.unwrapped
        states.append((base.agent_pos, base.agent_dir))
        if any(env.step(int(rng.integers(7)))[2:4]):
            env.reset()
    return env.unwrapped, states


def ppo_setup(view: str, cell_impl: str, num_envs: int, num_steps: int):
    from chronomem.envs.make import make_vector_env
    from chronomem.rl import ppo

    args = ppo.Args(env=ENV, core="lstm", dim=64, hidden=64, num_envs=num_envs, num_steps=num_steps, update_epochs=4,
                    num_minibatches=max(1, num_envs // 2), lr=1e-3, anneal_lr=False, seed=1, progress=False)
    envs = make_vector_env(ENV, num_envs, view=view)
    torch.manual_seed(1)
    agent = ppo.make_agent(args, {}, envs.single_observation_space, envs.single_action_space)
    agent.encoder.cell_impl = cell_impl
    optimizer = ppo.make_optimizer(agent, args, torch.device("cpu"))
    obs, _ = envs.reset(seed=list(range(num_envs)))
    return args, envs, agent, optimizer, obs, agent.initial_state(num_envs)


def main(argv: list[str] | None = None) -> dict:
    from minigrid.minigrid_env import MiniGridEnv

    from chronomem.envs.wrappers import agent_view
    from chronomem.rl import ppo

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--json", help="write the conditions and the times here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = {}
    with Measured(threads=1, log=print) as measured:
        base, states = view_states(200)

        def views(fn):
            def run():
                for position, direction in states:
                    base.agent_pos, base.agent_dir = position, direction
                    fn(base)
            return run

        minigrid_view = timed(views(lambda env: MiniGridEnv.gen_obs(env)["image"]), args.repeats) / len(states)
        fast_view = timed(views(agent_view), args.repeats) / len(states)
        result["view_us"] = {"minigrid": minigrid_view * 1e6, "fast": fast_view * 1e6}

        setups = {name: ppo_setup(view, impl, args.num_envs, args.num_steps)
                  for name, view, impl in [("before", "minigrid", "reference"), ("after", "fast", "auto")]}
        actions = np.random.default_rng(0).integers(0, 7, size=(64, args.num_envs))

        def env_steps(envs):
            def run():
                for a in actions:
                    envs.step(a)
            return run

        result["env_us_per_frame"] = {name: timed(env_steps(s[1]), args.repeats) / actions.size * 1e6
                                      for name, s in setups.items()}

        encoder_ms, update_s, split = {}, {}, {}
        for name, (ppo_args, envs, agent, optimizer, obs, state) in setups.items():
            rollout, obs, state = ppo.collect(agent, envs, obs, state, ppo_args.num_steps)
            setups[name] = (ppo_args, envs, agent, optimizer, obs, state)  # the envs moved on
            replay = {k: v[:2] for k, v in rollout.obs.items()}  # one minibatch: 2 envs x T steps

            def encode_backward(agent=agent, replay=replay):
                agent.encoder(replay).square().mean().backward()

            encoder_ms[name] = timed(encode_backward, args.repeats) * 1e3
        for _ in range(args.repeats):  # whole updates, before and after alternating
            for name, (ppo_args, envs, agent, optimizer, obs, state) in setups.items():
                start = time.perf_counter()
                rollout, obs, state = ppo.collect(agent, envs, obs, state, ppo_args.num_steps)
                tic = time.perf_counter()
                advantages, returns = ppo.gae(rollout, ppo_args.gamma, ppo_args.gae_lambda)
                ppo.learn(agent, optimizer, rollout, advantages, returns, ppo_args)
                seconds = time.perf_counter() - start
                setups[name] = (ppo_args, envs, agent, optimizer, obs, state)
                update_s.setdefault(name, []).append(seconds)
                split.setdefault(name, []).append((rollout.env_seconds, tic - start - rollout.env_seconds,
                                                   seconds - (tic - start)))
        result["encoder_ms"] = encoder_ms
        result["update_s"] = {name: statistics.median(times) for name, times in update_s.items()}
        result["update_split_s"] = {name: [statistics.median(part) for part in zip(*rows, strict=True)]
                                    for name, rows in split.items()}
    result["conditions"] = measured.record()

    frames = args.num_envs * args.num_steps
    print(f"one thread, {ENV}, the LSTM agent, {args.num_envs} envs x {args.num_steps} steps, medians of "
          f"{args.repeats}")
    print(f"{'part':<34} {'before':>10} {'after':>10} {'before / after':>15}")
    rows = [("view (us per observation)", result["view_us"]["minigrid"], result["view_us"]["fast"]),
            ("envs (us per frame)", *result["env_us_per_frame"].values()),
            ("encoder fwd+bwd, 256 frames (ms)", *encoder_ms.values()),
            ("PPO update (s)", *result["update_s"].values())]
    for label, before, after in rows:
        print(f"{label:<34} {before:>10.3f} {after:>10.3f} {before / after:>14.2f}x")
    for name, (env, acting, learning) in result["update_split_s"].items():
        print(f"{name}: env {env:.3f} s, acting {acting:.3f} s, learning {learning:.3f} s; "
              f"{frames / result['update_s'][name]:,.0f} frames/s")
    if args.json:
        with open(args.json, "x") as f:  # never overwrite another run's file
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
