"""How many threads torch computes with, chosen so that a run does not collapse when the machine is shared.

Torch's default is one thread per core, and its OpenMP threads spin while they wait for work. When
another process holds one of the cores, every parallel kernel waits for the thread that is not
running, and a run slows several times over (``benchmarks/threads.py``; docs/training.md, "Threads").
One thread per process loses far less on an idle machine than all of them lose on a busy one, so the
commands default to half the cores this process may run on (one on a 2-core machine), divided among
the processes ``torchrun`` started on this node. ``--threads`` (``chronomem train``, ``run``, ``eval``,
``bench``, ``lm sample``; ``chronomem rl train --torch-threads``) sets it.

``conditions()`` and ``Measured`` record what else a timing depends on (the threads, OpenMP's
settings, the load average before and after) and flag a measurement taken while the load exceeded
the cores; every script in benchmarks/ and ``chronomem bench`` store them with their numbers.

No torch import at module level: the command line reads the default before it loads torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def default_threads() -> int:
    """Half the available cores, at least one, shared among torchrun's processes on this node."""
    per_node = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(1, available_cores() // 2 // per_node)


def check_threads(threads: int | None, flag: str = "--threads") -> int:
    """``threads``, or the default when None; a ValueError naming ``flag`` unless a positive integer."""
    if threads is None:
        return default_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"{flag} must be a positive integer, got {threads!r}")
    return threads


def use_threads(threads: int | None, flag: str = "--threads") -> int:
    """Set torch's intra-op threads to ``threads`` (None: ``default_threads()``); returns the number set."""
    import torch

    threads = check_threads(threads, flag)
    torch.set_num_threads(threads)
    return threads


@contextmanager
def threads_set_to(threads: int | None, flag: str = "--threads") -> Iterator[int]:
    """Within the block torch computes with ``threads`` (None: ``default_threads()``); the count it had
    before comes back after, whatever happens inside."""
    import torch

    before = torch.get_num_threads()
    try:
        yield use_threads(threads, flag)
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------------
# The conditions of a measurement
# ---------------------------------------------------------------------------------------------------
# A timing taken while other processes hold the cores measures the contention as much as the code
# (the table in docs/training.md, "Threads": 2.7-4.5x for two threads). So every benchmark and
# ``chronomem bench`` record the thread settings and the load average before and after, and say so
# when the load exceeded the cores: such numbers can be compared within the run, not with another's.


def conditions(threads: int | list[int] | None = None) -> dict:
    """What a timing depends on besides the code, at this moment.

    ``torch_threads``: ``threads`` when the measurement runs elsewhere (workers that set their own;
    a list when it tries several), else this process's ``torch.get_num_threads()``. ``cores``:
    ``available_cores()``. ``omp_num_threads`` / ``omp_wait_policy``: the environment's values, None
    when unset (OpenMP reads them once, at start-up, so they hold for the whole run).
    ``load_average``: the 1-minute load average, None where the OS does not report one.
    """
    if threads is None:
        import torch  # here, not at module level: the command line reads the defaults without torch

        threads = torch.get_num_threads()
    try:
        load = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # Windows; a system that cannot say
        load = None
    return {
        "torch_threads": list(threads) if isinstance(threads, (list, tuple)) else threads,
        "cores": available_cores(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "load_average": load,
    }


def is_busy(record: dict) -> bool:
    """Whether the 1-minute load exceeded the cores at either end of ``record`` (``Measured.record()``).

    The load counts the measuring process too, so a load just under the cores on a machine of one's
    own is normal at the end; above them, some process waited for a core. An unknown load is not busy.
    """
    ends = [record.get("before"), record.get("after")]
    return any(c and c["load_average"] is not None and c["load_average"] > c["cores"] for c in ends)


def _threads_text(threads: int | list[int]) -> str:
    if isinstance(threads, list) and len(threads) == 1:
        threads = threads[0]
    if isinstance(threads, list):
        return f"torch threads {', '.join(map(str, threads))} (one setting each)"
    return f"{threads} torch thread{'s' if threads != 1 else ''}"


def summarize(record: dict) -> str:
    """One line for a person: threads, OpenMP settings, load before -> after on the cores, and, when
    ``is_busy(record)``, the warning that the timings include contention.

    ``record``: ``Measured.record()``, or one ``conditions()`` (a measurement not yet finished).
    """
    if "before" not in record:
        record = {"before": record, "after": None}
    before, after = record["before"], record["after"]
    loads = [c["load_average"] for c in (before, after) if c]
    env = ", ".join(
        f"{name} unset" if value is None else f"{name}={value}"
        for name, value in (("OMP_NUM_THREADS", before["omp_num_threads"]),
                            ("OMP_WAIT_POLICY", before["omp_wait_policy"]))
    )
    load = " -> ".join("unknown" if v is None else f"{v:g}" for v in loads)
    line = f"{_threads_text(before['torch_threads'])}, {env}, load {load} on {before['cores']} cores"
    if is_busy(record):
        peak = max(v for v in loads if v is not None)
        line += (f"; MEASURED ON A BUSY MACHINE (load {peak:g} > {before['cores']} cores): "
                 "the timings include contention")
    return line


class Measured:
    """The conditions before and after a measurement, and whether the machine was busy at either end.

        with Measured(log=print) as measured:    # prints "conditions before: ..."
            ...                                  # the measurement and its table
        # prints "conditions: ..." (with the busy warning when the load exceeded the cores)
        result["conditions"] = measured.record()

    ``threads``: as in ``conditions()``. ``log``: where the two lines go (None: nowhere). ``start()``
    and ``stop()`` do the same without a ``with`` block.
    """

    def __init__(self, threads: int | list[int] | None = None, log=None):
        self.threads, self.log = threads, log
        self.before: dict | None = None
        self.after: dict | None = None

    def start(self) -> Measured:
        self.before, self.after = conditions(self.threads), None
        if self.log:
            self.log(f"conditions before: {summarize(self.before)}")
        return self

    def stop(self) -> Measured:
        if self.before is None:
            raise ValueError("Measured.stop() before start(): there is no measurement to close")
        self.after = conditions(self.threads)
        if self.log:
            self.log(f"conditions: {self.summary()}")
        return self

    def __enter__(self) -> Measured:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def busy(self) -> bool:
        return is_busy(self.record())

    def record(self) -> dict:
        """``{"before", "after", "busy"}`` for a JSON result (``after`` None until ``stop()``)."""
        if self.before is None:
            raise ValueError("Measured.record() before start(): nothing was measured")
        record = {"before": self.before, "after": self.after}
        return {**record, "busy": is_busy(record)}

    def summary(self) -> str:
        return summarize(self.record())
