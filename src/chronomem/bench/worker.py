"""One capped measurement in a fresh process: peak memory (and the job's own timings) of one job.

Every memory number of chronomem comes from here: the scaling sweep (``chronomem bench``), the HTM peer
comparison and the relevance experiments' evaluations (``transfer-copy``, ``denoise``).

The parent (``measure``) starts ``python -c "from chronomem.bench.worker import child; child()"``,
sends it a JSON request on stdin and reads one result per phase back from its stdout. The child
imports the job (``"package.module:function"``) and calls ``job(spec, meter)``. The job builds what
it needs, calls ``meter.set_baseline()`` once the fixed costs are paid (interpreter, torch, model,
inputs, lazy library initialisation), then ``meter.run(phase, fn)`` for each phase; ``fn`` returns
the phase's own numbers (seconds, accuracy ...) as a dict.

Peak memory: peak resident set size ``VmHWM`` of /proc/self/status (Linux; ``ru_maxrss`` elsewhere).
Not the child's ``ru_maxrss`` on Linux: that of an exec'd child starts at its parent's RSS at fork
time, so a child of a large parent reports the parent's size. Each record holds
``baseline_rss_mb`` (peak at ``set_baseline``), ``peak_rss_mb`` (after the phase; phases run in
order, so the peak only grows) and ``delta_rss_mb = peak - baseline``.

OOM, timeouts and failures are results, not crashes. A phase is ``"OOM"`` when

* the job raises an allocation failure (``MemoryError``, torch's "can't allocate memory");
* its peak above the baseline exceeds ``memory_cap_mb`` (checked after the phase);
* the parent sees the child's resident memory pass baseline + cap and kills it;
* the hard safety net fires: after the baseline the child caps its address space (``RLIMIT_AS``)
  at its current size + 2 x cap + 512 MB, so a runaway allocation fails instead of swapping;
* the child dies from SIGKILL (the kernel's OOM killer) or with an allocation failure on stderr.

A child running past ``timeout`` seconds is killed: its unreported phases are ``"timeout"``. Any
other exception is ``"error"`` with the exception's text.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

OK, OOM, TIMEOUT, ERROR, UNAVAILABLE = "ok", "OOM", "timeout", "error", "unavailable"
MARK = "@@measure "  # prefix of the child's result lines on stdout
CHILD_CODE = "from chronomem.bench.worker import child; child()"


# =============================================================================================
# Memory of a process
# =============================================================================================


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB: ``VmHWM`` on Linux (see the module docstring)."""
    hwm = status_mb("VmHWM")
    if hwm is not None:
        return hwm
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux


def status_mb(field_name: str, pid: int | str = "self") -> float | None:
    """A memory field (``VmRSS``, ``VmHWM``, ``VmSize``) of a process from /proc (Linux), in MiB; None
    where unavailable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def is_oom(err: BaseException) -> bool:
    """An allocation failure: Python's MemoryError or torch's allocator message (CPU or CUDA)."""
    return isinstance(err, MemoryError) or _allocation_failure(str(err))


def _allocation_failure(text: str) -> bool:
    text = text.lower()
    return any(s in text for s in ("memoryerror", "out of memory", "can't allocate", "cannot allocate", "bad_alloc"))


def _describe(err: BaseException, limit: int) -> str:
    return f"{type(err).__name__}: {str(err)[:limit]}"


def time_calls(fn: Callable[[], Any], warmup: int, repeats: int, deadline: float = math.inf):
    """Median seconds of ``fn()`` over timed repeats after ``warmup`` untimed ones.

    Only the repeats that fit in 70% of the time left before ``deadline`` (``time.perf_counter``
    scale) run; when none fit, the warm-up times stand in. Returns ``(seconds, timed)``.
    """
    times = []
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    left = deadline - time.perf_counter()
    if times and math.isfinite(left):
        repeats = max(0, min(repeats, int(0.7 * left / max(times[-1], 1e-9))))
    timed = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        timed.append(time.perf_counter() - t0)
    return statistics.median(timed or times), timed


# =============================================================================================
# The child's side
# =============================================================================================


def _emit(**record) -> None:
    print(MARK + json.dumps(record), flush=True)


class Meter:
    """What a job reports through: its baseline, then one measured result per phase."""

    def __init__(self, phases: Sequence[str], timeout: float | None = None, memory_cap_mb: float | None = None):
        self.phases = list(phases)
        self.memory_cap_mb = memory_cap_mb
        self.deadline = time.perf_counter() + timeout if timeout else math.inf
        self.baseline_mb: float | None = None

    def fail(self, err: BaseException, status: str | None = None) -> None:
        """The job could not get to its phases (a bad option, an allocation failure while building):
        every phase gets this result (``status`` default: OOM for an allocation failure, else error)."""
        status = status or (OOM if is_oom(err) else ERROR)
        for phase in self.phases:
            _emit(phase=phase, status=status, error=_describe(err, 400))

    def set_baseline(self, **info) -> None:
        """Record the baseline peak; ``info`` (e.g. the parameter count) goes into every record. Then
        cap the address space (the hard safety net; the cap itself is checked on the measured peak)."""
        self.baseline_mb = peak_rss_mb()
        vm = status_mb("VmSize")
        if self.memory_cap_mb and vm is not None:
            limit = int((vm + 2 * self.memory_cap_mb + 512) * 2**20)  # room for allocator arenas
            try:
                resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
            except (ValueError, OSError):
                pass
        _emit(event="setup", baseline_rss_mb=round(self.baseline_mb, 1), **info)

    def run(self, phase: str, fn: Callable[[], dict | None]) -> dict:
        """Run one phase; report its numbers (``fn()``'s dict) with the peak memory above the baseline."""
        if self.baseline_mb is None:
            raise RuntimeError("Meter.set_baseline() must come before Meter.run()")
        baseline = round(self.baseline_mb, 1)
        try:
            fields = fn() or {}
        except Exception as err:
            record = dict(phase=phase, status=OOM if is_oom(err) else ERROR, error=_describe(err, 300),
                          baseline_rss_mb=baseline, peak_rss_mb=round(peak_rss_mb(), 1))
            _emit(**record)
            return record
        peak = peak_rss_mb()
        delta = max(peak - self.baseline_mb, 0.0)
        cap = self.memory_cap_mb
        over = bool(cap and delta > cap)
        record = dict(phase=phase, status=OOM if over else OK, **fields, baseline_rss_mb=baseline,
                      peak_rss_mb=round(peak, 1), delta_rss_mb=round(delta, 1))
        if over:
            record["error"] = f"peak {delta:.0f} MB above the cap {cap} MB"
        _emit(**record)
        return record


def child() -> None:
    """Entry point of the measuring process: reads the request on stdin, runs the job."""
    request = json.loads(sys.stdin.read())
    if request.get("threads"):
        import torch

        torch.set_num_threads(request["threads"])
    module, function = request["job"].split(":")
    job = getattr(importlib.import_module(module), function)
    job(request["spec"], Meter(request["phases"], request.get("timeout"), request.get("memory_cap_mb")))


# =============================================================================================
# The parent's side
# =============================================================================================


def measure(
    job: str,
    spec: dict,
    phases: Sequence[str],
    *,
    timeout: float | None = None,
    memory_cap_mb: float | None = None,
    threads: int | None = None,
) -> dict[str, dict]:
    """Run ``job(spec, meter)`` (``"module:function"``) in a fresh process; returns ``{phase: record}``
    for every phase, each with a ``status`` (see the module docstring) and the job's setup info.

    The parent watches the child's resident memory and kills it past baseline + ``memory_cap_mb``
    (``"OOM"``); past ``timeout`` seconds it kills it (``"timeout"`` for the phases not reported).
    """
    env = dict(os.environ, MALLOC_ARENA_MAX="2")
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    request = {"job": job, "spec": spec, "phases": list(phases), "timeout": timeout,
               "memory_cap_mb": memory_cap_mb, "threads": threads}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD_CODE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    records: list[dict] = []
    stderr: list[str] = []

    def read_stdout():
        for line in proc.stdout:
            if line.startswith(MARK):
                records.append(json.loads(line[len(MARK) :]))

    readers = [
        threading.Thread(target=read_stdout, daemon=True),
        threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True),
    ]
    for r in readers:
        r.start()
    try:
        proc.stdin.write(json.dumps(request))
        proc.stdin.close()
    except BrokenPipeError:  # the child died before reading: reported below from its exit code
        pass
    start = time.perf_counter()
    killed = None
    while proc.poll() is None:
        if timeout is not None and time.perf_counter() - start > timeout:
            killed = TIMEOUT
        elif memory_cap_mb:
            setup = next((r for r in records if r.get("event") == "setup"), None)
            rss = status_mb("VmRSS", proc.pid)
            if setup and rss is not None and rss - setup["baseline_rss_mb"] > memory_cap_mb:
                killed = OOM
        if killed:
            proc.kill()
            break
        time.sleep(0.05)
    proc.wait()
    for r in readers:
        r.join(timeout=5)
    results = {r.pop("phase"): r for r in records if "phase" in r}
    tail = "".join(stderr)[-500:]
    for phase in phases:
        if phase in results:
            continue
        if killed == TIMEOUT:
            results[phase] = {"status": TIMEOUT, "error": f"killed after {timeout} s"}
        elif killed == OOM:
            results[phase] = {"status": OOM, "error": f"resident memory above the cap {memory_cap_mb} MB"}
        else:  # died without a result: a signal or an abort; allocation failures count as OOM
            memory = proc.returncode == -9 or _allocation_failure(tail)
            results[phase] = {
                "status": OOM if memory else ERROR,
                "error": f"worker exited with code {proc.returncode}: {tail.strip()[-300:]}",
            }
    setup = next((r for r in records if r.get("event") == "setup"), {})
    for r in results.values():
        for key, value in setup.items():
            if key != "event":
                r.setdefault(key, value)
    return results
