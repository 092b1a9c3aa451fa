"""Supervised Ballet (``chronomem.tasks.ballet``): the vectorised generator against stepping the
environment, labels, the every-dancer questions and the mixture of levels."""

import numpy as np
import pytest
import torch

pytest.importorskip("gymnasium")  # the generator is checked against stepping BalletEnv

from chronomem.envs.ballet import BalletEnv  # noqa: E402
from chronomem.envs.ballet_world import DANCE_OFFSETS, DANCER_CELLS, LEVELS, WATCH  # noqa: E402
from chronomem.registry import get_task  # noqa: E402
from chronomem.tasks.ballet import Episodes, SupervisedBallet, observation_features  # noqa: E402
from test_envs_ballet import run_to_cue  # noqa: E402

# ---- supervised task ---------------------------------------------------------------------------


def test_bad_arguments():
    for bad in ("3_delay16", "2_delay20", "2-delay16", "", 8):
        with pytest.raises(ValueError, match="2_delay16"):
            SupervisedBallet(bad)
    with pytest.raises(ValueError, match="observation"):
        SupervisedBallet("2_delay16", observation="pixels")


def env_stream(level, layout, observation):
    env = BalletEnv(level, observation="symbolic")
    observations, _ = run_to_cue(env, options={"layout": layout})
    return np.stack([observation_features(o, observation) for o in observations])


@pytest.mark.parametrize(
    "level,observation",
    [("2_delay16", "symbolic_full"), ("4_delay48", "symbolic"), ("8_delay16", "symbolic")],
)
def test_supervised_generator_matches_env(level, observation):
    task = SupervisedBallet(level, observation=observation)
    episodes = task.sample_episodes(3, torch.Generator().manual_seed(0))
    inputs = task.encode(episodes)
    assert inputs.shape == (3, task.length, task.input_dim) and inputs.dtype == torch.float32
    for b in range(3):
        assert (inputs[b].numpy() == env_stream(level, episodes.layout(b), observation)).all()
    # and the other way round: episodes the environment samples itself
    env = BalletEnv(level, observation="symbolic")
    layouts = []
    for seed in range(2):
        env.reset(seed=seed)
        layouts.append(env.layout)
    inputs = task.encode(Episodes.from_layouts(layouts))
    for b, layout in enumerate(layouts):
        assert (inputs[b].numpy() == env_stream(level, layout, observation)).all()


@pytest.mark.parametrize("level", LEVELS)
def test_supervised_shapes(level):
    task = get_task("ballet")(level=level)
    n, d = (int(v) for v in level.split("_delay"))
    assert task.length == n * (d + 15) + 1 and task.input_dim == 81 + 14
    assert task.kind == "classify" and task.num_classes == 8 and task.causal
    batch = task.sample(4, torch.Generator().manual_seed(0))
    assert batch.inputs.shape == (4, task.length, 95) and batch.mask is None and batch.targets.shape == (4,)
    assert (batch.inputs[:, :, :81].sum(-1) == n).all()  # n dancers in view at every step
    assert (batch.inputs[:, :, 81:].sum(-1) == 1).all()
    assert (batch.inputs[:, :-1, 81 + WATCH] == 1).all() and (batch.inputs[:, -1, 81 + WATCH] == 0).all()


def test_labels_uniform_and_occupied():
    g = torch.Generator().manual_seed(0)
    for n, level in ((8, "8_delay16"), (2, "2_delay16")):
        task = SupervisedBallet(level)
        episodes = task.sample_episodes(8000, g)
        counts = torch.bincount(episodes.labels, minlength=8).float()
        assert (abs(counts / 8000 - 1 / 8) < 0.015).all(), counts  # every cell equally likely
        assert abs((episodes.target == 0).float().mean() - 1 / n) < 0.03  # target uniform over dancers
        assert (episodes.labels == episodes.cells.gather(1, episodes.target[:, None])[:, 0]).all()
        for k in ("cells", "dances", "shapes", "colours"):
            values = getattr(episodes, k)
            assert (values.sort(1).values.diff(1) > 0).all()  # distinct within an episode
    # the label's cell holds a dancer at the cue
    batch = SupervisedBallet("4_delay16").sample(64, g)
    cue_cells = batch.inputs[:, -1, :81].view(-1, 9, 9)
    rows, cols = torch.tensor(DANCER_CELLS).T
    assert (cue_cells[torch.arange(64), rows[batch.targets] - 1, cols[batch.targets] - 1] == 1).all()


def decode(inputs: np.ndarray) -> int:
    """A hand-written solver: find the 3x3 block whose dancer traced the instructed dance."""
    occupancy = inputs[:, :81].reshape(-1, 9, 9)
    dance = int(inputs[-1, 81:].argmax()) - 1
    found = []
    for k, (r, c) in enumerate(DANCER_CELLS):
        block = occupancy[:, r - 2 : r + 1, c - 2 : c + 1].reshape(len(inputs), 9)
        if block.sum() == 0:
            continue
        path = np.stack(np.unravel_index(block.argmax(1), (3, 3)), 1) - 1  # [L, 2] offsets
        windows = np.lib.stride_tricks.sliding_window_view(path, (16, 2))[:, 0]  # [L-15, 16, 2]
        if (windows == DANCE_OFFSETS[dance, 1:]).all((1, 2)).any():
            found.append(k)
    assert len(found) == 1
    return found[0]


def test_supervised_task_is_solvable_from_its_features():
    task = SupervisedBallet("8_delay16")
    batch = task.sample(64, torch.Generator().manual_seed(1))
    predictions = [decode(x) for x in batch.inputs.numpy()]
    assert predictions == batch.targets.tolist()


@pytest.mark.parametrize("level", ["2_delay16", "4_delay48", "8_delay16"])
def test_every_dancer_questions(level):
    """questions="every_dancer": the target episode, then one question per dancer; each answer is what
    the hand-written solver reads off the stream for that question; the score counts the first only."""
    plain, every = SupervisedBallet(level), SupervisedBallet(level, questions="every_dancer")
    assert (plain.kind, every.kind) == ("classify", "tag") and every.describe()["questions"] == "every_dancer"
    a, b = plain.sample(16, torch.Generator().manual_seed(7)), every.sample(16, torch.Generator().manual_seed(7))
    L, n = plain.length, plain.num_dancers
    assert b.inputs.shape == (16, L + n - 1, 95) and b.targets.shape == (16, L + n - 1)
    assert torch.equal(b.inputs[:, :L], a.inputs) and torch.equal(b.targets[:, L - 1], a.targets)
    expect_loss = torch.zeros(L + n - 1, dtype=torch.bool)
    expect_loss[L - 1 :] = True
    assert torch.equal(b.loss_mask, expect_loss.expand(16, -1))
    assert torch.equal(b.score_mask, (torch.arange(L + n - 1) == L - 1).expand(16, -1))
    for row in range(16):
        x = b.inputs[row].numpy()
        names = x[L - 1 :, 81:].argmax(-1)
        assert len(set(names.tolist())) == n and WATCH not in names  # every dancer asked once
        for q in range(n):  # the cue frame with the question's name, then solve it independently
            assert (x[L - 1 + q, :81] == x[L - 1, :81]).all()
            stream = np.concatenate([x[: L - 1], x[L - 1 + q : L + q]])
            assert decode(stream) == int(b.targets[row, L - 1 + q])
    mixed = get_task("ballet")(level="mixed", levels=(level,), questions="every_dancer")
    assert mixed.kind == "tag" and mixed.describe()["questions"] == "every_dancer"
    with pytest.raises(ValueError, match="questions"):
        SupervisedBallet(level, questions="all")


def test_every_dancer_score_is_the_single_question_accuracy():
    """A causal model's output at the first question depends only on the target episode, so the
    every-dancer score equals its accuracy on the single-question task (same episodes)."""
    from chronomem.heads import build_model
    from chronomem.train import evaluate

    torch.manual_seed(0)
    plain, every = SupervisedBallet("4_delay16"), SupervisedBallet("4_delay16", questions="every_dancer")
    net = build_model("lstm", every, dim=16, depth=1)
    batch = next(plain.eval_batches(64, 64))
    with torch.no_grad():
        logits, _ = net(batch.inputs)
    single = 100.0 * float((logits[:, -1].argmax(-1) == batch.targets).float().mean())
    assert evaluate(net, every, batch_size=64, num_examples=64)["accuracy"] == pytest.approx(single)
    assert 0 < single < 100  # an untrained model: the check is not vacuous


def test_eval_batches_fixed():
    task = SupervisedBallet("2_delay16")
    a = next(task.eval_batches(8, 8))
    b = next(task.eval_batches(8, 8))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)


def test_mixed_levels_are_the_papers_uniform_mixture():
    """``level="mixed"`` (App. B.1): each batch is one level, drawn uniformly; the examples are those of
    that level's ``SupervisedBallet``; the task rebuilds from its description."""
    task = get_task("ballet")(level="mixed")
    assert task.levels == LEVELS and task.input_dim == 95 and task.num_classes == 8
    g = torch.Generator().manual_seed(0)
    lengths = [task.sample(2, g).inputs.shape[1] for _ in range(600)]
    expected = {SupervisedBallet(level).length for level in LEVELS}
    assert set(lengths) == expected
    counts = [lengths.count(n) for n in sorted(expected)]
    assert min(counts) > 600 / 6 * 0.7 and max(counts) < 600 / 6 * 1.3  # roughly uniform
    # One level is that level: the same training batches and the same test set, so a run trained on
    # a mixture of one level reports the accuracy its level's evaluation gives (the tour's Ballet row).
    one = get_task("ballet")(level="mixed", levels=("4_delay16",))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    batch = one.sample(3, g1)
    want = SupervisedBallet("4_delay16").sample(3, g2)
    assert torch.equal(batch.inputs, want.inputs) and torch.equal(batch.targets, want.targets)
    for a, b in zip(one.eval_batches(4, 8), SupervisedBallet("4_delay16").eval_batches(4, 8), strict=True):
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    options = {k: v for k, v in one.describe().items() if k != "name"}
    assert get_task("ballet")(**options).levels == ("4_delay16",)
    with pytest.raises(ValueError, match="levels"):
        get_task("ballet")(level="mixed", levels=())
    with pytest.raises(ValueError, match="levels"):
        get_task("ballet")(level="2_delay16", levels=("2_delay16",))
    with pytest.raises(ValueError, match="2_delay16"):
        get_task("ballet")(level="mixed", levels=("3_delay16",))
