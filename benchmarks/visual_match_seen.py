"""Does an agent see Visual Match's colour before it must remember it? In the active mode the colour sits on
one of the explore room's 26 wall cells and the agent sees a 5x5 window around itself, so an episode's
explore phase may end without the colour ever in view; no memory can then choose better than chance (1/3).
For a trained agent (``RUN``: a PPO run directory or checkpoint) or a random policy (``--random ENV``), the
script plays ``--episodes`` episodes (actions drawn, seeded) and prints the share whose explore phase showed
the colour, and the right choices among the episodes that saw it and among those that did not: an agent at
chance among those that saw it does not use what it saw (docs/rl.md, "The active mode: first probes").

    python benchmarks/visual_match_seen.py RUN [RUN ...] [--episodes 400] [--seed 10000] [--jsonl FILE]
    python benchmarks/visual_match_seen.py --random chronomem/VisualMatch-active-d5-v0 --episodes 1000
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch


@torch.inference_mode()
def seen_and_chosen(agent, env_id: str, episodes: int, seed: int = 0) -> dict:
    """``agent`` (an ``ActorCritic``, or anything called ``logits, value, state = agent(obs, state)`` with
    ``initial_state(1)``; None: uniformly random actions) on the symbolic Visual Match id ``env_id`` for
    ``episodes`` episodes: how many showed the colour during the explore phase, and how many of those and
    of the others ended on the right square."""
    import gymnasium as gym

    import chronomem.envs  # noqa: F401  (registers the ids)
    from chronomem.envs.tvt import COLOUR_CHANNELS, TVTEnv

    env = gym.make(env_id)
    game = env.unwrapped
    if not isinstance(game, TVTEnv) or game.game != "visual_match" or game.observation != "symbolic":
        raise ValueError(f"env_id must be a symbolic Visual Match id, got {env_id!r}")
    rng, actions = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    counts = {"seen": [0, 0], "not seen": [0, 0]}  # [episodes, right choices]
    for episode in range(episodes):
        obs, info = env.reset(seed=seed + episode)
        state = None if agent is None else agent.initial_state(1)
        seen, done = False, False
        while not done:
            # in the explore phase the cue is the only coloured cell on the board
            seen |= info["phase"] == 0 and bool(obs["grid"][..., COLOUR_CHANNELS].any())
            if agent is None:
                action = int(rng.integers(env.action_space.n))
            else:
                batch = {key: torch.as_tensor(value)[None, None] for key, value in obs.items()}
                logits, _, state = agent(batch, state)
                action = int(torch.multinomial(logits[0, 0].softmax(-1), 1, generator=actions))
            obs, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
        row = counts["seen" if seen else "not seen"]
        row[0], row[1] = row[0] + 1, row[1] + bool(info.get("success"))
    env.close()
    rate = {name: None if n == 0 else round(100 * right / n, 1) for name, (n, right) in counts.items()}
    return {"env": env_id, "episodes": episodes, "seen": round(100 * counts["seen"][0] / episodes, 1),
            "right": round(100 * (counts["seen"][1] + counts["not seen"][1]) / episodes, 1),
            "right_when_seen": rate["seen"], "right_when_not_seen": rate["not seen"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", help="PPO run directories or checkpoints")
    parser.add_argument("--random", metavar="ENV", help="a uniformly random policy on this id instead")
    parser.add_argument("--env", default=None, help="Gymnasium id for the runs (default: each run's env)")
    parser.add_argument("--episodes", type=int, default=400, help="episodes per agent (default 400)")
    parser.add_argument("--seed", type=int, default=10000, help="seed of the episodes and of the drawn actions")
    parser.add_argument("--jsonl", help="append one record per agent to this file")
    a = parser.parse_args(argv)
    if a.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {a.episodes}")
    if bool(a.runs) == bool(a.random):
        parser.error("give run directories or --random ENV (one of the two)")
    torch.set_num_threads(1)
    from chronomem.rl.evaluate import load_agent

    found = []
    if a.random:
        found.append({"run": "random policy", **seen_and_chosen(None, a.random, a.episodes, a.seed)})
    for run in a.runs:
        agent, args, checkpoint = load_agent(run, a.env, device="cpu")
        found.append({"run": run, "checkpoint": checkpoint.name,
                      **seen_and_chosen(agent, a.env or args.env, a.episodes, a.seed)})
    for record in found:
        print(json.dumps(record))
        if a.jsonl:
            with open(a.jsonl, "a") as f:
                f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
