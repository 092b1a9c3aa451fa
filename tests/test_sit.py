"""SiT and SiT + TLB (chronomem.sit): the rotations, views, corruption and the three losses, each against a
plain reference or an exact property."""

import pytest
import torch
import torch.nn.functional as F

from chronomem.sit import SiT, augment, corrupt, nt_xent, pretraining_losses, rotate, unpatchify
from chronomem.tasks.images import patchify


def images(b=4, c=1, side=8, seed=0):
    return torch.rand(b, c, side, side, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def test_rotation_labels_are_exact_quarter_turns():
    x = images(4)
    quarters = torch.tensor([0, 1, 2, 3])
    turned = rotate(x, quarters)
    for i, k in enumerate(quarters.tolist()):
        assert torch.equal(turned[i], torch.rot90(x[i], k, dims=(-2, -1)))
    # a quarter turn counter-clockwise moves the top-right corner to the top-left
    corner = torch.zeros(1, 1, 3, 3)
    corner[0, 0, 0, 2] = 1
    assert rotate(corner, torch.tensor([1]))[0, 0, 0, 0] == 1
    assert torch.equal(rotate(rotate(x, quarters), (4 - quarters) % 4), x)


def nt_xent_loop(z1, z2, temperature):
    """The reference: SimCLR's loss written view by view."""
    z = F.normalize(torch.cat([z1, z2]), dim=-1)
    n, b, total = z.shape[0], z1.shape[0], 0.0
    for i in range(n):
        positive = (i + b) % n
        others = [j for j in range(n) if j != i]
        logits = torch.stack([z[i] @ z[j] / temperature for j in others])
        total = total - (z[i] @ z[positive] / temperature - torch.logsumexp(logits, 0))
    return total / n


def test_nt_xent_equals_the_loop_and_is_minimal_for_identical_views():
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(5, 7, generator=g, dtype=torch.double), torch.randn(5, 7, generator=g, dtype=torch.double)
    torch.testing.assert_close(nt_xent(z1, z2, 0.5), nt_xent_loop(z1, z2, 0.5), atol=1e-12, rtol=0)
    apart = torch.eye(5, 7, dtype=torch.double) * 10  # orthogonal images, two identical views each
    same = nt_xent(apart, apart, 0.5)
    assert same < nt_xent(apart, apart[torch.tensor([1, 2, 3, 4, 0])], 0.5)
    # the least it can be: the positive at similarity 1, the 2B - 2 others at 0
    floor = -torch.log(torch.exp(torch.tensor(2.0)) / (torch.exp(torch.tensor(2.0)) + 8)).double()
    torch.testing.assert_close(same, floor)
    with pytest.raises(ValueError, match="z1 and z2"):
        nt_xent(z1, z2[:3])


def test_unpatchify_inverts_patchify():
    x = images(3, c=3, side=8)
    pixels = patchify(x, 4)[..., :-2]
    assert torch.equal(unpatchify(pixels, 3, 4), x)


def test_views_are_random_crops_in_range_and_reproducible():
    x = images(6, side=12)
    a = augment(x, torch.Generator().manual_seed(1))
    assert a.shape == x.shape and a.min() >= -1 and a.max() <= 1
    assert torch.equal(a, augment(x, torch.Generator().manual_seed(1)))
    assert not torch.equal(a, augment(x, torch.Generator().manual_seed(2)))
    flat = torch.full((2, 1, 12, 12), 0.25)  # a flat image stays flat: crops and flips move nothing
    view = augment(flat, torch.Generator().manual_seed(3))
    assert torch.allclose(view, view[..., :1, :1].expand_as(view), atol=1e-6)


def test_corruption_changes_blocks_of_each_image_and_leaves_the_input_alone():
    x = images(5, c=3, side=16)
    kept = x.clone()
    out = corrupt(x, torch.Generator().manual_seed(0))
    assert torch.equal(x, kept)
    changed = (out != x).flatten(1).float().mean(1)
    assert bool((changed > 0).all()) and bool((changed < 1).all())
    assert torch.equal(out, corrupt(x, torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("backbone", ["vit", "tlb"])
def test_sit_outputs_and_every_parameter_gets_a_gradient(backbone):
    torch.manual_seed(0)
    model = SiT(channels=1, image_size=8, patch_size=4, dim=16, depth=1, num_heads=2, backbone=backbone,
                projection_dim=8, chunk_size=3, num_state=2)
    out = model(images(3))
    assert out.rotation.shape == (3, 4) and out.projection.shape == (3, 8)
    assert out.reconstruction.shape == (3, 1, 8, 8)
    assert out.features.shape == ((3, 2, 16) if backbone == "vit" else (3, 1, 16))
    # the rotation head reads the features the probe reads: SiT's first token, SiT + TLB's state mean
    torch.testing.assert_close(out.rotation, model.rotation_head(out.features[:, 0]))
    if backbone == "tlb":
        _, state = model.backbone(model.encoder(patchify(images(3), 4)))
        torch.testing.assert_close(out.features[:, 0], model.backbone.norm_state(state.memory).mean(1))
    losses = pretraining_losses(model, images(4), torch.Generator().manual_seed(0))
    assert set(losses) == {"reconstruction", "rotation", "contrastive", "loss"}
    losses["loss"].backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing


def test_the_uncertainty_weighting_starts_as_the_plain_sum_with_the_reconstruction_halved():
    torch.manual_seed(0)
    model = SiT(channels=1, image_size=8, patch_size=4, dim=16, depth=1, num_heads=2, projection_dim=8)
    losses = pretraining_losses(model, images(4), torch.Generator().manual_seed(0))
    expected = 0.5 * losses["reconstruction"] + losses["rotation"] + losses["contrastive"]
    torch.testing.assert_close(losses["loss"], expected)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="backbone"):
        SiT(1, 8, 4, 16, 1, 2, backbone="cnn")
    with pytest.raises(ValueError, match="patch_size"):
        SiT(1, 10, 4, 16, 1, 2)
    with pytest.raises(ValueError, match="images must be"):
        SiT(1, 8, 4, 16, 1, 2)(torch.zeros(2, 3, 8, 8))


def test_blocks_are_laid_one_by_one_until_their_area_reaches_the_share():
    """The vectorised union of noise (or replacement) blocks == laying them in a loop, as the authors do."""
    from chronomem import sit

    batch, side, share = 6, 12, 0.3
    fast = sit._until_covered(batch, side, share, torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(4)
    corner, size = sit._blocks(batch, sit.MAX_BLOCKS, side, g)
    target = sit._uniform(batch, 0.0, share, g) * side * side
    for i in range(batch):
        mask, covered = torch.zeros(side, side, dtype=torch.bool), 0
        for (top, left), (h, w) in zip(corner[i].tolist(), size[i].tolist(), strict=True):
            if covered >= target[i]:
                break
            mask[top : top + h, left : left + w] = True
            covered += h * w
        assert torch.equal(fast[i], mask)
    assert 0 < fast.float().mean() < share + 0.1


# ---- the ssl experiment ---------------------------------------------------------------------------------


def test_the_probe_reads_every_feature_vector_and_separates_separable_classes():
    from chronomem.experiments.ssl import probe

    g = torch.Generator().manual_seed(0)
    labels = torch.randint(3, (300,), generator=g)
    centres = torch.eye(3, 8) * 6
    x = centres[labels][:, None] + 0.3 * torch.randn(300, 1, 8, generator=g)
    assert probe(x[:200], labels[:200], x[200:], labels[200:], 3, epochs=30, lr=1e-2, seed=0) == 100.0
    noise = torch.randn(300, 1, 8, generator=g)  # a second vector with nothing in it: the mean keeps the first's
    both = torch.cat([x, noise], 1)
    assert probe(both[:200], labels[:200], both[200:], labels[200:], 3, epochs=30, lr=1e-2, seed=0) >= 95.0
    blind = probe(noise[:200], labels[:200], noise[200:], labels[200:], 3, epochs=30, lr=1e-2, seed=0)
    assert blind < 60.0


def test_ssl_runs_at_smoke_scale(tmp_path, monkeypatch):
    from chronomem.experiments import ssl
    from chronomem.experiments.base import run_experiment
    from chronomem.registry import get_experiment
    from chronomem.tasks import images
    from test_images import write_fashion_mnist

    write_fashion_mnist(tmp_path / "data", n_train=30, n_test=16)
    monkeypatch.setenv(images.ENV_DATA_DIR, str(tmp_path / "data"))
    result = run_experiment(get_experiment("ssl"), "smoke", tmp_path / "run", progress=False)
    steps = [f"step {p}" for p in ssl.SCALES["smoke"].probe_at]
    assert tuple(result["results"]) == ssl.MODELS
    for model in ssl.MODELS:
        assert list(result["results"][model]) == steps
        assert all(0.0 <= v <= 100.0 for v in result["results"][model].values())
        assert set(result["extra"]["runs"][f"{model}/seed0"]["losses"]) == {"reconstruction", "rotation",
                                                                             "contrastive", "loss"}
    assert result["claims"][0]["better"] == "sit-tlb" and result["chance"] == 10.0
    again = run_experiment(get_experiment("ssl"), "smoke", tmp_path / "again", progress=False)
    assert again["results"] == result["results"]  # the same seed, the same table
    with pytest.raises(ValueError, match="probe_at"):
        ssl.SSLScale(steps=4, batch_size=2, lr=1e-3, eval_examples=2, probe_at=(2, 3))
