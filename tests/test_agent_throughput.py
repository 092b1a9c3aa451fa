"""benchmarks/agent_throughput.py on its smallest run: what it measures and what it reports.

No timing is asserted (the benchmark prints ratios measured side by side; docs/rl.md "Throughput"):
only that "before" and "after" are the settings they claim to be and that the records add up.
"""

import json

import pytest

from helpers import load_benchmark

pytest.importorskip("gymnasium")

agent_throughput = load_benchmark("agent_throughput")


def test_before_and_after_are_the_settings_they_name():
    from chronomem.experiments import minigrid, popgym

    assert agent_throughput.BEFORE["ballet"]["vectorization"] == "sync"
    ballet = agent_throughput.after_settings("ballet")
    assert (ballet["visual"], ballet["reconstruct_every"], ballet.get("vectorization")) == ("cells", 8, None)
    assert agent_throughput.after_settings("popgym") == popgym.SCALES["quick"].ppo
    assert agent_throughput.after_settings("doorkey") == minigrid.ppo_settings(minigrid.SCALES["quick"])


def test_one_core_one_env_writes_its_records(tmp_path, capsys):
    out = tmp_path / "throughput.json"
    records = agent_throughput.main(["--envs", "ballet", "--cores", "lstm", "--updates", "1", "--json", str(out)])
    (record,) = records
    for side in ("before", "after"):
        measured = record[side]
        assert measured["frames_per_second"] > 0 and sum(measured["share"].values()) == pytest.approx(1.0)
    after = agent_throughput.after_settings("ballet")
    assert record["after"]["frames"] == after["num_envs"] * after["num_steps"]  # one timed update
    assert record["before"]["frames"] == 16 * 64
    speeds = [record[side]["frames_per_second"] for side in ("after", "before")]
    assert record["ratio"] == pytest.approx(speeds[0] / speeds[1])
    saved = json.loads(out.read_text())
    assert saved["records"][0]["core"] == "lstm" and "before" in saved["conditions"]
    printed = capsys.readouterr().out
    assert "conditions before:" in printed and "ballet: after / before" in printed
    with pytest.raises(ValueError, match="--updates"):
        agent_throughput.main(["--updates", "0"])
