"""`chronomem rl train` / `chronomem rl eval`: flags from PPO's Args, resume rules, eval, GIF, errors."""

import json

import pytest
import torch

from chronomem.cli import main

pytest.importorskip("gymnasium")
torch.set_num_threads(1)

CUE = "chronomem/CueRecall-v0"
TINY = ["--env", CUE, "--dim", "8", "--hidden", "8", "--num-envs", "2", "--num-steps", "8", "--num-minibatches", "1",
        "--update-epochs", "1", "--no-progress"]


@pytest.mark.parametrize("argv, message", [
    (["rl", "train", "--env", "NoSuchEnv-v0"], "--env 'NoSuchEnv-v0' is not a registered Gymnasium environment"),
    (["rl", "train", "--env", CUE, "--core", "nope"], "unknown model 'nope'; valid names"),
    (["rl", "train", "--env", CUE, "--num-envs", "4", "--num-minibatches", "3"], "must divide --num-envs 4"),
    (["rl", "train", "--env", CUE, "--gamma", "2"], "--gamma must be in"),
    (["rl", "train", "--env", CUE, "--core", "transformer"], "core 'transformer' keeps no state"),
    (["rl", "train", "--env", CUE, "--core-opt", "hidden"], "--core-opt takes KEY=VALUE"),
    (["rl", "eval", "nowhere"], "config.json not found"),
])
def test_bad_input_fails_with_a_clear_message(argv, message, capsys, tmp_path):
    assert main(argv + ["--out", str(tmp_path / "run")] if argv[1] == "train" else argv) == 2
    assert message in capsys.readouterr().err


def test_train_resume_eval_and_gif(tmp_path, capsys):
    pytest.importorskip("minigrid")
    out = tmp_path / "run"
    argv = ["rl", "train", *TINY, "--total-frames", "16", "--out", str(out), "--core-opt", "hidden=6"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["frames"] == 16 and "return_mean" in result
    saved = json.loads((out / "config.json").read_text())
    assert saved["kind"] == "ppo" and saved["core_options"] == {"hidden": 6} and saved["args"]["dim"] == 8
    assert main(argv) == 2 and "already holds a run" in capsys.readouterr().err

    # resume: only the resumable flags may change
    assert main(["rl", "train", "--resume", str(out), "--total-frames", "32", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["frames"] == 32
    for flags, message in ((["--lr", "0.5"], "--lr 0.5 differs from the resumed run's saved value 0.001"),
                           (["--core-opt", "hidden=7"], "--core-opt hidden 7 differs"),
                           (["--out", str(tmp_path / "elsewhere")], "writes only into its own directory")):
        assert main(["rl", "train", "--resume", str(out), *flags]) == 2
        assert message in capsys.readouterr().err

    # eval on the run's env, then the GIF of a MiniGrid-less env is refused clearly
    assert main(["rl", "eval", str(out), "--episodes", "5", "--num-envs", "2"]) == 0
    evaluation = json.loads(capsys.readouterr().out)
    assert evaluation["episodes"] == 5 and evaluation["env"] == CUE and evaluation["checkpoint"] == "step_00000032"
    assert 0.0 <= evaluation["return_mean"] <= 1.0
    evaluations = []
    for burn in (0, 1000):  # torch's global generator moved on: --seed (default 0) alone decides the draws
        torch.rand(burn)
        assert main(["rl", "eval", str(out), "--episodes", "32", "--num-envs", "4"]) == 0
        evaluations.append(json.loads(capsys.readouterr().out))
    assert evaluations[0] == evaluations[1]
    assert main(["rl", "eval", str(out), "--gif", str(tmp_path / "a.gif")]) == 2
    assert "renders no rgb_array frames" in capsys.readouterr().err
    assert main(["rl", "eval", str(out), "--episodes", "0"]) == 2
    assert "--episodes must be a positive integer" in capsys.readouterr().err


def test_eval_on_a_larger_minigrid_and_gif(tmp_path, capsys):
    pytest.importorskip("minigrid")
    out = tmp_path / "run"
    assert main(["rl", "train", "--env", "MiniGrid-DoorKey-5x5-v0", "--dim", "8", "--hidden", "8", "--num-envs", "2",
                 "--num-steps", "4", "--num-minibatches", "1", "--update-epochs", "1", "--total-frames", "8",
                 "--no-progress", "--out", str(out)]) == 0
    capsys.readouterr()
    gif = tmp_path / "gifs" / "episode.gif"
    assert main(["rl", "eval", str(out), "--env", "MiniGrid-DoorKey-6x6-v0", "--episodes", "2", "--num-envs", "2",
                 "--gif", str(gif)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["env"] == "MiniGrid-DoorKey-6x6-v0" and result["episodes"] == 2
    assert gif.read_bytes()[:6] in (b"GIF87a", b"GIF89a") and result["gif_episode"]["length"] >= 1
    from PIL import Image

    with Image.open(gif) as film:  # one frame per step (none merged), 8 fps, 6x6 cells of 32 px enlarged x3
        assert film.n_frames == result["gif_episode"]["length"] + 1 and film.size == (576, 576)
        assert film.info["duration"] == 120
