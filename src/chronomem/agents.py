"""Agents: an observation encoder, a causal core and heads, for acting one step at a time and learning
from whole sequences.

* ``ActorCritic`` (PPO, ``chronomem.rl.ppo``): ``observation -> encoder -> core -> (policy logits,
  value)``, with paper 001's reconstruction loss (App. A.1) returned to the learner when asked.
* ``InstructedPolicy`` (behaviour cloning on BabyAI, paper 003 Sec. 4.2, trained by
  ``chronomem.train``): the instruction as one token before the states or at the start of every
  chunk; acts one step at a time (``step``, with a ``PolicyState``, each row at its own step) with the
  outputs of the whole-episode forward. No value: ``chronomem.rl.acting`` calls either policy.

They sit above the heads and encoders (``chronomem.heads``, ``chronomem.encoders``) and below the loops
that drive them (``chronomem.rl``, ``chronomem.train``), which own the state between calls.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from chronomem.checks import check_ended_rows, check_positive
from chronomem.encoders import MiniGridEncoder
from chronomem.heads import reconstruction_loss
from chronomem.layers import concat_states

HEAD_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}  # ActorCritic's head_activation (PPO's --head-activation)
SATURATED = 0.99  # |tanh| above this: the unit's gradient 1 - tanh^2 is under 0.02


class ActorCritic(nn.Module):
    """An agent around any core: ``observation -> encoder -> core -> (policy logits, value)``.

    ``logits [B, N, num_actions], value [B, N], state = agent(obs, state=None, done=None)``: ``obs`` has
    ``[B, N]`` in front (see ``chronomem.encoders``); ``done [B, N]`` (True where a step is the last of
    its episode) goes to the core, which then resets the rows inside the call (docs/design.md, "Episode
    boundaries"). Policy and value are two MLPs with one hidden layer of ``hidden`` units and tanh
    (rl-starter-files' actor and critic), initialised orthogonally with gains sqrt(2), then 0.01 for
    the policy's output and 1 for the value's (CleanRL's ``layer_init``), so the first policy is
    near uniform. ``head_activation="relu"``: paper 001's heads (App. A Table 1: every activation ReLU),
    which a core's output of any scale cannot saturate; tanh's pass almost no gradient once the output
    they read is large (docs/rl.md, "What the missed controls have in common"). ``value_heads=K > 1``: the critic has K
    outputs, ``value [B, N, K]``, one return per part of the reward (PPO's ``--reward-part``).

    ``reconstruction=w`` adds paper 001's self-supervised loss (App. A.1; the heads' option, for an
    agent): a decoder from the core's output reconstructs every step's observation (for Ballet the
    image and the instruction: ``chronomem.encoders.BalletDecoder``, built by the encoder's
    ``decoder(width)``; an encoder without one is a ValueError). The learner asks for it:
    ``logits, value, state, auxiliary = agent(obs, state, done, return_auxiliary=True)`` gives ``w``
    times the mean loss over the call's steps (``chronomem.heads.reconstruction_loss``; None when
    ``w = 0``); acting does not ask and decodes nothing. ``reconstruct_every=k`` (deviation, a CPU
    budget; default 1, every step) decodes one step in every ``k`` of the call, from a phase drawn at
    random per call: an unbiased estimate of the mean over every step at ``1 / k`` of the decoder's
    cost (on Ballet's symbolic grid the decoder and its loss are most of a learner step).
    """

    def __init__(self, encoder: nn.Module, core: nn.Module, num_actions: int, hidden: int = 64,
                 reconstruction: float = 0.0, reconstruct_every: int = 1, value_heads: int = 1,
                 head_activation: str = "tanh"):
        super().__init__()
        if isinstance(num_actions, bool) or not isinstance(num_actions, int) or num_actions < 1:
            raise ValueError(f"num_actions must be a positive int, got {num_actions!r}")
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ValueError(f"hidden must be a positive int, got {hidden!r}")
        if isinstance(reconstruction, bool) or not isinstance(reconstruction, (int, float)) or not reconstruction >= 0:
            raise ValueError(f"reconstruction must be a loss weight >= 0, got {reconstruction!r}")
        if head_activation not in HEAD_ACTIVATIONS:
            raise ValueError(f"head_activation must be one of {tuple(HEAD_ACTIVATIONS)}, got {head_activation!r}")
        self.encoder, self.core = encoder, core
        out_dim = getattr(core, "out_dim", getattr(encoder, "dim", None))
        activation = HEAD_ACTIVATIONS[head_activation]
        self.actor = self._mlp(out_dim, hidden, num_actions, 0.01, activation)
        self.value_heads = check_positive(value_heads, "value_heads")
        self.critic = self._mlp(out_dim, hidden, self.value_heads, 1.0, activation)
        self.reconstruction = float(reconstruction)
        self.reconstruct_every = check_positive(reconstruct_every, "reconstruct_every")
        if self.reconstruction:
            if not hasattr(encoder, "decoder"):
                raise ValueError(f"reconstruction={reconstruction} needs an encoder with a reconstruction decoder "
                                 f"(e.g. BalletEncoder), got {type(encoder).__name__}; use reconstruction=0")
            self.decoder = encoder.decoder(out_dim)  # App. A.1: independent weights

    @staticmethod
    def _mlp(width: int, hidden: int, out: int, out_gain: float, activation: type[nn.Module]) -> nn.Sequential:
        layers = [nn.Linear(width, hidden), activation(), nn.Linear(hidden, out)]
        for layer, gain in ((layers[0], 2**0.5), (layers[2], out_gain)):
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)
        return nn.Sequential(*layers)

    def initial_state(self, batch_size: int, device=None):
        """The core's initial state for ``batch_size`` environments."""
        return self.core.init_state(batch_size, device)

    def forward(self, obs, state=None, done: Tensor | None = None, return_auxiliary: bool = False):
        """``logits, value, state``; with ``return_auxiliary`` also the weighted reconstruction loss (class
        docstring; None when ``reconstruction`` is 0)."""
        reconstruct = return_auxiliary and bool(self.reconstruction)
        targets = self.encoder.reconstruction_targets(obs) if reconstruct else None  # checked and converted once
        x = self.encoder(obs) if targets is None else self.encoder.encode(*targets)
        y, state = self.core(x, state=state) if done is None else self.core(x, state=state, done=done)
        auxiliary = None
        if reconstruct:
            auxiliary = reconstruction_loss(self.decoder, self.reconstruction, y, targets, every=self.reconstruct_every)
        logits, value = self.actor(y), self.critic(y)
        if self.value_heads == 1:
            value = value.squeeze(-1)
        return (logits, value, state, auxiliary) if return_auxiliary else (logits, value, state)


def passes_no_gradient(activation: nn.Module, hidden: Tensor) -> Tensor:
    """Where a head's hidden unit (``hidden``, the output of ``activation``) passes (almost) no gradient back
    to the core: a ReLU at 0, a tanh beyond ``SATURATED``. Boolean, the shape of ``hidden``."""
    return hidden == 0 if isinstance(activation, nn.ReLU) else hidden.abs() > SATURATED


@contextmanager
def heads_watched(agent: ActorCritic) -> Iterator[dict[str, float]]:
    """What the heads read, over the calls of ``agent`` made inside: yields a dict that each call fills with
    ``core_output_norm`` (the mean norm per step of the core's output) and ``heads_no_gradient_policy`` /
    ``heads_no_gradient_value`` (the share of the policy's and the value's hidden units that pass (almost) no
    gradient, ``passes_no_gradient``), the last call's. Once every unit of a head passes none, the PPO loss
    reaches neither the core nor the encoder through it: an unnormalised core output that has grown large
    saturates tanh heads (docs/rl.md, "What the missed controls have in common")."""
    seen: dict[str, float] = {}

    def head(name: str):
        def record(module, inputs, out):
            seen[name] = passes_no_gradient(module, out.detach()).float().mean().item()
        return record

    def core(module, inputs, out):
        seen["core_output_norm"] = out[0].detach().norm(dim=-1).mean().item()

    hooks = [agent.core.register_forward_hook(core),
             agent.actor[1].register_forward_hook(head("heads_no_gradient_policy")),
             agent.critic[1].register_forward_hook(head("heads_no_gradient_value"))]
    try:
        yield seen
    finally:
        for hook in hooks:
            hook.remove()


class InstructedPolicy(nn.Module):
    """Behaviour cloning with an instruction (paper 003 Sec. 4.2, BabyAI): ``logits [B, N, num_actions],
    None = policy(inputs, mask=mask)`` over whole episodes, ``logits [B, num_actions], state =
    policy.step(features [B, F], state)`` one step at a time (acting), with equal outputs.

    A step's ``inputs`` are ``chronomem.tasks.babyai.step_features``: the 7x7x3 view, the direction and
    the mission's token ids (uint8). The view and direction go through the ``MiniGridEncoder``
    (without its mission bag of words); the instruction becomes one token of width ``dim``: a GRU over
    its word embeddings (BabyAI's own agent reads its instruction with a GRU), its last output. Where
    the instruction token goes (the paper: "For the baseline Transformer model, we append the language
    instruction to the sequence of states [...] For the proposed model, the language instruction is
    appended to each chunk"):

    * ``placement="sequence"`` (Transformer): ``[instruction, s_0, s_1, ...]``; every state attends to it
      at every layer.
    * ``placement="chunk"`` (TLB, ``core.chunk_size = K``): every chunk is ``[instruction, K - 1 states]``,
      so each chunk attends to it.

    Deviation: one instruction token (the GRU's summary), not one token per word. The core must be
    causal; a stateless core (the Transformer) acts with a cache of each layer's keys and values, so a
    step costs O(t), not a recomputation of the episode. Acting, each row is at its own step of its own
    episode (``PolicyState.steps``; ``state.reset(done)`` starts a row afresh, as
    ``chronomem.rl.acting.Acting`` does at an episode's end), so the rows need not start together.
    """

    PLACEMENTS = ("sequence", "chunk")

    def __init__(self, core: nn.Module, dim: int, num_actions: int, vocab_size: int, max_words: int,
                 placement: str = "sequence", view: int = 7):
        super().__init__()
        if placement not in self.PLACEMENTS:
            raise ValueError(f"placement must be one of {self.PLACEMENTS}, got {placement!r}")
        if not getattr(core, "causal", False):
            raise ValueError(f"the core must be causal (an agent acts on the past only), got {type(core).__name__} "
                             f"with causal={getattr(core, 'causal', None)}")
        self.placement = placement
        if placement == "chunk":
            chunk = getattr(core, "chunk_size", None)
            if not isinstance(chunk, int) or chunk < 2:
                raise ValueError(f"placement='chunk' needs a chunked core with chunk_size >= 2 (the instruction and "
                                 f"at least one state), got chunk_size={chunk!r}")
            self.period = chunk - 1  # states per chunk
        self.core, self.dim, self.view = core, dim, view
        self.max_words = check_positive(max_words, "max_words")
        self.image_features = view * view * 3
        self.encoder = MiniGridEncoder(dim, vocab_size=1, max_words=1, view=view, mission=False)
        self.words = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.instruction_rnn = nn.GRU(dim, dim, batch_first=True)
        self.norm = nn.LayerNorm(getattr(core, "out_dim", dim))
        self.out = nn.Linear(getattr(core, "out_dim", dim), num_actions)

    # ---- inputs ---------------------------------------------------------------------------------

    def states(self, inputs: Tensor) -> Tensor:
        """``[B, N, dim]`` embedded view and direction of every step of ``inputs [B, N, F]``."""
        width = self.image_features + 1 + self.max_words
        if not isinstance(inputs, Tensor) or inputs.dim() != 3 or inputs.shape[-1] != width:
            shape = tuple(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__
            raise ValueError(f"inputs must be step features [B, N, {width}] (view, direction, mission), got {shape}")
        if inputs.is_floating_point():
            raise TypeError(f"inputs must be integer step features (uint8), got dtype {inputs.dtype}")
        image = inputs[..., :self.image_features].long().unflatten(-1, (self.view, self.view, 3))
        return self.encoder({"image": image, "direction": inputs[..., self.image_features].long()})

    def instruction(self, mission: Tensor) -> Tensor:
        """``[B, dim]``: the GRU's output after the last word of ``mission [B, max_words]`` (token ids, 0 pads)."""
        mission = mission.long()
        out, _ = self.instruction_rnn(self.words(mission))
        last = (mission != 0).long().sum(1).clamp_min(1) - 1
        return out[torch.arange(mission.shape[0], device=out.device), last]

    # ---- whole episodes (training) ----------------------------------------------------------------

    def forward(self, inputs: Tensor, state=None, mask: Tensor | None = None):
        """Whole episodes (``state`` None, training): ``logits [B, N, A], None``. Acting (``state`` a
        ``PolicyState``): ``inputs [B, N, F]`` taken one step at a time from ``state`` (``step``), the
        logits of each and the state after them, as ``chronomem.rl.acting`` calls a policy."""
        if isinstance(state, PolicyState):
            if mask is not None:
                raise ValueError("acting takes every step: mask must be None when state is a PolicyState")
            logits = []
            for t in range(inputs.shape[1]):
                step_logits, state = self.step(inputs[:, t], state)
                logits.append(step_logits)
            return torch.stack(logits, 1), state
        if state is not None:
            raise TypeError("state must be None (whole episodes, each row from its episode's start) or the "
                            f"PolicyState of acting (policy.initial_state(batch)), got {type(state).__name__}")
        s = self.states(inputs)
        batch, n, dim = s.shape
        valid = torch.ones(batch, n, dtype=torch.bool, device=s.device) if mask is None else mask
        token = self.instruction(inputs[:, 0, self.image_features + 1:])[:, None]  # the episode's mission
        if self.placement == "sequence":
            x = torch.cat([token, s], 1)
            y, _ = self.core(x, mask=torch.cat([valid[:, :1], valid], 1))
            return self.out(self.norm(y[:, 1:])), None
        p = self.period
        chunks = -(-n // p)
        pad = chunks * p - n
        s = F.pad(s, (0, 0, 0, pad)).view(batch, chunks, p, dim)
        valid = F.pad(valid, (0, pad)).view(batch, chunks, p)
        x = torch.cat([token[:, None].expand(batch, chunks, 1, dim), s], 2).flatten(1, 2)
        m = torch.cat([valid[..., :1], valid], 2).flatten(1, 2)  # a chunk's instruction is valid with its states
        y, _ = self.core(x, mask=m)
        y = y.view(batch, chunks, p + 1, -1)[:, :, 1:].flatten(1, 2)[:, :n]
        return self.out(self.norm(y)), None

    # ---- one step at a time (acting) --------------------------------------------------------------

    def initial_state(self, batch_size: int, device=None) -> PolicyState:
        core_state = self.core.init_state(batch_size, device)
        steps = torch.zeros(check_positive(batch_size, "batch_size"), dtype=torch.long, device=device)
        return PolicyState(steps=steps, instruction=None, core=core_state, cache=None)

    def step(self, features: Tensor, state: PolicyState) -> tuple[Tensor, PolicyState]:
        """The logits ``[B, num_actions]`` of one step's ``features [B, F]`` and the next state. Each row
        is at its own step of its own episode (``state.steps``): a row at its first step reads its mission,
        and a row that opens a chunk (or, placement "sequence", its episode) takes the instruction token
        before its state."""
        if not isinstance(state, PolicyState):
            raise TypeError(f"state must be a PolicyState (policy.initial_state(batch)), got {type(state).__name__}")
        inputs = features[:, None]
        s = self.states(inputs)
        fresh = state.steps == 0
        token = state.instruction
        if token is None or bool(fresh.any()):  # a row's first step: read its mission
            read = self.instruction(inputs[:, 0, self.image_features + 1:])
            token = read if token is None else torch.where(fresh[:, None], read, token)
        opens = fresh if self.placement == "sequence" else state.steps % self.period == 0
        all_open, any_open = bool(opens.all()), bool(opens.any())
        with_token = torch.cat([token[:, None], s], 1) if any_open else None  # only where a row opens
        core_state, cache = state.core, state.cache
        if all_open or not any_open:  # the rows in step: one call
            x = with_token if all_open else s
            if core_state is None:  # a stateless core: its keys and values so far
                y, cache = self.core.step(x, cache)
            else:
                y, core_state = self.core(x, state=core_state)
            y = y[:, -1]
        elif core_state is None:  # one cache for the batch: the rows that open no chunk skip a pad
            pad = torch.stack([opens, torch.ones_like(opens)], 1)
            y, cache = self.core.step(with_token, cache, mask=pad)
            y = y[:, -1]
        else:  # a state splits by rows: the rows that open a chunk, then the others, joined again
            rows = (opens.nonzero().flatten(), (~opens).nonzero().flatten())
            parts = [self.core(x[r], state=core_state.select(r)) for x, r in zip((with_token, s), rows, strict=True)]
            back = torch.cat(rows).argsort()
            y = torch.cat([part[:, -1] for part, _ in parts])[back]
            core_state = concat_states([part_state for _, part_state in parts]).select(back)
        logits = self.out(self.norm(y))
        return logits, PolicyState(state.steps + 1, token, core_state, cache)


@dataclass(frozen=True)
class PolicyState:
    """``InstructedPolicy``'s state while acting: ``steps [B]`` each row has taken in its episode, the
    instruction token ``[B, dim]`` (None before the first step), the core's state, and for a stateless
    core the ``cache`` (``chronomem.baselines.KVCache``): per layer the keys and values of every token so
    far. ``reset(done)`` starts the rows of ``done [B]`` afresh, as an acting loop does at episode ends."""

    steps: Tensor
    instruction: Tensor | None
    core: object
    cache: object

    def reset(self, done: Tensor) -> PolicyState:
        done = check_ended_rows(done, self.steps.shape[0]).to(self.steps.device)
        core = None if self.core is None else self.core.reset(done)
        cache = None if self.cache is None else self.cache.reset(done)
        return PolicyState(self.steps.masked_fill(done, 0), self.instruction, core, cache)
