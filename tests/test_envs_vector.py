"""Natively vectorised environments (``chronomem.envs.ballet_vector.BalletVectorEnv``,
``chronomem.envs.recall.CueRecallVector``): equal, step for step, to Gymnasium's ``SyncVectorEnv`` with
same-step autoreset over the single environments (``BalletEnv``, ``BalletMixture``, ``CueRecall``) under
the same seeds and actions: observations, rewards, terminations, truncations and every info, the final
observations and infos of the ended episodes included."""

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

from chronomem.envs.ballet import BalletEnv  # noqa: E402
from chronomem.envs.ballet_vector import BalletVectorEnv  # noqa: E402
from chronomem.envs.ballet_world import (  # noqa: E402
    DANCER_CELLS,
    DIRECTIONS,
    GYM_ID,
    LEVELS,
    MAX_STEPS,
    MIXTURE,
    Layout,
    ballet_id,
    cue_step,
    parse_level,
)
from chronomem.envs.make import make_vector_env  # noqa: E402
from chronomem.envs.recall import GYM_ID as CUE  # noqa: E402
from chronomem.envs.recall import CueRecall, CueRecallVector  # noqa: E402

# The direction that leads from the centre straight to each dancer cell (3 steps away).
TOWARDS = [int(np.flatnonzero((DIRECTIONS == np.sign([r - 5, c - 5])).all(1))[0]) for r, c in DANCER_CELLS]


def assert_same(want, got, path="out"):
    """Exact equality of two step (or reset) results: the same nesting, dict keys, array dtypes and
    shapes, values, and Python types of scalars; object arrays (``final_obs``, string infos) element
    by element."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), path
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            assert_same(w, g, f"{path}[{i}]")
    elif isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), f"{path}: keys {sorted(want)} != {sorted(got)}"
        for key in want:
            assert_same(want[key], got[key], f"{path}[{key!r}]")
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), f"{path}: {type(got)} is not an array"
        assert (got.dtype, got.shape) == (want.dtype, want.shape), f"{path}: {got.dtype}{got.shape} != " \
                                                                   f"{want.dtype}{want.shape}"
        if want.dtype == object:
            for i, (w, g) in enumerate(zip(want, got, strict=True)):
                assert_same(w, g, f"{path}[{i}]")
        else:
            assert np.array_equal(want, got), f"{path}: {want} != {got}"
    else:
        assert type(got) is type(want) and got == want, f"{path}: {want!r} != {got!r}"


class Walker:
    """Actions that end Ballet episodes every way. Per episode an env either paces up and down beside the
    centre, touching nobody until the time limit (25%), or heads for the target's cell (35%: the
    ``target_cell`` of its reset info) or for a random dancer cell (40%: another dancer, or the wall
    where nobody stands), taking the heading with probability 0.8 and a random direction otherwise."""

    def __init__(self, num_envs: int, seed: int):
        self.rng = np.random.default_rng(seed)
        self.pace = np.zeros(num_envs, bool)
        self.heading = np.zeros(num_envs, np.int64)
        self.start(np.arange(num_envs), self.rng.integers(8, size=num_envs))
        self.t = 0

    def start(self, rows, target_cell):
        """New episodes in ``rows`` whose targets stand on ``DANCER_CELLS[target_cell[row]]``."""
        u = self.rng.random(len(rows))
        towards = np.array(TOWARDS)
        self.pace[rows] = u < 0.25
        self.heading[rows] = np.where(u < 0.6, towards[np.asarray(target_cell)[rows]],
                                      towards[self.rng.integers(8, size=len(rows))])

    def __call__(self) -> np.ndarray:
        self.t += 1
        walk = np.where(self.rng.random(len(self.pace)) < 0.8, self.heading, self.rng.integers(8, size=len(self.pace)))
        return np.where(self.pace, 0 if self.t % 2 else 4, walk)  # from the centre: rows 4-6 of column 5


def play(env_id: str, num_envs: int, steps: int, seed: int = 0, actions=None, **options) -> dict:
    """Both vector envs of ``env_id`` side by side, compared at the reset and every step; returns how the
    episodes ended (``target``, ``other``: contacts with reward 1 / 0; ``truncated``, at the steps
    ``limits``) and the ``levels`` seen. ``actions``: a callable giving each step's actions (default: a
    ``Walker`` told every new episode's target)."""
    reference = make_vector_env(env_id, num_envs, vectorization="sync", **options)
    native = make_vector_env(env_id, num_envs, **options)
    assert isinstance(reference, gym.vector.SyncVectorEnv) and not isinstance(native, gym.vector.SyncVectorEnv)
    assert native.metadata["autoreset_mode"] == reference.metadata["autoreset_mode"]
    assert native.single_observation_space == reference.single_observation_space
    assert native.observation_space == reference.observation_space and native.action_space == reference.action_space
    out = reference.reset(seed=seed)
    assert_same(out, native.reset(seed=seed), "reset")
    walker = Walker(num_envs, seed) if actions is None else actions
    if isinstance(walker, Walker):
        walker.start(np.arange(num_envs), out[1]["target_cell"])
    counts = {"target": 0, "other": 0, "truncated": 0, "limits": set(), "levels": set()}
    for t in range(steps):
        action = walker()
        out = reference.step(action)
        assert_same(out, native.step(action), f"step {t}")
        _, reward, terminated, truncated, info = out
        counts["target"] += int((terminated & (reward == 1)).sum())
        counts["other"] += int((terminated & (reward == 0)).sum())
        counts["truncated"] += int(truncated.sum())
        if truncated.any() and "step" in info["final_info"]:
            counts["limits"] |= set(info["final_info"]["step"][truncated].tolist())
        counts["levels"] |= set(info.get("level", []))
        if isinstance(walker, Walker):
            walker.start(np.flatnonzero(terminated | truncated), info["target_cell"])
    reference.close()
    native.close()
    return counts


# ---- equal to SyncVectorEnv over the single envs ------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_every_level_equals_sync_over_ballet_env(level):
    n, delay = parse_level(level)
    env_id = ballet_id(level, "symbolic")
    cue = cue_step(n, delay)
    # the reference's time limits (320 / 1024 actions)
    natural = play(env_id, 4, MAX_STEPS[delay] + 30, seed=1)
    assert MAX_STEPS[delay] in natural["limits"], natural
    # a limit just after the cue: contacts and truncations often
    short = play(env_id, 6, 2 * (cue + 8), seed=2, max_steps=cue + 8)
    assert short["limits"] == {cue + 8}, short
    assert natural["target"] + short["target"] and natural["other"] + short["other"], (natural, short)
    # a limit before the cue: truncated while the dances run
    during = play(env_id, 2, cue, seed=3, max_steps=cue // 2)
    assert during["truncated"] == 4 and during["limits"] == {cue // 2}, during


def test_any_dancer_control_equals_sync_and_pays_every_contact():
    """The control (``-any`` ids): the native env equals ``BalletEnv(any_dancer=True)`` step for step,
    and every contact pays 1, where the same episodes of the level pay only the target's."""
    n, delay = parse_level("4_delay16")
    short = {"max_steps": cue_step(n, delay) + 8}
    control = play(ballet_id("4_delay16", "symbolic", any_dancer=True), 6, 300, seed=2, **short)
    level = play(ballet_id("4_delay16", "symbolic"), 6, 300, seed=2, **short)
    assert control["other"] == 0 and control["target"] > 0, control
    assert level["other"] > 0 and control["target"] == level["target"] + level["other"], (control, level)
    with pytest.raises(ValueError, match="any_dancer"):
        ballet_id(MIXTURE, "symbolic", any_dancer=True)


def test_mixture_equals_sync_over_ballet_mixture():
    natural = play(ballet_id(MIXTURE, "symbolic"), 8, 1100, seed=4)
    assert natural["target"] and natural["other"] and natural["truncated"], natural
    assert len(natural["levels"]) == len(LEVELS), natural["levels"]
    # Gymnasium's TimeLimit (gym.make(..., max_episode_steps=...)), which the native env applies itself
    limited = play(ballet_id(MIXTURE, "symbolic"), 6, 500, seed=5, max_episode_steps=150)
    assert limited["target"] + limited["other"] and limited["truncated"], limited
    subset = play(ballet_id(MIXTURE, "symbolic"), 3, 200, seed=6, levels=("2_delay16", "4_delay16", "2_delay16"))
    assert subset["levels"] <= {"2_delay16", "4_delay16"} and subset["target"] + subset["other"], subset


def test_pixels_equal_sync():
    level = play(ballet_id("2_delay16", "pixels"), 4, 150, seed=8, max_steps=cue_step(2, 16) + 10)
    assert level["target"] and level["other"] and level["truncated"], level
    play(ballet_id(MIXTURE, "pixels"), 2, 100, seed=8, max_episode_steps=70)


@pytest.mark.parametrize("options", [{}, {"random_delay": True, "delay": 6, "max_episode_steps": 5},
                                     {"num_cues": 3, "delay": 2}])
def test_cue_recall_equals_sync(options):
    rng = np.random.default_rng(0)
    num_cues = options.get("num_cues", 2)
    counts = play(CUE, 5, 600, seed=9, actions=lambda: rng.integers(num_cues, size=5), **options)
    assert counts["target"] and counts["other"], counts
    assert bool(counts["truncated"]) == ("max_episode_steps" in options), counts


def test_seeding_follows_sync_vector_env():
    env_id = ballet_id("4_delay16", "symbolic")
    reference = make_vector_env(env_id, 3, vectorization="sync")
    native = make_vector_env(env_id, 3)
    walker = Walker(3, 0)
    for seed in (11, [5, 6, 7], None, [None, 9, None]):  # None continues each env's own generator
        assert_same(reference.reset(seed=seed), native.reset(seed=seed), f"reset(seed={seed})")
        for _ in range(80):
            action = walker()
            assert_same(reference.step(action), native.step(action))
    # env i's episodes are those of a single BalletEnv seeded with seed + i
    native.reset(seed=20)
    for i in range(3):
        single = BalletEnv("4_delay16", "symbolic")
        single.reset(seed=20 + i)
        assert native.unwrapped.layouts[i] == single.layout
    # unseeded, every env draws fresh entropy
    fresh = [make_vector_env(env_id, 3) for _ in range(2)]
    for envs in fresh:
        envs.reset()
    assert fresh[0].unwrapped.layouts != fresh[1].unwrapped.layouts
    assert all(s is not None for s in fresh[0].unwrapped.np_random_seed)


def test_reset_mask_follows_sync_vector_env():
    env_id = ballet_id(MIXTURE, "symbolic")
    reference, native = make_vector_env(env_id, 4, vectorization="sync"), make_vector_env(env_id, 4)
    assert_same(reference.reset(seed=0), native.reset(seed=0))
    walker = Walker(4, 1)
    for _ in range(30):
        action = walker()
        assert_same(reference.step(action), native.step(action))
    mask = np.array([False, True, False, True])
    assert_same(reference.reset(seed=[None, 3, None, 4], options={"reset_mask": mask.copy()}),
                native.reset(seed=[None, 3, None, 4], options={"reset_mask": mask.copy()}))
    for _ in range(30):
        action = walker()
        assert_same(reference.step(action), native.step(action))


# ---- given layouts ----------------------------------------------------------------------------------


def test_given_layouts_play_as_in_ballet_env():
    up = Layout(cells=(1, 6), dances=(2, 3), shapes=(2, 6), colours=(4, 9), target=0)  # (2, 5) above the centre
    down = Layout(cells=(1, 6), dances=(4, 5), shapes=(0, 1), colours=(0, 1), target=0)  # (8, 5) below: wrong
    envs = BalletVectorEnv(3, level="2_delay16", observation="symbolic")
    obs, info = envs.reset(seed=0, options={"layouts": [up, None, down]})
    assert envs.layouts[0] == up and envs.layouts[2] == down
    single = BalletEnv("2_delay16", observation="symbolic")
    single.reset(seed=1)  # the None row samples as a single env seeded with seed + 1
    assert envs.layouts[1] == single.layout
    cue = info["cue_step"][0]
    for t in range(1, cue + 4):
        obs, reward, terminated, truncated, info = envs.step(np.array([0, 0, 4]))
        if t < cue + 3:
            assert not terminated.any()
    # three steps after the cue: row 0 reached the target above, row 2 the other dancer below
    assert terminated[0] and reward[0] == 1.0 and terminated[2] and reward[2] == 0.0
    assert info["_final_obs"].tolist() == [True, bool(terminated[1]), True]
    # the same episode in BalletEnv ends with the same final observation
    single.reset(options={"layout": up})
    for _ in range(cue + 3):
        last, *_ = single.step(0)
    assert_same(last, info["final_obs"][0])
    assert info["final_info"]["step"][0] == cue + 3 and info["final_info"]["phase"][0] == "choice"


def test_one_layout_for_every_env_and_both_limits_at_once():
    """``options={"layout": L}`` is what SyncVectorEnv passes to every env; an episode may end by contact
    and by Gymnasium's time limit on the same step (terminated and truncated)."""
    layout = Layout(cells=(1, 6), dances=(2, 3), shapes=(2, 6), colours=(4, 9), target=0)
    cue = cue_step(2, 16)
    env_id = ballet_id("2_delay16", "symbolic")
    reference = make_vector_env(env_id, 2, vectorization="sync", max_episode_steps=cue + 3)
    native = make_vector_env(env_id, 2, max_episode_steps=cue + 3)
    assert_same(reference.reset(seed=0, options={"layout": layout}), native.reset(seed=0, options={"layout": layout}))
    for _ in range(cue + 3):
        out = reference.step(np.array([0, 1]))
        assert_same(out, native.step(np.array([0, 1])))
    assert out[2].tolist() == [True, False] and out[3].tolist() == [True, True]  # onto the target at the limit


# ---- rendering ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", [ballet_id("2_delay16", "symbolic"), ballet_id(MIXTURE, "pixels")])
def test_render_equals_ballet_env_render(env_id):
    reference = make_vector_env(env_id, 3, vectorization="sync", render_mode="rgb_array")
    native = make_vector_env(env_id, 3, render_mode="rgb_array")
    assert native.render_mode == "rgb_array"
    assert_same(reference.reset(seed=2), native.reset(seed=2))
    assert_same(reference.render(), native.render())
    walker = Walker(3, 2)
    for t in range(90):  # past the cue of 2_delay16 (62), episodes ending and restarting
        action = walker()
        reference.step(action)
        native.step(action)
        if t % 5 == 0 or t > 60:
            frames = native.render()
            assert_same(reference.render(), frames, f"step {t}")
            assert frames[0].shape == (108, 99, 3) and frames[0].dtype == np.uint8
            assert all(np.array_equal(native.unwrapped.render_env(i), frames[i]) for i in range(3))
    quiet, quiet_reference = make_vector_env(env_id, 2), make_vector_env(env_id, 2, vectorization="sync")
    quiet.reset(seed=0)
    quiet_reference.reset(seed=0)
    assert quiet.render() == (None, None) == quiet_reference.render()


# ---- building ---------------------------------------------------------------------------------------


def test_make_vec_and_make_vector_env_return_the_native_envs():
    ids = [GYM_ID] + [ballet_id(level, obs) for obs in ("pixels", "symbolic") for level in (*LEVELS, MIXTURE)]
    for env_id in ids:
        envs = gym.make_vec(env_id, num_envs=2, vectorization_mode="vector_entry_point")
        assert type(envs) is BalletVectorEnv and envs.num_envs == 2
        assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
        assert type(make_vector_env(env_id, 2)) is BalletVectorEnv
    mixture = gym.make_vec(ballet_id(MIXTURE, "symbolic"), num_envs=2, vectorization_mode="vector_entry_point")
    assert mixture.mixture and mixture.levels == LEVELS and mixture.observation == "symbolic"
    one = gym.make_vec(ballet_id("8_delay48", "pixels"), num_envs=2, vectorization_mode="vector_entry_point")
    assert not one.mixture and one.level == "8_delay48" and one.max_steps == 1024
    assert type(gym.make_vec(CUE, num_envs=3, vectorization_mode="vector_entry_point")) is CueRecallVector
    assert type(make_vector_env(CUE, 3, delay=2)) is CueRecallVector
    for env_id in (ballet_id(MIXTURE, "symbolic"), CUE):
        assert type(make_vector_env(env_id, 2, vectorization="sync")) is gym.vector.SyncVectorEnv
        assert type(make_vector_env(env_id, 2, vectorization="native")) is not gym.vector.SyncVectorEnv
    assert type(make_vector_env("MountainCar-v0", 2)) is gym.vector.SyncVectorEnv  # no native env: sync
    with pytest.raises(ValueError, match="vectorization='native'.*MountainCar-v0.*no natively vectorised"):
        make_vector_env("MountainCar-v0", 2, vectorization="native")
    with pytest.raises(ValueError, match="vectorization must be None or one of native, sync, async"):
        make_vector_env(CUE, 2, vectorization="subproc")
    with pytest.raises(ValueError, match="asynchronous=True.*vectorization='native'"):
        make_vector_env(CUE, 2, asynchronous=True, vectorization="native")
    with pytest.raises(ValueError, match="num_envs"):
        make_vector_env(CUE, 0)


# ---- bad input ------------------------------------------------------------------------------------


def test_bad_construction_names_the_argument():
    for bad in ("3_delay16", "2-delay16", "", 8):
        with pytest.raises(ValueError, match="level must be one of .*8_delay48"):
            BalletVectorEnv(2, level=bad)
    with pytest.raises(ValueError, match="level must be one of"):
        BalletVectorEnv(2, levels=("2_delay16", "nope"))
    for bad in ("2_delay16", (), {"2_delay16"}):
        with pytest.raises(ValueError, match="levels must be a non-empty sequence"):
            BalletVectorEnv(2, levels=bad)
    with pytest.raises(ValueError, match="level .* or levels .*not both"):
        BalletVectorEnv(2, level="2_delay16", levels=LEVELS)
    for bad in (0, -1, 2.0, True, "2", None):
        with pytest.raises(ValueError, match="num_envs must be a positive int"):
            BalletVectorEnv(bad)
        with pytest.raises(ValueError, match="num_envs must be a positive int"):
            CueRecallVector(bad)
    with pytest.raises(ValueError, match="observation must be 'pixels' or 'symbolic'"):
        BalletVectorEnv(2, observation="rgb")
    with pytest.raises(ValueError, match="render_mode must be None or 'rgb_array'"):
        BalletVectorEnv(2, render_mode="human")
    with pytest.raises(ValueError, match="max_steps .*the mixture keeps each level's own"):
        BalletVectorEnv(2, levels=LEVELS, max_steps=100)
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        BalletVectorEnv(2, max_steps=0)
    with pytest.raises(TypeError, match="max_steps must be an int"):
        BalletVectorEnv(2, max_steps=1.5)
    with pytest.raises(ValueError, match="max_episode_steps must be >= 1"):
        BalletVectorEnv(2, max_episode_steps=0)
    with pytest.raises(ValueError, match="num_cues must be >= 2"):
        CueRecallVector(2, num_cues=1)
    with pytest.raises(ValueError, match="delay must be >= 1"):
        CueRecallVector(2, delay=0)


@pytest.mark.parametrize("make", [lambda: BalletVectorEnv(2, observation="symbolic"), lambda: CueRecallVector(2)])
def test_bad_steps_name_the_argument(make):
    envs = make()
    num_actions = envs.single_action_space.n
    with pytest.raises(RuntimeError, match="call reset\\(\\) first"):
        envs.step(np.zeros(2, np.int64))
    envs.reset(seed=0)
    for bad in (np.zeros(3, np.int64), 0, np.zeros((1, 2), np.int64), []):
        with pytest.raises(ValueError, match="actions must have shape \\(2,\\)"):
            envs.step(bad)
    for bad in (np.zeros(2), np.array([True, False]), ["a", "b"]):
        with pytest.raises(ValueError, match="actions must be integers"):
            envs.step(bad)
    for bad in ([0, num_actions], [-1, 0]):
        with pytest.raises(ValueError, match=f"actions must be in \\[0, {num_actions}\\)"):
            envs.step(bad)
    envs.step([0, num_actions - 1])  # a list of ints is fine
    for bad, error, message in ((-1, ValueError, "seed must be >= 0"), ([1, 2, 3], ValueError, "2 seeds, got 3"),
                                ("abc", TypeError, "seed must be"), ([1.5, 2], TypeError, "seed must be")):
        with pytest.raises(error, match=message):
            envs.reset(seed=bad)
    for bad in (np.array([1, 0]), np.array([True]), np.array([False, False])):
        with pytest.raises(ValueError, match="reset_mask"):
            envs.reset(options={"reset_mask": bad})
    envs.close()
    for call in (lambda: envs.step(np.zeros(2, np.int64)), lambda: envs.reset(seed=0)):
        with pytest.raises(RuntimeError, match="closed"):
            call()


def test_bad_layouts_and_render_index_name_the_argument():
    envs = BalletVectorEnv(2, level="2_delay16", observation="symbolic", render_mode="rgb_array")
    two = Layout((0, 1), (0, 1), (0, 1), (0, 1), 0)
    four = Layout((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3), 0)
    with pytest.raises(ValueError, match="options\\['layouts'\\] must be a list of num_envs=2"):
        envs.reset(options={"layouts": [two]})
    with pytest.raises(ValueError, match="options\\['layouts'\\] must be Layouts with 2 dancers"):
        envs.reset(options={"layouts": [two, four]})
    with pytest.raises(ValueError, match="options\\['layout'\\] must hold Layouts"):
        envs.reset(options={"layout": "two"})
    with pytest.raises(ValueError, match="not both"):
        envs.reset(options={"layout": two, "layouts": [two, two]})
    mixture = BalletVectorEnv(2, levels=("4_delay16",), observation="symbolic")
    with pytest.raises(ValueError, match="Layout with 4 dancers for env 0's level 4_delay16"):
        mixture.reset(seed=0, options={"layouts": [two, None]})
    mixture.reset(seed=0, options={"layouts": [four, None]})
    assert mixture.layouts[0] == four
    envs.reset(seed=0)
    for bad in (2, -1, 1.0, True):
        with pytest.raises(ValueError, match="index must be an int in \\[0, 2\\)"):
            envs.render_env(bad)


def test_cue_recall_checks_its_action():
    env = CueRecall(num_cues=3)
    env.reset(seed=0)
    for bad in (3, -1, 1.5, "a"):
        with pytest.raises(ValueError, match="action must be an int in \\[0, 3\\)"):
            env.step(bad)
    env.step(np.int64(2))


def test_speed_benchmark_runs_at_tiny_sizes(tmp_path, capsys):
    """benchmarks/ballet_env_speed.py end to end at B = 3 (no timing asserted: only the table's structure)."""
    import json

    from helpers import load_benchmark

    module = load_benchmark("ballet_env_speed")
    out = tmp_path / "speed.json"
    result = module.main(["--num-envs", "3", "--steps", "2", "--rounds", "2", "--level", "mixture", "--json", str(out)])
    assert [row["observation"] for row in result["rows"]] == ["symbolic", "pixels"]
    for row in result["rows"]:
        assert row["env"] == ballet_id(MIXTURE, row["observation"]) and row["num_envs"] == 3
        assert all(len(rounds) == 2 for rounds in row["rounds"].values())
        assert row["ratio"] == pytest.approx(row["steps_per_second"]["native"] / row["steps_per_second"]["sync"])
    assert json.loads(out.read_text())["config"]["num_envs"] == 3
    assert "native / sync" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        module.main(["--num-envs", "0"])
