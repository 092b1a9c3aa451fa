"""Tests of the baselines: Transformer, Transformer-XL / GTrXL, LSTM.

Fast paths are compared with naive references written with explicit loops (per head, per query/key
pair, per time step) on tiny random inputs.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from chronomem.baselines import (
    LSTM,
    GRUGate,
    LSTMState,
    RelativeAttention,
    Transformer,
    TransformerXL,
    XLState,
    relative_shift,
)
from chronomem.registry import build_backbone, get_model
from helpers import (
    assert_compiled_acting_matches,
    assert_compiled_acting_reads_the_cache,
    assert_compiled_learning_matches,
    assert_same_gradients,
)

torch.set_num_threads(1)


def _seed(s: int = 0) -> torch.Generator:
    torch.manual_seed(s)
    return torch.Generator().manual_seed(s)


def close(a, b, tol=1e-5):
    assert a.shape == b.shape, (a.shape, b.shape)
    if a.numel() == 0:
        return
    err = (a - b).abs().max().item()
    assert err <= tol * (1 + b.abs().max().item()), err


# --------------------------------------------------------------------------------------------
# Transformer
# --------------------------------------------------------------------------------------------


def naive_sinusoid(pos: float, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = [10000.0 ** (-2 * k / dim) for k in range(half)]
    values = [math.sin(pos * f) for f in freqs] + [math.cos(pos * f) for f in freqs]
    return torch.tensor(values, dtype=torch.float64)


def naive_mha(attn, xq, xkv, allowed):
    """One example: xq [Nq, D], xkv [Nk, D], allowed(i, j) -> bool. Explicit per-head softmax."""
    H, Dh = attn.num_heads, attn.head_dim
    q = xq @ attn.to_q.weight.T + attn.to_q.bias
    kv = xkv @ attn.to_kv.weight.T + attn.to_kv.bias
    k, v = kv[:, : attn.dim], kv[:, attn.dim :]
    out = torch.zeros(xq.shape[0], attn.dim, dtype=xq.dtype)
    for h in range(H):
        sl = slice(h * Dh, (h + 1) * Dh)
        for i in range(xq.shape[0]):
            js = [j for j in range(xkv.shape[0]) if allowed(i, j)]
            scores = torch.stack([q[i, sl] @ k[j, sl] / math.sqrt(Dh) for j in js])
            w = torch.softmax(scores, 0)
            out[i, sl] = sum(w[n] * v[j, sl] for n, j in enumerate(js))
    return out @ attn.to_out.weight.T + attn.to_out.bias


def naive_transformer(model: Transformer, x: torch.Tensor) -> torch.Tensor:
    """One unpadded example x [N, D]."""
    n, d = x.shape
    h = x + torch.stack([naive_sinusoid(t, d) for t in range(n)]).to(x.dtype)
    allowed = (lambda i, j: j <= i) if model.causal else (lambda i, j: True)
    for block in model.blocks:
        a = block.norm_attn(h)
        h = h + naive_mha(block.attn, a, a, allowed)
        lin1, lin2 = block.ff.net[0], block.ff.net[3]
        h = h + lin2(F.gelu(lin1(block.norm_ff(h))))
    return model.norm(h)


@pytest.mark.parametrize("causal", [False, True])
def test_transformer_matches_naive(causal):
    _seed(0)
    model = Transformer(dim=8, depth=2, num_heads=2, causal=causal).double().eval()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    y, state = model(x)
    assert state is None and y.shape == (3, 5, 8)
    for b in range(3):
        close(y[b], naive_transformer(model, x[b]), 1e-6)  # sinusoids are float32


def test_transformer_causal_ignores_future():
    _seed(1)
    x = torch.randn(2, 9, 16)
    x2 = x.clone()
    x2[:, 5:] = torch.randn(2, 4, 16)
    causal = Transformer(dim=16, depth=2, num_heads=4, causal=True).eval()
    close(causal(x)[0][:, :5], causal(x2)[0][:, :5], 1e-6)
    bidir = Transformer(dim=16, depth=2, num_heads=4, causal=False).eval()
    assert (bidir(x)[0][:, :5] - bidir(x2)[0][:, :5]).abs().max() > 1e-3  # the check can fail


@pytest.mark.parametrize("causal", [False, True])
def test_transformer_padding_invariance(causal):
    _seed(2)
    model = Transformer(dim=16, depth=2, num_heads=4, causal=causal).eval()
    a, b = torch.randn(1, 7, 16), torch.randn(1, 4, 16)
    # row 0: a (full); row 1: b right-padded; row 2: b left-padded; row 3: b with holes; padding is garbage
    x = torch.randn(4, 7, 16) * 10
    mask = torch.zeros(4, 7, dtype=torch.bool)
    x[0], mask[0] = a[0], True
    x[1, :4], mask[1, :4] = b[0], True
    x[2, 3:], mask[2, 3:] = b[0], True
    holes = torch.tensor([0, 2, 3, 6])
    x[3, holes], mask[3, holes] = b[0], True
    y, _ = model(x, mask=mask)
    ya, yb = model(a)[0][0], model(b)[0][0]
    close(y[0], ya)
    for row in (1, 2, 3):
        close(y[row][mask[row]], yb)
        assert (y[row][~mask[row]] == 0).all()


# --------------------------------------------------------------------------------------------
# Transformer-XL: relative attention against a per-(i, j) loop
# --------------------------------------------------------------------------------------------


def naive_relative_attention(ra: RelativeAttention, x, context, key_valid, causal):
    """Dai et al. Sec. 3.3, one (i, j) pair at a time: score = (q+u)k + (q+v) W_kr R_{i-j}."""
    B, L, D = x.shape
    K = context.shape[1]
    H, Dh = ra.num_heads, ra.head_dim
    attn = ra.attn
    out = torch.zeros(B, L, D, dtype=x.dtype)
    for b in range(B):
        q = x[b] @ attn.to_q.weight.T + attn.to_q.bias
        kv = context[b] @ attn.to_kv.weight.T + attn.to_kv.bias
        k, v = kv[:, :D], kv[:, D:]
        for h in range(H):
            sl = slice(h * Dh, (h + 1) * Dh)
            for i in range(L):
                pos_i = K - L + i
                scores, values = [], []
                for j in range(K):
                    if not key_valid[b, j] or (causal and j > pos_i):
                        continue
                    r = ra.to_r.weight @ naive_sinusoid(pos_i - j, D).to(x.dtype)  # W_kr R_{i-j}
                    s = (q[i, sl] + ra.u[h]) @ k[j, sl] + (q[i, sl] + ra.v[h]) @ r[sl]
                    scores.append(s / math.sqrt(Dh))
                    values.append(v[j, sl])
                if scores:
                    w = torch.softmax(torch.stack(scores), 0)
                    out[b, i, sl] = sum(wn * vn for wn, vn in zip(w, values, strict=True))
    return out @ attn.to_out.weight.T + attn.to_out.bias


@pytest.mark.parametrize("causal", [True, False])
def test_relative_attention_matches_naive_loops(causal):
    _seed(3)
    ra = RelativeAttention(8, 2).double()
    with torch.no_grad():  # non-trivial global biases
        ra.u.normal_()
        ra.v.normal_()
    M, L = 3, 4
    context = torch.randn(2, M + L, 8, dtype=torch.float64)
    x = context[:, M:]
    key_valid = torch.ones(2, M + L, dtype=torch.bool)
    key_valid[0, 0] = False  # an empty memory slot
    key_valid[1, :M] = False  # no memory at all
    key_valid[1, M + 2] = False  # a padded step in the segment
    got = ra(x, context, key_mask=key_valid, causal=causal)
    want = naive_relative_attention(ra, x, context, key_valid, causal)
    close(got, want, 1e-6)  # sinusoids are float32


@pytest.mark.parametrize("table", [True, False])
@pytest.mark.parametrize("n_q,n_k", [(1, 1), (1, 5), (3, 3), (4, 9), (5, 7)])
def test_position_bias_matches_naive_pairs(table, n_q, n_k):
    """Both ways to the position term (a table of R_{i-j} per pair, or the relative shift) equal
    ``(q + v)^T W_kr R_{i-j}`` pair by pair, with the same gradients into q, v and W_kr."""
    _seed(5)
    ra = RelativeAttention(8, 2).double()
    H, Dh = 2, 4
    q = torch.randn(3, H, n_q, Dh, dtype=torch.float64, requires_grad=True)
    want = torch.zeros(3, H, n_q, n_k, dtype=torch.float64)
    for i in range(n_q):
        for j in range(n_k):
            r = ra.to_r.weight @ naive_sinusoid(n_k - n_q + i - j, 8).double()  # W_kr R_{i-j}
            want[..., i, j] = ((q[..., i, :] + ra.v) * r.view(H, Dh)).sum(-1) / math.sqrt(Dh)
    got = ra.position_bias(q, n_k, table=table)
    close(got, want, 1e-6)  # sinusoids are float32
    with torch.inference_mode():  # kept outside autograd (in the form asked): the second call reads it
        for _ in range(2):
            close(ra.position_bias(q.detach(), n_k, table=table), want.detach(), 1e-6)
    grad_out = torch.randn_like(want)
    got_grads = torch.autograd.grad((got * grad_out).sum(), (q, ra.v, ra.to_r.weight))
    want_grads = torch.autograd.grad((want * grad_out).sum(), (q, ra.v, ra.to_r.weight))
    for g, w in zip(got_grads, want_grads, strict=True):
        close(g, w, 1e-6)


def test_projected_distances_are_kept_outside_autograd_and_never_stale():
    """Acting and generation reuse ``W_kr R`` from the last call of the same shape; a weight change by an
    optimizer step, ``load_state_dict`` or ``.to()`` is seen, and under autograd nothing is kept."""
    _seed(6)
    ra, other = RelativeAttention(8, 2), RelativeAttention(8, 2)
    x, context = torch.randn(2, 1, 8), torch.randn(2, 6, 8)

    def fresh():  # the same call computed from scratch
        ra._distances_cache = None
        with torch.inference_mode():
            return ra(x, context)

    with torch.inference_mode():
        first = ra(x, context)
        kept = ra._distances_cache[1]
        assert torch.equal(ra(x, context), first) and ra._distances_cache[1] is kept  # reused
        ra(torch.randn(2, 2, 8), context)  # another shape: computed anew
        assert ra._distances_cache[1] is not kept
    ra(x, context).sum().backward()
    assert ra._distances_cache is None  # nothing kept under autograd
    torch.optim.SGD(ra.parameters(), lr=0.5).step()
    with torch.inference_mode():
        stepped = ra(x, context)
    assert not torch.equal(stepped, first) and torch.equal(stepped, fresh())
    with torch.inference_mode():
        ra(x, context)
    ra.load_state_dict(other.state_dict())
    with torch.inference_mode():
        assert torch.equal(ra(x, context), fresh())
        ra(x, context)
    for p in ra.parameters():  # fused Adam writes in place without bumping version counters
        p.grad = torch.randn_like(p)
    torch.optim.Adam(ra.parameters(), lr=0.5, fused=True).step()
    with torch.inference_mode():
        assert torch.equal(ra(x, context), fresh())
    ra.double()
    assert ra._distances_cache is None
    with torch.inference_mode():
        assert ra(x.double(), context.double()).dtype == torch.float64


def test_projected_distances_compile_into_one_graph_across_layers():
    """Under torch.compile the kept ``W_kr R`` is not used: its key (a weight's address) would break the
    graph and recompile once per layer. Several layers acting compile whole (``fullgraph``), once, and
    give eager's numbers."""
    _seed(7)
    layers = torch.nn.ModuleList(RelativeAttention(8, 2) for _ in range(3))

    def act(x, memory):
        for layer in layers:
            x = layer(x, torch.cat([memory, x], 1))
        return x

    torch._dynamo.reset()
    compiled = torch.compile(act, backend="eager", fullgraph=True)
    x, memory = torch.randn(2, 1, 8), torch.randn(2, 5, 8)
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            close(compiled(x, memory), act(x, memory), 1e-6)
    torch._dynamo.reset()


@pytest.mark.parametrize("n_q,n_k", [(1, 1), (1, 5), (3, 3), (4, 9), (5, 7)])
def test_relative_shift_matches_gather(n_q, n_k):
    scores = torch.randn(2, 3, n_q, n_k + n_q - 1)
    i = torch.arange(n_q)[:, None]
    j = torch.arange(n_k)[None, :]
    col = n_q - 1 - i + j  # column of distance (n_k - n_q + i) - j
    want = scores.gather(-1, col.expand(2, 3, n_q, n_k))
    close(relative_shift(scores, n_k), want, 0)


# --------------------------------------------------------------------------------------------
# Transformer-XL / GTrXL: recurrence
# --------------------------------------------------------------------------------------------


def _xl(**kw):
    base = dict(dim=16, depth=2, num_heads=2, segment_len=4, mem_len=6)
    base.update(kw)
    return TransformerXL(**base).eval()


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mem_len", [0, 3, 6])
def test_xl_streaming_equals_batch(gated, causal, mem_len):
    _seed(4)
    model = _xl(gated=gated, causal=causal, mem_len=mem_len)
    x = torch.randn(3, 14, 16)  # segments 4, 4, 4, 2
    mask = torch.ones(3, 14, dtype=torch.bool)
    mask[1, 11:] = False  # right padding in one row
    y, state = model(x, mask=mask)
    ys, s = [], None
    for start in range(0, 14, 4):
        y_t, s = model(x[:, start : start + 4], s, mask[:, start : start + 4])
        ys.append(y_t)
    close(torch.cat(ys, 1), y)
    close(s.memory, state.memory)
    assert torch.equal(s.valid, state.valid)
    assert not state.memory.requires_grad


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("output_steps", [1, 3, 6, 20])  # within the last segment, across two, all
def test_xl_output_steps_equal_the_plain_forward(gated, causal, output_steps):
    """``output_steps=r``: the last r outputs, their gradients and the state are the plain forward's;
    the other outputs are zeros."""
    _seed(9)
    fast = _xl(gated=gated, causal=causal, output_steps=output_steps).train()
    plain = _xl(gated=gated, causal=causal).train()
    plain.load_state_dict(fast.state_dict())
    x = torch.randn(3, 14, 16)  # segments 4, 4, 4, 2
    (y_fast, s_fast), (y_plain, s_plain) = fast(x), plain(x)
    r = min(output_steps, 14)
    close(y_fast[:, -r:], y_plain[:, -r:])
    assert not y_fast[:, : 14 - r].any()
    close(s_fast.memory, s_plain.memory)
    weights = torch.randn_like(y_plain[:, -r:])
    (y_fast[:, -r:] * weights).mean().backward()
    (y_plain[:, -r:] * weights).mean().backward()
    assert_same_gradients(plain, fast)
    if r < 14:
        with pytest.raises(ValueError, match="mask"):
            fast(x, mask=torch.arange(14)[None].expand(3, 14) < 13)
    with pytest.raises(ValueError, match="output_steps"):
        _xl(output_steps=0)


@settings(max_examples=15, deadline=None)
@given(
    seg=st.integers(1, 5), mem=st.integers(0, 7), n=st.integers(1, 13),
    gated=st.booleans(), causal=st.booleans(),
)
def test_xl_streaming_equals_batch_random_shapes(seg, mem, n, gated, causal):
    torch.manual_seed(seg * 1000 + mem * 100 + n)
    model = TransformerXL(dim=8, depth=2, num_heads=2, segment_len=seg, mem_len=mem, gated=gated,
                          causal=causal).eval()
    x = torch.randn(2, n, 8)
    state = model.init_state(2)
    y, final = model(x, state)
    ys, s = [], state
    for chunk in x.split(seg, dim=1):
        y_t, s = model(chunk, s)
        ys.append(y_t)
    close(torch.cat(ys, 1), y)
    close(s.memory, final.memory)
    assert final.memory.shape == (2, 2, mem, 8) and int(final.valid[0].sum()) == min(mem, n)


def test_xl_memory_equals_recomputation():
    """Causal XL: forward values with segment 1 and a long memory equal one segment over everything
    (the cached layer inputs are what the layers would recompute; relative distances line up)."""
    _seed(5)
    x = torch.randn(2, 10, 16)
    for gated in (False, True):
        whole = _xl(gated=gated, segment_len=10, mem_len=0)
        y, _ = whole(x)
        for seg in (1, 3):
            parts = _xl(gated=gated, segment_len=seg, mem_len=10)
            parts.load_state_dict(whole.state_dict())
            close(parts(x)[0], y)


def test_xl_memory_holds_layer_inputs():
    _seed(6)
    model = _xl(mem_len=3)
    x = torch.randn(2, 8, 16)
    y, state = model(x)
    close(state.memory[:, 0], x[:, -3:], 0)  # layer 0 received x
    # layer 1 received layer 0's output on the last segment (whose own memory was x[:, :4])
    mem0 = x[:, 1:4]
    valid = torch.ones(2, 7, dtype=torch.bool)
    h1 = model.layers[0](x[:, 4:], mem0, valid, True)
    close(state.memory[:, 1], h1[:, -3:])
    assert state.valid.all()


def test_xl_gradient_stopped_at_memory():
    _seed(7)
    model = _xl(mem_len=4)
    model.train(False)
    # one call over two segments
    x = torch.randn(2, 8, 16, requires_grad=True)
    y, _ = model(x)
    (grad,) = torch.autograd.grad(y[:, 4:].square().sum(), x)
    assert (grad[:, :4] == 0).all()  # segment 1 reaches segment 2 only through the (detached) memory
    assert grad[:, 4:].abs().max() > 0  # while the current segment does get gradients
    # separate calls
    x1 = torch.randn(2, 4, 16, requires_grad=True)
    x2 = torch.randn(2, 4, 16, requires_grad=True)
    _, state = model(x1)
    y2, _ = model(x2, state)
    g1, g2 = torch.autograd.grad(y2.square().sum(), [x1, x2], allow_unused=True)
    assert g1 is None or (g1 == 0).all()
    assert g2.abs().max() > 0


def test_xl_segment2_depends_on_segment1_only_through_memory():
    _seed(8)
    x = torch.randn(2, 8, 16)
    x_changed = x.clone()
    x_changed[:, :4] = torch.randn(2, 4, 16)
    with_memory = _xl(mem_len=4)
    assert (with_memory(x)[0][:, 4:] - with_memory(x_changed)[0][:, 4:]).abs().max() > 1e-3
    no_memory = _xl(mem_len=0)
    close(no_memory(x)[0][:, 4:], no_memory(x_changed)[0][:, 4:], 0)


def test_xl_padding_at_end_and_reset():
    _seed(9)
    model = _xl(mem_len=5)
    a = torch.randn(1, 6, 16)
    x = torch.cat([a, torch.randn(1, 6, 16) * 5], 0)
    x[0, 6:] = 0
    mask = torch.ones(2, 6, dtype=torch.bool)
    y, state = model(x, mask=mask)
    x_pad = torch.cat([x, torch.randn(2, 3, 16) * 100], 1)  # garbage padding at the end
    mask_pad = torch.cat([mask, torch.zeros(2, 3, dtype=torch.bool)], 1)
    y_pad, state_pad = model(x_pad, mask=mask_pad)
    close(y_pad[:, :6], y)
    assert (y_pad[:, 6:] == 0).all() and not state_pad.valid[:, -3:].any()
    # reset empties a row: it then behaves like a fresh sequence
    done = torch.tensor([True, False])
    reset = state.reset(done)
    assert not reset.valid[0].any() and (reset.memory[0] == 0).all()
    assert torch.equal(reset.memory[1], state.memory[1])
    z = torch.randn(2, 4, 16)
    y_reset, _ = model(z, reset)
    close(y_reset[0:1], model(z[0:1])[0])
    close(y_reset[1:], model(z[1:], XLState(state.memory[1:], state.valid[1:]))[0])


def test_gtrxl_gate():
    _seed(10)
    gate = GRUGate(6).double()
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    w, u = gate.w.weight, gate.u.weight
    r = torch.sigmoid(y @ w[:6].T + x @ u[:6].T)
    z = torch.sigmoid(y @ w[6:12].T + x @ u[6:].T - 2.0)  # b_g = 2 at init
    h = torch.tanh(y @ w[12:].T + (r * x) @ gate.u_g.weight.T)
    close(gate(x, y), (1 - z) * x + z * h, 1e-12)
    model = _xl(gated=True)
    assert all(hasattr(layer, "gate_attn") for layer in model.layers)
    x = torch.randn(2, 9, 16, requires_grad=True)
    y, _ = model(x)
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_xl_layer_equations():
    """Pre-LN residual (Transformer-XL) and GRU-gated with ReLU on sublayer outputs (GTrXL Sec. 3.2)."""
    _seed(14)
    memory, h = torch.randn(2, 3, 16), torch.randn(2, 4, 16)
    valid = torch.ones(2, 7, dtype=torch.bool)
    valid[0, :2] = False
    for gated in (False, True):
        layer = _xl(gated=gated).layers[0]
        ctx = layer.norm_attn(torch.cat([memory, h], 1))
        y = layer.attn(ctx[:, 3:], ctx, key_mask=valid, causal=True)
        if gated:
            e = layer.gate_attn(h, torch.relu(y))
            want = layer.gate_ff(e, torch.relu(layer.ff(layer.norm_ff(e))))
        else:
            e = h + y
            want = e + layer.ff(layer.norm_ff(e))
        close(layer(h, memory, valid, True), want, 1e-6)


# --------------------------------------------------------------------------------------------
# LSTM
# --------------------------------------------------------------------------------------------


def naive_lstm(model: LSTM, x, h, c):
    """Step the LSTM equations by hand with nn.LSTM's weights. h, c: [B, depth, H]."""
    lstm = model.lstm
    h, c = h.clone(), c.clone()
    ys = []
    for t in range(x.shape[1]):
        inp = x[:, t]
        for layer in range(model.depth):
            w_ih, w_hh = getattr(lstm, f"weight_ih_l{layer}"), getattr(lstm, f"weight_hh_l{layer}")
            b = getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}")
            gates = inp @ w_ih.T + h[:, layer] @ w_hh.T + b
            i, f, g, o = gates.chunk(4, -1)
            c[:, layer] = torch.sigmoid(f) * c[:, layer] + torch.sigmoid(i) * torch.tanh(g)
            h[:, layer] = torch.sigmoid(o) * torch.tanh(c[:, layer])
            inp = h[:, layer].clone()
        ys.append(inp)
    return torch.stack(ys, 1), h, c


def test_lstm_matches_manual_steps():
    _seed(11)
    model = LSTM(dim=5, depth=2, hidden=7).double()
    x = torch.randn(3, 6, 5, dtype=torch.float64)
    h0, c0 = torch.randn(3, 2, 7, dtype=torch.float64), torch.randn(3, 2, 7, dtype=torch.float64)
    y, state = model(x, LSTMState(h0, c0))
    y_ref, h_ref, c_ref = naive_lstm(model, x, h0, c0)
    close(y, y_ref, 1e-10)
    close(state.h, h_ref, 1e-10)
    close(state.c, c_ref, 1e-10)
    assert model.out_dim == 7


def test_lstm_forget_bias_starts_the_forget_gates_there_and_nothing_else():
    """``forget_bias=1``: every layer's forget-gate biases sum to 1 and the forget gate of a zero input and
    state is sigmoid(1); the other parameters are torch's, drawn as without it; bad values are named."""
    _seed(13)
    plain = LSTM(dim=5, depth=2, hidden=7)
    _seed(13)
    biased = LSTM(dim=5, depth=2, hidden=7, forget_bias=1.0)
    forget = slice(7, 14)
    for (name, p), q in zip(plain.named_parameters(), biased.parameters(), strict=True):
        if "bias" not in name:
            assert torch.equal(p, q), name
            continue
        keep = torch.ones(28, dtype=torch.bool)
        keep[forget] = False
        assert torch.equal(p[keep], q[keep]), name
    for layer in range(2):
        total = getattr(biased.lstm, f"bias_ih_l{layer}") + getattr(biased.lstm, f"bias_hh_l{layer}")
        assert torch.equal(total[forget], torch.ones(7))
    _, _, c = naive_lstm(biased, torch.zeros(1, 1, 5), torch.zeros(1, 2, 7), torch.ones(1, 2, 7))
    # a zero input and h: the first layer's gates are its biases alone, its forget gate sigmoid(1)
    gates = biased.lstm.bias_ih_l0 + biased.lstm.bias_hh_l0
    i, f, g = torch.sigmoid(gates[:7]), torch.sigmoid(gates[7:14]), torch.tanh(gates[14:21])
    close(c[:, 0], (f * 1.0 + i * g)[None], 1e-6)
    close(f, torch.full((7,), torch.sigmoid(torch.tensor(1.0)).item()), 1e-6)
    with pytest.raises(TypeError, match="forget_bias"):
        LSTM(dim=5, forget_bias="one")


def test_lstm_padding_invariance():
    _seed(12)
    model = LSTM(dim=4, depth=2, hidden=6)
    seqs = [torch.randn(1, n, 4) for n in (5, 3, 0)]
    refs = [model(s)[1] if s.shape[1] else model.init_state(1) for s in seqs]
    # right padding (packed path), including an empty row
    x = torch.randn(3, 5, 4) * 10
    mask = torch.zeros(3, 5, dtype=torch.bool)
    for row, s in enumerate(seqs):
        x[row, : s.shape[1]], mask[row, : s.shape[1]] = s[0], True
    y, state = model(x, mask=mask)
    for row, ref in enumerate(refs):
        close(state.h[row], ref.h[0])
        close(state.c[row], ref.c[0])
    assert (y[~mask] == 0).all()
    close(y[0], model(seqs[0])[0][0])
    # holes and left padding (step path)
    x2 = torch.randn(3, 7, 4) * 10
    mask2 = torch.zeros(3, 7, dtype=torch.bool)
    placements = [torch.tensor([0, 1, 3, 4, 6]), torch.tensor([4, 5, 6]), torch.tensor([], dtype=torch.long)]
    for row, (s, where) in enumerate(zip(seqs, placements, strict=True)):
        x2[row, where], mask2[row, where] = s[0], True
    y2, state2 = model(x2, mask=mask2)
    for row, ref in enumerate(refs):
        close(state2.h[row], ref.h[0])
        close(state2.c[row], ref.c[0])
    close(y2[1][mask2[1]], model(seqs[1])[0][0])
    assert (y2[~mask2] == 0).all()


def test_lstm_streaming_and_reset():
    _seed(13)
    model = LSTM(dim=4, hidden=5)
    x = torch.randn(2, 9, 4)
    y, state = model(x)
    y1, s = model(x[:, :4])
    y2, s = model(x[:, 4:], s)
    close(torch.cat([y1, y2], 1), y)
    close(s.h, state.h)
    done = torch.tensor([False, True])
    reset = state.reset(done)
    assert (reset.h[1] == 0).all() and (reset.c[1] == 0).all()
    assert torch.equal(reset.h[0], state.h[0])
    z = torch.randn(2, 3, 4)
    y_reset, _ = model(z, reset)
    close(y_reset[1:], model(z[1:])[0])
    assert state.detach().h.requires_grad is False


# --------------------------------------------------------------------------------------------
# Registry, config convention, bad input
# --------------------------------------------------------------------------------------------


def test_registry_builders():
    from chronomem.heads import build_model
    from chronomem.tasks.copy import CopyTask

    x = torch.randn(2, 6, 16)
    for name in ("transformer", "transformer-xl", "gtrxl", "lstm"):
        backbone = get_model(name)(dim=16, depth=1, num_heads=2, causal=True)
        y, _ = backbone(x)
        assert y.shape == (2, 6, backbone.out_dim)
    assert get_model("gtrxl")(dim=16, depth=1, num_heads=2, causal=True).config.gated
    xl = get_model("transformer-xl")(dim=16, depth=1, num_heads=2, causal=True, segment_len=3, mem_len=2)
    assert (xl.segment_len, xl.mem_len) == (3, 2)
    model = build_model("gtrxl", CopyTask(seq_len=5), dim=16, depth=1, num_heads=2, segment_len=4, mem_len=4)
    logits, state = model(torch.randint(0, 10, (2, 15)))
    assert logits.shape == (2, 15, 10) and isinstance(state, XLState)


def test_config_convention():
    cfg = TransformerXL.Config(dim=16, depth=1, num_heads=2, segment_len=4, mem_len=2)
    a, b = TransformerXL(config=cfg), TransformerXL(**vars(cfg))
    assert a.config == b.config
    assert TransformerXL(config=cfg, mem_len=7).mem_len == 7
    assert LSTM(config=LSTM.Config(dim=3)).out_dim == 3
    assert Transformer(config=Transformer.Config(dim=8, depth=1, num_heads=2)).out_dim == 8


@pytest.mark.parametrize(
    "make",
    [
        lambda: Transformer(dim=16, depth=1, num_heads=2),
        lambda: _xl(),
        lambda: LSTM(dim=16, hidden=8),
    ],
    ids=["transformer", "xl", "lstm"],
)
def test_bad_inputs(make):
    model = make()
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match="x"):
        model(torch.randn(2, 16))  # rank
    with pytest.raises(ValueError, match="last dimension 16"):
        model(torch.randn(2, 5, 15))
    with pytest.raises(ValueError, match="empty"):
        model(torch.randn(2, 0, 16))
    with pytest.raises(TypeError):
        model([[1.0]])
    with pytest.raises(TypeError, match="boolean"):
        model(x, mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="mask"):
        model(x, mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError):
        model(x, state=(1, 2))
    if not isinstance(model, Transformer):
        with pytest.raises(ValueError, match="batch size"):
            model(x, model.init_state(3))


def test_bad_construction():
    with pytest.raises(ValueError, match="segment_len"):
        _xl(segment_len=0)
    with pytest.raises(TypeError, match="segment_len"):
        _xl(segment_len=2.5)
    with pytest.raises(ValueError, match="mem_len"):
        _xl(mem_len=-1)
    with pytest.raises(ValueError, match="num_heads"):
        Transformer(dim=16, num_heads=3)
    with pytest.raises(ValueError, match="even"):
        TransformerXL(dim=9, num_heads=3)
    with pytest.raises(TypeError, match="unknown"):
        LSTM(dim=4, heads=2)
    with pytest.raises(TypeError, match="config"):
        Transformer(64)
    with pytest.raises(ValueError, match="max_len"):
        Transformer(dim=8, depth=1, num_heads=2, max_len=4)(torch.randn(1, 5, 8))
    xl = _xl(mem_len=3)
    with pytest.raises(ValueError, match="state.memory"):
        _xl(mem_len=4)(torch.randn(2, 4, 16), xl.init_state(2))


@pytest.mark.parametrize("positions", [True, False])
def test_transformer_step_with_its_cache_equals_one_call(positions):
    """Decoding with the key/value cache, in pieces of 1-3 tokens, gives the outputs of one causal call."""
    torch.manual_seed(0)
    model = Transformer(dim=16, depth=2, num_heads=2, causal=True, positions=positions).double().eval()
    x = torch.randn(2, 9, 16, dtype=torch.double)
    whole, _ = model(x)
    cache, pieces = None, []
    for start, stop in ((0, 1), (1, 4), (4, 5), (5, 7), (7, 9)):
        y, cache = model.step(x[:, start:stop], cache)
        pieces.append(y)
    torch.testing.assert_close(torch.cat(pieces, 1), whole, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="causal=True"):
        Transformer(dim=16, depth=1, num_heads=2, causal=False).step(x.float())


def test_transformer_step_writes_in_place_and_a_branch_keeps_every_cache():
    """Acting without copies: a step writes after the filled part of the cache's buffers (the same
    storage while it has room); a step from an older cache copies it first, so both continuations and
    the older cache itself still give the outputs of one call."""
    torch.manual_seed(0)
    model = Transformer(dim=16, depth=2, num_heads=2, causal=True).double().eval()
    x = torch.randn(3, 40, 16, dtype=torch.double)
    other = torch.cat([x[:, :20], torch.randn(3, 20, 16, dtype=torch.double)], 1)
    with torch.no_grad():
        cache, outputs = None, []
        for t in range(20):
            y, cache = model.step(x[:, t : t + 1], cache)
            outputs.append(y)
        at_20, storage = cache, cache.keys[0].data_ptr()
        for t in range(20, 30):
            y, cache = model.step(x[:, t : t + 1], cache)
            outputs.append(y)
        assert cache.keys[0].data_ptr() == storage and cache.length == 30  # room for 32: written in place
        branch, branched = at_20, []
        for t in range(20, 40):  # from the older cache: a copy, the newer chain untouched
            y, branch = model.step(other[:, t : t + 1], branch)
            branched.append(y)
        for t in range(30, 40):  # the first chain goes on, past its buffers' capacity
            y, cache = model.step(x[:, t : t + 1], cache)
            outputs.append(y)
        assert cache.keys[0].data_ptr() != storage  # grown
        torch.testing.assert_close(torch.cat(outputs, 1), model(x)[0], atol=1e-12, rtol=0)
        torch.testing.assert_close(torch.cat(branched, 1), model(other)[0][:, 20:], atol=1e-12, rtol=0)
        again, _ = model.step(x[:, 20:21], at_20)  # the older cache still holds its 20 tokens
        torch.testing.assert_close(again, model(x[:, :21])[0][:, 20:], atol=1e-12, rtol=0)
    with torch.inference_mode():
        _, made_inside = model.step(x[:, :3])
    with torch.no_grad():  # buffers made under inference_mode are copied, not written, outside it
        outside, _ = model.step(x[:, 3:4], made_inside)
    torch.testing.assert_close(outside, model(x[:, :4])[0][:, 3:], atol=1e-12, rtol=0)


@pytest.mark.parametrize("positions", [True, False])
def test_transformer_step_rows_apart_equal_each_episode_alone(positions):
    """Rows at their own steps: a row that skips a token (``mask``) or starts a new episode
    (``cache.reset``) gives, at every valid token, the outputs of one call over that episode's valid
    tokens alone; skipped tokens give zeros. Once every row has restarted, the dead prefix is dropped."""
    torch.manual_seed(0)
    model = Transformer(dim=16, depth=2, num_heads=2, causal=True, positions=positions).double().eval()
    batch, steps = 3, 70
    x = torch.randn(batch, steps, 16, dtype=torch.double)
    done = torch.zeros(batch, steps, dtype=torch.bool)  # True: the row's episode ends after this step
    done[1, [9, 24, 40]] = done[2, [29, 50]] = done[0, 33] = True
    done[:, 60] = True  # every row restarts: the cache keeps only what is left to attend to
    valid = torch.ones(batch, steps, dtype=torch.bool)
    valid[2, [5, 6, 52]] = valid[0, 61] = False
    with torch.no_grad():
        cache, outputs = None, []
        for t in range(steps):
            y, cache = model.step(x[:, t : t + 1], cache, mask=valid[:, t : t + 1])
            outputs.append(y)
            cache = cache.reset(done[:, t])
        y = torch.cat(outputs, 1)
        for b in range(batch):
            bounds = [0, *(done[b].nonzero().flatten() + 1).tolist(), steps]
            for start, stop in itertools.pairwise(bounds):
                keep = valid[b, start:stop]
                alone, _ = model(x[b : b + 1, start:stop][:, keep])
                torch.testing.assert_close(y[b, start:stop][keep], alone[0], atol=1e-10, rtol=0)
                assert (y[b, start:stop][~keep] == 0).all()
    assert cache.length == steps - 61  # the tokens since the common restart
    with pytest.raises(TypeError, match="done must be a boolean tensor"):
        cache.reset(torch.zeros(batch))


def test_transformer_step_under_autograd_gives_the_gradients_of_one_call():
    torch.manual_seed(0)
    model = Transformer(dim=16, depth=2, num_heads=2, causal=True).double()
    x = torch.randn(2, 6, 16, dtype=torch.double, requires_grad=True)
    cache, pieces = None, []
    for start, stop in ((0, 2), (2, 3), (3, 6)):
        y, cache = model.step(x[:, start:stop], cache)
        pieces.append(y)
    stepped = torch.autograd.grad(torch.cat(pieces, 1).pow(2).sum(), [x, *model.parameters()])
    whole = torch.autograd.grad(model(x)[0].pow(2).sum(), [x, *model.parameters()])
    for a, b in zip(stepped, whole, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize("gated", [False, True])
def test_a_compiled_xl_acting_step_is_one_graph(gated):
    """Under ``torch.compile`` acting (sliding memory) gives eager's outputs and state, step after step
    through an episode end, in whole graphs: no value read (the parameters' version, ``_read_segment_choices``'
    masks and cache check); the memory's keys and values read from the cache unchecked where the step
    continues its stretch (else projected again), concatenated, not written into ``XLBuffers``."""
    torch.manual_seed(1)
    xl = _xl(memory_mode="sliding", gated=gated)
    x = torch.randn(3, 9, 16)
    done = torch.zeros(3, 9, dtype=torch.bool)
    done[0, 3] = True
    assert_compiled_acting_matches(xl, x, done)
    if not gated:  # the same read either way (the gate is after it)
        assert_compiled_acting_reads_the_cache(xl, x, "kv")


@pytest.mark.parametrize("core", ["transformer-xl", "gtrxl", "mlp"])
def test_a_compiled_learning_call_is_one_graph(core):
    """Under ``torch.compile`` a learning call (a PPO replay with episode ends inside, from the state acting
    left) gives eager's outputs, state and gradients in one graph (the episode ends taken without asking
    whether there are any, the keys masked as the state says, the keys and values tagged 0 with
    gradients), and another rollout with other episode ends does not compile again."""
    torch.manual_seed(2)
    options = {"memory_mode": "sliding", "mem_len": 6, "segment_len": 4} if core != "mlp" else {}
    model = build_backbone(core, dim=16, depth=2, num_heads=2, causal=True, **options).double()
    x = torch.randn(3, 9, 16, dtype=torch.float64)
    done = torch.zeros(3, 9, dtype=torch.bool)
    done[0, 3] = done[2, 1] = done[2, 6] = True
    assert_compiled_learning_matches(model, x, done, atol=1e-9)


@pytest.mark.parametrize("memory_mode", ["sliding", "segment"])
def test_xl_acting_writes_in_place_and_every_state_keeps_its_values(memory_mode):
    """Acting without copies (XLBuffers): one-step calls without gradients write after the state's window
    (consecutive states share their storage), an older state acted from again and a reset state give
    what a copy of them gives, and the outputs are those of the learning path (with gradients)."""
    import copy

    torch.manual_seed(0)
    xl = _xl(memory_mode=memory_mode).double()
    x = torch.randn(3, 30, 16, dtype=torch.double)
    with torch.no_grad():
        _, state = xl(x[:, :8])
    saved = copy.deepcopy(state)
    outputs, states = [], [state]
    with torch.inference_mode():
        for t in range(8, 20):
            y, state = xl(x[:, t : t + 1], state)
            outputs.append(y)
            states.append(state)
    assert states[3].memory.untyped_storage().data_ptr() == states[4].memory.untyped_storage().data_ptr()
    reference, s = [], saved
    for t in range(8, 20):  # with gradients: the concatenating path
        y, s = xl(x[:, t : t + 1], s)
        reference.append(y.detach())
    torch.testing.assert_close(torch.cat(outputs, 1), torch.cat(reference, 1), atol=1e-12, rtol=0)
    older, kept = states[5], copy.deepcopy(states[5])
    with torch.inference_mode():
        again, _ = xl(x[:, 25:28], older)  # from a state the chain has moved past
        from_copy, _ = xl(x[:, 25:28], kept)
        newest, _ = xl(x[:, 20:21], state)  # the chain goes on from its newest state
    torch.testing.assert_close(again, from_copy, atol=0, rtol=0)
    for a, b in zip((older.memory, *older.kv), (kept.memory, *kept.kv), strict=True):
        assert torch.equal(a, b)  # acting from it wrote nothing into its window
    expected, _ = xl(x[:, 20:21], copy.deepcopy(state))
    torch.testing.assert_close(newest, expected.detach(), atol=1e-12, rtol=0)
    done = torch.tensor([True, False, False])
    with torch.inference_mode():
        after_reset, _ = xl(x[:, 21:22], state.reset(done))
    fresh, _ = xl(x[:, 21:22], copy.deepcopy(state).reset(done))
    torch.testing.assert_close(after_reset, fresh.detach(), atol=1e-12, rtol=0)
    with torch.no_grad():  # buffers made under inference_mode are copied, not written, outside it
        outside, _ = xl(x[:, 20:21], state)
    torch.testing.assert_close(outside, expected.detach(), atol=1e-12, rtol=0)
