"""Decision Transformer (Chen et al. 2021), and DT + TLB (paper 003 Sec. 4.2, Table 3).

Offline RL as sequence modelling: a trajectory is the tokens ``(R_1, s_1, a_1, R_2, s_2, a_2, ...)``,
``R_t`` the return-to-go (the sum of the rewards from step t to the episode's end), and a causal model
predicts ``a_t`` from the output at ``s_t``. Acting, it is given a target return as ``R_1``, and
``R_{t+1} = R_t - r_t`` after each reward. Paper 003: "For the proposed model, we incorporate a temporal
latent bottleneck module into the decision Transformer": DT + TLB is the same model with the causal TLB
(``chronomem.tlb``) as its core in place of the causal Transformer.

What follows the authors' Atari code (kzl/decision-transformer, ``atari/mingpt/model_atari.py``; the
facts, not its code):

* each token is embedded and squashed by tanh: the return by a linear map of the scalar, the state by a
  convolutional encoder (the Nature-DQN stack for 84 x 84 frames, ``StateEncoder``), the action by an
  embedding;
* positions: a learned embedding of the token's place in the window (``3K`` places, zeros at first)
  plus a learned embedding of the episode's step at the window's first state (the *global* timestep,
  up to ``max_timestep``, zeros at first), dropout 0.1, then the core, a LayerNorm and a bias-free
  linear head;
* the actions are predicted from the state tokens (``1::3``); acting, the window ends with the newest
  state, so it holds ``3T - 1`` tokens (the last action is the one to choose);
* weights of the linear maps and embeddings start at N(0, 0.02), biases at 0 (``init_weights``), except the
  state encoder and the return embedding, which the authors' code builds after its initialisation runs
  and so keep PyTorch's defaults (kept here).

Deviations (docs/offline_rl.md): the core is chronomem's pre-LN Transformer (``positions=False``: DT
brings its own) or TLB, built by the registry; a window never crosses an episode's start (DT's sampler
shifts a window back across it; here a short one is padded on the right and masked, ``mask``), and the
global timestep while acting is the window's first step, as in training (DT's evaluation feeds the
current step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from chronomem.checks import check_positive
from chronomem.layers import dropout_layer

__all__ = ["DecisionTransformer", "StateEncoder", "dt_tokens"]


class StateEncoder(nn.Module):
    """A state ``[..., C, H, W]`` (uint8 or float in [0, 1]) to ``[..., dim]``, tanh at the end.

    Frames of at least 36 x 36 (Atari's 84 x 84 stacks) go through the Nature-DQN convolutions (DT's
    encoder: 32 8x8/4, 64 4x4/2, 64 3x3/1, ReLU, then a linear map); smaller grids (MinAtar's 10 x 10)
    through MinAtar's own DQN's single 3x3 convolution of 16 channels (Young & Tian 2019), then the
    linear map. uint8 frames are divided by 255 as DT does; MinAtar's 0/1 channels are read as they are."""

    def __init__(self, shape: tuple[int, int, int], dim: int):
        super().__init__()
        channels, height, width = shape
        if min(height, width) >= 36:
            self.convs = nn.Sequential(nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2),
                                       nn.ReLU(), nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten())
            self.scale = 255.0
        else:
            self.convs = nn.Sequential(nn.Conv2d(channels, 16, 3, stride=1), nn.ReLU(), nn.Flatten())
            self.scale = 1.0
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, *shape)).shape[-1]
        self.shape = tuple(shape)
        self.out = nn.Linear(flat, dim)

    def forward(self, states: Tensor) -> Tensor:
        if tuple(states.shape[-3:]) != self.shape:
            raise ValueError(f"states must be [..., {', '.join(map(str, self.shape))}], got {tuple(states.shape)}")
        lead = states.shape[:-3]
        x = states.reshape(-1, *self.shape).float() / self.scale
        return torch.tanh(self.out(self.convs(x))).view(*lead, -1)


def dt_tokens(returns: Tensor, states: Tensor, actions: Tensor | None) -> Tensor:
    """Interleave ``[B, T, D]`` embeddings as ``(R_1, s_1, a_1, ..., R_T, s_T[, a_T])``: ``[B, 3T, D]``, or
    ``[B, 3T - 1, D]`` when ``actions`` has ``T - 1`` steps (acting) or is None with ``T = 1``."""
    batch, steps, dim = states.shape
    if actions is None or actions.shape[1] == steps - 1:
        last = actions if actions is not None else states[:, :0]
        padded = torch.cat([last, states.new_zeros(batch, 1, dim)], 1)
        return torch.stack([returns, states, padded], 2).flatten(1, 2)[:, :-1]
    return torch.stack([returns, states, actions], 2).flatten(1, 2)


class DecisionTransformer(nn.Module):
    """``logits [B, T, num_actions] = dt(states [B, T, C, H, W], actions [B, T] or [B, T - 1], returns [B, T],
    timestep [B], mask [B, T] or None)`` (module docstring). ``actions`` of ``T - 1`` steps: acting, the
    logits at the last step choose the next action. ``mask`` marks the valid steps, a prefix of each row.
    ``timestep`` is each row's episode step at its window's first state.

    ``core``: a causal chronomem backbone over ``[B, 3T, dim]`` tokens (the registry's ``transformer`` with
    ``positions=False``, or ``tlb``); ``context`` is K, the steps in a window; ``max_timestep`` the largest
    global timestep embedded (larger ones share the last embedding)."""

    def __init__(self, core: nn.Module, num_actions: int, state_shape: tuple[int, int, int], context: int,
                 max_timestep: int, dropout: float = 0.1):
        super().__init__()
        if not getattr(core, "causal", False):
            raise ValueError(f"the core must be causal (an action is predicted from the past only), got "
                             f"{type(core).__name__} with causal={getattr(core, 'causal', None)}")
        dim = core.dim
        self.core, self.dim = core, dim
        self.num_actions = check_positive(num_actions, "num_actions")
        self.context = check_positive(context, "context")
        self.max_timestep = check_positive(max_timestep, "max_timestep", minimum=0)
        self.action_embedding = nn.Embedding(num_actions, dim)
        self.position = nn.Parameter(torch.zeros(1, 3 * context, dim))  # the token's place in the window
        self.timestep = nn.Parameter(torch.zeros(max_timestep + 1, dim))  # the window's first step
        self.drop = dropout_layer(dropout)
        self.norm = nn.LayerNorm(getattr(core, "out_dim", dim))
        self.head = nn.Linear(getattr(core, "out_dim", dim), num_actions, bias=False)
        self.apply(init_weights)
        # Built after the initialisation, as in the authors' code: PyTorch's defaults.
        self.state_encoder = StateEncoder(state_shape, dim)
        self.return_embedding = nn.Linear(1, dim)

    def forward(self, states: Tensor, actions: Tensor, returns: Tensor, timestep: Tensor,
                mask: Tensor | None = None) -> Tensor:
        batch, steps = states.shape[:2]
        if steps > self.context:
            raise ValueError(f"a window holds at most context={self.context} steps, got {steps}")
        if actions.shape[:1] != (batch,) or actions.shape[1] not in (steps, steps - 1):
            raise ValueError(f"actions must be [B, T] or [B, T - 1] for states of [B, T] = [{batch}, {steps}], "
                             f"got {tuple(actions.shape)}")
        if returns.shape != (batch, steps):
            raise ValueError(f"returns must be [B, T] = [{batch}, {steps}], got {tuple(returns.shape)}")
        if timestep.shape != (batch,):
            raise ValueError(f"timestep must be [B] = [{batch}], got {tuple(timestep.shape)}")
        s = self.state_encoder(states)
        r = torch.tanh(self.return_embedding(returns.unsqueeze(-1).to(s.dtype)))
        a = torch.tanh(self.action_embedding(actions.long())) if actions.shape[1] else None
        x = dt_tokens(r, s, a)
        n = x.shape[1]
        t = self.timestep[timestep.long().clamp(0, self.max_timestep)]
        x = self.drop(x + self.position[:, :n] + t[:, None])
        token_mask = None
        if mask is not None:
            if mask.shape != (batch, steps):
                raise ValueError(f"mask must be [B, T] = [{batch}, {steps}], got {tuple(mask.shape)}")
            token_mask = mask.repeat_interleave(3, 1)[:, :n]
        y, _ = self.core(x, mask=token_mask)
        return self.head(self.norm(y[:, 1::3]))

    def loss(self, states: Tensor, actions: Tensor, returns: Tensor, timestep: Tensor,
             mask: Tensor | None = None) -> Tensor:
        """The mean cross-entropy of every valid step's action (DT's loss; padded steps not counted)."""
        logits = self(states, actions, returns, timestep, mask)
        losses = F.cross_entropy(logits.flatten(0, 1), actions.flatten().long(), reduction="none")
        if mask is None:
            return losses.mean()
        weights = mask.flatten().to(losses.dtype)
        return (losses * weights).sum() / weights.sum().clamp_min(1.0)

    def param_groups(self, weight_decay: float) -> list[dict]:
        """AdamW's groups as in the authors' code: the weights of linear maps and convolutions decay; biases,
        LayerNorms, embeddings and the position tables do not."""
        decay, keep = [], []
        for module in self.modules():
            for name, p in module.named_parameters(recurse=False):
                linear = isinstance(module, (nn.Linear, nn.Conv2d)) and name == "weight"
                (decay if linear else keep).append(p)
        return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


def init_weights(module: nn.Module) -> None:
    """DT's (minGPT's) initialisation: linear maps and embeddings N(0, 0.02), biases 0, LayerNorm 1 and 0."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, 0.0, 0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
