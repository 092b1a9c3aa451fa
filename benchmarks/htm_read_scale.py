"""How large is HTM's memory read at initialisation, beside the residual stream it is added to?

An untrained one-layer HTM (the quick RL agent's: width 64, 4 heads, chunks of 16, top-4 of 24 chunks,
a local window of 16) reads a batch of random sequences of unit-variance inputs; the script prints the
mean norm per step of the input, of the memory read (``x + read`` in ``HTMLayer``: the HTM block) and
of the layer's whole update ``y - x``, for the released module's ``init_scale=2`` (docs/htm.md) and
PyTorch's default (``init_scale=None``). docs/rl.md, "HTM's read at initialisation".

A second table (``--input-scale``: the inputs' standard deviation per feature; 0.09 gives the quick
agent's encoder outputs, of norm ~0.7 at width 64) prints the mean norm per step of the output the
policy and value read, before the first chunk completes (no read) and after, for the paper's layer
(``init_scale=2``), without the slot encoding, with the read gated shut, and with ``final_norm``
(docs/htm.md, "final_norm").

    python benchmarks/htm_read_scale.py
    python benchmarks/htm_read_scale.py --dim 256 --steps 120
    python benchmarks/htm_read_scale.py --input-scale 0.09

``--runs DIR ...`` measures trained agents instead: each PPO run's HTM agent (its newest checkpoint)
plays ``--episodes`` episodes of its own env, actions drawn from its policy (seeded), and a table gives,
per layer and per phase of the episode (``info["phase"]``: Visual Match's and Key-to-Door's explore,
distractor and reward; Ballet's dance and choice), the mean norm per step of the residual stream entering
the HTM block, of the read added to it (times the gate, with ``read_gate``) and of their ratio (docs/rl.md, "The paper's
layer's missed controls hold a read larger than the stream it joins"); then of the core's output, which
the policy and value read, and the share of the policy's and of the value's hidden units that pass it
(almost) no gradient: tanh units saturated (``|tanh| > 0.99``), ReLU units at 0 (docs/rl.md, "What the
missed controls have in common"):

    python benchmarks/htm_read_scale.py --runs runs/vm-d30-htm/control/htm-seed0 --episodes 16 [--jsonl FILE]

``--untrained`` measures each run's agent as it was before training instead (built from its config with
torch seeded by its seed, as ``chronomem rl train`` builds it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from statistics import fmean

import torch

from chronomem.experiments.visual_match import CPU_AGENT, CPU_HTM


@contextlib.contextmanager
def recorded_reads(record):
    """Within the block, every ``HTMAttention.read`` calls ``record(module, inputs, output)`` after reading
    (``inputs``: its positional arguments after ``self``); the method is restored on the way out."""
    from chronomem.htm import HTMAttention

    original = HTMAttention.read

    def read(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        record(self, args, out)
        return out

    HTMAttention.read = read
    try:
        yield
    finally:
        HTMAttention.read = original


def quick_core(dim: int, **options):
    """The quick RL agent's HTM (visual_match's CPU_AGENT and CPU_HTM: one layer, 4 heads, chunks of 16,
    top-4 of 24, window 16), with ``options``."""
    from chronomem.htm import build_htm

    return build_htm(dim, CPU_AGENT["depth"], CPU_AGENT["heads"], **CPU_HTM, **options)


@torch.inference_mode()
def trained_reads(run: str, episodes: int, seed: int = 0, untrained: bool = False) -> dict:
    """``{"gates": [...], (layer, phase): (stream, read, ratio, output, actor, critic)}`` of the HTM agent of
    PPO run ``run`` over ``episodes`` episodes of its env (module docstring: ``--runs``): the mean norm per
    step of the residual stream entering each layer's HTM block, of the read added to it (gated), their
    ratio, the norm of the core's output, and the share of the policy's and the value's hidden units
    (``ActorCritic``'s one hidden layer each) that pass no gradient (``agents.passes_no_gradient``:
    ``|tanh| > 0.99``, or ReLU at 0).
    The phase is ``info["phase"]`` of the observation read (-1 where the env gives none). ``untrained``: the
    run's agent as initialised (its config, torch seeded with its seed), not its checkpoint."""
    import gymnasium as gym

    import chronomem.envs  # noqa: F401  (registers the ids)
    from chronomem.agents import passes_no_gradient
    from chronomem.htm import HTMTransformer
    from chronomem.rl.evaluate import built_agent, load_agent

    if untrained:  # the same agent before training: built from the run's config after seeding as ppo.train does
        from chronomem.train.resume import find_run

        saved = find_run(run, kind="ppo").config
        torch.manual_seed(saved["args"]["seed"])
        agent, args = built_agent(saved)
        agent.eval()
    else:
        agent, args, _ = load_agent(run, device="cpu")
    if not isinstance(agent.core, HTMTransformer):
        raise ValueError(f"--runs must name runs of an HTM agent, got core {type(agent.core).__name__} in {run}")
    layers = list(agent.core.layers)
    streams: dict[int, float] = {}
    hooks = [layer.norm_memory.register_forward_pre_hook(
        lambda module, inputs, i=i: streams.__setitem__(i, inputs[0][0, -1].norm().item()))
        for i, layer in enumerate(layers)]
    heads: dict[str, float] = {}

    def no_gradient(name):
        def record(module, inputs, out):
            heads[name] = passes_no_gradient(module, out[0, -1]).float().mean().item()
        return record

    hooks += [agent.actor[1].register_forward_hook(no_gradient("actor")),
              agent.critic[1].register_forward_hook(no_gradient("critic")),
              agent.core.register_forward_hook(lambda module, inputs, out: heads.__setitem__(
                  "output", out[0][0, -1].norm().item()))]
    reads: list[float] = []

    def record(module, inputs, out):
        layer = next(i for i, layer in enumerate(layers) if layer.memory is module)
        gate = 1.0 if layers[layer].read_gate is None else abs(layers[layer].read_gate.item())
        reads.append((layer, gate * out[0, -1].norm().item()))  # the norm of a * read

    found: dict = {}
    env, draws = gym.make(args.env), torch.Generator().manual_seed(seed)
    try:
        with recorded_reads(record):
            for episode in range(episodes):
                obs, info = env.reset(seed=seed + episode)
                state, done = agent.initial_state(1), False
                while not done:
                    reads.clear()
                    logits, _, state = agent({k: torch.as_tensor(v)[None, None] for k, v in obs.items()}, state)
                    for layer, read in reads:
                        found.setdefault((layer, info.get("phase", -1)), []).append(
                            (streams[layer], read, heads["output"], heads["actor"], heads["critic"]))
                    action = torch.multinomial(logits[0, 0].softmax(-1), 1, generator=draws)
                    obs, _, terminated, truncated, info = env.step(int(action))
                    done = terminated or truncated
    finally:
        env.close()
        for hook in hooks:
            hook.remove()
    table = {key: (fmean(s for s, *_ in rows), fmean(r for _, r, *_ in rows), fmean(r / s for s, r, *_ in rows),
                   *(fmean(row[i] for row in rows) for i in (2, 3, 4)))
             for key, rows in sorted(found.items())}
    return {"gates": [None if layer.read_gate is None else layer.read_gate.item() for layer in layers], **table}


def print_trained(runs: list[str], episodes: int, seed: int, jsonl: str | None = None,
                  untrained: bool = False) -> None:
    """The table of ``trained_reads`` for every run; with ``jsonl``, one record per run appended to it."""
    from chronomem.envs.tvt import PHASES

    print(f"{'untrained' if untrained else 'trained'} agents, {episodes} episodes each, actions drawn (seed {seed})")
    print("| run | layer | gate | phase | stream | read | read / stream | output | no gradient: policy / value |")
    print("|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        found = trained_reads(run, episodes, seed, untrained)
        rows = []
        for (layer, phase), (stream, read, ratio, output, actor, critic) in (
                (k, v) for k, v in found.items() if k != "gates"):
            gate = found["gates"][layer]
            name = phase if isinstance(phase, str) else PHASES[phase] if 0 <= phase < len(PHASES) else "-"
            rows.append({"layer": layer, "gate": gate, "phase": name, "stream": round(stream, 3),
                         "read": round(read, 3), "read_over_stream": round(ratio, 3), "output": round(output, 3),
                         "no_gradient_policy": round(actor, 3), "no_gradient_value": round(critic, 3)})
            print(f"| {run} | {layer} | {'-' if gate is None else f'{gate:.3f}'} | {name} | {stream:.2f} | {read:.2f} "
                  f"| {ratio:.2f} | {output:.2f} | {actor:.2f} / {critic:.2f} |")
        if jsonl:
            with open(jsonl, "a") as f:
                f.write(json.dumps({"run": run, "untrained": untrained, "episodes": episodes, "seed": seed,
                                    "rows": rows}) + "\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=60, help="a Key-to-Door episode at distractor 30")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--input-scale", type=float, default=1.0, help="the inputs' std per feature")
    parser.add_argument("--runs", nargs="+", metavar="DIR", help="trained HTM agents (PPO runs) instead")
    parser.add_argument("--episodes", type=int, default=16, help="--runs: episodes per run")
    parser.add_argument("--seed", type=int, default=0, help="--runs: seed of the episodes and the actions")
    parser.add_argument("--jsonl", help="--runs: append one record per run (every row) to this file")
    parser.add_argument("--untrained", action="store_true",
                        help="--runs: each run's agent as initialised (its config and seed), not its checkpoint")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")

    torch.set_num_threads(1)
    if args.runs:
        print_trained(args.runs, args.episodes, args.seed, args.jsonl, args.untrained)
        return
    print("| init_scale | input | memory read | read / input | layer update y - x |")
    print("|---|---|---|---|---|")
    for init_scale in (2.0, None):
        inputs, reads, updates = [], [], []
        for seed in range(args.seeds):
            torch.manual_seed(seed)
            core = quick_core(args.dim, init_scale=init_scale)
            x = args.input_scale * torch.randn(args.batch, args.steps, args.dim)

            def norm(module, inputs, out, reads=reads):  # the mean norm per step of each read
                reads.append(out.norm(dim=-1).mean().item())

            with torch.no_grad(), recorded_reads(norm):
                y, _ = core(x)
            inputs.append(x.norm(dim=-1).mean().item())
            updates.append((y - x).norm(dim=-1).mean().item())
        print(f"| {init_scale} | {fmean(inputs):.2f} | {fmean(reads):.2f} | {fmean(reads) / fmean(inputs):.2f} "
              f"| {fmean(updates):.2f} |")
    print()
    chunk = CPU_HTM["chunk_size"]
    print("| layer | output before the first chunk completes | after |")
    print("|---|---|---|")
    for name, options in OUTPUT_VARIANTS.items():
        before, after = [], []
        for seed in range(args.seeds):
            torch.manual_seed(seed)
            core = quick_core(args.dim, **options)
            with torch.no_grad():
                y, _ = core(args.input_scale * torch.randn(args.batch, args.steps, args.dim))
            norms = y.norm(dim=-1)
            before.append(norms[:, :chunk].mean().item())  # no chunk complete yet: nothing read
            after.append(norms[:, chunk:].mean().item())
        print(f"| {name} | {fmean(before):.2f} | {fmean(after):.2f} |")


# The output the heads read, per layer (the second table)
OUTPUT_VARIANTS = {
    "paper's (init_scale=2)": {},
    "no slot encoding": {"position_encoding": False},
    "read gated shut": {"read_gate": 0.0},
    "final_norm": {"final_norm": True},
}


if __name__ == "__main__":
    main()
