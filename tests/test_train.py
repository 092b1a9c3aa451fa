"""Trainer: exact resume, atomic and validated checkpoints, metrics, data-parallel training."""

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from chronomem.heads import Classifier, Tagger
from chronomem.tasks.base import Batch
from chronomem.tasks.copy import CopyTask
from chronomem.train import CheckpointError, TrainConfig, load_checkpoint, loop, train
from chronomem.train.metrics import loss_and_accuracy


class TinyRNN(nn.Module):
    """A GRU backbone with dropout, so that resuming must restore the RNG too."""

    def __init__(self, dim):
        super().__init__()
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.drop = nn.Dropout(0.2)
        self.out_dim = dim

    def forward(self, x, state=None, mask=None):
        y, h = self.rnn(self.drop(x), state)
        return y, h


def make_model(seed=0):
    torch.manual_seed(seed)
    return Tagger(TinyRNN(16), 16, 10, vocab_size=10)


def config(tmp_path, **kw):
    base = dict(steps=12, batch_size=8, lr=3e-3, schedule="cosine", warmup=3, progress=False, log_every=4,
                eval_examples=32, out=str(tmp_path))
    return TrainConfig(**{**base, **kw})


def flat_weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_resume_reaches_the_same_weights_and_loss(tmp_path, monkeypatch):
    task = CopyTask(seq_len=6, copy_len=3)
    full = train(make_model(), task, config(tmp_path / "full"))

    # the same run, killed right after its step-5 checkpoint, then resumed in a fresh process-like state
    real_save = loop.save_checkpoint

    def save_then_die(run_dir, step, *args):
        real_save(run_dir, step, *args)
        if step == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(loop, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(make_model(), task, config(tmp_path / "split", checkpoint_every=5))
    monkeypatch.setattr(loop, "save_checkpoint", real_save)
    torch.manual_seed(999)  # the resumed process starts from other global RNG state
    resumed = train(make_model(seed=123), task, config(tmp_path / "split"), resume=tmp_path / "split")
    assert resumed.steps == 12
    torch.testing.assert_close(flat_weights(resumed.model), flat_weights(full.model), atol=1e-6, rtol=0)
    assert abs(resumed.metrics["loss"] - full.metrics["loss"]) < 1e-6
    last_train = [r for r in full.history if r["split"] == "train"][-1]
    resumed_last = [r for r in resumed.history if r["split"] == "train"][-1]
    assert resumed_last["loss"] == pytest.approx(last_train["loss"], abs=1e-6)


def test_training_reduces_loss(tmp_path):
    task = CopyTask(seq_len=4, copy_len=2)
    result = train(make_model(), task, config(tmp_path, steps=40, schedule="constant", warmup=0))
    train_rows = [r for r in result.history if r["split"] == "train"]
    assert train_rows[-1]["loss"] < train_rows[0]["loss"]
    rows = (tmp_path / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("step,split,loss,accuracy") and rows[-1].split(",")[1] == "test"


def test_corrupt_checkpoint_fails_clearly_and_previous_survives(tmp_path):
    task = CopyTask(seq_len=4, copy_len=2)
    train(make_model(), task, config(tmp_path, steps=6, checkpoint_every=3))
    ckpts = sorted((tmp_path / "checkpoints").glob("step_*"))
    assert [c.name for c in ckpts] == ["step_00000003", "step_00000006"]
    weights = ckpts[-1] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated, as by a crash mid-copy
    with pytest.raises(CheckpointError, match="step_00000003"):
        load_checkpoint(tmp_path, make_model())
    state = load_checkpoint(ckpts[0], make_model())  # the earlier one is intact
    assert state["step"] == 3
    (ckpts[0] / "trainer.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="trainer state"):
        load_checkpoint(ckpts[0], make_model())


def test_checkpoint_of_another_model_is_rejected(tmp_path):
    train(make_model(), CopyTask(seq_len=4, copy_len=2), config(tmp_path, steps=2))
    other = Tagger(TinyRNN(8), 8, 10, vocab_size=10)
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path, other)


def test_interrupted_write_leaves_latest_usable(tmp_path):
    train(make_model(), CopyTask(seq_len=4, copy_len=2), config(tmp_path, steps=2))
    # a crash while writing the next checkpoint leaves a .tmp directory behind: loading ignores it
    (tmp_path / "checkpoints" / "step_00000004.tmp").mkdir()
    assert load_checkpoint(tmp_path, make_model())["step"] == 2


@pytest.mark.parametrize(
    "kw, flag",
    [({"steps": -1}, "--steps"), ({"batch_size": 0}, "--batch-size"), ({"lr": 0.0}, "--lr"),
     ({"optimizer": "sgd"}, "--optimizer"), ({"schedule": "step"}, "--schedule"), ({"clip": -1.0}, "--clip"),
     ({"anneal_by": "epochs"}, "--anneal-by"), ({"anneal_by": "budget"}, "--anneal-by budget needs a time budget")],
)
def test_bad_hyperparameters_name_the_flag(kw, flag):
    with pytest.raises(ValueError, match=flag):
        TrainConfig(**kw)


class FakeClock:
    """``time.perf_counter`` for the trainer: every call advances ``tick`` seconds."""

    def __init__(self, tick):
        self.now, self.tick = 0.0, tick

    def __call__(self):
        self.now += self.tick
        return self.now


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_budget_annealing_reaches_zero_when_the_budget_runs_out(tmp_path, monkeypatch, schedule):
    # A run cut by its time budget long before its step count: by steps its lr would barely have moved;
    # annealed by the budget it follows the time spent and ends near 0.
    monkeypatch.setattr(loop.time, "perf_counter", FakeClock(0.01))
    kw = dict(steps=100_000, schedule=schedule, warmup=0, log_every=1, time_budget=2.0)
    by_steps = train(make_model(), CopyTask(seq_len=4, copy_len=2), config(tmp_path / "a", **kw))
    by_budget = train(make_model(), CopyTask(seq_len=4, copy_len=2),
                      config(tmp_path / "b", anneal_by="budget", **kw))
    assert by_budget.stopped_early and by_steps.stopped_early
    lrs = [r["lr"] for r in by_budget.history if r["split"] == "train"]
    assert len(lrs) > 5 and lrs == sorted(lrs, reverse=True)
    assert lrs[-1] < 0.05 * 3e-3 < 0.9 * 3e-3 < [r["lr"] for r in by_steps.history if r["split"] == "train"][-1]
    # the decay follows the fraction of the budget spent: seconds of the logged row / budget
    rows = [r for r in by_budget.history if r["split"] == "train"]
    spent = min(1.0, rows[3]["seconds"] / 2.0)
    expected = 3e-3 * ((1 - spent) if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * spent)))
    assert rows[3]["lr"] == pytest.approx(expected, abs=0.05 * 3e-3)


def test_budget_counts_training_seconds_across_resume(tmp_path, monkeypatch):
    monkeypatch.setattr(loop.time, "perf_counter", FakeClock(0.01))
    kw = dict(steps=100_000, schedule="linear", warmup=0, log_every=1, time_budget=1.0, anneal_by="budget")
    first = train(make_model(), CopyTask(seq_len=4, copy_len=2), config(tmp_path, **kw))
    state = load_checkpoint(tmp_path, make_model())
    assert state["seconds"] > 1.0 and first.stopped_early
    # resumed with the budget already spent: one more step at most, at lr 0
    again = train(make_model(), CopyTask(seq_len=4, copy_len=2), config(tmp_path, **kw), resume=tmp_path)
    assert again.steps == first.steps + 1
    assert all(r["lr"] == 0.0 for r in again.history if r["split"] == "train")


def test_loss_and_accuracy_masks():
    logits = torch.tensor([[[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]]])
    targets = torch.tensor([[0, 0, 1]])
    batch = Batch(torch.zeros(1, 3, dtype=torch.long), targets, loss_mask=torch.tensor([[True, True, False]]),
                  score_mask=torch.tensor([[False, True, True]]))
    loss, correct, count = loss_and_accuracy(logits, batch, "tag")
    ce = torch.nn.functional.cross_entropy(logits[0], targets[0], reduction="none")
    torch.testing.assert_close(loss, ce[:2].mean())
    assert (int(correct), int(count)) == (0, 2)
    loss, correct, count = loss_and_accuracy(logits[:, 0], Batch(None, torch.tensor([0])), "classify")
    assert (int(correct), int(count)) == (1, 1)


def test_classifier_last_pooling_ignores_padding():
    torch.manual_seed(0)
    model = Classifier(TinyRNN(8), 8, 3, pooling="last", vocab_size=5).eval()
    x = torch.randint(0, 5, (1, 4))
    padded = torch.cat([x, torch.randint(0, 5, (1, 3))], 1)
    mask = torch.tensor([[True] * 4 + [False] * 3])
    torch.testing.assert_close(model(padded, mask=mask)[0], model(x)[0])


def test_reconstruction_loss_is_the_literal_per_step_loss():
    """App. A.1's auxiliary loss: features by a sigmoid cross-entropy averaged over features, tokens by a
    softmax cross-entropy, both averaged over the valid steps; None in eval mode."""
    torch.manual_seed(1)
    features = Classifier(TinyRNN(8), 8, 3, pooling="last", input_dim=5, reconstruction=0.5).train()
    inputs = (torch.rand(2, 6, 5) > 0.5).float()
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    features.backbone.drop.eval()  # TinyRNN's dropout would make the two computations differ
    features(inputs, mask=mask)
    y = features.backbone(features.embed(inputs))[0]
    p = torch.sigmoid(features.decoder(y))
    per_step = -(inputs * p.log() + (1 - inputs) * (1 - p).log()).mean(-1)
    want = 0.5 * per_step[mask].mean()
    torch.testing.assert_close(features.auxiliary_loss, want, atol=1e-5, rtol=1e-5)

    tokens = Tagger(TinyRNN(8), 8, 3, vocab_size=7, reconstruction=2.0).train()
    tokens.backbone.drop.eval()
    ids = torch.randint(0, 7, (2, 5))
    tokens(ids)
    logp = tokens.decoder(tokens.backbone(tokens.embed(ids))[0]).log_softmax(-1)
    want = -2.0 * logp.gather(-1, ids[..., None]).mean()
    torch.testing.assert_close(tokens.auxiliary_loss, want, atol=1e-5, rtol=1e-5)
    tokens.eval()
    tokens(ids)
    assert tokens.auxiliary_loss is None


def test_trainer_adds_the_auxiliary_loss(tmp_path):
    """The decoder learns only through ``auxiliary_loss``: it moves when the trainer adds it."""
    task = CopyTask(seq_len=4, copy_len=2)
    torch.manual_seed(0)
    model = Tagger(TinyRNN(16), 16, 10, vocab_size=10, reconstruction=1.0)
    before = model.decoder.weight.detach().clone()
    result = train(model, task, config(tmp_path, steps=3, log_every=1))
    assert not torch.allclose(model.decoder.weight, before)
    logged = [row for row in result.history if row["split"] == "train"]
    assert len(logged) == 3 and all(row["auxiliary_loss"] > 0 for row in logged)  # logged apart


def test_reconstruction_bad_input():
    with pytest.raises(ValueError, match="reconstruction"):
        Tagger(TinyRNN(8), 8, 3, vocab_size=7, reconstruction=-1.0)
    model = Classifier(TinyRNN(8), 8, 3, input_dim=5, reconstruction=1.0).train()
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        model(torch.randn(2, 4, 5) * 3)


DDP_WORKER = Path(__file__).parent / "ddp_worker.py"


def test_torchrun_two_processes_keep_weights_in_sync(tmp_path):
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(torchrun), "--standalone", "--nproc_per_node=2", str(DDP_WORKER), str(tmp_path)]
    if not torchrun.exists():
        cmd = [sys.executable, "-m", "torch.distributed.run", *cmd[1:]]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    w0, w1 = (load_file(tmp_path / f"rank{r}.safetensors") for r in (0, 1))
    assert w0.keys() == w1.keys()
    for key in w0:
        assert torch.equal(w0[key], w1[key]), key
    start = load_file(tmp_path / "rank0_init.safetensors")
    assert any(not torch.equal(start[k], w0[k]) for k in w0)  # it trained
    assert (tmp_path / "run" / "checkpoints" / "latest").exists()  # rank 0 wrote the checkpoint
    shutil.rmtree(tmp_path / "run")
