"""Argument checks: every public module and environment calls these at its entry, so bad input fails
with a ``TypeError``/``ValueError`` that names the argument and the expected shape or range, never with
a RuntimeError from inside a matmul. The input rules they enforce are those of ``chronomem.layers``'
docstring (dtype, batch, reset). This module imports nothing of chronomem: envs and tasks use it
without importing the attention layers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn


def _check_shape(x: Any, name: str, ndim: int, last_dim: int | None, doc: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor{doc}, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions{doc}, got shape {tuple(x.shape)}")
    if last_dim is not None and x.shape[-1] != last_dim:
        raise ValueError(f"{name} must have last dimension {last_dim}{doc}, got shape {tuple(x.shape)}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} must have batch size >= 1{doc}, got shape {tuple(x.shape)}")
    if x.dim() >= 2 and x.shape[1] == 0:
        raise ValueError(f"{name} is an empty sequence{doc}: shape {tuple(x.shape)}")


def check_tensor(
    x: Any,
    name: str,
    ndim: int,
    last_dim: int | None = None,
    shape_doc: str = "",
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Return ``x`` if it is a floating tensor of rank ``ndim`` (and last size ``last_dim``) with a
    batch (dim 0) and a sequence (dim 1) of at least one step; cast to ``dtype`` when given (the
    input dtype rule of the module docstring: modules pass ``parameter_dtype(self)``)."""
    doc = f" {shape_doc}" if shape_doc else ""
    _check_shape(x, name, ndim, last_dim, doc)
    if not x.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor{doc} (features), got dtype {x.dtype}"
            + ("" if dtype is None else f"; floating inputs are cast to the module's {dtype}")
        )
    return x if dtype is None else x.to(dtype)


def check_token_ids(x: Any, name: str, vocab_size: int) -> Tensor:
    """Return ``x`` as int64 token ids if it is an integer tensor ``[B, N]`` with values in
    ``[0, vocab_size)`` (one check of the range per call: an out-of-range id would otherwise fail
    inside the embedding, as a device-side assert on a GPU)."""
    doc = " [B, N] (token ids)"
    if isinstance(x, Tensor) and (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool):
        raise TypeError(f"{name} must be integer token ids{doc}, got dtype {x.dtype}")
    _check_shape(x, name, 2, None, doc)
    bad = (x < 0) | (x >= vocab_size)
    if bool(bad.any()):
        raise ValueError(
            f"{name} must hold token ids in [0, {vocab_size}) (vocab_size={vocab_size}), got values in "
            f"[{int(x.min())}, {int(x.max())}] (shape {tuple(x.shape)})"
        )
    return x.long()


def parameter_dtype(module: nn.Module) -> torch.dtype:
    """The dtype of ``module``'s floating parameters (or buffers): the dtype its inputs are cast to."""
    for t in module.parameters():
        if t.is_floating_point():
            return t.dtype
    for t in module.buffers():
        if t.is_floating_point():
            return t.dtype
    return torch.get_default_dtype()


def check_mask(mask: Any, name: str, shape: Sequence[int]) -> Tensor | None:
    """Return a boolean mask of exactly ``shape`` (``True`` = valid), or ``None``."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a boolean torch.Tensor of shape {tuple(shape)}, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a boolean tensor (True = valid), got dtype {mask.dtype}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(mask.shape)}")
    return mask


def check_done(done: Any, shape: Sequence[int]) -> Tensor | None:
    """Return ``done`` of exactly ``shape`` (``[B, N]``: True where a step is the last of its episode),
    or ``None``."""
    if done is None:
        return None
    if not isinstance(done, Tensor) or done.dtype != torch.bool:
        got = f"dtype {done.dtype}" if isinstance(done, Tensor) else type(done).__name__
        raise TypeError(f"done must be a boolean tensor of shape {tuple(shape)} (True = last step of an "
                        f"episode), got {got}")
    if tuple(done.shape) != tuple(shape):
        raise ValueError(f"done must have shape {tuple(shape)}, got {tuple(done.shape)}")
    return done


def check_ended_rows(done: Any, batch: int) -> Tensor:
    """Return ``done [B]`` (the rows whose episode ended) for a state of ``batch`` rows: ``state.reset``'s
    argument, checked once for every state."""
    if not isinstance(done, Tensor) or done.dtype != torch.bool or done.dim() != 1:
        got = f"dtype {done.dtype} and shape {tuple(done.shape)}" if isinstance(done, Tensor) else type(done).__name__
        raise TypeError(f"done must be a boolean tensor of shape [B] (the rows whose episode ended), got {got}")
    if done.shape[0] != batch:
        raise ValueError(f"done has batch size {done.shape[0]}, the state {batch}")
    return done


def check_positive(value: Any, name: str, minimum: int = 1) -> int:
    """Return ``value`` if it is an int >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_heads(dim: int, num_heads: int, name: str = "num_heads") -> None:
    check_positive(dim, "dim")
    check_positive(num_heads, name)
    if dim % num_heads:
        raise ValueError(f"{name}={num_heads} must divide dim={dim}")


def check_even_dim(dim: int, name: str = "dim") -> None:
    if dim % 2:
        raise ValueError(f"{name} must be even (sinusoid encodings have sin and cos halves), got {dim}")


def check_fraction(p: Any, name: str) -> float:
    """Return ``p`` if it is a number in [0, 1)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1), got {p!r}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {p}")
    return float(p)


def check_number(value: Any, name: str, *, none: bool = False) -> float | None:
    """Return ``value`` as a float if it is a finite real number (or None, where ``none``)."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a finite number{' or None' if none else ''}, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def check_dropout(p: float, name: str = "dropout") -> None:
    check_fraction(p, name)


def check_state_batch(state_batch: int, batch: int, name: str = "state") -> None:
    if state_batch != batch:
        raise ValueError(f"{name} was made for batch size {state_batch}, but the input has batch size {batch}")
