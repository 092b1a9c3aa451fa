"""Hierarchical Transformer Memory: naive references, properties, streaming == batch, bad input."""

import dataclasses
import json
import math

import pytest
import torch

from chronomem.htm import HierarchicalMemory, HTMAttention, HTMTransformer
from chronomem.layers import copy_state, sinusoid_encoding, state_donated
from chronomem.ops import htm_chunks
from chronomem.ops.htm_local import local_layout
from chronomem.ops.htm_mix import DENSE_CHUNKS_PER_K, DENSE_MIN_QUERIES, GROUPED_MIN_PAIRS, READ_IMPLS
from contract import assert_same_state
from helpers import (
    assert_compiled_acting_matches,
    assert_compiled_acting_reads_the_cache,
    assert_compiled_learning_matches,
    assert_same_gradients,
)

torch.set_num_threads(1)


# ------------------------------------------------------------------------------------------------
# Naive reference of Section 2: one query, one chunk at a time, plain loops.
# ------------------------------------------------------------------------------------------------


def naive_read(attn: HTMAttention, queries, keys, contents, slot_valid, valid, mask=None):
    """The literal read: per query, rank the chunks, then ``sum_i R_i * MHA(x, C_i)`` with the plain
    ``MultiHeadAttention`` on each selected chunk (K/V projected per chunk, as in the released module)."""
    B, Q, D = queries.shape
    M, C = contents.shape[1], contents.shape[2]
    pe = sinusoid_encoding(C, D, reverse=True)
    rows = []
    for b in range(B):
        for q in range(Q):
            x = queries[b, q]
            read = torch.zeros(D)
            scored = []
            for m in range(M):
                seen = bool(valid[b, m]) and (mask is None or bool(mask[b, q, m]))
                r = float((attn.to_query(x) @ attn.to_key(keys[b, m])).detach()) / math.sqrt(D)
                scored.append((r if seen else -1e9, seen, m))
            scored.sort(key=lambda t: -t[0])
            top = [t for t in scored[: attn.top_k] if t[1]]
            if top:  # else: no visible chunk, a zero read
                logits = torch.stack([attn.to_query(x) @ attn.to_key(keys[b, m]) for *_, m in top]) / math.sqrt(D)
                w = torch.softmax(logits, 0)
                w = (1 - attn.relevance_floor) * w + attn.relevance_floor / len(top)  # the option, literally
                for wi, (_, _, m) in zip(w, top, strict=True):
                    chunk = (contents[b, m] + pe)[None]  # [1, C, D]
                    y = attn.within(x[None, None], chunk, key_mask=slot_valid[b, m][None])
                    read = read + wi * y[0, 0]
            rows.append(read)
    return torch.stack(rows).view(B, Q, D)


def random_memory(B=2, M=6, C=4, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    contents = torch.randn(B, M, C, D, generator=g)
    slot_valid = torch.ones(B, M, C, dtype=torch.bool)
    slot_valid[0, 1, 2:] = False  # a chunk cut short by an episode end
    valid = torch.ones(B, M, dtype=torch.bool)
    valid[0, 4] = False
    if B > 1:
        valid[1, :4] = False  # row 1: only two valid chunks (fewer than k)
    keys = (contents * slot_valid[..., None]).sum(2) / slot_valid.sum(2, keepdim=True)
    return keys, contents, slot_valid, valid


def as_memory(keys, contents, slot_valid, valid):
    B, M, C, D = contents.shape
    mem = HierarchicalMemory.empty(B, M, C, D)
    return mem.__class__(
        **{**mem.__dict__, "keys": keys, "contents": contents, "slot_valid": slot_valid, "valid": valid}
    )


@pytest.fixture(params=READ_IMPLS)
def read_path(request):
    """Run a test through every way ``HTMAttention.read`` mixes the selected chunks (``read_impl``): the
    per-query gather (``mix_selected_chunks``), every query against every chunk read
    (``mix_chunks_dense``), the plain reference, and the automatic choice."""
    return request.param


@pytest.mark.parametrize("top_k", [1, 3, 6])
def test_attention_matches_naive_reference(top_k, read_path):
    torch.manual_seed(0)
    B, M, C, D, Q = 2, 6, 4, 8, 5
    attn = HTMAttention(D, num_heads=2, top_k=top_k, chunk_size=C, read_impl=read_path)
    keys, contents, slot_valid, valid = random_memory(B, M, C, D)
    queries = torch.randn(B, Q, D)
    mask = torch.rand(B, Q, M) > 0.3
    mask[0, 2] = False  # a query that may read nothing
    mask[..., 3] = False  # a chunk no query may read (the dense path leaves it out)
    got = attn(queries, as_memory(keys, contents, slot_valid, valid), mask)
    with torch.no_grad():
        want = naive_read(attn, queries, keys, contents, slot_valid, valid, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert got[0, 2].abs().max() == 0  # no visible chunk -> zeros
    got_nomask = attn(queries, as_memory(keys, contents, slot_valid, valid))
    torch.testing.assert_close(
        got_nomask, naive_read(attn, queries, keys, contents, slot_valid, valid), atol=1e-5, rtol=1e-4
    )


@pytest.mark.parametrize("top_k", [1, 3, 6])
def test_relevance_floor_matches_naive_reference(top_k, read_path):
    """``relevance_floor=f`` is the literal read with ``R_i`` replaced by ``(1 - f) R_i + f / n`` over the
    n selected visible chunks; a query that may read nothing still reads zeros, and the floor changes the
    read (so the reference is not passing by ignoring it)."""
    torch.manual_seed(2)
    B, M, C, D, Q = 2, 6, 4, 8, 5
    floored = HTMAttention(D, num_heads=2, top_k=top_k, chunk_size=C, relevance_floor=0.4, read_impl=read_path)
    keys, contents, slot_valid, valid = random_memory(B, M, C, D)
    memory = as_memory(keys, contents, slot_valid, valid)
    queries = torch.randn(B, Q, D)
    mask = torch.rand(B, Q, M) > 0.3
    mask[0, 2] = False
    got = floored(queries, memory, mask)
    with torch.no_grad():
        want = naive_read(floored, queries, keys, contents, slot_valid, valid, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert got[0, 2].abs().max() == 0
    plain = HTMAttention(D, num_heads=2, top_k=top_k, chunk_size=C, read_impl=read_path)
    plain.load_state_dict(floored.state_dict())
    difference = (plain(queries, memory, mask) - got).abs().max()
    assert difference < 1e-6 if top_k == 1 else difference > 1e-3  # one chunk: its weight is 1 either way


@pytest.mark.parametrize("floor", [-0.1, 1.0, True, "0.1"])
def test_relevance_floor_bad_values(floor):
    with pytest.raises(ValueError if isinstance(floor, float) else TypeError, match="relevance_floor"):
        HTMAttention(8, num_heads=2, top_k=2, chunk_size=4, relevance_floor=floor)
    with pytest.raises(ValueError if isinstance(floor, float) else TypeError, match="relevance_floor"):
        HTMTransformer(dim=8, depth=1, num_heads=2, top_k=2, chunk_size=4, memory_size=4, relevance_floor=floor)


def assert_same_state_but_version(got, want):
    """Two models' states equal but for ``kv_version``: which parameter values made the cached keys, each
    model's own number."""
    unversioned = dict(kv_version=None)
    assert_same_state(dataclasses.replace(got, **unversioned), dataclasses.replace(want, **unversioned), atol=1e-12)


def acting_outputs(model: HTMTransformer, x, done):
    """The outputs of the acting path: ``model`` called one step at a time, with the episode ends."""
    with torch.no_grad():
        state, steps = model.init_state(x.shape[0]), []
        for t in range(x.shape[1]):
            y, state = model(x[:, t : t + 1], state=state, done=done[:, t : t + 1])
            steps.append(y)
    return torch.cat(steps, 1)


@pytest.mark.parametrize("gate", [0.0, 0.6])
def test_read_gate_scales_the_read(gate):
    """``read_gate=a`` is ``x + a * read``: the same model as one without the gate whose HTM blocks' output
    projections (weight and bias; the read is linear in them) are scaled by ``a``, in outputs, state and
    the acting path (one step at a time, with episode ends). Shut (``a = 0``), the gate's own gradient is
    not zero, so the read can open it; then no gradient reaches the read's parameters."""
    torch.manual_seed(3)
    options = dict(dim=8, depth=2, num_heads=2, top_k=2, chunk_size=3, memory_size=4, window=4)
    gated = HTMTransformer(**options, read_gate=gate).double()
    plain = HTMTransformer(**options).double()
    with torch.no_grad():
        for layer in gated.layers:
            for p in layer.memory.within.to_out.parameters():
                p.normal_()  # a read that is not zero at the start
    state = {k: v for k, v in gated.state_dict().items() if "read_gate" not in k}
    plain.load_state_dict(state)
    with torch.no_grad():
        for layer, gated_layer in zip(plain.layers, gated.layers, strict=True):
            for p in layer.memory.within.to_out.parameters():
                p.mul_(gated_layer.read_gate)  # a float32 start, then double: not exactly `gate`
    x = torch.randn(2, 11, 8, dtype=torch.double)
    done = torch.zeros(2, 11, dtype=torch.bool)
    done[0, 6] = True
    got, got_state = gated(x, done=done)
    want, want_state = plain(x, done=done)
    torch.testing.assert_close(got, want)
    assert_same_state_but_version(got_state, want_state)
    torch.testing.assert_close(acting_outputs(gated, x, done), want)
    ungated = HTMTransformer(**options).double()
    ungated.load_state_dict(state)
    assert (ungated(x, done=done)[0] - got).abs().max() > 1e-3  # the gate changes the output
    got.square().sum().backward()
    for layer in gated.layers:
        assert layer.read_gate.grad.abs() > 0
        to_out = layer.memory.within.to_out.weight.grad
        assert (to_out.abs().max() == 0) == (gate == 0.0)


def test_final_norm_is_a_layer_norm_of_the_plain_output():
    """``final_norm=True`` is the plain model's output through one LayerNorm, at every step of a call with
    episode ends and padding, with ``output_steps``, and on the acting path (one step at a time); padded
    and skipped steps stay zeros, and the state is the plain model's."""
    torch.manual_seed(5)
    options = dict(dim=8, depth=2, num_heads=2, top_k=2, chunk_size=3, memory_size=4, window=4)
    normed = HTMTransformer(**options, final_norm=True).double()
    plain = HTMTransformer(**options).double()
    with torch.no_grad():
        normed.norm.weight.uniform_(0.5, 1.5)
        normed.norm.bias.normal_(0.0, 0.1)
    plain.load_state_dict({k: v for k, v in normed.state_dict().items() if not k.startswith("norm.")})
    x = torch.randn(2, 11, 8, dtype=torch.double)
    done = torch.zeros(2, 11, dtype=torch.bool)
    done[0, 6] = True
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, 9:] = False
    got, got_state = normed(x, mask=mask, done=done)
    want, want_state = plain(x, mask=mask, done=done)
    torch.testing.assert_close(got, normed.norm(want) * mask[..., None])
    assert got[1, 9:].abs().max() == 0
    assert_same_state_but_version(got_state, want_state)
    torch.testing.assert_close(acting_outputs(normed, x, done), normed.norm(plain(x, done=done)[0]))
    tail = HTMTransformer(**options, final_norm=True, output_steps=4).double()
    tail.load_state_dict(normed.state_dict())
    y_tail = tail(x)[0]
    torch.testing.assert_close(y_tail[:, -4:], normed(x)[0][:, -4:])
    assert y_tail[:, :-4].abs().max() == 0


@pytest.mark.parametrize(("gate", "error"), [(True, TypeError), ("0", TypeError), (float("nan"), ValueError),
                                             (float("inf"), ValueError)])
def test_read_gate_bad_values(gate, error):
    with pytest.raises(error, match="read_gate"):
        HTMTransformer(dim=8, depth=1, num_heads=2, top_k=2, chunk_size=4, memory_size=4, read_gate=gate)


@pytest.mark.parametrize("Q", [1, 3])  # Q * top_k < M: LN of the gathered slots; >= M: of the whole memory
def test_memory_norm_reads_layer_normed_memory(Q, read_path):
    """``memory_norm=True`` is the literal read on LN(summaries) and LN(steps) (no learned scale), so the
    read no longer depends on the scale of what was stored; without it, it does."""
    torch.manual_seed(1)
    B, M, C, D = 2, 6, 4, 8
    keys, contents, slot_valid, valid = random_memory(B, M, C, D, seed=3)
    queries = torch.randn(B, Q, D)
    normed = HTMAttention(D, num_heads=2, top_k=3, chunk_size=C, memory_norm=True, read_impl=read_path)
    got = normed(queries, as_memory(keys, contents, slot_valid, valid))
    ln = lambda t: torch.nn.functional.layer_norm(t, (D,))
    with torch.no_grad():
        want = naive_read(normed, queries, ln(keys), ln(contents), slot_valid, valid)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    scaled = normed(queries, as_memory(7 * keys + 2, 7 * contents + 2, slot_valid, valid))
    torch.testing.assert_close(scaled, got, atol=1e-4, rtol=1e-4)  # LN removes a per-step scale and shift
    plain = HTMAttention(D, num_heads=2, top_k=3, chunk_size=C, read_impl=read_path)
    plain.load_state_dict(normed.state_dict())
    a = plain(queries, as_memory(keys, contents, slot_valid, valid))
    b = plain(queries, as_memory(7 * keys + 2, 7 * contents + 2, slot_valid, valid))
    assert (a - b).abs().max() > 1e-2


@pytest.mark.parametrize("memory_gradient", [False, True])
@pytest.mark.parametrize(("memory_norm", "Q", "floor"),
                         [(False, 5, 0.0), (True, 5, 0.0), (True, 1, 0.0), (False, 5, 0.3)])
def test_gradients_match_naive_reference(memory_gradient, memory_norm, Q, floor, read_path):
    """The fast read moves the K/V projections onto the query side; parameter and query gradients
    must still equal those of the literal per-chunk read (float64, so only rounding differs). With
    ``memory_gradient`` the gradients into the keys and contents must equal the literal read's too,
    also through ``memory_norm``'s LayerNorm, taken on the whole memory (Q=5) or on each query's
    gathered slots (Q=1: Q * top_k < M), and through ``relevance_floor``'s mix."""
    torch.manual_seed(4)
    B, M, C, D = 2, 6, 4, 8
    attn = HTMAttention(
        D, num_heads=2, top_k=3, chunk_size=C, memory_gradient=memory_gradient, memory_norm=memory_norm,
        relevance_floor=floor, read_impl=read_path,
    ).double()
    ln = (lambda t: torch.nn.functional.layer_norm(t, (D,))) if memory_norm else (lambda t: t)
    memory = [t.double() if t.is_floating_point() else t for t in random_memory(B, M, C, D)]
    queries = torch.randn(B, Q, D, dtype=torch.float64)
    mask = torch.rand(B, Q, M) > 0.3
    grads = []
    for naive in (False, True):
        attn.zero_grad()
        q = queries.clone().requires_grad_(True)
        keys, contents = (t.clone().requires_grad_(memory_gradient) for t in memory[:2])
        if naive:
            out = naive_read(attn, q, ln(keys), ln(contents), *memory[2:], mask)
        else:
            out = attn(q, as_memory(keys, contents, *memory[2:]), mask)
        (out * torch.linspace(-1, 1, D, dtype=torch.float64)).sum().backward()
        grads.append([q.grad] + [p.grad.clone() for p in attn.parameters()]
                     + ([keys.grad, contents.grad] if memory_gradient else []))
    for got, want in zip(*grads, strict=True):
        assert want.abs().max() > 0
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-8)


def test_attention_dropout_path():
    """With dropout in training the read takes the plain autograd path: it is random, differentiable,
    and in eval mode equals the read without dropout."""
    torch.manual_seed(6)
    B, M, C, D = 2, 6, 4, 8
    memory = as_memory(*random_memory(B, M, C, D))
    attn = HTMAttention(D, num_heads=2, top_k=3, chunk_size=C, dropout=0.5)
    plain = HTMAttention(D, num_heads=2, top_k=3, chunk_size=C)
    plain.load_state_dict(attn.state_dict())
    q = torch.randn(B, 5, D, requires_grad=True)
    a, b = attn(q, memory), attn(q, memory)
    assert not torch.allclose(a, b)
    a.sum().backward()
    assert torch.isfinite(q.grad).all() and q.grad.abs().max() > 0
    attn.eval()
    torch.testing.assert_close(attn(q, memory), plain(q, memory))


def test_permuting_chunks_leaves_read_unchanged_when_k_equals_m():
    torch.manual_seed(1)
    B, M, C, D = 2, 5, 3, 8
    attn = HTMAttention(D, num_heads=2, top_k=M, chunk_size=C)
    keys, contents, slot_valid, valid = random_memory(B, M, C, D)
    q = torch.randn(B, 4, D)
    perm = torch.randperm(M)
    a = attn(q, as_memory(keys, contents, slot_valid, valid))
    b = attn(q, as_memory(keys[:, perm], contents[:, perm], slot_valid[:, perm], valid[:, perm]))
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_unselected_and_masked_chunks_do_not_matter():
    torch.manual_seed(2)
    B, M, C, D = 1, 6, 4, 8
    attn = HTMAttention(D, num_heads=2, top_k=2, chunk_size=C)
    keys, contents, slot_valid, valid = random_memory(B, M, C, D)
    q = torch.randn(B, 1, D)
    logits = attn.to_query(q) @ attn.to_key(keys).transpose(1, 2)
    logits = logits.masked_fill(~valid[:, None], -1e9)
    unselected = int(logits[0, 0].masked_fill(~valid[0], 1e9).argmin())  # a valid chunk, ranked last
    mask = torch.ones(B, 1, M, dtype=torch.bool)
    masked = int(logits[0, 0].argmax())
    mask[0, 0, masked] = False
    base = attn(q, as_memory(keys, contents, slot_valid, valid), mask)
    for m in (unselected, masked):
        changed = contents.clone()
        changed[0, m] += 10 * torch.randn(C, D)  # contents only; the key keeps the chunk unselected
        out = attn(q, as_memory(keys, changed, slot_valid, valid), mask)
        torch.testing.assert_close(out, base)
    # Sanity: changing a selected chunk does change the read.
    selected = int(logits[0, 0].masked_fill(~mask[0, 0], -1e9).argmax())
    changed = contents.clone()
    changed[0, selected] += 10
    assert not torch.allclose(attn(q, as_memory(keys, changed, slot_valid, valid), mask), base)


def test_no_gradient_into_memory():
    torch.manual_seed(3)
    attn = HTMAttention(8, num_heads=2, top_k=2, chunk_size=4)
    keys, contents, slot_valid, valid = random_memory(2, 6, 4, 8)
    keys.requires_grad_(True)
    contents.requires_grad_(True)
    q = torch.randn(2, 3, 8, requires_grad=True)
    attn(q, as_memory(keys, contents, slot_valid, valid)).sum().backward()
    for t in (keys, contents):
        assert t.grad is None or t.grad.abs().max() == 0
    assert q.grad is not None and q.grad.abs().max() > 0
    assert attn.to_key.weight.grad.abs().max() > 0  # W_k still learns


def test_empty_memory_reads_zeros():
    attn = HTMAttention(8, num_heads=2, top_k=2, chunk_size=4)
    mem = HierarchicalMemory.empty(2, 3, 4, 8)
    out = attn(torch.randn(2, 5, 8), mem)
    assert out.shape == (2, 5, 8) and out.abs().max() == 0


def autograd_nodes(t: torch.Tensor) -> set[str]:
    """Names of the backward nodes in ``t``'s graph (a custom Function ``_F`` shows as ``_FBackward``)."""
    names, seen, stack = set(), set(), [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(child for child, _ in node.next_functions)
    return names


KERNELS = {"gather": "_MixSelectedChunksBackward", "grouped": "_MixChunksGroupedBackward",
           "dense": "_MixChunksDenseBackward"}
MANY_CHUNKS = DENSE_CHUNKS_PER_K * 3 + 1  # more chunks than dense reads (top_k = 3, 2 heads below)
GROUPED_QUERIES = -(-GROUPED_MIN_PAIRS // (2 * 3))  # enough queries for GROUPED_MIN_PAIRS pairs (2 rows, top-3)
SPREAD_CHUNKS = 64  # as many pairs over these many chunks: about 8 a chunk, tiles of 32 mostly padding


@pytest.mark.parametrize(
    ("read_impl", "Q", "M", "dropout", "taken"),
    [
        ("gather", DENSE_MIN_QUERIES, 6, 0.0, "gather"),
        ("dense", 1, 6, 0.0, "dense"),
        ("reference", DENSE_MIN_QUERIES, 6, 0.0, "reference"),
        ("auto", DENSE_MIN_QUERIES, DENSE_CHUNKS_PER_K * 3, 0.0, "dense"),  # many queries, few chunks
        ("auto", DENSE_MIN_QUERIES - 1, DENSE_CHUNKS_PER_K * 3, 0.0, "gather"),  # few queries
        ("grouped", 1, 6, 0.0, "grouped"),
        ("auto", GROUPED_QUERIES, MANY_CHUNKS, 0.0, "grouped"),  # many pairs over a few chunks: full tiles
        ("auto", GROUPED_QUERIES - 1, MANY_CHUNKS, 0.0, "gather"),  # ... a query short of GROUPED_MIN_PAIRS
        ("auto", GROUPED_QUERIES, SPREAD_CHUNKS, 0.0, "gather"),  # as many pairs over many chunks: padded tiles
        ("auto", DENSE_MIN_QUERIES, MANY_CHUNKS, 0.0, "gather"),  # few pairs
        ("dense", DENSE_MIN_QUERIES, 6, 0.5, "reference"),  # attention dropout: only the reference has it
    ],
)
def test_read_impl_takes_the_named_path(read_impl, Q, M, dropout, taken):
    """``read_impl`` names the kernel that mixes the chunks; "auto" keeps the rule of ``ops.htm_mix``:
    for at least DENSE_MIN_QUERIES queries, dense when they read at most DENSE_CHUNKS_PER_K * top_k
    chunks, else grouped for at least GROUPED_MIN_PAIRS (query, chunk) pairs whose tiles would be full
    enough (``grouped_pays``)."""
    torch.manual_seed(0)
    attn = HTMAttention(8, num_heads=2, top_k=3, chunk_size=4, dropout=dropout, read_impl=read_impl)
    out = attn(torch.randn(2, Q, 8, requires_grad=True), as_memory(*random_memory(2, M, 4, 8)))
    nodes = autograd_nodes(out)
    assert {name for name, kernel in KERNELS.items() if kernel in nodes} == ({taken} - {"reference"})
    with pytest.raises(ValueError, match="read_impl"):
        HTMAttention(8, num_heads=2, top_k=3, chunk_size=4, read_impl="fast")


# ------------------------------------------------------------------------------------------------
# Memory writing against a list-based reference
# ------------------------------------------------------------------------------------------------


def naive_write(steps, dones, C, M, overlap=0, keep=False):
    """One row: returns the list of stored chunks (oldest first), each a list of step tensors."""
    chunks, acc, carried = [], [], 0
    for x, d in zip(steps, dones, strict=True):
        acc.append(x)
        if len(acc) == C:
            chunks.append(list(acc))
            acc = acc[C - overlap :] if overlap else []
            carried = overlap
        if d:
            if len(acc) > carried:
                chunks.append(list(acc))
            acc, carried = [], 0
            if not keep:
                chunks = []
        chunks = chunks[-M:]
    return chunks, acc


def stored_chunks(mem: HierarchicalMemory, b: int):
    order = [int(i) for i in mem.chunk_id[b].argsort()]
    out = []
    for m in order:
        if mem.valid[b, m]:
            n = int(mem.slot_valid[b, m].sum())
            out.append((mem.contents[b, m, :n], mem.keys[b, m], mem.slot_valid[b, m]))
    return out


@pytest.mark.parametrize("overlap,keep", [(0, False), (1, False), (0, True), (2, True)])
def test_memory_write_matches_reference(overlap, keep):
    g = torch.Generator().manual_seed(4)
    B, N, C, M, D = 3, 29, 4, 3, 5
    x = torch.randn(B, N, D, generator=g)
    done = torch.rand(B, N, generator=g) < 0.08
    done[2] = False
    done[1, 6] = True
    mem = HierarchicalMemory.empty(B, M, C, D, overlap=overlap, keep_across_episodes=keep)
    whole = mem.write(x, done)
    pieces = mem
    for a in range(0, N, 7):  # the same stream written in pieces
        pieces = pieces.write(x[:, a : a + 7], done[:, a : a + 7])
    for b in range(B):
        want, acc = naive_write(list(x[b]), list(done[b]), C, M, overlap, keep)
        for got_mem in (whole, pieces):
            got = stored_chunks(got_mem, b)
            assert len(got) == len(want)
            for (contents, key, slots), ref in zip(got, want, strict=True):
                ref = torch.stack(ref)
                torch.testing.assert_close(contents, ref)
                torch.testing.assert_close(key, ref.mean(0))  # summary = mean of the stored steps
                assert slots[: len(ref)].all() and not slots[len(ref) :].any()
            assert int(got_mem.fill[b]) == len(acc)
            if acc:
                torch.testing.assert_close(got_mem.accumulator[b, : len(acc)], torch.stack(acc))


def test_memory_commit_and_eviction_order():
    B, C, M, D = 1, 2, 3, 1
    mem = HierarchicalMemory.empty(B, M, C, D)
    x = torch.arange(1.0, 12.0).view(1, 11, 1)  # steps 1..11
    mem = mem.write(x[:, :3])
    assert int(mem.committed[0]) == 1 and int(mem.fill[0]) == 1  # chunk (1, 2) committed, 3 waiting
    assert mem.valid[0].tolist() == [True, False, False]
    assert mem.keys[0, 0, 0] == 1.5  # the mean of the chunk
    mem = mem.write(x[:, 3:])  # chunks (3,4) (5,6) (7,8) (9,10): the first two are evicted
    assert mem.chunk_id[0].tolist() == [3, 4, 2]  # ring buffer: slot = commit index % M
    assert mem.contents[0, :, :, 0].tolist() == [[7.0, 8.0], [9.0, 10.0], [5.0, 6.0]]
    assert int(mem.fill[0]) == 1 and mem.accumulator[0, 0, 0] == 11


def test_episode_boundary_commits_partial_chunk_then_clears():
    D = 2
    x = torch.randn(1, 5, D)
    done = torch.tensor([[False, False, True, False, False]])
    keep = HierarchicalMemory.empty(1, 4, 4, D, keep_across_episodes=True).write(x, done)
    assert keep.valid[0].tolist() == [True, False, False, False]
    assert keep.slot_valid[0, 0].tolist() == [True, True, True, False]
    torch.testing.assert_close(keep.keys[0, 0], x[0, :3].mean(0))
    assert int(keep.fill[0]) == 2  # the new episode started a new chunk
    clear = HierarchicalMemory.empty(1, 4, 4, D).write(x, done)
    assert not clear.valid.any() and int(clear.fill[0]) == 2
    # reset(done) between calls does the same
    mem = HierarchicalMemory.empty(2, 4, 4, D).write(torch.randn(2, 6, D))
    mem = mem.reset(torch.tensor([True, False]))
    assert not mem.valid[0].any() and mem.valid[1, 0] and int(mem.fill[0]) == 0 and int(mem.fill[1]) == 2


# ------------------------------------------------------------------------------------------------
# HTMTransformer
# ------------------------------------------------------------------------------------------------

SMALL = dict(dim=16, depth=2, num_heads=2, top_k=2, chunk_size=3, memory_size=4, window=4)


def run_in_pieces(model, x, size, mask=None):
    state, ys = None, []
    for a in range(0, x.shape[1], size):
        m = None if mask is None else mask[:, a : a + size]
        y, state = model(x[:, a : a + size], state, m)
        ys.append(y)
    return torch.cat(ys, 1), state


@pytest.mark.parametrize(
    "options",
    [{}, {"extra_length": 3}, {"overlap": 1}, {"shared_memory": True}, {"memory_size": 2, "top_k": 2},
     {"memory_norm": True}],
)
def test_step_window_and_sequence_agree(options):
    torch.manual_seed(5)
    model = HTMTransformer(**{**SMALL, **options}).eval()
    x = torch.randn(2, 26, 16)
    whole, s_whole = model(x)
    for size in (1, 4, 7):
        pieces, s_pieces = run_in_pieces(model, x, size)
        torch.testing.assert_close(pieces, whole, atol=2e-5, rtol=1e-4)
        for a, b in zip(s_pieces.memories, s_whole.memories, strict=True):
            torch.testing.assert_close(a.contents, b.contents)
            assert torch.equal(a.chunk_id, b.chunk_id) and torch.equal(a.valid, b.valid)
        for a, b in zip(s_pieces.caches, s_whole.caches, strict=True):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)
    # The state carries on: continuing after the whole sequence == continuing after the pieces.
    more = torch.randn(2, 5, 16)
    torch.testing.assert_close(model(more, s_whole)[0], model(more, s_pieces)[0], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "options",
    [  # App. B.4's PAI model (no layer reads another step), per-layer memories, a shared one with a window
        {"window": 1, "shared_memory": True, "top_k": 3, "chunk_size": 2, "memory_size": 5, "output_steps": 1},
        {"output_steps": 3},
        {"output_steps": 6, "extra_length": 3, "memory_norm": True},
        {"shared_memory": True, "output_steps": 2},
    ],
)
def test_output_steps_equal_the_plain_forward(options):
    """``output_steps=r`` computes only the last r outputs of a call: they equal the plain forward's,
    gradients included, the others are zeros, and the state is the same (so calls chain)."""
    torch.manual_seed(7)
    fast = HTMTransformer(**{**SMALL, **options})
    plain = HTMTransformer(**{**SMALL, **options, "output_steps": None})
    plain.load_state_dict(fast.state_dict())
    r = options["output_steps"]
    x = torch.randn(3, 17, 16)
    state_plain = state_fast = None
    for piece in (x[:, :10], x[:, 10:]):  # two calls: the second reads the memory the first stored
        y_plain, state_plain = plain(piece, state_plain)
        y_fast, state_fast = fast(piece, state_fast)
        torch.testing.assert_close(y_fast[:, -r:], y_plain[:, -r:], atol=2e-5, rtol=1e-4)
        assert not y_fast[:, :-r].any()
        for a, b in zip(state_fast.memories, state_plain.memories, strict=True):
            torch.testing.assert_close(a.contents, b.contents, atol=2e-5, rtol=1e-4)
        for a, b in zip(state_fast.caches, state_plain.caches, strict=True):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)
    weights = torch.randn_like(y_plain[:, -r:])
    (y_plain[:, -r:] * weights).mean().backward()
    (y_fast[:, -r:] * weights).mean().backward()
    assert_same_gradients(plain, fast)
    with pytest.raises(ValueError, match="mask"):
        fast(x, mask=torch.arange(17)[None].expand(3, 17) < 16)


@pytest.mark.parametrize("extra_length", [0, 3])
@pytest.mark.parametrize("start", [0, 5, 8])
def test_local_layout_matches_the_visibility_rule(extra_length, start):
    """The blocked local attention (one block per window) lets each query see exactly the steps of the
    literal rule ``floor(t/W)*W - E <= s <= t``, s a real step, and its queries are the last keys of
    their block, at consecutive positions (what relative positions assume)."""
    W, n, B = 4, 11, 2
    model = HTMTransformer(**{**SMALL, "window": W, "extra_length": extra_length})
    L = model.cache_length
    position, lengths = torch.full((B,), start), torch.tensor([n, 7])
    layout = local_layout(position, lengths, n, window=W, extra_length=extra_length, cache=L)
    assert layout.queries.shape[0] > 1  # blocked
    for b in range(B):
        seen = set()
        for g in range(layout.queries.shape[0]):
            Wq, Wk = layout.queries.shape[1], layout.keys.shape[1]
            for a in range(Wq):
                if layout.mask[b, g, a].any():  # a real query (padding slots see nothing)
                    assert layout.keys[g, Wk - Wq + a] == layout.queries[g, a]
                for c in range(Wk):
                    if layout.mask[b, g, a, c]:
                        seen.add((int(layout.queries[g, a]) - L, int(layout.keys[g, c]) - L))
        want = set()
        for i in range(n):
            t = start + i
            for j in range(-L, n):
                s = start + j
                if s >= 0 and j < lengths[b] and (t // W) * W - extra_length <= s <= t:
                    want.add((i, j))
        assert seen == want


def test_memory_is_used_beyond_the_local_window():
    torch.manual_seed(6)
    model = HTMTransformer(**SMALL).eval()
    x = torch.randn(1, 20, 16)
    y = model(x)[0]
    x2 = x.clone()
    x2[:, 0] += 1.0  # outside the local window of step 19, but in a stored chunk
    assert not torch.allclose(model(x2)[0][:, 19], y[:, 19])


@pytest.mark.parametrize("relative_positions", [True, False])
def test_local_attention_sees_order_only_with_relative_positions(relative_positions):
    """Before any chunk completes, only the local attention acts. Without positions a query's read is
    a softmax over a set, so swapping two earlier steps cannot change it; with Transformer-XL's
    relative positions (the default, as in the paper's agent) it must."""
    torch.manual_seed(11)
    options = {**SMALL, "depth": 1, "chunk_size": 8, "window": 8, "relative_positions": relative_positions}
    model = HTMTransformer(**options)  # one layer: its causal attention reads the earlier steps as a set
    x = torch.randn(2, 6, 16)
    swapped = x[:, [0, 2, 1, 3, 4, 5]]
    last, last_swapped = model(x)[0][:, -1], model(swapped)[0][:, -1]
    if relative_positions:
        assert not torch.allclose(last, last_swapped, atol=1e-4)
    else:
        torch.testing.assert_close(last, last_swapped, atol=1e-5, rtol=1e-4)


def test_future_inputs_never_change_past_outputs():
    torch.manual_seed(7)
    model = HTMTransformer(**{**SMALL, "extra_length": 2}).eval()
    x = torch.randn(2, 18, 16)
    y = model(x)[0]
    for t in (0, 5, 11):
        x2 = x.clone()
        x2[:, t + 1 :] = torch.randn_like(x2[:, t + 1 :])
        torch.testing.assert_close(model(x2)[0][:, : t + 1], y[:, : t + 1])


def test_padding_invariance_and_reset():
    torch.manual_seed(8)
    model = HTMTransformer(**SMALL).eval()
    x = torch.randn(2, 14, 16)
    mask = torch.ones(2, 14, dtype=torch.bool)
    mask[1, 9:] = False
    y, state = model(x, mask=mask)
    y1, state1 = model(x[1:, :9])
    torch.testing.assert_close(y[1:, :9], y1, atol=1e-5, rtol=1e-4)
    assert y[1, 9:].abs().max() == 0
    torch.testing.assert_close(state.memories[0].contents[1:], state1.memories[0].contents)
    # After reset(done), a row behaves like a fresh stream.
    state = state.reset(torch.tensor([True, False]))
    z = torch.randn(2, 6, 16)
    torch.testing.assert_close(model(z, state)[0][:1], model(z[:1])[0], atol=1e-5, rtol=1e-4)


def test_gradients_flow_to_parameters_not_memory():
    torch.manual_seed(9)
    model = HTMTransformer(**SMALL)
    x = torch.randn(2, 12, 16, requires_grad=True)
    y, state = model(x)
    y.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert all(not m.contents.requires_grad and not m.keys.requires_grad for m in state.memories)


def test_memory_gradient_option():
    """``memory_gradient=True`` changes no output; the loss at the last step then reaches the steps
    that only memory holds (outside its local window), which the default stop-gradient blocks."""
    torch.manual_seed(9)
    x = torch.randn(2, 20, 16)
    grads, outputs = [], []
    for memory_gradient in (False, True):
        torch.manual_seed(10)
        model = HTMTransformer(**SMALL, memory_gradient=memory_gradient)
        xi = x.clone().requires_grad_(True)
        y, _ = model(xi)
        y[:, -1].sum().backward()
        outputs.append(y.detach())
        grads.append(xi.grad)
    torch.testing.assert_close(outputs[0], outputs[1])
    early = slice(0, 12)  # step 19's window is steps 16-19; steps 0-11 are in complete chunks only
    assert grads[0][:, early].abs().max() == 0
    assert grads[1][:, early].abs().max() > 0


@pytest.mark.parametrize("read_impl", ["auto", "gather", "grouped", "dense"])
def test_transformer_read_impls_match_the_reference(read_impl):
    """Every ``read_impl`` of the whole model equals ``read_impl="reference"`` (float64): outputs over
    two calls, gradients into the parameters and, with ``memory_gradient``, into the inputs that only
    memory holds. The option round-trips through the JSON of a run's config."""
    torch.manual_seed(13)
    options = {**SMALL, "memory_norm": True, "memory_gradient": True, "read_impl": read_impl}
    fast = HTMTransformer(**options).double()
    options = json.loads(json.dumps(dataclasses.asdict(fast.config)))
    assert options["read_impl"] == read_impl
    reference = HTMTransformer(**{**options, "read_impl": "reference"}).double()
    reference.load_state_dict(fast.state_dict())
    x = torch.randn(2, 26, 16, dtype=torch.float64)
    inputs = []
    for model in (fast, reference):
        xi = x.clone().requires_grad_(True)
        y1, state = model(xi[:, :20])
        y2, _ = model(xi[:, 20:], state)
        y = torch.cat([y1, y2], 1)
        if read_impl != "auto":  # the layers' reads ran the kernel asked for; the reference, neither
            assert {name for name, kernel in KERNELS.items() if kernel in autograd_nodes(y)} == (
                {read_impl} if model is fast else set())
        (y * torch.linspace(-1, 1, 16, dtype=torch.float64)).sum().backward()
        inputs.append((y.detach(), xi.grad))
    torch.testing.assert_close(inputs[0][0], inputs[1][0], atol=1e-10, rtol=1e-8)
    torch.testing.assert_close(inputs[0][1], inputs[1][1], atol=1e-10, rtol=1e-8)
    assert_same_gradients(reference, fast, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("shared_memory", [False, True])
@pytest.mark.parametrize("memory_gradient", [False, True])
def test_a_call_builds_its_new_chunks_once(shared_memory, memory_gradient, monkeypatch):
    """Each memory builds the chunks that complete in a call once (``ops.htm_chunks.complete_chunks``)
    and uses them both to read and to store; what it stores is what ``HierarchicalMemory.write`` stores,
    detached."""
    torch.manual_seed(14)
    model = HTMTransformer(**SMALL, shared_memory=shared_memory, memory_gradient=memory_gradient)
    x = torch.randn(2, 11, 16, requires_grad=True)
    mask = torch.arange(11)[None] < torch.tensor([[11], [8]])
    calls, build = [], htm_chunks.complete_chunks
    counted = lambda *a, **kw: calls.append(1) or build(*a, **kw)
    monkeypatch.setattr(htm_chunks, "complete_chunks", counted)  # counts, changes nothing
    _, state = model(x, mask=mask)
    assert len(calls) == (1 if shared_memory else SMALL["depth"])
    written = model.init_state(2).memories[0].write(x, mask=mask)  # layer 0 (or the shared memory) stores x
    for name, want in written.__dict__.items():
        got = getattr(state.memories[0], name)
        assert (torch.equal(got, want) and not got.requires_grad) if torch.is_tensor(want) else got == want
    assert written.valid.any()  # chunks were committed


@pytest.mark.parametrize("options", [{}, {"shared_memory": True, "window": 1}, {"extra_length": 2, "overlap": 1},
                                     {"keep_across_episodes": True, "memory_norm": True}])
def test_one_step_path_equals_the_general_path_with_gradients(options, monkeypatch):
    """A one-step call takes ``HTMTransformer._step`` (the per-call layout of the general path is never
    built) and gives, step after step with episode ends, the outputs, state and gradients (input,
    parameters, across steps through the cache) of one call over the whole sequence (float64)."""
    from chronomem import htm as htm_module

    torch.manual_seed(15)
    model = HTMTransformer(**{**SMALL, **options}).double()
    B, N = 3, 14
    x = torch.randn(B, N, 16, dtype=torch.float64, requires_grad=True)
    done = torch.zeros(B, N, dtype=torch.bool)
    done[0, 4] = done[1, 9] = done[2, 13] = True  # inside, and at the last step
    weights = torch.randn(B, N, 16, dtype=torch.float64)
    whole, state_whole = model(x, done=done)
    grads_whole = torch.autograd.grad((whole * weights).sum(), [x, *model.parameters()])
    general = htm_module.local_layout
    monkeypatch.setattr(htm_module, "local_layout", lambda *a, **kw: pytest.fail("one step took the general path"))
    state, steps = None, []
    for t in range(N):
        y, state = model(x[:, t : t + 1], state, done=done[:, t : t + 1])
        steps.append(y)
    stepped = torch.cat(steps, 1)
    monkeypatch.setattr(htm_module, "local_layout", general)
    torch.testing.assert_close(stepped, whole, atol=1e-10, rtol=0)
    assert_same_state(state, state_whole, atol=1e-10)
    grads_stepped = torch.autograd.grad((stepped * weights).sum(), [x, *model.parameters()])
    for got, want in zip(grads_stepped, grads_whole, strict=True):
        torch.testing.assert_close(got, want, atol=1e-9, rtol=0)
    assert grads_whole[0][:, :4].abs().sum() > 0


@pytest.mark.parametrize("options", [{}, {"shared_memory": True, "window": 1, "overlap": 1}])
def test_a_donated_acting_step_writes_its_chunks_into_its_input_state(options):
    """An acting step whose input state is donated (``layers.state_donated``, as ``rl.acting.Acting`` plays)
    gives the outputs and states of one that is not, step after step: rows out of phase, full ring buffers
    (a commit evicts the oldest chunk, which the step itself still reads) and an episode end. Where a chunk
    completes it writes it into its input's ring buffer; the step that is not donated leaves its input as it
    was."""
    torch.manual_seed(17)
    model = HTMTransformer(**{**SMALL, **options}).eval()
    B, N = 3, 30
    x = torch.randn(B, N, 16)
    done = torch.zeros(B, N, dtype=torch.bool)
    done[1, 17] = True
    with torch.inference_mode():
        lengths = torch.tensor([20, 14, 7])  # the rows at different fills of their chunks
        _, state = model(torch.randn(B, 20, 16), mask=torch.arange(20)[None] < lengths[:, None])
        donated, commits = copy_state(state), 0
        for t in range(N):
            step = (x[:, t : t + 1], None if t == 0 else done[:, t : t + 1])
            before = copy_state(state)
            want, state_after = model(step[0], state, done=step[1])
            assert_same_state(state, before, 0, f"the input state of step {t}")  # left as it was
            completes = bool(torch.stack([m.fill for m in donated.memories]).eq(SMALL["chunk_size"] - 1).any())
            ring = donated.memories[0].contents
            with state_donated():
                got, donated = model(step[0], donated, done=step[1])
            torch.testing.assert_close(got, want, atol=0, rtol=0)
            assert_same_state(donated, state_after, 0, f"the state after step {t}")
            if completes and not done[:, t].any():
                assert donated.memories[0].contents is ring  # written where it was
                assert state_after.memories[0].contents is not state.memories[0].contents
                commits += 1
            state = state_after
    assert commits >= 5 and state.memories[0].valid.all()


@pytest.mark.parametrize("options", [{}, {"shared_memory": True, "window": 1, "extra_length": 2, "overlap": 1}])
def test_a_compiled_acting_step_is_one_graph(options):
    """Under ``torch.compile`` an acting step gives eager's outputs and state, step after step through
    chunks that complete and an episode end, in whole graphs: the choices an eager step reads from values
    (``_read_step_choices``: whether the cached keys and values are current, whether a chunk completes)
    are made without them (the cache read unchecked where the step continues its stretch, else projected
    again; the write that commits), and the attention's empty rows, the chunk count, the commit and the reset
    run inside the graph."""
    torch.manual_seed(16)
    model = HTMTransformer(**{**SMALL, **options}).eval()
    x = torch.randn(3, 11, 16)
    done = torch.zeros(3, 11, dtype=torch.bool)
    done[1, 4] = True
    assert_compiled_acting_matches(model, x, done)
    if not options:  # the same read with a shared memory
        assert_compiled_acting_reads_the_cache(model, x, "keys_values")
    with torch.no_grad():
        _, state = model(x)
    assert state.memories[0].committed.min() >= 2  # chunks complete within the steps


@pytest.mark.parametrize("options", [{"memory_gradient": True},
                                     {"shared_memory": True, "overlap": 1, "keep_across_episodes": True}])
def test_a_compiled_learning_call_is_one_graph(options):
    """Under ``torch.compile`` a learning call (a PPO replay: 17 steps with episode ends inside, from the
    state acting left) gives eager's outputs, state and gradients in one graph, and another rollout with
    other episode ends does not compile again: the episodes' numbering, the chunks a call commits (a
    column per step), the dense read (every chunk scored) and the keys and values' tag (0 with
    gradients) are decided without reading a value."""
    torch.manual_seed(17)
    model = HTMTransformer(**{**SMALL, **options}).double()
    x = torch.randn(3, 17, 16, dtype=torch.float64)
    done = torch.zeros(3, 17, dtype=torch.bool)
    done[1, 4] = done[0, 12] = done[2, 2] = done[2, 5] = True
    assert 17 >= DENSE_MIN_QUERIES  # the read a long call takes
    assert_compiled_learning_matches(model, x, done, atol=1e-9)


def test_registry_and_head():
    from chronomem.heads import build_model
    from chronomem.tasks.copy import CopyTask

    task = CopyTask(seq_len=10)
    model = build_model(
        "htm", task, dim=16, depth=1, num_heads=2, top_k=2, chunk_size=4, memory_size=8, window=8
    )
    logits, _ = model(task.sample(3, torch.Generator().manual_seed(0)).inputs)
    assert logits.shape == (3, task.length, task.num_classes)
    assert torch.isfinite(logits).all()


# ------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------


def test_bad_input():
    with pytest.raises(ValueError, match="top_k"):
        HTMTransformer(**{**SMALL, "top_k": 5})
    with pytest.raises(ValueError, match="top_k"):
        HTMAttention(8, 2, top_k=4, chunk_size=2)(torch.randn(1, 2, 8), HierarchicalMemory.empty(1, 3, 2, 8))
    with pytest.raises(ValueError, match="chunk_size"):
        HTMAttention(8, 2, top_k=1, chunk_size=0)
    with pytest.raises(ValueError, match="chunk_size"):
        HTMTransformer(**{**SMALL, "chunk_size": 0})
    with pytest.raises(ValueError, match="dim"):
        HTMAttention(9, 3, top_k=1, chunk_size=2)  # odd feature size: no sin|cos halves
    attn = HTMAttention(8, 2, top_k=1, chunk_size=2)
    mem = HierarchicalMemory.empty(2, 3, 2, 8)
    with pytest.raises(ValueError, match="mask"):
        attn(torch.randn(2, 4, 8), mem, torch.ones(2, 4, 2, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask"):
        attn(torch.randn(2, 4, 8), mem, torch.ones(2, 4, 3))
    with pytest.raises(ValueError, match="memory"):
        attn(torch.randn(3, 4, 8), mem)
    with pytest.raises(ValueError, match="queries"):
        attn(torch.randn(2, 4, 6), mem)
    with pytest.raises(ValueError, match="x"):
        mem.write(torch.randn(2, 3, 7))
    model = HTMTransformer(**SMALL)
    _, state = model(torch.randn(2, 3, 16))
    with pytest.raises(ValueError, match="state"):
        model(torch.randn(3, 3, 16), state)
    with pytest.raises(ValueError, match="x"):
        model(torch.randn(2, 3, 15))
    with pytest.raises(ValueError, match="mask"):
        model(torch.randn(2, 3, 16), mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="prefix"):
        model(torch.randn(2, 3, 16), mask=torch.tensor([[True, False, True]] * 2))
    with pytest.raises(ValueError, match="overlap"):
        HTMTransformer(**{**SMALL, "overlap": 3})
    with pytest.raises(ValueError, match="output_steps"):
        HTMTransformer(**{**SMALL, "output_steps": 0})
    with pytest.raises(ValueError, match="empty"):
        model(torch.randn(2, 0, 16))


def test_ballet_experiment_smoke(tmp_path):
    from chronomem.experiments.base import run_experiment
    from chronomem.registry import get_experiment

    experiment = get_experiment("ballet")
    results = run_experiment(experiment, "smoke", tmp_path)
    assert set(results["results"]) == {"htm", "transformer-xl", "lstm"}
    for model, row in results["results"].items():  # one model per memory, evaluated per level
        assert set(row) == {"2_delay16"} and 0 <= row["2_delay16"] <= 100
        assert "accuracy_on_training_mixture" in results["extra"]["runs"][f"{model}/seed0"]
    assert "tour" in experiment.scales and (tmp_path / "report.md").exists()


def test_attention_initialisation_follows_the_released_module():
    """VarianceScaling(2) on the relevance and within-chunk projections, zero biases; None keeps PyTorch's."""
    torch.manual_seed(0)
    attn = HTMAttention(256, 4, top_k=2, chunk_size=4)
    target = math.sqrt(2.0 / 256)
    for linear in (attn.to_query, attn.to_key, attn.within.to_q, attn.within.to_kv, attn.within.to_out):
        assert abs(float(linear.weight.detach().std()) / target - 1) < 0.05
        assert linear.bias is None or not linear.bias.any()
    default = HTMAttention(256, 4, top_k=2, chunk_size=4, init_scale=None)
    assert float(default.to_query.weight.detach().std()) < 0.5 * target  # kaiming-uniform(a=sqrt 5): 1/sqrt(3 fan_in)
    model = HTMTransformer(dim=16, depth=1, num_heads=2, top_k=1, chunk_size=2, memory_size=2, window=2,
                           init_scale=None)
    assert model.layers[0].memory.within.to_q.bias.abs().sum() > 0  # PyTorch's default keeps random biases
