"""Does a trained Visual Match agent hold the colour? A linear readout of the target colour from what the
agent computes, step by step through the episode, beside how often the agent then chooses right.

The agent plays ``--episodes`` episodes (forced layouts drawn from ``--seed``, actions sampled, all
episodes in one batch: every episode of a TVT game has the same length). At every step the encoder's
output (what the agent sees now) and the core's output (what the policy and value heads read) are kept.
Per step, a multinomial logistic regression learns the target colour (0-2) from one of them on the first
half of the episodes and is scored on the other half: chance is 1/3. Where the core's output holds the
colour at the reward phase and the choice is still at chance, the memory carried the colour and the
heads did not learn to use it; where it does not hold it, the memory lost it (or never stored it). The
encoder's row is the control: it holds the colour while the cue is in view and not after. Beside the
core's readout, the share of the core output's variance that the colour explains (unscaled, as the heads
see it): a colour that a readout finds can still be a small part of what the heads are given. For an HTM
core, the last column is the relevance weight its read gives the episode's first chunk (the one holding
the cue: memory slot 0, while an episode has made fewer chunks than the memory holds), averaged over
episodes and layers: 0 where the chunk is not selected or not yet complete.

    python benchmarks/visual_match_readout.py RUN [--episodes 600] [--env ID] [--json OUT]
    python benchmarks/visual_match_readout.py RUN --all-checkpoints --episodes 300   # over training

RUN is a PPO run directory (its newest checkpoint) or one of its checkpoints. Passive Visual Match only
(docs/rl.md, "What decides HTM's seeds").
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from torch import Tensor, nn


@torch.inference_mode()
def play(agent: nn.Module, env_id: str, episodes: int, seed: int = 0) -> dict:
    """``{"seen": [E, T, D], "held": [E, T, D], "target": [E], "right": [E], "first_chunk": [E, T] or None}``:
    the encoder's and the core's outputs at every step of ``episodes`` episodes of ``env_id`` played in one
    batch, each episode's target colour, whether its choice was right, and for an HTM core the relevance
    weight of the episode's first chunk (the mean over layers)."""
    import gymnasium as gym

    import chronomem.envs  # noqa: F401  (registers the ids)
    import chronomem.htm as htm
    from chronomem.envs.tvt import TVTEnv, sample_layout

    envs = [gym.make(env_id) for _ in range(episodes)]
    game = envs[0].unwrapped
    if not isinstance(game, TVTEnv) or game.game != "visual_match" or game.mode != "passive":
        raise ValueError(f"--env must be a passive Visual Match id, got {env_id!r}")
    rng, actions = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    layouts = [sample_layout(rng, "visual_match", game.num_apples, game.apple_rewards, game.cue_cell) for _ in envs]
    observations = [env.reset(options={"layout": layout})[0] for env, layout in zip(envs, layouts, strict=True)]
    kept: dict[str, list[Tensor]] = {"seen": [], "held": []}
    hooks = [agent.encoder.register_forward_hook(lambda m, i, out: kept["seen"].append(out[:, 0].clone())),
             agent.core.register_forward_hook(lambda m, i, out: kept["held"].append(out[0][:, 0].clone()))]
    weights: list[Tensor] = []
    mix = htm.mix_chunks

    def mix_recording(q, relevance, top_idx, *args, **kwargs):  # an acting step: one query per row
        weights.append((relevance * (top_idx == 0)).sum(-1)[:, 0])  # the weight on slot 0: the first chunk
        return mix(q, relevance, top_idx, *args, **kwargs)

    htm.mix_chunks = mix_recording  # HTMAttention.read calls it with the relevance of the selected chunks
    state, done = agent.initial_state(episodes), False
    try:
        while not done:
            batch = {key: torch.as_tensor(np.stack([obs[key] for obs in observations]))[:, None]
                     for key in observations[0]}
            logits, _, state = agent(batch, state)
            chosen = torch.multinomial(logits[:, 0].softmax(-1), 1, generator=actions)[:, 0]
            results = [env.step(int(a)) for env, a in zip(envs, chosen, strict=True)]
            observations = [result[0] for result in results]
            ends = {bool(result[2] or result[3]) for result in results}
            if len(ends) > 1:
                raise RuntimeError("the episodes of one batch ended at different steps")
            done = ends.pop()
    finally:
        htm.mix_chunks = mix
        for hook in hooks:
            hook.remove()
        for env in envs:
            env.close()
    right = np.array([bool(result[4].get("success", False)) for result in results])  # the last step's info
    steps = len(kept["held"])
    first_chunk = torch.stack(weights, 1).view(episodes, steps, -1).mean(-1) if weights else None
    return {"seen": torch.stack(kept["seen"], 1), "held": torch.stack(kept["held"], 1),
            "target": torch.tensor([layout.target_colour for layout in layouts]), "right": right,
            "first_chunk": first_chunk}


def readout_accuracy(features: Tensor, labels: Tensor, classes: int = 3, steps: int = 200) -> float:
    """Held-out accuracy of a multinomial logistic regression (L2 1e-3, L-BFGS) fitted on the first half
    of ``features [E, D]`` and scored on the second half."""
    features, labels = features.double().clone(), labels.clone()  # not inference tensors: autograd saves them
    half = features.shape[0] // 2
    mean, std = features[:half].mean(0), features[:half].std(0).clamp(min=1e-6)
    features = (features - mean) / std
    with torch.enable_grad():
        readout = nn.Linear(features.shape[1], classes).double()
        nn.init.zeros_(readout.weight)  # a convex fit: the same optimum from any start, so start at zero
        nn.init.zeros_(readout.bias)
        optimiser = torch.optim.LBFGS(readout.parameters(), max_iter=steps, line_search_fn="strong_wolfe")

        def loss():
            optimiser.zero_grad()
            value = nn.functional.cross_entropy(readout(features[:half]), labels[:half])
            value = value + 1e-3 * readout.weight.square().sum()
            value.backward()
            return value

        optimiser.step(loss)
        with torch.no_grad():
            return float((readout(features[half:]).argmax(-1) == labels[half:]).double().mean())


def colour_share(features: Tensor, labels: Tensor) -> float:
    """The share of ``features [E, D]``'s variance (summed over dimensions, unscaled: as the heads see them)
    that the colour explains: between-colour variance over total."""
    features = features.double()
    total = (features - features.mean(0)).square().sum()
    between = sum((labels == c).sum() * (features[labels == c].mean(0) - features.mean(0)).square().sum()
                  for c in labels.unique())
    return float(between / total.clamp(min=1e-12))


def read_out(agent: nn.Module, env_id: str, episodes: int, every: int, seed: int = 0) -> dict:
    """The readout's accuracy per step (every ``every`` steps and each phase's first and last), with the
    share of right choices."""
    from chronomem.envs.tvt import EXPLORE, REWARD

    played = play(agent, env_id, episodes, seed)
    T = played["held"].shape[1]
    reward = T - REWARD  # the reward phase's first step
    marks = sorted({*range(0, T, every), EXPLORE - 1, EXPLORE, reward - 1, reward, T - 1})
    rows = [{"step": t, "phase": "explore" if t < EXPLORE else "distractor" if t < reward else "reward",
             "encoder": readout_accuracy(played["seen"][:, t], played["target"]),
             "core": readout_accuracy(played["held"][:, t], played["target"]),
             "core_share": colour_share(played["held"][:, t], played["target"]),
             **({} if played["first_chunk"] is None else {"first_chunk": float(played["first_chunk"][:, t].mean())})}
            for t in marks]
    return {"env": env_id, "episodes": episodes, "choice_right": float(played["right"].mean()), "reward_step": reward,
            "readout": rows}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    parser.add_argument("--episodes", type=int, default=600, help="episodes, half to fit and half to score")
    parser.add_argument("--env", default=None, help="Gymnasium id (default: the run's env)")
    parser.add_argument("--every", type=int, default=5, help="read out every this many steps (and the first and "
                                                              "last of each phase)")
    parser.add_argument("--all-checkpoints", action="store_true",
                        help="every checkpoint of the run, oldest first: one line each (the readout over training)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the layouts and of the sampled actions")
    parser.add_argument("--json", default=None, help="also write the tables here")
    a = parser.parse_args(argv)
    if a.episodes < 10:
        parser.error(f"--episodes must be >= 10, got {a.episodes}")
    if a.every < 1:
        parser.error(f"--every must be >= 1, got {a.every}")
    torch.set_num_threads(1)
    from chronomem.rl.evaluate import load_agent
    from chronomem.train.checkpoint import checkpoint_step, list_checkpoints
    from chronomem.train.resume import find_run

    chosen = list_checkpoints(find_run(a.run, kind="ppo").dir / "checkpoints") if a.all_checkpoints else [a.run]
    if not chosen:
        parser.error(f"no checkpoint in {a.run}")
    found = []
    for path in chosen:
        agent, args, checkpoint = load_agent(path, a.env, device="cpu")
        found.append({"run": a.run, "checkpoint": checkpoint.name, "frames": checkpoint_step(checkpoint),
                      **read_out(agent, a.env or args.env, a.episodes, a.every, a.seed)})
    if a.all_checkpoints:
        print(f"{a.run}: per checkpoint, right choices of {a.episodes} episodes and the readout's held-out accuracy of "
              "the target colour (chance 33%) from the core's output at the cue's last step, the distractor's last "
              "and the reward phase's first; for HTM the first chunk's relevance there")
        print("frames     right  cue    distractor  reward  (variance share)  first chunk")
        for run in found:
            at = {row["step"]: row for row in run["readout"]}
            reward = run["reward_step"]
            cue = max(row["step"] for row in run["readout"] if row["phase"] == "explore")
            first = at[reward].get("first_chunk")
            print(f"{run['frames']:>9,}  {100 * run['choice_right']:>5.1f}  {100 * at[cue]['core']:>5.1f}  "
                  f"{100 * at[reward - 1]['core']:>10.1f}  {100 * at[reward]['core']:>6.1f}  "
                  f"{100 * at[reward]['core_share']:>15.1f}%"
                  + ("" if first is None else f"  {first:>11.2f}"))
    else:
        run = found[0]
        print(f"{a.run} ({run['checkpoint']}): choice right in {100 * run['choice_right']:.1f}% of {a.episodes} "
              "episodes; held-out accuracy of a linear readout of the target colour (chance 33%):")
        rows = run["readout"]
        print("step  phase       encoder  core  core's variance from the colour"
              + ("  first chunk's relevance" if "first_chunk" in rows[0] else ""))
        for row in rows:
            print(f"{row['step']:>4}  {row['phase']:<10}  {100 * row['encoder']:>6.1f}  {100 * row['core']:>5.1f}  "
                  f"{100 * row['core_share']:>30.1f}%"
                  + (f"  {row['first_chunk']:>23.2f}" if "first_chunk" in row else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(found if a.all_checkpoints else found[0], f, indent=1)


if __name__ == "__main__":
    main()
