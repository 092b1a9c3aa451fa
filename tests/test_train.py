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
    # the history spans the whole run, the rows before the kill as they were logged
    assert [(r["step"], r["split"]) for r in resumed.history] == [(r["step"], r["split"]) for r in full.history]
    before = [r for r in resumed.history if r["step"] <= 5]
    assert before and all(r["loss"] == pytest.approx(f["loss"], abs=1e-6) for r, f in
                          zip(before, full.history, strict=False) if r["split"] == "train")


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


def test_corrupt_trainer_state_error_gives_no_unsafe_advice(tmp_path):
    train(make_model(), CopyTask(seq_len=4, copy_len=2), config(tmp_path, steps=4, checkpoint_every=2))
    (tmp_path / "checkpoints" / "step_00000004" / "trainer.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path, make_model())
    message = str(err.value)
    assert "truncated or corrupt" in message
    assert f"--resume {tmp_path / 'checkpoints' / 'step_00000002'}" in message
    assert "weights_only" not in message and "\n" not in message  # torch's advice to unpickle is not repeated


def test_resume_from_an_earlier_checkpoint_sets_the_later_ones_aside(tmp_path):
    task = CopyTask(seq_len=4, copy_len=2)
    full = train(make_model(), task, config(tmp_path / "full", steps=9, checkpoint_every=3))
    run = tmp_path / "run"
    train(make_model(), task, config(run, steps=9, checkpoint_every=3))
    weights = run / "checkpoints" / "step_00000009" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    resumed = train(make_model(seed=5), task, config(run, steps=9, checkpoint_every=3),
                    resume=run / "checkpoints" / "step_00000006")
    torch.testing.assert_close(flat_weights(resumed.model), flat_weights(full.model), atol=1e-6, rtol=0)
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["latest", "step_00000006", "step_00000009", "step_00000009.discarded"]
    assert load_checkpoint(run, make_model())["step"] == 9  # the new step 9, not the corrupt one


class Killed(BaseException):
    """A kill of the process: no ``except Exception`` catches it."""


def _metrics_rows(run_dir):
    lines = (run_dir / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    return [dict(zip(header, line.split(","), strict=True)) for line in lines[1:]]


def test_killed_and_resumed_run_logs_each_step_once_and_time_continues(tmp_path, monkeypatch):
    task = CopyTask(seq_len=6, copy_len=3)
    kw = dict(steps=12, log_every=2, eval_every=4, checkpoint_every=5)
    monkeypatch.setattr(loop.time, "perf_counter", FakeClock(0.1))
    train(make_model(), task, config(tmp_path / "full", **kw))
    real_step = loop.torch.optim.AdamW.step

    def step_then_die_at_9(self, *args, **kwargs):  # killed at step 9: steps 6-8 were logged after step 5's checkpoint
        if self.state and next(iter(self.state.values()))["step"] == 8:
            raise Killed
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(loop.torch.optim.AdamW, "step", step_then_die_at_9)
    with pytest.raises(Killed):
        train(make_model(), task, config(tmp_path / "split", **kw))
    monkeypatch.setattr(loop.torch.optim.AdamW, "step", real_step)
    before = _metrics_rows(tmp_path / "split")
    assert [r["step"] for r in before][-2:] == ["8", "8"]  # the killed run had logged past its checkpoint
    at_checkpoint = load_checkpoint(tmp_path / "split", make_model())["seconds"]
    train(make_model(), task, config(tmp_path / "split", **kw), resume=tmp_path / "split")
    rows, full_rows = _metrics_rows(tmp_path / "split"), _metrics_rows(tmp_path / "full")
    keys = [(r["step"], r["split"]) for r in rows]
    assert keys == [(r["step"], r["split"]) for r in full_rows] and len(set(keys)) == len(keys)
    seconds = [float(r["seconds"]) for r in rows if r["split"] == "train"]
    assert seconds == sorted(set(seconds)) and seconds[2] > at_checkpoint > seconds[1]  # step 6 counts on from 5


# The calls of one checkpoint write, in order; a kill just before (or inside) each must leave a resumable run.
KILL_POINTS = [
    ("save_file", 1),  # mid-way through model.safetensors
    ("torch.save", 1),  # mid-way through trainer.pt
    ("fsync", 1),  # files written, not yet flushed
    ("os.replace", 1),  # step_N.tmp complete, not yet renamed
    ("os.replace", 2),  # step_N in place, ``latest`` not yet replaced
    ("rmtree", 3),  # ``latest`` replaced, the oldest checkpoint not yet pruned (calls 1-2 clear temporaries)
]


@pytest.mark.parametrize("call, nth", KILL_POINTS)
def test_kill_during_a_checkpoint_write_then_resume(tmp_path, monkeypatch, call, nth):
    from chronomem.train import checkpoint

    task = CopyTask(seq_len=4, copy_len=2)
    kw = dict(steps=12, checkpoint_every=3)
    full = train(make_model(), task, config(tmp_path / "full", **kw))
    run = tmp_path / "run"
    calls = {"n": 0, "armed": False}
    real_save = loop.save_checkpoint

    def arm_at_step_9(run_dir, step, *args):  # checkpoints 3 and 6 are complete, so 9 would prune 3
        calls["armed"] = step == 9
        return real_save(run_dir, step, *args)

    def killer(real, partial_write=False):
        def wrapped(*args, **kwargs):
            if calls["armed"]:
                calls["n"] += 1
                if calls["n"] == nth:
                    if partial_write:  # the file exists, half-written, as a kill in the middle leaves it
                        real(*args, **kwargs)
                        path = Path(args[1])
                        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
                    raise Killed
            return real(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(loop, "save_checkpoint", arm_at_step_9)
    target = {"save_file": (checkpoint, "save_file"), "torch.save": (checkpoint.torch, "save"),
              "fsync": (checkpoint.os, "fsync"), "os.replace": (checkpoint.os, "replace"),
              "rmtree": (checkpoint.shutil, "rmtree")}[call]
    real = getattr(*target)
    monkeypatch.setattr(*target, killer(real, partial_write=call in ("save_file", "torch.save")))
    with pytest.raises(Killed):
        train(make_model(), task, config(run, **kw))
    assert calls["n"] == nth
    monkeypatch.undo()
    assert load_checkpoint(run, make_model())["step"] in (6, 9)  # the previous checkpoint, or the complete new one
    resumed = train(make_model(seed=7), task, config(run, **kw), resume=run)
    assert resumed.steps == 12
    torch.testing.assert_close(flat_weights(resumed.model), flat_weights(full.model), atol=1e-6, rtol=0)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_00000009", "step_00000012"]


@pytest.mark.parametrize("nth", [1, 2, 3])
def test_kill_while_rewriting_a_checkpoint_of_the_same_step(tmp_path, monkeypatch, nth):
    """Writing step N again (e.g. a final checkpoint at a step already saved): a kill at any rename
    leaves a complete checkpoint to resume from, never a ``latest`` naming a missing one."""
    from chronomem.train import checkpoint

    task = CopyTask(seq_len=4, copy_len=2)
    kw = dict(schedule="constant", checkpoint_every=3)  # the lr does not depend on the planned step count
    full = train(make_model(), task, config(tmp_path / "full", steps=9, **kw))
    run = tmp_path / "run"
    first = train(make_model(), task, config(run, steps=6, **kw))
    state = load_checkpoint(run, make_model())
    calls, real_replace = [], checkpoint.os.replace

    def replace_or_die(*args):
        calls.append(args)
        if len(calls) == nth:
            raise Killed
        return real_replace(*args)

    monkeypatch.setattr(checkpoint.os, "replace", replace_or_die)
    with pytest.raises(Killed):
        checkpoint.save_checkpoint(run, 6, first.model, state)
    monkeypatch.undo()
    assert load_checkpoint(run, make_model())["step"] in (3, 6)
    resumed = train(make_model(seed=2), task, config(run, steps=9, **kw), resume=run)
    torch.testing.assert_close(flat_weights(resumed.model), flat_weights(full.model), atol=1e-6, rtol=0)


KILL_MID_WRITE = """
import os, signal, sys
import torch
from chronomem.train import checkpoint
sys.path.insert(0, sys.argv[2])
from test_train import CopyTask, config, make_model, train

real_save = torch.save

def save_half_then_sigkill(obj, path):  # the second checkpoint's trainer.pt, half on disk, then SIGKILL
    real_save(obj, path)
    if obj["step"] == 6:
        data = open(path, "rb").read()
        open(path, "wb").write(data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)

checkpoint.torch.save = save_half_then_sigkill
train(make_model(), CopyTask(seq_len=4, copy_len=2), config(sys.argv[1], steps=12, checkpoint_every=3))
"""


def test_sigkill_in_the_middle_of_a_checkpoint_write_then_resume(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", KILL_MID_WRITE, str(run), str(Path(__file__).parent)], env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert (run / "checkpoints" / "step_00000006.tmp").is_dir()  # killed mid-write
    task = CopyTask(seq_len=4, copy_len=2)
    assert load_checkpoint(run, make_model())["step"] == 3
    full = train(make_model(), task, config(tmp_path / "full", steps=12, checkpoint_every=3))
    resumed = train(make_model(seed=3), task, config(run, steps=12, checkpoint_every=3), resume=run)
    torch.testing.assert_close(flat_weights(resumed.model), flat_weights(full.model), atol=1e-6, rtol=0)


def test_checkpoint_files_are_flushed_before_the_rename(tmp_path, monkeypatch):
    from chronomem.train import checkpoint

    events = []
    real_fsync, real_replace = checkpoint.os.fsync, checkpoint.os.replace
    opened = {}
    real_open = checkpoint.os.open

    def record_open(path, *args, **kwargs):
        fd = real_open(path, *args, **kwargs)
        opened[fd] = Path(path).name
        return fd

    monkeypatch.setattr(checkpoint.os, "open", record_open)
    monkeypatch.setattr(checkpoint.os, "fsync", lambda fd: events.append(("fsync", opened.get(fd))) or real_fsync(fd))
    monkeypatch.setattr(checkpoint.os, "replace",
                        lambda a, b: events.append(("replace", Path(b).name)) or real_replace(a, b))
    checkpoint.save_checkpoint(tmp_path, 1, make_model(), {"step": 1})
    rename = events.index(("replace", "step_00000001"))
    assert {("fsync", "model.safetensors"), ("fsync", "trainer.pt"), ("fsync", "step_00000001.tmp")} <= set(
        events[:rename])
    assert events.index(("replace", "latest")) > rename


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
     ({"anneal_by": "epochs"}, "--anneal-by"), ({"anneal_by": "budget"}, "--anneal-by budget needs a time budget"),
     ({"time_budget": -1.0}, "--time-budget"), ({"time_budget": float("nan")}, "--time-budget")],
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
    # resumed with the budget already spent: no step (the run the budget ended is the finished run)
    again = train(make_model(), CopyTask(seq_len=4, copy_len=2), config(tmp_path, **kw), resume=tmp_path)
    assert again.steps == first.steps and again.stopped_early
    assert [r for r in again.history if r["split"] == "train" and r["step"] > first.steps] == []  # none now
    assert [r["step"] for r in again.history if r["split"] == "train"] == [
        r["step"] for r in first.history if r["split"] == "train"]  # the run's history, read back
    assert again.metrics == first.metrics  # the same model, evaluated again


def test_an_out_that_holds_a_run_is_refused_and_left_as_it_was(tmp_path):
    # Running the README's example twice: the second call must not rewrite the first run's files nor
    # leave its later checkpoints to be loaded as the new run's.
    from chronomem.train import load_run, train_spec

    spec = {"model": "lstm", "model_options": {"dim": 8, "depth": 1}, "task": "copy",
            "task_options": {"seq_len": 4, "copy_len": 2}}
    train_spec(spec, config(tmp_path, steps=6, checkpoint_every=3, schedule="constant"))
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    other = {**spec, "model_options": {"dim": 12, "depth": 1}}
    for again in (other, spec):
        with pytest.raises(ValueError, match=r"out .* already holds a run \(config.json\): continue it with resume="):
            train_spec(again, config(tmp_path, steps=4))
    with pytest.raises(ValueError, match="already holds a run"):
        train(make_model(), CopyTask(seq_len=4, copy_len=2), config(tmp_path, steps=4))
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    model, _, saved = load_run(tmp_path)
    assert saved == spec
    # resuming the run into its own directory is what the message offers, and it is allowed
    train_spec(spec, config(tmp_path, steps=8, schedule="constant"), resume=tmp_path)
    # resuming another run into a directory that holds a run is refused too
    copy = tmp_path.parent / f"{tmp_path.name}-copy"
    shutil.copytree(tmp_path, copy)
    with pytest.raises(ValueError, match="already holds a run"):
        train_spec(spec, config(tmp_path, steps=9), resume=copy)


def test_ppo_refuses_an_out_that_holds_a_run(tmp_path):
    from chronomem.rl.ppo import Args
    from chronomem.rl.ppo import train as ppo_train

    (tmp_path / "config.json").write_text('{"kind": "ppo"}')
    with pytest.raises(ValueError, match="already holds a run"):
        ppo_train(Args(env="popgym-RepeatPreviousEasy-v0", out=str(tmp_path)))
    assert (tmp_path / "config.json").read_text() == '{"kind": "ppo"}' and len(list(tmp_path.iterdir())) == 1


def _lrs(history):
    return {r["step"]: r["lr"] for r in history if r["split"] == "train"}


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_resume_with_more_steps_spreads_the_remaining_decay(tmp_path, schedule):
    # Stopped at step 6 of 12 (warmup 3), then continued to 24 steps: the lr goes on from where it was
    # and reaches 0 at the new total, along the rest of the same decay, never jumping back up.
    task = CopyTask(seq_len=4, copy_len=2)
    kw = dict(schedule=schedule, warmup=3, log_every=1)
    full = train(make_model(), task, config(tmp_path / "a", steps=12, checkpoint_every=6, **kw))
    before = _lrs(full.history)
    resumed = _lrs(train(make_model(), task, config(tmp_path / "a", steps=24, **kw),
                         resume=tmp_path / "a" / "checkpoints" / "step_00000006").history)
    assert {step: lr for step, lr in resumed.items() if step <= 6} == {s: lr for s, lr in before.items() if s <= 6}
    after = {step: lr for step, lr in resumed.items() if step > 6}  # the steps trained after the resume
    done_at_6 = (6 - 3) / (12 - 3)

    def factor(progress):
        return 1 - progress if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * progress))

    for step, lr in after.items():  # the lr logged at a step is the one of the next step
        expected = 3e-3 * factor(done_at_6 + (1 - done_at_6) * (step - 6) / (24 - 6))
        assert lr == pytest.approx(expected, abs=1e-12), step
    assert after[24] == pytest.approx(0.0, abs=1e-12)
    assert after[7] < before[6] and list(after.values()) == sorted(after.values(), reverse=True)


def test_extending_a_run_whose_decay_reached_zero_is_refused(tmp_path):
    task = CopyTask(seq_len=4, copy_len=2)
    train(make_model(), task, config(tmp_path, steps=6, schedule="linear"))
    with pytest.raises(ValueError, match="reached lr 0 at step 6"):
        train(make_model(), task, config(tmp_path, steps=12, schedule="linear"), resume=tmp_path)
    # a constant schedule (here with a warmup) extends as before
    train(make_model(), task, config(tmp_path / "c", steps=6, schedule="constant"))
    more = train(make_model(), task, config(tmp_path / "c", steps=9, schedule="constant"), resume=tmp_path / "c")
    assert set(_lrs(more.history).values()) == {3e-3}


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
    softmax cross-entropy, both averaged over the valid steps; returned, weighted, when asked."""
    torch.manual_seed(1)
    features = Classifier(TinyRNN(8), 8, 3, pooling="last", input_dim=5, reconstruction=0.5).train()
    inputs = (torch.rand(2, 6, 5) > 0.5).float()
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    features.backbone.drop.eval()  # TinyRNN's dropout would make the two computations differ
    logits, _, auxiliary = features(inputs, mask=mask, return_auxiliary=True)
    torch.testing.assert_close(logits, features(inputs, mask=mask)[0])  # asking changes no output
    y = features.backbone(features.embed(inputs))[0]
    p = torch.sigmoid(features.decoder(y))
    per_step = -(inputs * p.log() + (1 - inputs) * (1 - p).log()).mean(-1)
    want = 0.5 * per_step[mask].mean()
    torch.testing.assert_close(auxiliary, want, atol=1e-5, rtol=1e-5)

    tokens = Tagger(TinyRNN(8), 8, 3, vocab_size=7, reconstruction=2.0).train()
    tokens.backbone.drop.eval()
    ids = torch.randint(0, 7, (2, 5))
    _, _, auxiliary = tokens(ids, return_auxiliary=True)
    logp = tokens.decoder(tokens.backbone(tokens.embed(ids))[0]).log_softmax(-1)
    want = -2.0 * logp.gather(-1, ids[..., None]).mean()
    torch.testing.assert_close(auxiliary, want, atol=1e-5, rtol=1e-5)
    assert len(tokens(ids)) == 2  # logits, state: not asked, not computed
    assert Tagger(TinyRNN(8), 8, 3, vocab_size=7)(ids, return_auxiliary=True)[2] is None  # reconstruction=0


def test_trainer_adds_the_auxiliary_loss(tmp_path):
    """The decoder learns only through the auxiliary loss: it moves when the trainer adds it."""
    task = CopyTask(seq_len=4, copy_len=2)
    torch.manual_seed(0)
    model = Tagger(TinyRNN(16), 16, 10, vocab_size=10, reconstruction=1.0)
    before = model.decoder.weight.detach().clone()
    result = train(model, task, config(tmp_path, steps=3, log_every=1))
    assert not torch.allclose(model.decoder.weight.cpu(), before)  # trained on a GPU where there is one
    logged = [row for row in result.history if row["split"] == "train"]
    assert len(logged) == 3 and all(row["auxiliary_loss"] > 0 for row in logged)  # logged apart


def test_reconstruction_bad_input():
    with pytest.raises(ValueError, match="reconstruction"):
        Tagger(TinyRNN(8), 8, 3, vocab_size=7, reconstruction=-1.0)
    model = Classifier(TinyRNN(8), 8, 3, input_dim=5, reconstruction=1.0).train()
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        model(torch.randn(2, 4, 5) * 3, return_auxiliary=True)


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


def test_every_loss_term_reaches_metrics_csv_and_tensorboard(tmp_path, monkeypatch):
    """A head built with reconstruction=1: its auxiliary loss gets its own metrics.csv column and
    TensorBoard scalar, beside the task loss; evaluation rows leave the cell empty."""
    logged = []

    class Writer:  # stands in for TensorBoard's SummaryWriter (the package is optional)
        def __init__(self, log_dir):
            pass

        def add_scalar(self, tag, value, step):
            logged.append((tag, value, step))

        def close(self):
            pass

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", type(sys)("fake_tensorboard"))
    sys.modules["torch.utils.tensorboard"].SummaryWriter = Writer
    torch.manual_seed(0)
    model = Tagger(TinyRNN(16), 16, 10, vocab_size=10, reconstruction=1.0)
    result = train(model, CopyTask(seq_len=4, copy_len=2), config(tmp_path, steps=4, log_every=2, eval_every=2))
    rows = _metrics_rows(tmp_path)
    assert list(rows[0]) == ["step", "split", "loss", "accuracy", "lr", "tokens_per_second", "seconds",
                             "auxiliary_loss"]
    history = [r for r in result.history if r["split"] == "train"]
    assert [float(r["auxiliary_loss"]) for r in rows if r["split"] == "train"] == [r["auxiliary_loss"] for r in history]
    assert all(r["auxiliary_loss"] > 0 for r in history)
    assert [r["auxiliary_loss"] for r in rows if r["split"] != "train"] == ["", ""]  # val at step 2, test at 4
    assert [(tag, step) for tag, _, step in logged if tag.endswith("/auxiliary_loss")] == [("train/auxiliary_loss", 2),
                                                                                           ("train/auxiliary_loss", 4)]
    assert {tag for tag, _, _ in logged} >= {"train/loss", "train/lr", "val/loss", "test/accuracy"}


def test_metrics_csv_widens_for_a_new_column_and_keeps_earlier_rows(tmp_path):
    from chronomem.train.metrics import MetricsLogger

    logger = MetricsLogger(tmp_path)
    logger.log({"step": 2, "split": "val", "loss": 1.5, "accuracy": 10.0})  # an evaluation before any training row
    logger.log({"step": 2, "split": "train", "loss": 1.0, "extra_loss": 0.25, "accuracy": 20.0, "lr": 0.1,
                "tokens_per_second": 7, "seconds": 0.5})
    logger.log({"step": 4, "split": "test", "loss": 0.5, "accuracy": 30.0, "seconds": 1.0})
    logger.close()
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines == ["step,split,loss,accuracy,lr,tokens_per_second,seconds,extra_loss", "2,val,1.5,10.0,,,,",
                     "2,train,1.0,20.0,0.1,7,0.5,0.25", "4,test,0.5,30.0,,,1.0,"]
    again = MetricsLogger(tmp_path)  # a resumed run reads the columns back and appends under them
    again.rewind(3)
    again.log({"step": 4, "split": "train", "loss": 0.75, "extra_loss": 0.5, "accuracy": 25.0})
    assert (tmp_path / "metrics.csv").read_text().splitlines()[1:] == [
        "2,val,1.5,10.0,,,,", "2,train,1.0,20.0,0.1,7,0.5,0.25", "4,train,0.75,25.0,,,,0.5"]
    fresh = MetricsLogger(tmp_path)  # a new run in the same directory starts the file anew, columns too
    fresh.rewind(0)
    fresh.log({"step": 1, "split": "test", "loss": 0.1, "accuracy": 99.0})
    assert (tmp_path / "metrics.csv").read_text().splitlines() == ["step,split,loss,accuracy", "1,test,0.1,99.0"]


def test_metrics_csv_reads_back_the_rows_as_logged(tmp_path):
    from chronomem.train.metrics import MetricsLogger, read_metrics

    g = torch.Generator().manual_seed(0)
    rows = [{"step": 8, "split": "train", "episodes": 0, "lr": 3e-4},  # no episode ended: no return column
            {"step": 16, "split": "train", "return_mean": -0.4375, "episodes": 3, "lr": 1 / 3, "sps": 1234},
            *({"step": 24 + i, "split": "val", "loss": torch.randn((), generator=g).item() * 10 ** i}
              for i in range(-8, 9, 4))]
    logger = MetricsLogger(tmp_path)
    for row in rows:
        logger.log(row)
    logger.close()
    back = read_metrics(tmp_path / "metrics.csv")
    assert back == rows  # the same keys and values, floats to the last bit
    assert [type(v) for v in back[1].values()] == [type(v) for v in rows[1].values()]


def test_resumed_run_with_an_auxiliary_loss_logs_each_step_once(tmp_path):
    task = CopyTask(seq_len=4, copy_len=2)

    def model():
        torch.manual_seed(0)
        return Tagger(TinyRNN(16), 16, 10, vocab_size=10, reconstruction=1.0)

    train(model(), task, config(tmp_path / "full", steps=6, log_every=1))
    train(model(), task, config(tmp_path / "split", steps=3, log_every=1, checkpoint_every=3))
    train(model(), task, config(tmp_path / "split", steps=6, log_every=1), resume=tmp_path / "split")
    full, split = _metrics_rows(tmp_path / "full"), _metrics_rows(tmp_path / "split")
    assert [(r["step"], r["split"]) for r in split] == [(r["step"], r["split"]) for r in full]
    for a, b in zip(split, full, strict=True):
        assert a["auxiliary_loss"] == b["auxiliary_loss"] and a["loss"] == b["loss"]


def test_load_run_evaluates_to_the_trainers_final_metrics(tmp_path):
    from chronomem.train import evaluate, load_run, train_spec

    spec = {"model": "lstm", "model_options": {"dim": 16, "depth": 1}, "task": "copy",
            "task_options": {"seq_len": 5}}
    result = train_spec(spec, config(tmp_path, steps=3, checkpoint_every=2, eval_batch_size=16))
    trained_on = next(result.model.parameters()).device  # a GPU where there is one: evaluated there again
    model, task, loaded_spec = load_run(tmp_path, device=str(trained_on))
    assert loaded_spec == spec and not model.training
    torch.testing.assert_close(flat_weights(model), flat_weights(result.model), atol=0, rtol=0)
    assert evaluate(model, task, 16, 32) == result.metrics
    at_step_2, _, _ = load_run(tmp_path / "checkpoints" / "step_00000002")
    assert not torch.equal(flat_weights(at_step_2), flat_weights(model))


def test_load_run_errors_are_clear(tmp_path):
    from chronomem.train import load_run

    with pytest.raises(CheckpointError, match="config.json"):
        load_run(tmp_path / "nothing")
    train(make_model(), CopyTask(seq_len=4, copy_len=2), config(tmp_path / "bare", steps=1))  # no spec
    with pytest.raises(CheckpointError, match="names no model and task"):
        load_run(tmp_path / "bare")


def test_an_experiment_passes_its_progress_down(tmp_path, capsys, monkeypatch):
    # run_experiment(progress=...) reaches every run, evaluation and data generator of the experiment
    # explicitly (no global switch): silent, nothing on stderr; shown, every run's lines.
    from chronomem import progress
    from chronomem.experiments.base import run_experiment
    from chronomem.registry import get_experiment

    monkeypatch.setattr(progress, "LINE_INTERVAL", 0.0)  # every evaluation counts as a long one
    experiment = get_experiment("copy-baselines")
    run_experiment(experiment, "smoke", tmp_path / "quiet", models=["lstm"], progress=False)
    assert capsys.readouterr().err == ""
    run_experiment(experiment, "smoke", tmp_path / "shown", models=["lstm"], progress=True)
    err = capsys.readouterr().err
    assert "lstm on copy, seed 0: step 1/" in err and "lstm on copy, seed 0: done, " in err
    assert "evaluating on the test split of copy: done, " in err


def test_a_long_evaluation_shows_its_progress(capsys, monkeypatch):
    from chronomem import progress

    monkeypatch.setattr(progress, "LINE_INTERVAL", 0.0)  # every evaluation counts as a long one
    task = CopyTask(seq_len=4, copy_len=2)
    loop.evaluate(make_model(), task, batch_size=4, num_examples=8)
    err = capsys.readouterr().err
    assert "evaluating on the test split of copy: example 4/8" in err and "done, 8 examples" in err
    loop.evaluate(make_model(), task, batch_size=4, num_examples=8, progress=False)
    assert capsys.readouterr().err == ""


def test_a_compiled_run_trains_as_the_eager_one(tmp_path):
    """--compile (traced and differentiated by aot_eager on the CPU): the same losses and weights."""
    from chronomem.registry import build_backbone

    torch._dynamo.reset()
    task = CopyTask(seq_len=4, copy_len=2)

    def model():
        torch.manual_seed(0)
        return Tagger(build_backbone("transformer", dim=16, depth=1, num_heads=2, causal=True), 16, 10, vocab_size=10)

    runs = [train(model(), task, config(tmp_path / str(k), steps=6, **changes))
            for k, changes in enumerate([{}, {"compile": True, "compile_backend": "aot_eager"}])]
    torch._dynamo.reset()
    losses = [[r["loss"] for r in run.history if r["split"] == "train"] for run in runs]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    torch.testing.assert_close(flat_weights(runs[1].model), flat_weights(runs[0].model), atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="--compile-mode must be one of"):
        config(tmp_path, compile=True, compile_mode="fastest")
