"""Images as sequences of patches (paper 002 Sec. 4 and Table 1, paper 003 Sec. 4.1 and Tables 1-2).

Both papers classify CIFAR-10/100 images "split into patches of size 4x4 and fed in raster order",
train at 64x64 (CIFAR's 32x32 upsampled) and test the same models at 128x128, where the sequence is
4x longer. ``ImageTask`` is that task for any resolution and patch size:

* An image is resized to ``resolution`` x ``resolution`` (bilinear, as an upsampling of CIFAR must be
  done somehow; the papers do not say how; antialiased when it shrinks), its pixels scaled to
  [-1, 1], and cut into ``patch_size`` x ``patch_size`` patches in raster order (row by row).
* Each step of the sequence is one patch, ``[B, N, C * p * p + 2]``: its pixels (channel, row,
  column order) followed by the image coordinates of its centre, (row, column) as fractions of the
  image height and width. The model's ``chronomem.encoders.PatchEncoder`` embeds the pixels and
  turns the centre into a 2-D sinusoid measured in patches of the *training* grid, so a test image of
  another resolution is placed where the training images were (our choice of position encoding;
  docs/images.md says why). ``task.patches`` tells ``chronomem.heads.build_model`` to use it.
* ``with_resolution(r)`` is the same data at another resolution (the transfer test): the model built
  for the training task reads it unchanged.

Data, real and offline (``load_dataset``):

* Fashion-MNIST (Xiao et al. 2017; 60,000 / 10,000 grey 28x28 photographs of clothing, 10 classes):
  the IDX files ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
  ``t10k-labels-idx1-ubyte``, gzipped or not. Debian and Ubuntu install them with
  ``apt-get install dataset-fashion-mnist`` under ``/usr/share/datasets/fashion-mnist``, the default.
* CIFAR-10 / CIFAR-100 (Krizhevsky 2009) in the "binary version" of the official archives
  (``cifar-10-binary.tar.gz``: ``data_batch_1.bin`` .. ``data_batch_5.bin``, ``test_batch.bin``, records
  of 1 label byte + 3,072 pixel bytes; ``cifar-100-binary.tar.gz``: ``train.bin``, ``test.bin``,
  records of a coarse and a fine label byte + 3,072 pixel bytes; we use the 100 fine labels). The
  pixels are the red, green and blue 32x32 planes, each row by row.

Where the files are looked for: ``data_dir`` (and its sub-directory named as the archive unpacks,
``cifar-10-batches-bin`` / ``cifar-100-binary``), else ``$CHRONOMEM_DATA_DIR`` (the same), else the
Debian path for Fashion-MNIST. Missing or malformed data raises ``DatasetError`` (a ValueError, so the
command line prints one line) naming the file and saying how to get the data.

Splits: ``test`` is the official test set, in file order; ``val`` the last ``num_val`` training
images (default a tenth, at most 5,000); ``train`` the others, drawn uniformly with replacement per
batch. No augmentation (the papers name none).
"""

from __future__ import annotations

import functools
import gzip
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from chronomem.checks import check_positive
from chronomem.registry import register_task
from chronomem.tasks.base import Batch, Task

ENV_DATA_DIR = "CHRONOMEM_DATA_DIR"
DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"  # apt-get install dataset-fashion-mnist


@dataclass(frozen=True)
class DatasetInfo:
    classes: int
    channels: int
    side: int  # native resolution (square images)
    subdir: str  # the directory the official archive unpacks into ("" : none)
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    how_to_get: str


DATASETS = {
    "fashion-mnist": DatasetInfo(
        10, 1, 28, "", ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
        ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
        "on Debian or Ubuntu: apt-get install dataset-fashion-mnist (files under "
        f"{DEBIAN_FASHION_MNIST}); or download the four IDX files from "
        "https://github.com/zalandoresearch/fashion-mnist and pass their directory as data_dir "
        f"(--task-opt data_dir=DIR, or ${ENV_DATA_DIR} / --data-dir for chronomem run)"),
    "cifar10": DatasetInfo(
        10, 3, 32, "cifar-10-batches-bin", tuple(f"data_batch_{i}.bin" for i in range(1, 6)), ("test_batch.bin",),
        "download cifar-10-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html, unpack it and pass "
        f"the directory as data_dir (--task-opt data_dir=DIR, or ${ENV_DATA_DIR} / --data-dir for chronomem run)"),
    "cifar100": DatasetInfo(
        100, 3, 32, "cifar-100-binary", ("train.bin",), ("test.bin",),
        "download cifar-100-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html, unpack it and pass "
        f"the directory as data_dir (--task-opt data_dir=DIR, or ${ENV_DATA_DIR} / --data-dir for chronomem run)"),
}
CIFAR_PIXELS = 3 * 32 * 32


class DatasetError(ValueError):
    """Image data missing or malformed; the message names the file and how to get the data."""


# --------------------------------------------------------------------------------------------
# Readers of the official file formats
# --------------------------------------------------------------------------------------------


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped if it is gzip (by its magic number, whatever its name)."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (EOFError, OSError) as err:  # a cut gzip stream
            raise DatasetError(f"{path}: truncated or corrupt gzip file ({err})") from None
    return raw


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX file (LeCun's MNIST format, also Fashion-MNIST's) of unsigned bytes as a uint8 array:
    magic ``0x00 0x00 0x08 ndim``, then ``ndim`` big-endian int32 sizes, then the data."""
    data = _read_bytes(Path(path))
    if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] != 0x08:
        raise DatasetError(f"{path}: not an IDX file of unsigned bytes (expected the magic 00 00 08 ndim, got "
                           f"{data[:4].hex(' ') or 'an empty file'})")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DatasetError(f"{path}: truncated IDX header ({len(data)} bytes, the header needs {header})")
    shape = tuple(int(v) for v in np.frombuffer(data, dtype=">i4", count=ndim, offset=4))
    size = int(np.prod(shape))
    if len(data) - header != size:
        raise DatasetError(f"{path}: truncated IDX file: shape {shape} needs {size} bytes of data, the file holds "
                           f"{len(data) - header}")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def read_cifar(path: str | Path, label_bytes: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """A CIFAR binary file -> ``(images uint8 [N, 3, 32, 32], labels int64 [N])``. A record is
    ``label_bytes`` label bytes (CIFAR-10: 1; CIFAR-100: 2, coarse then fine; the last is returned)
    followed by 3,072 pixel bytes (red, green, blue planes of 32 rows of 32)."""
    data = _read_bytes(Path(path))
    record = label_bytes + CIFAR_PIXELS
    if not data or len(data) % record:
        raise DatasetError(f"{path}: truncated CIFAR file: {len(data)} bytes is not a positive multiple of the "
                           f"{record}-byte record ({label_bytes} label byte(s) + {CIFAR_PIXELS} pixels)")
    rows = np.frombuffer(data, dtype=np.uint8).reshape(-1, record)
    return rows[:, label_bytes:].reshape(-1, 3, 32, 32), rows[:, label_bytes - 1].astype(np.int64)


# --------------------------------------------------------------------------------------------
# A dataset in memory
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageData:
    """Images ``uint8 [N, C, H, W]`` (square) and labels ``[N]`` of a training and a test set."""

    train_images: Tensor
    train_labels: Tensor
    test_images: Tensor
    test_labels: Tensor
    num_classes: int
    name: str = "images"

    def __post_init__(self):
        channels = None
        for split in ("train", "test"):
            images, labels = getattr(self, f"{split}_images"), getattr(self, f"{split}_labels")
            if not isinstance(images, Tensor) or images.dtype != torch.uint8 or images.dim() != 4:
                what = f"dtype {images.dtype}, shape {tuple(images.shape)}" if isinstance(images, Tensor) \
                    else type(images).__name__
                raise ValueError(f"{split}_images must be a uint8 tensor [N, C, H, W], got {what}")
            n, c, h, w = images.shape
            if c not in (1, 3) or h != w or n == 0:
                raise ValueError(f"{split}_images must hold N > 0 square images with 1 or 3 channels [N, C, H, H], "
                                 f"got shape {tuple(images.shape)}")
            if channels is not None and (c, h) != channels:
                raise ValueError(f"test_images must have the channels and size of train_images {channels}, got "
                                 f"{(c, h)}")
            channels = (c, h)
            if not isinstance(labels, Tensor) or labels.shape != (n,) or labels.is_floating_point():
                shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
                raise ValueError(f"{split}_labels must be integer labels [{n}], got {shape}")
            if bool(((labels < 0) | (labels >= self.num_classes)).any()):
                raise ValueError(f"{split}_labels must lie in [0, {self.num_classes}), got "
                                 f"[{int(labels.min())}, {int(labels.max())}]")

    @property
    def channels(self) -> int:
        return self.train_images.shape[1]

    @property
    def side(self) -> int:
        return self.train_images.shape[2]


def data_dirs(data_dir: str | Path | None, dataset: str) -> list[Path]:
    """Where ``dataset``'s files are looked for, in order (module docstring)."""
    info = DATASETS[dataset]
    roots = [Path(data_dir)] if data_dir is not None else []
    if os.environ.get(ENV_DATA_DIR):
        roots.append(Path(os.environ[ENV_DATA_DIR]))
    if dataset == "fashion-mnist":
        roots.append(Path(DEBIAN_FASHION_MNIST))
    dirs = []
    for root in roots:
        dirs += [root / info.subdir, root] if info.subdir else [root, root / dataset]
    return dirs


def _find(directory: Path, name: str) -> Path | None:
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def load_dataset(dataset: str, data_dir: str | Path | None = None) -> ImageData:
    """``dataset`` (``"fashion-mnist"``, ``"cifar10"``, ``"cifar100"``) from the first directory of
    ``data_dirs`` that holds any of its files; ``DatasetError`` if none does or a file is missing or
    malformed."""
    if dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {tuple(DATASETS)}, got {dataset!r}")
    info = DATASETS[dataset]
    names = (*info.train_files, *info.test_files)
    searched = data_dirs(data_dir, dataset)
    for directory in searched:
        found = {name: _find(directory, name) for name in names}
        if any(found.values()):
            missing = [name for name, path in found.items() if path is None]
            if missing:
                raise DatasetError(f"{dataset} in {directory} is incomplete: missing {', '.join(missing)} "
                                   f"(or .gz); to get it: {info.how_to_get}")
            return _load(dataset, tuple(str(found[name]) for name in names))
    where = ", ".join(str(d) for d in searched) or "(no directory: give data_dir)"
    raise DatasetError(f"no {dataset} data found (looked in {where}); to get it: {info.how_to_get}")


@functools.lru_cache(maxsize=4)  # the training task and its other resolutions share one copy
def _load(dataset: str, paths: tuple[str, ...]) -> ImageData:
    info = DATASETS[dataset]
    n_train = len(info.train_files)
    if dataset == "fashion-mnist":
        arrays = [read_idx(p) for p in paths]
        for images, labels, split in ((arrays[0], arrays[1], "train"), (arrays[2], arrays[3], "t10k")):
            if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
                raise DatasetError(f"{dataset} {split}: images {images.shape} and labels {labels.shape} do not match "
                                   "([N, 28, 28] and [N])")
        parts = [(arrays[0][:, None], arrays[1]), (arrays[2][:, None], arrays[3])]
    else:
        label_bytes = 2 if dataset == "cifar100" else 1
        read = [read_cifar(p, label_bytes) for p in paths]
        parts = [tuple(np.concatenate(a) for a in zip(*read[:n_train], strict=True)),
                 tuple(np.concatenate(a) for a in zip(*read[n_train:], strict=True))]
    # np.array: writable copies (torch does not take read-only buffers)
    tensors = [(torch.from_numpy(np.array(x)), torch.from_numpy(y.astype(np.int64))) for x, y in parts]
    try:
        return ImageData(*tensors[0], *tensors[1], num_classes=info.classes, name=dataset)
    except ValueError as err:
        raise DatasetError(f"{dataset} ({paths[0]} ...): {err}") from None


# --------------------------------------------------------------------------------------------
# Patches
# --------------------------------------------------------------------------------------------


def resize(images: Tensor, resolution: int) -> Tensor:
    """uint8 ``[B, C, H, H]`` -> float ``[B, C, r, r]`` in [-1, 1]: bilinear (antialiased when shrinking)."""
    x = images.float() / 127.5 - 1.0
    if x.shape[-1] == resolution:
        return x
    return F.interpolate(x, size=(resolution, resolution), mode="bilinear", align_corners=False,
                         antialias=resolution < x.shape[-1])


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """``[B, C, H, W]`` -> ``[B, (H/p) * (W/p), C * p * p + 2]``: raster-ordered patches (row by row), each
    its pixels (channel, row, column) then its centre's (row, column) as fractions of the image."""
    if not isinstance(images, Tensor) or images.dim() != 4:
        raise ValueError(f"images must be a tensor [B, C, H, W], got "
                         f"{tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__}")
    check_positive(patch_size, "patch_size")
    b, c, h, w = images.shape
    if h % patch_size or w % patch_size:
        raise ValueError(f"patch_size={patch_size} must divide the image height and width, got {h}x{w}")
    gh, gw = h // patch_size, w // patch_size
    p = patch_size
    pixels = images.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c * p * p)
    rows = (torch.arange(gh, dtype=images.dtype, device=images.device) + 0.5) / gh
    cols = (torch.arange(gw, dtype=images.dtype, device=images.device) + 0.5) / gw
    centres = torch.stack(torch.meshgrid(rows, cols, indexing="ij"), -1).reshape(1, gh * gw, 2)
    return torch.cat([pixels, centres.expand(b, -1, -1)], -1)


# --------------------------------------------------------------------------------------------
# The task
# --------------------------------------------------------------------------------------------


class ImageTask(Task):
    """Image classification over raster-ordered patch sequences (module docstring).

    ``dataset``: ``"fashion-mnist"``, ``"cifar10"`` or ``"cifar100"`` (read from ``data_dir``, module
    docstring), or give ``data`` (an ``ImageData``, e.g. your own arrays). ``resolution``: the side the
    images are resized to (default: their own); ``patch_size`` must divide it. ``train_resolution``:
    the resolution the model is trained at (default ``resolution``): it fixes the position scale of the
    patch encoder (``patches["grid"]``), so a task made for testing at another resolution says where
    the model was trained."""

    name = "images"
    kind = "classify"
    causal = False

    def __init__(self, dataset: str = "fashion-mnist", resolution: int | None = None, patch_size: int = 4,
                 data_dir: str | None = None, train_resolution: int | None = None, num_val: int | None = None,
                 data: ImageData | None = None):
        if data is None:
            data = load_dataset(dataset, data_dir)
        elif not isinstance(data, ImageData):
            raise TypeError(f"data must be an ImageData (or None to read dataset), got {type(data).__name__}")
        self.data, self.dataset, self.data_dir = data, data.name, None if data_dir is None else str(data_dir)
        self.patch_size = check_positive(patch_size, "patch_size")
        self.resolution = data.side if resolution is None else check_positive(resolution, "resolution")
        self.train_resolution = (self.resolution if train_resolution is None
                                 else check_positive(train_resolution, "train_resolution"))
        for name in ("resolution", "train_resolution"):
            if getattr(self, name) % patch_size:
                raise ValueError(f"patch_size={patch_size} must divide {name}={getattr(self, name)}")
        n_train = data.train_images.shape[0]
        self.num_val = min(5_000, n_train // 10) if num_val is None else check_positive(num_val, "num_val", minimum=0)
        if self.num_val >= n_train:
            raise ValueError(f"num_val={self.num_val} must be below the {n_train} training images")
        self.num_classes = data.num_classes
        self.channels = data.channels
        self.input_dim = self.channels * patch_size * patch_size + 2
        # How chronomem.heads embeds the inputs: a PatchEncoder with the training grid's positions.
        self.patches = {"channels": self.channels, "patch_size": patch_size,
                        "grid": self.train_resolution // patch_size}

    @property
    def length(self) -> int:
        """Patches per image (the sequence length)."""
        return (self.resolution // self.patch_size) ** 2

    def with_resolution(self, resolution: int) -> ImageTask:
        """The same data at ``resolution`` for a model trained on this task (its training resolution kept)."""
        return ImageTask(patch_size=self.patch_size, resolution=resolution, train_resolution=self.train_resolution,
                         num_val=self.num_val, data=self.data, data_dir=self.data_dir)

    def _split(self, split: str) -> tuple[Tensor, Tensor]:
        d, n_train = self.data, self.data.train_images.shape[0] - self.num_val
        if split == "train":
            return d.train_images[:n_train], d.train_labels[:n_train]
        if split == "val":
            return d.train_images[n_train:], d.train_labels[n_train:]
        if split == "test":
            return d.test_images, d.test_labels
        raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")

    def encode(self, images: Tensor) -> Tensor:
        """uint8 images ``[B, C, H, H]`` -> patch features ``[B, N, input_dim]`` at this resolution."""
        return patchify(resize(images, self.resolution), self.patch_size)

    def sample(self, batch_size: int, generator: torch.Generator, split: str = "train") -> Batch:
        images, labels = self._split(split)
        index = torch.randint(images.shape[0], (batch_size,), generator=generator)
        return Batch(self.encode(images[index]), labels[index])

    def eval_batches(self, batch_size: int, num_examples: int, split: str = "test") -> Iterator[Batch]:
        """The first ``num_examples`` images of the split (at most all of them), in file order."""
        images, labels = self._split(split)
        total = min(num_examples, images.shape[0])
        for start in range(0, total, batch_size):
            stop = min(start + batch_size, total)
            yield Batch(self.encode(images[start:stop]), labels[start:stop])

    def describe(self) -> dict:
        return {"name": self.name, "dataset": self.dataset, "resolution": self.resolution,
                "patch_size": self.patch_size, "data_dir": self.data_dir,
                "train_resolution": self.train_resolution, "num_val": self.num_val}


# chronomem train --task images --task-opt dataset=cifar10 --task-opt data_dir=DIR ...
register_task("images")(ImageTask)
