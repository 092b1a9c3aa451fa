"""Environment steps per second of Ballet: the native vector env against SyncVectorEnv, side by side.

Both play the same id with ``B`` envs (``--num-envs``, default 256) and same-step autoreset, from the
same seeds, under the same uniformly random actions (drawn beforehand, so drawing them is not timed):

* ``native``: ``BalletVectorEnv`` (``chronomem.envs.ballet_vector``), what
  ``chronomem.envs.make.make_vector_env`` builds for a Ballet id: one numpy step for all ``B`` episodes;
* ``sync``: ``SyncVectorEnv`` over ``B`` ``BalletEnv`` (``make_vector_env(..., vectorization="sync")``):
  the way every Ballet vector env was built before, one Python ``BalletEnv.step`` per env.

The two give the same observations step for step (``tests/test_envs_vector.py``), so only the time
differs. Rounds are interleaved (one round of ``--steps`` steps of each way in turn, after a warm-up
round), so a change of the machine's load hits both alike; the table shows the median env steps/s
(``B * steps / seconds``) over ``--rounds`` and the ratio native / sync. One torch thread (chronomem
imports torch; the environments themselves use only numpy, and no BLAS); run with ``OMP_NUM_THREADS=1``.

    OMP_NUM_THREADS=1 python benchmarks/ballet_env_speed.py                       # symbolic and pixels, B = 256
    OMP_NUM_THREADS=1 python benchmarks/ballet_env_speed.py --observations symbolic --num-envs 64 --level 8_delay48
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from chronomem.envs.ballet_world import LEVELS, MIXTURE, ballet_id
from chronomem.envs.make import make_vector_env
from chronomem.threads import Measured

WAYS = ("native", "sync")


def steps_per_second(envs, actions: np.ndarray) -> float:
    """``B * T / seconds`` of ``T`` steps of ``envs`` under ``actions [T, B]``."""
    start = time.perf_counter()
    for row in actions:
        envs.step(row)
    return actions.size / (time.perf_counter() - start)


def measure(env_id: str, num_envs: int, steps: int, rounds: int, seed: int) -> dict:
    """Median env steps/s of each way over ``rounds`` interleaved rounds (after one warm-up round)."""
    envs = {way: make_vector_env(env_id, num_envs, vectorization=way) for way in WAYS}
    rng = np.random.default_rng(seed)
    rates: dict[str, list[float]] = {way: [] for way in WAYS}
    try:
        for way in WAYS:
            envs[way].reset(seed=seed)
        for repeat in range(rounds + 1):  # the first round is a warm-up
            actions = rng.integers(8, size=(steps, num_envs))
            for way in WAYS:
                rate = steps_per_second(envs[way], actions)
                if repeat:
                    rates[way].append(rate)
    finally:
        for env in envs.values():
            env.close()
    median = {way: statistics.median(rates[way]) for way in WAYS}
    return {"env": env_id, "num_envs": num_envs, "steps_per_second": median,
            "ratio": median["native"] / median["sync"], "rounds": rates}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-envs", type=int, default=256, help="environments B")
    p.add_argument("--level", default="2_delay16", choices=[*LEVELS, MIXTURE])
    p.add_argument("--observations", nargs="+", choices=["symbolic", "pixels"], default=["symbolic", "pixels"])
    p.add_argument("--steps", type=int, default=20, help="steps per round (each of B envs)")
    p.add_argument("--rounds", type=int, default=7, help="timed rounds of each way (median)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="OUT", help="write the config and the table here")
    args = p.parse_args(argv)
    for name in ("num_envs", "steps", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    torch.set_num_threads(1)
    rows = []
    with Measured(log=print) as measured:
        print(f"Ballet {args.level}, B = {args.num_envs}, random actions, median of {args.rounds} interleaved "
              f"rounds of {args.steps} steps")
        print(f"  {'observation':12s} {'native steps/s':>15s} {'sync steps/s':>13s} {'native / sync':>14s}")
        for observation in args.observations:
            row = measure(ballet_id(args.level, observation), args.num_envs, args.steps, args.rounds, args.seed)
            rows.append({"observation": observation, **row})
            rate = row["steps_per_second"]
            print(f"  {observation:12s} {rate['native']:15,.0f} {rate['sync']:13,.0f} {row['ratio']:13.1f}x")
    result = {"config": vars(args), "conditions": measured.record(), "rows": rows}
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
        print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
