"""Decision Transformer and DT + TLB (chronomem.dt), their data (chronomem.tasks.trajectories), the MinAtar
envs and the decision-transformer experiment."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
import torch

from chronomem.dt import DecisionTransformer, dt_tokens
from chronomem.registry import build_backbone
from chronomem.tasks.trajectories import Trajectories, read_dqn_replay, replay_file

CORES = {"transformer": dict(positions=False), "tlb": dict(chunk_size=6, num_state=2, self_per_cross=1)}
SHAPE = (3, 10, 10)


def model(core: str, context: int = 4, actions: int = 5, seed: int = 0) -> DecisionTransformer:
    torch.manual_seed(seed)
    backbone = build_backbone(core, dim=16, depth=1, num_heads=2, causal=True, **CORES[core])
    return DecisionTransformer(backbone, actions, SHAPE, context, max_timestep=50, dropout=0.0).eval()


def batch(b: int = 2, t: int = 4, actions: int = 5, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    states = torch.randint(0, 2, (b, t, *SHAPE), generator=g, dtype=torch.uint8)
    return (states, torch.randint(0, actions, (b, t), generator=g), torch.rand(b, t, generator=g) * 10,
            torch.randint(0, 40, (b,), generator=g))


# ---- the model ------------------------------------------------------------------------------------


def test_tokens_interleave_return_state_action_and_acting_drops_the_last_action():
    r, s, a = (torch.full((1, 2, 1), v) for v in (1.0, 2.0, 3.0))
    assert dt_tokens(r, s, a).flatten().tolist() == [1, 2, 3, 1, 2, 3]
    assert dt_tokens(r, s, a[:, :1]).flatten().tolist() == [1, 2, 3, 1, 2]
    assert dt_tokens(r[:, :1], s[:, :1], None).flatten().tolist() == [1, 2]


@pytest.mark.parametrize("core", sorted(CORES))
def test_an_action_is_predicted_from_the_past_only(core):
    dt = model(core)
    states, actions, returns, timestep = batch()
    logits = dt(states, actions, returns, timestep)
    for t in range(4):  # change everything after s_t, a_t included: the logits up to t stay
        s2, a2, r2 = states.clone(), actions.clone(), returns.clone()
        a2[:, t:] = (a2[:, t:] + 1) % 5
        s2[:, t + 1:] = 1 - s2[:, t + 1:]
        r2[:, t + 1:] += 3.0
        changed = dt(s2, a2, r2, timestep)
        torch.testing.assert_close(changed[:, : t + 1], logits[:, : t + 1])
        if t < 3:
            assert not torch.allclose(changed[:, t + 1:], logits[:, t + 1:])


@pytest.mark.parametrize("core", sorted(CORES))
def test_acting_without_the_last_action_gives_the_training_logits(core):
    dt = model(core)
    states, actions, returns, timestep = batch()
    full = dt(states, actions, returns, timestep)
    for t in range(1, 5):
        acting = dt(states[:, :t], actions[:, : t - 1], returns[:, :t], timestep)
        torch.testing.assert_close(acting[:, -1], full[:, t - 1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("core", sorted(CORES))
def test_right_padding_changes_no_valid_step_and_the_loss_skips_it(core):
    dt = model(core)
    states, actions, returns, timestep = batch()
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    noisy_states, noisy_actions = states.clone(), actions.clone()
    noisy_states[1, 2:] = 1 - noisy_states[1, 2:]
    noisy_actions[1, 2:] = (noisy_actions[1, 2:] + 2) % 5
    a = dt(states, actions, returns, timestep, mask)
    b = dt(noisy_states, noisy_actions, returns, timestep, mask)
    torch.testing.assert_close(a[mask], b[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dt.loss(states, actions, returns, timestep, mask),
                               dt.loss(noisy_states, noisy_actions, returns, timestep, mask))
    alone = dt(states[1:, :2], actions[1:, :2], returns[1:, :2], timestep[1:])  # the short row by itself
    torch.testing.assert_close(a[1, :2], alone[0], atol=1e-5, rtol=1e-5)


def test_the_loss_is_the_mean_cross_entropy_of_the_valid_steps_and_reaches_every_parameter():
    dt = model("tlb").train()
    states, actions, returns, timestep = batch()
    mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    logits = dt(states, actions, returns, timestep, mask)
    expected = torch.nn.functional.cross_entropy(logits[mask], actions[mask])
    loss = dt.loss(states, actions, returns, timestep, mask)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    readout = {"core.norm_state.weight", "core.norm_state.bias"}  # TLB's pooled readout: not a token output's
    missing = [n for n, p in dt.named_parameters() if p.grad is None and n not in readout]
    assert not missing, missing


def test_the_timestep_embedding_is_the_windows_first_step_and_larger_ones_share_the_last():
    dt = model("transformer")
    with torch.no_grad():
        dt.timestep.normal_()
    states, actions, returns, _ = batch(b=1)
    out = [dt(states, actions, returns, torch.tensor([t])) for t in (3, 50, 80)]
    assert not torch.allclose(out[0], out[1])
    torch.testing.assert_close(out[1], out[2])  # max_timestep = 50


def test_decay_applies_to_the_weights_of_linear_maps_and_convolutions_only():
    dt = model("transformer")
    decay, keep = dt.param_groups(0.1)
    decayed = {id(p) for p in decay["params"]}
    for module in dt.modules():
        for name, p in module.named_parameters(recurse=False):
            is_weight = isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)) and name == "weight"
            assert (id(p) in decayed) == is_weight, (type(module).__name__, name)
    assert decay["weight_decay"] == 0.1 and keep["weight_decay"] == 0.0
    assert len(decay["params"]) + len(keep["params"]) == len(list(dt.parameters()))


def test_bad_inputs_name_what_they_expected():
    dt = model("transformer")
    states, actions, returns, timestep = batch(t=4)
    with pytest.raises(ValueError, match="at most context=4"):
        dt(*batch(t=5))
    with pytest.raises(ValueError, match=r"actions must be \[B, T\] or \[B, T - 1\]"):
        dt(states, actions[:, :2], returns, timestep)
    with pytest.raises(ValueError, match="states must be"):
        dt(states[..., :5], actions, returns, timestep)
    with pytest.raises(ValueError, match="must be causal"):
        DecisionTransformer(build_backbone("transformer", dim=16, depth=1, num_heads=2, causal=False), 3, SHAPE, 4, 10)


# ---- the data -------------------------------------------------------------------------------------


def episodes_of(lengths, seed: int = 0, shape=(1, 2, 2)):
    g = np.random.default_rng(seed)
    return [(g.integers(0, 255, (n, *shape), dtype=np.uint8), g.integers(0, 3, n), g.integers(0, 3, n).astype(float))
            for n in lengths]


def test_returns_to_go_and_steps_equal_a_loop_over_each_episode():
    data = Trajectories.from_episodes(episodes_of([3, 1, 5]))
    rtg, steps = data.returns_to_go(), data.steps()
    start = 0
    for end in data.ends:
        for i in range(start, end):
            assert rtg[i] == pytest.approx(data.rewards[i:end].sum())
            assert steps[i] == i - start
        start = end
    assert data.episode_returns().tolist() == pytest.approx([rtg[0], rtg[3], rtg[4]])


def test_windows_stay_in_one_episode_end_at_its_end_at_the_latest_and_pad_short_ones():
    data = Trajectories.from_episodes(episodes_of([3, 8, 2]))
    starts, rtg, steps = data.starts(), data.returns_to_go(), data.steps()
    w = data.windows(400, 4, np.random.default_rng(0))
    flat_states = data.states.reshape(len(data), -1)
    for k in range(400):
        valid = int(w.mask[k].sum())
        assert w.mask[k].tolist() == [True] * valid + [False] * (4 - valid)
        # locate the window's first state in the data, then check every valid step against it
        first = int(np.flatnonzero((flat_states == w.states[k, 0].numpy().reshape(-1)).all(1))[0])
        episode = int(np.searchsorted(data.ends, first, side="right"))
        end = data.ends[episode]
        assert valid == min(4, end - starts[episode]) and first + valid <= end
        assert w.timestep[k] == steps[first]
        assert w.actions[k, :valid].tolist() == data.actions[first:first + valid].tolist()
        assert w.returns[k, :valid].tolist() == pytest.approx(rtg[first:first + valid].tolist())
        assert (w.actions[k, valid:] == 0).all() and (w.returns[k, valid:] == 0).all()
    assert (w.mask.sum(1) == 2).any() and (w.mask.sum(1) == 4).any()


def test_trajectories_round_trip_through_npz_and_refuse_bad_arrays(tmp_path):
    data = Trajectories.from_episodes(episodes_of([2, 3]))
    data.save(tmp_path / "d.npz", command="chronomem run decision-transformer")
    back = Trajectories.load(tmp_path / "d.npz")
    for name in ("states", "actions", "rewards", "ends"):
        assert np.array_equal(getattr(back, name), getattr(data, name))
    with pytest.raises(ValueError, match="ends must be"):
        Trajectories(data.states, data.actions, data.rewards, np.array([2, 4]))
    with pytest.raises(ValueError, match="states must be uint8"):
        Trajectories(data.states.astype(np.float32), data.actions, data.rewards, data.ends)


def write_replay(directory, checkpoint: int, terminals: list[int], seed: int = 0, added: int | None = None):
    """A Dopamine replay checkpoint in its format: np.save of each array into a gzip stream."""
    g = np.random.default_rng(seed)
    n = len(terminals)
    arrays = {"observation": g.integers(0, 255, (n, 84, 84), dtype=np.uint8),
              "action": g.integers(0, 4, n).astype(np.int32),
              "reward": g.choice([-1.0, 0.0, 1.0], n).astype(np.float32),
              "terminal": np.array(terminals, dtype=np.uint8), "add_count": np.array(n if added is None else added)}
    directory.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        with gzip.GzipFile(replay_file(directory, name, checkpoint), "wb") as f:
            np.save(f, array, allow_pickle=False)
    return arrays


def test_dqn_replay_is_read_as_whole_episodes_of_four_frame_stacks(tmp_path):
    arrays = write_replay(tmp_path, 0, [0, 0, 1, 0, 1, 0, 0, 0, 1, 0])  # episodes end at 3, 5 and 9; a tail
    assert replay_file(tmp_path, "observation", 0).name == "$store$_observation_ckpt.0.gz"
    data = read_dqn_replay(tmp_path, transitions=9, buffers=1, episodes_per_visit=3)
    assert data.ends.tolist() == [3, 5, 9] and data.states.shape == (9, 4, 84, 84)
    frames = arrays["observation"]
    assert (data.states[0, :3] == 0).all() and (data.states[0, 3] == frames[0]).all()  # blank before the start
    assert (data.states[4, 2:] == frames[3:5]).all() and (data.states[4, :2] == 0).all()  # episode 2 from index 3
    assert (data.states[8] == frames[5:9]).all()
    assert data.actions.tolist() == arrays["action"][:9].tolist()
    assert data.rewards.tolist() == arrays["reward"][:9].tolist()


def test_dqn_replay_reads_only_the_first_indices_and_says_when_too_little_is_there(tmp_path):
    write_replay(tmp_path, 0, [0, 1, 0, 1, 0, 1])
    data = read_dqn_replay(tmp_path, transitions=2, buffers=1, capacity=4, episodes_per_visit=2)
    assert data.ends.tolist() == [2, 4]  # the third episode lies past the capacity read
    with pytest.raises(ValueError, match="only 4 transitions"):
        read_dqn_replay(tmp_path, transitions=5, buffers=1, capacity=4, episodes_per_visit=2, max_visits=20)
    with pytest.raises(FileNotFoundError, match="DQN-Replay file not found"):
        read_dqn_replay(tmp_path / "missing", transitions=1, buffers=1)


# ---- the MinAtar envs -----------------------------------------------------------------------------


def test_minatar_envs_follow_the_gymnasium_api_and_their_seeds():
    pytest.importorskip("minatar")
    from gymnasium.utils.env_checker import check_env

    from chronomem.envs.make import make_env
    from chronomem.envs.minatar import minatar_id

    env = make_env(minatar_id("Seaquest"))
    check_env(env.unwrapped, skip_render_check=True)
    assert env.observation_space["grid"].shape == (10, 10, 10) and env.action_space.n == 6

    def play(seed):
        e = make_env(minatar_id("Breakout"))
        obs, _ = e.reset(seed=seed)
        frames = [obs["grid"]]
        for t in range(60):
            obs, reward, terminated, truncated, _ = e.step(t % 3)
            frames.append(obs["grid"])
            if terminated:
                obs, _ = e.reset()
                frames.append(obs["grid"])
        return np.stack(frames)

    assert np.array_equal(play(3), play(3)) and not np.array_equal(play(3), play(4))
    with pytest.raises(ValueError, match="game must be one of"):
        minatar_id("Pong")


# ---- the experiment -------------------------------------------------------------------------------


def test_the_learning_rate_warms_up_by_tokens_then_decays_to_its_floor():
    from chronomem.experiments.decision_transformer import SCALES, lr_factor

    s = SCALES["quick"]
    assert lr_factor(s.warmup_tokens // 2, s, 10**6) == pytest.approx(0.5)
    assert lr_factor(s.warmup_tokens, s, 10**6) == pytest.approx(1.0)
    middle = s.warmup_tokens + (10**6 - s.warmup_tokens) // 2
    assert lr_factor(middle, s, 10**6) == pytest.approx(0.5, abs=1e-3)
    assert lr_factor(10**7, s, 10**6) == s.final_lr


def test_a_smoke_run_records_its_data_once_and_gives_the_same_table_twice(tmp_path, monkeypatch):
    pytest.importorskip("minatar")
    from chronomem.experiments.base import run_experiment
    from chronomem.registry import get_experiment

    monkeypatch.setenv("CHRONOMEM_CACHE", str(tmp_path / "cache"))
    experiment = get_experiment("decision-transformer")
    first = run_experiment(experiment, "smoke", tmp_path / "a", seed=0, progress=False)
    cached = sorted((tmp_path / "cache" / "offline").glob("*.npz"))
    assert len(cached) == 1 and not list((tmp_path / "cache" / "offline").glob("*partial*"))
    meta = json.loads(str(np.load(cached[0])["meta_settings"]))
    assert meta["game"] == "Breakout" and meta["transitions"] == 300
    second = run_experiment(experiment, "smoke", tmp_path / "b", seed=0, progress=False)
    assert first["results"] == second["results"] and set(first["results"]) == {"dt", "dt-tlb"}
    assert set(first["results"]["dt"]) == {"MinAtar Breakout"}
    saved = json.loads((tmp_path / "a" / "results.json").read_text())
    assert saved["extra"]["datasets"]["MinAtar Breakout"]["transitions"] >= 300
    assert not math.isnan(saved["extra"]["random_return"]["MinAtar Breakout"])


def test_the_paper_scale_plays_atari_as_dt_does_where_ale_is_installed():
    pytest.importorskip("ale_py")  # not in chronomem's extras: skipped without it (docs/offline_rl.md)
    pytest.importorskip("cv2")
    from chronomem.experiments.decision_transformer import make_atari_env, observation_states, play_dt

    envs = make_atari_env("ALE/Breakout-v5", 2)
    try:
        obs, _ = envs.reset(seed=[0, 1])
        states = observation_states(obs)
        assert states.shape == (2, 4, 84, 84) and states.dtype == torch.uint8  # 4 grey 84 x 84 frames
    finally:
        envs.close()
    torch.manual_seed(0)
    core = build_backbone("tlb", dim=16, depth=1, num_heads=2, causal=True, chunk_size=6, num_state=2,
                          self_per_cross=1)
    dt = DecisionTransformer(core, 4, (4, 84, 84), context=5, max_timestep=100)
    scores = play_dt(dt, "ALE/Breakout-v5", 90.0, 2, seed=0, max_steps=30)
    assert len(scores) == 2 and all(s >= 0 for s in scores)
