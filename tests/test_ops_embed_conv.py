"""MiniGridEncoder's cell embeddings and first convolution folded into one convolution of the one-hot
ids, against the reference (values and gradients), when it is chosen, and the encoder that uses it. On
the test device (``CHRONOMEM_TEST_DEVICE``, tests/conftest.py)."""

from unittest import mock

import pytest
import torch

from chronomem.encoders import MiniGridEncoder
from chronomem.ops import embed_conv as ops
from chronomem.ops.embed_conv import FOLD_MIN_ROWS, embed_conv, embed_conv_folded, embed_conv_reference
from helpers import assert_cell_impls_agree

torch.set_num_threads(1)
SIZES = (11, 6, 3)  # MiniGrid's objects, colours and door states


def random_ids(n, view, g):
    return torch.stack([torch.randint(size, (n, view, view), generator=g) for size in SIZES], -1)


def parameters(e, channels, kernel, g):
    tables = [torch.randn(size, e, generator=g, dtype=torch.float64) for size in SIZES]
    weight = torch.randn(channels, len(SIZES) * e, kernel, kernel, generator=g, dtype=torch.float64)
    bias = torch.randn(channels, generator=g, dtype=torch.float64)
    return [t.requires_grad_(True) for t in (*tables, weight, bias)]


@pytest.mark.parametrize("n, view, kernel", [(5, 7, 2), (70, 7, 2), (3, 5, 3)])
def test_folded_equals_the_reference(n, view, kernel, device):
    """Random ids, every table and the convolution's weight and bias: the same output and the same
    gradients into each of them."""
    g = torch.Generator().manual_seed(n)
    params = [p.detach().to(device).requires_grad_(True) for p in parameters(4, 6, kernel, g)]
    ids = random_ids(n, view, g).to(device)
    outputs = [fn(ids, params[:3], params[3], params[4]) for fn in (embed_conv_reference, embed_conv_folded)]
    torch.testing.assert_close(outputs[1], outputs[0])
    upstream = torch.randn(outputs[0].shape, generator=g, dtype=torch.float64).to(device)
    grads = [torch.autograd.grad((y * upstream).sum(), params) for y in outputs]
    for folded, reference in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(folded, reference)


def test_auto_folds_calls_of_enough_rows():
    """"auto" folds a call of ``FOLD_MIN_ROWS`` observations and not one fewer; "reference" and
    "folded" do as named; the same values either way; mismatched tables or an unknown name are refused."""
    g = torch.Generator().manual_seed(0)
    params = parameters(4, 6, 2, g)
    ids = random_ids(FOLD_MIN_ROWS, 7, g)
    cases = [(ids, "auto", True), (ids[:-1], "auto", False), (ids, "reference", False), (ids[:1], "folded", True)]
    for x, impl, folds in cases:
        with mock.patch.object(ops, "embed_conv_folded", wraps=ops.embed_conv_folded) as folded:
            y = embed_conv(x, params[:3], params[3], params[4], impl=impl)
        assert folded.called == folds, (impl, len(x))
        torch.testing.assert_close(y, embed_conv_reference(x, params[:3], params[3], params[4]))
    with pytest.raises(ValueError, match="one table per field"):
        embed_conv(ids, params[:2], params[3], params[4])
    with pytest.raises(ValueError, match="cell_impl must be one of"):
        embed_conv(ids, params[:3], params[3], params[4], impl="fold")


def test_encoder_gives_the_same_features_either_way():
    """``MiniGridEncoder`` on a replay-sized batch of MiniGrid observations: the folded and the
    reference path agree, values and every weight's gradient."""
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(0)
    encoder = MiniGridEncoder(16, vocab_size=20, max_words=5)
    B, N = 2, 40
    obs = {"image": random_ids(B * N, 7, g).view(B, N, 7, 7, 3).to(torch.uint8),
           "direction": torch.randint(4, (B, N), generator=g), "mission": torch.randint(20, (B, N, 5), generator=g)}
    assert_cell_impls_agree(encoder, obs)
    with pytest.raises(ValueError, match="cell_impl must be one of"):
        MiniGridEncoder(16, vocab_size=20, max_words=5, cell_impl="fast")
