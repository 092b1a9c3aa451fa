"""How a trained Visual Match agent chooses, case by case. Each of the 18 cases (the three squares'
colour order, 6, times the target square, 3) is played ``--episodes`` times with forced layouts (the
start, cue cell and apples drawn), and each episode's end is counted as right (the target's square),
wrong (another square) or none (no square touched before the reward phase's timer). A policy that has
not learned the choice is wrong about twice as often as right; one that has learned it except for some
cases shows them here (docs/rl.md, "Visual Match": the memoryless control's 77-82%).

    python benchmarks/visual_match_cases.py RUN [--episodes 10] [--greedy] [--env ID] [--jsonl FILE]

RUN is a PPO run directory (its newest checkpoint) or one of its checkpoints, e.g.
``docs/measured/visual-match/quick-run-reconstruction/control/mlp-seed1``. Passive, symbolic envs only (the squares are
read off the whole board).
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections import Counter

import numpy as np
import torch

OUTCOMES = ("right", "wrong", "none")


def touched_square(grid: np.ndarray, squares: tuple, colour_channels: np.ndarray) -> bool:
    """Touching any square hides all three: True once none of them shows a colour."""
    return not any(grid[cell][colour_channels].any() for cell in squares)


@torch.inference_mode()
def play_cases(agent, env_id: str, episodes: int, greedy: bool, seed: int = 0) -> dict:
    """``{"total": {outcome: count}, "cases": {case: {outcome: count}}}`` of ``agent`` (an ``ActorCritic``,
    or anything called ``logits, value, state = agent(obs, state)`` with ``initial_state(1)``) on
    ``env_id``, ``episodes`` per case."""
    import gymnasium as gym

    import chronomem.envs  # noqa: F401  (registers the ids)
    from chronomem.envs.tvt import COLOUR_CHANNELS, NUM_COLOURS, SQUARE_CELLS, Layout, TVTEnv, sample_layout

    env = gym.make(env_id)
    game = env.unwrapped
    if not isinstance(game, TVTEnv) or game.game != "visual_match" or game.mode != "passive" \
            or game.observation != "symbolic":
        raise ValueError(f"--env must be a passive, symbolic Visual Match id, got {env_id!r}")
    rng, actions = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    cases: dict[str, Counter] = {}
    for order in itertools.permutations(range(NUM_COLOURS)):
        for target in range(NUM_COLOURS):
            counts = Counter()
            for _ in range(episodes):
                drawn = sample_layout(rng, "visual_match", game.num_apples, game.apple_rewards, game.cue_cell)
                layout = Layout(start=drawn.start, apples=drawn.apples, apple_reward=drawn.apple_reward,
                                cue=drawn.cue, colours=order, target=target)
                obs, _ = env.reset(options={"layout": layout})
                state, done, info = agent.initial_state(1), False, {}
                while not done:
                    batch = {key: torch.as_tensor(value)[None, None] for key, value in obs.items()}
                    logits, _, state = agent(batch, state)
                    logits = logits[0, 0]
                    action = logits.argmax() if greedy else torch.multinomial(logits.softmax(-1), 1, generator=actions)
                    obs, _, terminated, truncated, info = env.step(int(action))
                    done = terminated or truncated
                touched = touched_square(obs["grid"], SQUARE_CELLS, COLOUR_CHANNELS)
                counts["right" if info.get("success") else "wrong" if touched else "none"] += 1
            cases[f"colours {order}, target {target}"] = counts
    env.close()
    total = sum(cases.values(), Counter())
    return {"env": env_id, "greedy": greedy, "episodes_per_case": episodes, "total": {k: total[k] for k in OUTCOMES},
            "cases": {name: {k: c[k] for k in OUTCOMES} for name, c in cases.items()}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    parser.add_argument("--episodes", type=int, default=10, help="episodes per case (default 10)")
    parser.add_argument("--greedy", action="store_true", help="the most likely action (default: sampled)")
    parser.add_argument("--env", default=None, help="Gymnasium id (default: the run's env)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the layouts and of the sampled actions")
    parser.add_argument("--jsonl", help="append the whole record, every case's counts, to this file")
    a = parser.parse_args(argv)
    if a.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {a.episodes}")
    torch.set_num_threads(1)
    from chronomem.rl.evaluate import load_agent

    agent, args, checkpoint = load_agent(a.run, a.env, device="cpu")
    found = {"run": a.run, "checkpoint": checkpoint.name, **play_cases(agent, a.env or args.env, a.episodes, a.greedy,
                                                                         a.seed)}
    for name, counts in found["cases"].items():
        print(f"{name}: " + ", ".join(f"{k} {counts[k]}" for k in OUTCOMES))
    print(json.dumps({k: v for k, v in found.items() if k != "cases"}))
    if a.jsonl:
        with open(a.jsonl, "a") as f:
            f.write(json.dumps(found) + "\n")


if __name__ == "__main__":
    main()
