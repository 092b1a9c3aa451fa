"""How much does Visual Match's cue reach an untrained agent's choice? The quick scale's agents at
initialisation, built as PPO builds them (the same seed, settings and core options).

Each of 32 episodes (the passive task, random actions) is played twice with the same actions and
layout but another target colour, so the two differ only in the cue's colour in the explore phase.
Per core and seed the script prints, over the reward phase's steps:

* ``moved``: how far the cue's colour moves the core's output, ``|y_a - y_b| / |y|`` (mean per step):
  what the choice's gradient has to start from;
* for HTM, the memory read's share of it (``read moved``: ``|r_a - r_b| / |r|``), the read's size
  beside the output's, and the explore chunk's weight among the visible chunks (``explore weight``;
  uniform is 1/3 at distractor 30, where a reward step sees three chunks);
* the encoder's output per step (``stored step norm``), which HTM stores, beside the norm of the slot
  position encoding the released module adds to each stored step (``slot encoding norm``).

docs/rl.md, "What decides HTM's seeds: a race in its relevance".

    python benchmarks/visual_match_cue_at_init.py
    python benchmarks/visual_match_cue_at_init.py core.memory_norm=True --distractor 5 --cores htm
"""

from __future__ import annotations

import argparse
import ast
import math
import sys
from dataclasses import replace
from pathlib import Path
from statistics import fmean

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling script, also when loaded as a module
from htm_read_scale import recorded_reads as reads_recorded  # noqa: E402


def episodes(distractor: int, count: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``count`` pairs of grids ``[N, H, W, C]`` that differ only in the target colour, and the phase of
    each step; the same random actions in both (the episode ends at the same step: a square ends it)."""
    from chronomem.envs.tvt import TVTEnv

    rng = np.random.default_rng(0)
    pairs = []
    for i in range(count):
        env = TVTEnv(mode="passive", distractor=distractor)
        env.reset(seed=i)
        layouts = (env.layout, replace(env.layout, target=(env.layout.target + 1) % 3))
        actions = rng.integers(0, 4, size=4 * distractor + 100)
        played = []
        for layout in layouts:
            obs, info = env.reset(options={"layout": layout})
            grids, phases = [obs["grid"]], [info["phase"]]
            for action in actions:
                obs, _, terminated, truncated, info = env.step(int(action))
                if terminated or truncated:
                    break
                grids.append(obs["grid"])
                phases.append(info["phase"])
            played.append((np.stack(grids), np.array(phases)))
        (a, phases), (b, _) = played
        pairs.append((a, b, phases))
    return pairs


def recorded_reads(seen: dict):
    """Within the block, each ``HTMAttention.read`` leaves its inputs and output in ``seen``
    (``htm_read_scale.recorded_reads``)."""

    def keep(module, inputs, out):
        queries, keys, _, _, valid, *mask = inputs
        seen.update(module=module, queries=queries, keys=keys, valid=valid, mask=mask[0] if mask else None, out=out)

    return reads_recorded(keep)


def chunk_weights(seen: dict, step: int) -> list[float]:
    """The relevance weight of each chunk visible at ``step`` (commit order: the first holds the explore
    phase), the mean over the batch: ``HTMAttention.read``'s softmax, recomputed from its recorded inputs
    (the relevance head's own weights, before ``relevance_floor``'s mix)."""
    module, queries, keys = seen["module"], seen["queries"], seen["keys"]
    with torch.no_grad():
        if module.memory_norm:
            keys = torch.nn.functional.layer_norm(keys, (keys.shape[-1],))
        query = module.to_query(queries[:, step : step + 1])
        logits = query @ module.to_key(keys).transpose(1, 2) / math.sqrt(queries.shape[-1])
        visible = seen["valid"] & (True if seen["mask"] is None else seen["mask"][:, step])  # [B, M]
        weights = torch.softmax(logits[:, 0].masked_fill(~visible, float("-inf")), -1)
    return weights[:, visible[0]].mean(0).tolist()


def explore_weight(seen: dict, steps: np.ndarray) -> float | None:
    """The explore chunk's mean weight (``chunk_weights``) over the ``steps`` that see more than one chunk."""
    weights = [chunk_weights(seen, t) for t in steps]
    return fmean(w[0] for w in weights if len(w) > 1) if any(len(w) > 1 for w in weights) else None


def core_changes(pairs: list[str]) -> dict:
    """``core.KEY=VALUE`` pairs as the HTM core's options (a Python literal each)."""
    changes = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if not key.startswith("core.") or not value:
            raise ValueError(f"a change is core.KEY=VALUE, got {pair!r}")
        changes[key[5:]] = ast.literal_eval(value)
    return changes


def quick_agent(core: str, seed: int, distractor: int, changes: dict):
    """The quick scale's Visual Match agent for ``core``, as PPO builds it: the seed, then the envs, then the
    agent, with the scale's settings and core options (``changes`` on top of HTM's)."""
    import chronomem.envs  # noqa: F401  (registers the ids)
    from chronomem.envs.make import make_vector_env
    from chronomem.experiments.visual_match import GAME_SCALES
    from chronomem.rl.ppo import make_agent
    from chronomem.rl.settings import Args

    scale = GAME_SCALES["visual-match"]["quick"]
    env_id = scale.env_id(distractor)
    settings = {k: v for k, v in scale.ppo.items() if k != "checkpoint_every"}
    torch.manual_seed(seed)
    envs = make_vector_env(env_id, settings["num_envs"])
    options = {**scale.models[core], **(changes if core == "htm" else {})}
    agent = make_agent(Args(env=env_id, core=core, **settings, seed=seed), options, envs.single_observation_space,
                       envs.single_action_space)
    envs.close()
    return agent


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("changes", nargs="*", metavar="core.KEY=VALUE", help="options for the cores")
    parser.add_argument("--distractor", type=int, default=30)
    parser.add_argument("--cores", nargs="+", default=["htm", "transformer-xl", "lstm"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=32)
    args = parser.parse_args(argv)
    changes = core_changes(args.changes)

    torch.set_num_threads(1)
    pairs = episodes(args.distractor, args.episodes)
    print(f"distractor {args.distractor}, {args.episodes} episode pairs, changes {changes or 'none'}")
    print("| core | seed | moved | read moved | read / output | explore weight | stored step norm "
          "| slot encoding norm |")
    print("|---|---|---|---|---|---|---|---|")
    for core in args.cores:
        for seed in range(args.seeds):
            agent = quick_agent(core, seed, args.distractor, changes)
            moved, read_moved, read_size, weights, stored = [], [], [], [], []
            seen: dict = {}
            with torch.no_grad(), recorded_reads(seen):
                for a, b, phases in pairs:
                    x = agent.encoder({"grid": torch.as_tensor(np.stack([a, b]))})
                    y, _ = agent.core(x)
                    steps = np.nonzero(phases == 2)[0]
                    moved.append(float((y[0] - y[1])[steps].norm(dim=-1).mean() / y[:, steps].norm(dim=-1).mean()))
                    stored.append(float(x.norm(dim=-1).mean()))
                    if seen:
                        out = seen["out"]
                        read_moved.append(float((out[0] - out[1])[steps].norm(dim=-1).mean()
                                                / out[:, steps].norm(dim=-1).mean()))
                        read_size.append(float(out[:, steps].norm(dim=-1).mean() / y[:, steps].norm(dim=-1).mean()))
                        if (w := explore_weight(seen, steps)) is not None:
                            weights.append(w)
            memory = getattr(getattr(agent.core, "layers", [None])[0], "memory", None)  # HTM's first HTMAttention
            encoded = getattr(memory, "position_encoding", False)
            slot_norm = memory.slot_encoding.norm(dim=-1).mean().item() if encoded else None

            def show(values, digits=3):
                return f"{fmean(values):.{digits}f}" if values else "-"

            print(f"| {core} | {seed} | {show(moved)} | {show(read_moved)} | {show(read_size, 2)} | {show(weights)} "
                  f"| {show(stored, 2)} | {'-' if slot_norm is None else f'{slot_norm:.2f}'} |", flush=True)


if __name__ == "__main__":
    main()
