"""The RL experiments at smoke scale: ballet-rl (paper 001 Table 3) and popgym (POPGym's MMER)."""

import json

import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("popgym")

from chronomem.envs.ballet import ballet_id  # noqa: E402
from chronomem.experiments import popgym as popgym_experiment  # noqa: E402
from chronomem.experiments import run_experiment  # noqa: E402
from chronomem.experiments.rl_runs import max_mean_return, mean_curve  # noqa: E402
from chronomem.registry import _load, get_experiment  # noqa: E402

_load(experiments=True)


def test_ballet_rl_smoke(tmp_path):
    results = run_experiment(get_experiment("ballet-rl"), "smoke", tmp_path, progress=False)
    assert set(results["results"]) == {"lstm", "transformer-xl", "htm"}
    for model, row in results["results"].items():
        assert set(row) == {"2_delay16"} and 0 <= row["2_delay16"] <= 100
        assert results["paper"][model]["8_delay48"] > 0  # Table 3 beside ours
        assert results["extra"][model]["runs"][0]["frames"] == 16
    assert (tmp_path / "learning_curves.png").stat().st_size > 0
    assert "success rate" in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "results.json").read_text())["config"]["train_env"] == ballet_id(
        "mixture", "symbolic")


def test_popgym_smoke(tmp_path, monkeypatch):
    # The published table plus a row of a model only the paper has (as POPGym's GRU), one of whose
    # environments is outside the smoke scale: results.json carries the scale's rows of every model.
    extra = {"gru": {"RepeatPreviousEasy": 0.5, "CountRecallHard": -0.25}}
    monkeypatch.setattr(popgym_experiment, "PAPER", {**popgym_experiment.PAPER, **extra})
    run_experiment(get_experiment("popgym"), "smoke", tmp_path, progress=False)
    saved = json.loads((tmp_path / "results.json").read_text())
    results = saved["results"]
    assert list(results) == ["lstm", "gtrxl", "htm"]
    smoke = {"RepeatPreviousEasy", "MineSweeperEasy"}
    for model in ("lstm", "gtrxl", "htm"):
        assert set(results[model]) == smoke
        assert all(-1 <= v <= 1 for v in results[model].values())
    published = {m: {s: v for s, v in row.items() if s in smoke} for m, row in popgym_experiment.PAPER.items()}
    assert saved["paper"] == {m: row for m, row in published.items() if row} | {"gru": {"RepeatPreviousEasy": 0.5}}
    assert "| gru | — (0.50) | — (—) |" in (tmp_path / "report.md").read_text()  # a paper-only row
    assert (tmp_path / "learning_curves.png").stat().st_size > 0


def test_popgym_published_table_names_real_environments_and_mmers():
    popgym_experiment.check_paper_table(popgym_experiment.PAPER)
    popgym_experiment.check_paper_table({"gru": {"RepeatPreviousEasy": 1.0, "LabyrinthExploreHard": -1}})
    for bad, message in (({"gru": {"RepeatPreviusEasy": 0.5}}, "POPGym environment"),
                         ({"gru": {"RepeatPrevious": 0.5}}, "POPGym environment"),
                         ({"gru": {"RepeatPreviousEasy": 1.5}}, r"\[-1, 1\]"),
                         ({"gru": {"RepeatPreviousEasy": True}}, r"\[-1, 1\]"),
                         ({"transformer": {"RepeatPreviousEasy": 0.5}}, "model must be one of")):
        with pytest.raises(ValueError, match=message):
            popgym_experiment.check_paper_table(bad)


def test_smooth_averages_equal_groups_of_updates():
    from chronomem.experiments.rl_runs import smooth

    points = [(1000 * (i + 1), float(i % 2)) for i in range(120)]  # a return alternating 0, 1
    smoothed = smooth(points, bins=50)
    assert len(smoothed) == 40 and smoothed[0] == (3000, 1 / 3) and smoothed[-1] == (120_000, 2 / 3)
    assert smooth(points[:7], bins=50) == points[:7]  # short curves are drawn as they are


def test_mmer_and_mean_curves():
    history = [{"step": 8}, {"step": 16, "return_mean": -0.5}, {"step": 24, "return_mean": 0.25},
               {"step": 32, "return_mean": 0.0}]
    assert max_mean_return(history) == 0.25 and max_mean_return(history[:1]) is None
    assert mean_curve([[(16, 0.0), (24, 1.0)], [(16, 1.0)]]) == [(16, 0.5)]


def test_a_finished_run_is_loaded_as_it_ended(tmp_path, monkeypatch):
    """``ppo_run(reuse=True)`` on a finished run: the same weights, history, frames, and torch's random
    state as right after training, without training again."""
    import torch

    from chronomem.experiments import rl_runs
    from chronomem.rl import ppo

    ppo_settings = dict(dim=16, depth=1, heads=2, hidden=16, num_envs=2, num_steps=8, num_minibatches=1,
                        update_epochs=1, log_every=1)
    trained = rl_runs.ppo_run("popgym-RepeatPreviousEasy-v0", "lstm", {}, ppo_settings, 48, 3, tmp_path / "run",
                              progress=False)
    random_state = torch.get_rng_state()
    torch.manual_seed(12345)  # whatever ran in between

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(ppo, "train", no_training)
    loaded = rl_runs.ppo_run("popgym-RepeatPreviousEasy-v0", "lstm", {}, ppo_settings, 48, 3, tmp_path / "run",
                             progress=True, reuse=True)  # progress does not change the run
    assert torch.equal(torch.get_rng_state(), random_state)
    assert loaded.frames == trained.frames == 48 and len(trained.history) == 3
    assert loaded.history == trained.history
    assert abs(loaded.seconds - trained.seconds) < 1.0
    for (name, a), (_, b) in zip(trained.agent.state_dict().items(), loaded.agent.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert not loaded.agent.training
    with pytest.raises(ValueError, match="other settings.*seed: saved 3, asked 4"):
        rl_runs.ppo_run("popgym-RepeatPreviousEasy-v0", "lstm", {}, ppo_settings, 48, 4, tmp_path / "run",
                        progress=False, reuse=True)


@pytest.mark.parametrize("name", ["ballet-rl", "popgym", "minigrid-transfer"])
def test_a_resumed_experiment_gives_the_uninterrupted_table(tmp_path, monkeypatch, name):
    import shutil

    from chronomem.rl import ppo

    experiment = get_experiment(name)
    whole = run_experiment(experiment, "smoke", tmp_path / "whole", progress=False)
    # An interrupted run: no results yet, and its last run killed before its final checkpoint.
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    for file in ("results.json", "report.md", "results.png", "learning_curves.png"):
        (tmp_path / "cut" / file).unlink(missing_ok=True)
    runs = sorted(p.parent for p in (tmp_path / "cut").rglob("config.json"))
    shutil.rmtree(runs[-1] / "checkpoints")
    trained = []
    train = ppo.train
    monkeypatch.setattr(ppo, "train", lambda args, *rest, **kw: trained.append(args.out) or train(args, *rest, **kw))
    resumed = run_experiment(experiment, "smoke", tmp_path / "cut", progress=False, resume=True)
    assert trained == [str(runs[-1])]  # only the unfinished run trained again
    assert resumed["results"] == whole["results"]
    assert resumed["extra"].get("curves") == whole["extra"].get("curves")
    assert json.loads((tmp_path / "cut" / "results.json").read_text())["results"] == whole["results"]
    assert resumed["config"]["resumed"] and "resumed" not in whole["config"]  # its seconds are the call's


def test_resume_is_refused_where_it_cannot_work(tmp_path):
    with pytest.raises(ValueError, match="--resume: copy-baselines cannot reuse"):
        run_experiment(get_experiment("copy-baselines"), "smoke", tmp_path, progress=False, resume=True)
    with pytest.raises(ValueError, match="no such directory"):
        run_experiment(get_experiment("popgym"), "smoke", tmp_path / "missing", progress=False, resume=True)
