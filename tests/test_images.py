"""Images as patch sequences: the CIFAR and IDX readers on small files written here, their errors,
patches in raster order, 2-D positions that transfer to a longer sequence (fixed sinusoids, or ViT's
learned table resized bilinearly, checked against a naive reference), the models at two resolutions,
and the resolution-transfer experiments at smoke scale."""

import gzip
import struct

import numpy as np
import pytest
import torch

from chronomem import encoders
from chronomem.cli import main
from chronomem.encoders import PatchEncoder
from chronomem.heads import Classifier, build_model
from chronomem.layers import sinusoid_from_positions
from chronomem.registry import get_model, get_task
from chronomem.tasks import images
from chronomem.tasks.images import DatasetError, ImageData, ImageTask, load_dataset, patchify, read_cifar, read_idx

torch.set_num_threads(1)

FMNIST = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@pytest.fixture(autouse=True)
def no_installed_data(monkeypatch, tmp_path):
    """Only the files a test writes count: neither the environment nor an installed dataset."""
    monkeypatch.delenv(images.ENV_DATA_DIR, raising=False)
    monkeypatch.setattr(images, "DEBIAN_FASHION_MNIST", str(tmp_path / "not-installed"))
    images._load.cache_clear()


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}i", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_fashion_mnist(directory, n_train=40, n_test=20, side=28, compress=True, seed=0):
    """Tiny IDX files in Fashion-MNIST's names; returns the arrays written."""
    rng = np.random.default_rng(seed)
    arrays = (rng.integers(0, 256, (n_train, side, side)), rng.integers(0, 10, n_train),
              rng.integers(0, 256, (n_test, side, side)), rng.integers(0, 10, n_test))
    directory.mkdir(parents=True, exist_ok=True)
    for name, array in zip(FMNIST, arrays, strict=True):
        raw = idx_bytes(array)
        if compress:
            (directory / f"{name}.gz").write_bytes(gzip.compress(raw))
        else:
            (directory / name).write_bytes(raw)
    return arrays


def cifar_records(images_, labels, coarse=None) -> bytes:
    """CIFAR's binary records: [coarse label] label, then the red, green, blue 32x32 planes row by row."""
    out = bytearray()
    for k, (image, label) in enumerate(zip(images_, labels, strict=True)):
        out += bytes([] if coarse is None else [coarse[k]]) + bytes([label]) + image.astype(np.uint8).tobytes()
    return bytes(out)


# ------------------------------------------------------------------------------------------------
# Readers
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [True, False])
def test_idx_reader_reads_what_was_written(tmp_path, compress):
    written = write_fashion_mnist(tmp_path, compress=compress)
    suffix = ".gz" if compress else ""
    np.testing.assert_array_equal(read_idx(tmp_path / f"{FMNIST[0]}{suffix}"), written[0])
    np.testing.assert_array_equal(read_idx(tmp_path / f"{FMNIST[3]}{suffix}"), written[3])
    data = load_dataset("fashion-mnist", tmp_path)
    assert data.train_images.shape == (40, 1, 28, 28) and data.test_labels.shape == (20,)
    np.testing.assert_array_equal(data.train_images[:, 0].numpy(), written[0])
    assert data.num_classes == 10 and data.name == "fashion-mnist"


def test_truncated_or_foreign_files_name_the_file(tmp_path):
    raw = idx_bytes(np.zeros((3, 4, 4)))
    cut = tmp_path / "cut-idx"
    cut.write_bytes(raw[:-5])
    with pytest.raises(DatasetError, match=r"cut-idx: truncated IDX file: shape \(3, 4, 4\) needs 48 bytes"):
        read_idx(cut)
    cut_gz = tmp_path / "cut.gz"
    cut_gz.write_bytes(gzip.compress(raw)[:-10])
    with pytest.raises(DatasetError, match="cut.gz: truncated or corrupt gzip"):
        read_idx(cut_gz)
    foreign = tmp_path / "foreign"
    foreign.write_bytes(b"PK\x03\x04 not idx")
    with pytest.raises(DatasetError, match="foreign: not an IDX file"):
        read_idx(foreign)
    cifar = tmp_path / "data_batch_1.bin"
    cifar.write_bytes(bytes(3073 * 2 - 1))
    with pytest.raises(DatasetError, match="data_batch_1.bin: truncated CIFAR file: 6145 bytes"):
        read_cifar(cifar)


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_cifar_reader_layout_and_search_path(tmp_path, monkeypatch, dataset):
    rng = np.random.default_rng(1)
    pictures = rng.integers(0, 256, (7, 3, 32, 32))
    labels = rng.integers(0, 100 if dataset == "cifar100" else 10, 7)
    coarse = rng.integers(0, 20, 7) if dataset == "cifar100" else None
    folder = tmp_path / ("cifar-100-binary" if dataset == "cifar100" else "cifar-10-batches-bin")  # as unpacked
    folder.mkdir()
    files = images.DATASETS[dataset].train_files + images.DATASETS[dataset].test_files
    for k, name in enumerate(files):  # train files hold the records rolled by k, so the order shows
        (folder / name).write_bytes(cifar_records(np.roll(pictures, k, 0), np.roll(labels, k), coarse))
    got_images, got_labels = read_cifar(folder / files[0], 2 if dataset == "cifar100" else 1)
    np.testing.assert_array_equal(got_images, pictures)  # [N, 3, 32, 32]: red, green, blue planes
    np.testing.assert_array_equal(got_labels, labels)  # CIFAR-100: the fine label
    monkeypatch.setenv(images.ENV_DATA_DIR, str(tmp_path))  # found through the environment, in its subdirectory
    data = load_dataset(dataset)
    n_train = 7 * len(images.DATASETS[dataset].train_files)
    assert data.train_images.shape == (n_train, 3, 32, 32) and data.test_images.shape == (7, 3, 32, 32)
    if dataset == "cifar10":  # the five batches in order
        np.testing.assert_array_equal(data.train_images[7:14].numpy(), np.roll(pictures, 1, 0))
    assert data.num_classes == (100 if dataset == "cifar100" else 10)


def test_missing_data_says_how_to_get_it(tmp_path):
    with pytest.raises(DatasetError, match="no fashion-mnist data found .*apt-get install dataset-fashion-mnist"):
        load_dataset("fashion-mnist", tmp_path / "empty")
    with pytest.raises(DatasetError, match="cifar-10-binary.tar.gz"):
        load_dataset("cifar10", tmp_path)
    write_fashion_mnist(tmp_path / "partial")
    (tmp_path / "partial" / f"{FMNIST[2]}.gz").unlink()
    with pytest.raises(DatasetError, match=f"incomplete: missing {FMNIST[2]}"):
        load_dataset("fashion-mnist", tmp_path / "partial")
    with pytest.raises(ValueError, match="dataset must be one of"):
        load_dataset("mnist", tmp_path)
    write_fashion_mnist(tmp_path / "odd")
    (tmp_path / "odd" / f"{FMNIST[1]}.gz").write_bytes(gzip.compress(idx_bytes(np.zeros(39))))  # 40 images
    with pytest.raises(DatasetError, match=r"images \(40, 28, 28\) and labels \(39,\) do not match"):
        load_dataset("fashion-mnist", tmp_path / "odd")


def test_the_command_line_prints_one_line_not_a_traceback(tmp_path, capsys):
    code = main(["train", "--model", "vit", "--task", "images", "--task-opt", f"data_dir={tmp_path / 'none'}",
                 "--steps", "1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "no fashion-mnist data found" in err and "apt-get install dataset-fashion-mnist" in err


def test_run_takes_a_data_dir(tmp_path, capsys):
    empty = tmp_path / "my-data"
    code = main(["run", "resolution-transfer", "--scale", "smoke", "--data-dir", str(empty), "--out",
                 str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and f"looked in {empty}" in err


def test_image_data_rejects_bad_shapes_and_channels():
    good = dict(train_images=torch.zeros(4, 1, 8, 8, dtype=torch.uint8), train_labels=torch.zeros(4, dtype=torch.long),
                test_images=torch.zeros(2, 1, 8, 8, dtype=torch.uint8), test_labels=torch.zeros(2, dtype=torch.long),
                num_classes=10)
    ImageData(**good)
    bad = [
        (dict(train_images=torch.zeros(4, 2, 8, 8, dtype=torch.uint8)), "1 or 3 channels"),
        (dict(train_images=torch.zeros(4, 1, 8, 6, dtype=torch.uint8)), r"square images .* got shape \(4, 1, 8, 6\)"),
        (dict(train_images=torch.zeros(4, 8, 8, dtype=torch.uint8)), r"uint8 tensor \[N, C, H, W\]"),
        (dict(train_images=torch.zeros(4, 1, 8, 8)), "got dtype torch.float32"),
        (dict(test_images=torch.zeros(2, 3, 8, 8, dtype=torch.uint8)), "channels and size of train_images"),
        (dict(train_labels=torch.zeros(3, dtype=torch.long)), r"train_labels must be integer labels \[4\]"),
        (dict(test_labels=torch.full((2,), 10)), r"test_labels must lie in \[0, 10\)"),
    ]
    for change, message in bad:
        with pytest.raises(ValueError, match=message):
            ImageData(**{**good, **change})


# ------------------------------------------------------------------------------------------------
# Patches, positions, the task
# ------------------------------------------------------------------------------------------------


def test_patches_are_raster_ordered_with_their_centres():
    x = torch.randn(2, 3, 6, 4)
    p = patchify(x, 2)  # 3 rows x 2 columns of patches
    assert p.shape == (2, 6, 3 * 4 + 2)
    for n in range(6):
        r, c = divmod(n, 2)  # raster order: row by row
        torch.testing.assert_close(p[:, n, :12], x[:, :, 2 * r:2 * r + 2, 2 * c:2 * c + 2].reshape(2, 12))
        torch.testing.assert_close(p[:, n, 12:], torch.tensor([(r + 0.5) / 3, (c + 0.5) / 2]).expand(2, 2))
    with pytest.raises(ValueError, match=r"patch_size=4 must divide the image height and width, got 6x4"):
        patchify(x, 4)


def test_patch_size_must_divide_the_resolution():
    data = tiny_data()
    with pytest.raises(ValueError, match="patch_size=3 must divide resolution=8"):
        ImageTask(data=data, patch_size=3)
    with pytest.raises(ValueError, match="patch_size=4 must divide train_resolution=10"):
        ImageTask(data=data, patch_size=4, train_resolution=10)


def test_positions_of_a_longer_sequence_fall_where_the_image_was_trained():
    """At 1x the codes are the 2-D sinusoids of the integer patch row and column; at 2x (4x the patches)
    each patch's code is nearest to the code of the 1x patch covering the same part of the image, and
    the 2x codes span the same range (none beyond the trained grid)."""
    grid, dim = 7, 32
    enc = PatchEncoder(channels=1, patch_size=4, dim=dim, grid=grid)
    base = patchify(torch.zeros(1, 1, 28, 28), 4)[0, :, -2:]
    code = enc.positions(base)  # [49, dim]
    rows, cols = torch.arange(49) // grid, torch.arange(49) % grid
    want = torch.cat([sinusoid_from_positions(rows.float(), dim // 2),
                      sinusoid_from_positions(cols.float(), dim // 2)], -1)
    torch.testing.assert_close(code, want)
    long = enc.positions(patchify(torch.zeros(1, 1, 56, 56), 4)[0, :, -2:])  # [196, dim]
    nearest = torch.cdist(long, code).argmin(1)
    r2, c2 = torch.arange(196) // 14, torch.arange(196) % 14
    assert torch.equal(nearest, (r2 // 2) * grid + c2 // 2)


def test_patch_encoder_checks_its_input():
    enc = PatchEncoder(channels=3, patch_size=2, dim=8, grid=4)
    x = patchify(torch.zeros(2, 3, 8, 8), 2)
    assert enc(x).shape == (2, 16, 8)
    with pytest.raises(ValueError, match=r"obs must have .* 14"):  # grey patches given to an RGB encoder
        enc(patchify(torch.zeros(2, 1, 8, 8), 2))
    with pytest.raises(ValueError, match=r"centre as \(row, column\) fractions"):
        enc(torch.cat([x[..., :-2], x[..., -2:] * 8], -1))
    with pytest.raises(ValueError, match="multiple of 4"):
        PatchEncoder(channels=3, patch_size=2, dim=6, grid=4)
    with pytest.raises(ValueError, match="an encoder embeds feature inputs"):
        Classifier(get_model("vit")(dim=8, depth=1, num_heads=2), 8, 10, vocab_size=5, encoder=enc)


def test_sinusoid_positions_are_still_the_default():
    """Without ``positions`` the encoder is the one resolution-transfer's results were made with: a
    linear map of the pixels plus the 2-D sinusoids of the patch's place in the training grid, and no
    other parameter (its checkpoints load unchanged)."""
    torch.manual_seed(0)
    enc = PatchEncoder(channels=1, patch_size=2, dim=8, grid=3)
    assert enc.position_scheme == "sinusoid" and set(enc.state_dict()) == {"linear.weight", "linear.bias"}
    for side in (6, 12):  # 1x and 2x
        x = patchify(torch.randn(2, 1, side, side), 2)
        place = x[..., -2:] * 3 - 0.5  # centres in patches of the training grid
        want = enc.linear(x[..., :4]) + torch.cat([sinusoid_from_positions(place[..., 0], 4),
                                                   sinusoid_from_positions(place[..., 1], 4)], -1)
        torch.testing.assert_close(enc(x), want)


def learned_encoder(grid=3, dim=6, seed=0) -> PatchEncoder:
    """A learned-position encoder with a random table (far from its N(0, 0.02) start, so that errors show)."""
    torch.manual_seed(seed)
    enc = PatchEncoder(channels=1, patch_size=2, dim=dim, grid=grid, positions="learned")
    with torch.no_grad():
        enc.table.copy_(torch.randn(grid, grid, dim))
    return enc


def bilinear_reference(table: torch.Tensor, side: int) -> torch.Tensor:
    """``table [g, g, D]`` resized to ``[side, side, D]`` one output entry at a time, with the
    align_corners=False convention: output row i reads input row ``(i + 0.5) * g / side - 0.5`` (clamped
    at 0, the first entry's centre), the weighted mean of the two rows around it; columns likewise."""
    g = table.shape[0]

    def source(i):  # (lower neighbour, upper neighbour, weight of the upper one)
        at = max((i + 0.5) * g / side - 0.5, 0.0)
        low = min(int(at), g - 1)
        return low, min(low + 1, g - 1), at - low

    out = torch.empty(side, side, table.shape[2], dtype=table.dtype)
    for i in range(side):
        r0, r1, wr = source(i)
        for j in range(side):
            c0, c1, wc = source(j)
            out[i, j] = ((1 - wr) * (1 - wc) * table[r0, c0] + (1 - wr) * wc * table[r0, c1]
                         + wr * (1 - wc) * table[r1, c0] + wr * wc * table[r1, c1])
    return out


def test_learned_positions_at_the_training_grid_are_the_table(monkeypatch):
    enc = learned_encoder(grid=3, dim=6)  # any width: no sin/cos halves to split
    assert enc.table.shape == (3, 3, 6) and enc.table_at(3) is enc.table  # used as is, not resampled

    def no_resampling(*args, **kwargs):
        raise AssertionError("the table was interpolated at the training grid")

    monkeypatch.setattr(encoders.F, "interpolate", no_resampling)
    x = patchify(torch.randn(2, 1, 6, 6), 2)  # 3 x 3 patches, raster order
    with torch.no_grad():
        torch.testing.assert_close(enc(x), enc.linear(x[..., :4]) + enc.table.reshape(9, 6))
        shuffled = x[:, torch.randperm(9)]  # each patch takes the entry of its own centre, in any order
        torch.testing.assert_close(enc(shuffled), enc.linear(shuffled[..., :4])
                                   + enc.table[(shuffled[..., 4] * 3).long(), (shuffled[..., 5] * 3).long()])


@pytest.mark.parametrize("side", [6, 12, 5, 2])  # 2x, 4x, a factor that is no integer, a smaller grid
def test_learned_positions_are_resized_bilinearly(side):
    enc = learned_encoder(grid=3, dim=6)
    with torch.no_grad():
        want = bilinear_reference(enc.table, side)
        torch.testing.assert_close(enc.table_at(side), want)
        x = patchify(torch.randn(2, 1, 2 * side, 2 * side), 2)  # side x side patches
        torch.testing.assert_close(enc(x), enc.linear(x[..., :4]) + want.reshape(side * side, 6))


def test_the_reference_is_not_the_corner_aligned_resize():
    # The check can fail: the corner-aligned convention (the JAX ViT's scipy zoom) differs from ours at 2x.
    table = learned_encoder().table.detach()
    aligned = torch.nn.functional.interpolate(table.permute(2, 0, 1)[None], size=(6, 6), mode="bilinear",
                                              align_corners=True)[0].permute(1, 2, 0)
    assert not torch.allclose(aligned, bilinear_reference(table, 6), atol=1e-3)


@pytest.mark.parametrize("side", [3, 6])
def test_gradients_reach_the_learned_table(side):
    enc = learned_encoder(grid=3, dim=6)
    x = patchify(torch.randn(2, 1, 2 * side, 2 * side), 2)
    (enc(x) * torch.randn(2, side * side, 6)).sum().backward()
    assert enc.table.grad is not None and bool((enc.table.grad != 0).all())  # every entry is read at 1x and 2x


def test_learned_positions_start_as_vits():
    torch.manual_seed(0)
    table = PatchEncoder(channels=1, patch_size=2, dim=64, grid=8, positions="learned").table.detach()
    assert abs(float(table.mean())) < 0.002 and abs(float(table.std()) - 0.02) < 0.001  # N(0, 0.02)


def test_bad_positions_name_the_argument_and_the_choices():
    with pytest.raises(ValueError, match=r"positions must be one of \('sinusoid', 'learned'\), got 'bogus'"):
        PatchEncoder(channels=1, patch_size=2, dim=8, grid=3, positions="bogus")
    task = ImageTask(data=tiny_data(), resolution=8, patch_size=2)
    with pytest.raises(ValueError, match=r"patch_positions must be one of \('sinusoid', 'learned'\), got 'fixed'"):
        build_model("vit", task, dim=8, num_heads=2, patch_positions="fixed")
    with pytest.raises(ValueError, match="patch_positions='learned' .* has no patches"):
        build_model("transformer", get_task("copy")(), dim=8, num_heads=2, patch_positions="learned")
    enc = learned_encoder()
    with pytest.raises(ValueError, match="square grid .* got 8 patches"):
        enc(patchify(torch.randn(1, 1, 8, 4), 2))
    PatchEncoder(channels=1, patch_size=2, dim=6, grid=3, positions="learned")  # no multiple of 4 needed


def tiny_data(n_train=24, n_test=8, channels=1, side=8, seed=0) -> ImageData:
    g = torch.Generator().manual_seed(seed)
    return ImageData(torch.randint(0, 256, (n_train, channels, side, side), generator=g, dtype=torch.uint8),
                     torch.randint(0, 10, (n_train,), generator=g),
                     torch.randint(0, 256, (n_test, channels, side, side), generator=g, dtype=torch.uint8),
                     torch.randint(0, 10, (n_test,), generator=g), num_classes=10, name="tiny")


def test_task_splits_resizes_and_keeps_its_training_grid():
    task = ImageTask(data=tiny_data(), resolution=8, patch_size=2, num_val=4)
    assert (task.length, task.input_dim, task.patches) == (16, 6, {"channels": 1, "patch_size": 2, "grid": 4})
    batch = task.sample(5, torch.Generator().manual_seed(0))
    assert batch.inputs.shape == (5, 16, 6) and batch.mask is None and batch.targets.shape == (5,)
    assert batch.inputs[..., :4].abs().max() <= 1.0  # pixels in [-1, 1]
    test = list(task.eval_batches(3, 100))  # the whole test set, in file order
    assert [len(b.targets) for b in test] == [3, 3, 2]
    assert torch.equal(torch.cat([b.targets for b in test]), task.data.test_labels)
    assert torch.equal(torch.cat([b.targets for b in task.eval_batches(8, 100, "val")]), task.data.train_labels[-4:])
    twice = task.with_resolution(16)
    assert twice.length == 64 and twice.patches == task.patches and twice.data is task.data
    b2 = next(twice.eval_batches(8, 8))
    assert b2.inputs.shape == (8, 64, 6)
    assert get_task("images") is ImageTask


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------

ROWS = {
    "vit": ("vit", dict(depth=2)),
    "tlb": ("tlb", dict(depth=2, self_per_cross=1, chunk_size=4, num_state=2)),
    "tlb-no-top-down": ("tlb", dict(depth=2, self_per_cross=1, chunk_size=4, num_state=2, top_down=False)),
    "blrp": ("blrp", dict(depth=2, segment_size=4, latent_size=4)),
}


@pytest.mark.parametrize("positions", ["sinusoid", "learned"])
@pytest.mark.parametrize("row", sorted(ROWS))
def test_models_read_images_at_two_resolutions(row, positions):
    task = ImageTask(data=tiny_data(channels=3), resolution=8, patch_size=2)
    model, options = ROWS[row]
    torch.manual_seed(0)
    net = build_model(model, task, dim=16, num_heads=2, ff_mult=2.0, patch_positions=positions, **options).eval()
    assert isinstance(net.embed, PatchEncoder) and net.embed.grid == 4 and net.embed.position_scheme == positions
    for resolution in (8, 16):
        batch = next(task.with_resolution(resolution).eval_batches(4, 4))
        logits, _ = net(batch.inputs)
        assert logits.shape == (4, 10) and torch.isfinite(logits).all()
    grey = ImageTask(data=tiny_data(channels=1), resolution=8, patch_size=2)
    with pytest.raises(ValueError, match=r"inputs must have .* 14"):  # grey patches to an RGB model
        net(next(grey.eval_batches(2, 2)).inputs)


def test_vit_has_no_position_encoding_of_its_own():
    """The ViT's positions come from the patch encoder: permuting its input tokens permutes its outputs
    (the Transformer, which adds 1-D positions, does not)."""
    torch.manual_seed(0)
    vit = get_model("vit")(dim=8, depth=1, num_heads=2).eval()
    transformer = get_model("transformer")(dim=8, depth=1, num_heads=2, causal=False).eval()
    x, perm = torch.randn(2, 5, 8), torch.tensor([3, 0, 4, 1, 2])
    torch.testing.assert_close(vit(x[:, perm])[0], vit(x)[0][:, perm])
    transformer.load_state_dict(vit.state_dict())
    assert not torch.allclose(transformer(x[:, perm])[0], transformer(x)[0][:, perm])


# ------------------------------------------------------------------------------------------------
# The experiment
# ------------------------------------------------------------------------------------------------


def test_resolution_transfer_runs_at_smoke_scale(tmp_path, monkeypatch):
    from chronomem.experiments import images as experiment
    from chronomem.experiments.base import run_experiment
    from chronomem.registry import get_experiment
    from chronomem.train import evaluate, load_run

    with pytest.raises(DatasetError, match="apt-get install dataset-fashion-mnist"):  # no data: how to get it
        run_experiment(get_experiment("resolution-transfer"), "smoke", tmp_path / "none", progress=False)
    write_fashion_mnist(tmp_path / "data", n_train=30, n_test=16)
    monkeypatch.setenv(images.ENV_DATA_DIR, str(tmp_path / "data"))
    result = run_experiment(get_experiment("resolution-transfer"), "smoke", tmp_path / "run", progress=False)
    assert tuple(result["results"]) == experiment.MODELS
    for row in result["results"].values():
        assert set(row) == {"1x", "2x", experiment.KEPT} and all(0.0 <= row[k] <= 100.0 for k in ("1x", "2x"))
    assert result["paper"]["tlb-no-top-down"] == {"1x": 76.04, "2x": 49.22, experiment.KEPT: 64.7}
    assert len(result["extra"]["runs"]) == 4 and result["config"]["test_resolutions"] == [8, 16]
    assert result["config"]["models"]["tlb-no-top-down"][1]["top_down"] is False
    assert "different data" in (tmp_path / "run" / "report.md").read_text().lower()  # said beside the table
    # A run rebuilds from its saved spec (the task's describe()) and gives its test accuracy again.
    model, task, spec = load_run(tmp_path / "run" / "fashion-mnist" / "vit" / "seed0", device="cpu")
    assert spec["task_options"]["resolution"] == 8 and task.patches["grid"] == 2  # 8 / patch 4
    assert evaluate(model, task, 50, 16)["accuracy"] == result["extra"]["per_seed"]["fashion-mnist/vit"]["1x"][0]


def test_the_learned_positions_experiment_gives_resolution_transfers_table(tmp_path, monkeypatch):
    """resolution-transfer-learned: the same rows, columns, paper numbers and claims as
    resolution-transfer, every model's patch encoder with ViT's learned table."""
    from chronomem.experiments.base import run_experiment
    from chronomem.registry import get_experiment
    from chronomem.train import evaluate, load_run

    write_fashion_mnist(tmp_path / "data", n_train=30, n_test=16)
    monkeypatch.setenv(images.ENV_DATA_DIR, str(tmp_path / "data"))
    base, learned = (get_experiment(name) for name in ("resolution-transfer", "resolution-transfer-learned"))
    assert learned.claims == base.claims and learned.paper == base.paper and "decisive test" in learned.notes
    got = {e.name: run_experiment(e, "smoke", tmp_path / e.name, progress=False) for e in (base, learned)}
    sinusoid, table = got["resolution-transfer"], got["resolution-transfer-learned"]
    def columns(run):
        return {model: set(row) for model, row in run["results"].items()}

    assert columns(table) == columns(sinusoid)
    assert table["paper"] == sinusoid["paper"] and set(table["extra"]["runs"]) == set(sinusoid["extra"]["runs"])
    assert table["config"].pop("patch_positions") == "learned" and "patch_positions" not in sinusoid["config"]
    for row, (model, options) in table["config"]["models"].items():
        assert options.pop("patch_positions") == "learned"  # every row alike, nothing else changed
        assert [model, options] == list(sinusoid["config"]["models"][row])
    assert {k: v for k, v in table["config"].items() if k != "models"} == \
        {k: v for k, v in sinusoid["config"].items() if k != "models"}
    # A run rebuilds with its learned table from the saved spec and gives its test accuracy again.
    net, task, _ = load_run(tmp_path / learned.name / "fashion-mnist" / "blrp" / "seed0", device="cpu")
    assert net.embed.position_scheme == "learned" and net.embed.table.shape == (2, 2, 16)
    assert evaluate(net, task, 50, 16)["accuracy"] == table["extra"]["per_seed"]["fashion-mnist/blrp"]["1x"][0]


def test_paper_scale_has_both_cifar_datasets_side_by_side():
    from chronomem.experiments import images as experiment

    paper = experiment.SCALES["paper"]
    table = experiment.paper_table(paper)
    assert table["vit"]["cifar10 1x"] == 93.75 and table["blrp"]["cifar100 2x"] == 61.06
    assert "cifar10 1x" not in table["tlb-no-top-down"]  # the ablation is CIFAR-100 only (paper 003 Table 2)
    assert (paper.resolution, paper.patch_size, paper.factors, paper.dim, paper.lr) == (64, 4, (1, 2), 368, 4e-4)
    assert experiment.model_options("tlb", paper)[1]["chunk_size"] == 32
