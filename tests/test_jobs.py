"""``chronomem run EXPERIMENT --jobs K``: an experiment's independent runs in K processes of one torch
thread each, writing the numbers a sequential run writes (``chronomem.experiments.jobs``)."""

import dataclasses
import json
import os

import pytest
import torch

from chronomem.cli import main
from chronomem.experiments import run_experiment, tour
from chronomem.experiments.base import Experiment
from chronomem.experiments.jobs import Jobs
from chronomem.registry import EXPERIMENTS, get_experiment


def where(item: int) -> tuple[int, int, int]:
    """The job function of the ``Jobs.map`` test: the item, the process and its torch threads."""
    return item, os.getpid(), torch.get_num_threads()


def without_timings(value):
    """``value`` without what the clock measures (seconds, frames per second), recursively."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if "seconds" not in k and k != "frames_per_second"}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


CLOCK = ("seconds", "tokens_per_second", "sps")  # metrics.csv columns that time the run


def logged_metrics(run_dir) -> dict:
    """Every metrics.csv under ``run_dir`` (each run's losses at each logged step: finer than a smoke
    run's accuracies), by run, without the columns the clock measures."""
    logged = {}
    for path in sorted(run_dir.rglob("metrics.csv")):
        header, *rows = [line.split(",") for line in path.read_text().splitlines()]
        kept = [i for i, name in enumerate(header) if not name.startswith(CLOCK)]
        logged[str(path.relative_to(run_dir))] = [[row[i] for i in kept] for row in [header, *rows]]
    return logged


def assert_same_numbers(experiment: str, tmp_path, capfd=None) -> dict:
    """Run ``experiment`` at smoke scale with ``jobs=1`` and ``jobs=2``: the same results.json but for
    the timings and ``config["jobs"]``. Returns the parallel run's results.json."""
    saved = {}
    for jobs in (1, 2):
        run_experiment(get_experiment(experiment), "smoke", tmp_path / str(jobs), seed=1, progress=capfd is not None,
                       jobs=jobs)
        saved[jobs] = json.loads((tmp_path / str(jobs) / "results.json").read_text())
    one, two = saved[1], saved[2]
    assert one["results"] == two["results"]
    assert without_timings(one["extra"]) == without_timings(two["extra"])  # every seed's numbers, curves
    assert (one["config"]["jobs"], two["config"]["jobs"]) == (1, 2)
    assert {**one["config"], "jobs": 2} == two["config"]
    assert logged_metrics(tmp_path / "1") == logged_metrics(tmp_path / "2")
    return two


def test_map_keeps_the_order_and_runs_in_processes_of_one_thread():
    assert Jobs().map(where, [3, 1, 2]) == [(i, os.getpid(), torch.get_num_threads()) for i in (3, 1, 2)]
    got = Jobs(2).map(where, [3, 1, 2, 5])
    assert [item for item, _, _ in got] == [3, 1, 2, 5]
    assert all(pid != os.getpid() and threads == 1 for _, pid, threads in got)
    before = torch.get_num_threads()
    assert Jobs(3, threads=2).map(where, [7]) == [(7, os.getpid(), 2)]  # one job: here, with a worker's threads
    assert torch.get_num_threads() == before


def test_copy_baselines_in_two_processes_gives_the_sequential_numbers(tmp_path, capfd):
    assert_same_numbers("copy-baselines", tmp_path, capfd)
    err = capfd.readouterr().err  # the workers' progress reaches stderr, each line naming its run
    for model in ("lstm", "transformer", "transformer-xl"):
        assert err.count(f"{model} on copy, seed 1: done") == 2  # once per run: jobs=1, then jobs=2


def test_listops_in_two_processes_gives_the_sequential_numbers(tmp_path):
    saved = assert_same_numbers("listops", tmp_path)  # every model's loss at every logged step too
    assert len(logged_metrics(tmp_path / "2")) == len(saved["config"]["models"]) == 4


def test_pai_in_two_processes_gives_the_sequential_numbers(tmp_path):
    saved = assert_same_numbers("pai", tmp_path)  # its smoke scale runs two seeds: 4 runs over 2 processes
    assert len(logged_metrics(tmp_path / "2")) == len(saved["extra"]["runs"]) == 4


def test_an_rl_experiment_in_two_processes_gives_the_sequential_numbers(tmp_path):
    pytest.importorskip("gymnasium")
    try:
        import popgym  # noqa: F401

        name = "popgym"
    except ImportError:
        name = "ballet-rl"
    saved = assert_same_numbers(name, tmp_path)
    assert logged_metrics(tmp_path / "2")  # every update's losses compared
    runs = saved["extra"]["runs"] if name == "popgym" else {m: saved["extra"][m]["runs"] for m in saved["results"]}
    assert all(run["curve"] for model_runs in runs.values() for run in model_runs)  # compared update by update


@pytest.mark.parametrize("jobs", ["0", "-1", "two", "1.5"])
def test_bad_jobs_is_a_one_line_error_naming_the_flag(jobs, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["run", "copy-baselines", "--scale", "smoke", "--jobs", jobs, "--out", str(out)]
    if jobs.lstrip("-").isdigit():
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err == ("chronomem run: error: --jobs must be a positive integer (runs at once, one process each), "
                       f"got {jobs}")
    else:  # argparse's own error names it too
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and f"argument --jobs: invalid int value: '{jobs}'" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("jobs", [0, -1, True, 1.5, "2"])
def test_run_experiment_refuses_bad_jobs_before_it_writes(jobs, tmp_path):
    with pytest.raises(ValueError, match="--jobs must be a positive integer"):
        run_experiment(get_experiment("copy-baselines"), "smoke", tmp_path / "run", jobs=jobs)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="--threads must be a positive integer"):
        Jobs(2, threads=0)


def test_jobs_and_threads_reach_run_experiment(tmp_path, capsys, monkeypatch):
    import chronomem.experiments

    calls = []

    def fake(experiment, scale, out, **kwargs):
        calls.append(kwargs["jobs"])
        return {"results": {"lstm": {"copy": 50.0}}, "paper": {}, "scale": scale, "seconds": 1.0}

    monkeypatch.setattr(chronomem.experiments, "run_experiment", fake)
    before = torch.get_num_threads()
    try:
        for flags in ([], ["--jobs", "2"], ["--jobs", "2", "--threads", "3"]):
            assert main(["run", "copy-baselines", "--scale", "smoke", "--out", str(tmp_path), *flags]) == 0
    finally:
        torch.set_num_threads(before)
    assert calls == [Jobs(1), Jobs(2, threads=1), Jobs(2, threads=3)]


def sequential_only(calls: list) -> Experiment:
    def run(scale, out, seed, models=None, time_budget=None, progress=True):
        calls.append(scale)
        return {"results": {"m": {"x": 1.0}}, "config": {}}

    return Experiment(name="sequential", description="", run=run, scales=("smoke", "tour", "quick", "paper"))


def test_an_experiment_that_cannot_split_its_runs_refuses_more_jobs(tmp_path, monkeypatch):
    calls: list = []
    experiment = sequential_only(calls)
    with pytest.raises(ValueError, match="--jobs 2: sequential runs its runs one after the other in one process"):
        run_experiment(experiment, "smoke", tmp_path / "a", jobs=2)
    assert not calls and not (tmp_path / "a").exists()
    assert run_experiment(experiment, "smoke", tmp_path / "b", jobs=1)["config"]["jobs"] == 1
    # The tour hands --jobs to each contributor, and checks them all before anything runs.
    monkeypatch.setattr(tour, "EXPERIMENTS", {"sequential": experiment, "tour": EXPERIMENTS["tour"]})
    with pytest.raises(ValueError, match="--jobs 2: sequential runs"):
        run_experiment(EXPERIMENTS["tour"], "smoke", tmp_path / "c", jobs=2, progress=False)
    assert calls == ["smoke"]


CALLS: list = []


@dataclasses.dataclass(frozen=True)
class SquareJob:
    value: int
    progress: bool = True


def square(job: SquareJob) -> dict:
    CALLS.append(job.value)
    return {"square": job.value**2, "pair": (job.value, -job.value)}


def test_a_recorded_job_is_read_back_on_resume_only_for_the_same_job(tmp_path):
    from chronomem.experiments.jobs import Recorded, run_recorded

    CALLS.clear()
    path = str(tmp_path / "runs" / "three.json")
    first = run_recorded(Recorded(square, SquareJob(3), path))
    assert first == {"square": 9, "pair": [3, -3]} and CALLS == [3]  # as JSON reads it back, tuples as lists
    assert run_recorded(Recorded(square, SquareJob(3, progress=False), path, reuse=True)) == first
    assert CALLS == [3]  # read back: progress is no part of the job
    assert run_recorded(Recorded(square, SquareJob(4), path, reuse=True))["square"] == 16  # another job: run
    assert run_recorded(Recorded(square, SquareJob(4), path))["square"] == 16  # without reuse: run again
    assert CALLS == [3, 4, 4]
    assert json.loads((tmp_path / "runs" / "three.json").read_text())["job"] == {"value": 4}


def test_decision_transformer_resumes_from_its_recorded_runs(tmp_path, monkeypatch):
    pytest.importorskip("minatar")
    from chronomem.experiments import decision_transformer

    monkeypatch.setenv("CHRONOMEM_CACHE", str(tmp_path / "cache"))
    experiment = get_experiment("decision-transformer")
    first = run_experiment(experiment, "smoke", tmp_path / "out", seed=0, progress=False)
    assert len(list((tmp_path / "out" / "runs").rglob("seed0.json"))) == 2  # dt and dt-tlb

    def not_again(run):
        raise AssertionError(f"{run.model} trained again")

    monkeypatch.setattr(decision_transformer, "train_and_play", not_again)
    again = run_experiment(experiment, "smoke", tmp_path / "out", seed=0, progress=False, resume=True)
    assert again["results"] == first["results"] and again["per_seed"] == first["per_seed"]


def test_the_costliest_jobs_start_first_and_the_results_keep_the_jobs_order(monkeypatch):
    from chronomem.experiments import jobs as jobs_module

    assert jobs_module.start_order(4, None) == [0, 1, 2, 3]
    assert jobs_module.start_order(5, [1, 3, float("inf"), 3, 2]) == [2, 1, 3, 4, 0]  # ties keep their order
    with pytest.raises(ValueError, match="cost must give one number per job"):
        jobs_module.start_order(3, [1, 2])
    submitted = []

    class Pool:  # records the submission order; runs each job at once
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, function, job):
            from concurrent.futures import Future

            submitted.append(job)
            future = Future()
            future.set_result(function(job))
            return future

    import concurrent.futures

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Pool)
    got = Jobs(2).map(where, [10, 20, 30, 40], cost=[1, 4, 2, 3])
    assert submitted == [20, 40, 30, 10]
    assert [item for item, _, _ in got] == [10, 20, 30, 40]
