"""Can an agent without memory solve MiniGrid's Memory task? A scripted policy that reads only the
current 7x7 view, on MemoryS7 / S9 / S11 / S13.

The Memory env (minigrid ``MemoryEnv``): a cue object (key or ball) in a small start room, a hallway,
and at its end a junction with a key and a ball, one a step north and one a step south; stepping next
to the one that matches the cue pays ``1 - 0.9 * steps / max_steps``, next to the other ends the
episode with 0. The agent sees 7 cells ahead and 3 to each side. The script shows two facts:

* **whether the cue is in view from the junction**, facing back west through the start room's door
  (MiniGrid's own ``gen_obs`` and occlusion): it is in MemoryS7 and S9, not in S11 and S13;
* **what a memoryless policy scores.** At the junction the policy turns north first (it cannot yet see
  the cue); facing north or south it steps forward with probability ``p`` and otherwise turns back
  west; facing west it reads the cue and the two end objects (in view at its sides) and turns to the
  matching one. Facing north after that turn looks the same as facing north on arrival, so the policy
  is stochastic there: it succeeds with probability ``1 - p / 2`` where the cue is in view, at the
  price of a few turns, and with 1/2 where it is not.

The policy is written with the env's state for brevity; ``view_determined`` checks that it is a
function of the view alone: over every layout (cue x end order) and every reachable cell and heading,
two states with the same view get the same action distribution.

This is why a memoryless PPO agent can pass MemoryS7 (docs/rl.md, "minigrid-transfer"): the
junction's view holds the cue, so only the larger sizes demand memory of the agent.

    python benchmarks/minigrid_memory_reactive.py [--episodes 1000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

SIZES = (7, 9, 11, 13)  # run by default
REGISTERED = (7, 9, 11, 13, 15, 17)  # MiniGrid's MemoryS{size}-v0 ids
FORWARD, LEFT, RIGHT = 2, 0, 1  # MiniGrid's actions
EAST, SOUTH, WEST, NORTH = 0, 1, 2, 3  # MiniGrid's headings


def make(size: int):
    import gymnasium as gym
    import minigrid  # noqa: F401  (registers the envs)

    return gym.make(f"MiniGrid-MemoryS{size}-v0").unwrapped


def reset_env(size: int, seed: int = 0):
    """A reset MemoryS{size} env."""
    env = make(size)
    env.reset(seed=seed)
    return env


def junction(env) -> tuple[int, int]:
    """The cell between the two end objects (``MemoryEnv`` without a random length)."""
    return env.width - 2, env.height // 2


def cue_in_view(env) -> bool:
    """Whether the agent, at the junction facing west, sees the start room's cue (MiniGrid's view)."""
    env.agent_pos, env.agent_dir = np.array(junction(env)), WEST
    return bool(env.agent_sees(1, env.height // 2 - 1))


def policy(env, p_forward: float) -> dict[int, float]:
    """The memoryless policy's action distribution in the env's current state."""
    x, y = (int(v) for v in env.agent_pos)
    if (x, y) != junction(env):  # the hallway, always entered heading east
        return {FORWARD: 1.0}
    if env.agent_dir == EAST:
        return {LEFT: 1.0}
    if env.agent_dir in (NORTH, SOUTH):
        back_west = RIGHT if env.agent_dir == SOUTH else LEFT
        return {FORWARD: p_forward, back_west: 1.0 - p_forward} if p_forward < 1 else {FORWARD: 1.0}
    if not env.agent_sees(1, env.height // 2 - 1):  # facing west: no cue in view, a coin flip
        return {RIGHT: 0.5, LEFT: 0.5}
    match_north = env.success_pos[1] < y  # read in the view: the cue and the end object at each side
    return {RIGHT: 1.0} if match_north else {LEFT: 1.0}


def view_determined(size: int, p_forward: float = 0.2, acting=policy) -> bool:
    """Every pair of reachable states with the same view gets the same action distribution from
    ``acting(env, p_forward)``."""
    env = make(size)
    seen: dict[bytes, dict[int, float]] = {}
    layouts, seed = set(), 0
    while len(layouts) < 4:  # the cue's type x the order of the end objects
        env.reset(seed=seed)
        seed += 1
        layout = (env.grid.get(1, env.height // 2 - 1).type, env.success_pos)
        if layout in layouts:
            continue
        layouts.add(layout)
        jx, jy = junction(env)
        states = [((x, jy), EAST) for x in range(1, jx)] + [((jx, jy), d) for d in (EAST, SOUTH, WEST, NORTH)]
        for pos, heading in states:
            env.agent_pos, env.agent_dir = np.array(pos), heading
            view = env.gen_obs()["image"].tobytes()
            action = acting(env, p_forward)
            if seen.setdefault(view, action) != action:
                return False
    return True


def play(size: int, p_forward: float, episodes: int, seed: int = 0) -> dict:
    """Success rate and mean return of the memoryless policy over ``episodes`` episodes."""
    env, rng = make(size), np.random.default_rng(seed)
    returns, successes = [], 0
    for episode in range(episodes):
        env.reset(seed=seed * 100_003 + episode)
        total, done = 0.0, False
        while not done:
            distribution = policy(env, p_forward)
            action = int(rng.choice(list(distribution), p=list(distribution.values())))
            _, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
        successes += total > 0
    return {"success": successes / episodes, "return_mean": float(np.mean(returns))}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--p-forward", type=float, nargs="+", default=[0.1, 0.2, 0.5, 1.0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--json", help="write the results here (never overwrites a file)")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        raise ValueError(f"--episodes: expected a positive count, got {args.episodes}")
    if not all(0 < p <= 1 for p in args.p_forward):
        raise ValueError(f"--p-forward: expected probabilities in (0, 1], got {args.p_forward}")
    if not set(args.sizes) <= set(REGISTERED):
        raise ValueError(f"--sizes: expected some of MiniGrid's Memory sizes {REGISTERED}, got {args.sizes}")
    if args.json and Path(args.json).exists():
        raise FileExistsError(f"--json: {args.json} exists; choose another path")
    result = {"episodes": args.episodes, "sizes": {}}
    print(f"memoryless policy, {args.episodes} episodes per cell: success % (mean return)")
    print("| size | cue in view from the junction | view-determined | "
          + " | ".join(f"p = {p}" for p in args.p_forward) + " |")
    print("|---|---|---|" + "---|" * len(args.p_forward))
    for size in args.sizes:
        row = {"cue_in_view": cue_in_view(reset_env(size)),
               "view_determined": view_determined(size),
               "play": {str(p): play(size, p, args.episodes) for p in args.p_forward}}
        result["sizes"][str(size)] = row
        cells = " | ".join(f"{r['success']:.1%} ({r['return_mean']:.2f})" for r in row["play"].values())
        print(f"| MemoryS{size} | {row['cue_in_view']} | {row['view_determined']} | {cells} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
