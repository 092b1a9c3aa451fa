"""The experiment runner: typed scales of step counts, reproducible smoke runs, the explicit time
budget, results.json's metric, and the tour's long table and plot."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from chronomem.experiments import babyai, base, htm, listops, lm, relevance, ssl, tour
from chronomem.experiments import copy_baselines as copy
from chronomem.experiments import decision_transformer as dt
from chronomem.experiments import images as resolution
from chronomem.experiments.base import Experiment, Scale, run_experiment
from chronomem.registry import EXPERIMENTS, get_experiment
from chronomem.report import comparison_table, plot_results, resolve_chance

ALL_SCALES = {
    "copy-baselines": copy.SCALES, "ballet": htm.BALLET_SCALES, "pai": htm.PAI_SCALES, "listops": listops.SCALES,
    "transfer-copy": relevance.TRANSFER_SCALES, "denoise": relevance.DENOISE_SCALES, "lm": lm.SCALES,
    "resolution-transfer": resolution.SCALES,  # its smoke run needs data: tests/test_images.py writes some
    "babyai": babyai.SCALES, "babyai-multi": babyai.MULTI_SCALES, "ssl": ssl.SCALES, "decision-transformer": dt.SCALES,
    "listops-length-easy": listops.EASY_SCALES,
}
FAST = ("copy-baselines", "ballet", "pai", "listops")  # smoke runs of about a second each


def without_timings(value):
    """``value`` with every timing (a key naming seconds) left out, recursively."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if "seconds" not in str(k)}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def fake_capped_evaluation(request, timeout=None):
    """Stands in for relevance.run_capped's fresh measured process (seconds each) in these tests."""
    return {"status": "ok", "accuracy": 50.0, "baseline_rss_mb": 1.0, "peak_rss_mb": 2.0, "delta_rss_mb": 1.0}


@pytest.mark.parametrize("experiment", sorted(ALL_SCALES))
def test_scales_are_typed_step_counts_and_serialise(experiment):
    scales = ALL_SCALES[experiment]
    assert set(scales) <= set(base.SCALES) and {"smoke", "quick", "paper"} <= set(scales)
    assert set(get_experiment(experiment).scales) == set(scales)
    for name, scale in scales.items():
        assert isinstance(scale, Scale), (experiment, name)
        fields = {f.name for f in dataclasses.fields(scale)}
        assert not any("budget" in f for f in fields), (experiment, name, fields)  # steps, not seconds
        assert isinstance(scale.steps, int) and scale.steps > 0
        json.dumps(dataclasses.asdict(scale))  # what results.json records
        cfg = scale.train_config(seed=3)
        assert (cfg.steps, cfg.batch_size, cfg.seed, cfg.time_budget, cfg.anneal_by) == (
            scale.steps, scale.batch_size, 3, None, "steps")


def test_a_time_budget_stops_runs_and_anneals_over_it():
    quick = htm.BALLET_SCALES["quick"]
    cfg = quick.train_config(seed=0, time_budget=90.0)
    # the clock ends the run: the steps are only a far ceiling, so a faster model takes more of them
    assert (cfg.time_budget, cfg.anneal_by, cfg.schedule, cfg.steps) == (90.0, "budget", "cosine",
                                                                         quick.steps * base.BUDGET_STEP_CEILING)
    assert htm.BALLET_SCALES["tour"].train_config(0, 90.0).anneal_by == "steps"  # a constant lr has no decay


def logged_losses(run_dir) -> dict:
    """The loss of every metrics.csv row a run left (``listops`` keeps each model's run directory):
    finer than the accuracies of a smoke run, which two different models can share."""
    losses = {}
    for path in sorted(run_dir.rglob("metrics.csv")):
        rows = [line.split(",") for line in path.read_text().splitlines()]
        column = rows[0].index("loss")
        losses[str(path.relative_to(run_dir))] = [row[column] for row in rows[1:]]
    return losses


@pytest.mark.parametrize("experiment", FAST)
def test_a_smoke_run_twice_gives_identical_metrics(tmp_path, experiment):
    runs = []
    for k in range(2):
        torch.manual_seed(100 + k)  # whatever the process did before, the run seeds itself
        runs.append(run_experiment(get_experiment(experiment), "smoke", tmp_path / str(k), seed=1, progress=False))
    saved = [json.loads((tmp_path / str(k) / "results.json").read_text()) for k in range(2)]
    assert saved[0]["results"] == saved[1]["results"] == runs[0]["results"]
    assert without_timings(saved[0]["extra"]) == without_timings(saved[1]["extra"])
    assert saved[0]["config"] == saved[1]["config"] and saved[0]["config"]["time_budget"] is None
    assert saved[0]["metric"] == get_experiment(experiment).metric
    assert saved[0]["code"] == base.code_version()  # the code that made it: version, commit (in a checkout)
    assert "no time budget" in (tmp_path / "0" / "report.md").read_text()
    losses = [logged_losses(tmp_path / str(k)) for k in range(2)]
    assert losses[0] == losses[1]
    if experiment == "listops":
        assert len(losses[0]) == 4 and all(losses[0].values())


def trained_weights(run_dir: Path) -> dict:
    """The weights of a run's last checkpoint."""
    from safetensors.torch import load_file

    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    return load_file(run_dir / "checkpoints" / latest / "model.safetensors")


def test_a_smoke_run_of_two_seeds_averages_them_and_trains_each_its_own_weights(tmp_path):
    assert htm.PAI_SCALES["smoke"].seeds == 2  # pai's smoke scale: seeds 1 and 2 here
    produced = run_experiment(get_experiment("pai"), "smoke", tmp_path, seed=1, progress=False)
    for model, row in produced["results"].items():
        for setting, cell in row.items():
            values = produced["per_seed"][model][setting]
            assert len(values) == 2 and cell == pytest.approx(sum(values) / 2), (model, setting)
    assert list(produced["extra"]["runs"]) == ["htm/seed1", "htm/seed2", "transformer/seed1", "transformer/seed2"]
    for model in ("htm", "transformer"):
        first, second = (trained_weights(tmp_path / model / f"seed{k}") for k in (1, 2))
        assert first.keys() == second.keys()
        assert any(not torch.equal(first[name], second[name]) for name in first), model  # each seed reached its run


def test_code_version_names_this_checkout(tmp_path, monkeypatch):
    import subprocess

    import chronomem

    code = base.code_version()
    assert code["version"] == chronomem.__version__
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(chronomem.__file__).parent, capture_output=True,
                          text=True)
    if head.returncode == 0:  # a git checkout (CI's clean clone is one)
        assert code["commit"] == head.stdout.strip() and isinstance(code["dirty"], bool)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(FileNotFoundError("git")))
    assert base.code_version() == {"version": chronomem.__version__, "commit": None, "dirty": None}


def _steps(extra: dict) -> dict:
    runs = extra.get("runs", extra)
    return {name: row["steps"] for name, row in runs.items() if isinstance(row, dict) and "steps" in row}


@pytest.mark.parametrize("experiment", (*FAST, "transfer-copy"))
def test_time_budget_reaches_every_model_and_is_reported(tmp_path, monkeypatch, experiment):
    monkeypatch.setattr(relevance, "run_capped", fake_capped_evaluation)
    out = tmp_path / experiment
    result = run_experiment(get_experiment(experiment), "smoke", out, progress=False, time_budget=1e-9)
    steps = _steps(result["extra"])
    assert steps and set(steps.values()) == {1}, steps  # every model stopped by the clock after one step
    assert result["config"]["time_budget"] == 1e-9
    assert json.loads((out / "results.json").read_text())["config"]["time_budget"] == 1e-9
    assert "equal wall-clock budget of 1e-09 s per model" in (out / "report.md").read_text()


@pytest.mark.parametrize("experiment", (*FAST, "listops-length", "transfer-copy", "denoise"))
def test_a_resumed_supervised_experiment_gives_the_uninterrupted_table(tmp_path, monkeypatch, experiment):
    """chronomem run --resume of a supervised experiment cut short: one run killed before its final
    checkpoint, one never started. Only those two train again; the finished runs are loaded and
    evaluated, and the table is the uninterrupted one."""
    import shutil

    import chronomem.train

    monkeypatch.setattr(relevance, "run_capped", fake_capped_evaluation)
    whole = run_experiment(get_experiment(experiment), "smoke", tmp_path / "whole", progress=False)
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    for file in ("results.json", "report.md", "results.png"):
        (tmp_path / "cut" / file).unlink()
    runs = sorted(p.parent for p in (tmp_path / "cut").rglob("config.json"))
    assert len(runs) >= 2
    shutil.rmtree(runs[-1] / "checkpoints")  # killed before its final (and only) checkpoint
    shutil.rmtree(runs[0])  # never started
    from_scratch = []
    train = chronomem.train.train

    def recording_train(model, task, cfg, *, resume=None, **kw):
        if resume is None or resume.checkpoint is None:
            from_scratch.append(Path(cfg.out))
        return train(model, task, cfg, resume=resume, **kw)

    monkeypatch.setattr(chronomem.train, "train", recording_train)
    resumed = run_experiment(get_experiment(experiment), "smoke", tmp_path / "cut", progress=False, resume=True)
    assert sorted(from_scratch) == [runs[0], runs[-1]]
    assert resumed["results"] == whole["results"]
    assert resumed.get("per_seed") == whole.get("per_seed")
    assert without_timings(resumed["extra"]) == without_timings(whole["extra"])
    assert resumed["config"]["resumed"] and "resumed" not in whole["config"]


def test_a_resumed_equal_time_experiment_gives_the_uninterrupted_table(tmp_path):
    """Under a time budget a finished run resumed takes no further step (its budget is spent)."""
    import shutil

    experiment = get_experiment("copy-baselines")
    whole = run_experiment(experiment, "smoke", tmp_path / "whole", progress=False, time_budget=1e-9)
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    (tmp_path / "cut" / "results.json").unlink()
    resumed = run_experiment(experiment, "smoke", tmp_path / "cut", progress=False, time_budget=1e-9, resume=True)
    assert set(_steps(resumed["extra"]).values()) == {1}
    assert resumed["results"] == whole["results"]


def test_a_resumed_supervised_run_must_be_the_same_run(tmp_path):
    out = tmp_path / "run"
    run_experiment(get_experiment("copy-baselines"), "smoke", out, progress=False)
    (out / "results.json").unlink()
    config = json.loads((out / "lstm" / "seed0" / "config.json").read_text())
    config["train"]["lr"] *= 2
    (out / "lstm" / "seed0" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"--lr .* differs from the resumed run's saved value"):
        run_experiment(get_experiment("copy-baselines"), "smoke", out, progress=False, resume=True)


def test_run_experiment_checks_scale_and_budget(tmp_path):
    pai = get_experiment("pai")
    with pytest.raises(ValueError, match="scale of pai must be one of"):
        run_experiment(pai, "tour", tmp_path / "a")  # pai has no tour scale
    for bad in (0, -5.0, float("nan"), "60", True):
        with pytest.raises(ValueError, match="time_budget must be a positive number"):
            run_experiment(pai, "smoke", tmp_path / "b", time_budget=bad)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def fake_experiment(name: str, calls: list) -> Experiment:
    def run(scale, out, seed, models=None, time_budget=None, progress=True):
        calls.append((name, scale, time_budget))
        return {"results": {"m": {"short": 10.0, "long": 20.0}}, "config": {"scale": scale}}

    return Experiment(name=name, description="", run=run, paper={"m": {"long": 90.0}}, metric=f"{name} metric",
                      scales=("smoke", "tour", "quick", "paper"))


def test_tour_runs_each_contributors_tour_scale_in_one_long_table(tmp_path, monkeypatch):
    calls: list = []
    fakes = {"alpha": fake_experiment("alpha", calls), "beta": fake_experiment("beta", calls),
             "gamma": dataclasses.replace(fake_experiment("gamma", calls), scales=("smoke", "quick", "paper")),
             "tour": EXPERIMENTS["tour"]}
    monkeypatch.setattr(tour, "EXPERIMENTS", fakes)
    result = run_experiment(fakes["tour"], "quick", tmp_path / "tour", progress=False, time_budget=30.0)
    assert calls == [("alpha", "tour", 30.0), ("beta", "tour", 30.0)]  # gamma has no tour scale
    assert result["scale"] == "tour"  # the CLI's default scale, quick, means the tour scale here
    assert result["results"]["beta: m"] == {"short": 10.0, "long": 20.0}
    assert result["paper"]["alpha: m"] == {"short": None, "long": 90.0}
    report = (tmp_path / "tour" / "report.md").read_text()
    assert "| experiment | model | setting | ours | paper | metric |" in report
    assert "| alpha | m | long | 20.0 | 90.0 | alpha metric |" in report
    assert "| beta | m | short | 10.0 | — | beta metric |" in report
    assert "(—)" not in report
    calls.clear()
    run_experiment(fakes["tour"], "smoke", tmp_path / "smoke", progress=False)
    assert calls == [("alpha", "smoke", None), ("beta", "smoke", None)]


def test_comparison_table_of_one_experiment_has_a_column_per_setting():
    table = comparison_table({"lstm": {"T=100": 30.0, "T=200": "OOM"}}, {"lstm": {"T=100": 99.0}, "tlb": {"x": 1.0}})
    assert table.splitlines() == [
        "| model | T=100 | T=200 | x |", "|---|---|---|---|",
        "| lstm | 30.0 (99.0) | OOM (—) | — (—) |", "| tlb | — (—) | — (—) | — (1.00) |"]


def test_plot_grows_with_its_rows(tmp_path):
    import matplotlib.image

    heights = []
    for rows in (2, 12):
        results = {"experiment": "tour", "scale": "tour",
                   "results": {f"experiment-{k}: a-rather-long-model-name": {"T=100": 10.0 * k} for k in range(rows)},
                   "paper": {"experiment-1: a-rather-long-model-name": {"T=100": 99.0}}}
        plot_results(results, tmp_path / f"{rows}.png", "accuracy (%)")
        heights.append(matplotlib.image.imread(tmp_path / f"{rows}.png").shape[0])
    assert heights[1] > 2 * heights[0]


def test_plot_leaves_out_settings_no_run_measured(tmp_path, monkeypatch):
    """The paper's rows for a setting we ran stay (a model we did not run included); a setting only the
    paper has gets no row."""
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    results = {"experiment": "denoise", "scale": "quick", "results": {"lstm": {"T=100": 40.0, "T=200": 30.0}},
               "paper": {"lstm": {"T=100": 50.0, "T=2000": 10.0}, "relevance-rnn": {"T=200": 99.0, "T=300": 98.0}}}
    plot_results(results, tmp_path / "d.png", "%")
    labels = [label.get_text() for label in figures[0].axes[0].get_yticklabels()]
    assert labels == ["lstm — T=100", "lstm — T=200", "relevance-rnn — T=200"]


def test_plot_marks_each_rows_chance_level(tmp_path, monkeypatch):
    """A dashed mark at each row's chance: its own experiment's in the tour, none where none is known."""
    import matplotlib.pyplot as plt

    assert all(experiment.chance is not None for experiment in tour.contributors())
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to read it
    rows = {"ballet: htm": {"2_delay16": 90.0}, "listops: tlb": {"accuracy": 30.0},
            "copy-baselines: lstm": {"T=100": 20.0}, "not-registered: m": {"x": 5.0}}
    chance = {}  # what the tour records: each contributor's chance level for its rows
    for name in ("ballet", "listops", "copy-baselines"):
        own = {key.split(": ")[1]: row for key, row in rows.items() if key.startswith(f"{name}: ")}
        chance.update(tour.contributed_chance(get_experiment(name), {"results": own}))
    plot_results({"experiment": "tour", "scale": "tour", "results": rows, "paper": {}, "chance": chance},
                 tmp_path / "t.png", "%")
    alone = {"experiment": "copy-baselines", "scale": "tour", "results": {"lstm": {"T=100": 20.0}}, "paper": {}}
    alone["chance"] = resolve_chance(get_experiment("copy-baselines"), alone)  # as base.finish records it
    plot_results(alone, tmp_path / "c.png", "%")
    marks = [[line.get_xdata()[0] for line in fig.axes[0].get_lines() if line.get_linestyle() == "--"]
             for fig in figures]
    assert marks == [[50.0, 10.0, 12.5], [12.5]]
    assert "chance" in [t.get_text() for t in figures[0].axes[0].get_legend().get_texts()]


def test_plot_keeps_values_readable_over_the_chance_mark(tmp_path):
    """A bar ending just short of chance has its number beside it, and the dashed mark is hidden over the
    bar's whole height there: read from the saved pixels, against the same figure with the mark elsewhere
    (same limits, same legend, so the two images line up pixel for pixel)."""
    import numpy as np
    from PIL import Image

    def render(level: float) -> np.ndarray:
        results = {"experiment": "visual-match", "scale": "quick", "results": {"mlp": {"d5": 33.0, "d30": 95.0}},
                   "paper": {}, "chance": {"d5": level, "d30": 34.0}}
        plot_results(results, tmp_path / "v.png", "%")
        return np.asarray(Image.open(tmp_path / "v.png").convert("RGB")).astype(int)

    crossed, elsewhere = render(34.0), render(80.0)
    assert crossed.shape == elsewhere.shape
    differ = (crossed != elsewhere).any(axis=2)
    columns = np.flatnonzero(differ.any(axis=0))
    mark = columns[columns < crossed.shape[1] // 2]  # the mark at 34 (the one at 80 lies right of the middle)
    assert 0 < len(mark) <= 3, "the mark at 34 is drawn somewhere in the row"
    column = int(mark.min())

    def blue(x: int) -> np.ndarray:
        return np.abs(crossed[:, x] - [31, 119, 180]).sum(axis=1) < 30

    rows = np.flatnonzero(blue(column - 8) & ~blue(column + 8))  # the d5 bar ends just short of the mark
    assert len(rows) > 5, "the d5 bar ends a few pixels short of the mark"
    inside = slice(rows.min() + 1, rows.max())  # the bar's height, less its anti-aliased edges
    assert not differ[inside, column - 1:column + 3].any(), "the mark shows across the number beside the bar"
    assert differ[:rows.min(), column].any() and differ[rows.max() + 1:, column].any(), "the mark shows elsewhere"
