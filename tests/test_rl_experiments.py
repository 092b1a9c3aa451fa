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


def test_mmer_and_mean_curves():
    history = [{"step": 8}, {"step": 16, "return_mean": -0.5}, {"step": 24, "return_mean": 0.25},
               {"step": 32, "return_mean": 0.0}]
    assert max_mean_return(history) == 0.25 and max_mean_return(history[:1]) is None
    assert mean_curve([[(16, 0.0), (24, 1.0)], [(16, 1.0)]]) == [(16, 0.5)]
