"""Frames per second of the whole PPO loop (rollout + learning) per core: the quick settings the RL
experiments had before issue 37 ("before") against today's (``after``), side by side in one run.

For each environment (Ballet symbolic, the level mixture; POPGym RepeatPreviousEasy; MiniGrid
DoorKey-5x5) and each core, ``chronomem.rl.ppo.train`` runs ``--updates`` updates after one update of
warm-up with each setting, one after the other, in this process with one torch thread. Reported:
frames per second over the timed updates, the ratio after / before, and where the time went (the
share of envs.step, of acting and of learning, from the loop's own ``seconds_env`` / ``seconds_act`` /
``seconds_learn`` columns).

"before" is frozen here as the experiments' quick settings were (16 environments stepped by
Gymnasium's ``SyncVectorEnv``, paper 001's CNN and a reconstruction of every step on Ballet). "after"
is read from ``ballet-rl``'s, ``popgym``'s and ``minigrid-transfer``'s ``SCALES["quick"]`` as the code has
them now; on Ballet that is the CPU-sized agent of docs/rl.md ("A Ballet agent sized for a CPU"): 64
native envs, the per-cell encoder, one step in 8 reconstructed.

    python benchmarks/agent_throughput.py [--envs ballet popgym doorkey] [--cores lstm htm ...]
                                          [--updates 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from chronomem.threads import Measured

CORES = ("lstm", "relevance-lstm", "mem-lstm", "transformer-xl", "gtrxl", "tlb", "htm")
CORE_OPTIONS = {  # the options the experiments give each core (ballet-rl's for the three it runs)
    "lstm": {}, "relevance-lstm": {"buffer_size": 5, "relevant_size": 5}, "mem-lstm": {},
    "transformer-xl": {"mem_len": 256}, "gtrxl": {"mem_len": 256}, "tlb": {},
    "htm": {"chunk_size": 16, "top_k": 4, "memory_size": 64},
}
BALLET_OPTIONS = {"htm": {"chunk_size": 32, "top_k": 8, "memory_size": 40}}
ENVS = {
    "ballet": "chronomem/Ballet-mixture-symbolic-v0",
    "popgym": "popgym-RepeatPreviousEasy-v0",
    "doorkey": "MiniGrid-DoorKey-5x5-v0",
}
# The quick settings before issue 37 (the experiments' SCALES["quick"] at commit 78f5cf4).
BEFORE = {
    "ballet": dict(dim=64, depth=2, heads=4, hidden=128, num_envs=16, num_steps=64, num_minibatches=4,
                   update_epochs=4, lr=3e-4, ent_coef=1e-3, vectorization="sync"),
    "popgym": dict(dim=64, depth=1, heads=4, hidden=64, num_envs=16, num_steps=128, num_minibatches=4,
                   update_epochs=4, lr=5e-4, vectorization="sync"),
    "doorkey": dict(dim=64, hidden=64, num_envs=16, num_steps=128, num_minibatches=8, vectorization="sync"),
}


def after_settings(env: str) -> dict:
    """Today's settings for ``env``: the quick scale of its experiment (on Ballet the CPU-sized agent,
    docs/rl.md "A Ballet agent sized for a CPU")."""
    if env == "ballet":
        from chronomem.experiments.ballet_rl import SCALES

        return dict(SCALES["quick"].ppo)
    if env == "popgym":
        from chronomem.experiments.popgym import SCALES

        return dict(SCALES["quick"].ppo)
    from chronomem.experiments.minigrid import SCALES, ppo_settings

    return ppo_settings(SCALES["quick"])


def options(env: str, core: str) -> dict:
    return BALLET_OPTIONS.get(core, CORE_OPTIONS[core]) if env == "ballet" else CORE_OPTIONS[core]


def split(measured: dict) -> str:
    """``env/act/learn`` shares of the loop's time, in %."""
    return "/".join(f"{100 * measured['share'][part]:.0f}" for part in ("env", "act", "learn"))


def measure(env: str, core: str, ppo: dict, updates: int, seed: int) -> dict:
    """Frames per second over ``updates`` updates after one of warm-up, and the loop's time split."""
    from chronomem.rl.ppo import Args, train

    args = Args(env=ENVS[env], core=core, seed=seed, progress=False, torch_threads=1, **ppo)
    args.total_frames = args.frames_per_update * (updates + 1)
    rows = train(args, options(env, core)).history[1:]  # the first update builds caches and warms up
    seconds = {part: sum(row[f"seconds_{part}"] for row in rows) for part in ("env", "act", "learn")}
    total = sum(seconds.values())
    frames = args.frames_per_update * len(rows)
    return {"frames_per_second": frames / total, "frames": frames,
            "share": {part: value / total for part, value in seconds.items()}}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--cores", nargs="+", default=list(CORES), choices=list(CORES))
    parser.add_argument("--updates", type=int, default=2, help="timed updates per setting (after one of warm-up)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the records to this file")
    args = parser.parse_args(argv)
    if args.updates < 1:
        raise ValueError(f"--updates must be >= 1, got {args.updates}")
    torch.set_num_threads(1)
    records = []
    with Measured(threads=1, log=print) as conditions:
        print(f"{'env':8} {'core':15} {'before f/s':>10} {'after f/s':>10} {'ratio':>6}   "
              "split before (env/act/learn)  after")
        for env in args.envs:
            for core in args.cores:
                before = measure(env, core, BEFORE[env], args.updates, args.seed)
                after = measure(env, core, after_settings(env), args.updates, args.seed)
                ratio = after["frames_per_second"] / before["frames_per_second"]
                records.append({"env": env, "core": core, "before": before, "after": after, "ratio": ratio})
                print(f"{env:8} {core:15} {before['frames_per_second']:10.0f} {after['frames_per_second']:10.0f} "
                      f"{ratio:6.2f}   {split(before):>28}  {split(after)}", flush=True)
    ratios = {env: [r["ratio"] for r in records if r["env"] == env] for env in args.envs}
    for env, values in ratios.items():
        if values:
            mean = math.exp(sum(map(math.log, values)) / len(values))
            print(f"{env}: after / before, geometric mean over cores {mean:.2f}x, lowest {min(values):.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"conditions": conditions.record(), "records": records}, f, indent=1)
    return records


if __name__ == "__main__":
    main()
