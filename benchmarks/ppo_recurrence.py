"""Truncated back-propagation windows against whole rollouts, side by side: does PPO's ``--recurrence k``
(torch-ac's option; paper 004's authors ran k = 16 on MiniGrid) learn faster per frame or per second?

For each seed, the LSTM agent trains with each ``--recurrences`` setting in turn (``whole``: gradients
through the whole 128-step rollout, chronomem's default; a number: windows of that many steps, each from
the state stored while acting), all other settings minigrid-transfer's quick PPO settings
(rl-starter-files' defaults) with minibatches of whole env sequences, one torch thread. A run stops when
the mean return of an update's episodes first reaches ``--target`` or at ``--max-frames``. Per setting:
the frames to the target (per seed and the median; a run that never reached it counts as
``--max-frames``), the training frames per second, and both as ratios to ``whole``. Settings alternate
within a seed, so a change of the machine's load hits each alike; the conditions (threads, load) are
printed before and after.

    python benchmarks/ppo_recurrence.py                               # DoorKey-5x5, seeds 1-3, whole/16/4
    python benchmarks/ppo_recurrence.py --env MiniGrid-MemoryS7-v0 --max-frames 800000 --json runs/rec.json
"""

from __future__ import annotations

import argparse
import json
import statistics

from chronomem.threads import Measured

WHOLE = "whole"


def measure(env: str, recurrence: str, seed: int, target: float, max_frames: int) -> dict:
    from chronomem.experiments.minigrid import SCALES, ppo_settings
    from chronomem.rl.ppo import Args, train

    # the scale's settings but its windows: each run's own, in minibatches of whole env sequences
    settings = {**ppo_settings(SCALES["quick"]), "recurrence": None if recurrence == WHOLE else int(recurrence),
                "minibatch": "envs"}
    args = Args(env=env, core="lstm", seed=seed, total_frames=max_frames, stop_return=target, progress=False,
                torch_threads=1, **settings)
    result = train(args)
    reached = [row["step"] for row in result.history if row.get("return_mean", -1.0) >= target]
    return {"recurrence": recurrence, "seed": seed, "frames_to_target": reached[0] if reached else None,
            "frames": result.frames, "frames_per_second": round(result.frames / max(result.seconds, 1e-9), 1)}


def summarise(records: list[dict], recurrences: list[str], max_frames: int) -> list[dict]:
    """Per setting: the median frames to the target (``max_frames`` for a run that missed it), the median
    frames per second, and each as a ratio to ``whole``'s (the first setting when ``whole`` is not run)."""
    rows = []
    for recurrence in recurrences:
        mine = [r for r in records if r["recurrence"] == recurrence]
        frames = [r["frames_to_target"] or max_frames for r in mine]
        rows.append({"recurrence": recurrence, "frames_to_target": [r["frames_to_target"] for r in mine],
                     "median_frames": statistics.median(frames),
                     "frames_per_second": statistics.median(r["frames_per_second"] for r in mine)})
    base = next((row for row in rows if row["recurrence"] == WHOLE), rows[0])
    for row in rows:
        row["frames_ratio"] = round(row["median_frames"] / base["median_frames"], 2)
        row["speed_ratio"] = round(row["frames_per_second"] / base["frames_per_second"], 2)
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="MiniGrid-DoorKey-5x5-v0")
    parser.add_argument("--recurrences", nargs="+", default=[WHOLE, "16", "4"],
                        help="'whole' and/or window lengths that divide the 128-step rollout")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--target", type=float, default=0.9, help="mean return that ends a run")
    parser.add_argument("--max-frames", type=int, default=400_000)
    parser.add_argument("--json", default=None, help="write the records and the summary here")
    args = parser.parse_args(argv)
    measured = Measured(threads=1, log=print).start()
    records = [measure(args.env, recurrence, seed, args.target, args.max_frames)
               for seed in args.seeds for recurrence in args.recurrences]
    rows = summarise(records, args.recurrences, args.max_frames)
    print(f"\nLSTM agent on {args.env}, seeds {args.seeds}: frames to mean return {args.target} (max "
          f"{args.max_frames:,}) and training frames/s\n")
    print("| recurrence | frames to target per seed | median | x whole | frames/s | x whole |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        per_seed = " / ".join("-" if f is None else f"{f:,}" for f in row["frames_to_target"])
        print(f"| {row['recurrence']} | {per_seed} | {row['median_frames']:,.0f} | {row['frames_ratio']} | "
              f"{row['frames_per_second']:,.0f} | {row['speed_ratio']} |")
    measured.stop()
    report = {"env": args.env, "target": args.target, "max_frames": args.max_frames, "records": records,
              "summary": rows, "conditions": measured.record()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
