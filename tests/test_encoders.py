"""Observation encoders: shapes, MiniGrid's index tables, the mission bag of words, bad input."""

import pytest
import torch

from chronomem.encoders import (
    NUM_COLORS,
    NUM_DIRECTIONS,
    NUM_OBJECTS,
    NUM_STATES,
    FeatureEncoder,
    MiniGridEncoder,
    encoder_for,
)

torch.set_num_threads(1)


def grid_obs(B=2, N=3, words=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    image = torch.stack([torch.randint(0, high, (B, N, 7, 7), generator=g)
                         for high in (NUM_OBJECTS, NUM_COLORS, NUM_STATES)], -1).to(torch.uint8)
    mission = torch.randint(1, 20, (B, N, 8), generator=g)
    mission[..., words:] = 0
    return {"image": image, "direction": torch.randint(0, NUM_DIRECTIONS, (B, N), generator=g), "mission": mission}


def test_index_tables_match_minigrid():
    constants = pytest.importorskip("minigrid.core.constants")
    assert (NUM_OBJECTS, NUM_COLORS, NUM_STATES) == (len(constants.OBJECT_TO_IDX), len(constants.COLOR_TO_IDX),
                                                     len(constants.STATE_TO_IDX))
    assert NUM_DIRECTIONS == len(constants.DIR_TO_VEC)


def test_minigrid_encoder_shapes_and_steps_are_independent():
    torch.manual_seed(0)
    encoder = MiniGridEncoder(24, vocab_size=20, max_words=8)
    obs = grid_obs()
    x = encoder(obs)
    assert x.shape == (2, 3, 24)
    one_step = encoder({k: v[:, 1:2] for k, v in obs.items()})  # each step is encoded alone
    torch.testing.assert_close(one_step, x[:, 1:2])


def test_mission_is_a_bag_of_its_words():
    torch.manual_seed(0)
    encoder = MiniGridEncoder(16, vocab_size=20, max_words=8)
    obs = grid_obs(words=3)
    shuffled = {**obs, "mission": obs["mission"].clone()}
    shuffled["mission"][..., :3] = obs["mission"][..., [2, 0, 1]]  # word order does not matter
    torch.testing.assert_close(encoder(shuffled), encoder(obs))
    padded = {**obs, "mission": obs["mission"].clone()}
    padded["mission"][..., 3:] = 0
    other = {**obs, "mission": obs["mission"].clone()}
    other["mission"][..., 0] = (obs["mission"][..., 0] % 19) + 1  # another word changes the encoding
    assert not torch.allclose(encoder(other), encoder(obs))
    blind = MiniGridEncoder(16, vocab_size=20, max_words=8, mission=False)
    assert blind({k: v for k, v in obs.items() if k != "mission"}).shape == (2, 3, 16)


def test_other_view_sizes():
    encoder = MiniGridEncoder(8, vocab_size=4, max_words=2, view=9, mission=False)
    obs = grid_obs()
    image = torch.zeros(2, 3, 9, 9, 3, dtype=torch.long)
    assert encoder({"image": image, "direction": obs["direction"]}).shape == (2, 3, 8)


@pytest.mark.parametrize("change, error, message", [
    ({"image": torch.zeros(2, 3, 7, 7, 3)}, TypeError, r"obs\['image'\] must be an integer tensor"),
    ({"image": torch.zeros(2, 3, 5, 5, 3, dtype=torch.long)}, ValueError, r"must have shape \[B, N, 7, 7, 3\]"),
    ({"image": torch.full((2, 3, 7, 7, 3), 12, dtype=torch.long)}, ValueError,
     r"must hold indices in \[0, \(11, 6, 3\)"),
    ({"direction": torch.full((2, 3), 4)}, ValueError, r"obs\['direction'\] must hold indices in \[0, 4\)"),
    ({"mission": torch.full((2, 3, 8), 20)}, ValueError, r"obs\['mission'\] must hold indices in \[0, 20\)"),
    ({"mission": torch.zeros(2, 3, 7, dtype=torch.long)}, ValueError, r"obs\['mission'\] must have shape"),
])
def test_minigrid_encoder_bad_input(change, error, message):
    encoder = MiniGridEncoder(8, vocab_size=20, max_words=8)
    with pytest.raises(error, match=message):
        encoder({**grid_obs(), **change})
    with pytest.raises(TypeError, match="obs must be a dict"):
        encoder(torch.zeros(2, 3, 7, 7, 3))


def test_a_compiled_encoder_checks_its_ids_without_a_graph_break():
    """Under ``torch.compile`` the id check reads no value (so no graph break, and on a GPU no sync per step): an
    assert the device checks, which still refuses an id out of range."""
    torch._dynamo.reset()
    encoder = MiniGridEncoder(8, vocab_size=20, max_words=8)
    compiled = torch.compile(encoder, backend="aot_eager", fullgraph=True)  # a break would raise
    try:
        obs = grid_obs()
        torch.testing.assert_close(compiled(obs), encoder(obs))
        with pytest.raises(RuntimeError, match=r"obs\['direction'\] must hold indices in \[0, 4\)"):
            compiled({**obs, "direction": torch.full((2, 3), 4)})
    finally:
        torch._dynamo.reset()


def test_feature_encoder_and_encoder_for():
    gym = pytest.importorskip("gymnasium")
    box = gym.spaces.Box(0, 1, (5,))
    encoder = encoder_for(box, 8)
    assert isinstance(encoder, FeatureEncoder) and encoder(torch.rand(2, 3, 5)).shape == (2, 3, 8)
    with pytest.raises(ValueError, match="obs must have last dimension 5"):
        encoder(torch.rand(2, 3, 4))
    with pytest.raises(TypeError, match="no encoder for the observation space"):
        encoder_for(gym.spaces.Discrete(3), 8)
    space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (7, 7, 3), "uint8"), "direction": gym.spaces.Discrete(4),
                             "mission": gym.spaces.Box(0, 9, (6,), "int64")})
    encoder = encoder_for(space, 8)
    assert isinstance(encoder, MiniGridEncoder) and (encoder.vocab_size, encoder.max_words) == (10, 6)
    with pytest.raises(TypeError, match="MissionTokens"):
        encoder_for(gym.spaces.Dict({**space.spaces, "mission": gym.spaces.Text(10)}), 8)
