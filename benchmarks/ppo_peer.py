"""Recurrent PPO side by side: torch-ac (the library of rl-starter-files, which paper 004's MiniGrid
agents built on) against chronomem's PPO with the LSTM core, on MiniGrid-DoorKey-5x5-v0.

Same settings on both sides (rl-starter-files' PPO for MiniGrid): 16 environments, 128 frames per
environment per update, 4 epochs, minibatches of 256 frames, Adam lr 1e-3 without annealing, gamma
0.99, lambda 0.95, clip 0.2, entropy 0.01, value 0.5, gradient clip 0.5, one torch thread.

* torch-ac (``pip install 'chronomem[peers]'``): ``PPOAlgo`` with an actor-critic of rl-starter-files'
  layer sizes written here (``StarterModel``: the 7x7x3 image through 2x2 convolutions of 16, 32, 64
  channels with one max-pool, an LSTM cell of 64, policy and value MLPs of 64 tanh units, its row-
  normalised initialisation), recurrence 4 (its gradients stop every 4 steps), its 15 environment
  subprocesses (``ParallelEnv``).
* chronomem: ``chronomem.rl.ppo.train`` with ``--core lstm`` of width 64 (its encoder also reads the
  direction and the mission), ``num_minibatches = 8`` (8 minibatches of 2 whole 128-step env
  sequences: 256 frames), gradients through the whole 128 steps, one process (``SyncVectorEnv``).

Measured per seed: frames per second of the training loop (rollouts and updates, not the imports and
setup), the wall-clock seconds of that loop to 0.9 (the headline: what a user waits for) and the
frames after which the mean return of the update's episodes first reaches 0.9 (torch-ac
logs its last episodes, at least one per environment; ours the episodes ended during the update). A
run stops there, or at ``--max-frames``. Each (implementation, seed) runs in a fresh process, the two
implementations alternating, so a change of the machine's load hits both alike.

    python benchmarks/ppo_peer.py                       # seeds 1 2 3
    python benchmarks/ppo_peer.py --seeds 1 --max-frames 200000 --json runs/ppo_peer.json
    python benchmarks/ppo_peer.py --seeds 1 2 3 4 5 --variant ours "minibatches of 4-step windows"
    python benchmarks/ppo_peer.py --seeds 1 2 3 4 5 --variant ours "torch-ac's minibatches and Adam eps"
    python benchmarks/ppo_peer.py --ablate --seeds 1 2 3 4 5 --jobs 2   # one difference at a time

``--ablate`` (frames only, so runs may share the cores): torch-ac, then ours with one of its
differences from torch-ac changed to torch-ac's at a time (``ABLATIONS``), and all of them together.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from chronomem.threads import Measured

ENV = "MiniGrid-DoorKey-5x5-v0"
NUM_ENVS, FRAMES_PER_ENV, EPOCHS, BATCH, LR, RECURRENCE = 16, 128, 4, 256, 1e-3, 4
TARGET = 0.9


# ----------------------------------------------------------------------------------------------
# torch-ac with rl-starter-files' model sizes
# ----------------------------------------------------------------------------------------------


def run_torch_ac(seed: int, max_frames: int) -> dict:
    import gymnasium as gym
    import minigrid  # noqa: F401  (registers the MiniGrid ids)
    import numpy as np
    import torch
    import torch_ac
    from torch import nn

    class StarterModel(nn.Module, torch_ac.RecurrentACModel):
        """rl-starter-files' ``ACModel`` sizes with memory and without text."""

        def __init__(self, num_actions: int, width: int = 64):
            super().__init__()
            self.width = width
            self.conv = nn.Sequential(nn.Conv2d(3, 16, 2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 2), nn.ReLU(),
                                      nn.Conv2d(32, width, 2), nn.ReLU())  # 7x7 -> 1x1
            self.lstm = nn.LSTMCell(width, width)
            self.actor = nn.Sequential(nn.Linear(width, 64), nn.Tanh(), nn.Linear(64, num_actions))
            self.critic = nn.Sequential(nn.Linear(width, 64), nn.Tanh(), nn.Linear(64, 1))
            for module in self.modules():  # rl-starter-files: unit-norm rows of N(0, 1), zero biases
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight)
                    module.weight.data /= module.weight.data.norm(dim=1, keepdim=True)
                    nn.init.zeros_(module.bias)

        @property
        def memory_size(self) -> int:
            return 2 * self.width

        def forward(self, obs, memory):
            x = self.conv(obs.image.permute(0, 3, 1, 2)).flatten(1)
            h, c = self.lstm(x, (memory[:, : self.width], memory[:, self.width :]))
            dist = torch.distributions.Categorical(logits=self.actor(h))
            return dist, self.critic(h).squeeze(1), torch.cat([h, c], 1)

    def preprocess(obss, device=None):
        images = torch.tensor(np.array([o["image"] for o in obss]), device=device, dtype=torch.float)
        return torch_ac.DictList({"image": images})

    torch.manual_seed(seed)
    np.random.seed(seed)
    envs = []
    for i in range(NUM_ENVS):  # rl-starter-files seeds env i with seed + 10000 i
        env = gym.make(ENV)
        env.reset(seed=seed + 10000 * i)
        envs.append(env)
    model = StarterModel(envs[0].action_space.n)
    algo = torch_ac.PPOAlgo(envs, model, torch.device("cpu"), FRAMES_PER_ENV, 0.99, LR, 0.95, 0.01, 0.5, 0.5,
                            RECURRENCE, 1e-8, 0.2, EPOCHS, BATCH, preprocess)
    frames, reached, start = 0, None, time.perf_counter()
    while frames < max_frames:
        exps, logs = algo.collect_experiences()  # torch-ac 1.4: collect, then update on the experiences
        algo.update_parameters(exps)
        frames += logs["num_frames"]
        if reached is None and np.mean(logs["return_per_episode"]) >= TARGET:
            reached = frames
            break
    seconds = time.perf_counter() - start
    return {"frames": frames, "seconds": seconds, "reached": reached}


# ----------------------------------------------------------------------------------------------
# chronomem
# ----------------------------------------------------------------------------------------------


# One difference from torch-ac at a time (issue 50's ablation): Args changes, and for the agent's
# initialisation and encoder a change made to the built agent (``_TORCH_AC_AGENT``).
ABLATIONS = {
    "ours": {},
    "torch-ac's initialisation": {"agent": "init"},
    "image only (no direction, no mission)": {"agent": "image"},
    "gradients cut every 4 steps": {"recurrence": 4},
    "minibatches of 4-step windows": {"recurrence": 4, "minibatch": "windows"},
    "time-out as failure": {"timeout": "failure"},
    "advantages normalised": {"norm_adv": True},
    "Adam eps 1e-8": {"adam_eps": 1e-8},
    "value loss x2 (torch-ac's weight)": {"vf_coef": 1.0},
    "value loss not clipped": {"clip_vloss": False},
    "all of torch-ac's": {"agent": "init+image", "recurrence": 4, "minibatch": "windows", "timeout": "failure",
                          "adam_eps": 1e-8, "vf_coef": 1.0},
    # torch-ac's minibatches and its optimiser, our agent and losses: the fastest to 0.9 in the settings sweep
    # (benchmarks/ppo_settings.py --control doorkey-peer)
    "torch-ac's minibatches and Adam eps": {"recurrence": 4, "minibatch": "windows", "adam_eps": 1e-8},
    # and the envs stepped in subprocesses, as torch-ac steps its own (does the second core pay?)
    "torch-ac's minibatches and Adam eps, envs in subprocesses": {"recurrence": 4, "minibatch": "windows",
                                                                 "adam_eps": 1e-8, "async_envs": True},
}


def torch_ac_agent(agent, changes: str) -> None:
    """Make ``agent`` (a MiniGrid ``ActorCritic``) like rl-starter-files' in place: ``init``: every linear
    layer's rows drawn from N(0, 1) and scaled to unit norm, biases 0 (its ``init_params``; the LSTM keeps
    PyTorch's); ``image``: the direction and the mission no longer reach the core (the direction's
    embedding held at 0, the mission dropped)."""
    import torch
    from torch import nn

    with torch.no_grad():
        if "init" in changes:
            for module in agent.modules():
                if isinstance(module, nn.Linear):
                    module.weight.normal_(0, 1)
                    module.weight /= module.weight.norm(dim=1, keepdim=True)
                    module.bias.zero_()
        if "image" in changes:
            encoder = agent.encoder
            encoder.direction.weight.zero_()
            encoder.direction.weight.requires_grad_(False)
            if encoder.words is not None:
                encoder.words.weight.zero_()
                encoder.words.weight.requires_grad_(False)


def run_chronomem(seed: int, max_frames: int, ablation: str = "ours") -> dict:
    from chronomem.rl import ppo
    from chronomem.rl.ppo import Args, train

    changes = dict(ABLATIONS[ablation])
    agent_changes = changes.pop("agent", "")
    if agent_changes:
        build = ppo.make_agent

        def make_agent(*args, **kwargs):
            agent = build(*args, **kwargs)
            torch_ac_agent(agent, agent_changes)
            return agent

        ppo.make_agent = make_agent  # this process runs this one ablation
    args = Args(env=ENV, core="lstm", dim=64, hidden=64, num_envs=NUM_ENVS, num_steps=FRAMES_PER_ENV,
                update_epochs=EPOCHS, num_minibatches=NUM_ENVS * FRAMES_PER_ENV // BATCH, lr=LR, anneal_lr=False,
                total_frames=max_frames, stop_return=TARGET, seed=seed, torch_threads=1, progress=False, **changes)
    result = train(args)
    reached = next((row["step"] for row in result.history if row.get("return_mean", -1) >= TARGET), None)
    return {"frames": result.frames, "seconds": result.seconds, "reached": reached}


RUNNERS = {"torch-ac": run_torch_ac, "chronomem": run_chronomem}


# ----------------------------------------------------------------------------------------------
# Side by side
# ----------------------------------------------------------------------------------------------


def measure(name: str, seed: int, max_frames: int, ablation: str = "ours") -> dict:
    """One run in a fresh process (torch-ac forks its environment workers at import)."""
    cmd = [sys.executable, __file__, "--one", name, "--seeds", str(seed), "--max-frames", str(max_frames),
           "--ablation", ablation]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{name} ({ablation}), seed {seed} failed:\n{done.stderr[-3000:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    variant = ablation if name == "chronomem" else name
    print(f"  {variant}, seed {seed}: reached {TARGET} at {record['reached']}", file=sys.stderr, flush=True)
    return {"name": name, "ablation": variant, "seed": seed, **record, "fps": record["frames"] / record["seconds"]}


def ablation_table(records: list[dict], max_frames: int) -> str:
    """Frames to 0.9 per variant and seed, the median, and its ratio to torch-ac's median."""
    def frames(r):
        return r["reached"] or float("inf")

    peers = [frames(r) for r in records if r["name"] == "torch-ac"]
    peer = statistics.median(peers) if peers else float("inf")  # no peer run: no ratio
    lines = [f"| variant (one difference from ours) | frames to {TARGET} per seed | median | x torch-ac | solved |",
             "|---|---|---|---|---|"]
    for variant in dict.fromkeys(r["ablation"] for r in records):
        mine = sorted((r for r in records if r["ablation"] == variant), key=lambda r: r["seed"])
        median = statistics.median(frames(r) for r in mine)
        per_seed = ", ".join(f"{r['reached'] / 1000:.0f}k" if r["reached"] else f"> {max_frames / 1000:.0f}k"
                             for r in mine)
        shown = f"{median:,.0f}" if median != float("inf") else "not reached"
        ratio = f"{median / peer:.2f}x" if median != float("inf") and peer != float("inf") else "-"
        lines.append(f"| {variant} | {per_seed} | {shown} | {ratio} | {sum(bool(r['reached']) for r in mine)}/"
                     f"{len(mine)} |")
    return "\n".join(lines)


def table(records: list[dict], max_frames: int) -> str:
    """Per run, then the medians of each implementation (ours per ``--variant``) and their ratios to torch-ac's."""
    def label(r):
        return r["name"] if r["ablation"] in ("ours", "torch-ac") else f"chronomem, {r['ablation']}"

    width = max(14, *(len(label(r)) for r in records))
    lines = [f"{'seed':>4}  {'implementation':<{width}}  {'frames/s':>9}  {'frames to ' + str(TARGET):>16}  "
             f"{'seconds':>8}"]
    for r in records:
        reached = f"{r['reached']:,}" if r["reached"] else f"> {max_frames:,}"
        lines.append(f"{r['seed']:>4}  {label(r):<{width}}  {r['fps']:>9,.0f}  {reached:>16}  {r['seconds']:>8.1f}")
    summary = {}
    for name in dict.fromkeys(label(r) for r in records):
        mine = [r for r in records if label(r) == name]
        summary[name] = {"fps": statistics.median(r["fps"] for r in mine),
                         "reached": statistics.median(r["reached"] or float("inf") for r in mine),
                         "seconds": statistics.median(seconds_to_target(r) for r in mine),
                         "solved": sum(r["reached"] is not None for r in mine), "runs": len(mine)}
    lines.append("")
    lines.append(f"{'median':<{width}}  {'frames/s':>9}  {'frames to ' + str(TARGET):>16}  "
                 f"{'seconds to ' + str(TARGET):>15}  {'solved':>7}")
    for name, s in summary.items():
        reached = f"{s['reached']:,.0f}" if s["reached"] != float("inf") else "not reached"
        seconds = f"{s['seconds']:,.1f}" if s["seconds"] != float("inf") else "not reached"
        lines.append(f"{name:<{width}}  {s['fps']:>9,.0f}  {reached:>16}  {seconds:>15}  {s['solved']:>3}/{s['runs']}")
    peer = summary["torch-ac"]
    lines.append("")
    for name, ours in summary.items():
        if name != "torch-ac":
            lines.append(f"ratio {name} / torch-ac: seconds to {TARGET} {ratio(ours['seconds'], peer['seconds'])} "
                         f"(target <= 0.6), frames to {TARGET} {ratio(ours['reached'], peer['reached'])} "
                         f"(target <= 1.0), frames/s {ours['fps'] / peer['fps']:.2f}x")
    return "\n".join(lines)


def seconds_to_target(record: dict) -> float:
    """A run stops when it reaches the target: its seconds are the wall-clock time to it (inf if never)."""
    return record["seconds"] if record["reached"] is not None else float("inf")


def ratio(ours: float, peer: float) -> str:
    """``ours / peer`` as ``1.23x``; ``-`` where either never reached the target."""
    return f"{ours / peer:.2f}x" if float("inf") not in (ours, peer) else "-"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--max-frames", type=int, default=400_000, help="a run that has not reached 0.9 stops here")
    parser.add_argument("--json", help="write the conditions and the records here")
    parser.add_argument("--ablate", nargs="*", metavar="VARIANT",
                        help="frames to 0.9 of torch-ac and of ours with one difference from torch-ac at a time "
                             f"(default: torch-ac and every one of {', '.join(ABLATIONS)}; named variants run "
                             "without torch-ac unless 'torch-ac' is named too); runs --jobs at a time")
    parser.add_argument("--jobs", type=int, default=1, help="--ablate: runs at a time (one per core)")
    parser.add_argument("--variant", nargs="+", default=["ours"], metavar="VARIANT",
                        help="side by side: our settings for each seed, one or more of ABLATIONS' names "
                             "(e.g. 'minibatches of 4-step windows'; default: ours)")
    parser.add_argument("--ablation", default="ours", choices=sorted(ABLATIONS), help=argparse.SUPPRESS)
    parser.add_argument("--one", choices=sorted(RUNNERS), help=argparse.SUPPRESS)  # a child process's run
    args = parser.parse_args(argv)
    if args.max_frames < NUM_ENVS * FRAMES_PER_ENV:
        parser.error(f"--max-frames must be at least one update ({NUM_ENVS * FRAMES_PER_ENV} frames)")
    if args.one:
        import torch

        torch.set_num_threads(1)
        options = {"ablation": args.ablation} if args.one == "chronomem" else {}
        print(json.dumps(RUNNERS[args.one](args.seeds[0], args.max_frames, **options)))
        return
    unknown = [v for v in args.variant if v not in ABLATIONS]
    if unknown:
        parser.error(f"--variant: unknown variants {unknown}; choose from {', '.join(ABLATIONS)}")
    if args.ablate is not None:
        unknown = [v for v in args.ablate if v not in ABLATIONS and v != "torch-ac"]
        if unknown:
            parser.error(f"--ablate: unknown variants {unknown}; choose from {', '.join(ABLATIONS)}")
        from concurrent.futures import ThreadPoolExecutor

        # the peer runs unless variants are named without it ("torch-ac" names it)
        peer = not args.ablate or "torch-ac" in args.ablate
        jobs = [("torch-ac", seed, "ours") for seed in args.seeds] if peer else []
        jobs += [("chronomem", seed, variant) for variant in (args.ablate or ABLATIONS) if variant != "torch-ac"
                 for seed in args.seeds]
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            records = list(pool.map(lambda job: measure(job[0], job[1], args.max_frames, job[2]), jobs))
        print(ablation_table(records, args.max_frames))
        if args.json:
            with open(args.json, "x") as f:  # never overwrite another run's file
                json.dump({"records": records}, f, indent=2)
        return
    records = []
    measured = Measured(threads=1, log=print).start()  # the runs' processes: one torch thread each
    for seed in args.seeds:
        for name, variant in [("torch-ac", "ours"), *(("chronomem", v) for v in args.variant)]:
            records.append(measure(name, seed, args.max_frames, variant))
            r = records[-1]
            print(f"  {r['ablation']}, seed {seed}: {r['fps']:,.0f} frames/s, reached {TARGET} at {r['reached']}",
                  file=sys.stderr, flush=True)
    print(table(records, args.max_frames))
    measured.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"conditions": measured.record(), "records": records}, f, indent=2)


if __name__ == "__main__":
    main()
