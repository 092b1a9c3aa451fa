"""Visual Match without RL: can a core carry the cue's colour across the distractor phase when the answer
is given? Minutes on one thread, with none of PPO's noise.

2,048 passive episodes (``--episodes``; random actions in the explore and distractor phases; in the
reward room the player stays on its start cell, so every episode is full length) are labelled with the
target square (left, middle, right; chance 1/3). The quick scale's agent (its encoder and core, built as PPO builds
them: same seed, settings and core options) with a linear head is trained by cross-entropy at every
reward-phase step, Adam at the quick scale's learning rate, 32 episodes a step. Every ``--every``
steps the script prints the accuracy on 256 held-out episodes (``--held-out``) and, for HTM, the
relevance weight of each chunk visible at the reward phase's last step (commit order: the first holds
the explore phase and so the colour; mean over the held-out episodes).
docs/rl.md, "What decides HTM's seeds: a race in its relevance".

    python benchmarks/visual_match_supervised.py
    python benchmarks/visual_match_supervised.py core.chunk_size=32 --cores htm --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling script, also when loaded as a module
from visual_match_cue_at_init import chunk_weights, core_changes, quick_agent, recorded_reads  # noqa: E402

STAY = 1  # south: in the reward room the start cell's south is a wall, so the player stays


def labelled_episodes(distractor: int, count: int, first_seed: int) -> tuple[torch.Tensor, ...]:
    """``grids [count, N, H, W, C]``, ``phases [count, N]`` and ``target [count]`` of ``count`` full episodes."""
    from chronomem.envs.tvt import TVTEnv

    env = TVTEnv(mode="passive", distractor=distractor)
    rng = np.random.default_rng(first_seed)
    grids, phases, targets = [], [], []
    for i in range(count):
        obs, info = env.reset(seed=first_seed + i)
        episode, phase = [obs["grid"]], [info["phase"]]
        while True:
            action = STAY if info["phase"] == 2 else int(rng.integers(0, 4))
            obs, _, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
            episode.append(obs["grid"])
            phase.append(info["phase"])
        grids.append(np.stack(episode))
        phases.append(np.array(phase))
        targets.append(env.layout.target)
    return torch.as_tensor(np.stack(grids)), torch.as_tensor(np.stack(phases)), torch.as_tensor(targets)


def loss_and_accuracy(agent, head: nn.Module, grids, phases, targets) -> tuple[torch.Tensor, float]:
    """Cross-entropy of the target square at every reward-phase step, and the % named right."""
    out, _ = agent.core(agent.encoder({"grid": grids}))
    reward = phases == 2
    logits, labels = head(out)[reward], targets[:, None].expand_as(phases)[reward]
    return F.cross_entropy(logits, labels), 100 * (logits.argmax(-1) == labels).float().mean().item()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("changes", nargs="*", metavar="core.KEY=VALUE", help="options for HTM")
    parser.add_argument("--distractor", type=int, default=30)
    parser.add_argument("--cores", nargs="+", default=["htm", "transformer-xl"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--episodes", type=int, default=2048, help="training episodes")
    parser.add_argument("--held-out", type=int, default=256, help="held-out episodes")
    args = parser.parse_args(argv)
    changes = core_changes(args.changes)

    from chronomem.experiments.visual_match import GAME_SCALES

    torch.set_num_threads(1)
    lr, dim = (GAME_SCALES["visual-match"]["quick"].ppo[key] for key in ("lr", "dim"))
    train = labelled_episodes(args.distractor, args.episodes, 0)
    test = labelled_episodes(args.distractor, args.held_out, 100_000)
    last = int(torch.nonzero(test[1][0] == 2)[-1])  # the reward phase's last step
    print(f"distractor {args.distractor}, HTM changes {changes or 'none'}; accuracy (%) on {args.held_out} held-out "
          f"episodes every {args.every} steps [HTM: relevance weight of each visible chunk at step {last}, "
          "explore chunk first]")
    for core in args.cores:
        for seed in args.seeds:
            agent = quick_agent(core, seed, args.distractor, changes)
            head = nn.Linear(dim, 3)
            trained = [*agent.encoder.parameters(), *agent.core.parameters(), *head.parameters()]
            optimizer = torch.optim.Adam(trained, lr=lr)

            rng, start, line, seen = np.random.default_rng(seed), time.perf_counter(), [], {}
            for step in range(args.steps + 1):
                if step % args.every == 0:
                    with torch.no_grad(), recorded_reads(seen):
                        _, accuracy = loss_and_accuracy(agent, head, *test)
                    weights = "/" + ",".join(f"{w:.2f}" for w in chunk_weights(seen, last)) if seen else ""
                    line.append(f"{step}:{accuracy:.0f}{weights}")
                if step < args.steps:
                    batch = torch.as_tensor(rng.integers(0, len(train[0]), 32))
                    loss, _ = loss_and_accuracy(agent, head, *(part[batch] for part in train))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            print(f"{core} seed {seed} ({time.perf_counter() - start:.0f} s): {' '.join(line)}", flush=True)


if __name__ == "__main__":
    main()
