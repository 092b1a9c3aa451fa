"""chronomem.train.resume: find a run, check the flags given against its saved settings, restore it.
(End to end: tests/test_cli.py, test_rl_cli.py, test_train.py, test_ppo.py, test_rl_experiments.py.)"""

import dataclasses
import json
import re

import pytest
import torch

from chronomem.train import CheckpointError, TrainConfig
from chronomem.train.checkpoint import save_checkpoint
from chronomem.train.resume import (
    NOT_SET,
    Run,
    check_new_run,
    differences,
    find_run,
    restore,
    resume_point,
    resumed_settings,
)


def a_run(path, **settings) -> Run:
    """A run directory killed before its first checkpoint, trained with ``TrainConfig(**settings)``."""
    path.mkdir(parents=True)
    train = dataclasses.asdict(TrainConfig(out="where it was", **settings))
    (path / "config.json").write_text(json.dumps({"spec": {"model": "lstm"}, "train": train}))
    return find_run(path)


def test_differences_compare_as_config_json_holds_them():
    saved = {"betas": [0.9, 0.999], "lr": 0.001, "clip": None}
    assert differences({"betas": (0.9, 0.999), "lr": 0.001, "clip": None}, saved) == {}
    assert differences({"lr": 0.01, "seed": 3}, saved) == {"lr": (0.01, 0.001), "seed": (3, NOT_SET)}


def test_resumed_settings_keep_the_saved_ones_and_apply_the_resumable_ones(tmp_path):
    run = a_run(tmp_path / "run", steps=5, lr=0.01, clip=None)
    assert run.checkpoint is None and resume_point(run) is None  # it starts again from step 0
    cfg = resumed_settings(run, TrainConfig, run.config["train"], {"steps": 9, "lr": 0.01, "progress": False})
    assert (cfg.steps, cfg.lr, cfg.clip, cfg.out, cfg.progress) == (9, 0.01, None, str(run.dir), False)
    assert resumed_settings(run, TrainConfig, run.config["train"], {}).progress  # the command's, not the run's


@pytest.mark.parametrize("given, kept, message", [
    ({"lr": 0.02}, {}, "--lr 0.02 differs from the resumed run's saved value 0.01"),
    ({"clip": 1.0}, {}, "--clip 1.0 differs from the resumed run's saved value None"),
    ({"betas": (0.8, 0.9)}, {}, "--betas (0.8, 0.9) differs from the resumed run's saved value (0.9, 0.999)"),
    ({}, {"--model": ("gru", "lstm")}, "--model gru differs from the resumed run's saved value lstm"),
    ({"out": "elsewhere"}, {}, "a resumed run writes only into its own directory"),
])
def test_a_flag_that_would_change_the_run_is_refused(tmp_path, given, kept, message):
    run = a_run(tmp_path / "run", lr=0.01, clip=None)
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        resumed_settings(run, TrainConfig, run.config["train"], given, kept)
    if "out" not in given:  # where the saved value is, and which flags may change
        assert f"({run.dir / 'config.json'}); with --resume only --steps, --eval-every," in str(err.value)


def test_no_clipping_is_named_as_the_command_line_gives_it(tmp_path):
    run = a_run(tmp_path / "run")
    with pytest.raises(ValueError, match=r"--clip 0 \(no clipping\) differs from the resumed run's saved value 1.0"):
        resumed_settings(run, TrainConfig, run.config["train"], {"clip": None})


def test_a_run_is_found_by_its_directory_or_checkpoint_and_of_the_kind_asked(tmp_path):
    run = a_run(tmp_path / "run")
    model = torch.nn.Linear(2, 2)
    checkpoint = save_checkpoint(run.dir, 3, model, {"step": 3, "seconds": 1.5, "optimizer": {}, "rng": {}})
    assert find_run(run.dir).checkpoint == checkpoint == find_run(checkpoint).checkpoint
    assert find_run(checkpoint).dir == run.dir
    with pytest.raises(CheckpointError, match="is not a PPO run"):
        find_run(run.dir, kind="ppo")
    restored = restore(find_run(run.dir), torch.nn.Linear(2, 2))
    assert (restored.step, restored.seconds, restored.checkpoint) == (3, 1.5, checkpoint)
    assert restore(None, model) is None


def test_a_new_run_never_lands_on_another(tmp_path):
    run = a_run(tmp_path / "run")
    check_new_run(None)
    check_new_run(tmp_path / "fresh")
    check_new_run(run.dir, run)  # the run resumed is the run in out
    check_new_run(run.dir, run.dir)
    other = a_run(tmp_path / "other")
    for resume in (None, other, other.dir):
        with pytest.raises(ValueError, match="already holds a run"):
            check_new_run(run.dir, resume, flag="--out")
