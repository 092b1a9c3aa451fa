"""The per-cell encoder (``chronomem.ops.cell_map``), the reference against the folded map, in an agent.

Visual Match's quick agent (``chronomem.experiments.visual_match``: its board of 7x11 cells of 9
symbols, one-hot or empty, and its PPO settings), one thread, each part timed with the encoder's
``cell_impl`` set to ``"reference"`` and to ``"auto"`` (which folds this board) in alternating
repeats, medians shown:

* **acting**: one step of the agent for the 16 envs, ``[16, 1]``, no gradients;
* **learner step**: one minibatch of the rollout replayed (2 envs x 128 steps), forward, backward and
  the optimiser's step; with ``--optimizer`` both of Adam's CPU kernels, ``foreach`` and ``fused``;
* **update**: a whole PPO update, the rollout collected and learned (8 epochs x 8 minibatches), as PPO
  ran before the folded map (the reference map, foreach Adam) against now (folded, fused Adam).

    python benchmarks/cell_map.py [--core mlp] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from chronomem.threads import Measured


def agent_and_rollout(core: str):
    from chronomem.envs.make import make_vector_env
    from chronomem.experiments.visual_match import SCALES
    from chronomem.rl import ppo

    scale = SCALES["quick"]
    args = ppo.Args(env=scale.env_id(5), core=core, total_frames=10**6, seed=0, progress=False, **scale.ppo)
    envs = make_vector_env(args.env, args.num_envs)
    torch.manual_seed(0)
    agent = ppo.make_agent(args, scale.models[core], envs.single_observation_space, envs.single_action_space)
    agent.eval()
    obs, _ = envs.reset(seed=0)
    state = agent.initial_state(args.num_envs)
    rollout, obs, state = ppo.collect(agent, envs, obs, state, args.num_steps, None, args.recurrence,
                                      args.timeout, args.reward_part)
    return args, envs, agent, rollout, obs, state


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict:
    from chronomem.rl import ppo

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--core", default="mlp")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    settings, envs, agent, rollout, obs, state = agent_and_rollout(args.core)
    step_obs = {key: torch.as_tensor(value).unsqueeze(1) for key, value in obs.items()}
    optimizers = {kind: torch.optim.Adam(agent.parameters(), lr=1e-6, **{kind: True}) for kind in ("foreach", "fused")}
    minibatch = torch.arange(settings.num_envs // settings.num_minibatches)
    advantages, returns = ppo.gae(rollout, settings.gamma, settings.gae_lambda)

    def act():
        with torch.inference_mode():
            agent(step_obs, state)

    def learner_step(optimizer):
        logprobs, entropy, values, _ = ppo.replay_windows(agent, rollout, minibatch)
        loss = logprobs.mean() + entropy.mean() + values.mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def update():  # the reference map with foreach Adam (PPO before the folded map), the folded with fused
        collected, *_ = ppo.collect(agent, envs, obs, state, settings.num_steps, None, settings.recurrence,
                                    settings.timeout, settings.reward_part)
        optimizer = optimizers["foreach" if agent.encoder.cell_impl == "reference" else "fused"]
        with ppo.differentiable_on_cudnn(agent):
            ppo.learn(agent, optimizer, collected, advantages, returns, settings)

    parts = {"acting step": act, "learner step, foreach Adam": lambda: learner_step(optimizers["foreach"]),
             "learner step, fused Adam": lambda: learner_step(optimizers["fused"]),
             "PPO update, foreach Adam with the reference, fused folded": update}
    rows = {}
    with Measured(threads=1, log=print):
        for name, fn in parts.items():
            seconds = {}
            for impl in ("reference", "auto", "reference", "auto"):  # alternating: a change of load hits both
                agent.encoder.cell_impl = impl
                seconds.setdefault(impl, []).append(timed(fn, args.repeats if not name.startswith("PPO") else 1))
            reference, folded = (min(seconds[impl]) for impl in ("reference", "auto"))
            rows[name] = {"reference_ms": 1000 * reference, "folded_ms": 1000 * folded, "speedup": reference / folded}
            print(f"{args.core} agent, {name}: {1000 * reference:.2f} ms with the reference map, "
                  f"{1000 * folded:.2f} ms folded ({reference / folded:.2f}x)", flush=True)
    envs.close()
    return rows


if __name__ == "__main__":
    main()
