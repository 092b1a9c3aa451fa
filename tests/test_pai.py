"""Paired associative inference task: structure, chunk alignment, solvability, bad input, smoke run."""

import pytest
import torch

from chronomem.htm import HierarchicalMemory
from chronomem.registry import get_task
from chronomem.tasks.pai import ROLES, PAITask

torch.set_num_threads(1)


def episode(task, batch=5, seed=0):
    return task.sample(batch, torch.Generator().manual_seed(seed))


def decode(task, inputs):
    F, n = task.item_dim, task.n_triplets
    items, roles = inputs[..., :F], inputs[..., F:]
    pairs = items[: 4 * n].view(2 * n, 2, F)
    return pairs, items[4 * n], items[4 * n + 1], items[4 * n + 2], roles


def oracle(task, inputs):
    """Follow the chain from the probe through the stored pairs until it reaches one of the choices;
    return (the index of that choice, the number of hops)."""
    pairs, c0, c1, probe, _ = decode(task, inputs)
    cur, hops = probe, 0
    while not (torch.equal(cur, c0) or torch.equal(cur, c1)):
        nxt = [i for i in range(len(pairs)) if torch.equal(pairs[i, 0], cur)]
        assert len(nxt) == 1 and hops < 2  # each item starts at most one pair; chains are A -> B -> C
        cur, hops = pairs[nxt[0], 1], hops + 1
    assert not (torch.equal(cur, c0) and torch.equal(cur, c1))  # the other choice is a foil
    return (0 if torch.equal(cur, c0) else 1), hops


@pytest.mark.parametrize("query", ["indirect", "direct", "mixed"])
def test_structure_and_oracle(query):
    task = PAITask(n_triplets=5, item_dim=6, query=query)
    batch = episode(task, batch=48)
    assert batch.inputs.shape == (48, task.length, task.input_dim) and task.length == 4 * 5 + 3
    assert task.input_dim == 6 + len(ROLES) and batch.targets.shape == (48,)
    kinds = set()
    for b in range(48):
        pairs, c0, c1, probe, roles = decode(task, batch.inputs[b])
        answer, hops = oracle(task, batch.inputs[b])
        assert answer == int(batch.targets[b])
        # MEMO's trial types: AB (the probe starts a pair), BC (it ends one), AC (two hops).
        kinds.add((hops, any(torch.equal(pairs[i, 1], probe) for i in range(len(pairs)))))
        # Roles: pair first / second alternate, then choice 0, choice 1, probe.
        expect = [0, 1] * (2 * task.n_triplets) + [2, 3, 4]
        assert roles.argmax(-1).tolist() == expect and torch.equal(roles.sum(-1), torch.ones(task.length))
        # Both choices appear as the second item of a stored pair (no "seen before" shortcut).
        for c in (c0, c1):
            assert sum(torch.equal(pairs[i, 1], c) for i in range(len(pairs))) == 1
    assert 0 < batch.targets.float().mean() < 1
    expected = {"indirect": {(2, False)}, "direct": {(1, False)}, "mixed": {(2, False), (1, False), (1, True)}}
    assert kinds == expected[query]


def test_pairs_are_chunks_of_length_two():
    task = PAITask(n_triplets=3, item_dim=4)
    x = episode(task, batch=2).inputs
    n = 2 * task.n_triplets
    mem = HierarchicalMemory.empty(2, n + 1, 2, task.input_dim).write(x[:, : task.memory_length])
    assert mem.valid.sum(1).tolist() == [n, n]
    order = mem.chunk_id[0].masked_fill(~mem.valid[0], 10**6).argsort()[:n]
    torch.testing.assert_close(mem.contents[0, order], x[0, : task.memory_length].view(n, 2, -1))


def test_deterministic_and_registered():
    task = get_task("pai")(n_triplets=3, item_dim=4)
    a, b = episode(task, seed=3), episode(task, seed=3)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(episode(task, seed=4).inputs, a.inputs)
    test1 = next(task.eval_batches(4, 4)).inputs
    assert torch.equal(test1, next(task.eval_batches(4, 4)).inputs)
    assert task.describe() == {
        "name": "pai",
        "n_triplets": 3,
        "item_dim": 4,
        "shuffle": True,
        "query": "indirect",
    }


def test_bad_input():
    with pytest.raises(ValueError, match="n_triplets"):
        PAITask(n_triplets=1)
    with pytest.raises(ValueError, match="item_dim"):
        PAITask(item_dim=0)
    with pytest.raises(ValueError, match="query"):
        PAITask(query="sideways")


def test_pai_experiment_smoke(tmp_path):
    from chronomem.experiments.base import run_experiment
    from chronomem.registry import get_experiment

    results = run_experiment(get_experiment("pai"), "smoke", tmp_path)
    assert set(results["results"]) == {"htm", "transformer"}
    # Trained on MEMO's mix of trial types, scored on the AC (indirect) and AB (direct) trials.
    assert results["config"]["task"]["query"] == "mixed"
    for row in results["results"].values():
        assert set(row) == {"length 3", "direct (A -> B)"} and all(0 <= v <= 100 for v in row.values())
    assert (tmp_path / "report.md").exists() and (tmp_path / "results.json").exists()


def test_choice_readout_scores_the_embedded_choices():
    """readout="choices" (paper 001 App. B.4): logits are dot products of a projection of the pooled
    output with the shared input embedding of each choice; checked against a literal computation."""
    from chronomem.heads import build_model

    torch.manual_seed(0)
    task = PAITask(n_triplets=2, item_dim=4)
    assert task.choice_steps == (4 * task.n_triplets, 4 * task.n_triplets + 1)
    batch = episode(task, batch=3)
    roles = batch.inputs[:, list(task.choice_steps), task.item_dim:].argmax(-1)
    assert roles.tolist() == [[2, 3]] * 3  # the steps named by choice_steps hold choice 0 and choice 1
    net = build_model("transformer", task, dim=8, depth=1, num_heads=2, pooling="last", readout="choices")
    logits, _ = net(batch.inputs)
    y, _ = net.backbone(net.embed(batch.inputs))
    out = net.project(net.norm(y[:, -1]))
    expect = torch.stack([(out * net.embed(batch.inputs[:, s])).sum(-1) for s in task.choice_steps], dim=1)
    torch.testing.assert_close(logits, expect)


def test_choice_readout_bad_input():
    from chronomem.heads import Classifier, build_model
    from chronomem.tasks.copy import CopyTask

    task = PAITask(n_triplets=2, item_dim=4)
    with pytest.raises(ValueError, match="readout"):
        build_model("transformer", task, dim=8, depth=1, num_heads=2, readout="nearest")
    with pytest.raises(ValueError, match="choice_steps"):
        Classifier(torch.nn.Identity(), 8, 2, readout="choices", input_dim=9)
    with pytest.raises(ValueError, match="choice_steps"):
        Classifier(torch.nn.Identity(), 8, 2, readout="choices", choice_steps=(1, 2, 3), input_dim=9)
    with pytest.raises(ValueError, match="readout"):
        build_model("transformer", CopyTask(), dim=8, depth=1, num_heads=2, readout="choices")


def test_fixed_readout_keeps_the_projection_and_trains_the_rest(tmp_path):
    """fixed_readout=True: the trainer leaves the choice projection at its initialisation; every other
    parameter still learns (and without the option the projection trains too)."""
    from chronomem.heads import build_model
    from chronomem.train import TrainConfig, train

    task = PAITask(n_triplets=2, item_dim=4)
    cfg = TrainConfig(steps=3, batch_size=4, lr=1e-2, eval_examples=8, progress=False)
    for fixed in (True, False):
        torch.manual_seed(0)
        net = build_model("transformer", task, dim=8, depth=1, num_heads=2, pooling="last", readout="choices",
                          fixed_readout=fixed)
        before = {name: p.detach().clone() for name, p in net.named_parameters()}
        train(net, task, cfg)  # on a GPU where there is one
        moved = {name for name, p in net.named_parameters() if not torch.equal(p.cpu(), before[name])}
        project = {"project.weight", "project.bias"}
        assert moved & project == (set() if fixed else project)
        assert "embed.weight" in moved


def test_fixed_readout_needs_the_choice_readout():
    from chronomem.heads import Classifier, build_model
    from chronomem.tasks.copy import CopyTask

    with pytest.raises(ValueError, match="fixed_readout"):
        Classifier(torch.nn.Identity(), 8, 2, readout="mlp", fixed_readout=True, input_dim=9)
    with pytest.raises(ValueError, match="fixed_readout"):
        build_model("transformer", CopyTask(), dim=8, depth=1, num_heads=2, fixed_readout=True)
