"""benchmarks/visual_match_cue_at_init.py and visual_match_supervised.py at tiny sizes: the episode pairs
differ only in the cue, so the memoryless agent's output cannot move while HTM's does; the relevance
weights are a distribution over the visible chunks; the labelled episodes are whole and labelled; every
patched read is restored."""

import numpy as np

from chronomem.htm import HTMAttention
from helpers import load_benchmark

cue_at_init = load_benchmark("visual_match_cue_at_init")
supervised = load_benchmark("visual_match_supervised")


def table(out: str) -> dict[str, list[str]]:
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    return {row[0].strip(): [cell.strip() for cell in row[1:]] for row in rows[1:]}


def test_the_cue_moves_a_memory_but_never_the_memoryless_agent(capsys):
    original = HTMAttention.read
    cue_at_init.main(["--cores", "mlp", "htm", "--seeds", "1", "--episodes", "2"])
    assert HTMAttention.read is original
    rows = table(capsys.readouterr().out)
    assert float(rows["mlp"][1]) == 0.0  # nothing of the explore phase reaches a memoryless step
    assert float(rows["htm"][1]) > 0.0 and float(rows["htm"][2]) > 0.0
    assert 0.0 < float(rows["htm"][4]) < 1.0  # the explore chunk among three at distractor 30
    assert float(rows["htm"][5]) > 0.0 and float(rows["htm"][6]) > 0.0  # the stored step and the slot encoding


def test_episode_pairs_differ_only_in_the_cue():
    for a, b, phases in cue_at_init.episodes(30, 3):
        assert a.shape == b.shape and len(phases) == len(a)
        differs = np.nonzero((a != b).any(axis=(1, 2, 3)))[0]
        assert len(differs) and set(phases[differs]) == {0}  # only explore steps (the cue) differ


def test_labelled_episodes_are_whole_and_the_accuracy_and_weights_are_printed(capsys):
    grids, phases, targets = supervised.labelled_episodes(5, 4, 0)
    assert grids.shape[:2] == phases.shape == (4, 35)  # the player stays off the squares: full episodes
    assert (phases[:, -15:] == 2).all() and set(targets.tolist()) <= {0, 1, 2}
    original = HTMAttention.read
    supervised.main(["--distractor", "30", "--cores", "htm", "--seeds", "0", "--steps", "2", "--every", "1",
                     "--episodes", "8", "--held-out", "4"])
    assert HTMAttention.read is original
    line = capsys.readouterr().out.splitlines()[-1]
    points = line.split(": ", 1)[1].split()
    assert [p.split(":")[0] for p in points] == ["0", "1", "2"]
    for point in points:
        accuracy, weights = point.split(":")[1].split("/")
        assert 0.0 <= float(accuracy) <= 100.0
        assert abs(sum(map(float, weights.split(","))) - 1.0) < 0.02 and len(weights.split(",")) == 3
