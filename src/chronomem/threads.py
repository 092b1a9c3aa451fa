"""How many threads torch computes with, chosen so that a run does not collapse when the machine is shared.

Torch's default is one thread per core, and its OpenMP threads spin while they wait for work. When
another process holds one of the cores, every parallel kernel waits for the thread that is not
running, and a run slows several times over (``benchmarks/threads.py``; docs/training.md, "Threads").
One thread per process loses far less on an idle machine than all of them lose on a busy one, so the
commands default to half the cores this process may run on (one on a 2-core machine), divided among
the processes ``torchrun`` started on this node. ``--threads`` (``chronomem train``, ``run``, ``eval``,
``bench``, ``lm sample``; ``chronomem rl train --torch-threads``) sets it.

No torch import at module level: the command line reads the default before it loads torch.
"""

from __future__ import annotations

import os


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
