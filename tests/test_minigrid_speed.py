"""benchmarks/minigrid_speed.py on its smallest run: what it measures and what it reports (no timing
is asserted: the script prints ratios measured side by side)."""

import json

import pytest

from helpers import load_benchmark

pytest.importorskip("gymnasium")
pytest.importorskip("minigrid")

minigrid_speed = load_benchmark("minigrid_speed")


def test_smallest_run_reports_every_part_before_and_after(tmp_path, capsys):
    out = tmp_path / "speed.json"
    result = minigrid_speed.main(["--repeats", "1", "--num-envs", "2", "--num-steps", "8", "--json", str(out)])
    for part in ("view_us", "env_us_per_frame", "encoder_ms", "update_s"):
        assert set(result[part]) == ({"minigrid", "fast"} if part == "view_us" else {"before", "after"})
        assert all(value > 0 for value in result[part].values())
    for name, split in result["update_split_s"].items():
        assert len(split) == 3 and all(part >= 0 for part in split)
        assert sum(split) <= result["update_s"][name] * 1.5  # the split is of the updates timed
    assert json.loads(out.read_text())["conditions"]["after"]
    printed = capsys.readouterr().out
    assert "PPO update (s)" in printed and "before / after" in printed
    with pytest.raises(FileExistsError):  # never overwrites another run's file
        minigrid_speed.main(["--repeats", "1", "--num-envs", "2", "--num-steps", "8", "--json", str(out)])
