"""POPGym behind the env factory: every environment at every difficulty by id, its previous-action
protocol, the action adapters, the observation encoder, and an agent with every core that takes done."""

import importlib.util

import numpy as np
import pytest
import torch

pytest.importorskip("gymnasium")
pytest.importorskip("popgym")

from chronomem.encoders import SpacesEncoder, encoder_for  # noqa: E402
from chronomem.envs.make import make_env, make_vector_env  # noqa: E402
from chronomem.envs.popgym import DIFFICULTIES, ENVS, NEEDS_MAZELIB, TORQUES, all_ids, popgym_id  # noqa: E402
from test_rl_ballet import CORES, TINY, tiny_args, train_or_skip  # noqa: E402

torch.set_num_threads(1)
HAS_MAZELIB = importlib.util.find_spec("mazelib") is not None


def test_ids_cover_the_papers_15_environments_at_3_difficulties():
    assert len(ENVS) == 15 and len(set(all_ids())) == 45
    assert popgym_id("RepeatPrevious", "Hard") == "popgym-RepeatPreviousHard-v0"
    with pytest.raises(ValueError, match="name must be one of"):
        popgym_id("Pong")
    with pytest.raises(ValueError, match="difficulty"):
        popgym_id("RepeatFirst", "easy")


@pytest.mark.parametrize("env_id", all_ids())
def test_every_environment_steps_through_the_vector_env_factory(env_id):
    if any(name in env_id for name in NEEDS_MAZELIB) and not HAS_MAZELIB:
        with pytest.raises(ValueError, match="mazelib"):
            make_env(env_id)
        return
    envs = make_vector_env(env_id, 2)
    space = envs.single_observation_space
    assert set(space.spaces) >= {"prev_action", "is_t0"} and hasattr(envs.single_action_space, "n")
    encoder = encoder_for(space, 8)
    obs, _ = envs.reset(seed=[0, 1])
    for _ in range(5):
        x = encoder({k: torch.as_tensor(v).unsqueeze(1) for k, v in obs.items()})
        assert x.shape == (2, 1, 8) and torch.isfinite(x).all()
        obs, reward, *_ = envs.step(envs.action_space.sample())
        assert np.all(np.abs(reward) <= 1.0)
    envs.close()


def test_previous_action_and_first_step_flag():
    env = make_env(popgym_id("RepeatPrevious"))
    obs, _ = env.reset(seed=0)
    assert obs["is_t0"] == 1 and obs["prev_action"] == 0  # POPGym's null action
    for action in (3, 1, 2):
        obs, *_ = env.step(action)
        assert obs["is_t0"] == 0 and obs["prev_action"] == action
    mines = make_env(popgym_id("MineSweeper"))  # a cell (row, col) as one Discrete action
    mines.reset(seed=0)
    assert mines.action_space.n == 16
    obs, *_ = mines.step(6)
    assert tuple(obs["prev_action"]) == (1, 2)


def test_pendulum_torque_is_discretised():
    env = make_env(popgym_id("PositionOnlyPendulum"))
    env.reset(seed=0)
    assert env.action_space.n == TORQUES
    for action, torque in ((0, -2.0), (2, 0.0), (TORQUES - 1, 2.0)):
        obs, *_ = env.step(action)
        assert obs["prev_action"].shape == (1,) and obs["prev_action"][0] == pytest.approx(torque)


def test_spaces_encoder_is_a_linear_map_of_one_hot_codes_and_features():
    parts = {"a": ("discrete", 3), "b": ("multidiscrete", (2, 4)), "c": ("box", 2)}
    torch.manual_seed(0)
    encoder = SpacesEncoder(parts, 5)
    obs = {"a": torch.tensor([[2, 0]]), "b": torch.tensor([[[1, 3], [0, 0]]]), "c": torch.randn(1, 2, 2)}
    out = encoder(obs)
    for t in range(2):
        flat = torch.cat([torch.nn.functional.one_hot(obs["a"][0, t], 3), torch.nn.functional.one_hot(
            obs["b"][0, t, 0], 2), torch.nn.functional.one_hot(obs["b"][0, t, 1], 4)]).float()
        weight = torch.cat([encoder.tables["a"].weight, encoder.tables["b"].weight]).T  # [5, 3 + 2 + 4]
        expected = weight @ flat + encoder.tables["c"].weight @ obs["c"][0, t] + encoder.bias
        torch.testing.assert_close(out[0, t], expected)
    with pytest.raises(ValueError, match=r"obs\['b'\] must hold indices"):
        encoder({**obs, "b": torch.tensor([[[2, 0], [0, 0]]])})
    with pytest.raises(TypeError, match="parts"):
        encoder({"a": obs["a"]})


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("name", ["RepeatFirst", "MineSweeper"])
def test_popgym_agent_trains_a_few_steps_with_every_core(core, name):
    result = train_or_skip(tiny_args(popgym_id(name, DIFFICULTIES[0]), core), TINY.get(core, {}))
    row = result.history[-1]
    assert result.frames == 12 and np.isfinite(row["policy_loss"]) and "reconstruction_loss" not in row


def test_unknown_popgym_id_names_the_closest():
    with pytest.raises(ValueError, match="popgym-RepeatFirstEasy-v0"):
        make_env("popgym-RepeatFirstEsy-v0")
