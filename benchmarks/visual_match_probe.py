"""What slows Visual Match's choice? One PPO run on the control at a short distractor (the colour also
shown at the choice, so no memory is needed), with changes to the agent's settings, to its core
(``core.KEY=VALUE``, the builder's options) or to the env (``env.KEY=VALUE``: e.g.
``env.apple_rewards=0.0``, no apples; ``env.control=False``, the task itself; ``env.cue_cell=0``, the
cue always on one wall cell), until 90% of a logged update's choices are right or a frame cap; then an
evaluation of 200 episodes. One JSON line per run (docs/rl.md, "Visual Match": the probes).

    python benchmarks/visual_match_probe.py starter --core mlp
    python benchmarks/visual_match_probe.py no-apples --core mlp env.apple_rewards=0.0 --jsonl runs/probes.jsonl
    python benchmarks/visual_match_probe.py raw-advantages --core mlp norm_adv=False
    python benchmarks/visual_match_probe.py htm-task --core htm core.chunk_size=16 env.control=False

Key-to-Door through the env's keywords: ``env.game='key_to_door' env.mode='active'`` (``env.control=False``
for the task itself).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import time
from pathlib import Path

# minigrid-transfer's (rl-starter-files') settings with advantages normalised, the per-cell vision
BASE = dict(dim=64, depth=1, hidden=64, visual="cells", num_envs=16, num_steps=128, num_minibatches=8,
            update_epochs=4, lr=1e-3, ent_coef=0.01, norm_adv=True)


def probe(name: str, core: str, changes: dict, env_changes: dict, distractor: int, frames: int, seed: int,
          out: str | None = None, core_options: dict | None = None, freeze: str | None = None) -> dict:
    import gymnasium as gym
    import torch

    import chronomem.envs  # noqa: F401  (registers the entry points named below)
    from chronomem.rl import ppo
    from chronomem.rl.evaluate import evaluate
    from chronomem.rl.ppo import Args, train

    torch.set_num_threads(1)
    if freeze:  # an ablation: these parameters keep their initial values (Adam skips a parameter without grad)
        build = ppo.make_agent

        def make_agent(*args, **kwargs):
            agent = build(*args, **kwargs)
            frozen = [p.requires_grad_(False) for name, p in agent.named_parameters() if freeze in name]
            if not frozen:
                raise ValueError(f"--freeze {freeze!r} names no parameter of the agent")
            return agent

        ppo.make_agent = make_agent
    slug = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")  # a probe's name may hold spaces and commas
    env_id = f"probe/VisualMatch-{slug}-v0"  # the control with the env changes
    gym.register(env_id, entry_point="chronomem.envs.tvt:TVTEnv",
                 vector_entry_point="chronomem.envs.tvt_vector:TVTVectorEnv",
                 kwargs={"mode": "passive", "distractor": distractor, "control": True, **env_changes})
    settings = {**BASE, "stop_success": 0.9, **changes}  # stop_success=None: the whole run
    args = Args(env=env_id, core=core, **settings, total_frames=frames, seed=seed, progress=False, log_every=1, out=out)
    start = time.perf_counter()
    result = train(args, core_options or {})
    rows = [row for row in result.history if "success_rate" in row]
    measured = evaluate(result.agent, env_id, 200, progress=False)
    kls = sorted(row["approx_kl"] for row in result.history)
    return {"name": name, "core": core, "core_options": core_options or {}, "env": env_changes, "args": changes,
            **({"frozen": freeze} if freeze else {}),
            "distractor": distractor, "seed": seed,
            "frames": result.frames, "seconds": round(time.perf_counter() - start),
            "learned": rows[-1]["success_rate"] >= 0.9,
            "first_update_at_0.9": next((row["step"] for row in rows if row["success_rate"] >= 0.9), None),
            "train_success_last": rows[-1]["success_rate"],
            "eval_success": measured["success_rate"], "kl_median": kls[len(kls) // 2],
            "entropy_last": rows[-1]["entropy"],
            "success_every_98k": [row["success_rate"] for row in rows if row["step"] % 98_304 < 2048]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name")
    parser.add_argument("changes", nargs="*", metavar="KEY=VALUE",
                        help="Args fields, env.KEY for the env's, core.KEY for the core's options")
    parser.add_argument("--core", default="mlp")
    parser.add_argument("--distractor", type=int, default=5)
    parser.add_argument("--frames", type=int, default=400_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jsonl", help="append the record to this file")
    parser.add_argument("--out", help="keep the run (config, metrics, final checkpoint) in this new directory, e.g. "
                                      "for benchmarks/visual_match_cases.py")
    parser.add_argument("--freeze", help="parameters whose names contain this keep their initial values, e.g. "
                                         "read_gate with core.read_gate=0.0: HTM without its read")
    args = parser.parse_intermixed_args(argv)
    changes, env_changes, core_options = {}, {}, {}
    targets = {"": changes, "env": env_changes, "core": core_options}  # KEY, env.KEY, core.KEY
    for pair in args.changes:
        key, _, value = pair.partition("=")
        scope, _, field = key.rpartition(".")
        if not value or scope not in targets:
            parser.error(f"changes must be KEY=VALUE, env.KEY=VALUE or core.KEY=VALUE, got {pair!r}")
        targets[scope][field] = ast.literal_eval(value)
    record = probe(args.name, args.core, changes, env_changes, args.distractor, args.frames, args.seed, args.out,
                   core_options, args.freeze)
    print(json.dumps(record))
    if args.jsonl:
        with open(Path(args.jsonl), "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
