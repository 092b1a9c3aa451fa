"""Names -> constructors for models, tasks and experiments (``chronomem list`` prints them).

Modules register themselves with the decorators below; ``_load()`` finds and imports every module that
does, so a name is known as soon as anything asks the registry, and a new model, task or experiment is
one module file with its decorator. Asking for a model or a task imports the models and tasks only; the
experiments are imported when an experiment (or ``names()``) is asked for.

A model builder is ``builder(dim, depth, num_heads, causal, **options) -> backbone``, called through
``build_backbone(name, dim=, depth=, num_heads=, causal=, **options)`` (keywords: one call style) where a backbone
follows the convention of ``chronomem.heads`` (``y, state = backbone(x [B, N, dim], state, mask)``).
A task builder is ``builder(**options) -> chronomem.tasks.Task``. An experiment is a
``chronomem.experiments.Experiment``.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODELS: dict[str, Callable[..., Any]] = {}
TASKS: dict[str, Callable[..., Any]] = {}
EXPERIMENTS: dict[str, Any] = {}

# Where registrations live: every top-level module of chronomem whose source registers a model (a new
# core is one module file with its ``@register_model``, or a top-level ``register_model(name)(builder)``),
# the tasks package, whose ``__init__`` imports each of its modules, and apart from them the experiments
# package, loaded only when an experiment is asked for: it imports the trainer and (agents) their
# environments, which a model or a task never needs.
_TASKS = "chronomem.tasks"
_EXPERIMENTS = "chronomem.experiments"
_REGISTERS_MODEL = re.compile(r"^@?register_model\(", re.MULTILINE)  # a decorator or a call at top level
_loaded: set[str] = set()


@functools.cache
def model_modules() -> tuple[str, ...]:
    """The top-level modules of chronomem that register a model, found by reading their source (not by
    importing them: most modules register nothing and some are slow to import), once per process."""
    import pkgutil

    import chronomem

    found = []
    for module in pkgutil.iter_modules(chronomem.__path__):
        if module.ispkg or module.name == "registry":
            continue
        path = Path(module.module_finder.path) / f"{module.name}.py"
        if path.exists() and _REGISTERS_MODEL.search(path.read_text()):
            found.append(f"chronomem.{module.name}")
    return tuple(sorted(found))


def _load(experiments: bool = False) -> None:
    """Import the modules that register models and tasks (and, with ``experiments``, the experiments)."""
    for name in (*model_modules(), _TASKS, *((_EXPERIMENTS,) if experiments else ())):
        if name in _loaded:
            continue
        importlib.import_module(name)
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
