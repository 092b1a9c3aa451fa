"""The efficiency benchmark harness: output schema, OOM / timeout / error results, skipping, slope fit.

No timing assertions: the tests run tiny models in subprocesses and check what gets recorded.
"""

from __future__ import annotations

import json
import math
import textwrap

import pytest

from chronomem import bench, registry

# Tiny backbones registered in every worker through ``--plugin``; they misbehave only past 64 steps
# (the worker's warm-up before the baseline uses the first 64 steps).
PLUGIN = textwrap.dedent(
    """
    import time

    import torch
    from torch import nn

    from chronomem.registry import MODELS


    class Tiny(nn.Module):
        def __init__(self, dim, kind):
            super().__init__()
            self.lin, self.kind, self.out_dim = nn.Linear(dim, dim), kind, dim

        def forward(self, x, state=None, mask=None):
            if x.shape[1] > 64:
                if self.kind == "sleep":
                    time.sleep(120)
                if self.kind == "hog":  # 16 TB: the allocation fails
                    torch.empty(2**42)
                if self.kind == "grow":  # N * 128 KiB, touched: far above an 8 MB cap at N = 128
                    x = x + torch.ones(x.shape[1] * 2**15).sum() * 0
            return self.lin(x), None


    for kind in ("tiny", "sleep", "hog", "grow"):
        MODELS.setdefault(f"bench-{kind}", lambda dim, depth, num_heads, causal, kind=kind, **o: Tiny(dim, kind))
    """
)

TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--threads", "1", "--repeats", "1", "--peer", "off"]


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "plugin.py"
    path.write_text(PLUGIN)
    registry.names()  # load the built-in models first, so that the restore below keeps them
    before = dict(registry.MODELS)
    yield str(path)
    registry.MODELS.clear()
    registry.MODELS.update(before)


def _points(out):
    results = json.loads((out / "results.json").read_text())
    return results, {(p["model"], p["n"], p["mode"]): p for p in results["points"]}


def test_quick_schema(tmp_path, plugin):
    out = tmp_path / "quick"
    argv = ["--quick", "--models", "transformer", "bench-tiny", "--lengths", "32", "96"]
    assert bench.main([*argv, *TINY, "--plugin", plugin, "--out", str(out)]) == 0
    results, points = _points(out)
    assert {"config", "machine", "points", "slopes", "targets", "peers", "seconds"} <= set(results)
    assert results["config"]["lengths"] == [32, 96] and results["config"]["quick"] is True
    for model in ("transformer", "bench-tiny"):
        for n in (32, 96):
            for mode in ("infer", "train"):
                p = points[(model, n, mode)]
                assert p["status"] == "ok", p
                for key in ("seconds", "tokens_per_s", "peak_rss_mb", "baseline_rss_mb", "delta_rss_mb", "repeats"):
                    assert isinstance(p[key], (int, float)) and p[key] >= 0, (key, p)
                assert p["peak_rss_mb"] >= p["baseline_rss_mb"] > 0
                assert math.isclose(p["tokens_per_s"], n / p["seconds"], rel_tol=1e-6)
        fit = results["slopes"][model]["train"]["time"]
        assert fit["range"] == [32, 96] and fit["points"] == 2 and math.isfinite(fit["slope"])
    conditions = results["conditions"]  # the workers' threads, the load before and after the run
    assert conditions["busy"] in (True, False)
    for end in ("before", "after"):
        assert conditions[end]["torch_threads"] == 1 and conditions[end]["cores"] >= 1
        assert {"omp_num_threads", "omp_wait_policy", "load_average"} <= set(conditions[end])
    report = (out / "report.md").read_text()
    assert "| transformer |" in report and "| bench-tiny |" in report
    assert "Conditions: 1 torch thread, " in report
    assert (out / "time.png").stat().st_size > 0 and (out / "memory.png").stat().st_size > 0


def test_busy_machine_is_flagged(tmp_path, plugin, monkeypatch, capsys):
    """A load above the cores, read by the parent before and after the sweep, is printed, stored in
    results.json and written into report.md."""
    import os

    from chronomem.threads import available_cores

    load = available_cores() + 1.5
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load), raising=False)
    out = tmp_path / "busy"
    argv = ["--models", "bench-tiny", "--lengths", "8", "--mode", "infer"]
    assert bench.main([*argv, *TINY, "--plugin", plugin, "--out", str(out)]) == 0
    results, _ = _points(out)
    assert results["conditions"]["busy"] is True
    assert results["conditions"]["before"]["load_average"] == round(load, 2)
    flag = f"MEASURED ON A BUSY MACHINE (load {round(load, 2):g} > {available_cores()} cores)"
    printed = capsys.readouterr().out
    assert printed.count("conditions before: ") == 1 and flag in printed.split("conditions: ")[1]
    assert flag in (out / "report.md").read_text()


def test_oom_error_and_skip(tmp_path, plugin):
    out = tmp_path / "oom"
    argv = ["--models", "bench-hog", "bench-grow", "lstm", "--lengths", "32", "128", "256", "--mode", "train",
            "--memory-cap-mb", "8", "--timeout", "60", "--model-opt", "lstm:no_such_option=1"]
    assert bench.main([*argv, *TINY, "--plugin", plugin, "--out", str(out)]) == 0
    _, points = _points(out)
    for model in ("bench-hog", "bench-grow"):
        assert points[(model, 32, "train")]["status"] == "ok"
        assert points[(model, 128, "train")]["status"] == "OOM", points[(model, 128, "train")]
        assert points[(model, 256, "train")]["status"] == "skipped"  # larger N after an OOM
    assert "allocate" in points[("bench-hog", 128, "train")]["error"]  # caught inside the worker
    assert points[("lstm", 32, "train")]["status"] == "error"  # a bad option is a result too
    assert "no_such_option" in points[("lstm", 32, "train")]["error"]
    assert points[("lstm", 128, "train")]["status"] == "skipped"


def test_timeout_and_skip(tmp_path, plugin):
    out = tmp_path / "timeout"
    argv = ["--models", "bench-sleep", "--lengths", "128", "256", "--timeout", "6"]
    assert bench.main([*argv, *TINY, "--plugin", plugin, "--out", str(out)]) == 0
    results, points = _points(out)
    for mode in ("infer", "train"):
        assert points[("bench-sleep", 128, mode)]["status"] == "timeout"
        assert points[("bench-sleep", 256, mode)]["status"] == "skipped"
    assert results["slopes"]["bench-sleep"]["train"] == {"time": None, "memory": None}


def test_fit_slope():
    ns = [512, 1024, 2048, 4096, 8192]
    fit = bench.fit_slope(ns, [3e-6 * n**2 for n in ns])
    assert fit["slope"] == pytest.approx(2.0) and fit["range"] == [1024, 8192] and fit["points"] == 4
    assert bench.fit_slope([256, 512], [1.0, 2.0])["slope"] == pytest.approx(1.0)  # fewer than 2 in range
    assert bench.fit_slope([1024], [1.0]) is None
    assert bench.fit_slope([1024, 2048], [0.0, 1.0]) is None  # non-positive values are left out


def test_bad_arguments(capsys):
    assert bench.main(["--dim", "30", "--heads", "4"]) == 2
    assert "--heads must divide --dim" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--model-opt", "no-colon"])


def test_peer_comparison_schema():
    shape = bench.PeerShape(batch=1, queries=4, chunks=8, chunk_size=4, top_k=2, dim=16, heads=2)
    result = bench.compare_peers(shape, repeats=1, warmup=0, threads=1, log=lambda line: None)
    assert result["shape"]["chunks"] == 8 and "chronomem" in result["rows"]
    assert set(result["rows"]) | set(result["unavailable"]) == set(bench.PEERS)
    for name, row in result["rows"].items():
        for mode in ("infer", "train"):
            assert row[mode]["seconds"] > 0 and row[mode]["delta_rss_mb"] is not None
            if name != "chronomem":
                assert row[mode]["time_ratio"] > 0
    assert bench.peer_report(result)[0].startswith("## HTMAttention")


@pytest.mark.parametrize("key_mask", [False, True])
def test_count_flops_of_attention_equals_hand_count(key_mask):
    """Self-attention over N tokens: four D x D projections (q, k, v, out) and two N x N x D products,
    2 FLOPs per multiply-add. The attention runs through SDPA, which the counter must not miss."""
    import torch

    from chronomem.layers import MultiHeadAttention

    n, d = 12, 16
    attn = MultiHeadAttention(d, num_heads=4)
    x = torch.randn(1, n, d)
    mask = torch.ones(1, n, dtype=torch.bool) if key_mask else None
    flops = bench.count_flops(lambda t: attn(t, key_mask=mask), x)
    assert flops == 2 * n * d * d * 4 + 2 * 2 * n * n * d


def test_unknown_model_is_an_error(tmp_path, capsys):
    """An unknown name fails at once, in one line naming it and listing the valid ones; nothing written."""
    from chronomem.cli import main as chronomem

    out = tmp_path / "bench"
    assert bench.main(["--quick", "--models", "transformer", "nope", *TINY, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("chronomem bench: error: --models")
    assert "'nope'" in err and "valid models:" in err and "transformer" in err and "htm" in err
    assert chronomem(["bench", "--quick", "--models", "nope", *TINY, "--out", str(out)]) == 2
    assert "'nope'" in capsys.readouterr().err
    assert bench.main(["--quick", "--models", "lstm", "--model-opt", "nope:x=1", *TINY, "--out", str(out)]) == 2
    assert "--model-opt: unknown model(s) 'nope'" in capsys.readouterr().err
    assert not out.exists()


def test_out_holding_a_run_is_refused(tmp_path, capsys):
    """A benchmark never overwrites another run's files."""
    out = tmp_path / "bench"
    out.mkdir()
    (out / "results.json").write_text('{"earlier": "run"}\n')
    argv = ["--quick", "--models", "lstm", "--lengths", "8", *TINY, "--out", str(out)]
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert "already holds a benchmark (results.json)" in err and str(out) in err
    assert [p.name for p in out.iterdir()] == ["results.json"]
    assert (out / "results.json").read_text() == '{"earlier": "run"}\n'
    (out / "results.json").unlink()
    (out / "peers.json").write_text("{}")
    assert bench.main(["--peer", "only", "--out", str(out)]) == 2  # the peer comparison alone too
    assert "(peers.json)" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("")
    assert bench.main([*argv[:-1], str(tmp_path / "a-file")]) == 2
    assert "is a file" in capsys.readouterr().err
