"""The Ballet world (``chronomem.envs.ballet``): the rules of App. B.1 / the reference environment and
the Gymnasium API."""

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
from gymnasium.utils.env_checker import check_env  # noqa: E402

from chronomem.envs.ballet import BalletEnv  # noqa: E402
from chronomem.envs.ballet_world import (  # noqa: E402
    AGENT_START,
    CLOCK_RGB,
    COLOUR_NAMES,
    COLOURS,
    DANCE_NAMES,
    DANCE_OFFSETS,
    DANCER_CELLS,
    DANCES,
    DIRECTIONS,
    FAILURE_RGB,
    GYM_ID,
    LEVELS,
    SHAPES,
    SUCCESS_RGB,
    VOCAB,
    WATCH,
    Layout,
    shape_mask,
)

# The direction that leads from the centre straight to each dancer cell (3 steps away).
TOWARDS = {
    (r, c): int(np.flatnonzero((DIRECTIONS == np.sign([r - 5, c - 5])).all(1))[0]) for r, c in DANCER_CELLS
}


def run_to_cue(env, seed=0, action=0, **reset_kw):
    """Reset and step with ``action`` until the instruction changes; returns (observations, steps)."""
    obs, info = env.reset(seed=seed, **reset_kw)
    observations = [obs]
    while obs["instruction"] == WATCH:
        obs, reward, terminated, truncated, info = env.step(action)
        assert reward == 0 and not terminated and not truncated
        observations.append(obs)
    return observations, info["step"]


# ---- Listing 1 -------------------------------------------------------------------------------


def test_dances_of_listing_1():
    assert len(DANCES) == 13 and VOCAB == ("watch", *DANCE_NAMES)
    for name, moves in DANCES.items():
        assert len(moves) == 16 and all(0 <= m < 8 for m in moves), name
        path = np.cumsum(DIRECTIONS[moves], axis=0)
        assert (path[-1] == 0).all(), f"{name} does not return to its start"
        assert np.abs(path).max() <= 1, f"{name} leaves its 3x3 block"
    assert (DANCE_OFFSETS[:, 0] == 0).all() and (DANCE_OFFSETS[:, -1] == 0).all()
    # no two dances trace the same path, and none is given away by a single step (paper Sec. 3.1)
    assert len({tuple(map(tuple, o)) for o in DANCE_OFFSETS}) == 13
    for m in range(1, 16):
        assert len({tuple(o) for o in DANCE_OFFSETS[:, m]}) < 13
    # directions clockwise from up
    assert DIRECTIONS[[0, 2, 4, 6]].tolist() == [[-1, 0], [0, 1], [1, 0], [0, -1]]


# ---- rules -------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_cue_step(level):
    env = BalletEnv(level, observation="symbolic")
    n, d = env.num_dancers, env.delay
    observations, step = run_to_cue(env, seed=3)
    assert step == n * (d + 15) == env.cue_step
    assert observations[-1]["instruction"] == 1 + env.layout.dances[env.layout.target]
    assert all(o["instruction"] == WATCH for o in observations[:-1])


def test_dancer_timing_matches_reference_update_order():
    """Dancer i makes its moves at steps i*(d+15) + 0..15 (the first already in the reset frame)."""
    env = BalletEnv("4_delay16", observation="symbolic")
    env.reset(seed=1)
    d = env.delay
    trace = [env._positions.copy()]
    for _ in range(env.cue_step):
        env.step(0)
        trace.append(env._positions.copy())
    trace = np.stack(trace)  # [L, n, 2]
    home = np.array([DANCER_CELLS[c] for c in env.layout.cells])
    for i, dance in enumerate(env.layout.dances):
        for t in range(len(trace)):
            m = np.clip(t - i * (d + 15) + 1, 0, 16)
            assert (trace[t, i] == home[i] + DANCE_OFFSETS[dance, m]).all(), (i, t)


def test_actions_ignored_while_dances_run():
    env_a, env_b = BalletEnv("2_delay16", "symbolic"), BalletEnv("2_delay16", "symbolic")
    obs_a, _ = env_a.reset(seed=5)
    obs_b, _ = env_b.reset(seed=5)
    rng = np.random.default_rng(0)
    for _ in range(env_a.cue_step):  # up to and including the cue step
        obs_a, *_ = env_a.step(int(rng.integers(8)))
        obs_b, *_ = env_b.step(0)
        assert (obs_a["grid"] == obs_b["grid"]).all() and obs_a["instruction"] == obs_b["instruction"]
        assert tuple(env_a._agent) == AGENT_START
    env_a.step(0)  # the first action after the cue moves the agent
    assert tuple(env_a._agent) == (4, 5)


@pytest.mark.parametrize("seed", [0, 1])
def test_reward_only_for_target_and_contact_ends_episode(seed):
    env = BalletEnv("8_delay16", observation="symbolic")
    hits = []
    for i in range(8):
        run_to_cue(env, seed=seed)
        r, c = DANCER_CELLS[env.layout.cells[i]]
        for k in range(3):
            obs, reward, terminated, truncated, info = env.step(TOWARDS[(r, c)])
            assert terminated == (k == 2) and not truncated
        assert reward == (1.0 if i == env.layout.target else 0.0)
        hits.append(reward)
        with pytest.raises(RuntimeError, match="reset"):
            env.step(0)
    assert sum(hits) == 1


def test_time_limit():
    for level, limit in (("2_delay16", 320), ("2_delay48", 1024)):
        env = BalletEnv(level, observation="symbolic")
        assert env.max_steps == limit
        run_to_cue(env, seed=0)
        step, truncated = env.cue_step, False
        while not truncated:  # pace up and down next to the centre, touching nobody
            obs, reward, terminated, truncated, info = env.step(0 if step % 2 == env.cue_step % 2 else 4)
            step += 1
            assert reward == 0 and not terminated
        # pycolab's frame is 0 on the reset frame and the episode ends at frame >= max_steps:
        # exactly max_steps actions (320 / 1024)
        assert step == info["step"] == limit
    env = BalletEnv("2_delay16", observation="symbolic", max_steps=10)
    env.reset(seed=0)
    out = [env.step(0) for _ in range(10)]
    assert [o[3] for o in out] == [False] * 9 + [True]
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)


def test_walls_block_the_agent():
    env = BalletEnv("2_delay16", observation="symbolic")
    layout = Layout(cells=(0, 7), dances=(0, 1), shapes=(0, 1), colours=(0, 1), target=0)  # NW and SE corners
    run_to_cue(env, options={"layout": layout})
    for _ in range(7):  # the cue step (its action ignored) has passed: up four cells, then into the wall
        env.step(0)
    assert tuple(env._agent) == (1, 5)
    env.step(1)  # north-east into the wall: no move at all (not a slide)
    assert tuple(env._agent) == (1, 5)


# ---- looks -------------------------------------------------------------------------------------


def test_shapes_and_colours_distinct_and_unique_per_episode():
    masks = [shape_mask(s) for s in SHAPES]
    assert len(SHAPES) == 15 and len(COLOURS) == 19
    assert len({m.tobytes() for m in masks}) == 15 and all(0 < m.sum() < 81 for m in masks)
    assert len(set(COLOURS.values())) == 19
    env = BalletEnv("8_delay16", observation="pixels")
    for seed in range(30):
        env.reset(seed=seed)
        lay = env.layout
        for values in (lay.cells, lay.dances, lay.shapes, lay.colours):
            assert len(set(values)) == 8
    with pytest.raises(ValueError, match="distinct"):
        Layout(cells=(0, 1), dances=(0, 1), shapes=(3, 3), colours=(0, 1), target=0)


@pytest.mark.parametrize("direction, success", [(0, True), (4, False)])
def test_render_shows_the_clock_the_cue_and_the_outcome(direction, success):
    env = BalletEnv("2_delay16", observation="symbolic", render_mode="rgb_array")
    layout = Layout(cells=(1, 6), dances=(2, 3), shapes=(2, 6), colours=(4, 9), target=0)  # target (2,5)
    env.reset(seed=0, options={"layout": layout})
    sprite = env._pixels[3 + layout.target]
    bars = []
    for _ in range(env.cue_step - 1):  # the dances: a bar fills up towards the cue
        env.step(0)
        strip = env.render()[99:]
        assert set(map(tuple, strip.reshape(-1, 3).tolist())) <= {(0, 0, 0), CLOCK_RGB}  # no sprite yet
        bars.append(int(strip[4].any(-1).sum()))
    assert bars == sorted(bars) and 0 < bars[0] < bars[-1] < 99
    env.step(0)  # the cue: the target's sprite in the first cell, on black
    strip = env.render()[99:]
    assert env._phase == "choice" and (strip[:, :9] == sprite).all() and not strip[:, 9:].any()
    reward = terminated = 0
    while not terminated:  # straight up onto the target, or down onto the other dancer at (8, 5)
        _, reward, terminated, truncated, _ = env.step(direction)
    assert reward == float(success)
    strip = env.render()[99:]
    background = strip[:, 9:].reshape(-1, 3)
    assert (background == (SUCCESS_RGB if success else FAILURE_RGB)).all()
    drawn = sprite.any(-1)
    assert (strip[:, :9][drawn] == sprite[drawn]).all()


def test_pixels_egocentric():
    env = BalletEnv("2_delay16", observation="pixels", render_mode="rgb_array")
    layout = Layout(cells=(1, 6), dances=(2, 3), shapes=(2, 6), colours=(4, 9), target=1)  # (2,5) and (8,5)
    obs, _ = env.reset(seed=0, options={"layout": layout})
    image = obs["image"]
    assert image.shape == (99, 99, 3) and image.dtype == np.uint8
    centre = np.s_[45:54, 45:54]
    assert (image[centre] == 255).all()  # the agent: a white square at the centre
    assert (image[:9, :9] == 40).all()  # the wall's corner (at reset the view is the whole board)
    assert (image == env.render()[:99]).all()  # the board; the status strip below it is for viewers
    for _ in range(env.cue_step + 2):  # after the cue the agent walks up twice: the view follows it
        obs, *_ = env.step(0)
    image = obs["image"]
    assert tuple(env._agent) == (3, 5)
    assert (image[centre] == 255).all()
    assert (image[:18] == 0).all()  # two rows beyond the top wall are floor
    assert (image[18:27] == 40).all()  # the top wall, two cells higher in the view
    # the dancer at (2,5), one cell above the agent, in its shape and colour
    want = shape_mask("plus")[..., None] * np.array(COLOURS[COLOUR_NAMES[4]], np.uint8)
    assert (image[36:45, 45:54] == want).all()
    obs, reward, terminated, *_ = env.step(0)  # onto the (wrong) dancer: drawn over the agent
    assert terminated and reward == 0.0
    assert (obs["image"][centre] == want).all()


# ---- Gymnasium ---------------------------------------------------------------------------------


@pytest.mark.parametrize("observation", ["pixels", "symbolic"])
def test_check_env(observation):
    check_env(BalletEnv("4_delay16", observation=observation), skip_render_check=True)
    check_env(gym.make(GYM_ID, level="2_delay16", observation=observation, render_mode="rgb_array").unwrapped)


def test_gymnasium_make_and_spaces():
    env = gym.make(GYM_ID, level="2_delay48", observation="symbolic")
    obs, info = env.reset(seed=0)
    assert env.observation_space["grid"].shape == (11, 11, 36) and env.action_space.n == 8
    assert env.observation_space["instruction"].n == 14 and obs in env.observation_space
    assert info["cue_step"] == 2 * (48 + 15)


def test_seeds_reproducible():
    def episode(env, seed):
        observations, _ = run_to_cue(env, seed=seed, action=3)
        return env.layout, np.stack([o["grid"] for o in observations])

    env = BalletEnv("4_delay16", observation="symbolic")
    lay_a, obs_a = episode(env, 7)
    lay_b, obs_b = episode(env, 7)
    assert lay_a == lay_b and (obs_a == obs_b).all()
    assert episode(env, 8)[0] != lay_a
    env = BalletEnv("4_delay16", observation="symbolic", seed=7)
    env.reset()
    assert env.layout == lay_a
    env.reset()  # later resets continue the stream
    assert env.layout != lay_a


def test_bad_arguments():
    for bad in ("3_delay16", "2_delay20", "2-delay16", "", 8):
        with pytest.raises(ValueError, match="8_delay48"):
            BalletEnv(bad)
    with pytest.raises(ValueError, match="observation"):
        BalletEnv("2_delay16", observation="rgb")
    env = BalletEnv("2_delay16", observation="symbolic")
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action"):
        env.step(8)
    with pytest.raises(ValueError, match="layout"):
        env.reset(options={"layout": Layout((0,), (0,), (0,), (0,), 0)})
