"""HTM's chunk-mixing kernels against their naive reference: values, gradients, gradcheck. On the test
device (``CHRONOMEM_TEST_DEVICE``, tests/conftest.py): inputs are drawn on the CPU, then moved."""

import pytest
import torch

from chronomem.ops import htm_mix
from chronomem.ops.htm_grouped import group_pairs, mix_chunks_grouped, tile_fill
from chronomem.ops.htm_mix import mix_chunks, mix_chunks_dense, mix_chunks_reference, mix_selected_chunks

torch.set_num_threads(1)


def on(device, *tensors):
    """``tensors`` on ``device`` (a CPU tensor that requires grad stays the leaf it is on the CPU)."""
    return tuple(t.to(device) for t in tensors)


def reference_on_rows(q, weights, table, slot_table, rows, norm=False, slot_encoding=None):
    """``mix_chunks_reference`` on ``mix_selected_chunks``'s flat rows: one batch row holding every chunk."""
    return mix_chunks_reference(q[None], weights[None], rows[None], table[None], slot_table[None],
                                norm, slot_encoding)[0]


@pytest.mark.parametrize("rows_per_block", [1, 3, 1000])
@pytest.mark.parametrize("slot_transform", [False, True])
def test_blockwise_mix_matches_plain_autograd(rows_per_block, slot_transform, device):
    """``mix_selected_chunks`` (blocks of queries, a backward that gathers again) == the reference,
    values and gradients (into the table too), whatever the block size, also when the gathered slots
    are read through LN and a slot encoding; and it passes gradcheck."""
    g = torch.Generator().manual_seed(5)
    N, H, k, C, D, R = 7, 2, 3, 4, 6, 5
    table = (3 * torch.randn(R, C, D, generator=g, dtype=torch.float64) + 1).requires_grad_(True)
    transform = (True, torch.randn(C, D, generator=g, dtype=torch.float64)) if slot_transform else (False, None)
    slot_table = torch.rand(R, C, generator=g) > 0.3
    slot_table[:, -1] = True
    slot_table[2] = False  # an empty (invalid) chunk: read with weight 0
    rows = torch.randint(R, (N, k), generator=g)
    q = torch.randn(N, H, D, generator=g, dtype=torch.float64, requires_grad=True)
    weights = torch.softmax(torch.randn(N, k, generator=g, dtype=torch.float64), -1)
    weights = torch.where(rows == 2, 0.0, weights).requires_grad_(True)
    block_bytes = rows_per_block * k * C * D * 8
    upstream = torch.randn(N, H, D, generator=g, dtype=torch.float64)
    table, slot_table, rows, q, weights, upstream = on(device, table, slot_table, rows, q, weights, upstream)
    transform = (transform[0], None if transform[1] is None else transform[1].to(device))
    got = mix_selected_chunks(q, weights, table, slot_table, rows, *transform, block_bytes=block_bytes)
    want = reference_on_rows(q, weights, table, slot_table, rows, *transform)
    torch.testing.assert_close(got, want)
    grads_got = torch.autograd.grad((got * upstream).sum(), (q, weights, table))
    grads_want = torch.autograd.grad((want * upstream).sum(), (q, weights, table))
    for a, b in zip(grads_got, grads_want, strict=True):
        assert b.abs().max() > 0
        torch.testing.assert_close(a, b)
    mix = lambda q, w, t: mix_selected_chunks(q, w, t, slot_table, rows, *transform, block_bytes=block_bytes)
    assert torch.autograd.gradcheck(mix, (q, weights, table))


@pytest.mark.parametrize("tile_rows", [1, 6, 64])
@pytest.mark.parametrize("block_bytes", [1, 2**20])  # one tile per block, or all
@pytest.mark.parametrize("table_grad", [False, True])
def test_grouped_mix_matches_plain_autograd(tile_rows, block_bytes, table_grad, device):
    """``mix_chunks_grouped`` (the pairs sorted by chunk, a tile of pairs per matrix product, results
    added into their queries, tiles in blocks) == the reference, values and gradients (into the table
    when it requires one), with tiles of one pair, of a few, or of every pair of a chunk, blocks of one
    tile or of all; chunks selected by many queries, by one, twice by one query, or by none; an empty
    chunk; and it passes gradcheck."""
    g = torch.Generator().manual_seed(6)
    N, H, k, C, D, R = 11, 2, 3, 4, 6, 7
    table = (3 * torch.randn(R, C, D, generator=g, dtype=torch.float64) + 1).requires_grad_(table_grad)
    slot_table = torch.rand(R, C, generator=g) > 0.3
    slot_table[:, -1] = True
    slot_table[2] = False  # an empty (invalid) chunk: read with weight 0
    rows = torch.randint(4, (N, k), generator=g)  # rows 0-3 shared by many queries ...
    rows[0] = torch.tensor([5, 5, 2])  # ... row 5 by one query, twice; row 6 by none
    q = torch.randn(N, H, D, generator=g, dtype=torch.float64, requires_grad=True)
    weights = torch.softmax(torch.randn(N, k, generator=g, dtype=torch.float64), -1)
    weights = torch.where(rows == 2, 0.0, weights).requires_grad_(True)
    upstream = torch.randn(N, H, D, generator=g, dtype=torch.float64)
    table, slot_table, rows, q, weights, upstream = on(device, table, slot_table, rows, q, weights, upstream)
    inputs = (q, weights, table) if table_grad else (q, weights)
    sizes = dict(tile_rows=tile_rows, block_bytes=block_bytes)
    got = mix_chunks_grouped(q, weights, table, slot_table, rows, **sizes)
    want = reference_on_rows(q, weights, table, slot_table, rows)
    torch.testing.assert_close(got, want)
    grads_got = torch.autograd.grad((got * upstream).sum(), inputs)
    grads_want = torch.autograd.grad((want * upstream).sum(), inputs)
    for a, b in zip(grads_got, grads_want, strict=True):
        assert b.abs().max() > 0
        torch.testing.assert_close(a, b)
    if table_grad:
        mix = lambda q, w, t: mix_chunks_grouped(q, w, t, slot_table, rows, **sizes)
    else:
        mix = lambda q, w: mix_chunks_grouped(q, w, table, slot_table, rows, **sizes)
    # On a GPU index_add_ sums with atomics, in any order: a backward run twice may differ in the last bits.
    assert torch.autograd.gradcheck(mix, inputs, nondet_tol=1e-12 if device.type == "cuda" else 0.0)


def test_group_pairs_tiles_every_pair_once():
    """``group_pairs``: every (query, chunk) pair lands in exactly one tile, each tile holds pairs of its
    own chunk only, a chunk has ceil(pairs / tile) tiles, and padding points past the last pair and query."""
    g = torch.Generator().manual_seed(9)
    N, k, R, tile = 13, 3, 6, 4
    rows = torch.randint(R - 1, (N, k), generator=g)  # row R - 1 is never selected
    tiles = group_pairs(rows, R, tile)
    real = tiles.pair < N * k
    assert sorted(tiles.pair[real].tolist()) == list(range(N * k))
    assert torch.equal(rows.flatten()[tiles.pair[real]], tiles.row[:, None].expand_as(real)[real])
    assert torch.equal(tiles.query[real], tiles.pair[real] // k)
    assert bool((tiles.query[~real] == N).all())
    counts = torch.bincount(rows.flatten(), minlength=R)
    assert torch.equal(torch.bincount(tiles.row, minlength=R), (counts + tile - 1) // tile)


def test_tile_fill_is_the_share_of_tile_places_real_pairs_take():
    """``tile_fill``: the pairs over the places of the tiles ``group_pairs`` would cut (a chunk's pairs
    padded to whole tiles): 1 for whole tiles, 1 / tile when every chunk is chosen once."""
    tile = 4
    whole = torch.tensor([[0, 1], [0, 1], [0, 1], [0, 1]])  # chunks 0 and 1 four times each: two full tiles
    assert tile_fill(whole, 3, tile) == 1.0
    once = torch.arange(6).view(3, 2)  # six chunks once each: six tiles of one pair
    assert tile_fill(once, 6, tile) == 1 / tile
    rows = torch.tensor([[0, 1], [0, 2], [0, 2], [0, 2], [0, 3]])  # 5 + 1 + 3 + 1 pairs: 2 + 1 + 1 + 1 tiles
    assert tile_fill(rows, 4, tile) == 10 / (5 * tile)
    assert tile_fill(rows, 4, tile) == rows.numel() / (len(group_pairs(rows, 4, tile).row) * tile)


@pytest.mark.parametrize("case, expected", [("agreeing", "grouped"), ("spread", "gather"), ("small", "gather")])
def test_auto_groups_a_call_whose_tiles_fill(case, expected, monkeypatch):
    """``impl="auto"`` takes the grouped path for a call of at least ``GROUPED_MIN_PAIRS`` pairs whose
    queries agree on their chunks (full tiles), and the gather when they spread over the chunks (tiles of
    one or two pairs) or the call is small; either way it gives the reference's values and gradients."""
    g = torch.Generator().manual_seed(11)
    B, Q, H, C, D, k = 2, 128, 4, 4, 8, 4  # 4 heads: 16 pairs a tile; 2 * 128 * 4 = 1,024 pairs
    M = 256
    if case == "small":
        Q = 64  # 512 pairs
    scores = torch.randn(B, Q, M, generator=g)
    if case != "spread":  # every query of a row prefers the same k chunks
        scores[:, :, :k] += 100.0
    top_idx = scores.topk(k, -1).indices
    contents = torch.randn(B, M, C, D, generator=g, dtype=torch.float64, requires_grad=True)
    slot_valid = torch.ones(B, M, C, dtype=torch.bool)
    visible = torch.ones(B, Q, M, dtype=torch.bool)  # every chunk readable: never dense
    weights = torch.softmax(torch.randn(B, Q, k, generator=g, dtype=torch.float64), -1).requires_grad_(True)
    q = torch.randn(B, Q, H, D, generator=g, dtype=torch.float64, requires_grad=True)
    taken = []
    for name in ("mix_chunks_grouped", "mix_selected_chunks"):
        original = getattr(htm_mix, name)
        monkeypatch.setattr(htm_mix, name, lambda *a, _f=original, _n=name, **kw: taken.append(_n) or _f(*a, **kw))
    got = mix_chunks(q, weights, top_idx, contents, slot_valid, visible, impl="auto")
    assert taken == ["mix_chunks_grouped" if expected == "grouped" else "mix_selected_chunks"]
    want = mix_chunks(q, weights, top_idx, contents, slot_valid, visible, impl="reference")
    torch.testing.assert_close(got, want)
    for a, b in zip(*(torch.autograd.grad(out.square().sum(), (q, weights, contents)) for out in (got, want)),
                    strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("rows_per_block", [1, 1000])
def test_dense_mix_matches_selected_mix(rows_per_block, device):
    """``mix_chunks_dense`` (every query scores every chunk its group may read; the unselected get
    weight 0) == the reference's gather of the selected chunks, values and gradients (into the slots
    too), in blocks of one row or all rows, with groups of queries that may read different chunks or
    none; and it passes gradcheck."""
    g = torch.Generator().manual_seed(7)
    B, Q, H, M, C, D, k = 3, 6, 2, 5, 3, 6, 2
    slots = (2 * torch.randn(B, M, C, D, generator=g, dtype=torch.float64) + 1).requires_grad_(True)
    slot_valid = torch.rand(B, M, C, generator=g) > 0.3
    slot_valid[..., 0] = True
    slot_valid[1, 2] = False  # an empty chunk: read with weight 0
    visible = torch.rand(B, Q, M, generator=g) > 0.3
    visible[1, :, 2] = False
    visible[:, :2, 4] = False  # group 1 (queries 0-1) may not read chunk 4,
    visible[:, 2:4, 0] = False  # group 2 not chunk 0,
    visible[:, 4:] = False  # and group 3 nothing
    scores = torch.randn(B, Q, M, generator=g).masked_fill(~visible, -1e9)
    top_idx = scores.topk(k, -1).indices
    weights = torch.softmax(torch.randn(B, Q, k, generator=g, dtype=torch.float64), -1).requires_grad_(True)
    read = lambda w: torch.where(visible.gather(-1, top_idx), w, 0.0)  # as in HTMAttention.read
    sizes = dict(query_group=2, block_bytes=rows_per_block * 2 * H * M * C * 8)
    upstream = torch.randn(B, Q, H, D, generator=g, dtype=torch.float64)
    q = torch.randn(B, Q, H, D, generator=g, dtype=torch.float64, requires_grad=True)
    slots, slot_valid, visible, top_idx, weights, upstream, q = on(device, slots, slot_valid, visible, top_idx,
                                                                   weights, upstream, q)

    def dense(q, weights, slots):
        weights = torch.zeros(B, Q, M, dtype=q.dtype, device=q.device).scatter(-1, top_idx, read(weights))
        return mix_chunks_dense(q, weights, slots, slot_valid, visible, **sizes)

    def gathered(q, weights, slots):
        return mix_chunks_reference(q, read(weights), top_idx, slots, slot_valid)

    got, want = dense(q, weights, slots), gathered(q, weights, slots)
    torch.testing.assert_close(got, want)
    assert got[:, 4:].abs().max() == 0
    grads_got = torch.autograd.grad((got * upstream).sum(), (q, weights, slots))
    grads_want = torch.autograd.grad((want * upstream).sum(), (q, weights, slots))
    for a, b in zip(grads_got, grads_want, strict=True):
        assert b.abs().max() > 0
        torch.testing.assert_close(a, b)
    assert torch.autograd.gradcheck(dense, (q, weights, slots))


@pytest.mark.parametrize("impl", ["auto", "gather", "grouped", "dense"])
@pytest.mark.parametrize("transform", [False, True])
@pytest.mark.parametrize("Q", [1, 20])  # Q * k < M: slots transformed after the gather; >= M: before
def test_mix_chunks_paths_match_the_reference(impl, transform, Q, device):
    """``mix_chunks`` by each implementation's name == ``impl="reference"``, values and gradients into
    the queries, weights and contents, through LN and the slot encoding or without them."""
    g = torch.Generator().manual_seed(8)
    B, H, M, C, D, k = 2, 2, 6, 4, 6, 2
    contents = torch.randn(B, M, C, D, generator=g, dtype=torch.float64, requires_grad=True)
    slot_valid = torch.rand(B, M, C, generator=g) > 0.3
    slot_valid[..., -1] = True
    visible = torch.rand(B, Q, M, generator=g) > 0.2
    top_idx = torch.randn(B, Q, M, generator=g).masked_fill(~visible, -1e9).topk(k, -1).indices
    weights = torch.softmax(torch.randn(B, Q, k, generator=g, dtype=torch.float64), -1)
    weights = torch.where(visible.gather(-1, top_idx), weights, 0.0).requires_grad_(True)
    q = torch.randn(B, Q, H, D, generator=g, dtype=torch.float64, requires_grad=True)
    options = dict(norm=True, slot_encoding=torch.randn(C, D, generator=g, dtype=torch.float64)) if transform else {}
    upstream = torch.randn(B, Q, H, D, generator=g, dtype=torch.float64)
    contents, slot_valid, visible, top_idx, weights, q, upstream = on(device, contents, slot_valid, visible, top_idx,
                                                                      weights, q, upstream)
    options = {key: value.to(device) if torch.is_tensor(value) else value for key, value in options.items()}
    outputs = [mix_chunks(q, weights, top_idx, contents, slot_valid, visible, impl=name, **options)
               for name in (impl, "reference")]
    torch.testing.assert_close(*outputs)
    grads = [torch.autograd.grad((out * upstream).sum(), (q, weights, contents)) for out in outputs]
    for a, b in zip(*grads, strict=True):
        assert b.abs().max() > 0
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("impl", ["auto", "dense"])
def test_a_compiled_mix_is_one_graph_with_the_references_values(impl):
    """Under ``torch.compile`` (``fullgraph``: a break is an error) ``mix_chunks`` picks no chunk by value
    ("auto" gathers each query's k, "dense" scores every chunk) and gives the reference's values and
    gradients, for a call long enough that eagerly "auto" would take the dense path."""
    g = torch.Generator().manual_seed(9)
    B, Q, H, M, C, D, k = 2, 20, 2, 6, 4, 6, 2
    contents = torch.randn(B, M, C, D, generator=g, dtype=torch.float64, requires_grad=True)
    slot_valid = torch.rand(B, M, C, generator=g) > 0.3
    slot_valid[..., -1] = True
    visible = torch.rand(B, Q, M, generator=g) > 0.2
    visible[..., -1] = False  # a chunk no query may read: eagerly dense drops it, compiled it weighs zero
    top_idx = torch.randn(B, Q, M, generator=g).masked_fill(~visible, -1e9).topk(k, -1).indices
    weights = torch.softmax(torch.randn(B, Q, k, generator=g, dtype=torch.float64), -1)
    weights = torch.where(visible.gather(-1, top_idx), weights, 0.0).requires_grad_(True)
    q = torch.randn(B, Q, H, D, generator=g, dtype=torch.float64, requires_grad=True)
    encoding = torch.randn(C, D, generator=g, dtype=torch.float64)

    def mix(q, weights, contents, name):
        return mix_chunks(q, weights, top_idx, contents, slot_valid, visible, impl=name, norm=True,
                          slot_encoding=encoding)

    torch._dynamo.reset()
    try:
        got = torch.compile(mix, backend="aot_eager", fullgraph=True, dynamic=False)(q, weights, contents, impl)
    finally:
        torch._dynamo.reset()
    want = mix(q, weights, contents, "reference")
    torch.testing.assert_close(got, want)
    for a, b in zip(*(torch.autograd.grad(out.square().sum(), (q, weights, contents)) for out in (got, want)),
                    strict=True):
        torch.testing.assert_close(a, b)
