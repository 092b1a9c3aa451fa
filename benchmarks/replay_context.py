"""PPO's ``--replay-context K`` side by side with none, where a cue and its query never share a rollout.

CueRecall (``chronomem.envs.recall``) with a delay of ``--delay`` steps: episodes of ``delay + 1`` steps,
the cue at the first, the query at the last. Rollouts of ``--num-steps`` shorter than an episode hold no
episode whole, so no replayed call holds a cue and its query: without a context the query's gradient
cannot reach the step that wrote the cue into the state, and the policy can only learn to read what the
state happens to keep. A context of ``K`` steps (``--contexts``) replays the previous rollout's last ``K``
steps first, with gradients; with ``num_steps + K >= delay + 1`` every episode after the first rollout lies
whole in one call.

For each seed, the LSTM agent trains once per context in turn (the settings of the test that the agent
solves CueRecall: 16 envs, lr 5e-3, raw advantages; one torch thread). Per run: the frames until a logged
mean return first reaches ``--target``, the mean return of the last quarter of the logged rows (whether
it held), the share of episodes replayed whole (``episodes_whole``) and the median approx_kl. Contexts
alternate within a seed, so a change of the machine's load hits each alike.

    python benchmarks/replay_context.py                          # delay 5, rollouts of 5, contexts 0 and 5
    python benchmarks/replay_context.py --seeds 0 1 2 3 4 --json runs/replay-context.json
"""

from __future__ import annotations

import argparse
import json
import statistics

from chronomem.threads import Measured


def cue_recall_id(delay: int) -> str:
    """A Gymnasium id of CueRecall with this delay (registered here once: the package registers delay 5's
    ``chronomem/CueRecall-v0`` with its constructor's defaults)."""
    import gymnasium as gym

    from chronomem.envs.recall import CueRecall, CueRecallVector

    env_id = f"chronomem/CueRecall-delay{delay}-v0"
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=CueRecall, vector_entry_point=CueRecallVector, kwargs={"delay": delay})
    return env_id


def measure(delay: int, num_steps: int, context: int, seed: int, target: float, max_frames: int) -> dict:
    from chronomem.rl.ppo import Args, train

    args = Args(env=cue_recall_id(delay), core="lstm", dim=32, hidden=32, num_envs=16, num_steps=num_steps,
                num_minibatches=2, update_epochs=4, lr=5e-3, replay_context=context, total_frames=max_frames,
                seed=seed, log_every=4, torch_threads=1, progress=False)
    history = train(args).history
    logged = [row for row in history if "return_mean" in row]
    reached = [row["step"] for row in logged if row["return_mean"] >= target]
    last = logged[-max(1, len(logged) // 4):]
    whole = [row["episodes_whole"] for row in logged if "episodes_whole" in row]
    return {"context": context, "seed": seed, "frames_to_target": reached[0] if reached else None,
            "return_last_quarter": round(statistics.fmean(row["return_mean"] for row in last), 3),
            "episodes_whole": round(statistics.fmean(whole), 3) if whole else None,
            "approx_kl_median": statistics.median(row["approx_kl"] for row in history),
            "frames": history[-1]["step"], "seconds": history[-1]["seconds"]}


def summarise(records: list[dict], contexts: list[int]) -> list[dict]:
    """Per context: the frames to the target per seed (None: missed), how many seeds reached it, and the
    last quarter's mean return per seed and over the seeds."""
    rows = []
    for context in contexts:
        mine = [r for r in records if r["context"] == context]
        rows.append({"context": context, "frames_to_target": [r["frames_to_target"] for r in mine],
                     "reached": sum(r["frames_to_target"] is not None for r in mine), "seeds": len(mine),
                     "return_last_quarter": [r["return_last_quarter"] for r in mine],
                     "mean_return_last_quarter": round(statistics.fmean(r["return_last_quarter"] for r in mine), 3)})
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=int, default=5, help="CueRecall's delay: episodes of delay + 1 steps")
    parser.add_argument("--num-steps", type=int, default=5, help="rollout length (shorter than an episode)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[0, 5], help="replay contexts K to compare")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=0.9, help="mean return counted as learned (chance: 0.5)")
    parser.add_argument("--max-frames", type=int, default=30_000)
    parser.add_argument("--json", default=None, help="write the records and the summary here")
    args = parser.parse_args(argv)
    measured = Measured(threads=1, log=print).start()
    records = [measure(args.delay, args.num_steps, context, seed, args.target, args.max_frames)
               for seed in args.seeds for context in args.contexts]
    rows = summarise(records, args.contexts)
    print(f"\nLSTM agent on CueRecall (delay {args.delay}, episodes of {args.delay + 1} steps), rollouts of "
          f"{args.num_steps} steps, seeds {args.seeds}, {args.max_frames:,} frames each\n")
    print(f"| replay context | frames to mean return {args.target} per seed | reached | last quarter's mean return "
          "per seed | mean |")
    print("|---|---|---|---|---|")
    for row in rows:
        frames = " / ".join("-" if f is None else f"{f:,}" for f in row["frames_to_target"])
        held = " / ".join(f"{r:.2f}" for r in row["return_last_quarter"])
        print(f"| {row['context']} | {frames} | {row['reached']}/{row['seeds']} | {held} | "
              f"{row['mean_return_last_quarter']:.2f} |")
    measured.stop()
    report = {"delay": args.delay, "num_steps": args.num_steps, "target": args.target, "max_frames": args.max_frames,
              "records": records, "summary": rows, "conditions": measured.record()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
