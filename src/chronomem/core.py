"""The causal core: one owner for the agent contract's episode ends (docs/design.md).

Every memory an agent can drive (``lstm``, ``mlp``, the relevance and Mem cores, Transformer-XL and GTrXL
with a sliding memory, causal TLB, HTM) is a ``CausalCore``. The contract it keeps:

    y [B, N, out_dim], state = core(x [B, N, dim], state=None, mask=None, done=None)

``done [B, N]`` is True where a step is the last of its episode. The output at a step sees only its own
episode's past; after a done step the row continues from the initial state; no gradient crosses the
boundary; a padded step (``mask`` False) is no step of an episode, so its done is ignored. One call with
dones equals the same steps fed as separate calls with ``state.reset(done[:, t])`` between them.

This class decides ``done`` once, for every core:

* checks ``x``, ``mask``, ``done`` and the state, and builds the initial state when none is given;
* drops the dones of padded steps;
* hands the core's ``scan`` only the episode ends *strictly inside* the call (None when there are
  none, as for every one-step call of an agent acting);
* resets, after the scan, the rows whose call ends with a done: ``state.reset(done[:, -1])``, the
  same reset a caller would apply between two calls.

A core writes only ``init_state``, ``check_state`` and ``scan`` (its whole call, with episode ends
inside it), and, if it can be built non-causal, ``done_refused``. Its state is a ``RecurrentState``
whose ``reset`` restores the initial state of the ended rows (HTM's commits the partial chunk first;
TLB's marks the rows fresh). ``tests/test_contract_registry.py`` runs the contract on every
registered core that is a ``CausalCore``, with no test file of its own.
"""

from __future__ import annotations

from torch import Tensor, nn

from chronomem.checks import check_done, check_mask, check_tensor, parameter_dtype
from chronomem.layers import any_or_compiling

__all__ = ["CausalCore"]


class CausalCore(nn.Module):
    """Base of the causal cores (module docstring). A subclass sets ``dim`` (the input width) and
    ``causal``, and writes ``init_state(batch_size, device=None)``, ``check_state(state, batch)`` and
    ``scan(x, state, mask, done)``."""

    dim: int
    causal: bool = True

    def forward(self, x: Tensor, state=None, mask: Tensor | None = None, done: Tensor | None = None):
        x = self.check_input(x)
        batch, n = x.shape[:2]
        mask = check_mask(mask, "mask", (batch, n))
        done = check_done(done, (batch, n))
        if done is not None:
            refused = self.done_refused()
            if refused is not None:
                raise ValueError(refused)
            if mask is not None:
                done = done & mask  # a padded step is no step of an episode
        state = self.init_state(batch, x.device) if state is None else self.check_state(state, batch)
        y, state = self.scan(x, state, mask, self.inner_ends(done))
        if done is not None and any_or_compiling(done[:, -1]):  # the rows whose call ends an episode
            state = state.reset(done[:, -1])
        return y, state

    @staticmethod
    def inner_ends(done: Tensor | None) -> Tensor | None:
        """``done`` without its last step, or None when no episode ends before the call's last step (under
        ``torch.compile`` only a one-step call's None: a graph does not branch on the dones' values)."""
        if done is None or done.shape[1] == 1 or not any_or_compiling(done[:, :-1]):
            return None
        inner = done.clone()
        inner[:, -1] = False
        return inner

    def check_input(self, x) -> Tensor:
        """``x [B, N, dim]`` in the parameters' dtype (a clear error otherwise)."""
        return check_tensor(x, "x", 3, self.dim, "[B, N, dim]", dtype=parameter_dtype(self))

    def done_refused(self) -> str | None:
        """Why this core, as configured, cannot take ``done`` (None: it can)."""
        if self.causal:
            return None
        return (f"done (episode ends inside a call) needs a causal {type(self).__name__}: a non-causal one lets a "
                "step see later steps, which may belong to the next episode")

    def init_state(self, batch_size: int, device=None):
        raise NotImplementedError

    def check_state(self, state, batch: int):
        """``state`` if it is this core's state for ``batch`` rows; else a TypeError or ValueError."""
        raise NotImplementedError

    def scan(self, x: Tensor, state, mask: Tensor | None, done: Tensor | None):
        """The whole call: ``(y, state)`` from checked inputs; ``done`` holds only episode ends before the
        call's last step (None: none), and the state after the last step is reset by ``forward``."""
        raise NotImplementedError
