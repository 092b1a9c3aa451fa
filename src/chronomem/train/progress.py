"""Progress of a training run: a tqdm bar on a terminal, a plain line every ``LINE_INTERVAL`` seconds
otherwise (log files, CI), and one summary line when the run ends. Written to stderr, so that a
command's own output (``chronomem run``'s table, ``chronomem train``'s JSON) stays apart.

The trainer shows progress when its ``TrainConfig.progress`` is set; inside a ``reporting(...)`` block
(``chronomem run`` opens one around an experiment) that block decides instead, so an experiment's runs
show progress without each experiment passing a flag down.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from tqdm.auto import tqdm

LINE_INTERVAL = 10.0  # seconds between two plain progress lines when stderr is not a terminal


@dataclass(frozen=True)
class Reporting:
    enabled: bool
    label: str = ""  # prefixes every line, e.g. the experiment's name


_reporting: ContextVar[Reporting | None] = ContextVar("chronomem_reporting", default=None)


@contextmanager
def reporting(enabled: bool = True, label: str = "") -> Iterator[None]:
    """Within this block every training run shows its progress (``enabled``) or stays silent,
    whatever its ``TrainConfig.progress``; ``label`` prefixes its lines."""
    token = _reporting.set(Reporting(enabled, label))
    try:
        yield
    finally:
        _reporting.reset(token)


def wanted(config_progress: bool) -> tuple[bool, str]:
    """``(show progress?, label prefix)`` for a run whose config says ``config_progress``."""
    block = _reporting.get()
    return (config_progress, "") if block is None else (block.enabled, block.label)


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


class Progress:
    """Reports steps ``initial + 1 .. total`` of one run; every method is a no-op when not ``enabled``.
    ``unit`` names what is counted (training steps; demos for a demo generator)."""

    def __init__(self, total: int, initial: int, label: str, enabled: bool, time_budget: float | None = None,
                 seconds_before: float = 0.0, unit: str = "step"):
        self.total, self.initial, self.label, self.enabled, self.unit = total, initial, label, enabled, unit
        self.time_budget, self.seconds_before = time_budget, seconds_before
        self.stream = sys.stderr
        self.step, self.loss, self.accuracy = initial, None, None
        self.start = self.last_line = time.monotonic()
        self.bar = None
        if enabled and self.stream.isatty():
            self.bar = tqdm(total=total, initial=initial, desc=label, leave=False, file=self.stream,
                            dynamic_ncols=True, unit=unit)

    def update(self, step: int, loss: float | None = None, accuracy: float | None = None) -> None:
        """Step ``step`` is done; ``loss`` / ``accuracy`` (%) are the latest logged training values."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(step - self.step)
        self.step = step
        if loss is not None:
            self.loss, self.accuracy = loss, accuracy
            if self.bar is not None:
                self.bar.set_postfix(loss=loss, acc=accuracy)
        now = time.monotonic()
        if self.bar is None and now - self.last_line >= LINE_INTERVAL:
            self.last_line = now
            metrics = "" if self.loss is None else f", loss {self.loss:.4g}, accuracy {self.accuracy:.1f}%"
            self._print(f"{self.unit} {step}/{self.total} ({100 * step / self.total:.0f}%){metrics}, "
                        f"{_duration(self.seconds_before + now - self.start)}, ETA {_duration(self.eta(now))}")

    def eta(self, now: float) -> float:
        """Seconds left: the remaining steps at this run's pace, or the time budget's rest if sooner."""
        elapsed, done = now - self.start, self.step - self.initial
        left = (self.total - self.step) * elapsed / done if done else float("inf")
        if self.time_budget is not None:
            left = min(left, max(0.0, self.time_budget - self.seconds_before - elapsed))
        return left if left != float("inf") else 0.0

    def close(self, steps: int, seconds: float, test: dict[str, float], stopped_early: bool) -> None:
        """End the run with one summary line: steps, training time and the final test metrics."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        early = " (time budget reached)" if stopped_early else ""
        metrics = ", ".join(f"test {k} {v:.4g}" if k == "loss" else f"test {k} {v:.1f}%" for k, v in test.items())
        self._print(f"done, {steps} {self.unit}s in {_duration(seconds)}{early}" + (f": {metrics}" if metrics else ""))

    def finish(self, count: int) -> None:
        """End a step that is not a training run (data generation): close the bar and, if the step
        lasted ``LINE_INTERVAL`` or more, print one line with its count and time. A shorter step leaves
        no trace, so small data sets (tests) stay silent."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        seconds = time.monotonic() - self.start
        if seconds >= LINE_INTERVAL:
            self._print(f"done, {count} {self.unit}s in {_duration(seconds)}")

    def _print(self, text: str) -> None:
        print(f"{self.label}: {text}" if self.label else text, file=self.stream, flush=True)
