"""TLB's chunk machinery (chronomem.ops.tlb_chunks) against its naive references: the layout against a
loop over tokens, the scan by waves against one chunk at a time (on a toy recurrence and on the TLB
itself), the cache against a loop over rows; values and gradients."""

from dataclasses import replace

import pytest
import torch

from chronomem.ops.tlb_chunks import (
    ChunkCache,
    ContinuedChunk,
    KeysValues,
    Perceived,
    SlowState,
    assemble_cache,
    assemble_cache_reference,
    layout_chunks,
    layout_chunks_reference,
    scan_chunks,
    to_chunks,
    to_tokens,
    virtual_row_states,
)
from chronomem.tlb import TLB
from contract import jitter_layer_norms_, randn64, state_tensors

torch.set_num_threads(1)

D = 6


def case(name: str, batch: int = 3, length: int = 11, K: int = 4):
    """(batch, length, K, causal, fill, done) of a named layout case."""
    g = torch.Generator().manual_seed(len(name))
    fill = done = None
    if "fill" in name:  # rows mid-chunk (row 1 at a chunk boundary)
        fill = torch.randint(1, K, (batch,), generator=g)
        fill[1] = 0
    if "done" in name:  # episode ends inside the call, several in some rows
        done = torch.rand(batch, max(length, 7), generator=g) < 0.25
        done[0, 0] = done[2, 5] = done[2, 6] = True
        done[1] = False
        done[1, length - 1] = True  # at the last step: begins no episode inside the call
        done = done[:, :length]
    return batch, length, K, name != "non-causal", fill, done


CASES = ["non-causal", "causal", "fill", "done", "fill+done"]


def explicit(layout, field: str) -> torch.Tensor:
    """A layout field, with the plain reshape's None written out."""
    value = getattr(layout, field)
    if value is not None:
        return value
    B, n, K = layout.batch, layout.length, layout.chunk_size
    if field == "token_slots":  # chunk c of row b is at position c * B + b
        t = torch.arange(n)
        return (((t // K) * B + torch.arange(B)[:, None]) * K + t % K).flatten()
    return torch.arange(layout.virtual_rows if field == "order" else B)  # identity


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("length", [11, 12, 1])
def test_layout_matches_the_loop_over_tokens(name, length):
    batch, n, K, causal, fill, done = case(name, length=length)
    fast = layout_chunks(batch, n, K, causal, fill, done)
    slow = layout_chunks_reference(batch, n, K, causal, fill, done)
    for field in ("chunks", "wave_starts", "wave_sizes", "virtual_rows"):
        assert getattr(fast, field) == getattr(slow, field), field
    for field in ("complete", "last_chunks", "end_fill", "order", "token_slots", "first_chunks", "last_rows"):
        assert torch.equal(explicit(fast, field), explicit(slow, field)), field
    if name in ("non-causal", "causal"):  # the common case is the plain reshape
        assert fast.token_slots is None
    # Tokens into chunks and back, values and gradients, by either layout.
    x = randn64(batch, n, D, seed=1).requires_grad_(True)
    mask = torch.rand(batch, n, generator=torch.Generator().manual_seed(2)) > 0.3
    upstream = randn64(fast.chunks, K, D, seed=3)
    grads = []
    for layout in (fast, slow):
        chunks = to_chunks(layout, x, mask)
        assert torch.equal(to_tokens(layout, chunks.tokens), x)
        assert torch.equal(to_tokens(layout, chunks.mask[..., None]).squeeze(-1), mask)
        grads.append(torch.autograd.grad((chunks.tokens * upstream).sum(), x)[0])
        torch.testing.assert_close(chunks.tokens, to_chunks(fast, x, mask).tokens, atol=0, rtol=0)
    torch.testing.assert_close(grads[0], grads[1], atol=0, rtol=0)


def toy_recurrence(weight: torch.Tensor, continued: ContinuedChunk | None):
    """A small differentiable ``perceive`` / ``update`` pair shaped like TLB's (slots read the state,
    the state reads the chunk's valid slots), to compare the scans on."""

    def perceive(h, key_mask, memory, at):
        valid = torch.ones(h.shape[:2], dtype=torch.bool) if key_mask is None else key_mask
        read = torch.softmax(h @ memory.transpose(1, 2), -1) @ memory
        out = torch.tanh(h @ weight + read) * valid[..., None]
        if continued is not None and at is not None:
            out = continued.outputs(out, at)
        return Perceived(out, [2 * out], [out.sin()])

    def update(rows, outputs, key_mask, updated):
        valid = torch.ones(outputs.shape[:2], dtype=torch.bool) if key_mask is None else key_mask
        mean = (outputs * valid[..., None]).sum(1, keepdim=True) / valid.sum(1).clamp_min(1)[:, None, None]
        new = torch.tanh(rows.memory + mean)
        return SlowState(torch.where(updated[:, None, None], new, rows.memory), rows.chunks + updated.long())

    return perceive, update


@pytest.mark.parametrize("name", CASES)
def test_scan_by_waves_matches_one_chunk_at_a_time(name):
    batch, n, K, causal, fill, done = case(name, length=13)
    layout = layout_chunks(batch, n, K, causal, fill, done)
    g = torch.Generator().manual_seed(4)
    leaves = dict(
        h=torch.randn(layout.chunks, K, D, generator=g, dtype=torch.float64),
        memory=torch.randn(batch, 2, D, generator=g, dtype=torch.float64),
        initial=torch.randn(2, D, generator=g, dtype=torch.float64),
        weight=torch.randn(D, D, generator=g, dtype=torch.float64) / D**0.5,
        cached=torch.randn(batch, K, D, generator=g, dtype=torch.float64),
    )
    leaves = {key: t.requires_grad_(True) for key, t in leaves.items()}
    mask = torch.rand(layout.chunks, K, generator=g) > 0.3
    mask[0] = False  # an all-padding chunk
    updated = layout.complete & mask.any(1)
    continued = None
    if fill is not None:
        shapes = dict(fill=(), slot_valid=(K,), outputs=(K, D), chunk_keys=(), chunk_values=(), memory_keys=(),
                      memory_values=())
        cache = replace(ChunkCache.zeros(batch, shapes, "cpu", torch.float64), fill=fill, outputs=leaves["cached"])
        continued = ContinuedChunk.of(cache, torch.float64)
    perceive, update = toy_recurrence(leaves["weight"], continued)
    results = []
    for impl in ("waves", "loop"):
        start = virtual_row_states(layout, SlowState(leaves["memory"], torch.zeros(batch, dtype=torch.long)),
                                   leaves["initial"])
        scan = scan_chunks(layout, leaves["h"], mask, updated, start, perceive, update, impl=impl)
        loss = (scan.outputs.square().sum() + scan.state.memory.sum() + scan.keys()[0].mean()
                + scan.values()[0].sum())
        results.append([scan.outputs, scan.state.memory, scan.state.chunks, scan.keys()[0], scan.values()[0],
                        *torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)])
    assert int(results[0][2].sum()) == int(updated.sum())
    for got, want in zip(*results, strict=True):
        if want is None:  # I_0 is read only where an episode begins, the cache only where a row is mid-chunk
            assert got is None
        else:
            torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    with pytest.raises(ValueError, match="impl"):
        scan_chunks(layout, leaves["h"], mask, updated, start, perceive, update, impl="fast")


@pytest.mark.parametrize("name", CASES)
def test_cache_assembly_matches_the_loop_over_rows(name):
    batch, n, K, causal, fill, done = case(name)
    layout = layout_chunks(batch, n, K, causal, fill, done)
    g = torch.Generator().manual_seed(5)
    outputs = torch.randn(layout.chunks, K, D, generator=g, dtype=torch.float64, requires_grad=True)
    keys = [torch.randn(layout.chunks, 2, K, 3, generator=g, dtype=torch.float64, requires_grad=True)]
    values = [torch.randn(layout.chunks, 2, K, 3, generator=g, dtype=torch.float64, requires_grad=True)]
    mask = torch.rand(layout.chunks, K, generator=g) > 0.3
    memory_kv = KeysValues((torch.randn(batch, 2, 4, 3, generator=g),), (torch.randn(batch, 2, 4, 3, generator=g),))
    caches = [build(layout, outputs, mask, keys, values, memory_kv)
              for build in (assemble_cache, assemble_cache_reference)]
    assert causal or not caches[0].fill.any()
    upstream = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in state_tensors(caches[0])]
    grads = []
    for cache in caches:
        loss = sum((t * u).sum() for t, u in zip(state_tensors(cache), upstream, strict=True) if t.is_floating_point())
        grads.append(torch.autograd.grad(loss, [outputs, *keys, *values]))
    for got, want in zip(state_tensors(caches[0]), state_tensors(caches[1]), strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


CONFIGS = {
    "causal": dict(causal=True),
    "truncated": dict(causal=True, truncate_every=2, self_per_cross=2, depth=1),
    "authors": dict(causal=True, preset="authors", qkv_dim=6, self_per_cross=2, depth=1),
    "non-causal": dict(causal=False),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_tlb_scan_by_waves_equals_one_chunk_at_a_time(config):
    """The whole TLB with ``scan_impl="loop"`` (each virtual row's chunks one at a time, always masked)
    == the batched waves: outputs, final state, gradients into the input and every parameter, over two
    calls with padding, episode ends and rows continuing a chunk."""
    torch.manual_seed(6)
    options = dict(dim=D, num_heads=2, chunk_size=4, num_state=3, self_per_cross=1, depth=2, ff_mult=2.0)
    models = {}
    for impl in ("waves", "loop"):  # the same weights, each run by one scan
        torch.manual_seed(6)
        models[impl] = jitter_layer_norms_(TLB(**{**options, **CONFIGS[config]}, scan_impl=impl).double().eval())
    model = models["waves"]
    g = torch.Generator().manual_seed(7)
    B, L = 3, 17
    x = randn64(B, L, D, seed=8)
    mask = torch.rand(B, L, generator=g) > 0.2
    mask[2, 4:9] = False  # a whole chunk of padding
    done = torch.rand(B, L, generator=g) < 0.2 if model.causal else torch.zeros(B, L, dtype=torch.bool)
    weights = randn64(B, L, D, seed=9)
    cut = 6 if model.causal else 8  # mid-chunk: the second call continues rows' chunks
    results = []
    for model in models.values():
        xg = x.clone().requires_grad_(True)
        outputs, state = [], None
        for piece in (slice(0, cut), slice(cut, L)):
            y, state = model(xg[:, piece], state, mask[:, piece], done[:, piece] if model.causal else None)
            outputs.append(y)
        y = torch.cat(outputs, 1)
        loss = (y * weights).sum() + model.latest_memory(state).square().sum()
        params = [p for p in model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, [xg, *params], allow_unused=True)
        results.append([y, *state_tensors(state), *(g for g in grads if g is not None)])
    assert len(results[0]) == len(results[1])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-9)
