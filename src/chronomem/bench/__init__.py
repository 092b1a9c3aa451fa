"""Efficiency benchmark: time and memory of every backbone against sequence length, and against peers.

``chronomem bench [--models ...] [--lengths ...] [--mode train|infer|both] [--out DIR] [--quick]``

* ``worker``: one capped measurement in a fresh process (peak memory above a baseline; OOM, timeout
  and errors as results). Also used by the relevance experiments for their memory claims.
* ``sweep``: every (model, N) point, each in its own process; larger N skipped after a failure.
* ``report``: log-log slopes of time and memory against N, the scaling targets, ``report.md`` and
  the plots ``time.png`` / ``memory.png``.
* ``peers``: our ``HTMAttention`` against other implementations of the same read.
* ``command``: the command line; ``flops``: FLOP counts of one pass.

A run writes ``OUT/results.json``, ``OUT/report.md``, ``OUT/time.png`` and ``OUT/memory.png`` (or
``OUT/peers.json`` with ``--peer only``) into a new directory, or one that holds no earlier run. Both
JSON files hold the conditions of the run (threads, OpenMP settings, load average before and after,
``busy`` when it exceeded the cores: ``chronomem.threads.Measured``).
docs/benchmarks.md describes the measurements.
"""

from chronomem.bench.command import OUTPUTS, check_out, main, make_parser
from chronomem.bench.flops import count_flops
from chronomem.bench.peers import PEERS, PeerShape, compare_peers, peer_report
from chronomem.bench.report import FIT_RANGE, fit_slope, machine_info, slopes, targets, write_plots, write_report
from chronomem.bench.sweep import (
    DEFAULT_LENGTHS,
    DEFAULT_MODELS,
    QUICK_LENGTHS,
    SPECS,
    ModelSpec,
    resolve_models,
    run_point,
    sweep,
)
from chronomem.bench.worker import ERROR, OK, OOM, TIMEOUT, UNAVAILABLE, Meter, measure, peak_rss_mb

__all__ = [
    "DEFAULT_LENGTHS", "DEFAULT_MODELS", "ERROR", "FIT_RANGE", "OK", "OOM", "OUTPUTS", "PEERS", "QUICK_LENGTHS",
    "SPECS", "TIMEOUT", "UNAVAILABLE", "Meter", "ModelSpec", "PeerShape", "check_out", "compare_peers",
    "count_flops", "fit_slope", "machine_info", "main", "make_parser", "measure", "peak_rss_mb", "peer_report",
    "resolve_models", "run_point", "slopes", "sweep", "targets", "write_plots", "write_report",
]
