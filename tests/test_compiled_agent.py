"""benchmarks/compiled_agent.py: eager and compiled rows of ballet-rl's agent, from PPO's own metrics."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import load_benchmark

compiled_agent = load_benchmark("compiled_agent")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_each_compiled_setting_follows_eager_with_its_ratio(tmp_path, capsys):
    out = tmp_path / "rows.json"
    rows = compiled_agent.main(["--scale", "smoke", "--cores", "lstm", "--num-envs", "2", "--updates", "2",
                                "--backend", "aot_eager", "--device", "cpu", "--json", str(out)])
    assert [(r["setting"], r["num_envs"]) for r in rows] == [("eager", 2), ("compiled default", 2)]
    for r in rows:
        assert r["sps"] > 0 and r["frames_per_update"] == 2 * 8  # the smoke scale's 2 envs x 8 steps
        assert all(r[f"seconds_{part}"] >= 0 for part in compiled_agent.PARTS)
    shown = capsys.readouterr().out.splitlines()
    ratio = float(shown[-1].split()[5])  # compiled's x eager
    assert ratio == pytest.approx(rows[1]["sps"] / rows[0]["sps"], rel=1e-2)
    assert json.loads(out.read_text())["rows"] == rows


@pytest.mark.parametrize("argv, message", [
    (["--cores", "gtrxl"], "--cores: gtrxl not in ballet-rl's paper scale"),
    (["--cpp-wrapper", "--backend", "aot_eager"], "--cpp-wrapper needs --backend inductor, got aot_eager"),
    (["--updates", "0"], "--updates must be >= 1, got 0"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        compiled_agent.main(argv)
    assert message in capsys.readouterr().err
