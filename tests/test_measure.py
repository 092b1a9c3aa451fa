"""The relevance experiments measure memory with the benchmark's worker: the child's own peak, and OOM
as "peak above the baseline past the cap", the same rule as ``chronomem bench``."""

from __future__ import annotations

import pytest

from chronomem.bench.worker import OK, OOM, status_mb
from chronomem.experiments.relevance import run_capped


def _probe(model: str, seq_len: int, cap_mb: float) -> dict:
    """One Denoise training step of a tiny model (hidden 16, batch 4) in a fresh measured process."""
    options = {"dim": 16, "buffer_size": 3, "relevant_size": 3} if model.startswith("relevance") else {"dim": 16}
    return run_capped({"mode": "train", "task": "denoise", "task_options": {"seq_len": seq_len}, "model": model,
                       "model_options": options, "run": None, "cap_mb": cap_mb, "batch_size": 4})


def test_relevance_oom_is_the_bench_rule():
    """At T=600 a RelevanceRNN training step needs ~30 MB above its baseline and a MemRNN step, whose
    saved memories grow as T^2, ~200 MB: a 100 MB cap separates them."""
    relevance, full = _probe("relevance-rnn", 600, cap_mb=100), _probe("mem-rnn", 600, cap_mb=100)
    assert relevance["status"] == OK, relevance
    assert 0 < relevance["delta_rss_mb"] <= 100
    assert relevance["peak_rss_mb"] == pytest.approx(relevance["baseline_rss_mb"] + relevance["delta_rss_mb"], abs=0.2)
    assert full["status"] == OOM, full
    assert "above the cap 100" in full["error"]


def test_relevance_peak_is_the_child_own():
    """The child's ``ru_maxrss`` on Linux starts at the parent's RSS; the worker's VmHWM does not."""
    import torch

    hog = torch.ones(2**27)  # 512 MiB, touched, held by this (the parent) process
    parent_mb = status_mb("VmRSS")
    if parent_mb is None:
        pytest.skip("needs /proc (Linux)")
    answer = run_capped({"mode": "eval", "task": "copy", "task_options": {"seq_len": 5}, "model": "relevance-rnn",
                         "model_options": {"dim": 16, "buffer_size": 3, "relevant_size": 3}, "run": None,
                         "cap_mb": 4096, "batch_size": 4, "num_examples": 8})
    assert hog.sum() > 0
    assert answer["status"] == OK and 0.0 <= answer["accuracy"] <= 100.0
    assert answer["peak_rss_mb"] < parent_mb - 256, (answer, parent_mb)


def test_relevance_failure_raises():
    """A failure other than memory is a bug, not a result."""
    with pytest.raises(RuntimeError, match="no_such_option"):
        run_capped({"mode": "train", "task": "denoise", "task_options": {"seq_len": 5}, "model": "mem-rnn",
                    "model_options": {"dim": 16, "no_such_option": 1}, "run": None, "cap_mb": 100,
                    "batch_size": 4})


def test_a_capped_evaluation_reads_the_trained_run(tmp_path):
    """``"run": DIR`` evaluates the weights of DIR's checkpoint: two runs trained from other seeds give
    their own test losses, each the one the trained model gives in this process."""
    from chronomem.heads import build_model
    from chronomem.tasks.copy import CopyTask
    from chronomem.train import TrainConfig, evaluate, train

    options = {"dim": 16, "buffer_size": 3, "relevant_size": 3}
    task = CopyTask(seq_len=5)
    here, capped = [], []
    for seed in (1, 2):
        net = build_model("relevance-rnn", task, **options)
        cfg = TrainConfig(steps=3, batch_size=4, lr=0.05, seed=seed, out=str(tmp_path / f"seed{seed}"),
                          progress=False)
        trained = train(net, task, cfg).model
        here.append(evaluate(trained, task, 4, 8, progress=False)["loss"])
        answer = run_capped({"mode": "eval", "task": "copy", "task_options": {"seq_len": 5}, "model": "relevance-rnn",
                             "model_options": options, "run": cfg.out, "cap_mb": 4096, "batch_size": 4,
                             "num_examples": 8})
        capped.append(answer["loss"])
    assert here[0] != pytest.approx(here[1])  # the two runs are told apart by their losses
    assert capped == pytest.approx(here)
