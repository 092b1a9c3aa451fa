"""Shared primitives against naive references."""

import dataclasses
import math

import pytest
import torch
from torch import nn

from chronomem.checks import check_mask, check_tensor, check_token_ids, parameter_dtype
from chronomem.layers import (
    CrossAttentionBlock,
    FeedForward,
    MultiHeadAttention,
    ParameterVersion,
    RecurrentState,
    SelfAttentionBlock,
    causal_mask,
    dropout_layer,
    fixed_stretch,
    masked_mean,
    pad_to_multiple,
    parameters_fixed,
    sinusoid_encoding,
    variance_scaling_,
)


def naive_attention(mha: MultiHeadAttention, query, key_value, allowed, bias=None):
    """softmax(Q K^T / sqrt(d) + bias) V per head, looping over batch, head and query; empty rows -> 0."""
    B, Nq, D = query.shape
    H, Dh = mha.num_heads, mha.head_dim
    q = mha.to_q(query)
    k, v = mha.to_kv(key_value).chunk(2, dim=-1)
    out = torch.zeros(B, Nq, D)
    for b in range(B):
        for h in range(H):
            sl = slice(h * Dh, (h + 1) * Dh)
            for i in range(Nq):
                logits = k[b, :, sl] @ q[b, i, sl] / math.sqrt(Dh)
                if bias is not None:
                    logits = logits + bias[b, h, i]
                ok = allowed[b, i]
                if not ok.any():
                    continue
                weights = torch.softmax(logits.masked_fill(~ok, float("-inf")), dim=0)
                out[b, i, sl] = weights @ v[b, :, sl]
    return mha.to_out(out)  # an empty row's head outputs are zero before the output projection


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("use_key_mask", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_naive(cross, use_key_mask, causal):
    torch.manual_seed(0)
    B, Nq, D, H = 2, 5, 12, 3
    Nk = 7 if cross else Nq
    mha = MultiHeadAttention(D, H, kv_dim=8 if cross else None)
    query = torch.randn(B, Nq, D)
    kv = torch.randn(B, Nk, 8) if cross else query
    key_mask = torch.rand(B, Nk) > 0.3 if use_key_mask else None
    if key_mask is not None:
        key_mask[1] = False  # a row with no visible key must read zeros
    out = mha(query, kv if cross else None, key_mask=key_mask, causal=causal)
    allowed = torch.ones(B, Nq, Nk, dtype=torch.bool)
    if key_mask is not None:
        allowed &= key_mask[:, None, :]
    if causal:
        allowed &= causal_mask(Nq, Nk)
    ref = naive_attention(mha, query, kv, allowed)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    assert torch.isfinite(out).all()


def test_attention_bias_and_mask_match_naive():
    torch.manual_seed(1)
    B, N, D, H = 2, 6, 8, 2
    mha = MultiHeadAttention(D, H)
    x = torch.randn(B, N, D)
    bias = torch.randn(B, H, N, N)
    mask = torch.rand(B, 1, N, N) > 0.4
    q = mha.heads_q(x)
    k, v = mha.heads_kv(x)
    out = mha.attend(q, k, v, mask=mask, bias=bias)
    # the naive reference takes one mask per batch row; heads share it here
    ref = naive_attention(mha, x, x, mask[:, 0], bias=bias)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


def test_attention_gradients_and_empty_rows_are_finite():
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(1, 4, 8, requires_grad=True)
    out = mha(x, key_mask=torch.zeros(1, 4, dtype=torch.bool))
    assert torch.equal(out, mha.to_out.bias.expand_as(out))  # zero read, then the output bias
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_blocks_are_pre_ln_residual():
    torch.manual_seed(0)
    block = SelfAttentionBlock(8, 2)
    x = torch.randn(2, 5, 8)
    h = x + block.attn(block.norm_attn(x))
    torch.testing.assert_close(block(x), h + block.ff(block.norm_ff(h)))
    cross = CrossAttentionBlock(8, 2, context_dim=6)
    ctx = torch.randn(2, 3, 6)
    h = x + cross.attn(cross.norm_query(x), cross.norm_context(ctx))
    torch.testing.assert_close(cross(x, ctx), h + cross.ff(cross.norm_ff(h)))


def test_sinusoid_encoding():
    pe = sinusoid_encoding(5, 8)
    assert pe.shape == (5, 8)
    torch.testing.assert_close(pe[:, 0], torch.sin(torch.arange(5.0)))  # first frequency is 1
    torch.testing.assert_close(pe[:, 4], torch.cos(torch.arange(5.0)))
    torch.testing.assert_close(sinusoid_encoding(5, 8, reverse=True), pe.flip(0))
    with pytest.raises(ValueError, match="even"):
        sinusoid_encoding(5, 7)


def test_variance_scaling_matches_haiku_statistics():
    """Haiku's VarianceScaling(scale): truncated at 2 std of the underlying normal, variance scale/fan_in."""
    torch.manual_seed(0)
    linear = variance_scaling_(torch.nn.Linear(400, 300), 2.0)
    w = linear.weight.detach()
    target_std = math.sqrt(2.0 / 400)
    assert abs(float(w.std()) / target_std - 1) < 0.02  # 120k draws: the variance is scale / fan_in
    assert float(w.abs().max()) <= 2 * target_std / 0.87962566103423978 + 1e-7  # truncated at 2 sigma
    assert torch.equal(linear.bias, torch.zeros(300))
    with pytest.raises(ValueError, match="scale"):
        variance_scaling_(torch.nn.Linear(3, 3), 0.0)
    with pytest.raises(TypeError, match="nn.Linear"):
        variance_scaling_(torch.nn.Conv1d(3, 3, 1), 1.0)


def test_masks_and_padding():
    assert torch.equal(causal_mask(2, 3), torch.tensor([[True, True, False], [True, True, True]]))
    x = torch.randn(2, 5, 3)
    padded, mask = pad_to_multiple(x, 4)
    assert padded.shape == (2, 8, 3) and mask.sum() == 10 and torch.equal(padded[:, :5], x)
    m = torch.tensor([[True, True, False, False, False], [True] * 5])
    torch.testing.assert_close(masked_mean(x, m), torch.stack([x[0, :2].mean(0), x[1].mean(0)]))


def test_checks_name_the_argument():
    with pytest.raises(ValueError, match="x must have 3 dimensions"):
        check_tensor(torch.zeros(2, 3), "x", 3)
    with pytest.raises(ValueError, match="last dimension 4"):
        check_tensor(torch.zeros(2, 3, 5), "x", 3, 4)
    with pytest.raises(ValueError, match="empty"):
        check_tensor(torch.zeros(2, 0, 4), "x", 3, 4)
    with pytest.raises(TypeError, match="boolean"):
        check_mask(torch.ones(2, 3), "mask", (2, 3))
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        check_mask(torch.ones(2, 4, dtype=torch.bool), "mask", (2, 3))
    with pytest.raises(ValueError, match="must divide"):
        MultiHeadAttention(10, 3)


@dataclasses.dataclass(frozen=True)
class _State(RecurrentState):
    h: torch.Tensor
    valid: torch.Tensor


def test_recurrent_state_reset_and_detach():
    h = torch.randn(3, 2, requires_grad=True)
    s = _State(h * 2, torch.ones(3, 4, dtype=torch.bool))
    r = s.reset(torch.tensor([False, True, False]))
    assert torch.equal(r.h[1], torch.zeros(2)) and torch.equal(r.h[0], s.h[0])
    assert r.valid[1].sum() == 0 and r.valid[0].all()
    assert not s.detach().h.requires_grad
    with pytest.raises(TypeError):
        s.reset(torch.tensor([0, 1, 0]))


def test_recurrent_state_reset_selects_a_poisoned_row_clean():
    """reset restores zeros by selection: NaN * 0 and inf * 0 are NaN, so multiplying would not."""
    h = torch.tensor([[float("nan"), 1.0], [float("inf"), -float("inf")], [2.0, 3.0]])
    s = _State(h, torch.ones(3, 4, dtype=torch.bool))
    r = s.reset(torch.tensor([True, True, False]))
    assert torch.equal(r.h, torch.tensor([[0.0, 0.0], [0.0, 0.0], [2.0, 3.0]]))
    assert torch.equal(r.valid.sum(1), torch.tensor([0, 0, 4]))


def test_check_tensor_dtype_rule_and_batch():
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        out = check_tensor(x.to(dtype), "x", 3, 4, dtype=torch.float32)
        assert out.dtype == torch.float32
        assert torch.equal(out, x.to(dtype).float())
    assert check_tensor(x, "x", 3, 4) is x  # no dtype: no cast
    for dtype in (torch.int64, torch.int32, torch.bool):
        with pytest.raises(TypeError, match=rf"feats must be a floating-point tensor.*{dtype}"):
            check_tensor(torch.zeros(2, 3, 4, dtype=dtype), "feats", 3, 4, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"x must have batch size >= 1.*\(0, 3, 4\)"):
        check_tensor(torch.zeros(0, 3, 4), "x", 3, 4)
    assert parameter_dtype(torch.nn.Linear(2, 2).double()) == torch.float64


def test_check_token_ids():
    ids = torch.tensor([[0, 4, 2]], dtype=torch.int32)
    assert torch.equal(check_token_ids(ids, "inputs", 5), ids.long())
    with pytest.raises(ValueError, match=r"inputs must hold token ids in \[0, 5\).*\[-1, 5\].*\(1, 3\)"):
        check_token_ids(torch.tensor([[-1, 5, 2]]), "inputs", 5)
    with pytest.raises(ValueError, match=r"inputs must have 2 dimensions.*got shape \(3,\)"):
        check_token_ids(torch.tensor([0, 1, 2]), "inputs", 5)
    with pytest.raises(TypeError, match="inputs must be integer token ids.*float32"):
        check_token_ids(torch.zeros(1, 3), "inputs", 5)
    with pytest.raises(ValueError, match="batch size >= 1"):
        check_token_ids(torch.zeros(0, 3, dtype=torch.long), "inputs", 5)


def test_state_select_and_concat_split_and_join_the_batch():
    import dataclasses as dc

    from chronomem.layers import RecurrentState, concat_states

    @dc.dataclass(frozen=True)
    class S(RecurrentState):
        h: torch.Tensor
        valid: torch.Tensor
        pair: tuple

    state = S(torch.arange(12.0).view(4, 3), torch.tensor([True, False, True, False]),
              (torch.arange(4), torch.zeros(4, 2)))
    order = torch.tensor([3, 1])
    picked = state.select(order)
    assert torch.equal(picked.h, state.h[order]) and torch.equal(picked.valid, state.valid[order])
    assert torch.equal(picked.pair[0], torch.tensor([3, 1]))
    assert torch.equal(state.select(torch.tensor([True, False, False, True])).h, state.h[[0, 3]])
    joined = concat_states([state.select([0, 1]), state.select([2, 3])])
    for a, b in zip(dc.astuple(joined), dc.astuple(state), strict=True):
        if isinstance(a, tuple):
            assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
        else:
            assert torch.equal(a, b)
    with pytest.raises(TypeError, match="rows"):
        state.select(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="at least one"):
        concat_states([])


def test_dropout_layer_at_zero_is_the_identity_and_keeps_the_parameters():
    """``dropout_layer(0)`` dispatches nothing and equals ``nn.Dropout(0)``; any other rate is dropout. A
    FeedForward built with it has the parameters (names, values) and, in eval mode, the outputs of one with dropout."""
    x = torch.randn(4, 8)
    assert isinstance(dropout_layer(0.0), nn.Identity) and torch.equal(dropout_layer(0.0)(x), nn.Dropout(0.0)(x))
    assert isinstance(dropout_layer(0.5), nn.Dropout) and dropout_layer(0.5).p == 0.5
    torch.manual_seed(0)
    plain = FeedForward(8, dropout=0.0)
    torch.manual_seed(0)
    dropping = FeedForward(8, dropout=0.3).eval()
    assert plain.state_dict().keys() == dropping.state_dict().keys()
    assert torch.equal(plain(x), dropping(x))


def test_a_parameter_version_compares_once_per_fixed_stretch():
    """``ParameterVersion`` gives a new number whenever the values changed, comparing at every call;
    inside ``parameters_fixed(stretch)`` it compares at its first call of the stretch only (a change inside
    is the caller's mistake, not seen), a new stretch compares again, and nested stretches each compare
    once. The parameters are read only when compared."""
    weight = nn.Parameter(torch.randn(3, 4))
    version, reads = ParameterVersion(), []

    def parameters():
        reads.append(1)
        yield weight

    first = version(parameters())
    assert first > 0 and version(parameters()) == first and len(reads) == 2  # outside: compares every call
    with torch.no_grad():
        weight.add_(1.0)
    assert version(parameters()) != first  # the change is seen
    changed, stretch = version(parameters()), fixed_stretch()
    reads.clear()
    for _ in range(3):
        with parameters_fixed(stretch):
            assert version(parameters()) == changed
    assert len(reads) == 1  # one comparison for the stretch's three calls
    with parameters_fixed(stretch), torch.no_grad():
        weight.add_(1.0)  # a mistake inside a stretch: not seen until the stretch ends
        assert version(parameters()) == changed
    with parameters_fixed(fixed_stretch()):  # a new stretch compares again
        seen = version(parameters())
        assert seen != changed
        with parameters_fixed(fixed_stretch()):  # a nested one too, once
            reads.clear()
            assert version(parameters()) == seen and version(parameters()) == seen and len(reads) == 1
        reads.clear()
        assert version(parameters()) == seen and len(reads) == 1  # back in the outer stretch: compared again
