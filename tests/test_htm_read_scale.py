"""benchmarks/htm_read_scale.py at tiny sizes: it records every memory read, restores HTMAttention.read,
and its table shows the released initialisation's read larger than PyTorch's default; the second table
shows the output jump once a chunk is read, and final_norm's output at the LayerNorm's scale. With --runs
it measures trained HTM agents on their env, per phase, the read scaled by its gate, the output the heads
read and the share of the heads' units that pass it no gradient, and refuses others."""

import json

import pytest

from chronomem.htm import HTMAttention
from helpers import load_benchmark

read_scale = load_benchmark("htm_read_scale")


def test_reads_are_recorded_and_the_method_restored(capsys):
    original = HTMAttention.read
    read_scale.main(["--dim", "16", "--batch", "2", "--steps", "40", "--seeds", "2"])
    assert HTMAttention.read is original
    first, second = capsys.readouterr().out.split("\n\n")
    rows = [line.split("|")[1:-1] for line in first.splitlines()[2:]]
    ratio = {row[0].strip(): float(row[3]) for row in rows}
    assert set(ratio) == {"2.0", "None"}
    assert ratio["2.0"] > 2 * ratio["None"] > 0  # variance 2/fan-in against 1/(3 fan-in): ~sqrt(6) per projection


def test_the_output_the_heads_read(capsys):
    read_scale.main(["--dim", "16", "--batch", "2", "--steps", "40", "--seeds", "2", "--input-scale", "0.1"])
    second = capsys.readouterr().out.split("\n\n")[1]
    rows = {row[0].strip(): (float(row[1]), float(row[2])) for row in
            (line.split("|")[1:-1] for line in second.splitlines()[2:])}
    assert set(rows) == set(read_scale.OUTPUT_VARIANTS)
    before, after = rows["paper's (init_scale=2)"]
    assert after > 2 * before  # the read of the slot encoding, from step 16 on
    for name in ("no slot encoding", "read gated shut"):
        assert rows[name][1] < 1.5 * rows[name][0]
    assert all(abs(n - 16**0.5) < 0.1 for n in rows["final_norm"])  # LN's output: norm sqrt(dim)


def test_trained_runs_report_the_read_against_the_stream_per_phase(tmp_path, capsys):
    from chronomem.envs.tvt import PHASES, visual_match_id
    from chronomem.rl.ppo import Args, train

    runs = []
    for name, gate, final_norm, heads in (("paper", None, False, "tanh"), ("gated", 0.0, False, "tanh"),
                                          ("normed", None, True, "tanh"), ("relu", None, False, "relu")):
        run = tmp_path / name
        options = {"chunk_size": 4, "top_k": 1, "memory_size": 12, "window": 4, "read_gate": gate,
                   "final_norm": final_norm}
        train(Args(env=visual_match_id("passive", 5, control=True), core="htm", dim=8, heads=2, hidden=8,
                   head_activation=heads, num_envs=2, num_steps=35, num_minibatches=1, update_epochs=1,
                   total_frames=70, device="cpu", progress=False, out=str(run)), core_options=options)
        runs.append(str(run))
    original = HTMAttention.read
    records = tmp_path / "reads.jsonl"
    read_scale.main(["--runs", *runs, "--episodes", "2", "--jsonl", str(records)])
    assert HTMAttention.read is original
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and "---" not in line][1:]
    found = {(row[0], row[3]): (row[2], *map(float, row[4:8]), *map(float, row[8].split(" / "))) for row in rows}
    assert set(found) == {(run, phase) for run in runs for phase in PHASES}  # one layer, every phase
    assert {found[runs[0], phase][0] for phase in PHASES} == {"-"}  # the paper's layer has no gate
    gate = {float(found[runs[1], phase][0]) for phase in PHASES}
    assert len(gate) == 1 and abs(gate.pop()) < 0.01  # one update (lr 1e-3) barely opens a gate shut at 0
    assert all(found[key][1] > 0 and found[key][2] >= 0 for key in found)  # norms, whatever the gate's sign
    paper, gated = found[runs[0], "reward"], found[runs[1], "reward"]
    assert paper[2] > 0 and paper[3] == pytest.approx(paper[2] / paper[1], rel=0.5)  # a mean of ratios
    assert 0 <= gated[3] < paper[3] / 10  # the gate scales what enters the stream
    # what the heads read: the core's output (LayerNorm's sqrt(width) with final_norm, after one small step)
    assert all(found[key][4] > 0 and 0 <= found[key][5] <= 1 and 0 <= found[key][6] <= 1 for key in found)
    assert {round(found[runs[2], phase][4], 1) for phase in PHASES} == {round(8**0.5, 1)}
    assert found[runs[0], "reward"][4] != pytest.approx(8**0.5, abs=0.1)
    # ReLU heads pass no gradient where a unit is 0: about half of them as initialised (tanh's: |tanh| > 0.99)
    assert all(0.1 < share < 0.9 for phase in PHASES for share in found[runs[3], phase][5:])
    written = [json.loads(line) for line in records.read_text().splitlines()]
    assert [r["run"] for r in written] == runs and all(r["episodes"] == 2 for r in written)
    assert {(r["run"], row["phase"]): row["read_over_stream"] for r in written for row in r["rows"]} == pytest.approx(
        {key: value[3] for key, value in found.items()}, abs=0.006)  # the table's rounding
    for record in written:
        for row in record["rows"]:
            written_row = (row["output"], row["no_gradient_policy"], row["no_gradient_value"])
            assert written_row == pytest.approx(found[record["run"], row["phase"]][4:], abs=0.006)


def test_untrained_builds_the_run_agent_before_training(tmp_path):
    from chronomem.envs.tvt import visual_match_id
    from chronomem.rl.ppo import Args, train

    run = tmp_path / "run"
    train(Args(env=visual_match_id("passive", 5, control=True), core="htm", dim=8, heads=2, hidden=8, num_envs=2,
               num_steps=35, num_minibatches=1, update_epochs=4, lr=0.05, total_frames=70, device="cpu",
               progress=False, out=str(run)), core_options={"chunk_size": 4, "top_k": 1, "memory_size": 12,
                                                            "window": 4})
    first, again, trained = (read_scale.trained_reads(str(run), 1, untrained=untrained)
                             for untrained in (True, True, False))
    assert first == again  # seeded: the same agent, the same episode
    assert first != trained  # the checkpoint's weights moved (a large step), so its norms differ


def test_runs_must_be_htm_agents(tmp_path):
    from chronomem.envs.tvt import visual_match_id
    from chronomem.rl.ppo import Args, train

    run = tmp_path / "mlp"
    train(Args(env=visual_match_id("passive", 5, control=True), core="mlp", dim=8, hidden=8, num_envs=2,
               num_steps=35, num_minibatches=1, update_epochs=1, total_frames=70, device="cpu", progress=False,
               out=str(run)))
    with pytest.raises(ValueError, match="HTM agent"):
        read_scale.main(["--runs", str(run)])


def test_a_ballet_run_is_read_per_named_phase(tmp_path, capsys):
    """Ballet's ``info["phase"]`` is a name ("dance", "choice"), not Visual Match's index: the rows carry it."""
    from chronomem.rl.ppo import Args, train

    run = tmp_path / "ballet"
    train(Args(env="chronomem/Ballet-2_delay16-any-symbolic-v0", core="htm", dim=8, heads=2, hidden=8,
               visual="cells", reconstruction=0.0, num_envs=2, num_steps=16, num_minibatches=1, update_epochs=1,
               total_frames=32, device="cpu", progress=False, out=str(run)),
          core_options={"chunk_size": 4, "top_k": 1, "memory_size": 40})
    records = tmp_path / "reads.jsonl"
    read_scale.main(["--runs", str(run), "--episodes", "1", "--jsonl", str(records)])
    phases = [line.split("|")[4].strip() for line in capsys.readouterr().out.splitlines()
              if line.startswith(f"| {run} |")]
    assert sorted(phases) == ["choice", "dance"]
    assert sorted(row["phase"] for row in json.loads(records.read_text())["rows"]) == ["choice", "dance"]
