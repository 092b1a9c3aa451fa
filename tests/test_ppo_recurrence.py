"""benchmarks/ppo_recurrence.py on its smallest run: each setting trains with the recurrence it names,
and the summary's ratios are to the whole-rollout setting. No timing is asserted."""

import json

import pytest

from helpers import load_benchmark

pytest.importorskip("minigrid")

ppo_recurrence = load_benchmark("ppo_recurrence")


def test_each_setting_trains_with_its_recurrence(tmp_path, monkeypatch):
    from chronomem.rl import ppo

    seen = []
    train = ppo.train
    monkeypatch.setattr(ppo, "train", lambda args, *rest, **kw: seen.append(args.recurrence) or train(args, *rest,
                                                                                                       **kw))
    out = tmp_path / "rec.json"
    report = ppo_recurrence.main(["--recurrences", "whole", "16", "--seeds", "1", "--max-frames", "2048",
                                  "--json", str(out)])
    assert seen == [None, 16]
    assert [r["frames"] for r in report["records"]] == [2048, 2048]  # one rollout of 16 x 128
    assert json.loads(out.read_text())["summary"] == report["summary"]


def test_ratios_are_to_the_whole_rollout_and_a_missed_target_counts_as_the_cap():
    records = [{"recurrence": "whole", "frames_to_target": 100, "frames_per_second": 10.0},
               {"recurrence": "16", "frames_to_target": None, "frames_per_second": 20.0}]
    whole, windows = ppo_recurrence.summarise(records, ["whole", "16"], max_frames=400)
    assert (whole["frames_ratio"], whole["speed_ratio"]) == (1.0, 1.0)
    assert (windows["median_frames"], windows["frames_ratio"], windows["speed_ratio"]) == (400, 4.0, 2.0)
