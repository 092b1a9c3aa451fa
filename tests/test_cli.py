"""The `chronomem` command: list, train (+ resume), run, and its errors."""

import hashlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from chronomem import progress
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


TINY = ["--model", "lstm", "--task", "copy", "--task-opt", "seq_len=5", "--dim", "16", "--batch-size", "4",
        "--no-progress"]


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path) -> the hash of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_resume_writes_only_into_the_resumed_directory(tmp_path, monkeypatch, capsys):
    (tmp_path / "first").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "first")  # the run's saved `out` is relative to where it started
    assert main(["train", *TINY, "--steps", "4", "--checkpoint-every", "2", "--out", "runs/B"]) == 0
    original = tmp_path / "first" / "runs" / "B"
    copy = tmp_path / "C"
    shutil.copytree(original, copy)
    before = tree_digest(original)
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["train", "--resume", str(copy), "--steps", "8", "--no-progress"]) == 0
    assert tree_digest(original) == before  # the run copied from is untouched, byte for byte
    assert not any((tmp_path / "elsewhere").iterdir())  # nothing written where the command ran
    assert sorted(p.name for p in (copy / "checkpoints").iterdir()) == ["latest", "step_00000006", "step_00000008"]
    assert json.loads((copy / "config.json").read_text())["train"]["out"] == str(copy)
    assert main(["train", "--resume", "C", "--steps", "10", "--no-progress"]) == 2  # a relative path: from here
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", "C", "--steps", "10", "--no-progress"]) == 0
    assert (copy / "checkpoints" / "step_00000010").is_dir() and tree_digest(original) == before


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--lr", "0.01"], "--lr 0.01 differs from the resumed run's saved value 0.001"),
        (["--batch-size", "8"], "--batch-size 8 differs from the resumed run's saved value 4"),
        (["--model", "transformer"], "--model transformer differs from the resumed run's saved value lstm"),
        (["--dim", "32"], "--dim 32 differs from the resumed run's saved value 16"),
        (["--task-opt", "seq_len=7"], "--task-opt seq_len 7 differs from the resumed run's saved value 5"),
        (["--seed", "3"], "--seed 3 differs from the resumed run's saved value 0"),
        (["--schedule", "cosine"], "--schedule cosine differs from the resumed run's saved value constant"),
        (["--out", "elsewhere"], "a resumed run writes only into its own directory"),
    ],
)
def test_resume_rejects_a_flag_that_would_change_the_run(flags, named, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--steps", "2", "--out", str(run)]) == 0
    before = tree_digest(run)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--steps", "4", *flags]) == 2
    err = capsys.readouterr().err
    assert named in err and err.count("\n") == 1
    assert tree_digest(run) == before
    # the same values as saved are accepted, and the flags that may change apply
    argv = ["train", "--resume", str(run), "--steps", "4", "--lr", "0.001", "--task-opt", "seq_len=5",
            "--checkpoint-every", "3", "--time-budget", "600", "--no-progress"]
    assert main(argv) == 0
    saved = json.loads((run / "config.json").read_text())["train"]
    assert (saved["steps"], saved["checkpoint_every"], saved["time_budget"]) == (4, 3, 600.0)
    assert (run / "checkpoints" / "step_00000003").is_dir()


def test_resume_from_a_checkpoint_directory_named_by_the_corruption_error(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--steps", "4", "--checkpoint-every", "2", "--out", str(run)]) == 0
    trainer = run / "checkpoints" / "step_00000004" / "trainer.pt"
    trainer.write_bytes(b"not a checkpoint")
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--steps", "6", "--no-progress"]) == 2
    err = capsys.readouterr().err
    intact = run / "checkpoints" / "step_00000002"
    assert f"--resume {intact}" in err and "weights_only" not in err and err.count("\n") == 1
    assert main(["train", "--resume", str(intact), "--steps", "6", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 6
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["latest", "step_00000004", "step_00000004.discarded", "step_00000006"]  # set aside, not lost
    steps = [line.split(",")[:2] for line in (run / "metrics.csv").read_text().splitlines()[1:]]
    assert steps == [["6", "train"], ["6", "test"]]  # the rows logged after step 2 by the first run are gone


def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_it_again(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--steps", "3", "--out", str(run)]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    shutil.rmtree(run / "checkpoints")  # as if killed before it wrote one; config.json and metrics.csv remain
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["steps"] == 3 and again["loss"] == pytest.approx(first["loss"], abs=1e-6)  # same seed, same run
    steps = [line.split(",")[:2] for line in (run / "metrics.csv").read_text().splitlines()[1:]]
    assert steps == [["3", "train"], ["3", "test"]]


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


def bad_out_paths(tmp_path: Path) -> dict[str, str]:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    paths = {"a file": str(a_file), "under a file": str(a_file / "run")}
    if Path("/proc/self").is_dir():  # unwritable even for root
        paths["unwritable"] = "/proc/chronomem-test/run"
    return paths


def assert_one_line_error(code, capsys, command, *needles):
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"chronomem {command}: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize("case", ["a file", "under a file", "unwritable"])
@pytest.mark.parametrize("command", ["train", "run", "bench"])
def test_bad_out_is_a_one_line_error(command, case, tmp_path, capsys):
    paths = bad_out_paths(tmp_path)
    if case not in paths:
        pytest.skip("no /proc here")
    argv = {"train": ["train", *TINY, "--steps", "1"], "run": ["run", "copy-baselines", "--scale", "smoke"],
            "bench": ["bench", "--quick", "--models", "lstm"]}[command]
    assert_one_line_error(main([*argv, "--out", paths[case]]), capsys, command, "--out")


@pytest.mark.parametrize(
    "flags, needles",
    [
        (["--device", "banana"], ["--device 'banana' is not a device"]),
        (["--device", "cuda"], ["--device cuda: CUDA is not available"]),
        (["--time-budget", "-1"], ["--time-budget must be a positive number"]),
        (["--time-budget", "0"], ["--time-budget must be a positive number"]),
        (["--task-opt", "length=5"], ["--task-opt length", "valid keys: seq_len, n_symbols, copy_len"]),
    ],
)
def test_bad_train_flags_are_one_line_errors(flags, needles, tmp_path, capsys):
    if "cuda" in flags and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    out = tmp_path / "run"
    assert_one_line_error(main(["train", *TINY, "--steps", "1", "--out", str(out), *flags]), capsys, "train", *needles)
    assert not out.exists()


def test_bad_device_on_resume_is_a_one_line_error(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--steps", "1", "--out", str(run)]) == 0
    capsys.readouterr()
    code = main(["train", "--resume", str(run), "--steps", "2", "--device", "banana"])
    assert_one_line_error(code, capsys, "train", "--device")


def test_train_refuses_an_out_that_holds_a_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--steps", "1", "--out", str(run)]) == 0
    capsys.readouterr()
    before = tree_digest(run)
    assert_one_line_error(main(["train", *TINY, "--steps", "1", "--out", str(run)]), capsys, "train",
                          f"--resume {run}")
    assert tree_digest(run) == before


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


@pytest.mark.parametrize("module", ["chronomem", "chronomem.cli"])
def test_python_dash_m_runs_the_command(module):
    proc = subprocess.run([sys.executable, "-m", module, "list"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "models:" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", module, "train", "--model", "lstm", "--task", "copy", "--device",
                           "banana"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("chronomem train: error: --device")


def test_run_shows_progress_lines_and_a_summary_per_model_when_not_a_terminal(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress, "LINE_INTERVAL", 0.0)  # a line at every step (10 s in real use)
    assert main(["run", "copy-baselines", "--scale", "smoke", "--out", str(tmp_path / "a")]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    for model in ("lstm", "transformer", "transformer-xl"):
        label = f"{model} on copy, seed 0: "
        steps = [line for line in lines if line.startswith(label + "step ")]
        assert [line.split()[len(label.split())] for line in steps] == ["step"] * 3
        assert [line[len(label):].split(",")[0] for line in steps] == ["step 1/3 (33%)", "step 2/3 (67%)",
                                                                      "step 3/3 (100%)"]
        assert "ETA" in steps[-1] and "loss" in steps[-1]  # step 3 is the last, so it logs loss and accuracy
        summary = [line for line in lines if line.startswith(label + "done, 3 steps in ")]
        assert len(summary) == 1 and "test accuracy" in summary[0]
    assert "\r" not in captured.err and "on copy, seed 0: " not in captured.out  # plain lines, on stderr only


def test_run_quiet_shows_no_progress(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress, "LINE_INTERVAL", 0.0)
    assert main(["run", "copy-baselines", "--scale", "smoke", "--models", "lstm", "--quiet",
                 "--out", str(tmp_path / "a")]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "| lstm |" in captured.out


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_run_shows_a_bar_on_a_terminal(tmp_path, monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["run", "copy-baselines", "--scale", "smoke", "--models", "lstm", "--out", str(tmp_path / "a")]) == 0
    shown = terminal.getvalue()
    assert "lstm on copy, seed 0" in shown and "3/3" in shown and "\r" in shown  # tqdm's bar
    assert shown.rstrip().splitlines()[-1].startswith("lstm on copy, seed 0: done, 3 steps")


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


def test_train_flags_are_built_from_train_config(tmp_path, capsys):
    import dataclasses

    from chronomem.cli import make_parser
    from chronomem.config import config_flag
    from chronomem.train import TrainConfig
    from chronomem.train.loop import SCHEDULES

    train_parser = make_parser()._subparsers._group_actions[0].choices["train"]
    actions = {a.dest: a for a in train_parser._actions}
    for field in dataclasses.fields(TrainConfig):
        assert config_flag(field) in actions[field.name].option_strings and actions[field.name].default is None
    assert tuple(actions["schedule"].choices) == SCHEDULES and "rsqrt" in SCHEDULES
    # a flag not given takes TrainConfig's default: the saved settings are the dataclass's own
    run = tmp_path / "run"
    assert main(["train", "--model", "lstm", "--task", "copy", "--task-opt", "seq_len=5", "--steps", "1",
                 "--out", str(run), "--no-progress"]) == 0
    saved = json.loads((run / "config.json").read_text())
    defaults = dataclasses.asdict(TrainConfig(steps=1, out=str(run), progress=False))
    assert saved["train"] == {**defaults, "betas": list(defaults["betas"])}
    assert {k: saved["spec"]["model_options"][k] for k in ("dim", "depth", "num_heads")} == {
        "dim": 64, "depth": 2, "num_heads": 4}  # build_model's defaults


def test_train_flags_of_every_field_apply_and_resume_checks_them(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", *TINY, "--steps", "2", "--schedule", "rsqrt", "--warmup", "1", "--betas", "0.8", "0.9",
            "--weight-decay", "0.1", "--log-every", "1", "--clip", "0", "--out", str(run)]
    assert main(argv) == 0
    saved = json.loads((run / "config.json").read_text())["train"]
    assert (saved["schedule"], saved["betas"], saved["weight_decay"], saved["log_every"], saved["clip"]) == (
        "rsqrt", [0.8, 0.9], 0.1, 1, None)
    capsys.readouterr()
    for flags, named in [(["--weight-decay", "0.2"], "--weight-decay 0.2 differs"),
                         (["--betas", "0.8", "0.99"], "--betas (0.8, 0.99) differs"),
                         (["--clip", "1"], "--clip 1.0 differs from the resumed run's saved value None")]:
        assert_one_line_error(main(["train", "--resume", str(run), "--steps", "3", *flags]), capsys, "train", named)
    run2 = tmp_path / "clipped"
    assert main(["train", *TINY, "--steps", "1", "--out", str(run2)]) == 0
    capsys.readouterr()
    assert_one_line_error(main(["train", "--resume", str(run2), "--steps", "2", "--clip", "0"]), capsys, "train",
                          "--clip 0 (no clipping) differs from the resumed run's saved value 1.0")
    # the same values as saved are accepted; --log-every, like --steps, may change
    assert main(["train", "--resume", str(run), "--steps", "3", "--betas", "0.8", "0.9", "--clip", "0",
                 "--log-every", "3", "--no-progress"]) == 0
    assert json.loads((run / "config.json").read_text())["train"]["log_every"] == 3


@pytest.mark.parametrize("budget", ["0", "-5", "nan", "inf"])
def test_run_time_budget_must_be_positive(budget, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "copy-baselines", "--scale", "smoke", "--time-budget", budget, "--out", str(out)])
    assert_one_line_error(code, capsys, "run", "--time-budget must be a positive number of seconds")
    assert not out.exists()


def fake_run_experiment(calls, outs=None):
    def run_experiment(experiment, scale, out, **kwargs):
        calls.append(kwargs)
        if outs is not None:
            outs.append(out)
        return {"results": {"lstm": {"copy": 50.0}}, "paper": {}, "scale": scale, "seconds": 1.0}

    return run_experiment


def test_run_time_budget_reaches_run_experiment(tmp_path, capsys, monkeypatch):
    import chronomem.experiments
    from chronomem.experiments.jobs import Jobs

    calls = []
    monkeypatch.setattr(chronomem.experiments, "run_experiment", fake_run_experiment(calls))
    assert main(["run", "copy-baselines", "--scale", "smoke", "--out", str(tmp_path), "--time-budget", "30"]) == 0
    assert "equal time budget of 30 s per model" in capsys.readouterr().out
    assert main(["run", "copy-baselines", "--scale", "smoke", "--out", str(tmp_path), "--seed", "2"]) == 0
    sequential = Jobs(1)  # --jobs 1, the default
    assert calls == [{"seed": 0, "models": None, "progress": True, "time_budget": 30.0, "resume": False,
                      "jobs": sequential},
                     {"seed": 2, "models": None, "progress": True, "time_budget": None, "resume": False,
                      "jobs": sequential}]


def test_run_resume_continues_in_its_own_directory(tmp_path, capsys, monkeypatch):
    import chronomem.experiments

    interrupted = tmp_path / "interrupted"
    interrupted.mkdir()
    code = main(["run", "tour", "--scale", "smoke", "--resume", str(interrupted)])
    assert_one_line_error(code, capsys, "run", "--resume: tour cannot reuse the runs of an interrupted run")
    code = main(["run", "popgym", "--scale", "smoke", "--resume", str(interrupted), "--out", str(tmp_path / "x")])
    assert_one_line_error(code, capsys, "run", "a resumed run writes only into its own directory")
    calls = []
    monkeypatch.setattr(chronomem.experiments, "run_experiment", fake_run_experiment(calls, outs := []))
    assert main(["run", "popgym", "--scale", "smoke", "--resume", str(interrupted), "--quiet"]) == 0
    assert calls[0]["resume"] is True and outs == [interrupted]


def test_run_scales_are_the_experiments_scales(tmp_path, capsys, monkeypatch):
    import chronomem.experiments
    from chronomem.experiments.base import SCALES

    calls = []
    monkeypatch.setattr(chronomem.experiments, "run_experiment", fake_run_experiment(calls))
    for scale in SCALES:
        assert main(["run", "copy-baselines", "--scale", scale, "--out", str(tmp_path)]) == 0
    with pytest.raises(SystemExit) as exit_:
        main(["run", "copy-baselines", "--scale", "huge", "--out", str(tmp_path)])
    assert exit_.value.code == 2 and len(calls) == len(SCALES)
    err = capsys.readouterr().err
    assert "invalid choice: 'huge'" in err and all(repr(scale) in err for scale in SCALES)


def write_results(path: Path, experiment: str, seed: int, accuracy: float) -> Path:
    path.mkdir(parents=True)
    (path / "results.json").write_text(json.dumps({
        "experiment": experiment, "scale": "smoke", "seed": seed, "seconds": 3.0, "config": {},
        "results": {"lstm": {"copy": accuracy}}, "paper": {"lstm": {"copy": 99.0}}}))
    return path / "results.json"


def test_report_prints_the_results_page(tmp_path, capsys):
    from chronomem.report import results_page

    write_results(tmp_path / "runs" / "a", "copy-baselines", 0, 41.5)
    write_results(tmp_path / "runs" / "b", "copy-baselines", 1, 43.5)
    write_results(tmp_path / "other", "denoise", 0, 12.0)
    paths = [str(tmp_path / "runs"), str(tmp_path / "other" / "results.json")]
    assert main(["report", *paths]) == 0
    out = capsys.readouterr().out
    assert out == results_page(paths) and "| lstm | copy | 41.5 | 43.5 | 42.5 | 99.0 |" in out and "denoise" in out
    assert main(["report", *paths, "--title", "Tonight"]) == 0
    assert capsys.readouterr().out.startswith("# Tonight\n")
    page = tmp_path / "docs" / "results.md"
    assert main(["report", *paths, "--out", str(page)]) == 0
    assert page.read_text() == out and sorted(p.name for p in page.parent.iterdir()) == ["results.md"]
    assert capsys.readouterr().out == ""


def test_report_bad_paths_are_one_line_errors(tmp_path, capsys):
    write_results(tmp_path / "good", "copy-baselines", 0, 41.5)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("{not json")
    (tmp_path / "empty").mkdir()
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = [([str(tmp_path / "missing")], "does not exist"), ([str(tmp_path / "bad")], "is not valid JSON"),
             ([str(tmp_path / "empty")], "no results.json"), ([str(a_file)], "is not valid JSON"),
             ([str(tmp_path / "good"), "--out", str(tmp_path)], "is a directory, expected a file"),
             ([str(tmp_path / "good"), "--out", str(a_file / "page.md")], "--out")]
    for argv, needle in cases:
        assert_one_line_error(main(["report", *argv]), capsys, "report", needle)


def test_eval_prints_the_runs_final_test_metrics(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--steps", "4", "--checkpoint-every", "2", "--eval-examples", "48",
                 "--out", str(run)]) == 0
    trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["eval", str(run)]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert (evaluated["step"], evaluated["examples"]) == (4, 48)
    assert (evaluated["loss"], evaluated["accuracy"]) == (trained["loss"], trained["accuracy"])
    assert main(["eval", str(run / "checkpoints" / "step_00000002"), "--examples", "8", "--batch-size", "3",
                 "--device", "cpu"]) == 0
    earlier = json.loads(capsys.readouterr().out)
    assert (earlier["step"], earlier["examples"]) == (2, 8) and earlier["loss"] != trained["loss"]
    for argv, needle in [([str(tmp_path / "nothing")], "config.json"), ([str(run), "--examples", "0"], "--examples"),
                         ([str(run), "--device", "banana"], "--device")]:
        assert_one_line_error(main(["eval", *argv]), capsys, "eval", needle)


def test_train_does_not_import_the_experiments():
    """Only `run` and `list` need the experiments (and, with agents, their environments)."""
    code = ("import sys; from chronomem.cli import main; "
            f"code = main(['train', *{TINY!r}, '--steps', '1']); print(code, 'chronomem.experiments' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "0 False"


def test_run_never_overwrites_earlier_results(tmp_path, monkeypatch, capsys):
    """An explicit --out holding results is refused; the default directory gets a fresh name."""
    monkeypatch.chdir(tmp_path)
    assert main(["run", "copy-baselines", "--scale", "smoke", "--models", "lstm", "--quiet"]) == 0
    first = (tmp_path / "runs" / "copy-baselines" / "results.json").read_bytes()
    assert main(["run", "copy-baselines", "--scale", "smoke", "--models", "lstm", "--quiet"]) == 0
    assert (tmp_path / "runs" / "copy-baselines-2" / "results.json").exists()
    assert (tmp_path / "runs" / "copy-baselines" / "results.json").read_bytes() == first
    capsys.readouterr()
    assert main(["run", "copy-baselines", "--scale", "smoke", "--out", "runs/copy-baselines"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("chronomem run: error: --out runs/copy-baselines already holds") and err.count("\n") == 1
    assert (tmp_path / "runs" / "copy-baselines" / "results.json").read_bytes() == first


def test_resume_adds_models_to_finished_results_and_keeps_their_rows(tmp_path, monkeypatch, capsys):
    """--resume may rewrite a finished experiment's results.json only to add rows: same experiment, scale
    and seed, every model it holds named again; the rows it had come back equal (from the same runs)."""
    monkeypatch.chdir(tmp_path)
    run = ["run", "copy-baselines", "--scale", "smoke", "--quiet"]
    assert main([*run, "--models", "lstm", "--out", "first"]) == 0
    first = json.loads((tmp_path / "first" / "results.json").read_text())
    capsys.readouterr()
    refused = [(["--scale", "smoke", "--models", "transformer"], "holds lstm, which --models leaves out"),
               (["--scale", "smoke", "--models", "lstm", "transformer", "--seed", "1"], "another run (seed 0)"),
               (["--scale", "quick", "--models", "lstm", "transformer"], "another run (scale 'smoke')")]
    for flags, needle in refused:
        argv = ["run", "copy-baselines", "--quiet", "--resume", "first", *flags]
        assert_one_line_error(main(argv), capsys, "run", needle)
        assert json.loads((tmp_path / "first" / "results.json").read_text()) == first
    assert main([*run, "--models", "lstm", "transformer", "--resume", "first"]) == 0
    both = json.loads((tmp_path / "first" / "results.json").read_text())
    assert list(both["results"]) == ["lstm", "transformer"]
    assert both["results"]["lstm"] == first["results"]["lstm"] and both["per_seed"] == {
        **first["per_seed"], "transformer": both["per_seed"]["transformer"]}


def test_help_and_version_start_without_torch():
    # `chronomem --help`, `--version` and a command's bare usage build no config dataclass, so torch is not
    # imported (a second or more of start-up); training commands still import it when they build their flags.
    code = ("import sys\nfrom chronomem.cli import main\n"
            "for argv in (['--help'], ['--version']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"
    assert "chronomem 0.1.0" in out and "{list,train,eval,run,report,bench,lm,rl}" in out


def test_list_imports_neither_minigrid_popgym_nor_the_agents():
    # `chronomem list` loads every model, task and experiment, but not the RL stack: the experiments
    # read their environments' ids and facts (envs/ballet_world.py, envs/minigrid.py, envs/popgym.py);
    # the wrappers, MiniGrid, POPGym and the agents are imported when a run starts. Gymnasium's registry
    # is loaded: importing chronomem.envs registers every chronomem id (tests/test_envs_tvt.py). PPO's
    # settings (chronomem.rl.settings, no torch) are: the RL experiments check their scales against them.
    code = ("import sys\nfrom chronomem.cli import main\nmain(['list'])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('minigrid', 'popgym') "
            "or m.startswith(('chronomem.rl.', 'chronomem.agents', 'chronomem.envs.make')) "
            "and m != 'chronomem.rl.settings'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
    assert "ballet-rl" in out and "popgym" in out


def test_list_wraps_descriptions_at_words(capsys):
    from chronomem.registry import EXPERIMENTS

    assert main(["list"]) == 0
    listed = capsys.readouterr().out.split("experiments:\n", 1)[1]
    for name in EXPERIMENTS:  # every description whole: the listing's words, joined, contain it
        assert " ".join(EXPERIMENTS[name].description.split()) in " ".join(listed.split())


@pytest.mark.parametrize("argv, message", [
    (["lm", "sample", "RUN", "--prompt", "a", "--bytes", "-3"], "--bytes must be an integer >= 0, got -3"),
    (["lm", "sample", "RUN", "--prompt", "a", "--top-k", "0"], "--top-k must be an integer >= 1"),
    (["lm", "sample", "RUN", "--prompt", "a", "--temperature", "-1"], "--temperature must be a number >= 0"),
    (["train", "--model", "lstm", "--task", "copy", "--threads", "0"], "--threads must be a positive integer"),
])
def test_flag_errors_name_the_flag(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_eval_of_a_directory_that_is_not_a_run_says_so(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is not a run directory" in err and "--resume" not in err


def test_threads_flag_sets_torch_threads(tmp_path, capsys):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        main(["eval", str(tmp_path), "--threads", "1"])  # fails on the directory, after setting the threads
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_sampled_control_bytes_are_printed_escaped():
    from chronomem.cli import printable

    assert printable(b"ok\x07 \x1b[31mred\nnext\ttab \xff caf\xc3\xa9") == "ok\\x07 \\x1b[31mred\nnext\ttab \\xff café"


def test_run_prints_the_scale_that_ran(tmp_path, monkeypatch, capsys):
    # `chronomem run tour` runs the tour scale (quick is its alias): the heading says so
    import chronomem.experiments as experiments

    ran = {"results": {"ballet: htm": {"2_delay16": 50.0}}, "paper": {}, "scale": "tour", "seconds": 1.0}
    monkeypatch.setattr(experiments, "run_experiment", lambda *a, **k: ran)
    assert main(["run", "tour", "--out", str(tmp_path / "t")]) == 0
    assert "tour (tour)" in capsys.readouterr().out
