"""MiniGrid's view computed from the grid's cells (``chronomem.envs.wrappers.agent_view``, what
``make_env`` installs by default) against MiniGrid's own ``gen_obs`` (slice, rotate, occlude, encode):
the same arrays at every step of random episodes in envs with doors, keys, lava, several rooms and
BabyAI's missions, with a smaller view, with see-through walls, and while carrying."""

import copy
import pickle

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
pytest.importorskip("minigrid")

from minigrid.core.world_object import Ball, Key, Wall  # noqa: E402
from minigrid.minigrid_env import MiniGridEnv  # noqa: E402

from chronomem.envs import wrappers  # noqa: E402
from chronomem.envs.make import make_env  # noqa: E402
from chronomem.envs.wrappers import agent_view, fast_view  # noqa: E402

CASES = [("MiniGrid-DoorKey-5x5-v0", {}), ("MiniGrid-DoorKey-8x8-v0", {"agent_view_size": 5}),
         ("MiniGrid-MemoryS7-v0", {}), ("MiniGrid-LavaCrossingS9N1-v0", {}), ("MiniGrid-FourRooms-v0", {}),
         ("MiniGrid-KeyCorridorS3R3-v0", {}), ("BabyAI-GoToLocal-v0", {}),
         ("MiniGrid-DoorKey-8x8-v0", {"see_through_walls": True})]


@pytest.mark.parametrize("env_id, options", CASES)
def test_agent_view_equals_minigrids_view_at_every_step(env_id, options):
    """Random actions (turns, moves, pick-ups, toggles) from 3 seeds: the view equals MiniGrid's at
    every step, and again with the agent carrying something (the agent's own cell shows it)."""
    env = gym.make(env_id, **options)
    base, rng, steps = env.unwrapped, np.random.default_rng(0), 0
    for seed in range(3):
        env.reset(seed=seed)
        for _ in range(80):
            expected = MiniGridEnv.gen_obs(base)["image"]
            np.testing.assert_array_equal(agent_view(base), expected)
            steps += 1
            _, _, terminated, truncated, _ = env.step(int(rng.integers(base.action_space.n)))
            if terminated or truncated:
                break
    base.carrying = Ball("blue")
    np.testing.assert_array_equal(agent_view(base), MiniGridEnv.gen_obs(base)["image"])
    assert steps >= 30
    env.close()


def test_every_direction_and_the_grids_edge():
    """The agent in a corner facing each way (most of its view beyond the grid: walls), and next to a
    closed door and a key: equal to MiniGrid's; the constant wall code is the wall's encoding."""
    env = gym.make("MiniGrid-DoorKey-5x5-v0")
    env.reset(seed=4)
    base = env.unwrapped
    base.grid.set(2, 2, Key("red"))
    for position in [(1, 1), (3, 3), (1, 3)]:
        for direction in range(4):
            base.agent_pos, base.agent_dir = np.array(position), direction
            np.testing.assert_array_equal(agent_view(base), MiniGridEnv.gen_obs(base)["image"])
    assert wrappers._WALL_CODE == Wall().encode()
    env.close()


def test_make_env_plays_the_same_episodes_with_either_view():
    """``make_env(view="fast")`` (the default) and ``view="minigrid"``: the same observations, rewards
    and ends, step for step, for the same seed and actions; an env class with its own ``gen_obs`` keeps
    it; an unknown view is refused."""
    fast, reference = make_env("MiniGrid-DoorKey-5x5-v0"), make_env("MiniGrid-DoorKey-5x5-v0", view="minigrid")
    assert fast.unwrapped.gen_obs.func is wrappers._fast_gen_obs
    assert "gen_obs" not in vars(reference.unwrapped)
    rng = np.random.default_rng(1)
    for seed in range(2):
        outs = [env.reset(seed=seed)[0] for env in (fast, reference)]
        for _ in range(120):
            for key in outs[1]:
                np.testing.assert_array_equal(outs[0][key], outs[1][key])
            action = int(rng.integers(7))
            a, b = fast.step(action), reference.step(action)
            assert a[1:4] == b[1:4]
            outs = [a[0], b[0]]
            if a[2] or a[3]:
                break

    class OwnView(type(reference.unwrapped)):
        def gen_obs(self):
            return super().gen_obs()

    env = OwnView(size=5)
    assert fast_view(env) is env and "gen_obs" not in vars(env)
    for copied in (copy.deepcopy(fast), pickle.loads(pickle.dumps(fast))):  # the view goes with the env
        assert copied.unwrapped.gen_obs.args[0] is copied.unwrapped
        np.testing.assert_array_equal(copied.unwrapped.gen_obs()["image"], fast.unwrapped.gen_obs()["image"])
    with pytest.raises(ValueError, match="view must be one of"):
        make_env("MiniGrid-DoorKey-5x5-v0", view="slow")
