"""One acting loop: an agent steps B environments of a vector env, its state carried (docs/design.md).

``Acting`` owns what acting decides about episodes: an episode ends where the env says
``terminated | truncated``, and the agent's state of the rows that ended goes back to the initial state
(``state.reset``) before the next step. PPO's rollouts (``rl.ppo.collect``), the evaluation
(``rl.evaluate.evaluate``), the GIF's single episode and BabyAI's success rate
(``chronomem.experiments.babyai.success_rate``, a policy without a value) all act through it; each keeps only what it
needs from the ``ActingStep`` it gets back. How an action is chosen is the caller's (``choose``): PPO
samples and keeps the log-probability, the evaluation samples or takes the most likely action.

The vector env must autoreset on the same step (Gymnasium's ``AutoresetMode.SAME_STEP``, as
``chronomem.envs.make.make_vector_env`` builds it): the observation returned with a done is then the next
episode's first, and the ended one's last is in ``info["final_obs"]``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from chronomem.layers import fixed_stretch, parameters_fixed, state_donated

__all__ = ["Acting", "ActingStep", "act", "as_tensor", "drawn", "final_observations", "most_likely", "obs_map",
           "sampled"]


def obs_map(fn, obs, *others):
    """``fn`` applied to an observation's tensor(s): one array, or each value of a dict; with ``others``
    (observations of the same kind), ``fn`` takes the matching tensor of each too."""
    if isinstance(obs, dict):
        return {key: fn(value, *(other[key] for other in others)) for key, value in obs.items()}
    return fn(obs, *others)


def as_tensor(obs, device) -> Any:
    return obs_map(lambda a: torch.as_tensor(np.asarray(a), device=device), obs)


def final_observations(obs, info: dict, rows) -> Any:
    """The batched observation ``obs`` (the envs' next one) with the rows ``rows`` replaced by the final
    observations of the episodes that ended there (``info["final_obs"]`` holds them one by one: same-step
    autoreset): a whole batch, whatever the number of rows, to value them in one call of the acting shape."""
    final = obs_map(np.array, obs)  # a copy
    for i in rows:
        ended = info["final_obs"][i]
        if isinstance(final, dict):
            for key in final:
                final[key][i] = ended[key]
        else:
            final[i] = ended
    return final


# How an action is chosen from ``logits [B, A]``: ``(action [B], log-probability [B] or None)``.
Choose = Callable[[Tensor], tuple[Tensor, Tensor | None]]


def sampled(logits: Tensor) -> tuple[Tensor, Tensor]:
    """An action drawn from the policy, and its log-probability (what PPO stores)."""
    logp = torch.log_softmax(logits, -1)
    action = torch.multinomial(logp.exp(), 1)
    return action.squeeze(-1), logp.gather(-1, action).squeeze(-1)


def drawn(logits: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, None]:
    """An action drawn from the policy without its log-probability (the evaluation's: softmax
    probabilities, the same draws as before PPO and the evaluation shared this loop), from ``generator``
    (default: torch's global one)."""
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1), None


def most_likely(logits: Tensor) -> tuple[Tensor, None]:
    return logits.argmax(-1), None


def act(agent, obs, state, choose: Choose | None = None):
    """One step of the agent on the batched observation ``obs`` (arrays or tensors, ``[B, ...]``):
    ``(action [B], log-probability, value, state after the step, observation as tensors)``; without
    ``choose`` (a value alone: a bootstrap) no action is drawn and action and log-probability are None.

    The policy interface: ``agent(obs [B, 1, ...], state)`` returns ``(logits [B, 1, A], value, state)``
    (an actor-critic, ``chronomem.agents.ActorCritic``) or ``(logits, state)`` (a policy without a
    value, such as ``chronomem.agents.InstructedPolicy``: the value is then None);
    ``agent.initial_state(B, device)`` is the state of B fresh episodes, and ``state.reset(done [B])``
    starts the rows of ``done`` afresh, each row at its own step of its own episode."""
    first = next(iter(agent.parameters()), None)
    obs_t = as_tensor(obs, torch.device("cpu") if first is None else first.device)
    out = agent(obs_map(lambda x: x.unsqueeze(1), obs_t), state)
    logits, value, state = out if len(out) == 3 else (out[0], None, out[1])
    action, logprob = (None, None) if choose is None else choose(logits[:, 0])
    return action, logprob, None if value is None else value[:, 0], state, obs_t


@dataclass
class ActingStep:
    """What one step of ``Acting`` saw and did. ``obs``: the observation acted on (tensors); ``state``:
    the agent's state after the step, before the ended rows were reset (a truncated episode's final
    observation is valued from it)."""

    obs: Any
    action: Tensor
    logprob: Tensor | None
    value: Tensor | None  # None for a policy without a value
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    info: dict
    state: Any

    @property
    def done(self) -> np.ndarray:
        return self.terminated | self.truncated


class Acting:
    """``agent`` stepping ``envs`` from their current observations ``obs`` and the agent's ``state``;
    ``step()`` plays one step of every env. ``obs`` and ``state`` are where the next step starts (the
    ended rows' state already reset); ``env_seconds`` is the time spent inside ``envs.step``.

    The agent's parameters must not change while one ``Acting`` plays (a rollout, an evaluation): its steps
    are one ``layers.parameters_fixed`` stretch, so a core that caches keys and values compares its
    parameters once, at the first step, not at every step; and every step after the first continues the
    stretch from the state the one before left (``continued``), so that a compiled core reads the keys and
    values cached in it without checking them (``layers.reads_cached_kv``).

    ``Acting`` owns ``state`` from here on: each step donates its input state to the agent
    (``layers.state_donated``), so a core may write the step into it (HTM's ring buffer of chunks). A state
    it hands out (``state``, ``ActingStep.state``) holds its values until the next step; a caller that
    keeps one longer keeps ``layers.copy_state`` of it."""

    def __init__(self, agent, envs, obs, state, choose: Choose = sampled):
        mode = envs.metadata.get("autoreset_mode")
        if mode != _same_step():
            raise ValueError("the vector env must autoreset on the same step (autoreset_mode=SAME_STEP, as "
                             f"chronomem.envs.make.make_vector_env builds it), got {mode}")
        self.agent, self.envs, self.obs, self.state, self.choose = agent, envs, obs, state, choose
        self.env_seconds = 0.0
        self.stretch = fixed_stretch()
        self.continued = False  # whether self.state was left by a step of this stretch

    def in_stretch(self):
        """The context of a call of the agent within this stretch, from a state its steps left (once one has
        run: ``continued``): its steps, and a caller's other calls (a truncation's value, the rollout's next
        value), which then read the cached keys and values too."""
        return parameters_fixed(self.stretch, continued=self.continued)

    @torch.inference_mode()
    def step(self) -> ActingStep:
        with self.in_stretch(), state_donated():
            action, logprob, value, state, obs_t = act(self.agent, self.obs, self.state, self.choose)
        self.continued = True
        tic = time.perf_counter()
        self.obs, reward, terminated, truncated, info = self.envs.step(action.cpu().numpy())
        self.env_seconds += time.perf_counter() - tic
        done = terminated | truncated
        self.state = state.reset(torch.as_tensor(done, device=action.device)) if done.any() else state
        return ActingStep(obs_t, action, logprob, value, reward, terminated, truncated, info, state)


def _same_step():
    import gymnasium as gym

    return gym.vector.AutoresetMode.SAME_STEP
