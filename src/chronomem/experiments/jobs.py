"""An experiment's independent runs, one after the other or several at once (``chronomem run --jobs K``).

An experiment lists its runs (each model and seed; for the RL experiments each environment, model and
seed) as picklable job descriptions and hands them, with a module-level job function, to
``Jobs.map``, which returns the function's results in the order of the jobs:

* ``Jobs(1)`` (the default) calls the function on each job in this process, with its torch threads;
* ``Jobs(K)``, K > 1, runs the jobs in K fresh processes (``spawn``: nothing is inherited but the
  job), each with ``threads`` torch threads (default 1: two processes with torch's default of one
  thread per core slow each other 10-50x on 2 cores; docs/training.md, "Threads").

Every run seeds itself (``train_and_evaluate``, PPO's ``train`` and the experiments' own job
functions set ``torch.manual_seed`` from the run's seed before they build a model), so a run's numbers
do not depend on the process it ran in or on the runs before it there: ``--jobs K`` writes the
results.json a sequential run writes, at the same torch threads (``tests/test_jobs.py``). Its
progress lines go to stderr as in this process, labelled with the model and seed; a worker prints
lines, never a tqdm bar (bars of processes side by side would overwrite each other).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

JOBS_FLAG = "--jobs"


def check_jobs(processes: Any) -> int:
    """``processes`` if a positive integer, else a ValueError naming ``--jobs``."""
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"{JOBS_FLAG} must be a positive integer (runs at once, one process each), "
                         f"got {processes!r}")
    return processes


@dataclass(frozen=True)
class Jobs:
    """How an experiment runs its independent runs: ``processes`` at once, each worker process with
    ``threads`` torch threads (``processes == 1``: in this process, with its own threads)."""

    processes: int = 1
    threads: int = 1

    def __post_init__(self):
        from chronomem.threads import check_threads

        check_jobs(self.processes)
        check_threads(self.threads)

    @classmethod
    def of(cls, jobs: int | Jobs) -> Jobs:
        """``jobs`` as a ``Jobs``: an int is the number of processes, one torch thread each."""
        return jobs if isinstance(jobs, Jobs) else cls(check_jobs(jobs))

    def map(self, function: Callable[[Any], Any], jobs: Sequence[Any], cost: Sequence[float] | None = None) -> list:
        """``[function(job) for job in jobs]``, in ``self.processes`` processes.

        ``function`` must be defined at a module's top level and every job picklable (a process is
        started with ``spawn``). A job that raises stops the ones not yet started and the error
        reaches the caller (the running ones finish first). ``cost`` (one number per job, e.g. its
        frames): in processes, the costliest jobs start first (``start_order``), so that the last
        one to end is a short one and the processes finish close together; one at a time, and in
        the results, the jobs keep their order."""
        jobs = list(jobs)
        if self.processes == 1:
            return [function(job) for job in jobs]
        if len(jobs) <= 1:  # one run: here, with the threads a worker would have
            return _with_threads(self.threads, function, jobs)
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(self.processes, len(jobs)), mp_context=multiprocessing.get_context("spawn"),
                                 initializer=start_worker, initargs=(self.threads,)) as pool:
            futures = {i: pool.submit(function, jobs[i]) for i in start_order(len(jobs), cost)}
            try:
                return [futures[i].result() for i in range(len(jobs))]
            except BaseException:
                for future in futures.values():
                    future.cancel()
                raise


SEQUENTIAL = Jobs()


def start_order(count: int, cost: Sequence[float] | None) -> list[int]:
    """The order in which ``Jobs.map`` starts ``count`` jobs: the costliest first (longest processing
    time first: with K processes the makespan is then within 4/3 of the best possible), ties and no
    ``cost`` in the jobs' own order."""
    if cost is None:
        return list(range(count))
    cost = list(cost)
    if len(cost) != count:
        raise ValueError(f"cost must give one number per job ({count}), got {len(cost)}")
    return sorted(range(count), key=lambda i: -cost[i])


def _with_threads(threads: int, function: Callable[[Any], Any], jobs: list) -> list:
    from chronomem.threads import threads_set_to

    with threads_set_to(threads):
        return [function(job) for job in jobs]


class _Lines:
    """A worker's stderr: the same stream, but not a terminal, so that ``chronomem.progress`` prints
    lines (each labelled with its run) instead of a bar."""

    def __init__(self, stream):
        self._stream = stream

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name):
        return getattr(self._stream, name)


def start_worker(threads: int) -> None:
    """Set up a worker process: ``threads`` torch threads, progress as lines."""
    import torch

    torch.set_num_threads(threads)
    sys.stderr = _Lines(sys.stderr)


@dataclass(frozen=True)
class Recorded:
    """A job whose result is kept: ``run_recorded`` writes ``function(job)``'s (JSON-able) result to ``path``
    when it ends, beside the job's description; with ``reuse`` (``chronomem run --resume``) a result already
    there for the same job is read back instead of running it again. For experiments whose runs are
    short enough to redo whole: an interrupted call loses only the runs under way."""

    function: Callable[[Any], Any]
    job: Any
    path: str
    reuse: bool = False


def described(job: Any) -> dict:
    """What identifies a job: its fields, without how it shows its progress."""
    import dataclasses
    import json

    fields = {k: v for k, v in dataclasses.asdict(job).items() if k != "progress"}
    return json.loads(json.dumps(fields, default=str))


def run_recorded(recorded: Recorded) -> Any:
    """``recorded.function(recorded.job)``, or the result recorded for the same job (``Recorded``)."""
    import json
    from pathlib import Path

    from chronomem.experiments.base import write_json_atomic
    from chronomem.report import json_default

    path, job = Path(recorded.path), described(recorded.job)
    if recorded.reuse and path.exists():
        saved = json.loads(path.read_text())
        if saved.get("job") == job:
            return saved["result"]
    result = json.loads(json.dumps(recorded.function(recorded.job), default=json_default))  # as it reads back
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"job": job, "result": result})
    return result
