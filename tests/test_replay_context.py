"""benchmarks/replay_context.py on its smallest run: each run trains with the context it names, on CueRecall
with the delay asked, and the summary counts per context. Nothing learned is asserted (a few updates)."""

import json

import pytest

from helpers import load_benchmark

pytest.importorskip("gymnasium")

replay_context = load_benchmark("replay_context")


def test_each_run_trains_with_its_context_on_the_delay_asked(tmp_path, monkeypatch):
    from chronomem.rl import ppo

    seen = []
    train = ppo.train
    monkeypatch.setattr(ppo, "train", lambda args, *rest, **kw: seen.append((args.env, args.replay_context))
                        or train(args, *rest, **kw))
    out = tmp_path / "context.json"
    report = replay_context.main(["--delay", "7", "--num-steps", "6", "--contexts", "0", "6", "--seeds", "0",
                                  "--max-frames", "384", "--json", str(out)])
    assert seen == [("chronomem/CueRecall-delay7-v0", 0), ("chronomem/CueRecall-delay7-v0", 6)]
    none, six = report["records"]
    assert none["frames"] == six["frames"] == 384  # four rollouts of 16 x 6
    assert none["episodes_whole"] == 0.0  # 8-step episodes never lie in 6 steps
    assert six["episodes_whole"] > 0.5  # in 6 + 6 from the second rollout on
    assert [row["seeds"] for row in report["summary"]] == [1, 1]
    assert json.loads(out.read_text())["summary"] == report["summary"]


def test_the_summary_counts_the_seeds_that_reached_the_target():
    records = [{"context": 0, "frames_to_target": None, "return_last_quarter": 0.5},
               {"context": 0, "frames_to_target": 800, "return_last_quarter": 0.7},
               {"context": 5, "frames_to_target": 400, "return_last_quarter": 1.0}]
    none, five = replay_context.summarise(records, [0, 5])
    assert (none["reached"], none["seeds"], none["mean_return_last_quarter"]) == (1, 2, 0.6)
    assert (five["reached"], five["frames_to_target"]) == (1, [400])
