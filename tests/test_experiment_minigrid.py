"""minigrid-transfer (paper 004 Table 3) at the smoke scale: the results.json structure, the paper's
numbers beside ours, and the same seed giving the same numbers."""

import csv
import json

import pytest

pytest.importorskip("minigrid")

MODELS = ("mlp", "lstm", "mem-lstm", "relevance-lstm")
COLUMNS = {"DoorKey-5x5", "DoorKey-16x16"}


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
    from chronomem.experiments.base import run_experiment
    from chronomem.registry import get_experiment

    experiment = get_experiment("minigrid-transfer")
    outs = [tmp_path_factory.mktemp(name) for name in ("first", "again")]
    return outs, [run_experiment(experiment, "smoke", out, seed=3, progress=False) for out in outs]


def test_smoke_results_structure(smoke_runs):
    from chronomem.experiments.minigrid import SCALES

    (out, _), (results, _) = smoke_runs
    assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(results))
    assert results["experiment"] == "minigrid-transfer" and results["scale"] == "smoke"
    assert tuple(results["results"]) == MODELS
    for model, row in results["results"].items():
        assert set(row) == COLUMNS and all(0.0 <= value <= 1.0 for value in row.values())
        for column in COLUMNS:  # a cell is the mean over the seeds' evaluations
            per_seed = results["extra"]["per_seed"][model][column]["return_mean"]
            assert len(per_seed) == SCALES["smoke"].seeds
            assert row[column] == pytest.approx(sum(per_seed) / len(per_seed), abs=1e-3)
    # paper 004 Table 3, beside ours
    assert results["paper"]["relevance-lstm"] == {"DoorKey-5x5": 0.93, "DoorKey-16x16": 0.44}
    assert results["paper"]["lstm"]["DoorKey-16x16"] == 0.09
    runs = results["extra"]["runs"]
    assert len(runs) == len(MODELS) * SCALES["smoke"].seeds
    assert {run["seed"] for run in runs} == {3, 4}
    assert all(run["frames"] == SCALES["smoke"].frames for run in runs)
    assert all(set(run["eval"]) == COLUMNS and run["eval"]["DoorKey-16x16"]["episodes"] == 4 for run in runs)
    run = out / "runs" / "doorkey" / "lstm" / "seed_3"
    config = json.loads((run / "config.json").read_text())["args"]
    assert (config["anneal_lr"], config["adam_eps"]) == (False, 1e-8)  # Adam as torch-ac runs it
    rates = {float(row["lr"]) for row in csv.DictReader((run / "metrics.csv").open()) if row["split"] == "train"}
    assert rates == {config["lr"]}  # kept constant over the updates, not annealed
    report = (out / "report.md").read_text()
    assert report.count("| relevance-lstm |") == 2  # the control's table and the memory table
    # the control: DoorKey-5x5's own cell, per seed, learned at 0.9
    control = results["control"]
    assert control["per_seed"] == {m: results["extra"]["per_seed"][m]["DoorKey-5x5"]["return_mean"] for m in MODELS}
    assert control["learned"] == {m: [r >= 0.9 for r in control["per_seed"][m]] for m in MODELS}
    assert "Control (no memory needed): `MiniGrid-DoorKey-5x5-v0`" in report


def test_same_seed_same_numbers(smoke_runs):
    _, (first, again) = smoke_runs
    assert first["results"] == again["results"]
    assert first["extra"]["per_seed"] == again["extra"]["per_seed"]
    assert [r["eval"] for r in first["extra"]["runs"]] == [r["eval"] for r in again["extra"]["runs"]]


def test_extra_rows_and_refused_cores(tmp_path):
    """The extra cores (HTM here) run as agents; unknown names fail, listing the valid ones."""
    from chronomem.experiments.base import run_experiment
    from chronomem.registry import get_experiment

    experiment = get_experiment("minigrid-transfer")
    results = run_experiment(experiment, "smoke", tmp_path / "htm", models=("htm",), progress=False)
    assert results["extra"]["refused"] == {}  # every extra core now takes episode ends inside a call
    assert set(results["results"]["htm"]) == COLUMNS
    assert results["paper"] == {}
    with pytest.raises(ValueError, match="valid models: mlp, lstm, mem-lstm, relevance-lstm, htm, tlb, gtrxl"):
        run_experiment(experiment, "smoke", tmp_path / "bad", models=("nope",), progress=False)


def test_a_pair_may_train_for_its_own_frames():
    from chronomem.experiments.minigrid import SCALES

    quick = SCALES["quick"]
    assert quick.frames_of("doorkey") == quick.frames and quick.frames_of("memory") == quick.pair_frames["memory"]
    assert quick.frames_of("memory") % (quick.num_envs * quick.num_steps) == 0  # whole rollouts
