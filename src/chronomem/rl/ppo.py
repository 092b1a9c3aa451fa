"""Recurrent PPO with any chronomem core as the agent's memory, top to bottom.

CleanRL's ``ppo_atari_lstm.py`` is the model (one file, one ``Args`` dataclass, which lives in
``chronomem.rl.settings`` so that the experiments and the CLI check it without importing torch); the memory is any
causal core of the registry, driven through the core contract (docs/design.md): the agent acts one
step at a time with its state carried, and learns by replaying whole stored sequences with the episode
ends inside the call. PPO: Schulman et al. 2017, "Proximal Policy Optimization Algorithms"; GAE:
Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage Estimation".

One update:

1. **Rollout.** ``B = num_envs`` environments, ``T = num_steps`` steps each. At every step the agent
   reads the observations ``[B, 1, ...]`` under ``torch.inference_mode`` with the state carried from
   the previous step, samples actions, and the envs step. Rows whose episode ended get
   ``state.reset(done)``. The state at the rollout's start is kept for the replay (with
   ``recurrence = k``: the state at the start of every window of ``k`` steps).
2. **Autoreset and truncation.** The envs autoreset on the same step (``chronomem.envs.make``):
   the step that ends an episode returns the next episode's first observation and the final one in
   ``info["final_obs"]``. A time-limit truncation is not a terminal state: its return is bootstrapped
   with the value of the final observation, computed at once with the ended episode's state (before
   the reset). A termination's next value is 0. Either way GAE stops at the episode's end, so no
   advantage mixes two episodes. ``timeout="failure"`` (an agent-side choice; the envs keep their
   semantics) stores a truncation as a termination instead: the return ends with what the env paid.
3. **GAE** (Schulman et al. 2016, eq. 16, with lambda-returns as value targets).
4. **Learning.** ``update_epochs`` epochs; each splits the ``B`` envs into ``num_minibatches``
   minibatches of whole env sequences (``T`` steps), replayed in one call of the agent from the
   rollout's start state (``state.select(rows)``) with ``done [b, T]`` inside the call, so the
   recomputed log-probabilities and values of the first minibatch equal those of the rollout (tested
   to 1e-5 for every core). ``recurrence = k`` (torch-ac's option, used by paper 004's MiniGrid runs
   with k = 16) truncates back-propagation through time: the ``T / k`` windows of a minibatch's
   sequences are replayed side by side in one call ``[b * T / k, k]``, each from the state stored while
   acting at its first step, so no gradient crosses a window's start. The default replays whole
   rollouts (``k = T``), so no gradient crosses the rollout's start either: where a choice and the cue it
   needs fall in two rollouts, its gradient cannot reach the cue. ``replay_context = K`` (a deviation,
   off by default) replays each rollout after the previous rollout's last ``K`` steps, from the state
   stored at their first step: those steps are not scored, but the gradient flows back through them
   (truncated back-propagation with an overlap, Williams & Peng 1990's BPTT(h; h') with h = T + K and
   h' = T), at ``(T + K) / T`` of the replay's cost. ``minibatch="windows"`` draws the minibatches from
   all ``B * T / k`` windows (torch-ac's composition) instead of whole env sequences. Loss: the clipped
   surrogate (PPO eq. 7), the clipped value loss (CleanRL's), minus the entropy bonus, plus the agent's weighted
   reconstruction loss when it has one (paper 001 App. A.1, ``ActorCritic(reconstruction=w)``);
   advantages optionally normalised per minibatch (``norm_adv``); gradient norm clipped; the learning
   rate annealed linearly to 0 over the run. A policy that stops moving (``approx_kl`` below
   ``stall_kl`` for ``stall_updates`` updates, the return flat) is reported once (``StallWatch``), and so
   are heads that pass the core no gradient (``DeadHeadsWatch``: metrics.csv logs, from each update's
   first minibatch, the core's output norm and the share of the heads' units saturated or at 0).
   ``reward_part`` (a deviation, off by default): the env reports in ``info[key]`` the part of each
   step's reward to learn apart (Visual Match's apples); two value heads learn that part's return and
   the rest's, GAE runs on each, and the advantage is the sum of the two, each normalised alone with
   ``norm_adv``, so a sparse goal's advantages are not scaled down by a dense distraction's.

Scale-out (CleanRL's ``ppo_atari_multigpu.py`` pattern): under ``torchrun --nproc_per_node=K`` each of
the K ranks is a learner with its own ``num_envs`` environments (seeded with ``seed + rank``) and its
own action samples; the agent starts from rank 0's weights, every minibatch's gradients are averaged
over the ranks before clipping (gloo on CPU, nccl on GPU), so the ranks' weights stay identical; the
logged statistics are averaged over the ranks, a frame counts once per rank (``total_frames`` is the
total over all ranks), and only rank 0 writes the run directory.

Deviations from CleanRL's LSTM PPO: its LSTM reset multiplies by ``1 - done``, the cores select
(``torch.where``), so NaN never survives a reset; any core in place of its LSTM; truncation
bootstrapped (CleanRL treats it as terminal, as do torch-ac and rl-starter-files).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from chronomem.agents import ActorCritic, heads_watched
from chronomem.encoders import encoder_for
from chronomem.envs.make import env_seeds, make_vector_env
from chronomem.layers import concat_states, copy_state
from chronomem.rl.acting import Acting, act, as_tensor, final_observations, obs_map, sampled
from chronomem.rl.settings import Args
from chronomem.threads import threads_set_to
from chronomem.train.checkpoint import save_checkpoint
from chronomem.train.distributed import Context, all_reduce_mean, cleanup, default_device, setup
from chronomem.train.metrics import MetricsLogger
from chronomem.train.resume import Run, check_new_run, continue_run_dir, restore, restore_optimizer, rng_state

# =============================================================================================
# The agent: encoder -> core -> policy and value
# =============================================================================================

# Agents act one step at a time and learn with episode ends inside a call: of Transformer-XL's two
# memories only the sliding one (every query sees the mem_len steps before it) does both.
CORE_DEFAULTS: dict[str, dict[str, Any]] = {"transformer-xl": {"memory_mode": "sliding"},
                                             "gtrxl": {"memory_mode": "sliding"}}


def make_agent(args: Args, core_options: dict[str, Any], observation_space, action_space) -> ActorCritic:
    """The actor-critic for ``args.core`` (a registry name, ``core_options`` its builder's options).

    A core the agent cannot use is a ValueError naming it: one that keeps no state between calls, or
    that refuses episode ends inside a call (``done``), which the replay needs."""
    from chronomem.registry import build_backbone

    if not hasattr(action_space, "n"):
        raise ValueError(f"PPO here needs a discrete action space, got {action_space}")
    options = {**CORE_DEFAULTS.get(args.core, {}), **core_options}
    try:
        core = build_backbone(args.core, dim=args.dim, depth=args.depth, num_heads=args.heads, causal=True, **options)
    except (TypeError, ValueError) as err:
        raise type(err)(f"--core {args.core} (options {options}): {err}") from None
    check_agent_core(core, args.core, args.dim)
    encoder = encoder_for(observation_space, args.dim, args.visual)
    weight = args.reconstruction
    if weight is None:
        weight = getattr(encoder, "default_reconstruction", 0.0)
    return ActorCritic(encoder, core, int(action_space.n), args.hidden, reconstruction=weight,
                       reconstruct_every=args.reconstruct_every, value_heads=2 if args.reward_part else 1,
                       head_activation=args.head_activation)


def make_optimizer(agent: nn.Module, args: Args, device: torch.device) -> torch.optim.Optimizer:
    """Adam with ``args.lr`` and ``args.adam_eps``, fused: every parameter updated in one kernel (CPU and
    CUDA), where torch's default on a CPU is a loop over the tensors, and a small agent's step is mostly
    that loop's per-tensor overhead. (The fused kernel bumps no version counter: a cache a core keeps
    across updates compares parameter values, ``layers.ParameterVersion``.)"""
    kernel = {"fused": True} if device.type in ("cpu", "cuda") else {"foreach": True}
    return torch.optim.Adam(agent.parameters(), lr=args.lr, eps=args.adam_eps, **kernel)


def check_agent_core(core: torch.nn.Module, name: str, dim: int) -> None:
    """A ValueError naming ``name`` unless ``core`` carries a state and takes ``done`` inside a call."""
    state = core.init_state(1)
    if state is None:
        raise ValueError(f"core {name!r} keeps no state between calls (init_state returns None): an agent "
                         "acting one step at a time would see only the current step; use a recurrent core")
    dtype = next(core.parameters()).dtype
    x, done = torch.zeros(1, 2, dim, dtype=dtype), torch.tensor([[True, False]])
    try:
        with torch.no_grad():
            core(x, state=state, done=done)
    except (TypeError, ValueError) as err:
        raise ValueError(f"core {name!r} does not take episode ends inside a call (done=...), which PPO's "
                         f"replay of stored rollouts needs ({' '.join(str(err).split())})") from None


# =============================================================================================
# Observations: numpy arrays (or dicts of them) from the envs -> tensors with a time dimension
# =============================================================================================


# =============================================================================================
# 1. Rollout
# =============================================================================================


@dataclass
class Rollout:
    """``T`` steps of ``B`` envs, batch first (``[B, T]``), as the agent acted."""

    obs: Any  # [B, T, ...]: a tensor or a dict of tensors
    actions: Tensor  # [B, T] long
    logprobs: Tensor  # [B, T] log pi(a_t | history) when acting
    values: Tensor  # [B, T] V(history up to t) when acting ([B, T, 2] with a reward part: its, the rest's)
    rewards: Tensor  # [B, T] ([B, T, 2] with a reward part)
    terminated: Tensor  # [B, T] bool: step t ended its episode in a terminal state
    truncated: Tensor  # [B, T] bool: step t ended its episode by a time limit
    final_values: Tensor  # [B, T] V(final observation) where truncated, else 0
    next_value: Tensor  # [B] V(the observation after the rollout), the state carried
    state: Any  # the agent's state at the start of each window of ``window`` steps, window-major [T / window * B]
    env_seconds: float = 0.0  # of the rollout's time, the seconds spent in envs.step
    window: int | None = None  # steps per replayed window (``recurrence``); None: the whole rollout, one window
    context: Tail | None = None  # the previous rollout's last steps, replayed before this one's (replay_context)
    tail_state: Any = None  # the state at the start of this rollout's last ``replay_context`` steps

    @property
    def done(self) -> Tensor:
        return self.terminated | self.truncated

    def tail(self, steps: int) -> Tail:
        """This rollout's last ``steps`` steps: the context of the next rollout's replay."""
        if self.tail_state is None:
            raise ValueError("the rollout kept no tail state: collect it with context_steps")
        return Tail(obs_map(lambda x: x[:, -steps:], self.obs), self.done[:, -steps:], self.tail_state)


@dataclass
class Tail:
    """The last ``K`` steps of a rollout, which the next rollout's replay runs first (``Args.replay_context``):
    their observations ``[B, K, ...]``, episode ends ``[B, K]`` and the agent's state at their first step, as
    it acted. Replayed with the current weights, they rebuild the state the next rollout started from (the
    same state while the weights are those that acted) with a gradient path through them."""

    obs: Any
    done: Tensor
    state: Any


class EpisodeTracker:
    """Returns and lengths of the episodes as they end, and their ``success`` where the env reports one
    in the ended episode's info (Visual Match's choice, Key-to-Door's door: logged as ``success_rate``
    beside the return, which mixes the choice with the apples), and whether each lay whole in one
    replayed window (``episodes_whole``: only then does the gradient of its last steps reach its first;
    a window's start state is stored, so no gradient crosses it)."""

    def __init__(self, num_envs: int):
        self.returns, self.lengths = np.zeros(num_envs), np.zeros(num_envs, dtype=np.int64)
        self.finished: list[tuple[float, int]] = []
        self.successes: list[float] = []
        self.whole: list[float] = []

    def step(self, rewards: np.ndarray, done: np.ndarray, info: dict | None = None,
             window_steps: int | None = None) -> None:
        """``window_steps``: the steps of the replayed window so far, this one included (None: not known)."""
        self.returns += rewards
        self.lengths += 1
        for i in np.flatnonzero(done):
            self.finished.append((float(self.returns[i]), int(self.lengths[i])))
            if window_steps is not None:
                self.whole.append(float(self.lengths[i] <= window_steps))
        self.returns[done], self.lengths[done] = 0.0, 0
        final = (info or {}).get("final_info") or {}
        if "success" in final:
            self.successes += final["success"][final["_success"]].astype(float).tolist()

    def take(self) -> tuple[list[tuple[float, int]], list[float], list[float]]:
        """The ``(return, length)``, the successes and the whole-in-one-window flags (1.0 or 0.0) of the
        episodes ended since the last take."""
        taken = self.finished, self.successes, self.whole
        self.finished, self.successes, self.whole = [], [], []
        return taken


class StallWatch:
    """Says once when the policy has stopped moving (``Args.stall_updates``, ``Args.stall_kl``).

    Stalled: for ``updates`` updates in a row the approximate KL between the acting and the updated
    policy stayed below ``kl`` while the policy kept at least half of its largest entropy
    (``max_entropy``, log of the action count; None: not checked), and the training return has not moved:
    the mean return of the episodes that ended in the second half of those updates is within two standard
    errors of the first half's (or either half ended fewer than two episodes). The entropy alone cannot
    tell: a policy can sit just below its maximum while every update moves it less and less. Without it a
    converged policy (nearly deterministic, its return at the task's best) looked stalled (docs/rl.md,
    "The stall warning"). Nor is an update counted once the annealed learning rate is below
    ``SETTLING`` of its start (``lr_fraction``): there the schedule stops the policy by design, and the
    warning fired in the last tenth of runs whose learning rate had annealed toward 0."""

    SETTLING = 0.1

    def __init__(self, updates: int, kl: float, max_entropy: float | None = None):
        self.updates, self.kl, self.max_entropy = updates, kl, max_entropy
        self.streak: list[list[float]] = []  # the returns of the episodes ended in each update of the streak
        self.warned = False

    def step(self, approx_kl: float, returns: list[float], entropy: float | None = None,
             lr_fraction: float = 1.0) -> bool:
        """Record one update; True once, at the update where the stall is first seen."""
        if self.warned or not self.updates:
            return False
        converged = entropy is not None and self.max_entropy is not None and entropy < self.max_entropy / 2
        if converged or lr_fraction < self.SETTLING or not approx_kl < self.kl:
            self.streak = []
            return False
        self.streak = [*self.streak, returns][-self.updates:]
        if len(self.streak) < self.updates or self._return_moved():
            return False
        self.warned = True
        return True

    def _return_moved(self) -> bool:
        half = self.updates // 2
        early = np.array([r for rs in self.streak[:half] for r in rs])
        late = np.array([r for rs in self.streak[half:] for r in rs])
        if len(early) < 2 or len(late) < 2:
            return False
        error = math.sqrt(early.var(ddof=1) / len(early) + late.var(ddof=1) / len(late))
        return abs(late.mean() - early.mean()) > 2 * error

    def message(self, update: int, frames: int) -> str:
        return (f"the policy has stalled: approx_kl < {self.kl:g} for {self.updates} updates in a row while the "
                f"training return did not move (update {update}, {frames} frames). Likely causes: a learning "
                "rate too small for the advantages' scale (try --norm-adv or a larger --lr), an entropy weight "
                "that holds the policy near uniform (--ent-coef), or too few gradient steps per frame "
                "(--num-minibatches, --update-epochs)")


class DeadHeadsWatch:
    """Says once when the heads pass the core no gradient: at least ``SHARE`` of the policy's hidden units
    pass (almost) none (``agents.passes_no_gradient``) for ``updates`` updates in a row. The PPO loss then
    trains the heads' last layer over units stuck at their limits, and no longer the core or the encoder:
    the paper's HTM layer's output, left unnormalised, grew to norms of 100-15,000 in the runs that did not
    learn their controls (docs/rl.md, "What the missed controls have in common", "Ballet's HTM heads")."""

    SHARE = 0.99

    def __init__(self, updates: int):
        self.updates, self.streak, self.warned = updates, 0, False

    def step(self, stats: dict[str, float]) -> bool:
        """Record one update's ``learn`` stats; True once, at the update where the streak reaches ``updates``."""
        if self.warned or not self.updates or "heads_no_gradient_policy" not in stats:
            return False
        self.streak = self.streak + 1 if stats["heads_no_gradient_policy"] >= self.SHARE else 0
        self.warned = self.streak >= self.updates
        return self.warned

    def message(self, stats: dict[str, float], update: int, frames: int) -> str:
        return (f"the heads pass the core almost no gradient: {stats['heads_no_gradient_policy']:.0%} of the policy's "
                f"and {stats['heads_no_gradient_value']:.0%} of the value's hidden units saturated (tanh) or at 0 "
                f"(ReLU) for {self.updates} updates in a row (update {update}, {frames} frames); the core's output "
                f"they read has a norm of {stats['core_output_norm']:.1f} per step. The core and the encoder no "
                "longer learn from the PPO loss. Likely cause: a core whose output is not normalised (HTM: "
                "--core-opt final_norm=True), or --head-activation relu")


def step_share(info: dict, key: str) -> np.ndarray:
    """``info[key]`` of every env for this step: the ended episodes' from ``info["final_info"]`` (the
    top level holds the next episode's first info there). A ValueError naming ``--reward-part`` if the
    env does not report it."""
    if key not in info:
        raise ValueError(f"--reward-part {key!r}: the env's step info has no such key (it has {sorted(info)})")
    share = np.asarray(info[key], dtype=np.float64)
    final = info.get("final_info") or {}
    if key in final:
        share = np.where(final[f"_{key}"], final[key], share)
    return share


def collect(agent: ActorCritic, envs, next_obs, state, num_steps: int, tracker: EpisodeTracker | None = None,
            window: int | None = None, timeout: str = "truncation", reward_part: str | None = None,
            context: Tail | None = None, context_steps: int = 0):
    """One rollout of ``num_steps`` steps from ``next_obs`` (the envs' current observations) and the
    agent's ``state``; returns ``(rollout, next_obs, state)`` to continue from. ``window``: keep the
    state at the start of every window of that many steps (default: the rollout's start only).
    ``context`` (the previous rollout's ``tail``) is replayed before this rollout's steps; ``context_steps``:
    keep the state at the start of this rollout's last that many steps, for the next one's context.
    ``timeout="failure"`` stores a time-limit truncation as a termination (``Args.timeout``); ``reward_part``
    (``Args.reward_part``) stores each step's reward as that info key's part and the rest. No per-environment
    Python on the hot path: the observations become tensors once per step, actions go to the envs as
    one array, and only the rows whose episode was truncated are read one by one."""
    device = next(agent.parameters()).device
    B, T = envs.num_envs, num_steps
    parts = () if reward_part is None else (2,)
    buffers = {name: torch.zeros(B, T, *([] if name == "logprobs" else parts), device=device)
               for name in ("logprobs", "values", "rewards", "final_values")}
    actions = torch.zeros(B, T, dtype=torch.long, device=device)
    terminated, truncated = (torch.zeros(B, T, dtype=torch.bool, device=device) for _ in range(2))
    obs = obs_map(lambda x: x.new_zeros((B, T, *x.shape[1:])), as_tensor(next_obs, device))
    window_states = []  # the state each window of the replay starts from, as the agent had it
    tail_state = None
    replayed_before = 0 if context is None else context.done.shape[1]  # steps of a replayed call before this one's
    acting = Acting(agent, envs, next_obs, state, choose=sampled)  # resets the ended rows' state
    for t in range(T):
        if t % (window or T) == 0:
            window_states.append(copy_state(acting.state))  # the steps write into acting's own
        if context_steps and t == T - context_steps:
            tail_state = copy_state(acting.state)
        step = acting.step()
        for key, buffer in (obs.items() if isinstance(obs, dict) else [(None, obs)]):
            buffer[:, t] = step.obs if key is None else step.obs[key]
        term, trunc, info = step.terminated, step.truncated, step.info
        if timeout == "failure":  # the time-out ends the return: nothing to bootstrap
            term, trunc = term | trunc, np.zeros_like(trunc)
        actions[:, t], buffers["logprobs"][:, t], buffers["values"][:, t] = step.action, step.logprob, step.value
        reward_t = torch.as_tensor(step.reward, dtype=torch.float32, device=device)
        if reward_part is not None:  # [B, 2]: the part the env names, and the rest
            part = torch.as_tensor(step_share(info, reward_part), dtype=torch.float32, device=device)
            reward_t = torch.stack([part, reward_t - part], -1)
        buffers["rewards"][:, t] = reward_t
        terminated[:, t] = torch.as_tensor(term, device=device)
        truncated[:, t] = torch.as_tensor(trunc, device=device)
        if trunc.any():  # bootstrap: the value of the final observation, with the ended episode's state
            rows = np.flatnonzero(trunc)
            index = torch.as_tensor(rows, device=device)
            with torch.inference_mode(), acting.in_stretch():  # every row valued, the truncated ones' kept: the
                # acting shape, [B, 1], so that a compiled agent compiles no graph per number of truncated rows
                _, _, final_value, _, _ = act(agent, final_observations(acting.obs, info, rows), step.state)
            buffers["final_values"][index, t] = final_value[index]
        if tracker is not None:
            tracker.step(step.reward, term | trunc, info, window_steps=t % (window or T) + 1 + replayed_before)
    next_obs, state = acting.obs, acting.state
    with torch.inference_mode(), acting.in_stretch():  # the state its last step left
        _, _, next_value, _, _ = act(agent, next_obs, state)
    rollout = Rollout(obs, actions, terminated=terminated, truncated=truncated, next_value=next_value.clone(),
                      state=concat_states(window_states), window=window, env_seconds=acting.env_seconds,
                      context=context, tail_state=tail_state, **buffers)
    return rollout, next_obs, state


# =============================================================================================
# 2. GAE
# =============================================================================================


def gae(rollout: Rollout, gamma: float, gae_lambda: float) -> tuple[Tensor, Tensor]:
    """``(advantages, returns)`` ``[B, T]`` (Schulman et al. 2016, eq. 16; returns = advantages + values).

    The value after step t is the next step's, or after an episode's end the final observation's when
    truncated and 0 when terminated; the sum of TD errors stops at every episode's end. With a reward
    part (``[B, T, 2]`` values and rewards) each part's advantages and returns, ``[B, T, 2]``."""
    values, T = rollout.values, rollout.values.shape[1]
    advantages = torch.zeros_like(values)
    last = torch.zeros_like(rollout.next_value)
    parts = values.dim() == 3  # [B, T, 2]: each part of the reward with its own value (Args.reward_part)
    truncated, terminated, done = ((x.unsqueeze(-1) if parts else x) for x in
                                   (rollout.truncated, rollout.terminated, rollout.done))
    for t in reversed(range(T)):
        next_value = rollout.next_value if t == T - 1 else values[:, t + 1]
        next_value = torch.where(truncated[:, t], rollout.final_values[:, t], next_value)
        next_value = torch.where(terminated[:, t], 0.0, next_value)
        delta = rollout.rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * gae_lambda * (~done[:, t]) * last
        advantages[:, t] = last
    return advantages, advantages + values


# =============================================================================================
# 3. Learning: replay whole env sequences from the rollout's start state, with done inside
# =============================================================================================


def as_windows(x: Tensor, window: int) -> Tensor:
    """``[B, T, ...] -> [W * B, window, ...]``, window-major (``W = T / window``), as ``collect`` stores
    the states the windows start from."""
    return x.unflatten(1, (x.shape[1] // window, window)).transpose(0, 1).flatten(0, 1)


def replay_windows(agent: ActorCritic, rollout: Rollout,
                   windows: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """``(log-probabilities, entropies, values)`` ``[n, window]`` of the rollout's actions in the windows
    ``windows`` (indices ``w * B + b`` of window ``w`` of env ``b``), recomputed in one call ``[n, window]``,
    each window from the state stored while acting at its first step, with its episode ends inside the
    call; and the agent's weighted reconstruction loss over those steps (paper 001 App. A.1; None when
    the agent has none). Without ``recurrence`` a window is a whole rollout (``W = 1``). With a ``context``
    (``replay_context``, whole rollouts only) each row's call starts at the context's first step, from the
    state stored there, and its outputs over the context's steps are dropped: they are not scored, but the
    gradient of the rollout's steps flows back through them (and the reconstruction loss covers them)."""
    window = rollout.window or rollout.actions.shape[1]
    obs = obs_map(lambda x: as_windows(x, window)[windows], rollout.obs)
    done, state, skip = as_windows(rollout.done, window)[windows], rollout.state, 0
    if rollout.context is not None:  # W = 1: a window index is an env row
        context, skip = rollout.context, rollout.context.done.shape[1]
        obs = obs_map(lambda x, before: torch.cat([before[windows], x], 1), obs, context.obs)
        done, state = torch.cat([context.done[windows], done], 1), context.state
    logits, values, _, auxiliary = agent(obs, state.select(windows), done=done, return_auxiliary=True)
    logits, values = logits[:, skip:], values[:, skip:]
    logp = F.log_softmax(logits, -1)
    logprobs = logp.gather(-1, as_windows(rollout.actions, window)[windows].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logprobs, entropy, values, auxiliary


def env_windows(rows: Tensor, num_envs: int, num_windows: int) -> Tensor:
    """The window indices (``w * B + b``) of every window of the env rows ``rows``, window-major."""
    return torch.cat([rows + w * num_envs for w in range(num_windows)])


def replay(agent: ActorCritic, rollout: Rollout, rows: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """``replay_windows`` of every window of the env rows ``rows``, put back in time order: ``[b, T]``."""
    B, T = rollout.actions.shape
    W, b = T // (rollout.window or T), len(rows)
    logprobs, entropy, values, auxiliary = replay_windows(agent, rollout, env_windows(rows, B, W))

    def in_time_order(x: Tensor) -> Tensor:  # [W * b, window] -> [b, T]
        return x.unflatten(0, (W, b)).transpose(0, 1).flatten(1, 2)

    return in_time_order(logprobs), in_time_order(entropy), in_time_order(values), auxiliary


@contextlib.contextmanager
def differentiable_on_cudnn(agent: nn.Module):
    """The agent acts and replays in eval mode (the same function both times, no dropout), but cuDNN
    differentiates an ``nn.RNN``/``LSTM``/``GRU`` only in training mode. Such a module without dropout
    computes the same function in either mode, so for the update it is put in training mode, then back."""
    switched = [m for m in agent.modules() if isinstance(m, nn.RNNBase) and not m.training and m.dropout == 0]
    for module in switched:
        module.train()
    try:
        yield
    finally:
        for module in switched:
            module.eval()


def learn(agent: ActorCritic, optimizer: torch.optim.Optimizer, rollout: Rollout, advantages: Tensor,
          returns: Tensor, args: Args, ctx: Context | None = None) -> dict[str, float]:
    """PPO's epochs over one rollout; the means of the losses and diagnostics over its minibatches.

    Under torchrun (``ctx``) every rank has its own rollout; each minibatch's gradients are averaged
    over the ranks before clipping, so every rank takes the same step."""
    ctx = ctx or Context()
    B, T = rollout.actions.shape
    window = rollout.window or T
    W = T // window
    # every per-step tensor as windows [W * B, window]: a minibatch is a set of windows either way
    acted_logprobs, acted_values, advantages, targets = (as_windows(x, window) for x in
                                                      (rollout.logprobs, rollout.values, advantages, returns))
    by_windows = args.minibatch == "windows"
    units = W * B if by_windows else B  # what is shuffled: windows, or env rows with all their windows
    per_minibatch = units // args.num_minibatches
    sums: dict[str, Tensor] = {}  # summed on the device: one transfer per update, not one per minibatch
    count = 0
    heads: dict[str, float] = {}  # what the heads read in the update's first minibatch (eager agents only)
    for _ in range(args.update_epochs):
        order = torch.randperm(units, device=rollout.actions.device)
        for start in range(0, units, per_minibatch):
            drawn = order[start : start + per_minibatch]
            index = drawn if by_windows else env_windows(drawn, B, W)
            watch = heads_watched(agent) if count == 0 and isinstance(agent, ActorCritic) else contextlib.nullcontext()
            with watch as seen:
                logprobs, entropy, values, auxiliary = replay_windows(agent, rollout, index)
            heads.update(seen or {})
            logratio = logprobs - acted_logprobs[index]
            ratio = logratio.exp()
            adv = advantages[index]
            if args.norm_adv:  # with a reward part, each part's alone (over the minibatch's steps)
                steps = (0, 1) if adv.dim() == 3 else None
                adv = (adv - adv.mean(steps, keepdim=adv.dim() == 3)) / (adv.std(steps, keepdim=adv.dim() == 3) + 1e-8)
            if adv.dim() == 3:
                adv = adv.sum(-1)
            policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
            old_values, target = acted_values[index], targets[index]
            value_loss = (values - target).square()
            if args.clip_vloss:
                clipped = old_values + (values - old_values).clamp(-args.clip_coef, args.clip_coef)
                value_loss = torch.max(value_loss, (clipped - target).square())
            if value_loss.dim() == 3:  # one loss per head, summed: each head as one value would be
                value_loss = value_loss.sum(-1)
            value_loss = 0.5 * value_loss.mean()
            entropy = entropy.mean()
            loss = policy_loss - args.ent_coef * entropy + args.vf_coef * value_loss
            terms = {}
            if auxiliary is not None:  # the replay's weighted reconstruction loss (ActorCritic(reconstruction=w))
                loss = loss + auxiliary
                terms["reconstruction_loss"] = auxiliary.detach() / agent.reconstruction  # logged unweighted
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            average_gradients(agent, ctx)
            torch.nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
            with torch.no_grad():
                approx_kl = ((ratio - 1) - logratio).mean()  # the k3 estimator (CleanRL's approx_kl)
                clip_fraction = ((ratio - 1).abs() > args.clip_coef).float().mean()
            for name, value in (("policy_loss", policy_loss.detach()), ("value_loss", value_loss.detach()),
                                ("entropy", entropy.detach()),
                                ("approx_kl", approx_kl), ("clip_fraction", clip_fraction), *terms.items()):
                sums[name] = sums.get(name, 0.0) + value.detach()
            count += 1
        # the ranks decide together, or one would wait forever for the others' gradients
        if args.target_kl is not None and float(all_reduce_mean(approx_kl, ctx)) > args.target_kl:
            break
    stats = dict(zip(sums, (torch.stack(list(sums.values())) / count).tolist(), strict=True))
    stats.update(heads)
    returns, acted = (x.sum(-1) if x.dim() == 3 else x for x in (returns, rollout.values))
    variance = float(returns.var())
    unexplained = float((returns - acted).var())
    stats["explained_variance"] = float("nan") if variance == 0 else 1 - unexplained / variance
    return stats


def average_gradients(agent: torch.nn.Module, ctx: Context) -> None:
    """Average the gradients over the ranks in one all-reduce (CleanRL's multi-GPU PPO). A parameter
    without a gradient counts as a zero one, so every rank reduces the same buffer."""
    if not ctx.distributed:
        return
    params = [p for p in agent.parameters() if p.requires_grad]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    dist.all_reduce(flat)
    flat /= ctx.world_size
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def broadcast_weights(agent: torch.nn.Module, ctx: Context) -> None:
    """Every rank starts from rank 0's weights (and buffers)."""
    if ctx.distributed:
        with torch.no_grad():
            for tensor in [*agent.parameters(), *agent.buffers()]:
                dist.broadcast(tensor, src=0)


def rank_seed(seed: int, rank: int, frames: int) -> int:
    """The action-sampling seed of ``rank`` in a run with ``seed`` (re)starting at ``frames``."""
    return int(np.random.SeedSequence([int(seed), int(rank), int(frames)]).generate_state(1)[0])


# =============================================================================================
# 4. The run: envs, agent, updates, logs, checkpoints, resume
# =============================================================================================


@dataclass
class PPOResult:
    agent: ActorCritic
    frames: int
    seconds: float  # training seconds, those before a resume included
    history: list[dict[str, Any]] = field(default_factory=list)


def train(args: Args, core_options: dict[str, Any] | None = None,
          resume: str | Path | Run | None = None) -> PPOResult:
    """Train an agent with ``args`` (``core_options``: the core builder's options).

    With ``args.out`` the run writes ``config.json``, ``metrics.csv`` (+ TensorBoard when installed)
    and checkpoints there (``chronomem.train.checkpoint``: safetensors weights, the optimizer and RNG
    with ``torch.load(weights_only=True)``, written atomically). ``resume`` (a run directory, one of
    its checkpoints, or the ``Run`` that ``chronomem.train.resume.find_run`` found) restores weights,
    optimizer, RNG, frame count and training seconds; the environments restart with new seeds and new
    episodes, and the agent's memory starts empty (an environment's state cannot be saved), so a
    resumed run is not the uninterrupted one step for step.
    Sets torch's thread count to ``args.torch_threads`` while it runs.

    Launched by torchrun (``WORLD_SIZE`` > 1 in the environment) it joins the process group (or uses
    the one already initialised) and runs as one of the ranks (module docstring, "Scale-out"); every
    rank returns the same weights and history. A process group it created is destroyed at the end."""
    check_new_run(args.out or None, resume)
    device = default_device(args.device)
    owns_group = not (dist.is_available() and dist.is_initialized())
    ctx = setup(device)
    finished = False
    try:
        with threads_set_to(args.torch_threads, "--torch-threads"):
            result = _train(args, dict(core_options or {}), resume, device, ctx)
        finished = True
        return result
    finally:
        if owns_group and finished:
            cleanup(ctx)  # waits for the other ranks
        elif owns_group and ctx.distributed:
            dist.destroy_process_group()  # a failing rank must not wait for the others: let the error out


def _train(args: Args, core_options: dict[str, Any], resume, device: torch.device, ctx: Context) -> PPOResult:
    from chronomem.progress import Progress, duration

    if ctx.distributed:
        # every rank has passed its checks on the run directory before rank 0 writes config.json there
        dist.barrier()
    torch.manual_seed(args.seed)
    envs = make_vector_env(args.env, args.num_envs, asynchronous=args.async_envs, vectorization=args.vectorization)
    # a frame counts once per rank: total_frames and the learning-rate schedule are over all ranks
    frames_per_update = args.frames_per_update * ctx.world_size
    num_updates = math.ceil(args.total_frames / frames_per_update)
    try:
        agent = make_agent(args, core_options, envs.single_observation_space, envs.single_action_space).to(device)
        optimizer = make_optimizer(agent, args, device)
        broadcast_weights(agent, ctx)
        frames, seconds_before = 0, 0.0
        run_dir = Path(args.out) if args.out and ctx.is_main else None
        restored = restore(resume, agent, map_location=device)
        if restored is not None:
            frames, seconds_before = restored.step, restored.seconds
            restore_optimizer(restored, optimizer)
            if frames > num_updates * frames_per_update:
                raise ValueError(f"--total-frames {args.total_frames} is below the checkpoint's {frames} frames "
                                 f"({restored.checkpoint}); --total-frames is the run's new total")
        if ctx.distributed:
            # the ranks have read the checkpoint before rank 0 may set later ones aside; each rank
            # samples its own actions
            dist.barrier()
            torch.manual_seed(rank_seed(args.seed, ctx.rank, frames))
        logger = MetricsLogger(run_dir)
        if run_dir is not None:
            continue_run_dir(run_dir, logger, restored,
                             {"kind": "ppo", "args": dataclasses.asdict(args), "core_options": core_options})
        ranks = f", {ctx.world_size} ranks" if ctx.distributed else ""
        label = f"{args.name or args.core} on {args.env}, seed {args.seed}{ranks}"
        reporter = Progress(num_updates * frames_per_update, label, args.progress and ctx.is_main, unit="frame",
                            initial=frames, unit_scale=True)
        reporter.update(frames, {"mean return": "—"})  # until an episode ends; fixes the order of the metrics
        model = compiled(agent, args)  # what acts and replays; ``agent`` holds the weights and is saved
        next_obs, _ = envs.reset(seed=env_seeds(args.seed + ctx.rank, frames, args.num_envs))
        state = agent.initial_state(args.num_envs, device)
        context = None  # the previous rollout's tail (replay_context); none before the first, or after a resume
        tracker = EpisodeTracker(args.num_envs)
        stall = StallWatch(args.stall_updates, args.stall_kl, max_entropy=math.log(envs.single_action_space.n))
        dead_heads = DeadHeadsWatch(args.stall_updates)
        history: list[dict[str, Any]] = [] if restored is None else restored.logged()  # the run's, resumed
        update = frames // frames_per_update
        saved_update = update if restored is not None else None
        start, window_start, window_frames = time.perf_counter(), time.perf_counter(), 0
        window, outcomes, wholes = [], [], []  # the episodes ended since the last logged row
        split = dict.fromkeys(("env", "act", "learn"), 0.0)  # the window's seconds in each part of the loop
        while update < num_updates:
            update += 1
            lr = args.lr * (1.0 - (update - 1) / num_updates) if args.anneal_lr else args.lr
            for group in optimizer.param_groups:
                group["lr"] = lr
            agent.eval()  # acting and replay must compute the same function (no dropout)
            tic = time.perf_counter()
            rollout, next_obs, state = collect(model, envs, next_obs, state, args.num_steps, tracker, args.recurrence,
                                               args.timeout, args.reward_part, context, args.replay_context)
            context = rollout.tail(args.replay_context) if args.replay_context else None
            toc = time.perf_counter()
            advantages, returns = gae(rollout, args.gamma, args.gae_lambda)
            with differentiable_on_cudnn(agent):
                stats = learn(model, optimizer, rollout, advantages, returns, args, ctx)
            split["env"] += rollout.env_seconds
            split["act"] += toc - tic - rollout.env_seconds
            split["learn"] += time.perf_counter() - toc
            frames += frames_per_update
            window_frames += frames_per_update
            ended, succeeded, whole = tracker.take()
            window += ended
            outcomes += succeeded
            wholes += whole
            # one rank's view (its KL and episodes): a stall is a property of the shared weights
            stalled = stall.step(stats["approx_kl"], [r for r, _ in ended], stats["entropy"], lr / args.lr)
            if stalled:
                reporter.note(stall.message(update, frames))
            if dead_heads.step(stats):
                reporter.note(dead_heads.message(stats, update, frames))
            seconds = seconds_before + time.perf_counter() - start
            if update % args.log_every == 0 or update == num_updates or stalled:
                elapsed = time.perf_counter() - window_start
                stats, episodes = reduce_stats(stats, window, ctx, device, outcomes, wholes)
                row = {"step": frames, "split": "train", "update": update, **episodes,
                       **{k: round(v, 6) for k, v in stats.items()}, "lr": lr,
                       "sps": round(window_frames / max(elapsed, 1e-9)), "seconds": round(seconds, 2),
                       **{f"seconds_{part}": round(value, 3) for part, value in split.items()},
                       **({"stalled": 1} if stalled else {})}
                history.append(row)
                logger.log(row)
                shown = {} if "return_mean" not in row else {"mean return": f"{row['return_mean']:.3f}"}
                if "success_rate" in row:
                    shown["success"] = f"{row['success_rate']:.1%}"
                if stall.warned:
                    shown["STALLED"] = "(see above)"
                reporter.update(frames, {**shown, "speed": f"{row['sps']:.0f} frames/s"})
                window_start, window_frames, window, outcomes, wholes = time.perf_counter(), 0, [], [], []
                split = dict.fromkeys(split, 0.0)
                # every rank reads the same averaged row, so the ranks stop together
                reached = stop_reached(row, args)
            else:
                reporter.update(frames)
                reached = False
            if run_dir is not None and args.checkpoint_every and update % args.checkpoint_every == 0:
                save_checkpoint(run_dir, frames, agent, _trainer_state(frames, optimizer, seconds))
                saved_update = update
            if reached:
                break
        seconds = seconds_before + time.perf_counter() - start
        if run_dir is not None and saved_update != update:
            save_checkpoint(run_dir, frames, agent, _trainer_state(frames, optimizer, seconds))
        last = history[-1].get("return_mean") if history else None
        reporter.close(f"{frames} frames in {duration(seconds)}"
                       + ("" if last is None else f": mean return {last:.3f} (last logged episodes)"))
        logger.close()
        return PPOResult(agent, frames, seconds, history)
    finally:
        envs.close()


def compiled(agent: ActorCritic, args: Args) -> nn.Module:
    """The agent as acting and learning call it: itself, or with ``--compile`` under ``torch.compile``
    (``chronomem.train.compile``), sharing its parameters and attributes. Shapes are static
    (``dynamic=False``): an acting step ``[B, 1]`` and a replay ``[n, window]``, one graph each."""
    from chronomem.train.compile import compiled as compile_module

    return compile_module(agent, args.compile, args.compile_mode, args.compile_backend, dynamic=False,
                          cpp_wrapper=args.compile_cpp_wrapper)


def stop_reached(row: dict[str, Any], args: Args) -> bool:
    """Whether a logged row meets the run's stopping rule (--stop-return, --stop-length, --stop-success: each
    given one) over at least --stop-episodes ended episodes (default: one per env). The floor matters at
    the start: the episodes that end in the first rollouts are the ones that ended soonest, so a wandering
    policy's first few can all look like a learned one's."""
    if args.stop_return is None and args.stop_length is None and args.stop_success is None:
        return False
    if "return_mean" not in row or (args.stop_success is not None and "success_rate" not in row):  # none ended
        return False
    if row.get("episodes", 0) < (args.num_envs if args.stop_episodes is None else args.stop_episodes):
        return False
    return ((args.stop_return is None or row["return_mean"] >= args.stop_return)
            and (args.stop_length is None or row["length_mean"] <= args.stop_length)
            and (args.stop_success is None or row["success_rate"] >= args.stop_success))


def reduce_stats(stats: dict[str, float], episodes: list[tuple[float, int]], ctx: Context, device,
                 successes: list[float] = (), whole: list[float] = ()):
    """``(stats, episode columns)`` of one logged row: the statistics averaged over the ranks, the mean
    return and length over the episodes that ended on all ranks, the success rate of those whose env
    reports one, and the share that lay whole in one replayed window (``whole``: a flag per episode, or
    none), each over all ranks, so every rank logs the same columns (one all-reduce; identity alone)."""
    sums = [sum(r for r, _ in episodes), sum(n for _, n in episodes), len(episodes), sum(successes), len(successes),
            sum(whole), len(whole)]
    reduced = all_reduce_mean(torch.tensor([*stats.values(), *sums], dtype=torch.float64, device=device), ctx)
    reduced = reduced.cpu().tolist()
    stats = dict(zip(stats, reduced[: len(stats)], strict=True))
    total_return, total_length, count, total_success, judged, total_whole, flagged = (
        value * ctx.world_size for value in reduced[len(stats):])
    count, judged, flagged = round(count), round(judged), round(flagged)
    if not count:
        return stats, {"episodes": 0}
    return stats, {"return_mean": round(total_return / count, 4), "length_mean": round(total_length / count, 2),
                   "episodes": count, **({"success_rate": round(total_success / judged, 4)} if judged else {}),
                   **({"episodes_whole": round(total_whole / flagged, 4)} if flagged else {})}


def _trainer_state(frames: int, optimizer, seconds: float) -> dict[str, Any]:
    return {"step": frames, "seconds": seconds, "optimizer": optimizer.state_dict(),
            "rng": rng_state()}
