"""The per-cell encoder's folded map against its reference (values and gradients), when it is chosen,
and the encoder that uses it. On the test device (``CHRONOMEM_TEST_DEVICE``, tests/conftest.py)."""

from unittest import mock

import pytest
import torch

from chronomem.encoders import BalletEncoder
from chronomem.ops import cell_map as ops
from chronomem.ops.cell_map import FOLD_MIN_ROWS, cell_map, cell_map_folded, cell_map_reference
from helpers import assert_cell_impls_agree

torch.set_num_threads(1)


def one_hot_cells(shape, symbols, g, empty=0.3):
    """``[*shape, symbols]`` float: each cell one random symbol, or empty with probability ``empty``."""
    ids = torch.randint(symbols, shape, generator=g)
    x = torch.nn.functional.one_hot(ids, symbols).double()
    return x * (torch.rand(shape, generator=g) > empty).unsqueeze(-1)


def parameters(cells, S, K, dim, extra, g):
    weight, bias = torch.randn(K, S, generator=g), torch.randn(K, generator=g)  # ReLU cuts about half
    project_weight = torch.randn(dim, cells * K + extra, generator=g) / 8
    return [t.double().requires_grad_(True) for t in (weight, bias, project_weight, torch.randn(dim, generator=g))]


@pytest.mark.parametrize("extra", [0, 5])
@pytest.mark.parametrize("batch", [(3, 7), (40,)])
def test_folded_map_equals_the_reference(extra, batch, device):
    """Cells of at most one symbol (empty cells included), with and without an extra input (an
    instruction's embedding): the folded map gives the reference's values and gradients, into every
    weight and the extra input."""
    g = torch.Generator().manual_seed(0)
    cells, S, K, dim = 6, 4, 5, 3
    x = one_hot_cells((*batch, cells), S, g).to(device)
    params = [p.detach().to(device).requires_grad_(True) for p in parameters(cells, S, K, dim, extra, g)]
    more = torch.randn(*batch, extra, generator=g, dtype=torch.float64).to(device) if extra else None
    more = more.requires_grad_(True) if extra else None
    inputs = params + ([more] if extra else [])
    upstream = torch.randn(*batch, dim, generator=g, dtype=torch.float64).to(device)
    outputs = [fn(x, *params, more) for fn in (cell_map_reference, cell_map_folded)]
    torch.testing.assert_close(outputs[1], outputs[0])
    grads = [torch.autograd.grad((y * upstream).sum(), inputs) for y in outputs]
    for folded, reference in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(folded, reference)


def test_auto_folds_one_hot_calls_of_enough_rows_and_falls_back_otherwise():
    """"auto" takes the folded map for a call of ``FOLD_MIN_ROWS`` observations of one-hot cells; for a
    cell of two symbols, for fewer observations and under "reference" it computes the reference (same
    values); "folded" refuses two symbols in a cell; an unknown name is refused."""
    g = torch.Generator().manual_seed(1)
    params = parameters(6, 4, 5, 3, 0, g)
    one_hot = one_hot_cells((FOLD_MIN_ROWS, 6), 4, g)
    two = one_hot.clone()
    two[5, 2] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    cases = [(one_hot, "auto", True), (one_hot[: FOLD_MIN_ROWS - 1], "auto", False), (two, "auto", False),
             (one_hot, "reference", False), (one_hot[:1], "folded", True)]
    for x, impl, folds in cases:
        with mock.patch.object(ops, "cell_map_folded", wraps=ops.cell_map_folded) as folded:
            y = cell_map(x, *params, impl=impl)
        assert folded.called == folds, (impl, len(x))
        torch.testing.assert_close(y, cell_map_reference(x, *params))
    with pytest.raises(ValueError, match="at most one symbol"):
        cell_map(two, *params, impl="folded")
    with pytest.raises(ValueError, match="cell_impl must be one of"):
        cell_map(one_hot, *params, impl="fold")


@pytest.mark.parametrize("vocab_size", [0, 14])
def test_encoder_gives_the_same_features_with_either_map(vocab_size):
    """``BalletEncoder(visual="cells")`` on a symbolic board of one-hot cells (Visual Match's 7x11 of 9
    symbols; with an instruction as on Ballet): the folded and the reference map agree, values and
    weight gradients; a folded map of pixels is refused."""
    g = torch.Generator().manual_seed(2)
    view, symbols, B, N = (7, 11), 9, 4, 32
    torch.manual_seed(0)
    encoder = BalletEncoder(16, vocab_size=vocab_size, view=view, symbols=symbols, visual="cells")
    grid = one_hot_cells((B, N, *view), symbols, g).to(torch.uint8)
    obs = {"grid": grid} | ({"instruction": torch.randint(vocab_size, (B, N), generator=g)} if vocab_size else {})
    assert_cell_impls_agree(encoder, obs)
    with pytest.raises(ValueError, match="observation='symbolic'"):
        BalletEncoder(16, observation="pixels", visual="cells", cell_impl="folded")
