"""TLB's ``authors`` preset against a literal transcription of the authors' forward pass.

The transcription below is written from the authors' Long Range Arena code (google-research/
long-range-arena) and the Flax modules it calls, in float64 NumPy, one line per line of theirs. Each
comment names the file and function it transcribes, with these short names:

* [tlb.Encoder]  lra_benchmarks/models/transformer_tlb/transformer_tlb.py, StatefulTransformerEncoder.apply
* [tlb.Cross]    lra_benchmarks/models/transformer_tlb/transformer_tlb.py, CrossTransformerBlock.apply
* [tr.Block]     lra_benchmarks/models/transformer/transformer.py, TransformerBlock.apply
* [cl.Mlp]       lra_benchmarks/models/layers/common_layers.py, MlpBlock.apply
* [cl.Sinusoid]  lra_benchmarks/models/layers/common_layers.py, sinusoidal_init / AddPositionEmbs.apply
* [cl.Head]      lra_benchmarks/models/layers/common_layers.py, classifier_head
* [flax.MHA]     flax/deprecated/nn/attention.py, MultiHeadDotProductAttention.apply, make_padding_mask,
                 dot_product_attention
* [flax.LN]      flax/deprecated/nn/normalization.py, LayerNorm.apply (epsilon 1e-6)
* [jax.gelu]     jax.nn.gelu (approximate=True, its default)

Their sinusoids interleave sin and cos (channels 0::2 and 1::2); ours put the sin half before the cos
half. That is a fixed permutation of the residual channels, so the transcription runs in their channel
order on weights copied with that permutation (``PERM``) and the results are compared after undoing it.
"""

import numpy as np
import pytest
import torch

from chronomem.heads import Classifier
from chronomem.tlb import TLB

torch.set_num_threads(1)

D, QKV, HEADS, K, N, VOCAB, CLASSES = 8, 12, 2, 4, 3, 16, 5  # QKV != D: the attention width is its own
MLP = 16  # the FFN width, also the hidden width of the classifier head (LRA's mlp_dim)
PERM = np.stack([np.arange(D // 2), D // 2 + np.arange(D // 2)], axis=1).reshape(-1)  # theirs j = ours PERM[j]


# ------------------------------------------------------------------------------------------------
# The transcription (float64 NumPy). ``p`` holds their parameters, in their shapes and channel order.
# ------------------------------------------------------------------------------------------------


def their_layer_norm(x, p):
    mean = x.mean(-1, keepdims=True)  # [flax.LN] mean = jnp.mean(x, axis=-1)
    mean2 = (x * x).mean(-1, keepdims=True)  # [flax.LN] mean2 = jnp.mean(lax.square(x), axis=-1)
    var = mean2 - mean * mean  # [flax.LN] var = mean2 - lax.square(mean)
    mul = p["scale"] / np.sqrt(var + 1e-6)  # [flax.LN] mul = lax.rsqrt(var + epsilon) * scale
    return (x - mean) * mul + p["bias"]  # [flax.LN] y = (x - mean) * mul + bias


def their_gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))  # [jax.gelu] tanh form


def their_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))  # [flax.MHA] softmax over the key axis
    return e / e.sum(-1, keepdims=True)  # [flax.MHA] (flax.deprecated.nn.activation.softmax)


def their_attention(inputs_q, inputs_kv, p, mask):
    """``mask [B, Lq, Lk]`` (1 = may attend), built as make_padding_mask builds it."""
    q = np.einsum("bld,dhk->blhk", inputs_q, p["query"])  # [flax.MHA] DenseGeneral 'query', bias=False
    k = np.einsum("bld,dhk->blhk", inputs_kv, p["key"])  # [flax.MHA] DenseGeneral 'key', bias=False
    v = np.einsum("bld,dhk->blhk", inputs_kv, p["value"])  # [flax.MHA] DenseGeneral 'value', bias=False
    q = q / np.sqrt(q.shape[-1])  # [flax.MHA] dot_product_attention: query / sqrt(depth)
    logits = np.einsum("bqhk,bshk->bhqs", q, k)  # [flax.MHA] dot_product_attention: lax.dot_general
    bias = np.where(mask[:, None] > 0, 0.0, -1e10)  # [flax.MHA] attention_bias = select(mask > 0, 0, -1e10)
    weights = their_softmax(logits + bias)  # [flax.MHA] softmax(attn_weights + bias)
    out = np.einsum("bhqs,bshk->bqhk", weights, v)  # [flax.MHA] dot_product_attention: weights @ value
    return np.einsum("bqhk,hkd->bqd", out, p["out"])  # [flax.MHA] DenseGeneral 'out', axis=(-2, -1), bias=False


def their_mlp(x, p):
    h = x @ p["dense0"]["kernel"] + p["dense0"]["bias"]  # [cl.Mlp] nn.Dense(inputs, mlp_dim)
    h = their_gelu(h)  # [cl.Mlp] nn.gelu(x)
    return h @ p["dense1"]["kernel"] + p["dense1"]["bias"]  # [cl.Mlp] nn.Dense(x, actual_out_dim)


def their_self_block(inputs, p, padding_mask):
    """``padding_mask [B, K]`` (1 = token)."""
    x = their_layer_norm(inputs, p["ln0"])  # [tr.Block] x = nn.LayerNorm(inputs)
    mask = padding_mask[:, :, None] * padding_mask[:, None, :]  # [flax.MHA] make_padding_mask: query x key
    x = their_attention(x, x, p["attn"], mask)  # [tr.Block] nn.SelfAttention(x, padding_mask=...)
    x = x + inputs  # [tr.Block] x = x + inputs
    y = their_layer_norm(x, p["ln1"])  # [tr.Block] y = nn.LayerNorm(x)
    y = their_mlp(y, p["mlp"])  # [tr.Block] y = common_layers.MlpBlock(y, mlp_dim=...)
    return x + y  # [tr.Block] return x + y


def their_cross_block(inputs_q, inputs_kv, p, padding_mask=None, key_padding_mask=None):
    """Exactly one of ``padding_mask [B, Lq]`` (queries) and ``key_padding_mask [B, Lk]`` is given."""
    x = their_layer_norm(inputs_q, p["ln0"])  # [tlb.Cross] x = nn.LayerNorm(inputs_q)
    s = their_layer_norm(inputs_kv, p["ln_kv"])  # [tlb.Cross] s = nn.LayerNorm(inputs_kv)
    B, Lq, Lk = inputs_q.shape[0], inputs_q.shape[1], inputs_kv.shape[1]
    if padding_mask is not None:  # [flax.MHA] cross-attention, no key mask: every key is valid
        mask = padding_mask[:, :, None] * np.ones((B, 1, Lk))  # [flax.MHA] make_padding_mask(query, all-True)
    else:  # [flax.MHA] cross-attention, no query mask: every query is valid
        mask = np.ones((B, Lq, 1)) * key_padding_mask[:, None, :]  # [flax.MHA] make_padding_mask(all-True, key)
    x = their_attention(x, s, p["attn"], mask)  # [tlb.Cross] nn.MultiHeadDotProductAttention(x, s, ...)
    x = x + inputs_q  # [tlb.Cross] x = x + inputs_q
    y = their_layer_norm(x, p["ln1"])  # [tlb.Cross] y = nn.LayerNorm(x)
    y = their_mlp(y, p["mlp"])  # [tlb.Cross] y = common_layers.MlpBlock(y, ...)
    output = x + y  # [tlb.Cross] output = x + y (residual=True)
    given = padding_mask if padding_mask is not None else key_padding_mask  # [tlb.Cross] the mask given
    corner_case = (given.sum(1) == 0)[:, None, None]  # [tlb.Cross] corner_case = sum(mask, axis=1) == 0
    return np.where(corner_case, inputs_q, output)  # [tlb.Cross] output = jnp.where(corner_case, inputs_q, output)


def their_sinusoid(length, d_feature):
    pe = np.zeros((length, d_feature), dtype=np.float32)  # [cl.Sinusoid] pe = np.zeros(..., np.float32)
    position = np.arange(0, length)[:, np.newaxis]  # [cl.Sinusoid] position = np.arange(0, max_len)
    div_term = np.exp(np.arange(0, d_feature, 2) * -(np.log(10000.0) / d_feature))  # [cl.Sinusoid] div_term
    pe[:, 0::2] = np.sin(position * div_term)  # [cl.Sinusoid] pe[:, 0::2] = np.sin(position * div_term)
    pe[:, 1::2] = np.cos(position * div_term)  # [cl.Sinusoid] pe[:, 1::2] = np.cos(position * div_term)
    return pe.astype(np.float64)[None]  # [cl.Sinusoid] pe[np.newaxis, :length] (max_len only pads the table)


def their_forward(inputs, p, self_per_cross, depth):
    """``inputs [B, L]`` token ids (0 = padding), ``L`` a multiple of ``K``; returns (LN(state), logits)."""
    src_padding_mask = (inputs > 0).astype(np.float64)  # [tlb.Encoder] src_padding_mask = inputs > 0
    x = p["embed"][inputs]  # [tlb.Encoder] x = input_embed(x) (nn.Embed: take rows)
    pe = their_sinusoid(K, D)  # [tlb.Encoder] pe = AddPositionEmbs(zeros(B, block_size, D)), sinusoidal
    num_chunks = inputs.shape[1] // K  # [tlb.Encoder] num_chunks = num_tokens // block_size
    init_state = np.zeros((inputs.shape[0], N, D))  # [tlb.Encoder] init_state = jnp.zeros(...)
    state_pos_embed = init_state + their_sinusoid(N, D)  # [tlb.Encoder] AddPositionEmbs(init_state, ...)
    cur_state = init_state  # [tlb.Encoder] jax.lax.scan(scan_inner, init_state, ...)
    for c in range(num_chunks):  # [tlb.Encoder] the scan over jnp.split(x_with_pad, num_chunks, axis=1)
        padding_mask_cur = src_padding_mask[:, c * K:(c + 1) * K]  # [tlb.Encoder] cur_x_with_pad[:, :, -1]
        x_cur = x[:, c * K:(c + 1) * K]  # [tlb.Encoder] x_cur = cur_x_with_pad[:, :, :-1]
        x_cur = x_cur + pe  # [tlb.Encoder] x_cur = x_cur + pe (use_global_pos_encoding=False)
        cur_state = cur_state + state_pos_embed  # [tlb.Encoder] cur_state = cur_state + state_pos_embed
        for g in range(depth):  # [tlb.Encoder] for block_idx in range(num_cross_layers_input_updater)
            for r in range(self_per_cross):  # [tlb.Encoder] for layer_idx in range(self_to_cross_ratio_...)
                x_cur = their_self_block(x_cur, p["horizontal"][g][r], padding_mask_cur)  # [tlb.Encoder]
            x_cur = their_cross_block(  # [tlb.Encoder] horizontal_blocks[block_idx][-1](x_cur, cur_state, ...)
                x_cur, cur_state, p["horizontal"][g][-1], padding_mask=padding_mask_cur)  # [tlb.Encoder]
        cur_state = their_cross_block(  # [tlb.Encoder] vertical_layers[0](cur_state, x_cur, ...)
            cur_state, x_cur, p["vertical"], key_padding_mask=padding_mask_cur)  # [tlb.Encoder]
    encoded = their_layer_norm(cur_state, p["encoder_norm"])  # [tlb.Encoder] nn.LayerNorm(cur_state)
    pooled = encoded.mean(1)  # [cl.Head] pooling_mode='MEAN': jnp.mean(encoded, axis=1)
    hidden = np.maximum(pooled @ p["mlp"]["kernel"] + p["mlp"]["bias"], 0.0)  # [cl.Head] Dense(mlp_dim), relu
    logits = hidden @ p["logits"]["kernel"] + p["logits"]["bias"]  # [cl.Head] nn.Dense(encoded, num_classes)
    return encoded, logits


# ------------------------------------------------------------------------------------------------
# Our weights in their shapes and channel order
# ------------------------------------------------------------------------------------------------


def _np(t):
    return t.detach().double().numpy()


def _reads(linear):  # a Dense reading the residual stream: kernel [in, out], rows in their order
    return {"kernel": _np(linear.weight).T[PERM], "bias": _np(linear.bias)}


def _writes(linear):  # a Dense writing the residual stream: columns in their order
    return {"kernel": _np(linear.weight).T[:, PERM], "bias": _np(linear.bias)[PERM]}


def _norm(ln):
    return {"scale": _np(ln.weight)[PERM], "bias": _np(ln.bias)[PERM]}


def _attention(mha):
    q = _np(mha.to_q.weight).T[PERM].reshape(D, HEADS, QKV // HEADS)
    kv = _np(mha.to_kv.weight).T[PERM]
    k, v = kv[:, :QKV].reshape(D, HEADS, -1), kv[:, QKV:].reshape(D, HEADS, -1)
    out = _np(mha.to_out.weight).T[:, PERM].reshape(HEADS, QKV // HEADS, D)
    return {"query": q, "key": k, "value": v, "out": out}


def _mlp(ff):
    return {"dense0": _reads(ff.net[0]), "dense1": _writes(ff.net[3])}


def _self_block(block):
    return {"ln0": _norm(block.norm_attn), "attn": _attention(block.attn), "ln1": _norm(block.norm_ff),
            "mlp": _mlp(block.ff)}


def _cross_block(block):
    return {"ln0": _norm(block.norm_query), "ln_kv": _norm(block.norm_context), "attn": _attention(block.attn),
            "ln1": _norm(block.norm_ff), "mlp": _mlp(block.ff)}


def their_params(head: Classifier) -> dict:
    tlb = head.backbone
    return {
        "embed": _np(head.embed.weight)[:, PERM],
        "horizontal": [[*(_self_block(b) for b in g.self_blocks), _cross_block(g.cross)] for g in tlb.groups],
        "vertical": _cross_block(tlb.update.block),
        "encoder_norm": _norm(tlb.norm_state),
        "mlp": _reads(head.mlp[0]),
        "logits": {"kernel": _np(head.mlp[2].weight).T, "bias": _np(head.mlp[2].bias)},
    }


def make_head(self_per_cross=2, depth=1, seed=0) -> Classifier:
    torch.manual_seed(seed)
    tlb = TLB(preset="authors", dim=D, qkv_dim=QKV, num_heads=HEADS, ff_mult=MLP / D, chunk_size=K, num_state=N,
              self_per_cross=self_per_cross, depth=depth)
    head = Classifier(tlb, D, CLASSES, readout="relu_mlp", mlp_dim=MLP, vocab_size=VOCAB).double().eval()
    with torch.no_grad():  # non-trivial LayerNorm affines, so that a mixed-up norm shows
        for module in head.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
    return head


def tokens(lengths, chunks, seed=0):
    """Token ids ``[B, chunks * K]`` (1..VOCAB-1), padded with 0 after each row's length."""
    g = np.random.default_rng(seed)
    ids = g.integers(1, VOCAB, size=(len(lengths), chunks * K))
    for row, length in enumerate(lengths):
        ids[row, length:] = 0
    return ids


def ours(head, ids):
    inputs = torch.as_tensor(ids)
    with torch.no_grad():
        logits, state = head(inputs, mask=inputs > 0)
        encoded = head.backbone.norm_state(state.memory)
    return _np(encoded)[..., PERM], _np(logits)


# ------------------------------------------------------------------------------------------------
# The tests
# ------------------------------------------------------------------------------------------------


def test_preset_is_the_authors_configuration():
    cfg = TLB(preset="authors").config
    assert (cfg.dim, cfg.qkv_dim, int(cfg.dim * cfg.ff_mult), cfg.num_heads) == (512, 512, 1024, 8)
    assert (cfg.self_per_cross, cfg.depth, cfg.chunk_size, cfg.num_state, cfg.dropout) == (2, 1, 100, 100, 0.1)
    assert (cfg.slot_encoding, cfg.gelu_approximate, cfg.norm_eps, cfg.attn_bias, cfg.learned_init) == (
        "state", "tanh", 1e-6, False, False)
    assert TLB.Config.authors(dim=64) == TLB(preset="authors", dim=64).config
    model = TLB(preset="authors", dim=16, qkv_dim=8, num_heads=2, chunk_size=3, num_state=2)
    attn = model.update.block.attn
    assert attn.to_q.bias is None and attn.to_q.weight.shape == (8, 16) and attn.to_out.weight.shape == (16, 8)
    assert model.norm_state.eps == 1e-6 and not any(n == "initial" for n, _ in model.named_parameters())
    with pytest.raises(ValueError, match="preset"):
        TLB(preset="paper")
    with pytest.raises(ValueError, match="qkv_dim"):
        TLB(preset="authors", qkv_dim=10, num_heads=4)
    with pytest.raises(ValueError, match="slot_encoding"):
        TLB(dim=16, num_heads=2, slot_encoding="write")


@pytest.mark.parametrize("self_per_cross, depth", [(2, 1), (1, 1), (1, 2)])
@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_preset_matches_the_authors_forward_pass(chunks, self_per_cross, depth):
    """Padding inside the last chunk of each row (every row keeps a token in every chunk)."""
    head = make_head(self_per_cross, depth, seed=chunks)
    lengths = [chunks * K, chunks * K - 1, (chunks - 1) * K + 1]  # none, some, all but one padded
    ids = tokens(lengths, chunks, seed=10 + chunks)
    want_encoded, want_logits = their_forward(ids, their_params(head), self_per_cross, depth)
    got_encoded, got_logits = ours(head, ids)
    np.testing.assert_allclose(got_encoded, want_encoded, rtol=0, atol=1e-9)
    np.testing.assert_allclose(got_logits, want_logits, rtol=0, atol=1e-9)
    assert np.abs(want_logits).max() > 1e-2  # a non-trivial comparison


def test_all_padding_chunks_leave_the_state_unchanged_unlike_the_authors_code():
    """The authors' scan adds the slot encoding P to the state before every chunk, all-padding chunks
    included, so their final state depends on how far a row is padded; ours skips those chunks. Each
    row of ours equals their forward pass on that row cut to its own chunks."""
    head = make_head(seed=5)
    lengths = [3 * K, K + 2, 2]  # rows with 0, 1 and 2 chunks of padding only
    ids = tokens(lengths, 3, seed=6)
    params = their_params(head)
    got_encoded, got_logits = ours(head, ids)
    for row, length in enumerate(lengths):
        own = -(-length // K) * K
        want_encoded, want_logits = their_forward(ids[row:row + 1, :own], params, 2, 1)
        np.testing.assert_allclose(got_encoded[row:row + 1], want_encoded, rtol=0, atol=1e-9)
        np.testing.assert_allclose(got_logits[row:row + 1], want_logits, rtol=0, atol=1e-9)
    padded_encoded, _ = their_forward(ids, params, 2, 1)  # theirs on the padded batch: the quirk shows
    np.testing.assert_allclose(got_encoded[0], padded_encoded[0], rtol=0, atol=1e-9)  # no padded chunk
    assert np.abs(got_encoded[1:] - padded_encoded[1:]).max() > 1e-3


def test_lra_classifier_head():
    """readout="relu_mlp": Linear(mlp_dim) -> ReLU -> Linear, LRA's classifier_head, on the TLB summary."""
    head = make_head(seed=7)
    assert isinstance(head.mlp[1], torch.nn.ReLU) and head.mlp[0].out_features == MLP
    ids = torch.as_tensor(tokens([2 * K, K + 1], 2, seed=8))
    logits, state = head(ids, mask=ids > 0)
    pooled = head.backbone.summary(None, state)
    torch.testing.assert_close(logits, head.mlp[2](torch.relu(head.mlp[0](pooled))), atol=0, rtol=0)
    with pytest.raises(ValueError, match="mlp_dim"):
        Classifier(TLB(dim=D, num_heads=HEADS), D, CLASSES, readout="relu_mlp", mlp_dim=0, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="readout"):
        Classifier(TLB(dim=D, num_heads=HEADS), D, CLASSES, readout="relu", vocab_size=VOCAB)
