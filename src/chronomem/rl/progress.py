"""Progress of an agent's training, in frames: a tqdm bar with frames per second and the mean return
on a terminal, a plain line every ``LINE_INTERVAL`` seconds otherwise, and one summary line at the
end. Written to stderr (the command's own output stays apart); silent when not ``enabled``."""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm

from chronomem.train.progress import LINE_INTERVAL, _duration


class FrameProgress:
    def __init__(self, total: int, initial: int, label: str, enabled: bool):
        self.total, self.initial, self.label, self.enabled = total, initial, label, enabled
        self.frames, self.sps, self.mean_return = initial, None, None
        self.start = self.last_line = time.monotonic()
        self.stream = sys.stderr
        self.bar = None
        if enabled and self.stream.isatty():
            self.bar = tqdm(total=total, initial=initial, desc=label, unit="frame", unit_scale=True, leave=False,
                            file=self.stream, dynamic_ncols=True)

    def update(self, frames: int, sps: float | None = None, mean_return: float | None = None) -> None:
        """``frames`` done; ``sps`` and ``mean_return`` are the latest logged values (None: unchanged)."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(frames - self.frames)
        self.frames = frames
        self.sps = self.sps if sps is None else sps
        self.mean_return = self.mean_return if mean_return is None else mean_return
        if self.bar is not None:
            if sps is not None:
                self.bar.set_postfix(sps=self.sps, ret=self.mean_return)
            return
        now = time.monotonic()
        if now - self.last_line >= LINE_INTERVAL:
            self.last_line = now
            done = self.frames - self.initial
            eta = (self.total - frames) * (now - self.start) / done if done else 0.0
            ret = "" if self.mean_return is None else f", mean return {self.mean_return:.3f}"
            sps = "" if self.sps is None else f", {self.sps:.0f} frames/s"
            self._print(f"{frames}/{self.total} frames ({100 * frames / self.total:.0f}%){ret}{sps}, "
                        f"ETA {_duration(eta)}")

    def close(self, frames: int, seconds: float, mean_return: float | None) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        ret = "" if mean_return is None else f": mean return {mean_return:.3f} (last logged episodes)"
        self._print(f"done, {frames} frames in {_duration(seconds)}{ret}")

    def _print(self, text: str) -> None:
        print(f"{self.label}: {text}", file=self.stream, flush=True)


class EpisodeProgress:
    """Progress of playing ``total`` episodes (an evaluation, or the one episode of a GIF): episodes
    finished and environment steps so far, as a tqdm bar over the episodes (the steps beside it) on a
    terminal, a plain line every ``LINE_INTERVAL`` seconds otherwise, and a last line if it took that
    long. The steps are the sign of life: episodes run side by side in a vector env, so eight long
    episodes on eight environments all end near the end. Silent when not ``enabled``."""

    def __init__(self, total: int, label: str, enabled: bool):
        self.total, self.label, self.enabled = total, label, enabled
        self.episodes = self.steps = 0
        self.start = self.last_line = self.last_refresh = time.monotonic()
        self.stream = sys.stderr
        self.bar = None
        if enabled and self.stream.isatty():
            self.bar = tqdm(total=total, desc=label, unit="episode", leave=False, file=self.stream,
                            dynamic_ncols=True)

    def update(self, episodes: int, steps: int) -> None:
        """``episodes`` finished and ``steps`` taken so far (over all environments)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if self.bar is not None:
            self.bar.update(episodes - self.episodes)
            if now - self.last_refresh >= 0.5:  # one redraw per step would slow a fast environment down
                self.last_refresh = now
                self.bar.set_postfix_str(f"{steps} steps")
        self.episodes, self.steps = episodes, steps
        if self.bar is None and now - self.last_line >= LINE_INTERVAL:
            self.last_line = now
            self._print(f"episode {episodes}/{self.total}, {self._steps(now)}")

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        now = time.monotonic()
        if now - self.start >= LINE_INTERVAL:
            self._print(f"done, episode {self.episodes}/{self.total}, {self._steps(now)}")

    def _steps(self, now: float) -> str:
        elapsed = now - self.start
        return f"{self.steps} steps in {_duration(elapsed)} ({self.steps / max(elapsed, 1e-9):.0f} steps/s)"

    def _print(self, text: str) -> None:
        print(f"{self.label}: {text}", file=self.stream, flush=True)
