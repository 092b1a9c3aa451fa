"""Images as patch sequences: the CIFAR and IDX readers on small files written here, their errors,
patches in raster order, 2-D positions that transfer to a longer sequence, the models at two
resolutions, and the resolution-transfer experiment at smoke scale."""

import gzip
import struct

import numpy as np
import pytest
import torch

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


@pytest.mark.parametrize("row", sorted(ROWS))
def test_models_read_images_at_two_resolutions(row):
    task = ImageTask(data=tiny_data(channels=3), resolution=8, patch_size=2)
    model, options = ROWS[row]
    torch.manual_seed(0)
    net = build_model(model, task, dim=16, num_heads=2, ff_mult=2.0, **options).eval()
    assert isinstance(net.embed, PatchEncoder) and net.embed.grid == 4
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


def test_paper_scale_has_both_cifar_datasets_side_by_side():
    from chronomem.experiments import images as experiment

    paper = experiment.SCALES["paper"]
    table = experiment.paper_table(paper)
    assert table["vit"]["cifar10 1x"] == 93.75 and table["blrp"]["cifar100 2x"] == 61.06
    assert "cifar10 1x" not in table["tlb-no-top-down"]  # the ablation is CIFAR-100 only (paper 003 Table 2)
    assert (paper.resolution, paper.patch_size, paper.factors, paper.dim, paper.lr) == (64, 4, (1, 2), 368, 4e-4)
    assert experiment.model_options("tlb", paper)[1]["chunk_size"] == 32
