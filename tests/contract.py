"""The agent contract of a causal core (docs/design.md), as reusable checks.

A core is called ``y, state = core(x, state=None, done=None)`` with ``x [B, N, D]`` and ``done [B, N]``
True where a step is the last of its episode. The references here use only what the contract already
promises elsewhere (streaming with ``state.reset``), so a check fails when ``done`` inside a call, or
streaming at an arbitrary split, differs from it:

* ``check_done_equals_reset``: one call with dones == the same steps fed as consecutive calls cut
  after every step where any row's episode ends, with ``state.reset(done[:, t])`` between them;
  outputs, final state and gradients (into the input and every parameter).
* ``check_any_split``: calls of random lengths (one step included), with or without dones, == one call.
* ``check_select_concat``: ``state.select(rows)`` and ``concat_states`` split and join the batch.

Use float64 cores for tight tolerances. Every check runs on ``TEST_DEVICE`` (``CHRONOMEM_TEST_DEVICE``,
default cpu; tests/conftest.py): it moves the core and the inputs there.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from helpers import TEST_DEVICE


def on_test_device(core: nn.Module, *tensors: Tensor | None):
    """``core`` and ``tensors`` (None stays None) on ``TEST_DEVICE``."""
    return core.to(TEST_DEVICE), *(None if t is None else t.to(TEST_DEVICE) for t in tensors)


def randn64(*shape, seed: int = 0) -> Tensor:
    """A float64 normal tensor from its own seeded generator."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@torch.no_grad()
def jitter_layer_norms_(model: nn.Module) -> nn.Module:
    """Give every LayerNorm a non-trivial affine, so that a mixed-up norm shows in a comparison."""
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            module.weight.uniform_(0.5, 1.5)
            module.bias.normal_(0.0, 0.1)
    return model


def random_dones(batch: int, steps: int, generator: torch.Generator, p: float = 0.15) -> Tensor:
    """A done pattern with an episode end at the first step of row 0, at the last step of row 1, and
    several episodes in some rows."""
    done = torch.rand(batch, steps, generator=generator) < p
    done[0, 0] = True
    done[min(1, batch - 1), -1] = True
    return done


def state_tensors(state) -> list[Tensor]:
    """Every tensor of a (nested) state, in a fixed order."""
    if isinstance(state, Tensor):
        return [state]
    if dataclasses.is_dataclass(state):
        return [t for f in dataclasses.fields(state) for t in state_tensors(getattr(state, f.name))]
    if isinstance(state, (tuple, list)):
        return [t for s in state for t in state_tensors(s)]
    return []


def assert_same_state(a, b, atol: float, name: str = "state") -> None:
    ta, tb = state_tensors(a), state_tensors(b)
    assert len(ta) == len(tb), f"{name}: different structure"
    for i, (u, v) in enumerate(zip(ta, tb, strict=True)):
        if u.dtype == torch.bool or not u.is_floating_point():
            assert torch.equal(u, v), f"{name}: tensor {i} differs"
        else:
            torch.testing.assert_close(u, v, atol=atol, rtol=0, msg=f"{name}: tensor {i}")


def _grads(core: nn.Module, x: Tensor, y: Tensor, weights: Tensor) -> list[Tensor]:
    params = [p for p in core.parameters() if p.requires_grad]
    grads = torch.autograd.grad((y * weights).sum(), [x, *params], allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(grads, [x, *params], strict=True)]


def run_in_pieces(core: nn.Module, x: Tensor, cuts: list[int], done: Tensor | None = None, state=None,
                  pass_done: bool = True):
    """Feed ``x`` in consecutive pieces ending at ``cuts`` (exclusive ends, the last = N).

    With ``pass_done`` each piece gets its slice of ``done``; otherwise the pieces are cut at dones
    and ``state.reset`` applies them between calls (the reference)."""
    outputs, start = [], 0
    for end in cuts:
        piece_done = None if done is None or not pass_done else done[:, start:end]
        y, state = core(x[:, start:end], state=state, done=piece_done) if piece_done is not None else core(
            x[:, start:end], state=state)
        outputs.append(y)
        if done is not None and not pass_done:
            state = state.reset(done[:, end - 1])
        start = end
    return torch.cat(outputs, dim=1), state


def check_done_equals_reset(core: nn.Module, x: Tensor, done: Tensor, atol: float = 1e-9) -> None:
    """One call with ``done`` == calls cut after every done with ``state.reset`` between them."""
    core, x, done = on_test_device(core, x, done)
    steps = x.shape[1]
    cuts = sorted({t + 1 for t in torch.nonzero(done.any(0)).flatten().tolist()} | {steps})
    x1 = x.detach().clone().requires_grad_(True)
    x2 = x.detach().clone().requires_grad_(True)
    y1, s1 = core(x1, done=done)
    y2, s2 = run_in_pieces(core, x2, cuts, done, pass_done=False)
    torch.testing.assert_close(y1, y2, atol=atol, rtol=0, msg="outputs with done inside the call")
    assert_same_state(s1, s2, atol, "final state with done inside the call")
    weights = torch.randn(y1.shape, generator=torch.Generator().manual_seed(1), dtype=y1.dtype).to(y1.device)
    for i, (g1, g2) in enumerate(zip(_grads(core, x1, y1, weights), _grads(core, x2, y2, weights), strict=True)):
        torch.testing.assert_close(g1, g2, atol=atol * 100, rtol=0, msg=f"gradient {i} (0 = input)")


def random_cuts(steps: int, generator: torch.Generator, one_step_pieces: bool = False) -> list[int]:
    if one_step_pieces:
        return list(range(1, steps + 1))
    n_cuts = int(torch.randint(1, max(2, steps // 3), (1,), generator=generator))
    inner = torch.randperm(steps - 1, generator=generator)[:n_cuts] + 1
    return sorted(set(inner.tolist()) | {steps})


def check_any_split(core: nn.Module, x: Tensor, done: Tensor | None, generator: torch.Generator,
                    atol: float = 1e-9) -> None:
    """Calls of random lengths, and of one step each, == one call (with ``done`` if given)."""
    core, x, done = on_test_device(core, x, done)
    with torch.no_grad():
        y, state = core(x, done=done) if done is not None else core(x)
        for one_step in (False, True):
            cuts = random_cuts(x.shape[1], generator, one_step_pieces=one_step)
            y_pieces, state_pieces = run_in_pieces(core, x, cuts, done)
            torch.testing.assert_close(y_pieces, y, atol=atol, rtol=0, msg=f"outputs at cuts {cuts}")
            assert_same_state(state_pieces, state, atol, f"state at cuts {cuts}")


def check_select_concat(core: nn.Module, x: Tensor, concat_states, atol: float = 1e-9) -> None:
    """Rows selected from a state and joined again continue exactly as the whole batch does."""
    core, x = on_test_device(core, x)
    batch = x.shape[0]
    half = x.shape[1] // 2
    with torch.no_grad():
        _, state = core(x[:, :half])
        y_whole, _ = core(x[:, half:], state=state)
        order = torch.arange(batch - 1, -1, -1, device=x.device)
        parts = [state.select(order[:1]), state.select(order[1:])]
        joined = concat_states(parts)
        y_joined, _ = core(x[order, half:], state=joined)
        torch.testing.assert_close(y_joined, y_whole[order], atol=atol, rtol=0, msg="select + concat")


def check_done_trials(core: nn.Module, steps: int, dim: int, trials: int = 2) -> None:
    """``check_done_equals_reset`` on ``trials`` random inputs ``[4, steps, dim]`` and done patterns."""
    generator = torch.Generator().manual_seed(2)
    for trial in range(trials):
        x = randn64(4, steps, dim, seed=3 + trial)
        check_done_equals_reset(core, x, random_dones(4, steps, generator, p=0.2))


def check_split_trials(core: nn.Module, steps: int, dim: int, with_done: bool, trials: int = 2) -> None:
    """``check_any_split`` on ``trials`` random inputs ``[3, steps + trial, dim]``, with dones or without."""
    generator = torch.Generator().manual_seed(5)
    for trial in range(trials):
        x = randn64(3, steps + trial, dim, seed=6 + trial)
        done = random_dones(3, steps + trial, generator, p=0.2) if with_done else None
        check_any_split(core, x, done, generator)
