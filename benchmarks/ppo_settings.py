"""PPO settings chosen by time to learn: a small grid of settings per control task, each run until the
control's threshold (or a frame cap), reporting per setting and seed the wall-clock seconds and frames
it took (docs/rl.md, "Settings by time to learn").

A control is a task a memoryless policy can solve, played by the agent an experiment trains: what the
settings must learn before any memory result means anything. Each (setting, seed) runs in a fresh
process with one torch thread; ``--jobs K`` runs K at a time (one per core: two processes of two
threads each on 2 cores slow each other many times over). A run stops at the first logged update whose
mean return (and, where the control sets one, mean episode length) meets the threshold: Ballet's
any-dancer control pays every contact, so a wandering policy earns most of it, and it is learned when
the agent walks to a dancer as soon as the dances end (the cue comes at step 62, a dancer is 3 steps
away: 80 leaves room for sampled actions).

    python benchmarks/ppo_settings.py --control ballet-any --seeds 1 2 --jobs 2 --jsonl runs/settings.jsonl
    python benchmarks/ppo_settings.py --control ballet-any --table runs/settings.jsonl
    python benchmarks/ppo_settings.py --control doorkey-peer --seeds 1 2 3 --jsonl runs/doorkey-peer.jsonl
    python benchmarks/ppo_settings.py --control visual-match --seeds 1 --jsonl runs/visual-match.jsonl
    python benchmarks/ppo_settings.py --list

Each setting is a set of ``chronomem.rl.ppo.Args`` changes on the control's agent; the table is sorted by
the median seconds to the threshold (a run that does not reach it counts as never; ties: more seeds
learned first).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling script, also when loaded as a module
from ppo_peer import BATCH, EPOCHS, FRAMES_PER_ENV, LR, NUM_ENVS  # noqa: E402  (the peer benchmark's settings)

# ballet-rl's agent sized for a CPU (docs/rl.md "A Ballet agent sized for a CPU")
BALLET_AGENT = dict(core="lstm", dim=64, depth=2, heads=4, hidden=128, visual="cells", reconstruct_every=8)
# ballet-rl's quick settings before this benchmark (chosen for frames per second)
BALLET_BEFORE = dict(num_envs=64, num_steps=64, num_minibatches=4, update_epochs=4, lr=3e-4, ent_coef=1e-3)
# minigrid-transfer's (rl-starter-files') settings, with advantages normalised
STARTER = dict(num_envs=16, num_steps=128, num_minibatches=8, update_epochs=4, lr=1e-3, ent_coef=0.01,
               norm_adv=True)


@dataclass(frozen=True)
class Control:
    env: str
    agent: dict  # chronomem.rl.ppo.Args fields of the experiment's agent
    grid: dict  # setting name -> Args changes (and "core_options", replacing the control's)
    stop_return: float | None
    stop_length: float | None = None
    stop_success: float | None = None
    max_frames: int = 300_000
    about: str = ""
    core_options: dict = field(default_factory=dict)  # the core's builder options (the experiment's)


BALLET_QUICK = {**STARTER, "timeout": "failure", "reconstruction": 0.0}  # ballet-rl quick's settings
# benchmarks/ppo_peer.py's settings for our side (torch-ac's, as ours reads them; entropy 0.01 the Args default)
PEER = dict(num_envs=NUM_ENVS, num_steps=FRAMES_PER_ENV, num_minibatches=NUM_ENVS * FRAMES_PER_ENV // BATCH,
            update_epochs=EPOCHS, lr=LR, anneal_lr=False)
PEER_WINDOWS = {**PEER, "recurrence": 4, "minibatch": "windows"}


def _ballet_grid() -> dict:
    failure = {**STARTER, "timeout": "failure"}
    base = {**failure, "reconstruction": 0.0}  # the first grid's winner (docs/rl.md), varied one setting at a time
    return {
        "ballet-rl quick before (64x64, lr 3e-4, ent 1e-3)": BALLET_BEFORE,
        "16x128 (starter)": STARTER,
        "16x128 failure": failure,
        "16x128 failure, no recon": base,
        "16x128 failure, recon 0.1": {**failure, "reconstruction": 0.1},
        "16x128 truncation, no recon": {**base, "timeout": "truncation"},
        "16x128 failure, no recon, lr 3e-4": {**base, "lr": 3e-4},
        "16x128 failure, no recon, ent 1e-3": {**base, "ent_coef": 1e-3},
        "16x128 failure, no recon, no norm-adv": {**base, "norm_adv": False},
        "16x128 failure, no recon, windows of 16": {**base, "recurrence": 16, "minibatch": "windows"},
        "32x128 failure, no recon": {**base, "num_envs": 32},
        "64x128 failure, no recon": {**base, "num_envs": 64},
        "16x128 failure, no recon, 8 epochs": {**base, "update_epochs": 8},
    }


CONTROLS = {
    "ballet-any": Control(
        env="chronomem/Ballet-2_delay16-any-symbolic-v0", agent=BALLET_AGENT, grid=_ballet_grid(),
        stop_return=0.9, stop_length=80, max_frames=400_000,
        about="Ballet 2_delay16 where any dancer pays (no memory needed); learned: return >= 0.9 in <= 80 steps"),
    "ballet-any-htm": Control(
        env="chronomem/Ballet-2_delay16-any-symbolic-v0", agent={**BALLET_AGENT, "core": "htm"},
        core_options=dict(chunk_size=32, top_k=8, memory_size=40),  # ballet-rl quick's HTM
        grid={"ballet-rl quick (16x128 failure, no recon)": BALLET_QUICK,
              "ballet-rl quick, lr 3e-4": {**BALLET_QUICK, "lr": 3e-4},
              "ballet-rl quick, 8 epochs": {**BALLET_QUICK, "update_epochs": 8},
              "ballet-rl quick, ent 1e-3": {**BALLET_QUICK, "ent_coef": 1e-3}},
        stop_return=0.9, stop_length=80, max_frames=400_000,
        about="the any-dancer control with ballet-rl quick's HTM agent (its settings learned it for the LSTM "
              "and the memoryless agent; HTM touched a dancer in 97% of episodes but after 133 steps)"),
    "ballet-any-attention": Control(
        env="chronomem/Ballet-2_delay16-any-symbolic-v0", agent={**BALLET_AGENT, "core": "htm"},
        core_options=dict(chunk_size=32, top_k=8, memory_size=40),
        grid={"htm, 8 epochs": {**BALLET_QUICK, "update_epochs": 8},
              "htm, 8 epochs, lr 3e-4": {**BALLET_QUICK, "update_epochs": 8, "lr": 3e-4},
              "htm depth 1, 8 epochs": {**BALLET_QUICK, "update_epochs": 8, "depth": 1},
              # the heads read LN(output) (htm.py final_norm): the unlearned two-layer runs' heads saturate
              "htm, 8 epochs, final norm": {**BALLET_QUICK, "update_epochs": 8, "core_options": dict(
                  chunk_size=32, top_k=8, memory_size=40, final_norm=True)},
              "htm depth 1, 8 epochs, final norm": {**BALLET_QUICK, "update_epochs": 8, "depth": 1,
                                                    "core_options": dict(chunk_size=32, top_k=8, memory_size=40,
                                                                         final_norm=True)},
              "gtrxl (memory 256), 8 epochs": {**BALLET_QUICK, "update_epochs": 8, "core": "gtrxl",
                                               "core_options": dict(mem_len=256)},
              "transformer-xl (memory 256), 8 epochs": {**BALLET_QUICK, "update_epochs": 8, "core": "transformer-xl",
                                                        "core_options": dict(mem_len=256)}},
        stop_return=0.9, stop_length=80, max_frames=819_200,
        about="why HTM learns the any-dancer control slowly (seed 0 not in 819k frames): its settings, its "
              "depth, and the attention agents beside it (GTrXL's gates are what made Transformers learn in RL)"),
    "ballet-level": Control(
        env="chronomem/Ballet-2_delay16-symbolic-v0", agent=BALLET_AGENT,
        grid={"16x128 truncation, no recon": {**STARTER, "reconstruction": 0.0},
              "16x128 failure, no recon": {**STARTER, "timeout": "failure", "reconstruction": 0.0}},
        stop_return=0.45, stop_length=80, max_frames=600_000,
        about="Ballet 2_delay16 itself: the time-out read both ways; 'learned' here is only walking to a "
              "dancer (return >= 0.45, chance is 0.5, in <= 80 steps), not remembering which"),
    "visual-match": Control(
        env="chronomem/VisualMatch-passive-d30-control-v0", agent=dict(core="lstm", dim=64, hidden=64, visual="cells"),
        grid={"16x128 (starter)": STARTER,
              "16x128 raw advantages": {**STARTER, "norm_adv": False},
              "16x128, apples learned apart": {**STARTER, "reward_part": "apple_reward"},
              "16x128, apples learned apart, 8 epochs": {**STARTER, "reward_part": "apple_reward", "update_epochs": 8},
              "16x128, apples learned apart, 8 epochs, no reconstruction (visual-match quick)": {
                  **STARTER, "reward_part": "apple_reward", "update_epochs": 8, "reconstruction": 0.0},
              "16x128 ent 1e-3": {**STARTER, "ent_coef": 1e-3},
              "32x128": {**STARTER, "num_envs": 32}},
        stop_return=None, stop_success=0.9, max_frames=1_200_000,
        about="Visual Match, passive, distractor 30, the colour also shown at the choice (no memory needed); "
              "learned: >= 90% right choices among a logged update's episodes"),
    "doorkey": Control(
        env="MiniGrid-DoorKey-5x5-v0", agent=dict(core="lstm", dim=64, hidden=64),
        grid={"16x128 (starter)": STARTER,
              "16x128 no norm-adv": {**STARTER, "norm_adv": False},
              "16x128 windows of 4": {**STARTER, "recurrence": 4, "minibatch": "windows"},
              "16x128 lr 3e-4": {**STARTER, "lr": 3e-4},
              "64x128": {**STARTER, "num_envs": 64}},
        stop_return=0.9, max_frames=400_000, about="MiniGrid-DoorKey-5x5 (fully solvable without memory)"),
    "doorkey-peer": Control(
        env="MiniGrid-DoorKey-5x5-v0", agent=dict(core="lstm", dim=64, hidden=64),
        grid={"peer (16x128)": PEER,
              "peer, windows of 4": PEER_WINDOWS,
              "peer, windows of 4, Adam eps 1e-8": {**PEER_WINDOWS, "adam_eps": 1e-8},
              "peer, windows of 4, lr 2e-3": {**PEER_WINDOWS, "lr": 2e-3},
              "peer, windows of 4, 3 epochs": {**PEER_WINDOWS, "update_epochs": 3},
              "peer, windows of 4, 16x64": {**PEER_WINDOWS, "num_steps": 64, "num_minibatches": 4},
              "peer, windows of 4, 8x128": {**PEER_WINDOWS, "num_envs": 8, "num_minibatches": 4},
              "peer, windows of 4, minibatches of 512": {**PEER_WINDOWS, "num_minibatches": 4},
              "peer, windows of 4, value not clipped": {**PEER_WINDOWS, "clip_vloss": False},
              "peer, windows of 4, 2 epochs, lr 2e-3": {**PEER_WINDOWS, "update_epochs": 2, "lr": 2e-3}},
        stop_return=0.9, max_frames=300_000,
        about="MiniGrid-DoorKey-5x5 from benchmarks/ppo_peer.py's settings (torch-ac's), varied one at a time "
              "for the time to mean return 0.9 (issue 53)"),
}


def run_one(control: str, setting: str, seed: int) -> dict:
    """One run in this process; what the table needs."""
    from chronomem.rl.ppo import Args, stop_reached, train

    c = CONTROLS[control]
    changes = dict(c.grid[setting])
    core_options = changes.pop("core_options", c.core_options)  # a setting may bring its core's own options
    args = Args(env=c.env, **{**c.agent, **changes}, total_frames=c.max_frames, seed=seed,
                stop_return=c.stop_return, stop_length=c.stop_length, stop_success=c.stop_success, torch_threads=1,
                progress=False)
    result = train(args, core_options)
    last = result.history[-1]
    reached = last["step"] if stop_reached(last, args) else None  # the run stopped there, or ran out
    kls = [row["approx_kl"] for row in result.history]
    return {"frames": result.frames, "seconds": round(result.seconds, 1), "reached": reached,
            "fps": round(result.frames / max(result.seconds, 1e-9)),
            "return_last": last.get("return_mean"), "length_last": last.get("length_mean"),
            "success_last": last.get("success_rate"),
            "entropy_last": last["entropy"], "approx_kl_median": statistics.median(kls)}


def measure(control: str, setting: str, seed: int, stream: Path | None = None) -> dict:
    cmd = [sys.executable, __file__, "--one", control, setting, str(seed)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{control} / {setting}, seed {seed} failed:\n{done.stderr[-3000:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"  {setting}, seed {seed}: reached at {record['reached']} frames, {record['seconds']} s "
          f"({record['fps']} frames/s)", file=sys.stderr, flush=True)
    record = {"control": control, "setting": setting, "seed": seed, **record}
    if stream is not None:  # one line per run as it ends: a sweep cut short keeps what it measured
        with open(stream, "a") as f:
            f.write(json.dumps(record) + "\n")
    return record


def table(control: str, records: list[dict]) -> str:
    c = CONTROLS[control]
    rows = []
    for setting in dict.fromkeys(r["setting"] for r in records):
        mine = [r for r in records if r["setting"] == setting]
        times = [r["seconds"] if r["reached"] else float("inf") for r in mine]
        frames = [r["reached"] or float("inf") for r in mine]
        rows.append((statistics.median(times), setting, mine, statistics.median(frames)))
    # by the median time; among settings that never got there in the median, the one with more seeds learned
    rows.sort(key=lambda row: (row[0], -sum(bool(r["reached"]) for r in row[2])))
    lines = [f"{control}: {c.about} (cap {c.max_frames:,} frames, one thread per run)", "",
             "| setting | learned | median seconds | median frames | per seed: seconds (frames) | frames/s | "
             "median approx_kl |", "|---|---|---|---|---|---|---|"]
    for seconds, setting, mine, frames in rows:
        per_seed = ", ".join(f"{r['seconds']:.0f} ({r['reached']:,})" if r["reached"] else
                             f"not by {r['frames']:,} ({r['seconds']:.0f} s)" for r in mine)
        shown_s = f"{seconds:.0f}" if seconds != float("inf") else "not learned"
        shown_f = f"{frames:,.0f}" if frames != float("inf") else "-"
        fps = statistics.median(r["fps"] for r in mine)
        kls = [r["approx_kl_median"] for r in mine if r.get("approx_kl_median") is not None]
        kl = f"{statistics.median(kls):.1e}" if kls else "-"
        lines.append(f"| {setting} | {sum(bool(r['reached']) for r in mine)}/{len(mine)} | {shown_s} | {shown_f} | "
                     f"{per_seed} | {fps:,.0f} | {kl} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--control", choices=sorted(CONTROLS), default="ballet-any")
    parser.add_argument("--settings", nargs="+", help="a subset of the control's grid (default: all of it)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (one per core)")
    parser.add_argument("--jsonl", help="append each run's record to this file as it ends (JSON lines)")
    parser.add_argument("--table", nargs="+", metavar="JSONL", help="print the table of records already measured "
                        "(--jsonl files, the --control's records) and exit")
    parser.add_argument("--list", action="store_true", help="print every control's grid and exit")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # a child process: control, setting, seed
    args = parser.parse_args(argv)
    if args.one:
        import torch

        torch.set_num_threads(1)
        control, setting, seed = args.one
        print(json.dumps(run_one(control, setting, int(seed))))
        return
    if args.list:
        for name, c in CONTROLS.items():
            print(f"{name}: {c.about}")
            for setting, changes in c.grid.items():
                print(f"  {setting}: {changes}")
        return
    grid = CONTROLS[args.control].grid
    settings = args.settings or list(grid)
    unknown = [s for s in settings if s not in grid]
    if unknown:
        parser.error(f"--settings: {unknown} not in {args.control}'s grid ({', '.join(grid)})")
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if args.table:
        records = [json.loads(line) for path in args.table for line in Path(path).read_text().splitlines() if line]
        print(table(args.control, [r for r in records if r.get("control", args.control) == args.control]))
        return
    jobs = [(args.control, setting, seed) for setting in settings for seed in args.seeds]
    stream = Path(args.jsonl) if args.jsonl else None
    if stream is not None:
        stream.parent.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        records = list(pool.map(lambda job: measure(*job, stream=stream), jobs))
    print(table(args.control, records))


if __name__ == "__main__":
    main()
