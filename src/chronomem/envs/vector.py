"""What every natively vectorised environment here shares (``BalletVectorEnv``, ``CueRecallVector``):
Gymnasium's ``SyncVectorEnv`` rules written once, so that a native env returns what ``SyncVectorEnv``
over its single env returns: the checks of ``num_envs``, seeds, actions and partial resets, one
generator per env seeded as ``gymnasium.Env.reset`` seeds its own, and the info layout of
``VectorEnv._add_info`` (each key an array [B] and its ``_key`` mask; ``final_obs`` an object array).
"""

from __future__ import annotations

import numpy as np

from chronomem.checks import check_positive

try:  # the optional extra ``chronomem[rl]``; this module imports without it
    from gymnasium.utils import seeding
except ModuleNotFoundError:  # pragma: no cover - exercised only without gymnasium
    seeding = None


def check_num_envs(num_envs) -> int:
    """``num_envs`` if an int >= 1, else a ValueError naming it."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
    return int(num_envs)


def check_max_episode_steps(max_episode_steps) -> int | None:
    """None (or Gymnasium's -1) for no ``TimeLimit``, else a positive int (``gymnasium.make``'s rule)."""
    if max_episode_steps is None or (not isinstance(max_episode_steps, bool) and max_episode_steps == -1):
        return None
    return check_positive(max_episode_steps, "max_episode_steps")


def seed_list(seed, num_envs: int) -> list[int | None]:
    """``SyncVectorEnv.reset``'s seeds: None for every env, ``s + i`` for an int ``s``, or one per env."""
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        seeds = [int(seed) + i for i in range(num_envs)]
    elif isinstance(seed, (list, tuple, np.ndarray)):
        if len(seed) != num_envs:
            raise ValueError(f"seed must be an int or a list of num_envs={num_envs} seeds, got {len(seed)} seeds")
        if any(s is not None and (isinstance(s, bool) or not isinstance(s, (int, np.integer))) for s in seed):
            raise TypeError(f"seed must be an int, None or a list of ints or None, got {list(seed)!r}")
        seeds = [None if s is None else int(s) for s in seed]
    else:
        raise TypeError(f"seed must be an int, None or a list of num_envs={num_envs} ints, got {seed!r}")
    if any(s is not None and s < 0 for s in seeds):
        raise ValueError(f"seed must be >= 0 (every env's seed), got {seed!r}")
    return seeds


def check_reset_mask(options: dict, num_envs: int) -> np.ndarray | None:
    """``options["reset_mask"]`` (``SyncVectorEnv``'s partial reset): a bool array [B] with a True, or None."""
    if "reset_mask" not in options:
        return None
    mask = options["reset_mask"]
    if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (num_envs,):
        raise ValueError(f"options['reset_mask'] must be a bool numpy array of shape ({num_envs},), got {mask!r}")
    if not mask.any():
        raise ValueError("options['reset_mask'] must be True for at least one env, got all False")
    return mask


def check_actions(actions, num_envs: int, num_actions: int) -> np.ndarray:
    """``actions`` as an int64 array [B] of values in [0, num_actions), else a ValueError naming it."""
    array = np.asarray(actions)
    if array.shape != (num_envs,):
        raise ValueError(f"actions must have shape ({num_envs},) (one per env), got shape {array.shape}")
    if array.dtype.kind not in "iu":
        raise ValueError(f"actions must be integers, got dtype {array.dtype}")
    if array.min() < 0 or array.max() >= num_actions:
        raise ValueError(f"actions must be in [0, {num_actions}), got {array.tolist()}")
    return array.astype(np.int64, copy=False)


class RowGenerators:
    """One ``np.random.Generator`` per env, made and seeded as ``gymnasium.Env.reset`` makes its own."""

    def __init__(self, num_envs: int):
        self.generators: list = [None] * num_envs
        self.seeds: list = [None] * num_envs

    def seed(self, row: int, seed: int | None) -> np.random.Generator:
        if seed is not None:
            self.generators[row], self.seeds[row] = seeding.np_random(seed)
        return self[row]

    def __getitem__(self, row: int) -> np.random.Generator:
        if self.generators[row] is None:  # never seeded: fresh entropy, like Env.np_random's first use
            self.generators[row], self.seeds[row] = seeding.np_random()
        return self.generators[row]


def final_entries(infos: dict, final_obs: list, final_info: dict, rows: np.ndarray, num_envs: int) -> dict:
    """Adds ``final_obs``/``final_info`` and their masks to ``infos`` for the rows that ended, as
    ``VectorEnv._add_info`` lays them out (an object array of single observations; the infos batched)."""
    mask = np.zeros(num_envs, np.bool_)
    mask[rows] = True
    obs = np.full(num_envs, None, dtype=object)
    for row, single in zip(rows, final_obs, strict=True):
        obs[row] = single
    infos["final_obs"], infos["_final_obs"] = obs, mask
    infos["final_info"], infos["_final_info"] = final_info, mask.copy()
    return infos


def batched_info(values: dict, rows: np.ndarray | None, num_envs: int) -> dict:
    """``{key: array [R], ...}`` for ``rows`` (None: all) -> ``VectorEnv._add_info``'s layout: each key an
    array [B] (zeros, or None for objects, where absent) and its ``_key`` mask."""
    out = {}
    for key, value in values.items():
        if rows is None:
            out[key], out[f"_{key}"] = value, np.ones(num_envs, np.bool_)
            continue
        full = np.full(num_envs, None, dtype=object) if value.dtype == object else np.zeros(num_envs, value.dtype)
        full[rows] = value
        mask = np.zeros(num_envs, np.bool_)
        mask[rows] = True
        out[key], out[f"_{key}"] = full, mask
    return out
