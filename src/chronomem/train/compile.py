"""``--compile``, shared by the supervised loop and PPO: a module under ``torch.compile``, or itself.

The compiled module shares the original's parameters and attributes, so optimisers, checkpoints and
resume see the original; only the calls that go through the returned module run compiled. Where a
model's Python branches on a tensor's value, the graph breaks into pieces that run eagerly between the
compiled ones (docs/rl.md "Compiled"), so every model compiles.
"""

from __future__ import annotations

import torch
from torch import nn

from chronomem.config import COMPILE_MODES


def compiled(module: nn.Module, enabled: bool, mode: str = "default", backend: str = "inductor",
             dynamic: bool | None = None, cpp_wrapper: bool = False) -> nn.Module:
    """``torch.compile(module, mode=, backend=, dynamic=)`` if ``enabled``, else ``module``. ``mode``: one of
    ``COMPILE_MODES`` ("reduce-overhead": CUDA graphs); ``backend``: ``"inductor"``, or ``"aot_eager"``
    (traced and differentiated without generated code: the CPU tests); ``dynamic``: False where every
    call has one of a few fixed shapes (PPO), None to let torch decide (padded batches of many lengths).
    ``cpp_wrapper`` (inductor only): the code that calls a graph's kernels is generated in C++, not Python,
    so a call of many small kernels (an acting step) spends fewer microseconds between them; each graph
    takes longer to compile."""
    if not enabled:
        return module
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {COMPILE_MODES}, got {mode!r}")
    if not cpp_wrapper:
        return torch.compile(module, backend=backend, mode=None if mode == "default" else mode, dynamic=dynamic)
    if backend != "inductor":
        raise ValueError(f"--compile-cpp-wrapper needs --compile-backend inductor, got {backend!r}")
    from torch._inductor import list_mode_options  # inductor's import is slow: only where it is used

    # torch.compile takes a mode or options, not both: the mode's options, with the C++ wrapper
    options = {**list_mode_options(mode), "cpp_wrapper": True}
    return torch.compile(module, backend=backend, options=options, dynamic=dynamic)
