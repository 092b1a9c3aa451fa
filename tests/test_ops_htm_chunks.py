"""HTM's chunk machinery against its naive references: the chunks a call completes (values, and
gradients into the steps), their commit into the ring buffer, and what each query may read of them."""

import pytest
import torch

from chronomem.htm import HierarchicalMemory
from chronomem.layers import copy_state
from chronomem.ops.htm_chunks import (
    Accumulator,
    NewChunks,
    RingBuffer,
    append_step,
    append_step_and_commit,
    call_chunks,
    call_chunks_reference,
    chunks_to_read,
    chunks_to_read_reference,
    commit_chunks,
    commit_chunks_reference,
    commit_chunks_select,
    complete_chunks,
)
from chronomem.ops.htm_local import call_episodes

torch.set_num_threads(1)

B, N, C, D = 3, 17, 4, 5


def random_accumulator(overlap, generator, dtype=torch.float64):
    """A chunk being filled: some steps, the first ``carried`` of them carried over by the overlap."""
    fill = torch.tensor([0, 1, C - 1])
    carried = torch.minimum(fill, torch.tensor([0, overlap, overlap]))
    steps = torch.randn(B, C, D, generator=generator, dtype=dtype)
    accumulator = steps * (torch.arange(C)[None, :] < fill[:, None])[..., None]
    return Accumulator(accumulator, fill, carried)


def dones_for(kind, generator):
    if kind == "none":
        return None
    if kind == "shared":  # every row ends at the same steps
        done = torch.zeros(B, N, dtype=torch.bool)
        done[:, [2, 9]] = True
        return done
    done = torch.rand(B, N, generator=generator) < 0.15
    done[0, 5] = done[1, 6] = done[1, 10] = True  # row 1's last real step (11) ends an episode too
    return done


def weighted_sum(chunks_per_row, weights):
    """sum over each row's chunks (in commit order) of weights . (contents, key): what the gradient test
    differentiates, the same function for both paths."""
    total = 0.0
    for b, row in enumerate(chunks_per_row):
        for rank, (contents, key) in enumerate(row):
            total = total + (weights[0][b, rank] * contents).sum() + (weights[1][b, rank] * key).sum()
    return total


@pytest.mark.parametrize("overlap", [0, 1, 2])
@pytest.mark.parametrize("dones", ["none", "shared", "random"])
def test_call_chunks_match_the_reference(overlap, dones):
    """``call_chunks`` (whole-chunk tensor ops; with episode ends, every step's chunk at once) == a loop
    over the steps of each row: every committed chunk in order (contents, stored slots, key, the step that
    commits it, its episode; with episode ends, each row's chunks first and no more columns than a row
    has chunks) and the accumulator after; with ``detach=False``, the gradients into the
    steps and the incoming accumulator. Padded steps are not stored."""
    g = torch.Generator().manual_seed(overlap)
    acc = random_accumulator(overlap, g)
    x = torch.randn(B, N, D, generator=g, dtype=torch.float64)
    lengths = torch.tensor([N, 11, N])
    done = dones_for(dones, g)
    episodes = None if done is None else call_episodes(done, lengths, torch.zeros(B, dtype=torch.long), cache=0)
    x_in, acc_in = x.clone().requires_grad_(True), acc.accumulator.clone().requires_grad_(True)
    new, after = call_chunks(acc._replace(accumulator=acc_in), x_in, lengths, overlap, episodes, detach=False)
    x_ref, acc_ref = x.clone().requires_grad_(True), acc.accumulator.clone().requires_grad_(True)
    want, want_after = call_chunks_reference(acc._replace(accumulator=acc_ref), x_ref, lengths, overlap,
                                             None if episodes is None else episodes.done)
    got = []
    if done is not None:  # each row's chunks at the front, no column that no row needs
        assert torch.equal(new.valid, torch.arange(new.valid.shape[1])[None] < new.valid.sum(1, keepdim=True))
        assert new.valid.shape[1] == max(map(len, want))
    for b in range(B):
        committed = new.valid[b].nonzero().flatten().tolist()
        assert len(committed) == len(want[b]) > 0
        for j, chunk in zip(committed, want[b], strict=True):
            torch.testing.assert_close(new.contents[b, j], chunk["contents"])
            torch.testing.assert_close(new.keys[b, j], chunk["key"])
            assert torch.equal(new.slots[b, j], chunk["slots"]) and int(new.end[b, j]) == chunk["end"]
            assert int(new.episode[b, j] if done is not None else 0) == chunk["episode"]
        fill = int(after.fill[b])
        torch.testing.assert_close(after.accumulator[b, :fill], want_after[b]["steps"])
        assert not after.accumulator[b, fill:].any() and int(after.carried[b]) == want_after[b]["carried"]
        got.append([(new.contents[b, j], new.keys[b, j]) for j in committed])
    weights = [torch.randn(B, max(map(len, want)), *shape, generator=g, dtype=torch.float64)
               for shape in ((C, D), (D,))]
    grads = torch.autograd.grad(weighted_sum(got, weights), (x_in, acc_in))
    reference = [[(c["contents"], c["key"]) for c in row] for row in want]
    grads_want = torch.autograd.grad(weighted_sum(reference, weights), (x_ref, acc_ref))
    for a, b in zip(grads, grads_want, strict=True):
        assert b.abs().max() > 0
        torch.testing.assert_close(a, b)


def stored_memory(keep, overlap, generator, lengths=(15, 6, 2)):
    """A memory holding some chunks, some of them evicted already (M = 3)."""
    mem = HierarchicalMemory.empty(B, 3, C, D, overlap=overlap, keep_across_episodes=keep, dtype=torch.float64)
    mask = torch.arange(15)[None] < torch.tensor(lengths)[:, None]
    return mem.write(torch.randn(B, 15, D, generator=generator, dtype=torch.float64), mask=mask)


@pytest.mark.parametrize("commit", [commit_chunks, commit_chunks_select])
def test_commit_chunks_matches_the_reference(commit):
    """``commit_chunks`` (one indexed write per field, only the newest M of a call's chunks kept) and
    ``commit_chunks_select`` (what a compiled graph runs: a select per chunk column) == putting the valid
    chunks into the ring buffer one by one, more than M of them in a row included. The fields stay
    contiguous (every step's read views the contents as ``[B * M, C, D]`` rows)."""
    g = torch.Generator().manual_seed(4)
    mem = stored_memory(False, 0, g)
    K = 7
    valid = torch.rand(B, K, generator=g) < 0.6
    valid[0] = True  # 7 chunks into a buffer of 3: the oldest 4 are evicted at once
    valid[2] = False  # nothing to commit
    chunks = NewChunks(torch.randn(B, K, D, generator=g, dtype=torch.float64),
                       torch.randn(B, K, C, D, generator=g, dtype=torch.float64),
                       torch.rand(B, K, C, generator=g) < 0.7, valid)
    got, want = commit(mem.ring, chunks), commit_chunks_reference(mem.ring, chunks)
    for name, tensor in want._asdict().items():
        assert torch.equal(getattr(got, name), tensor), name
        assert getattr(got, name).is_contiguous(), name
    unchanged = commit_chunks(mem.ring, NewChunks(*(t[:, :0] for t in chunks[:4])))  # no chunk: nothing changes
    assert all(a is b for a, b in zip(unchanged, mem.ring, strict=True))


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("overlap", [0, 1])
@pytest.mark.parametrize("dones", ["none", "random"])
def test_chunks_to_read_matches_the_reference(keep, overlap, dones):
    """``chunks_to_read``'s per-query mask (chunk ids against the ring buffer at each query's time) ==
    replaying the ring buffer for each query: the stored chunks, then the call's chunks committed before
    the query, the newest M kept, emptied at each episode end unless ``keep_across_episodes``. The chunks
    read are the stored ones then the new ones."""
    g = torch.Generator().manual_seed(5 + overlap)
    mem = stored_memory(keep, overlap, g)
    x = torch.randn(B, N, D, generator=g, dtype=torch.float64)
    lengths = torch.tensor([N, 12, N])
    done = dones_for(dones, g)
    episodes = None if done is None else call_episodes(done, lengths, torch.zeros(B, dtype=torch.long), cache=0)
    new, _ = call_chunks(mem.filling, x, lengths, overlap, episodes)
    read = chunks_to_read(mem.ring, new, N, episodes, keep)
    assert torch.equal(read.keys, torch.cat([mem.keys, new.keys], 1))
    assert torch.equal(read.contents, torch.cat([mem.contents, new.contents], 1))
    assert torch.equal(read.slot_valid, torch.cat([mem.slot_valid, new.slots], 1))
    want = chunks_to_read_reference(mem.ring, new, N, episodes, keep)
    assert torch.equal(read.mask, want)
    assert torch.equal(read.tail(5).mask, want[:, -5:])
    assert want[:, :, 3:].any() and (dones == "none" or not want[0, -1, :3].any() or keep)


def test_a_call_that_completes_no_chunk_reads_the_stored_ones():
    """Nothing committed in the call and no episode end: every query reads every stored chunk (no mask)."""
    g = torch.Generator().manual_seed(6)
    mem = stored_memory(False, 0, g, lengths=(14, 6, 2))  # no row one step short of a full chunk
    x = torch.randn(B, 1, D, generator=g, dtype=torch.float64)
    new, _ = call_chunks(mem.filling, x, torch.ones(B, dtype=torch.long), 0)
    assert new.valid.shape[1] == 0
    read = chunks_to_read(mem.ring, new, 1)
    assert read.mask is None and read.keys is mem.keys
    assert torch.equal(chunks_to_read_reference(mem.ring, new, 1), mem.valid[:, None, :])


@pytest.mark.parametrize("overlap", [0, 2])
def test_append_step_is_complete_chunks_without_a_chunk(overlap):
    """``append_step`` (one select) == ``complete_chunks``'s accumulator for one step per row, rows at fills
    0, 1 and C - 2 (no chunk completes; the last carrying the overlap); the step is stored detached."""
    g = torch.Generator().manual_seed(3)
    acc = random_accumulator(overlap, g)
    acc = acc._replace(fill=torch.tensor([0, 1, C - 2]), carried=torch.tensor([0, min(overlap, 1), overlap]),
                       accumulator=acc.accumulator * (torch.arange(C) < torch.tensor([[0], [1], [C - 2]]))[..., None])
    x = torch.randn(B, 1, D, generator=g, dtype=torch.float64, requires_grad=True)
    got = append_step(acc, x)
    _, want = complete_chunks(acc, x, torch.ones(B, dtype=torch.long), overlap)
    for name in Accumulator._fields:
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert not got.accumulator.requires_grad
    assert torch.equal(got.accumulator[torch.arange(B), acc.fill], x.detach()[:, 0])


@pytest.mark.parametrize("overlap", [0, 1, 2])
@pytest.mark.parametrize("compiling", [False, True])
@pytest.mark.parametrize("in_place", [False, True])
def test_append_step_and_commit_is_the_general_write_of_one_step(overlap, compiling, in_place, monkeypatch):
    """``append_step_and_commit`` == ``complete_chunks`` then ``commit_chunks`` of one step per row, rows at
    fills C - 1 (the step completes their chunk, one of them into a full ring, evicting) and below (it only
    joins the accumulator), and == the naive references (``call_chunks_reference``,
    ``commit_chunks_reference``). ``compiling``: the commit a graph runs (``commit_chunks_select``).
    ``in_place``: the column written into the ring buffer's own tensors (``commit_column_``), which hold the
    result. The step is stored detached."""
    from chronomem.ops import htm_chunks

    monkeypatch.setattr(htm_chunks.torch.compiler, "is_compiling", lambda: compiling)
    g = torch.Generator().manual_seed(5)
    mem = stored_memory(False, overlap, g, lengths=(15, 13, 6))  # rows full, full, one chunk stored
    fill = torch.tensor([C - 1, 1, C - 1])
    carried = torch.minimum(fill, torch.tensor(overlap))
    steps = torch.randn(B, C, D, generator=g, dtype=torch.float64)
    acc = Accumulator(steps * (torch.arange(C)[None, :] < fill[:, None])[..., None], fill, carried)
    x = torch.randn(B, 1, D, generator=g, dtype=torch.float64, requires_grad=True)
    donated = RingBuffer(*(t.clone() for t in mem.ring))
    got_acc, got_ring = append_step_and_commit(acc, donated if in_place else mem.ring, x, overlap, in_place)
    new, want_acc = complete_chunks(acc, x, torch.ones(B, dtype=torch.long), overlap)
    want_ring = commit_chunks_reference(mem.ring, new)
    for name, tensor in want_ring._asdict().items():
        assert torch.equal(getattr(got_ring, name), tensor), name
        if name != "committed":  # written where they were, or left as they were
            assert (getattr(got_ring, name) is getattr(donated, name)) == in_place, name
    for name in Accumulator._fields:
        assert torch.equal(getattr(got_acc, name), getattr(want_acc, name)), name
    assert torch.equal(got_ring.committed - mem.ring.committed, torch.tensor([1, 0, 1]))
    chunks, after = call_chunks_reference(acc, x.detach(), torch.ones(B, dtype=torch.long), overlap)
    for b in range(B):
        assert len(chunks[b]) == int(fill[b] == C - 1)
        assert int(got_acc.fill[b]) == len(after[b]["steps"]) and int(got_acc.carried[b]) == after[b]["carried"]
        torch.testing.assert_close(got_acc.accumulator[b, : int(got_acc.fill[b])], after[b]["steps"])
    assert not got_acc.accumulator.requires_grad and not got_ring.contents.requires_grad


def test_memory_append_step_equals_write_at_every_step():
    """``HierarchicalMemory.append_step`` == ``write`` step after step, through chunks completing (the
    write that commits, ``append_step_and_commit``) and steps that complete none (``append_step``), rows at
    different fills; and so does a donated memory's (``in_place``), whose ring buffer stays the tensors it
    began with."""
    g = torch.Generator().manual_seed(4)
    mask = torch.tensor([[1, 1], [1, 0], [0, 0]]).bool()  # rows at fills 2, 1, 0
    slow = HierarchicalMemory.empty(B, 3, C, D, overlap=1, dtype=torch.float64)
    fast = slow = slow.write(torch.randn(B, 2, D, generator=g, dtype=torch.float64), mask=mask)
    donated = copy_state(fast)  # its ring buffer written in place at every commit
    contents = donated.contents
    for _ in range(3 * C + 1):
        x = torch.randn(B, 1, D, generator=g, dtype=torch.float64)
        fast, slow, donated = fast.append_step(x), slow.write(x), donated.append_step(x, in_place=True)
        for name, want in slow.__dict__.items():
            for got in (getattr(fast, name), getattr(donated, name)):
                assert torch.equal(got, want) if torch.is_tensor(want) else got == want, name
    assert slow.valid.all() and donated.contents is contents
