"""Frames per second of a Ballet PPO agent eager and compiled, side by side in one process.

Issue 53's GPU check: "the paper-scale Ballet agent (32 and 256 envs) eager against compiled". For each
``--cores`` entry and ``--num-envs`` value, each setting trains ``ballet-rl``'s agent at ``--scale`` (its
PPO settings, core options and training env; ``paper``: pixels, width 512, 4 layers, 8 heads) for
``--updates`` updates after a first one that compiles and is not counted:

* ``eager``: no ``torch.compile``;
* ``compiled <mode>`` for each ``--modes`` entry (``default``; ``reduce-overhead``: CUDA graphs), with
  ``--backend`` (``inductor``; ``aot_eager`` on a CPU test) and, with ``--cpp-wrapper``, inductor's C++
  wrapper (``--compile-cpp-wrapper``).

Per setting: the median over the counted updates of the frames per second of the whole update, and the
seconds of its acting (``seconds_act``), learning (``seconds_learn``) and envs (``seconds_env``), from
PPO's own metrics; and each compiled setting's frames per second as a multiple of eager's. Settings run
one after another in this process, so compare rows of one run.

    python benchmarks/compiled_agent.py --scale paper --num-envs 32 256 --device cuda --json runs/compiled.json
    python benchmarks/compiled_agent.py --scale quick --cores htm --updates 3 --cpp-wrapper     # a CPU thread
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from chronomem.config import COMPILE_MODES
from chronomem.envs.ballet_world import ballet_id
from chronomem.experiments.ballet_rl import SCALES
from chronomem.experiments.rl_runs import ppo_run

PARTS = ("act", "learn", "env")  # PPO's seconds_<part> of an update


def settings(modes: list[str], backend: str, cpp_wrapper: bool) -> list[tuple[str, dict]]:
    """(label, PPO settings) of eager and of each compiled mode."""
    suffix = " + C++ wrapper" if cpp_wrapper else ""
    compiled = [(f"compiled {mode}{suffix}", dict(compile=True, compile_mode=mode, compile_backend=backend,
                                          compile_cpp_wrapper=cpp_wrapper)) for mode in modes]
    return [("eager", dict(compile=False)), *compiled]


def measure(scale: str, core: str, num_envs: int, updates: int, changes: dict, device: str | None,
            threads: int, seed: int = 0) -> dict:
    """One setting's row: ``updates`` + 1 updates of the scale's agent, the first not counted."""
    s = SCALES[scale]
    ppo = {**s.ppo_of(core), "num_envs": num_envs, "log_every": 1, "checkpoint_every": 0, "device": device,
           "torch_threads": threads, **changes}
    frames = (updates + 1) * num_envs * ppo.get("num_steps", 128)
    start = time.perf_counter()
    result = ppo_run(ballet_id(s.train_level, s.observation), core, s.models[core], ppo, frames, seed, None, False)
    rows = result.history[1:]  # the first update compiles
    row = {"core": core, "num_envs": num_envs, "frames_per_update": frames // (updates + 1),
           "first_update_seconds": result.history[0]["seconds"], "seconds": round(time.perf_counter() - start, 1),
           "sps": statistics.median(r["sps"] for r in rows)}
    for part in PARTS:
        row[f"seconds_{part}"] = statistics.median(r[f"seconds_{part}"] for r in rows)
    return row


def table(rows: list[dict]) -> str:
    lines = [f"{'core':16} {'envs':>5} {'setting':28} {'frames/s':>9} {'x eager':>8} {'act s':>7} {'learn s':>8} "
             f"{'env s':>6} {'1st update s':>13}"]
    eager = {}
    for r in rows:
        key = (r["core"], r["num_envs"])
        if r["setting"] == "eager":
            eager[key] = r["sps"]
        ratio = r["sps"] / eager[key] if key in eager else float("nan")
        lines.append(f"{r['core']:16} {r['num_envs']:5d} {r['setting']:28} {r['sps']:9.0f} {ratio:8.2f} "
                     f"{r['seconds_act']:7.3f} {r['seconds_learn']:8.3f} {r['seconds_env']:6.3f} "
                     f"{r['first_update_seconds']:13.1f}")
    return "\n".join(lines)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", choices=sorted(SCALES), default="paper", help="ballet-rl's scale (default paper)")
    p.add_argument("--cores", nargs="+", default=["htm", "transformer-xl", "lstm"])
    p.add_argument("--num-envs", type=int, nargs="+", default=[32, 256])
    p.add_argument("--updates", type=int, default=5, help="counted updates per setting (after one that compiles)")
    p.add_argument("--modes", nargs="+", choices=COMPILE_MODES, default=["default"])
    p.add_argument("--backend", default="inductor", help="torch.compile's backend (aot_eager: a CPU test)")
    p.add_argument("--cpp-wrapper", action="store_true", help="inductor's C++ wrapper (--compile-cpp-wrapper)")
    p.add_argument("--device", default=None, help="cpu, cuda ... (default: cuda if available)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the rows here")
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    parser = make_parser()
    args = parser.parse_args(argv)
    for name in ("updates", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if any(n < 1 for n in args.num_envs):
        parser.error(f"--num-envs must be >= 1, got {args.num_envs}")
    unknown = sorted(set(args.cores) - set(SCALES[args.scale].models))
    if unknown:
        parser.error(f"--cores: {', '.join(unknown)} not in ballet-rl's {args.scale} scale; valid: "
                     f"{', '.join(SCALES[args.scale].models)}")
    if args.cpp_wrapper and args.backend != "inductor":
        parser.error(f"--cpp-wrapper needs --backend inductor, got {args.backend}")
    rows = []
    for core in args.cores:
        for num_envs in args.num_envs:
            for label, changes in settings(args.modes, args.backend, args.cpp_wrapper):
                torch._dynamo.reset()  # each compiled setting compiles its own graphs
                row = measure(args.scale, core, num_envs, args.updates, changes, args.device, args.threads)
                rows.append({"setting": label, **row})
                print(table(rows).splitlines()[-1], flush=True)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"\nballet-rl's {args.scale} agent on {device}, medians of {args.updates} updates after the first; "
          f"act/learn/env: seconds of an update\n{table(rows)}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"config": vars(args), "device": device, "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
