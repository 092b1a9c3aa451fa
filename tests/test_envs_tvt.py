"""Visual Match and Key-to-Door (``chronomem.envs.tvt``): the rules of the pycolab reference on forced
episodes, and the native vector env equal, step for step, to ``SyncVectorEnv`` over ``TVTEnv`` (same
seeds and actions: observations, rewards, ends, infos, final observations and infos)."""

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

from tests.test_envs_vector import assert_same  # noqa: E402

from chronomem.envs.make import make_vector_env  # noqa: E402
from chronomem.envs.tvt import (  # noqa: E402
    APPLE_CELLS,
    CUE_CELLS,
    MODES,
    PASSIVE_CUE_CELL,
    SQUARE_CELLS,
    SYMBOLS,
    Layout,
    TVTEnv,
    key_to_door_id,
    visual_match_id,
)
from chronomem.envs.tvt_vector import TVTVectorEnv  # noqa: E402

N, S, W, E = 0, 1, 2, 3
COLOUR = SYMBOLS.index("colour 0")


class Climber:
    """Actions that reach every event of both games: north with probability ``north``, else a random
    direction (the squares, the door and the key all lie north of where each phase starts)."""

    def __init__(self, num_envs: int, seed: int, north: float = 0.45):
        self.rng, self.num_envs, self.north = np.random.default_rng(seed), num_envs, north

    def __call__(self) -> np.ndarray:
        return np.where(self.rng.random(self.num_envs) < self.north, N, self.rng.integers(4, size=self.num_envs))


def play(env_id: str, num_envs: int, steps: int, seed: int = 0, **options) -> dict:
    """Both vector envs of ``env_id`` compared at the reset and every step; counts what happened."""
    reference = make_vector_env(env_id, num_envs, vectorization="sync", **options)
    native = make_vector_env(env_id, num_envs, **options)
    assert isinstance(reference, gym.vector.SyncVectorEnv) and isinstance(native.unwrapped, TVTVectorEnv)
    assert native.single_observation_space == reference.single_observation_space
    assert native.observation_space == reference.observation_space and native.action_space == reference.action_space
    assert_same(reference.reset(seed=seed), native.reset(seed=seed), "reset")
    act = Climber(num_envs, seed)
    counts = {"success": 0, "failure": 0, "apples": 0, "truncated": 0}
    for t in range(steps):
        action = act()
        out = reference.step(action)
        assert_same(out, native.step(action), f"step {t}")
        _, reward, terminated, truncated, info = out
        counts["apples"] += int(((reward > 0) & (info["phase"] == 1)).sum())
        counts["truncated"] += int(truncated.sum())
        if terminated.any():
            ended = info["final_info"]["success"][terminated]
            counts["success"] += int(ended.sum())
            counts["failure"] += int((~ended).sum())
    reference.close()
    native.close()
    return counts


@pytest.mark.parametrize("env_id", [visual_match_id("passive", 30), visual_match_id("active", 30, observation="pixels"),
                                    visual_match_id("passive", 30, control=True), key_to_door_id(30),
                                    key_to_door_id(30, control=True), key_to_door_id(30, True, "pixels")])
def test_native_equals_sync_over_tvt_env(env_id):
    counts = play(env_id, 6, 1200, seed=3)
    # every event happened: right and wrong choices (or doors opened and not), apples eaten and regrown
    assert counts["success"] and counts["failure"] and counts["apples"] > 100, counts


def test_native_equals_sync_with_a_time_limit_and_a_reset_mask():
    env_id = key_to_door_id(30)
    counts = play(env_id, 4, 300, seed=1, max_episode_steps=45)
    assert counts["truncated"] and not counts["success"] + counts["failure"], counts  # 45 < 60 steps an episode
    reference, native = make_vector_env(env_id, 3, vectorization="sync"), make_vector_env(env_id, 3)
    assert_same(reference.reset(seed=[4, 5, 6]), native.reset(seed=[4, 5, 6]))
    act = Climber(3, 0)
    for t in range(80):
        if t == 40:
            mask = np.array([True, False, True])
            assert_same(reference.reset(seed=9, options={"reset_mask": mask.copy()}),
                        native.reset(seed=9, options={"reset_mask": mask.copy()}))
        action = act()
        assert_same(reference.step(action), native.step(action), f"step {t}")


def test_cue_cell_puts_every_cue_on_one_wall_cell_and_leaves_the_other_draws():
    counts = play(visual_match_id("passive", 5), 4, 400, seed=2, cue_cell=7)  # single == vector, step for step
    assert counts["success"] and counts["failure"], counts
    fixed, drawn = TVTEnv(distractor=5, cue_cell=7), TVTEnv(distractor=5, cue_cell="any")
    cues = set()
    for seed in range(12):
        obs, _ = fixed.reset(seed=seed)
        drawn.reset(seed=seed)
        assert fixed.layout.cue == 7 and fixed.layout == Layout(**{**vars(drawn.layout), "cue": 7})
        assert obs["grid"][CUE_CELLS[7]][COLOUR + fixed.layout.colours[fixed.layout.target]] == 1
        cues.add(drawn.layout.cue)
    assert len(cues) > 3  # without it the cue moves
    vector = TVTVectorEnv(3, distractor=5, cue_cell=7)
    vector.reset(seed=0)
    assert [layout.cue for layout in vector.layouts] == [7, 7, 7]


@pytest.mark.parametrize("mode", MODES)
def test_the_passive_cue_sits_ahead_of_the_start_and_the_active_one_anywhere(mode):
    """DMLab's passive level shows the colour right in front of the agent, the active one anywhere
    (tvt/dmlab/README.md): passive episodes put it on the top wall's middle, active ones draw it, and
    ``cue_cell="any"`` draws it in the passive mode too; single and vector envs alike."""
    assert CUE_CELLS[PASSIVE_CUE_CELL] == (0, 5)
    default, anywhere = TVTEnv(mode=mode, distractor=5), TVTEnv(mode=mode, distractor=5, cue_cell="any")
    vector = TVTVectorEnv(12, mode=mode, distractor=5)
    vector.reset(seed=list(range(12)))
    cues = {"default": set(), "any": set()}
    for seed in range(12):
        default.reset(seed=seed)
        anywhere.reset(seed=seed)
        assert default.layout == vector.layouts[seed]
        cues["default"].add(default.layout.cue)
        cues["any"].add(anywhere.layout.cue)
        assert default.layout == Layout(**{**vars(anywhere.layout), "cue": default.layout.cue})  # nothing else moves
    assert len(cues["any"]) > 3
    assert cues["default"] == ({PASSIVE_CUE_CELL} if mode == "passive" else cues["any"])
    if mode == "passive":
        obs, _ = default.reset(seed=0)
        assert obs["grid"][0, 5, COLOUR + default.layout.target_colour] == 1


def _layout(**fields) -> Layout:
    base = dict(start=2, apples=tuple(range(10)), apple_reward=10.0, cue=0, colours=(2, 0, 1), target=1, key=4)
    return Layout(**{**base, **fields})


def _walk(env, actions):
    out = None
    for a in actions:
        out = env.step(a)
    return out


def test_a_forced_visual_match_episode_plays_the_reference_rules():
    env = TVTEnv(distractor=30)
    obs, info = env.reset(options={"layout": _layout()})
    assert info == {"phase": 0, "step": 0, "apple_reward": 0.0} and obs["grid"].shape == (7, 11, len(SYMBOLS))
    cue = CUE_CELLS[0]  # the target's colour (colour 0: target square 1 has colours[1] = 0) on the wall
    assert obs["grid"][cue][COLOUR + 0] == 1 and obs["grid"].sum(axis=(0, 1))[COLOUR:].tolist() == [1, 0, 0]
    # explore: walking into the coloured wall leaves the player where it is; 15 steps, then the apples
    _, reward, terminated, _, info = _walk(env, [N] * 15)
    assert reward == 0 and not terminated and info["phase"] == 1
    assert tuple(env._player) == (5, 5)
    # distractor: apple cell 0 is (1, 1); eat it, wait, and it grows back 21 frames after it was eaten
    obs, reward, *_, info = _walk(env, [W, W, W, W, N, N, N, N])  # (5, 1) ... (1, 1): apples on the way pay too
    assert tuple(env._player) == (1, 1) and env._board[APPLE_CELLS[0]] == 0
    assert reward == info["apple_reward"] == 10.0  # the step's reward is all apple
    assert env.step(S)[-1]["apple_reward"] == 0.0
    eaten_at = env._frame - 1
    for _ in range(19):
        env.step(S if env._frame % 2 else N)  # back and forth between (2, 1) and (1, 1)? (2, 1) is a wall
    assert env._frame == eaten_at + 20 and env._board[APPLE_CELLS[0]] == 0
    env.step(E)
    assert env._board[APPLE_CELLS[0]] == 2  # frame eaten + 21 > eaten + 20: back
    _walk(env, [E] * (30 - env._frame))
    assert env._phase == 2 and tuple(env._player) == (5, 5)
    # reward: the middle square (1, 5) has colour 0, the target's: 4 steps north
    obs, reward, terminated, _, info = _walk(env, [N] * 4)
    assert reward == 10.0 and not terminated
    assert all(obs["grid"][cell][COLOUR:].sum() == 0 for cell in SQUARE_CELLS)  # all three hidden
    obs, reward, terminated, _, info = _walk(env, [S] * 11)
    assert terminated and reward == 0 and info["success"] is True and info["step"] == 15 + 30 + 15
    assert info["apples"] == 10.0 * round(info["apples"] / 10.0) and info["apples"] >= 20
    with pytest.raises(RuntimeError, match="reset"):
        env.step(N)


def test_the_wrong_square_pays_nothing_and_the_control_shows_the_colour():
    for control in (False, True):
        env = TVTEnv(distractor=25, control=control)
        env.reset(options={"layout": _layout()})
        obs, *_ = _walk(env, [N] * 40)
        assert env._phase == 2
        assert obs["grid"][0, 5, COLOUR + 0] == int(control)  # the control's colour above the middle square
        _, reward, *_ = _walk(env, [N, N, N, W, W, W, N])  # (1, 2): the left square, colour 2
        assert reward == 0
        _, _, terminated, _, info = _walk(env, [S] * 8)
        assert terminated and info["success"] is False
        with pytest.raises(RuntimeError):
            env.step(N)


def test_key_to_door_needs_the_key():
    for take in (True, False):
        env = TVTEnv(game="key_to_door", mode="passive", distractor=25)
        env.reset(options={"layout": _layout(start=2, key=2)})  # start (4, 5); key (1, 5)
        obs, *_ = _walk(env, [N, N, N])
        assert obs["grid"][0, 5, SYMBOLS.index("indicator")] == 1  # lit the frame the key is taken
        if not take:
            env.reset(options={"layout": _layout(start=2, key=0)})  # key (1, 3): never reached below
            _walk(env, [N, N, N])
        obs, *_ = _walk(env, [S, N] * 18 + [S])  # pace until the reward room
        assert obs["grid"][0, 5, SYMBOLS.index("indicator")] == 0 and env._phase == 2 and env._has_key == take
        _, reward, *_ = _walk(env, [N, N])  # (3, 5) -> (2, 5) -> the door at (1, 5)
        assert reward == (10.0 if take else 0.0) and tuple(env._player) == ((1, 5) if take else (2, 5))
        _, _, terminated, _, info = _walk(env, [S] * 13)
        assert terminated and info["success"] is take


def test_key_to_door_control_draws_the_held_key_on_the_player():
    for observation in ("symbolic", "pixels"):
        seen = {}
        for control in (False, True):
            env = TVTEnv(game="key_to_door", mode="active", distractor=5, control=control, observation=observation)
            obs, _ = env.reset(options={"layout": _layout(start=2, key=2)})  # start (4, 5); key (1, 5)
            views = [obs] + [_walk(env, [a])[0] for a in [N, N, N] + [S] * 12 + [S] * 5 + [N, N]]
            assert env._success  # through the door: the key is spent
            views.append(_walk(env, [S])[0])
            seen[control] = views
        for t, (plain, shown) in enumerate(zip(seen[False], seen[True], strict=True)):
            holding = 3 <= t < 22  # taken at the third step, spent at the door (the 22nd)
            if observation == "symbolic":  # the active view: the player at its centre
                key = shown["grid"][2, 2, SYMBOLS.index("key")]
                assert key == holding, t
                rest = shown["grid"].copy()
                rest[2, 2, SYMBOLS.index("key")] = plain["grid"][2, 2, SYMBOLS.index("key")]
                assert np.array_equal(rest, plain["grid"]), t  # nothing else differs
            else:
                assert (not np.array_equal(shown["image"][2, 2], plain["image"][2, 2])) == holding, t


def test_the_active_view_is_the_window_around_the_player():
    active, passive = TVTEnv(mode="active"), TVTEnv(mode="passive")
    for env in (active, passive):
        env.reset(options={"layout": _layout(start=0)})
    a, p = active.step(E)[0]["grid"], passive.step(E)[0]["grid"]
    r, c = active._player
    padded = np.pad(p, ((2, 2), (2, 2), (0, 0)))
    assert a.shape == (5, 5, len(SYMBOLS)) and np.array_equal(a, padded[r : r + 5, c : c + 5])
    assert a[2, 2, SYMBOLS.index("player")] == 1


def test_layouts_drive_a_vector_row_like_the_single_env():
    layouts = [_layout(), None, _layout(colours=(0, 1, 2), target=2, cue=5)]
    envs = TVTVectorEnv(3, distractor=25)
    obs, _ = envs.reset(seed=0, options={"layouts": layouts})
    single = TVTEnv(distractor=25)
    single.reset(seed=1)  # the None row samples as a single env seeded with seed + 1
    assert envs.layouts[1] == single.layout and envs.layouts[0] == layouts[0]
    act = Climber(3, 5)
    singles = [TVTEnv(distractor=25) for _ in range(3)]
    for env, layout in zip(singles, [layouts[0], single.layout, layouts[2]], strict=True):
        env.reset(options={"layout": layout})
    for t in range(55):  # one whole episode
        action = act()
        obs, reward, terminated, _, info = envs.step(action)
        for i, env in enumerate(singles):
            want, want_reward, want_end, _, want_info = env.step(int(action[i]))
            seen = info["final_obs"][i] if terminated[i] else {k: v[i] for k, v in obs.items()}
            assert_same(want, seen, f"step {t} row {i}")
            assert want_reward == reward[i] and want_end == terminated[i]
            if terminated[i]:
                assert bool(info["final_info"]["success"][i]) == want_info["success"]


def test_env_checker_and_registered_ids():
    from gymnasium.utils.env_checker import check_env

    for env_id in (visual_match_id("passive", 90), visual_match_id("active", 250, True, "pixels"), key_to_door_id(90)):
        env = gym.make(env_id)
        check_env(env.unwrapped, skip_render_check=False)
        obs, _ = env.reset(seed=0)
        length = 0
        while True:
            length += 1
            *_, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                break
        assert length == 15 + env.unwrapped.lengths[1] + 15
    assert gym.make(visual_match_id(), distractor=7).unwrapped.lengths == (15, 7, 15)


@pytest.mark.parametrize("kwargs, match", [
    ({"game": "chess"}, "game"), ({"mode": "lazy"}, "mode"), ({"observation": "rgb"}, "observation"),
    ({"distractor": 0}, "distractor"), ({"num_apples": 23}, "num_apples"), ({"apple_rewards": ()}, "apple_rewards"),
    ({"control": 1}, "control"), ({"game": "key_to_door", "control": "yes"}, "control"),
    ({"cue_cell": 26}, "cue_cell"), ({"cue_cell": 1.0}, "cue_cell"), ({"cue_cell": "front"}, "cue_cell"),
    ({"game": "key_to_door", "mode": "active", "cue_cell": "any"}, "cue_cell"),
    ({"game": "key_to_door", "cue_cell": 0}, "cue_cell"),
])
def test_bad_construction_names_the_argument(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        TVTEnv(**kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        TVTVectorEnv(2, **kwargs)


def test_bad_layouts_and_actions_name_the_argument():
    with pytest.raises(ValueError, match="options\\['layout'\\]"):
        TVTEnv().reset(options={"layout": _layout(apples=(1, 2))})
    with pytest.raises(ValueError, match="options\\['layouts'\\]\\[1\\]"):
        TVTVectorEnv(2).reset(options={"layouts": [None, _layout(colours=(0, 0, 1))]})
    env = TVTEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action"):
        env.step(4)
    envs = TVTVectorEnv(2)
    envs.reset(seed=0)
    with pytest.raises(ValueError, match="actions"):
        envs.step(np.array([0, 5]))


def test_importing_chronomem_envs_registers_every_chronomem_id():
    import subprocess
    import sys

    code = ("import gymnasium as gym\nimport chronomem.envs\n"
            "for env_id in ('chronomem/Ballet-2_delay16-symbolic-v0', 'chronomem/CueRecall-v0', "
            "'chronomem/VisualMatch-passive-d90-v0', 'chronomem/KeyToDoor-d30-pixels-v0'):\n"
            "    gym.make(env_id).reset(seed=0)\nprint('made')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "made"
