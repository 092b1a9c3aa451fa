"""Temporal Latent Bottleneck: a naive per-chunk reference, streaming == batch, causality, padding,
gradients through the state, reset, readout, bad input."""

import pytest
import torch
import torch.nn.functional as F

from chronomem.heads import Classifier
from chronomem.registry import get_model
from chronomem.tlb import TLB, TLBState

torch.set_num_threads(1)

D, K, N = 8, 4, 3  # width, chunk size, state vectors
SMALL = dict(dim=D, num_heads=2, chunk_size=K, num_state=N, self_per_cross=1, depth=1, ff_mult=2.0)
# The details of the authors' forward pass (TLB.Config.authors), at the small sizes.
AUTHORS = dict(slot_encoding="state", learned_init=False, qkv_dim=6, attn_bias=False, norm_eps=1e-6,
               gelu_approximate="tanh")


def make(seed=0, dtype=torch.float64, **options) -> TLB:
    torch.manual_seed(seed)
    model = TLB(**{**SMALL, **options}).to(dtype).eval()
    with torch.no_grad():  # non-trivial LayerNorm affines, so that a mixed-up norm shows
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
    return model


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ------------------------------------------------------------------------------------------------
# Naive reference (the equations of docs/tlb.md): one row and one chunk at a time, only the chunk's valid tokens
# (each keeping the position of its slot), so there is no mask and no batching over chunks.
# ------------------------------------------------------------------------------------------------


@torch.no_grad()
def naive_tlb(model: TLB, x, mask=None, memory=None):
    """Returns ``y [B, L, D]`` (zeros at padded positions) and the final ``I [B, N, D]``."""
    B, L, _ = x.shape
    P, E = model.slot_encoding, model.chunk_encoding
    upd = model.update.block
    y = torch.zeros_like(x)
    finals = []
    for b in range(B):
        I = model.initial.clone() if memory is None else memory[b]  # I_0, [N, D]
        for start in range(0, L, K):
            slots = [j for j in range(min(K, L - start)) if mask is None or bool(mask[b, start + j])]
            if not slots:
                continue  # an all-padding chunk leaves the state unchanged
            idx = torch.tensor(slots)
            h = (x[b, start + idx] + E[idx])[None]  # position encoding within the chunk
            context = (I + P)[None]  # the state I_{l-1} plus the slot encoding
            for group in model.groups:
                for block in group.self_blocks:  # R x pre-LN self-attention + FFN, within the chunk
                    h = block(h, causal=model.causal)
                if group.cross is not None:  # top_down=False: no cross layer
                    h = group.cross(h, context)  # pre-LN cross-attention + FFN to I_{l-1} (top-down)
            y[b, start + idx] = model.norm(h[0])
            # Bottleneck update: U = I + CrossAttn(q=LN(I+P), kv=LN(H)); I' = U + FFN(LN(U))
            U = I + upd.attn(upd.norm_query(I + P)[None], upd.norm_context(h))[0]
            I = U + upd.ff(upd.norm_ff(U))
        finals.append(I)
    return y, torch.stack(finals)


def reference_mask(B, L):
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, 2] = False  # a hole inside a chunk
    mask[1, 8:12] = False  # a whole chunk of padding, then a valid chunk again
    mask[1, 14:] = False  # right padding
    return mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("self_per_cross", [0, 1, 2])
def test_forward_matches_naive_reference(causal, depth, self_per_cross):
    model = make(seed=1, causal=causal, depth=depth, self_per_cross=self_per_cross)
    B, L = 2, 17  # the last chunk is padded internally
    x = randn(B, L, D, seed=2)
    y, state = model(x)
    want_y, want_I = naive_tlb(model, x)
    torch.testing.assert_close(y, want_y, atol=1e-10, rtol=1e-9)
    # I after every token (a causal TLB keeps its partial last chunk pending in the state)
    torch.testing.assert_close(model.latest_memory(state), want_I, atol=1e-10, rtol=1e-9)
    mask = reference_mask(B, L)
    y, state = model(x, mask=mask)
    want_y, want_I = naive_tlb(model, x, mask)
    torch.testing.assert_close(y, want_y, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(model.latest_memory(state), want_I, atol=1e-10, rtol=1e-9)
    # Continuing from a given (non-initial) state: a non-causal call ended its partial chunk, a causal
    # one goes on filling it (then the reference is one call over both pieces).
    z = randn(B, 9, D, seed=3)
    y2, state2 = model(z, state)
    if causal:
        whole_mask = torch.cat([mask, torch.ones(B, 9, dtype=torch.bool)], 1)
        want_y2, want_I2 = naive_tlb(model, torch.cat([x, z], 1), whole_mask)
        want_y2 = want_y2[:, L:]
    else:
        want_y2, want_I2 = naive_tlb(model, z, memory=want_I)
    torch.testing.assert_close(y2, want_y2, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(model.latest_memory(state2), want_I2, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("causal", [False, True])
def test_without_top_down_the_fast_stream_never_reads_the_state(causal):
    """Paper 003 Table 2's ablation: no cross-attention layer in the perceptual module, so the token
    outputs do not depend on the state; the state is still updated (Eq. 7), as the naive reference
    without the cross layer computes."""
    model = make(seed=1, causal=causal, depth=2, top_down=False)
    assert all(group.cross is None for group in model.groups)
    B, L = 2, 17
    x, mask = randn(B, L, D, seed=2), reference_mask(B, L)
    y, state = model(x, mask=mask)
    want_y, want_I = naive_tlb(model, x, mask)
    torch.testing.assert_close(y, want_y, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(model.latest_memory(state), want_I, atol=1e-10, rtol=1e-9)
    other = TLBState(randn(B, N, D, seed=4), torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.bool))
    y_other, state_other = model(x, other, mask=mask)
    torch.testing.assert_close(y_other, y, atol=1e-12, rtol=0)  # outputs ignore the state ...
    assert not torch.allclose(model.latest_memory(state_other), model.latest_memory(state))  # ... which updates
    if causal:  # one token at a time (the cached step path) equals one call
        steps, s = [], None
        for t in range(L):
            out, s = model(x[:, t:t + 1], s, mask=mask[:, t:t + 1])
            steps.append(out)
        torch.testing.assert_close(torch.cat(steps, 1), y, atol=1e-10, rtol=1e-9)
        torch.testing.assert_close(model.latest_memory(s), want_I, atol=1e-10, rtol=1e-9)
    with pytest.raises(ValueError, match="self_per_cross"):  # a group would hold no layer at all
        TLB(**{**SMALL, "self_per_cross": 0, "top_down": False})


def test_float32_matches_naive_reference():
    model = make(seed=4, dtype=torch.float32, depth=2, self_per_cross=2)
    x = randn(2, 17, D, seed=5, dtype=torch.float32)
    mask = reference_mask(2, 17)
    y, state = model(x, mask=mask)
    want_y, want_I = naive_tlb(model, x, mask)
    torch.testing.assert_close(y, want_y, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(state.memory, want_I, atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------------------------------------------
# Streaming == batch
# ------------------------------------------------------------------------------------------------


def run_in_pieces(model, x, cuts, mask=None, state=None):
    ys = []
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        m = None if mask is None else mask[:, a:b]
        y, state = model(x[:, a:b], state, m)
        ys.append(y)
    return torch.cat(ys, 1), state


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"causal": True},
        {"truncate_every": 2},
        {"learned_init": False, "depth": 2},
        AUTHORS,  # P written into the state: it accumulates per chunk, and streaming still equals one call
    ],
)
def test_streaming_equals_one_call(options):
    model = make(seed=6, **options)
    L = 5 * K + 2
    x = randn(2, L, D, seed=7)
    mask = torch.ones(2, L, dtype=torch.bool)
    mask[0, L - 7 :] = False
    for m in (None, mask):
        whole, s_whole = model(x, mask=m)
        for cuts in ([0, K, 3 * K, L], [0, K, 2 * K, 3 * K, 4 * K, 5 * K, L], [0, 5 * K, L]):
            pieces, s_pieces = run_in_pieces(model, x, cuts, m)
            torch.testing.assert_close(pieces, whole, atol=1e-10, rtol=1e-9)
            torch.testing.assert_close(s_pieces.memory, s_whole.memory, atol=1e-10, rtol=1e-9)
            assert torch.equal(s_pieces.chunks, s_whole.chunks)
    # state=None and init_state() are the same start.
    torch.testing.assert_close(model(x, model.init_state(2))[0], model(x)[0], atol=0, rtol=0)
    # Chunks holding at least one valid token (row 0 masked); a causal TLB keeps the last one pending.
    assert s_whole.chunks.tolist() == ([4, 5] if model.causal else [4, 6])


# ------------------------------------------------------------------------------------------------
# Who sees what
# ------------------------------------------------------------------------------------------------


def test_causal_future_never_changes_past():
    model = make(seed=8, causal=True, depth=2)
    L = 4 * K - 1
    x = randn(2, L, D, seed=9)
    y = model(x)[0]
    for p in (0, 1, K - 1, K, 2 * K + 1, L - 1):
        x2 = x.clone()
        x2[:, p:] = randn(2, L - p, D, seed=10 + p)  # everything from p on
        y2 = model(x2)[0]
        torch.testing.assert_close(y2[:, :p], y[:, :p], atol=0, rtol=0)
        assert (y2[:, p] - y[:, p]).abs().amax() > 1e-4  # position p itself does change
    # A single changed token reaches later chunks through the state.
    x2 = x.clone()
    x2[:, 1] += randn(2, D, seed=13)  # (not a constant shift: every LayerNorm would remove that)
    y2 = model(x2)[0]
    torch.testing.assert_close(y2[:, :1], y[:, :1], atol=0, rtol=0)
    for chunk in (1, 2, 3):
        assert (y2[:, chunk * K] - y[:, chunk * K]).abs().amax() > 1e-4


def test_non_causal_information_flows_forward_only_through_the_state():
    model = make(seed=11, causal=False, depth=2)
    x = randn(2, 4 * K, D, seed=12)
    y = model(x)[0]
    p = K + 2  # a token in chunk 1
    x2 = x.clone()
    x2[:, p] += randn(2, D, seed=14)
    y2 = model(x2)[0]
    torch.testing.assert_close(y2[:, :K], y[:, :K], atol=0, rtol=0)  # earlier chunk: untouched
    # Bidirectional within the chunk: positions before p in chunk 1 change.
    assert (y2[:, K] - y[:, K]).abs().amax() > 1e-4
    for chunk in (2, 3):  # later chunks see it through I
        assert (y2[:, chunk * K : (chunk + 1) * K] - y[:, chunk * K : (chunk + 1) * K]).abs().amax() > 1e-4


# ------------------------------------------------------------------------------------------------
# Padding
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [{"causal": False}, {"causal": True}, AUTHORS])
def test_padding_changes_nothing(options):
    model = make(seed=13, depth=2, **options)
    L = 2 * K + 2
    x = randn(2, L, D, seed=14)
    y, state = model(x)
    # Appended masked tokens (random values): the partial chunk 2 gets masked tokens, chunk 3 is all padding.
    extra = 2 * K - 3
    xp = torch.cat([x, 100 * randn(2, extra, D, seed=15)], 1)
    mask = torch.ones(2, L + extra, dtype=torch.bool)
    mask[:, L:] = False
    yp, sp = model(xp, mask=mask)
    torch.testing.assert_close(yp[:, :L], y, atol=1e-10, rtol=1e-9)
    # (I after every token: a causal TLB's padded call has ended the chunk the unpadded one keeps pending)
    torch.testing.assert_close(model.latest_memory(sp), model.latest_memory(state), atol=1e-10, rtol=1e-9)
    if not model.causal:
        assert torch.equal(sp.chunks, state.chunks)
    assert yp[:, L:].abs().max() == 0  # padded outputs are zero
    # Rows of different lengths: a row padded from step 5 equals that row alone, unpadded.
    mask = torch.ones(2, L, dtype=torch.bool)
    mask[1, 5:] = False
    ym, sm = model(x, mask=mask)
    y1, s1 = model(x[1:, :5])
    torch.testing.assert_close(ym[1:, :5], y1, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(model.latest_memory(sm)[1:], model.latest_memory(s1), atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(ym[:1], y[:1], atol=1e-10, rtol=1e-9)
    assert ym[1, 5:].abs().max() == 0


def test_all_padding_chunk_leaves_state_unchanged():
    model = make(seed=16)
    _, state = model(randn(2, 2 * K, D, seed=17))
    z = randn(2, K + 1, D, seed=18)
    none = torch.zeros(2, K + 1, dtype=torch.bool)
    y, after = model(z, state, none)
    assert torch.equal(after.memory, state.memory) and torch.equal(after.chunks, state.chunks)
    assert y.abs().max() == 0
    # One row padded, the other not: only the valid row moves.
    some = none.clone()
    some[1] = True
    _, after = model(z, state, some)
    assert torch.equal(after.memory[0], state.memory[0])
    assert (after.memory[1] - state.memory[1]).abs().amax() > 1e-4
    assert after.chunks.tolist() == [2, 4]
    # From the initial state: all padding leaves I_0.
    _, fresh = model(z, mask=none)
    torch.testing.assert_close(fresh.memory, model.initial.detach().expand(2, -1, -1), atol=0, rtol=0)
    # Gradients stay finite through all-padding chunks (no NaN from attention rows without keys).
    zg = z.clone().requires_grad_(True)
    y, after = model(zg, state, some)
    (y.sum() + after.memory.sum()).backward()
    assert torch.isfinite(zg.grad).all() and zg.grad[0].abs().max() == 0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# ------------------------------------------------------------------------------------------------
# One chunk covering the sequence: a Transformer with cross-attention to a fixed state
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [7, 5])  # exactly one chunk, and one chunk padded internally
def test_single_chunk_is_a_transformer_with_fixed_cross_attention(causal, length):
    model = make(seed=19, causal=causal, depth=2, self_per_cross=2, chunk_size=7)
    x = randn(2, length, D, seed=20)
    y, state = model(x)
    with torch.no_grad():
        h = x + model.chunk_encoding[:length]
        fixed = (model.initial + model.slot_encoding).expand(2, -1, -1)  # I_0 + P, the same for all
        for group in model.groups:
            for block in group.self_blocks:
                h = block(h, causal=causal)
            h = group.cross(h, fixed)
        want = model.norm(h)
        I0 = model.initial.expand(2, -1, -1)
        b = model.update.block
        U = I0 + b.attn(b.norm_query(fixed), b.norm_context(h))
        want_I = U + b.ff(b.norm_ff(U))
    torch.testing.assert_close(y, want, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(model.latest_memory(state), want_I, atol=1e-10, rtol=1e-9)


# ------------------------------------------------------------------------------------------------
# Gradients through the state
# ------------------------------------------------------------------------------------------------


def input_grad(model, x, out_slice, state=None):
    x = x.clone().requires_grad_(True)
    y, _ = model(x, state)
    y[:, out_slice].sum().backward()
    return x.grad


def test_gradients_flow_through_the_state_and_truncation_cuts_them():
    x = randn(2, 3 * K, D, seed=21)
    last = slice(2 * K, 3 * K)
    model = make(seed=22)
    g = input_grad(model, x, last)
    assert g[:, :K].abs().amax() > 0 and g[:, K : 2 * K].abs().amax() > 0  # chunk 2 <- chunks 0, 1
    assert model.initial.grad is not None and model.initial.grad.abs().amax() > 0  # learned I_0 learns
    cut = make(seed=22, truncate_every=1)
    g = input_grad(cut, x, last)
    assert g[:, : 2 * K].abs().max() == 0 and g[:, 2 * K :].abs().amax() > 0
    # truncate_every=2: the state is detached after chunk 1, so chunk 1 still learns from chunk 0 ...
    two = make(seed=22, truncate_every=2)
    assert input_grad(two, x, slice(K, 2 * K))[:, :K].abs().amax() > 0
    # ... but chunk 2 learns from neither.
    assert input_grad(two, x, last)[:, : 2 * K].abs().max() == 0
    # Truncation changes gradients only, never values.
    torch.testing.assert_close(two(x)[0], model(x)[0], atol=0, rtol=0)


def test_gradients_flow_across_calls_unless_detached():
    model = make(seed=23)
    x = randn(2, K, D, seed=24).requires_grad_(True)
    _, state = model(x)
    z = randn(2, K, D, seed=25)
    model(z, state)[0].sum().backward()
    assert x.grad.abs().amax() > 0
    x.grad = None
    model(z, state.detach())[0].sum().backward()
    assert x.grad is None


# ------------------------------------------------------------------------------------------------
# Reset and readout
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("learned_init", [True, False])
def test_reset_restores_the_initial_state(learned_init):
    model = make(seed=26, learned_init=learned_init, truncate_every=3)
    _, state = model(randn(3, 2 * K, D, seed=27))
    done = torch.tensor([True, False, True])
    cleared = state.reset(done)
    assert cleared.fresh.tolist() == [True, False, True] and cleared.chunks.tolist() == [0, 2, 0]
    z = randn(3, K + 2, D, seed=28)
    y, after = model(z, cleared)
    y_fresh, s_fresh = model(z[done])
    torch.testing.assert_close(y[done], y_fresh, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(after.memory[done], s_fresh.memory, atol=1e-10, rtol=1e-9)
    assert torch.equal(after.chunks[done], s_fresh.chunks)
    y_kept, s_kept = model(z, state)  # the row that did not finish carries on
    torch.testing.assert_close(y[1], y_kept[1], atol=0, rtol=0)
    torch.testing.assert_close(after.memory[1], s_kept.memory[1], atol=0, rtol=0)
    assert not after.fresh.any()
    # Read before the next call, a reset row summarises I_0 (not the zeros that stand in for it).
    fresh = model.init_state(3)
    torch.testing.assert_close(model.summary(None, cleared)[done], model.summary(None, fresh)[done])
    if learned_init:  # the live I_0 is used after a reset, so it gets gradients
        model.zero_grad()
        model(z, cleared.detach())[0][0].sum().backward()
        assert model.initial.grad.abs().amax() > 0


def test_summary_is_the_mean_of_the_normalised_final_state():
    model = make(seed=29)
    x = randn(2, 2 * K + 1, D, seed=30)
    y, state = model(x)
    ln = model.norm_state
    want = F.layer_norm(state.memory, (D,), ln.weight, ln.bias).mean(dim=1)
    got = model.summary(y, state)
    assert got.shape == (2, D)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(model.summary(torch.zeros_like(y), state), got)  # the state, not the tokens
    # The classifier head reads the class from it.
    head = Classifier(model, D, num_classes=3, input_dim=5).float()  # the head feeds float32
    logits, s = head(randn(2, 2 * K + 1, 5, seed=31, dtype=torch.float32))
    torch.testing.assert_close(logits, head.mlp(model.summary(None, s)))


# ------------------------------------------------------------------------------------------------
# Construction and bad input
# ------------------------------------------------------------------------------------------------


def test_config_and_registry():
    a = TLB(config=TLB.Config(dim=16, num_heads=4, chunk_size=5, num_state=2))
    b = TLB(dim=16, num_heads=4, chunk_size=5, num_state=2)
    assert a.config == b.config
    defaults = TLB.Config()  # the authors' LRA ListOps setting
    assert (defaults.self_per_cross, defaults.num_state, defaults.chunk_size) == (2, 100, 100)
    built = get_model("tlb")(dim=16, depth=2, num_heads=4, causal=True, chunk_size=3, num_state=2)
    assert built.config.depth == 2 and built.causal and len(built.groups) == 2
    with pytest.raises(TypeError, match="unknown"):
        TLB(dim=16, num_heads=4, chunk=3)


def test_bad_input():
    with pytest.raises(ValueError, match="chunk_size"):
        TLB(**{**SMALL, "chunk_size": 0})
    with pytest.raises(ValueError, match="num_state"):
        TLB(**{**SMALL, "num_state": 0})
    with pytest.raises(ValueError, match="num_heads"):
        TLB(**{**SMALL, "num_heads": 3})
    with pytest.raises(ValueError, match="truncate_every"):
        TLB(**{**SMALL, "truncate_every": 0})
    model = TLB(**SMALL)
    with pytest.raises(ValueError, match="x"):
        model(torch.randn(2, 5))  # wrong rank
    with pytest.raises(ValueError, match="x"):
        model(torch.randn(2, 5, D + 2))  # wrong feature size
    with pytest.raises(ValueError, match="empty"):
        model(torch.randn(2, 0, D))
    with pytest.raises(TypeError, match="x"):
        model([[0.0] * D])
    with pytest.raises(ValueError, match="mask"):
        model(torch.randn(2, 5, D), mask=torch.ones(2, 6, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask"):
        model(torch.randn(2, 5, D), mask=torch.ones(2, 5))
    _, state = model(torch.randn(2, 5, D))
    with pytest.raises(ValueError, match="state"):
        model(torch.randn(3, 5, D), state)
    with pytest.raises(TypeError, match="state"):
        model(torch.randn(2, 5, D), state.memory)
    other = TLBState(torch.zeros(2, N + 1, D), state.chunks, state.fresh)
    with pytest.raises(ValueError, match="state"):
        model(torch.randn(2, 5, D), other)
    with pytest.raises(TypeError, match="done"):
        state.reset(torch.tensor([1, 0]))
