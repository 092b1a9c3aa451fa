"""Environments by id, one at a time or as a vector env: the factory every agent and experiment uses.

* ``make_env(env_id)`` builds any Gymnasium environment by id. ``import minigrid`` registers the
  MiniGrid and BabyAI ids (Gymnasium 1.x raises ``NameNotFound`` without it) and importing
  ``chronomem.envs`` registers every chronomem id (the cue-recall test env, the Ballet levels and the
  paper's level mixture, Visual Match and Key-to-Door), ``import popgym`` POPGym's environments (wrapped by
  ``chronomem.envs.wrappers.wrap_popgym``); an unknown id is a ValueError listing close matches. MiniGrid
  and BabyAI environments get ``chronomem.envs.wrappers.MissionTokens``, and their view computed by
  ``chronomem.envs.wrappers.agent_view`` (``view="fast"``, the same observations, ~3x faster than
  MiniGrid's; ``view="minigrid"`` keeps MiniGrid's own).
* ``make_vector_env`` builds ``num_envs`` environments of one id as a vector env with
  ``autoreset_mode=SAME_STEP``: the step that ends an episode returns the *next* episode's first
  observation and the final one in ``info["final_obs"]``. (Gymnasium 1.x's default, NEXT_STEP,
  spends one extra step per episode whose action is ignored; docs/rl.md, "Autoreset".) Three ways
  (``vectorization``): ``"native"``, the id's own vector env (``gym.make_vec(...,
  vectorization_mode="vector_entry_point")``: Ballet's ``BalletVectorEnv``, ``CueRecallVector``; one
  numpy step for all envs, tested equal to the sync way), the default for an id that registered one;
  otherwise ``"sync"``, ``SyncVectorEnv`` over ``make_env`` copies (one process: tests, and as fast
  as subprocesses on 2 cores), or ``"async"``, ``AsyncVectorEnv`` (one subprocess each,
  ``shared_memory=False``). MiniGrid, BabyAI and POPGym ids have no native env: they go the sync or
  async way, with ``make_env``'s wrappers.
* Seeding: ``envs.reset(seed=[s_0, ..., s_{B-1}])`` seeds every env once; later episodes continue
  each env's own generator. ``env_seeds(seed, frames, B)`` gives distinct seeds per run and restart.

No training code and no models here (docs/design.md: envs import no models, tasks or trainers).
"""

from __future__ import annotations

import difflib

import numpy as np

from chronomem.envs.minigrid import MAX_WORDS, PAIRS
from chronomem.envs.popgym import is_popgym, missing_hint
from chronomem.envs.wrappers import VIEWS, MissionTokens, fast_view, wrap_popgym

try:  # the optional extra ``chronomem[rl]``
    import gymnasium as gym
    from gymnasium import spaces
except ModuleNotFoundError:  # pragma: no cover - exercised only without gymnasium
    gym = None


def _require_gymnasium() -> None:
    if gym is None:
        raise ModuleNotFoundError("environments need gymnasium (and MiniGrid): pip install 'chronomem[rl]'")


def _register_ids() -> None:
    """Import the packages whose import registers environment ids."""
    import chronomem.envs  # noqa: F401  (its import registers every chronomem/ id: Ballet, CueRecall, TVT's)
    import chronomem.envs.popgym

    chronomem.envs.popgym.register()  # popgym-<Name><Difficulty>-v0 when POPGym is installed
    try:
        import minigrid  # noqa: F401  (MiniGrid-*, BabyAI-*)
    except ModuleNotFoundError:  # MiniGrid ids then stay unknown: check_env_id says how to install it
        pass


def check_env_id(env_id: str) -> str:
    """``env_id`` if Gymnasium knows it, else a ValueError naming ``--env`` with the closest ids."""
    _require_gymnasium()
    _register_ids()
    if not isinstance(env_id, str) or env_id not in gym.registry:
        close = difflib.get_close_matches(str(env_id), list(gym.registry), n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        if str(env_id).startswith(("MiniGrid", "BabyAI")) and not any(k.startswith("MiniGrid") for k in gym.registry):
            hint = "; MiniGrid is not installed: pip install 'chronomem[rl]'"
        if is_popgym(env_id) and missing_hint(env_id):
            hint = f"; {missing_hint(env_id)}"
        pairs = ", ".join(f"{p.train} -> {p.test}" for p in PAIRS.values())
        raise ValueError(f"--env {env_id!r} is not a registered Gymnasium environment{hint} (paper 004's pairs: "
                         f"{pairs})")
    return env_id


def make_env(env_id: str, render_mode: str | None = None, max_words: int = MAX_WORDS, view: str = "fast",
             **options):
    """One environment ``env_id`` (any Gymnasium id; ``options`` go to ``gym.make``). MiniGrid and BabyAI
    environments get ``MissionTokens`` and, with ``view="fast"``, ``fast_view`` (``"minigrid"``: MiniGrid's
    own view, the reference); POPGym's get ``wrap_popgym`` (its previous-action protocol and flat
    observations); Ballet's observations are batchable as they are."""
    check_env_id(env_id)
    if view not in VIEWS:
        raise ValueError(f"view must be one of {', '.join(VIEWS)}, got {view!r}")
    env = gym.make(env_id, **options) if render_mode is None else gym.make(env_id, render_mode=render_mode, **options)
    if is_popgym(env_id):
        return wrap_popgym(env)
    space = env.observation_space
    if isinstance(space, spaces.Dict) and "mission" in space.spaces and "image" in space.spaces:
        env = MissionTokens(env, max_words)
        if view == "fast":
            fast_view(env)
    return env


VECTORIZATIONS = ("native", "sync", "async")


def has_native(env_id: str) -> bool:
    """Whether ``env_id`` registered a natively vectorised env (a ``vector_entry_point``)."""
    check_env_id(env_id)
    return gym.spec(env_id).vector_entry_point is not None


def make_vector_env(env_id: str, num_envs: int, asynchronous: bool = False, vectorization: str | None = None,
                    **options):
    """``num_envs`` environments ``env_id`` as one vector env with same-step autoreset (module docstring).

    ``vectorization``: ``"native"`` (the id's own vector env, ``gym.make_vec(env_id, num_envs=num_envs,
    vectorization_mode="vector_entry_point", **options)``), ``"sync"`` or ``"async"`` (``num_envs``
    copies of ``make_env(env_id, **options)`` in a ``SyncVectorEnv`` / ``AsyncVectorEnv``); None: native
    when the id has one, else async if ``asynchronous``, else sync. ``options`` go to the environment's
    constructor either way (and ``max_episode_steps`` to Gymnasium's time limit, which the native envs
    apply themselves)."""
    check_env_id(env_id)
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
    if vectorization is not None and vectorization not in VECTORIZATIONS:
        raise ValueError(f"vectorization must be None or one of {', '.join(VECTORIZATIONS)}, got {vectorization!r}")
    native = has_native(env_id)
    if vectorization is None:
        vectorization = "native" if native else "async" if asynchronous else "sync"
    elif asynchronous and vectorization != "async":
        raise ValueError(f"asynchronous=True asks for subprocesses, but vectorization={vectorization!r}")
    if vectorization == "native":
        if not native:
            raise ValueError(f"vectorization='native': {env_id!r} has no natively vectorised env (no "
                             f"vector_entry_point); use 'sync' or 'async'")
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **options)
    fns = [lambda: make_env(env_id, **options) for _ in range(num_envs)]
    mode = gym.vector.AutoresetMode.SAME_STEP
    if vectorization == "async":
        return gym.vector.AsyncVectorEnv(fns, shared_memory=False, autoreset_mode=mode)
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)


def env_seeds(seed: int, frames: int, num_envs: int) -> list[int]:
    """Distinct env seeds for a run with ``seed`` starting (or restarting) at ``frames``: a resumed run's
    environments restart with new episodes, not the ones of the run's beginning."""
    state = np.random.SeedSequence([int(seed), int(frames)]).generate_state(num_envs)
    return [int(s) for s in state]
