"""MiniGrid for agents: the pairs, the mission tokens, vector envs with same-step autoreset, seeding,
cue recall, and the agent on a MiniGrid env (acting == replay)."""

import numpy as np
import pytest
import torch

gym = pytest.importorskip("gymnasium")
pytest.importorskip("minigrid")

from chronomem.envs.make import check_env_id, env_seeds, make_env, make_vector_env  # noqa: E402
from chronomem.envs.minigrid import MAX_WORDS, PAIRS, UNKNOWN, VOCABULARY, tokenize  # noqa: E402
from chronomem.envs.recall import CueRecall  # noqa: E402

torch.set_num_threads(1)


def test_pairs_are_registered_and_share_the_agents_view():
    assert set(PAIRS) == {"redbluedoors", "gotoobject", "memory", "gotodoor", "fetch", "doorkey"}
    for pair in PAIRS.values():
        small, large = make_env(pair.train), make_env(pair.test)
        assert small.observation_space == large.observation_space  # what makes transfer possible
        assert small.action_space == large.action_space
        assert small.unwrapped.width < large.unwrapped.width
        small.close(), large.close()


def test_every_mission_word_of_the_pairs_is_in_the_vocabulary():
    words = set()
    for pair in PAIRS.values():
        for env_id in (pair.train, pair.test):
            env = gym.make(env_id)
            for seed in range(30):
                obs, _ = env.reset(seed=seed)
                words |= set(obs["mission"].split())
    assert words and words <= set(VOCABULARY)
    assert len(set(VOCABULARY)) == len(VOCABULARY)


def test_tokenize():
    ids = tokenize("Go to the red key, then... zebra")
    assert ids.shape == (MAX_WORDS,) and ids.dtype == np.int64
    words = [VOCABULARY[i] for i in ids[:7]]
    assert words == ["go", "to", "the", "red", "key", "then", "<unk>"] and ids[6] == UNKNOWN
    assert (ids[7:] == 0).all()
    with pytest.raises(ValueError, match="has 3 words, more than max_words=2"):
        tokenize("a b c", max_words=2)


def test_make_env_tokenizes_the_mission_and_seeds_reproduce():
    env = make_env("MiniGrid-Fetch-5x5-N2-v0")
    obs, _ = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    assert [VOCABULARY[i] for i in obs["mission"] if i] == gym.make("MiniGrid-Fetch-5x5-N2-v0").reset(
        seed=3)[0]["mission"].split()
    again, _ = make_env("MiniGrid-Fetch-5x5-N2-v0").reset(seed=3)
    assert all(np.array_equal(obs[k], again[k]) for k in obs)


def test_unknown_env_is_a_clear_error():
    with pytest.raises(ValueError, match="'MiniGrid-DoorKey-5x5' is not a registered.*did you mean.*DoorKey-5x5-v0"):
        check_env_id("MiniGrid-DoorKey-5x5")
    with pytest.raises(ValueError, match="num_envs must be a positive int, got 0"):
        make_vector_env("MiniGrid-DoorKey-5x5-v0", 0)


def test_env_seeds_are_distinct_per_run_and_restart():
    assert len(set(env_seeds(1, 0, 16))) == 16
    assert env_seeds(1, 0, 4) == env_seeds(1, 0, 4)
    assert not set(env_seeds(1, 0, 4)) & set(env_seeds(1, 2048, 4))
    assert env_seeds(1, 0, 4) != env_seeds(2, 0, 4)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_vector_env_autoresets_on_the_same_step(asynchronous):
    """The step that ends an episode returns the next episode's first observation and the final one in
    info["final_obs"] (same-step autoreset), in one process and in subprocesses."""
    envs = make_vector_env("MiniGrid-DoorKey-5x5-v0", 2, asynchronous=asynchronous, max_steps=3)
    obs, _ = envs.reset(seed=[5, 6])
    first = {k: v.copy() for k, v in obs.items()}
    for _ in range(3):
        obs, reward, terminated, truncated, info = envs.step(np.array([0, 0]))  # turn left: never succeeds
    if not asynchronous:  # the envs have already started their next episodes
        assert [env.unwrapped.step_count for env in envs.envs] == [0, 0]
    envs.close()
    assert truncated.all() and not terminated.any() and (reward == 0).all()
    assert info["_final_obs"].all()
    for i in range(2):  # the final observation: three left turns after the first one
        assert set(info["final_obs"][i]) == {"image", "direction", "mission"}
        assert int(info["final_obs"][i]["direction"]) == (int(first["direction"][i]) - 3) % 4


def test_cue_recall():
    env = CueRecall(num_cues=3, delay=2)
    obs, _ = env.reset(seed=0)
    cue = int(obs[:3].argmax())
    assert obs.sum() == 1 and obs[-1] == 0
    obs, reward, terminated, _, _ = env.step(0)
    assert obs.sum() == 0 and reward == 0 and not terminated
    obs, reward, terminated, _, _ = env.step(1)
    assert obs[-1] == 1 and not terminated  # the query
    _, reward, terminated, _, _ = env.step(cue)
    assert reward == 1 and terminated
    with pytest.raises(ValueError, match="num_cues must be >= 2"):
        CueRecall(num_cues=1)


def test_agent_on_minigrid_replays_what_it_did():
    from chronomem.rl.ppo import Args, collect, make_agent, replay

    envs = make_vector_env("MiniGrid-DoorKey-5x5-v0", 2, max_steps=7)
    args = Args(dim=16, hidden=16, num_envs=2, num_steps=10, num_minibatches=1)
    torch.manual_seed(0)
    agent = make_agent(args, {}, envs.single_observation_space, envs.single_action_space).eval()
    obs, _ = envs.reset(seed=[0, 1])
    rollout, _, _ = collect(agent, envs, obs, agent.initial_state(2), 10)
    envs.close()
    assert rollout.truncated[:, 6].all() and set(rollout.obs) == {"image", "direction", "mission"}
    with torch.no_grad():
        logprobs, _, values, _ = replay(agent, rollout, torch.tensor([1, 0]))
    torch.testing.assert_close(logprobs, rollout.logprobs[[1, 0]], atol=1e-5, rtol=0)
    torch.testing.assert_close(values, rollout.values[[1, 0]], atol=1e-5, rtol=0)
