"""Names -> constructors for models, tasks and experiments (``chronomem list`` prints them).

Modules register themselves with the decorators below; ``_load()`` imports every module that does,
so a name is known as soon as anything asks the registry. Asking for a model or a task imports the
models and tasks only; the experiments are imported when an experiment (or ``names()``) is asked for.

A model builder is ``builder(dim, depth, num_heads, causal, **options) -> backbone``, called through
``build_backbone(name, dim=, depth=, num_heads=, causal=, **options)`` (keywords: one call style) where a backbone
follows the convention of ``chronomem.heads`` (``y, state = backbone(x [B, N, dim], state, mask)``).
A task builder is ``builder(**options) -> chronomem.tasks.Task``. An experiment is a
``chronomem.experiments.Experiment``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

MODELS: dict[str, Callable[..., Any]] = {}
TASKS: dict[str, Callable[..., Any]] = {}
EXPERIMENTS: dict[str, Any] = {}

# Every module that registers a model or a task. Experiments are loaded apart, only when one is asked
# for: they import the trainer and (agents) their environments, which a model or a task never needs.
_MODULES = (
    "chronomem.baselines",
    "chronomem.relevance",
    "chronomem.htm",
    "chronomem.tlb",
    "chronomem.blrp",
    "chronomem.tasks",
)
_EXPERIMENTS = "chronomem.experiments"
_loaded: set[str] = set()


def _load(experiments: bool = False) -> None:
    """Import the modules that register models and tasks (and, with ``experiments``, the experiments)."""
    for name in (*_MODULES, *((_EXPERIMENTS,) if experiments else ())):
        if name in _loaded:
            continue
        importlib.import_module(name)  # a missing or renamed module raises: it must not drop out silently
        _loaded.add(name)


def _register(table: dict[str, Any], kind: str, name: str):
    def decorator(obj):
        if name in table and table[name] is not obj:
            raise ValueError(f"{kind} {name!r} is registered twice")
        table[name] = obj
        return obj

    return decorator


def register_model(name: str):
    return _register(MODELS, "model", name)


def register_task(name: str):
    return _register(TASKS, "task", name)


def register_experiment(experiment):
    """Register an ``Experiment`` instance under its ``name``; returns it."""
    return _register(EXPERIMENTS, "experiment", experiment.name)(experiment)


def _lookup(table: dict[str, Any], kind: str, name: str):
    _load(experiments=table is EXPERIMENTS)
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; valid names: {', '.join(sorted(table))}")
    return table[name]


def get_model(name: str):
    return _lookup(MODELS, "model", name)


def build_backbone(name: str, *, dim: int, depth: int, num_heads: int, causal: bool, **options):
    """The registered model ``name``, built: the one way every caller calls a model builder (keywords)."""
    return get_model(name)(dim=dim, depth=depth, num_heads=num_heads, causal=causal, **options)


def get_task(name: str):
    return _lookup(TASKS, "task", name)


def get_experiment(name: str):
    return _lookup(EXPERIMENTS, "experiment", name)


def names() -> dict[str, list[str]]:
    _load(experiments=True)
    return {"models": sorted(MODELS), "tasks": sorted(TASKS), "experiments": sorted(EXPERIMENTS)}
