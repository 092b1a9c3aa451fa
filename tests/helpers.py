"""Assertions shared by several test modules (pytest puts this folder on ``sys.path``)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

# The device of the contract and kernel tests (tests/conftest.py): CHRONOMEM_TEST_DEVICE=cuda on a GPU.
TEST_DEVICE = torch.device(os.environ.get("CHRONOMEM_TEST_DEVICE", "cpu"))


def load_benchmark(name: str) -> ModuleType:
    """The script ``benchmarks/NAME.py`` as a module (benchmarks are scripts, not a package), registered
    in ``sys.modules`` so that its dataclasses find their module."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def assert_same_gradients(reference: nn.Module, model: nn.Module, atol: float = 2e-5, rtol: float = 1e-4) -> None:
    """Every parameter of ``model`` has the gradient of the same parameter of ``reference`` (None = 0)."""
    for (name, a), b in zip(reference.named_parameters(), model.parameters(), strict=True):
        zeros = torch.zeros_like(a)
        torch.testing.assert_close(zeros if b.grad is None else b.grad, zeros if a.grad is None else a.grad,
                                   atol=atol, rtol=rtol, msg=name)


def assert_cell_impls_agree(encoder: nn.Module, obs) -> None:
    """``encoder`` (an encoder with ``cell_impl``) gives the same features on ``obs`` with its folded and
    its reference path, and the same gradient into every weight."""
    outputs, grads = [], []
    for impl in ("reference", "folded"):
        encoder.cell_impl = impl
        y = encoder(obs)
        outputs.append(y)
        grads.append(torch.autograd.grad(y.square().sum(), list(encoder.parameters())))
    torch.testing.assert_close(outputs[1], outputs[0])
    for folded, reference in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(folded, reference, rtol=1e-4, atol=1e-5)


def assert_compiled_acting_matches(core: nn.Module, x: torch.Tensor, done: torch.Tensor, atol: float = 1e-5) -> None:
    """``core`` acting one step at a time on ``x [B, N, D]`` (episode ends ``done [B, N]``), without
    gradients, its steps one fixed stretch as ``rl.acting.Acting`` plays them (every step after the first
    ``continued``: a compiled step then reads the cache unchecked, the first projects it again; each step's
    input state donated, ``layers.state_donated``, so that a compiled step may write into it), under
    ``torch.compile`` (``aot_eager``: traced, no code generated) gives eager's outputs step after step in
    whole graphs (no break: nothing read from a value), and eager's states but for the version tag of the
    cached keys and values (0: a compiled step names none, ``layers.cache_version``), so that an eager step
    from a compiled step's state gives eager's output. After its parameters change in place (an update) it
    acts on without compiling again: two more passes over the steps from the states the first left, each a
    new stretch, the parameters moved before each, under ``error_on_recompile``."""
    import dataclasses

    from torch._dynamo.utils import counters

    from chronomem.layers import copy_state, fixed_stretch, parameters_fixed, state_donated
    from contract import assert_same_state

    def act(x, state, done):
        return core(x, state, done=done)

    def untagged(state):
        version = getattr(state, "kv_version", None)
        return state if version is None else dataclasses.replace(state, kv_version=torch.zeros_like(version))

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(act, backend="aot_eager", dynamic=False)  # static, as PPO compiles
    with torch.inference_mode():  # as a rollout after PPO's first starts: from a state made while acting
        eager_state = core.init_state(x.shape[0])
        compiled_state = copy_state(eager_state)
    try:
        for attempt in range(3):
            if attempt:
                with torch.no_grad():
                    for p in core.parameters():
                        p.add_(0.01 * torch.randn_like(p))  # an update, in place
            stretch = fixed_stretch()
            with torch.inference_mode(), torch._dynamo.config.patch(error_on_recompile=attempt > 0):
                for t in range(x.shape[1]):
                    step = (x[:, t : t + 1], done[:, t : t + 1])
                    if t == x.shape[1] - 1:  # an eager step from the compiled state: the cache projected again
                        torch.testing.assert_close(act(step[0], compiled_state, step[1])[0],
                                                   act(step[0], eager_state, step[1])[0], atol=atol, rtol=atol)
                    with parameters_fixed(stretch, continued=t > 0):
                        want, eager_state = act(step[0], eager_state, step[1])
                        with state_donated():
                            got, compiled_state = compiled(step[0], compiled_state, step[1])
                    torch.testing.assert_close(got, want, atol=atol, rtol=atol, msg=f"output at step {t}")
                    assert_same_state(compiled_state, untagged(eager_state), atol, f"state after step {t}")
        breaks = list(counters["graph_break"])
    finally:
        torch._dynamo.reset()
    assert not breaks, breaks


def assert_compiled_acting_reads_the_cache(core: nn.Module, x: torch.Tensor, field: str, atol: float = 1e-5) -> None:
    """A compiled acting step (``aot_eager``, static, as PPO compiles) that continues its stretch reads the keys
    and values cached in its state (``field``), unchecked: made wrong, they change its output. The stretch's
    first step projects them again: the same output from the wrong cache as from the right one, eager's."""
    import dataclasses

    from chronomem.layers import fixed_stretch, parameters_fixed

    with torch.no_grad():
        _, state = core(x[:, :-1])  # eager, without gradients: a state whose cache is current
    spoiled = dataclasses.replace(state, **{field: tuple(kv + 1.0 for kv in getattr(state, field))})
    step, stretch = x[:, -1:], fixed_stretch()
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, state: core(x, state)[0], backend="aot_eager", dynamic=False)
    try:
        with torch.inference_mode():
            want = core(step, state)[0]
            with parameters_fixed(stretch):
                first, first_spoiled = compiled(step, state), compiled(step, spoiled)
            with parameters_fixed(stretch, continued=True):
                later, later_spoiled = compiled(step, state), compiled(step, spoiled)
    finally:
        torch._dynamo.reset()
    for got in (first, first_spoiled, later):
        torch.testing.assert_close(got, want, atol=atol, rtol=atol)
    assert (later_spoiled - want).abs().max() > 100 * atol  # the cache was read


def assert_compiled_learning_matches(core: nn.Module, x: torch.Tensor, done: torch.Tensor, atol: float = 1e-5) -> None:
    """``core`` learning on ``x [B, N, D]`` with episode ends inside the call, as PPO replays a rollout (from
    the state acting left, with gradients), under ``torch.compile`` (``aot_eager``, static, as PPO compiles)
    gives eager's outputs, state and parameter gradients, in one graph (no break: nothing read from a
    value); and a second rollout, from a later state with other episode ends (``done`` rolled along
    time), runs under ``error_on_recompile``."""
    from torch._dynamo.utils import counters

    from contract import assert_same_state

    def learn(x, state, done):
        return core(x, state, done=done)

    parameters = [p for p in core.parameters() if p.requires_grad]
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(learn, backend="aot_eager", dynamic=False)
    start = None
    try:
        for rollout in range(2):
            with torch.no_grad():  # the state the rollout starts from: what acting left
                _, start = core(x, start, done=done.roll(rollout + 1, 1))
            ends = done.roll(rollout, 1)
            results = []
            for fn in (learn, compiled):
                with torch._dynamo.config.patch(error_on_recompile=rollout == 1):
                    y, state = fn(x, start, ends)
                grads = torch.autograd.grad(y.square().sum(), parameters, allow_unused=True)
                results.append((y, state, grads))
            (want, want_state, want_grads), (got, got_state, got_grads) = results
            torch.testing.assert_close(got, want, atol=atol, rtol=atol, msg=f"outputs of rollout {rollout}")
            assert_same_state(got_state, want_state, atol, f"state after rollout {rollout}")
            for p, g, w in zip(parameters, got_grads, want_grads, strict=True):
                g, w = (torch.zeros_like(p) if t is None else t for t in (g, w))
                torch.testing.assert_close(g, w, atol=atol, rtol=atol, msg=f"a gradient, rollout {rollout}")
        breaks = list(counters["graph_break"])
    finally:
        torch._dynamo.reset()
    assert not breaks, breaks
