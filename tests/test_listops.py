"""ListOps: generator rules, evaluator, LRA tokenisation, TSV files, augmentation, batches, experiments."""

from __future__ import annotations

import importlib.util
import random
import statistics

import numpy as np
import pytest
import torch

from chronomem.tasks import listops as lo
from chronomem.tasks.listops import ListOpsTask


def naive_value(tree) -> int:
    """Reference semantics written independently: recursion with the statistics module."""
    if isinstance(tree, int):
        return tree
    op, args = tree
    values = [naive_value(a) for a in args]
    return {
        "[MIN": min(values),
        "[MAX": max(values),
        "[MED": int(np.floor(statistics.median(values))),
        "[SM": sum(values) % 10,
    }[op]


@pytest.fixture(scope="module")
def examples():
    return lo.generate(300, 20, 120, seed=3)


def test_evaluator_on_hand_examples():
    assert lo.evaluate("[MAX 2 9 [MIN 4 7 ] 0 ]") == 9
    assert lo.evaluate("[MED 1 2 3 8 ]") == 2  # median 2.5, rounded down as LRA's int(np.median)
    assert lo.evaluate("[MED 5 1 9 ]") == 5
    assert lo.evaluate("[SM 9 8 7 ]") == 4
    assert lo.evaluate("[MIN [SM 5 5 ] 3 ]") == 0
    assert lo.evaluate("( ( ( [MAX 2 ) 9 ) ] )") == 9  # LRA source text with parentheses
    assert lo.evaluate("7") == 7
    for bad in ("[MAX 2 9", "[MAX ]", "2 3", "[FOO 1 2 ]", "", "]"):
        with pytest.raises(ValueError):
            lo.evaluate(bad)


def test_generated_labels_equal_evaluator(examples):
    for tree, label in examples:
        tokens = lo.to_tokens(tree)
        assert label == lo.evaluate(tokens) == lo.evaluate(lo.to_source(tree)) == naive_value(tree)


def test_lengths_depth_and_arguments(examples):
    assert len({tuple(lo.to_tokens(t)) for t, _ in examples}) == len(examples)  # no duplicates
    for tree, _ in examples:
        assert 20 < len(lo.to_tokens(tree)) < 120  # LRA's strict bounds
        assert lo.depth(tree) <= 10
        assert all(2 <= n <= 10 for n in lo.arities(tree))
    shallow = lo.generate(50, 5, 60, seed=0, max_depth=3, max_args=4)
    assert all(lo.depth(t) <= 3 and all(2 <= n <= 4 for n in lo.arities(t)) for t, _ in shallow)
    assert {op for t, _ in examples for op in lo.to_tokens(t) if op.startswith("[")} == set(lo.OPERATORS)


def test_operators_restrict_the_draw_and_keep_the_default_stream(tmp_path):
    two = lo.generate(60, 10, 60, seed=3, operators=(lo.MIN, lo.SM))
    assert {op for t, _ in two for op in lo.to_tokens(t) if op.startswith("[")} == {lo.MIN, lo.SM}
    assert all(label == lo.evaluate(lo.to_tokens(t)) for t, label in two)
    assert lo.generate(20, 10, 50, seed=5, operators=lo.OPERATORS) == lo.generate(20, 10, 50, seed=5)
    task = ListOpsTask(min_length=10, max_length=60, num_train=8, num_val=4, num_test=4, operators=[lo.MAX])
    assert task.describe()["operators"] == [lo.MAX]
    assert {t for x in task.split("train")[0] for t in lo.decode(x) if t.startswith("[")} == {lo.MAX}
    sizes = dict(min_length=10, max_length=60, num_train=8, num_val=4, num_test=4, cache_dir=str(tmp_path))
    ListOpsTask(**sizes).split("train")
    cached = ListOpsTask(**sizes, operators=(lo.MAX,)).split("train")[0]  # not the four-operator files
    assert {t for x in cached for t in lo.decode(x) if t.startswith("[")} == {lo.MAX}
    for bad in ("[MAX", (), (lo.MAX, lo.MAX), ("[ADD",)):
        with pytest.raises(ValueError, match="operators"):
            ListOpsTask(operators=bad)


def test_lra_source_text_and_tokenisation():
    tree = ("[MAX", (2, 9, ("[MIN", (4, 7))))
    assert lo.to_source(("[MAX", (2, 9))) == "( ( ( [MAX 2 ) 9 ) ] )"
    source = lo.to_source(tree)
    assert source == "( ( ( ( [MAX 2 ) 9 ) ( ( ( [MIN 4 ) 7 ) ] ) ) ] )"
    tokens = lo.tokenize(source)
    assert tokens == ["[MAX", "2", "9", "[MIN", "4", "7", "]", "]"]
    assert lo.parse(source) == tree
    ids = lo.encode(tokens)
    assert lo.decode(ids) == tokens
    # LRA's 15 symbols, padding 0 reserved
    assert sorted(lo.VOCAB) == sorted([str(v) for v in range(10)] + ["[MAX", "[MIN", "[MED", "[SM", "]"])
    assert sorted(lo.VOCAB.values()) == list(range(1, 16)) and ListOpsTask.vocab_size == 16
    with pytest.raises(ValueError, match="unknown token"):
        lo.encode(["[FIRST"])


def test_tsv_round_trip(tmp_path, examples):
    path = tmp_path / "basic_test.tsv"
    lo.write_tsv(path, examples)
    lines = path.read_text().splitlines()
    assert lines[0] == "Source\tTarget"
    assert lines[1].split("\t")[0] == lo.to_source(examples[0][0])
    ids, labels = lo.read_tsv(path, check_labels=True)
    assert labels.tolist() == [v for _, v in examples]
    assert [lo.decode(x) for x in ids] == [lo.to_tokens(t) for t, _ in examples]
    # writing what was read gives the same file
    again = tmp_path / "again.tsv"
    lo.write_tsv(again, [(lo.decode(x), y) for x, y in zip(ids, labels, strict=True)])
    assert again.read_text() == path.read_text()


@pytest.mark.parametrize(
    "line, message",
    [
        ("( ( [MAX 2 ) 9 ) ] )", "2 tab-separated fields"),
        ("( ( ( [MAX 2 ) 9 ) ] )\t12", "target"),
        ("( ( ( [MAX 2 ) 9 ) ] )\tx", "target"),
        ("( ( ( [MAX 2 ) 9 ) ] )\t3\t4", "2 tab-separated fields"),
        ("( ( ( [MAX 2 ) 19 ) ] )\t3", "unknown token"),
        ("  \t3", "empty source"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "basic_train.tsv"
    path.write_text("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n" + line + "\n")
    with pytest.raises(ValueError, match=rf"basic_train\.tsv, line 3: .*{message}"):
        lo.read_tsv(path)


def test_bad_header_and_wrong_label(tmp_path):
    path = tmp_path / "x.tsv"
    path.write_text("Input\tLabel\n1\t1\n")
    with pytest.raises(ValueError, match=r"x\.tsv, line 1"):
        lo.read_tsv(path)
    path.write_text("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t3\n")
    lo.read_tsv(path)  # labels are trusted by default
    with pytest.raises(ValueError, match=r"line 2: the label 3 differs"):
        lo.read_tsv(path, check_labels=True)


def test_augmentation_keeps_labels_and_multiplies_length(examples):
    for tree, label in examples[:50]:
        tokens = lo.to_tokens(tree)
        for k in (1, 2, 3, 4):
            augmented = lo.augment(tokens, k)
            assert lo.evaluate(augmented) == label
            assert len(augmented) == (len(tokens) if k == 1 else k * len(tokens) + 2)
            if k > 1:
                assert lo.parse(augmented) == ("[MAX", (tree,) * k)
    with pytest.raises(ValueError):
        lo.augment(["1"], 0)


def test_task_batches_masks_and_padding():
    task = ListOpsTask(min_length=10, max_length=60, num_train=40, num_val=8, num_test=12, seed=0)
    assert task.kind == "classify" and task.num_classes == 10 and not task.causal
    batch = task.sample(16, torch.Generator().manual_seed(0))
    lengths = batch.mask.sum(1)
    assert batch.inputs.dtype == torch.long and batch.inputs.shape == (16, int(lengths.max()))
    assert torch.equal(batch.mask, batch.inputs != 0)
    for row in range(16):  # valid tokens first, then padding; label = value of the valid tokens
        n = int(lengths[row])
        assert batch.mask[row, :n].all() and not batch.mask[row, n:].any()
        assert lo.evaluate(lo.decode(batch.inputs[row, :n].tolist())) == int(batch.targets[row])
        assert 10 < n < 60
    eval_batches = list(task.eval_batches(5, 100))
    assert [b.inputs.shape[0] for b in eval_batches] == [5, 5, 2]  # whole test split, in order
    again = list(task.eval_batches(5, 100))
    assert all(torch.equal(a.inputs, b.inputs) for a, b in zip(eval_batches, again, strict=True))
    # splits are disjoint and the test set does not depend on the training set size
    keys = {s: {tuple(x.tolist()) for x in task.split(s)[0]} for s in ("train", "val", "test")}
    assert not keys["train"] & keys["test"] and not keys["val"] & keys["test"]
    assert not keys["train"] & keys["val"]
    other = ListOpsTask(min_length=10, max_length=60, num_train=5, num_val=8, num_test=12, seed=0)
    assert keys["test"] == {tuple(x.tolist()) for x in other.split("test")[0]}
    assert sum(task.label_counts("train").values()) == 40


def test_task_augment_and_official_files(tmp_path):
    options = dict(min_length=10, max_length=60, num_train=10, num_val=4, num_test=6, seed=1)
    task = ListOpsTask(**options)
    for k in (2, 3):
        long = task.with_augment(k)
        same = ListOpsTask(**options, augment=k)
        ids, labels = long.split("test")
        assert all(np.array_equal(a, b) for a, b in zip(ids, same.split("test")[0], strict=True))
        assert np.array_equal(labels, task.split("test")[1])
        assert [len(x) for x in ids] == [k * len(x) + 2 for x in task.split("test")[0]]
        assert [lo.evaluate(lo.decode(x)) for x in ids] == labels.tolist()
    for split in ("train", "val", "test"):
        ids, labels = task.split(split)
        rows = [(lo.decode(x), y) for x, y in zip(ids, labels, strict=True)]
        lo.write_tsv(tmp_path / f"basic_{split}.tsv", rows)
    official = ListOpsTask(data_dir=str(tmp_path), num_train=7)
    assert len(official.split("train")[0]) == 7 and len(official.split("test")[0]) == 6
    batch = next(official.eval_batches(6, 6))
    assert batch.targets.tolist() == task.split("test")[1].tolist()
    options["cache_dir"] = str(tmp_path)
    first = ListOpsTask(**options).split("train")
    assert len(list(tmp_path.glob("listops-*.tsv"))) == 3
    again = ListOpsTask(**options)
    assert all(np.array_equal(a, b) for a, b in zip(first[0], again.split("train")[0], strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(first[0], task.split("train")[0], strict=True))


def test_bad_task_arguments():
    with pytest.raises(ValueError, match="min_length"):
        ListOpsTask(min_length=50, max_length=50)
    with pytest.raises(ValueError, match="augment"):
        ListOpsTask(augment=0)
    with pytest.raises(ValueError, match="num_train"):
        ListOpsTask(num_train=-1)
    with pytest.raises(ValueError, match="split"):
        ListOpsTask(min_length=1, max_length=20, num_train=1, num_val=1, num_test=1).split("dev")


def test_generation_is_seeded():
    a = lo.generate(20, 10, 50, seed=5)
    b = lo.generate(20, 10, 50, seed=5)
    c = lo.generate(20, 10, 50, seed=6)
    assert a == b and a != c
    accepted = rejected = 0
    for seed in range(200):  # max_length either rejects the draw or bounds it; accepted trees are exact
        tree, length, value = lo.generate_tree(random.Random(seed), max_length=12)
        if tree is None:
            assert length >= 12 and value == -1
            rejected += 1
        else:
            tokens = lo.to_tokens(tree)
            assert length == len(tokens) < 12 and value == lo.evaluate(tokens)
            accepted += 1
    assert accepted and rejected  # both branches were exercised


def test_generated_data_is_the_same_as_before_the_memory_change():
    """Digests of what the implementation before ``draw`` (token-tuple keys, lists of trees) produced:
    keeping only token ids must not change a single expression."""
    import hashlib

    task = ListOpsTask(min_length=10, max_length=60, num_train=40, num_val=8, num_test=12, seed=0)
    digest = hashlib.sha256()
    for split in ("test", "val", "train"):
        ids, labels = task.split(split)
        for x in ids:
            digest.update(x.tobytes() + b"|")
        digest.update(labels.tobytes())
    assert digest.hexdigest() == "62ad88a7304093881cdd634b273fecf49a88abca34f58ab1a46db67004884205"
    trees = repr(lo.generate(20, 10, 50, seed=5)).encode()
    assert hashlib.sha256(trees).hexdigest() == "d448522481f4989a89ed55a73561dd90ddf13dda9d84659418ffe9d6fb12d501"
    drawn = list(lo.draw(20, 10, 50, seed=5))
    assert [(t, v) for t, v, _ in drawn] == lo.generate(20, 10, 50, seed=5)
    assert all(np.array_equal(ids, lo.encode(lo.to_tokens(t))) for t, _, ids in drawn)


def test_lra_sized_data_takes_a_few_kilobytes_an_expression():
    """Kept: one uint8 id per token and its bytes in the duplicate check (before: ~58 KB an expression
    of LRA's lengths, one str object per token; 4.7 GB for the 96,000 of LRA's training set)."""
    import gc
    import tracemalloc

    ListOpsTask(min_length=1, max_length=5, num_train=1, num_val=0, num_test=0).split("train")  # imports done
    tracemalloc.start()
    try:
        task = ListOpsTask(num_train=30, num_val=0, num_test=0, seed=0)
        ids, _ = task.split("train")
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    tokens = sum(len(x) for x in ids)
    assert all(x.dtype == np.uint8 for x in ids) and all(isinstance(k, bytes) for k in task._exclude)
    assert kept < 3 * tokens + 30 * 1_000, (kept, tokens)


def test_generation_progress_on_stderr(monkeypatch, capsys):
    from chronomem import progress

    options = dict(min_length=10, max_length=40, num_train=6, num_val=0, num_test=3, seed=0)
    ListOpsTask(**options).split("train")  # a short generation leaves no trace
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "LINE_INTERVAL", 0.0)
    ListOpsTask(**options).split("train")
    err = capsys.readouterr().err
    assert "listops test split: expression 3/3 (100%)" in err and "listops test split: done, 3 expressions" in err
    assert "listops train split: expression 6/6" in err and "listops train split: done, 6 expressions" in err
    ListOpsTask(**options, progress=False).split("train")
    assert capsys.readouterr().err == ""


TRAIN_AVAILABLE = importlib.util.find_spec("chronomem.train") is not None


@pytest.mark.skipif(not TRAIN_AVAILABLE, reason="chronomem.train is not importable yet")
def test_experiments_smoke(tmp_path):
    from chronomem.experiments.base import run_experiment
    from chronomem.registry import get_experiment, names

    registered = set(names()["models"])
    result = run_experiment(get_experiment("listops"), "smoke", tmp_path / "listops")
    assert set(result["results"]) == {"transformer", "tlb", "blrp", "transformer-xl"}
    for model, row in result["results"].items():
        if model in registered:  # a mechanism not written yet is reported as "not available"
            assert 0.0 <= row["accuracy"] <= 100.0
    assert sum(result["extra"]["data"]["test"]["labels"].values()) == 32
    length = run_experiment(get_experiment("listops-length"), "smoke", tmp_path / "listops-length")
    assert length["config"]["checkpoints"].endswith("listops")  # reused the listops run, not retrained
    assert set(length["results"]) == registered & set(result["results"])
    for row in length["results"].values():
        assert set(row) == {"x1", "x2", "x3", "x4"} and all(0.0 <= v <= 100.0 for v in row.values())
    # the x1 column re-evaluates the trained checkpoint on the same test set: same accuracy
    for model, row in length["results"].items():
        assert row["x1"] == pytest.approx(result["results"][model]["accuracy"])


@pytest.mark.skipif(not TRAIN_AVAILABLE, reason="chronomem.train is not importable yet")
def test_paper_scale_models_are_configured_as_their_sources():
    """paper scale: TLB is the authors' LRA model, the Transformer LRA's, BLRP paper 002 Table 2; the
    LRA models train under LRA's schedule, 0.05 (/ 4 for TLB) * min(1, s / 1000) / sqrt(max(s, 1000))."""
    from chronomem.experiments import listops as exp
    from chronomem.heads import build_model
    from chronomem.train.loop import make_optimizer, make_scheduler

    s = exp.SCALES["paper"]
    task = ListOpsTask(min_length=10, max_length=40, num_train=8, num_val=4, num_test=4, seed=0)
    batch = task.sample(2, torch.Generator().manual_seed(0))
    for model, width, base_lr in (("tlb", 512, 0.05 / 4), ("transformer", 512, 0.05), ("blrp", 64, None)):
        options = exp.model_options(model, s)
        torch.manual_seed(0)
        net = build_model(model, task, **options).eval()
        assert net.backbone.dim == width
        logits, _ = net(batch.inputs, mask=batch.mask)
        assert logits.shape == (2, 10) and torch.isfinite(logits).all()
        cfg = exp.train_config(s, 0, model)
        lr = make_scheduler(make_optimizer(net, cfg), cfg).lr_lambdas[0]
        if base_lr is None:  # paper 002 Table 2: AdamW 4e-4, linear decay
            assert (cfg.lr, cfg.schedule, cfg.weight_decay) == (4e-4, "linear", 0.0)
            assert (net.backbone.config.dim, net.readout) == (64, "mlp")
            continue
        assert isinstance(net.mlp[1], torch.nn.ReLU) and net.mlp[0].out_features == 1024  # LRA's head
        assert (cfg.weight_decay, cfg.clip, cfg.betas, cfg.eps, cfg.steps, cfg.batch_size) == (
            0.1, None, (0.9, 0.98), 1e-9, 5_000, 32)
        for step in (1_000, 1_001, 2_500, 4_999):  # the rsqrt decay
            assert cfg.lr * lr(step) == pytest.approx(base_lr / max(step, 1_000) ** 0.5, rel=1e-12)
        for step in (0, 499, 998):  # the warm-up, one step ahead of LRA's (which starts at lr 0)
            assert cfg.lr * lr(step) == pytest.approx(base_lr * (step + 1) / 1_000 / 1_000**0.5, rel=1e-12)
    tlb = build_model("tlb", task, **exp.model_options("tlb", s)).backbone.config
    assert tlb == type(tlb).authors()  # the authors' preset at their ListOps sizes
    assert exp.model_options("transformer", s)["depth"] == 4  # base_listops_config.py: num_layers 4


def test_the_easy_length_test_draws_min_and_max_at_most_three_deep_and_otherwise_keeps_listops_settings():
    import dataclasses

    from chronomem.experiments import listops as exp
    from chronomem.tasks.listops import decode, depth, parse

    for name, easy in exp.EASY_SCALES.items():
        assert (easy.max_depth, easy.max_args, easy.operators) == (3, 5, (lo.MIN, lo.MAX))
        base = exp.SCALES["quick" if name == "paper" else name]
        same = dataclasses.replace(easy, max_depth=base.max_depth, max_args=base.max_args, operators=base.operators,
                                   data=base.data, segment=base.segment, memory=base.memory, steps=base.steps)
        assert same == base
    task = exp.make_task(exp.EASY_SCALES["smoke"], seed=0)
    trees = [parse(decode(x)) for x in task.split("test")[0]]
    assert max(depth(t) for t in trees) == 3 and all(n <= 5 for t in trees for n in lo.arities(t))
    assert {op for t in trees for op in lo.to_tokens(t) if op.startswith("[")} == {lo.MIN, lo.MAX}
    lra = exp.make_task(exp.SCALES["smoke"], seed=0)
    assert max(depth(parse(decode(x))) for x in lra.split("test")[0]) > 3  # the usual data nests deeper
