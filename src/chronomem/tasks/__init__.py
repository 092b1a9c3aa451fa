"""Tasks: data -> batches (supervised), no model code. Every module in this package registers its tasks;
the worlds some of them draw on (Gymnasium environments) live in ``chronomem.envs``."""

import importlib
import pkgutil

from chronomem.tasks.base import Batch, Task

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["Batch", "Task"]
