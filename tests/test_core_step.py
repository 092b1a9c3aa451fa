"""benchmarks/core_step.py at tiny sizes: the tables' structure, the ratios, cores without ``done``.

No timing is asserted: only what the script computes from its timings.
"""

import json

import pytest
import torch

from chronomem.baselines import LSTM
from helpers import load_benchmark

core_step = load_benchmark("core_step")

TINY = dict(dim=16, depth=1, heads=2, batch=2, fill=32)


def test_select_cores_keeps_the_reference_and_rejects_unknown_names():
    cores = core_step.select_cores(["htm"])
    assert cores[0].name == core_step.REFERENCE
    assert {core.name for core in cores} == {"lstm", "htm"}
    assert len(core_step.select_cores(None)) == len(core_step.CORES)
    with pytest.raises(ValueError, match="--cores: unknown core.*nope.*valid:.*htm"):
        core_step.select_cores(["nope"])


def test_every_core_is_a_registered_causal_model():
    for core in core_step.CORES:  # builds at a tiny width, so an option a builder dropped fails here
        model = core_step.build(core, 16, 1, 2)
        y, _ = model(torch.randn(2, 3, 16))
        assert y.shape == (2, 3, 16), core


def test_acting_rows_structure_and_ratios_to_the_lstm():
    cores = core_step.select_cores(["relevance-rnn", "transformer-xl"])
    rows = core_step.acting_rows(cores, steps=2, repeats=2, **TINY)
    assert [(r["core"], r["options"]) for r in rows] == [(c.name, c.label) for c in cores]
    reference = next(r for r in rows if r["core"] == "lstm")
    assert reference["ratio"] == pytest.approx(1.0)
    for r in rows:
        assert set(r) == {"core", "options", "compiled", "ms", "env_steps_per_s", "ratio", "mflop", "flop_ratio",
                          "operations"} and r["compiled"] is None
        assert r["ms"] > 0 and r["operations"] > 0
        assert r["flop_ratio"] == pytest.approx(r["mflop"] / reference["mflop"])
        assert r["ratio"] == pytest.approx(r["ms"] / reference["ms"])
        assert r["env_steps_per_s"] == pytest.approx(TINY["batch"] / (r["ms"] / 1000))
    table = core_step.format_acting(rows).splitlines()
    assert len(table) == len(rows) + 1 and "ms/step" in table[0]


def test_acting_work_counts_the_lstm_products_and_the_attention():
    """The LSTM's step does ``2 B (4H in + 4H H)`` per layer (``aten.mkldnn_rnn_layer``, which torch does not
    count); an attention core's count includes the CPU attention kernel's scores and weighted sum."""
    dim, batch = TINY["dim"], TINY["batch"]
    lstm = core_step.build(core_step.select_cores(None)[0], dim, 2, 2)
    state = core_step.steady_state(lstm, batch, dim, 8, torch.Generator().manual_seed(0))
    inputs = torch.randn(3, batch, 1, dim)
    flops, operations = core_step.acting_work(lstm, state, inputs)
    assert flops == 2 * 2 * batch * (4 * dim * dim + 4 * dim * dim) and operations >= 1
    xl = core_step.build(core_step.Core("transformer-xl", "", {"memory_mode": "sliding", "mem_len": 8}), dim, 1, 2)
    state = core_step.steady_state(xl, batch, dim, 16, torch.Generator().manual_seed(0))
    core_step.acting_work(xl, state, inputs)  # W_kr R is projected once, then kept
    with_attention, _ = core_step.acting_work(xl, state, inputs)
    attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    without, _ = core_step.acting_work(xl, state, inputs, {op: f for op, f in core_step.EXTRA_FLOPS.items()
                                                           if op is not attention})
    # one query over 9 keys (8 remembered and its own), per head: 2 products of head_dim, twice
    assert with_attention - without == 2 * 2 * batch * 9 * dim


def test_compiled_rows_follow_their_eager_rows_with_the_outputs_compared(monkeypatch):
    cores = core_step.select_cores(["transformer-xl"])[:2]
    rows = core_step.acting_rows(cores, steps=2, repeats=1, compile_backend="eager", **TINY)
    assert [(r["core"], r["compiled"]) for r in rows] == [("lstm", None), ("lstm", "eager"),
                                                          ("transformer-xl", None), ("transformer-xl", "eager")]
    assert rows[0]["ratio"] == pytest.approx(1.0)  # the reference is the eager LSTM
    for r in rows[1::2]:
        assert r["max_diff"] < 1e-5
        assert r["ratio"] == pytest.approx(r["ms"] / rows[0]["ms"])
    assert "compiled (eager)" in core_step.format_acting(rows).splitlines()[2]

    # a compiled step that computes something else shows in max_diff
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, backend, **options: (lambda x, state: (
        lambda y, s: (y + 1, s))(*real_compile(model, backend=backend, **options)(x, state=state))))
    rows = core_step.acting_rows(cores[:1], steps=2, repeats=1, compile_backend="eager", **TINY)
    assert rows[1]["max_diff"] == pytest.approx(1.0)


def test_compiled_learning_rows_follow_their_eager_rows():
    cores = core_step.select_cores(["transformer-xl"])[:2]  # the LSTM and the sliding Transformer-XL
    rows = core_step.learning_rows(cores, length=8, repeats=1, compile_backend="eager", **TINY)
    assert [(r["core"], r["compiled"]) for r in rows] == [("lstm", None), ("lstm", "eager"),
                                                          ("transformer-xl", None), ("transformer-xl", "eager")]
    for eager, compiled in zip(rows[::2], rows[1::2], strict=True):
        assert compiled["max_diff"] < 1e-5 and compiled["ms"] is None
        assert compiled["ratio"] == pytest.approx(compiled["ms_done"] / eager["ms_done"])
    assert "compiled (eager)" in core_step.format_learning(rows).splitlines()[2]


def test_acting_rows_need_the_reference():
    with pytest.raises(ValueError, match="reference 'lstm'"):
        core_step.acting_rows([c for c in core_step.CORES if c.name == "mem-rnn"], steps=1, repeats=1, **TINY)


class NoDoneLSTM(LSTM):
    """A core that does not take ``done`` yet."""

    def forward(self, x, state=None, mask=None, done=None):
        if done is not None:
            raise TypeError("NoDoneLSTM.forward() got an unexpected keyword argument 'done'")
        return super().forward(x, state, mask)


def test_learning_rows_report_a_core_without_done_instead_of_crashing(monkeypatch):
    import chronomem.registry as registry

    registry._load()
    monkeypatch.setitem(registry.MODELS, "no-done",
                        lambda dim, depth, num_heads, causal, **options: NoDoneLSTM(dim=dim, depth=depth))
    cores = [core_step.CORES[0], core_step.Core("no-done", "raises on done")]
    rows = core_step.learning_rows(cores, length=8, repeats=2, **TINY)
    lstm, no_done = rows
    assert lstm["done_support"] and lstm["error"] is None
    assert lstm["ratio"] == pytest.approx(lstm["ms_done"] / lstm["ms"])
    assert not no_done["done_support"]
    assert no_done["ms_done"] is None and no_done["ratio"] is None and no_done["ms"] > 0
    assert "unexpected keyword argument 'done'" in no_done["error"]
    assert "refuses done" in core_step.format_learning(rows).splitlines()[2]


def test_main_writes_both_tables(tmp_path, capsys):
    out = tmp_path / "rows.json"
    result = core_step.main(["--cores", "mem-rnn", "--dim", "16", "--depth", "1", "--heads", "2", "--batch", "2",
                             "--repeats", "2", "--steps", "2", "--fill", "16", "--rollout", "8",
                             "--learn-repeats", "1", "--threads", str(torch.get_num_threads()),
                             "--json", str(out)])
    written = json.loads(out.read_text())
    assert [r["core"] for r in written["acting"]] == ["lstm", "mem-rnn"]
    assert [r["core"] for r in written["learning"]] == ["lstm", "mem-rnn"]
    assert written["config"]["dim"] == 16 and "loadavg" in written
    assert written["acting"] == result["acting"]
    assert "env-steps/s" in capsys.readouterr().out


def test_main_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit):
        core_step.main(["--dim", "10", "--heads", "4"])
    assert "--heads must divide --dim" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        core_step.main(["--cpp-wrapper", "--compile", "eager"])
    assert "--cpp-wrapper needs --compile inductor, got --compile eager" in capsys.readouterr().err


def test_the_kv_cache_benchmark_compares_two_paths_that_agree(capsys):
    """benchmarks/kv_cache_step.py: its concatenating reference and the in-place cache give the same
    outputs (the script checks this on every run) and the table has one row per path and a ratio."""
    kv_cache_step = load_benchmark("kv_cache_step")
    kv_cache_step.main(["--steps", "20", "--repeats", "1", "--batches", "2", "3"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line[:5].strip() in ("2", "3")]
    assert [row[1] for row in rows] == ["in", "concatenating", "ratio"] * 2


def test_the_staggered_steady_state_puts_the_rows_out_of_phase():
    """``phase="staggered"`` (the default): a chunked core's rows are at different points of their chunks, as
    an agent's envs are, so some row completes a chunk at most steps; ``"aligned"``: every row at the same
    point. Every row holds a full memory either way. An unknown phase is refused."""
    htm = core_step.build(core_step.Core("htm", "", {"chunk_size": 4, "memory_size": 2, "top_k": 1, "window": 4}),
                          16, 1, 2)
    for phase, fills in (("staggered", [0, 3, 2, 1, 0, 3]), ("aligned", [0] * 6)):
        state = core_step.steady_state(htm, 6, 16, 32, torch.Generator().manual_seed(0), phase)
        assert state.memories[0].fill.tolist() == fills, phase
        assert state.memories[0].valid.all(), phase
    assert core_step.make_parser().parse_args([]).phase == "staggered"
    with pytest.raises(ValueError, match="phase must be one of"):
        core_step.steady_state(htm, 2, 16, 8, torch.Generator(), "sideways")
