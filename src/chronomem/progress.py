"""Progress of anything long: a training run (steps), an agent's training (frames), an evaluation
(examples, episodes), a data generator (expressions, demos).

One ``Progress`` for all of them: a tqdm bar on a terminal, a plain line every ``LINE_INTERVAL``
seconds otherwise (log files, CI), and one summary line at the end. Written to stderr, so that a
command's own output (``chronomem run``'s table, ``chronomem train``'s JSON) stays apart. Whether it
shows is the caller's ``enabled``, passed down explicitly by whoever started the work (``--quiet``,
``run_experiment(progress=False)``); nothing global decides it.
"""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm

LINE_INTERVAL = 10.0  # seconds between two plain progress lines when stderr is not a terminal
BAR_REFRESH = 0.5  # seconds between two redraws of the bar's metrics (a redraw per step slows fast loops)


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 07 s``, ``2 h 05 min``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


class Progress:
    """Reports ``done`` of ``total`` units (``unit``: "step", "frame", "episode", ...) counted from
    ``initial`` (a resumed run); every method is a no-op when not ``enabled``.

    ``update(done, metrics)``: ``metrics`` are the latest values to show, already formatted, in order
    (``{"loss": "0.693", "accuracy": "51.2%"}``); a metric not given again keeps its last value. A line
    reads ``label: step 300/1000 (30%), loss 0.693, accuracy 51.2%, 1 min 02 s, ETA 2 min 25 s``.
    ``time_budget`` (seconds, counting ``seconds_before`` of earlier sessions) caps the ETA.
    ``close(summary)`` ends with ``label: done, <summary>`` (default: ``<done> <unit>s in <time>`` and the
    last metrics);
    with ``only_if_long`` the line is printed only when the work took ``LINE_INTERVAL`` or more, so that
    short work (tests, small data sets) leaves no trace.
    """

    def __init__(self, total: int, label: str = "", enabled: bool = True, *, unit: str = "step", initial: int = 0,
                 time_budget: float | None = None, seconds_before: float = 0.0, unit_scale: bool = False):
        self.total, self.label, self.enabled, self.unit = total, label, enabled, unit
        self.initial, self.time_budget, self.seconds_before = initial, time_budget, seconds_before
        self.done, self.metrics = initial, {}
        self.stream = sys.stderr
        self.start = self.last_line = self.last_refresh = time.monotonic()
        self.bar = None
        if enabled and self.stream.isatty():
            self.bar = tqdm(total=total, initial=initial, desc=label or None, unit=unit, unit_scale=unit_scale,
                            leave=False, file=self.stream, dynamic_ncols=True)

    def update(self, done: int, metrics: dict[str, str] | None = None) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if metrics:
            self.metrics.update(metrics)
        if self.bar is not None:
            self.bar.update(done - self.done)
            self.done = done
            if metrics and (now - self.last_refresh >= BAR_REFRESH or done >= self.total):  # the last one shows
                self.last_refresh = now
                self.bar.set_postfix_str(", ".join(f"{k} {v}" for k, v in self.metrics.items()))
            return
        self.done = done
        if now - self.last_line >= LINE_INTERVAL:
            self.last_line = now
            shown = "".join(f", {k} {v}" for k, v in self.metrics.items())
            self._print(f"{self.unit} {done}/{self.total} ({100 * done / max(self.total, 1):.0f}%){shown}, "
                        f"{duration(self.seconds_before + now - self.start)}, ETA {duration(self.eta(now))}")

    def eta(self, now: float) -> float:
        """Seconds left: the remaining units at this run's pace, or the time budget's rest if sooner."""
        elapsed, counted = now - self.start, self.done - self.initial
        left = (self.total - self.done) * elapsed / counted if counted else float("inf")
        if self.time_budget is not None:
            left = min(left, max(0.0, self.time_budget - self.seconds_before - elapsed))
        return left if left != float("inf") else 0.0

    def close(self, summary: str | None = None, only_if_long: bool = False) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        seconds = time.monotonic() - self.start
        if only_if_long and seconds < LINE_INTERVAL:
            return
        shown = "".join(f", {k} {v}" for k, v in self.metrics.items())
        self._print(f"done, {summary or f'{self.done} {self.unit}s in {duration(seconds)}{shown}'}")

    def note(self, text: str) -> None:
        """Print ``text`` at once on its own line (above the bar, if any): a message that must not wait
        for the next progress line."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(f"{self.label}: {text}" if self.label else text, file=self.stream)
        else:
            self._print(text)

    def _print(self, text: str) -> None:
        print(f"{self.label}: {text}" if self.label else text, file=self.stream, flush=True)
