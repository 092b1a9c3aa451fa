"""rl/evaluate.py and rl/gif.py: the GIF written frame by frame (upscaled, its delay, bounded memory) and
the progress of an evaluation and of a filmed episode."""

import numpy as np
import pytest
import torch
from PIL import Image

from chronomem.rl.gif import GifWriter, scale_factor

torch.set_num_threads(1)

CUE = "chronomem/CueRecall-v0"
BALLET = "chronomem/Ballet-2_delay16-symbolic-v0"


def read_gif(path):
    """``(frames [T, H, W, 3], delays in ms, loop)`` as Pillow decodes the file."""
    with Image.open(path) as gif:
        frames, delays = [], []
        for i in range(gif.n_frames):
            gif.seek(i)
            frames.append(np.asarray(gif.convert("RGB")))
            delays.append(gif.info["duration"])
        return np.stack(frames), delays, gif.info.get("loop")


def tiny_agent(env_id):
    from chronomem.envs.make import make_env
    from chronomem.rl.ppo import Args, make_agent

    env = make_env(env_id)
    args = Args(env=env_id, dim=8, depth=1, heads=2, hidden=8, num_envs=2, num_minibatches=1, device="cpu")
    torch.manual_seed(0)
    agent = make_agent(args, {}, env.observation_space, env.action_space).eval()
    env.close()
    return agent


def test_small_frames_are_enlarged_by_an_integer_factor(tmp_path):
    assert scale_factor(108, 99) == 5 and scale_factor(512, 512) == 1 and scale_factor(160, 160) == 3
    rng = np.random.default_rng(0)
    colours = rng.integers(0, 255, (8, 3), dtype=np.uint8)
    frames = [colours[rng.integers(0, 8, (108, 99))] for _ in range(2)]  # Ballet's size
    frames[1][:40] = frames[0][:40]  # the second frame is drawn from row 40 down only
    with GifWriter(tmp_path / "a.gif") as gif:
        for frame in frames:
            gif.append(frame)
    back = read_gif(tmp_path / "a.gif")[0]
    assert back.shape == (2, 540, 495, 3)  # the short side 99 -> 495 >= 400
    assert (back == np.stack([f.repeat(5, axis=0).repeat(5, axis=1) for f in frames])).all()  # 5 x 5 blocks
    with GifWriter(tmp_path / "b.gif", min_side=0) as gif:
        gif.append(frames[0])
    assert read_gif(tmp_path / "b.gif")[0].shape == (1, 108, 99, 3)


@pytest.mark.parametrize("fps, delay", [(8, 120), (4, 250), (50, 20)])
def test_gif_frames_delay_and_loop_read_back(tmp_path, fps, delay):
    rng = np.random.default_rng(1)
    colours = rng.integers(0, 255, (6, 3), dtype=np.uint8)
    frames = [colours[rng.integers(0, 6, (12, 10))] for _ in range(4)]
    frames.insert(2, frames[1].copy())  # an unchanged frame stays a frame of its own
    frames[4] = frames[3].copy()
    frames[4][5, 7] = colours[0] if (frames[3][5, 7] != colours[0]).any() else colours[1]  # one pixel changed
    with GifWriter(tmp_path / "a.gif", fps, min_side=0) as gif:
        for frame in frames:
            gif.append(frame)
    back, delays, loop = read_gif(tmp_path / "a.gif")
    assert back.shape == (5, 12, 10, 3) and (back == np.stack(frames)).all()
    assert delays == [delay] * 5 and loop == 0


def test_gif_writer_refuses_bad_input(tmp_path):
    with pytest.raises(ValueError, match="fps must be in"):
        GifWriter(tmp_path / "a.gif", fps=0)
    with GifWriter(tmp_path / "b.gif") as gif:
        gif.append(np.zeros((4, 4, 3), np.uint8))
        with pytest.raises(ValueError, match="the first one's size 4x4, got 4x5"):
            gif.append(np.zeros((4, 5, 3), np.uint8))
        with pytest.raises(ValueError, match="RGB"):
            gif.append(np.zeros((4, 4), np.uint8))


def test_gif_frames_reach_the_disk_one_at_a_time(tmp_path):
    path = tmp_path / "a.gif"
    rng = np.random.default_rng(2)
    sizes = []
    with GifWriter(path, min_side=0) as gif:
        for _ in range(4):
            gif.append(rng.integers(0, 4, (20, 30, 3), dtype=np.uint8) * 60)
            sizes.append(path.stat().st_size)
    assert sizes == sorted(set(sizes))  # every frame added bytes to the file before the next came
    assert read_gif(path)[0].shape == (4, 20, 30, 3)


def test_record_gif_streams_upscaled_frames_and_shows_progress(tmp_path, monkeypatch, capsys):
    pytest.importorskip("gymnasium")
    import tracemalloc

    from chronomem import progress
    from chronomem.rl import evaluate as ev
    from chronomem.rl import gif as gif_module

    agent = tiny_agent(BALLET)
    renders, appended = [0], []
    make_env = ev.make_env

    def counting_env(env_id, **options):  # counts the frames rendered
        env = make_env(env_id, **options)
        render = env.render

        def counted():
            renders[0] += 1
            return render()

        env.render = counted
        return env

    real_append = gif_module.GifWriter.append

    def spy(self, frame):  # what was rendered, and what is on disk, when a frame is appended
        appended.append((renders[0], (tmp_path / "ballet.gif").stat().st_size))
        real_append(self, frame)

    monkeypatch.setattr(ev, "make_env", counting_env)
    monkeypatch.setattr(gif_module.GifWriter, "append", spy)
    monkeypatch.setattr(progress, "LINE_INTERVAL", 0.0)
    tracemalloc.start()
    try:
        result = ev.record_gif(agent, BALLET, tmp_path / "ballet.gif", seed=3, max_episode_steps=60)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    frames = result["length"] + 1
    # each frame is appended as soon as it is rendered, and the file grows while the episode is played
    assert [r for r, _ in appended] == list(range(1, frames + 1))
    sizes = [size for _, size in appended[1:]]  # before frames 2, 3, ...: frame 1, 2, ... already on disk
    assert sizes[0] > 0 and sizes == sorted(set(sizes))
    assert result["length"] == 60 and peak < 16 * 108 * 99 * 3  # a few of Ballet's frames, not all 61
    back, delays, _ = read_gif(tmp_path / "ballet.gif")
    assert back.shape == (frames, 540, 495, 3) and set(delays) == {120}  # Ballet's 108 x 99 px, x5
    err = capsys.readouterr().err
    assert f"GIF of {BALLET}: episode 0/1 (0%), steps 1," in err and f"GIF of {BALLET}: done, 1 episodes in" in err
    assert err.rstrip().endswith("steps 60")
    ev.record_gif(agent, BALLET, tmp_path / "quiet.gif", progress=False, max_episode_steps=5)
    assert capsys.readouterr().err == ""


def test_evaluate_shows_progress_over_episodes_and_steps(monkeypatch, capsys):
    pytest.importorskip("gymnasium")
    from chronomem import progress
    from chronomem.rl.evaluate import evaluate

    agent = tiny_agent(CUE)
    result = evaluate(agent, CUE, episodes=3, num_envs=2)
    assert result["episodes"] == 3 and capsys.readouterr().err == ""  # short: no line
    monkeypatch.setattr(progress, "LINE_INTERVAL", 0.0)
    evaluate(agent, CUE, episodes=3, num_envs=2)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(f"evaluating on {CUE}: episode 0/3 (0%), steps 2,")
    assert any(line.startswith(f"evaluating on {CUE}: episode 3/3 (100%),") for line in lines)
    assert lines[-1].startswith(f"evaluating on {CUE}: done, 3 episodes in")
    evaluate(agent, CUE, episodes=3, num_envs=2, progress=False)
    assert capsys.readouterr().err == ""


def test_evaluate_draws_its_actions_from_action_seed_whatever_ran_before():
    pytest.importorskip("gymnasium")
    from chronomem.rl.evaluate import evaluate

    agent = tiny_agent(CUE)

    def after(burn: int, **seeded) -> dict:
        torch.manual_seed(0)
        torch.rand(burn)  # what ran before in the process moved torch's global generator on
        return evaluate(agent, CUE, episodes=32, num_envs=4, progress=False, **seeded)

    assert after(0, action_seed=5) == after(1000, action_seed=5)
    assert after(0) != after(1000)  # the global generator's draws: the counts above could tell them apart
    assert after(0, action_seed=5) != after(0, action_seed=6)
    torch.manual_seed(5)  # the draws of torch's global generator seeded alike (how minigrid-transfer seeded them)
    assert evaluate(agent, CUE, episodes=32, num_envs=4, progress=False) == after(1000, action_seed=5)


def test_evaluate_reports_what_the_heads_read_over_every_step():
    """The means over the steps played of the core's output norm and of the heads' no-gradient shares: an agent
    whose heads' first layers are scaled up passes no gradient at every step, the usual one at few."""
    pytest.importorskip("gymnasium")
    from chronomem.rl.evaluate import evaluate

    agent = tiny_agent(CUE)
    usual = evaluate(agent, CUE, episodes=4, num_envs=2, progress=False, action_seed=0)
    assert usual["core_output_norm"] > 0
    assert 0 <= usual["heads_no_gradient_policy"] < 0.9 and 0 <= usual["heads_no_gradient_value"] < 0.9
    with torch.no_grad():
        agent.actor[0].weight *= 1e4
        agent.critic[0].weight *= 1e4
    dead = evaluate(agent, CUE, episodes=4, num_envs=2, progress=False, action_seed=0)
    assert dead["heads_no_gradient_policy"] > 0.97 and dead["heads_no_gradient_value"] > 0.97
    # the same core on the same observations (CueRecall's do not depend on the actions)
    assert dead["core_output_norm"] == usual["core_output_norm"]
    assert not agent.core._forward_hooks and not agent.actor[1]._forward_hooks
