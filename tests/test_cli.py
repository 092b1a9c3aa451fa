"""The `chronomem` command: list, train (+ resume), run, and its errors."""

import json
import subprocess
import sys

import pytest

from chronomem.cli import main
from chronomem.registry import names


def test_list_prints_every_registry(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for kind, listed in names().items():
        assert f"{kind}:" in out
        for name in listed:
            assert name in out
    assert "copy-baselines" in out and "tour" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--model", "nope", "--task", "copy"], "valid names"),
        (["train", "--model", "lstm", "--task", "nope"], "valid names"),
        (["train", "--model", "transformer", "--task", "copy", "--dim", "10", "--heads", "3"], "--heads"),
        (["train", "--model", "lstm", "--task", "copy", "--steps", "-3"], "--steps"),
        (["train", "--model", "lstm", "--task", "copy", "--task-opt", "seq_len=0"], "seq_len"),
        (["run", "no-such-experiment"], "valid names"),
        (["train", "--model", "lstm", "--task", "copy", "--anneal-by", "budget"], "needs a time budget"),
    ],
)
def test_bad_arguments_fail_before_training(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_train_then_resume(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--model", "lstm", "--task", "copy", "--task-opt", "seq_len=5", "--dim", "16", "--steps", "4",
            "--batch-size", "4", "--checkpoint-every", "2", "--out", str(run), "--no-progress"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["steps"] == 4
    config = json.loads((run / "config.json").read_text())
    assert config["spec"]["model"] == "lstm" and config["train"]["steps"] == 4
    assert main(["train", "--resume", str(run), "--steps", "6", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 6
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000006"


def test_train_with_a_budget_annealed_schedule(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--model", "lstm", "--task", "copy", "--task-opt", "seq_len=5", "--dim", "16", "--steps", "3",
            "--batch-size", "4", "--schedule", "linear", "--time-budget", "600", "--anneal-by", "budget",
            "--out", str(run), "--no-progress"]
    assert main(argv) == 0
    train_cfg = json.loads((run / "config.json").read_text())["train"]
    assert (train_cfg["time_budget"], train_cfg["anneal_by"]) == (600.0, "budget")


def test_missing_resume_directory_is_a_clear_error(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert "config.json" in capsys.readouterr().err


def test_run_writes_results_report_and_plot(tmp_path):
    out = tmp_path / "copy"
    assert main(["run", "copy-baselines", "--scale", "smoke", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results) >= {"experiment", "scale", "results", "paper", "config", "seconds"}
    assert results["experiment"] == "copy-baselines" and results["scale"] == "smoke"
    assert set(results["results"]) == {"lstm", "transformer", "transformer-xl"}
    assert all(0.0 <= v <= 100.0 for row in results["results"].values() for v in row.values())
    report = (out / "report.md").read_text()
    assert "lstm" in report and "(99.0)" in report
    assert (out / "results.png").stat().st_size > 0


def test_console_script_runs():
    proc = subprocess.run([sys.executable, "-m", "chronomem.cli", "list"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "models:" in proc.stdout


@pytest.mark.parametrize(
    "experiment, model",
    [
        ("copy-baselines", "lstm"),
        ("ballet", "htm"),
        ("pai", "htm"),
        ("transfer-copy", "relevance-rnn"),
        ("denoise", "mem-rnn"),
        ("listops", "transformer"),
        ("listops-length", "transformer"),
    ],
)
def test_run_restricted_to_one_model(experiment, model, tmp_path, capsys):
    out = tmp_path / experiment
    assert main(["run", experiment, "--scale", "smoke", "--models", model, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["results"]) == [model]
    assert list(results["config"]["models"]) == [model]
    assert set(results["paper"]) <= {model}
    table = capsys.readouterr().out
    assert f"| {model} |" in table and table.count("\n| ") == 2  # header and the one model's row


@pytest.mark.parametrize(
    "experiment, valid",
    [
        ("copy-baselines", "lstm, transformer, transformer-xl"),
        ("ballet", "htm, transformer-xl, lstm"),
        ("pai", "htm, transformer"),
        ("transfer-copy", "relevance-rnn, relevance-lstm, mem-rnn, lstm"),
        ("denoise", "relevance-rnn, mem-rnn"),
        ("listops", "transformer, tlb, blrp, transformer-xl"),
        ("listops-length", "transformer, tlb, blrp, transformer-xl"),
    ],
)
def test_run_unknown_model_fails_with_the_valid_ones(experiment, valid, tmp_path, capsys):
    out = tmp_path / experiment
    argv = ["run", experiment, "--scale", "smoke", "--models", "htm", "no-such-model", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "'no-such-model'" in err and f"valid models: {valid}" in err
    assert not out.exists()  # nothing trained or written, not even an empty output directory


def test_tour_takes_no_model_list(tmp_path, capsys):
    assert main(["run", "tour", "--scale", "smoke", "--models", "htm", "--out", str(tmp_path / "tour")]) == 2
    assert "tour" in capsys.readouterr().err
