"""Byte-level language modelling on a text corpus (paper 003 Sec. 4.3: enwik8 bits per byte).

A corpus is read as raw bytes (vocabulary 256) and split into contiguous train / val / test parts:

* ``"enwik8"``: the first 10^8 bytes of English Wikipedia (Mahoney's Hutter Prize file), the file
  ``enwik8`` in ``data_dir`` (or at ``path``). The standard split (Dai et al. 2019, Al-Rfou et al.
  2019): the first 90M bytes train, the next 5M validation, the last 5M test.
* ``"gcide"``: the GNU Collaborative International Dictionary of English as Debian's ``dict-gcide``
  ships it (``/usr/share/dictd/gcide.dict.dz``, a gzip (dictzip) file of about 40 MB of English),
  split 90% / 5% / 5% in file order. An offline corpus for CPU-sized runs.
* ``"file"``: any file the user names with ``path`` (read as bytes; gzip-compressed when its name
  ends in ``.gz`` or ``.dz``), split 90% / 5% / 5% in file order.

The split is a pure function of the bytes (no shuffling, no seed), so every run sees the same parts.

As a task (``kind = "lm"``): a batch is ``batch_size`` windows of ``seq_len`` consecutive bytes at
random offsets of the split, ``targets`` the same windows shifted by one byte (next-byte prediction).
A model with a state (Transformer-XL's memory, TLB's slow state) carries it across the segments /
chunks of each window inside one call, so the trainer's loop is unchanged; ``split_tokens(split)``
gives a whole split for streaming evaluation with the state (``CausalLM.evaluate_stream``).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import torch

from chronomem.checks import check_positive
from chronomem.registry import register_task
from chronomem.tasks.base import Batch, Task

CORPORA = ("gcide", "enwik8", "file")
GCIDE_PATH = Path("/usr/share/dictd/gcide.dict.dz")  # where Debian's dict-gcide installs it
ENWIK8_BYTES = 100_000_000
ENWIK8_SPLIT = (90_000_000, 5_000_000, 5_000_000)  # the standard train / val / test sizes
SPLITS = ("train", "val", "test")
FRACTIONS = (0.90, 0.05, 0.05)
HOW_TO_GET = {
    "gcide": "install it with `apt-get install dict-gcide` (Debian/Ubuntu), or give another corpus: "
             "corpus='enwik8' with data_dir=DIR holding the file enwik8, or corpus='file' with path=FILE",
    "enwik8": "download http://mattmahoney.net/dc/enwik8.zip, unzip it and give data_dir=DIR, the folder "
              "holding the file enwik8 (chronomem run lm: --data-dir DIR; chronomem train: --task-opt "
              "data_dir=DIR), or path=FILE; or use corpus='gcide' (`apt-get install dict-gcide`)",
    "file": "give path=FILE, a text file (gzip when its name ends in .gz or .dz)",
}


def corpus_path(corpus: str, path: str | Path | None = None, data_dir: str | Path | None = None) -> Path:
    """The file ``corpus`` is read from: ``path`` if given, else its usual place (``data_dir/enwik8``, or
    dict-gcide's install path). A missing or empty file is a ValueError naming the argument and saying
    how to get the corpus."""
    if corpus not in CORPORA:
        raise ValueError(f"corpus must be one of {CORPORA}, got {corpus!r}")
    if path is not None and data_dir is not None:
        raise ValueError(f"give path or data_dir, not both (got path={str(path)!r}, data_dir={str(data_dir)!r})")
    if path is not None:
        argument, file = "path", Path(path)
    elif corpus == "file":
        raise ValueError(f"corpus='file' needs path=FILE, got path=None: {HOW_TO_GET['file']}")
    elif data_dir is not None:
        if not Path(data_dir).is_dir():
            raise ValueError(f"data_dir={str(data_dir)!r} is not a directory: {HOW_TO_GET[corpus]}")
        argument, file = "data_dir", Path(data_dir) / ("enwik8" if corpus == "enwik8" else GCIDE_PATH.name)
    elif corpus == "gcide":
        argument, file = "corpus", GCIDE_PATH
    else:
        raise ValueError(f"corpus='enwik8' needs data_dir=DIR or path=FILE, got neither: {HOW_TO_GET['enwik8']}")
    if not file.is_file():
        raise ValueError(f"{argument}: no {corpus} corpus at {str(file)!r}: {HOW_TO_GET[corpus]}")
    if file.stat().st_size == 0:
        raise ValueError(f"{argument}: the corpus file {str(file)!r} is empty (0 bytes)")
    return file


def read_corpus(file: str | Path) -> bytes:
    """The bytes of ``file``, decompressed when its name ends in ``.gz`` or ``.dz`` (dictzip is gzip)."""
    file = Path(file)
    if file.suffix in (".gz", ".dz"):
        with gzip.open(file, "rb") as f:
            return f.read()
    return file.read_bytes()


def split_corpus(data: bytes, corpus: str) -> dict[str, bytes]:
    """Contiguous train / val / test parts: enwik8's standard 90M / 5M / 5M, else 90% / 5% / 5%."""
    if not data:
        raise ValueError(f"the {corpus} corpus is empty (0 bytes after decompression)")
    if corpus == "enwik8":
        if len(data) != ENWIK8_BYTES:
            raise ValueError(f"enwik8 must hold {ENWIK8_BYTES:,} bytes (the standard 90M/5M/5M split), got "
                             f"{len(data):,}: use corpus='file' for other text")
        sizes = ENWIK8_SPLIT
    else:
        train, val = int(len(data) * FRACTIONS[0]), int(len(data) * FRACTIONS[1])
        sizes = (train, val, len(data) - train - val)
    bounds = [0, sizes[0], sizes[0] + sizes[1], len(data)]
    return {split: data[bounds[i] : bounds[i + 1]] for i, split in enumerate(SPLITS)}


class TextTask(Task):
    """Next-byte prediction on ``corpus`` (module docstring): windows of ``seq_len`` bytes.

    The corpus file is located (and a missing or empty one reported) when the task is built, and read
    on first use. Loss and accuracy are per byte; ``loss / ln 2`` is bits per byte."""

    name = "text"
    kind = "lm"
    vocab_size = 256
    num_classes = 256
    causal = True

    def __init__(self, corpus: str = "gcide", path: str | None = None, data_dir: str | None = None,
                 seq_len: int = 512):
        self.corpus, self.path, self.data_dir = corpus, path, data_dir
        self.seq_len = check_positive(seq_len, "seq_len")
        self.file = corpus_path(corpus, path, data_dir)
        self._splits: dict[str, torch.Tensor] | None = None

    def split_tokens(self, split: str = "test") -> torch.Tensor:
        """The whole ``split`` as a 1-D uint8 tensor of bytes."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if self._splits is None:
            parts = split_corpus(read_corpus(self.file), self.corpus)
            self._splits = {name: torch.frombuffer(bytearray(part), dtype=torch.uint8) for name, part in parts.items()}
        return self._splits[split]

    def sample(self, batch_size: int, generator: torch.Generator, split: str = "train") -> Batch:
        tokens = self.split_tokens(split)
        windows = len(tokens) - self.seq_len  # offsets whose window and next byte fit in the split
        if windows < 1:
            raise ValueError(f"seq_len={self.seq_len} needs a {split} split of at least {self.seq_len + 1} bytes, "
                             f"got {len(tokens)} (corpus {str(self.file)!r})")
        offsets = torch.randint(0, windows, (batch_size, 1), generator=generator)
        window = tokens[offsets + torch.arange(self.seq_len + 1)].long()
        return Batch(window[:, :-1], window[:, 1:])

    def describe(self) -> dict:
        return {"name": self.name, "corpus": self.corpus, "path": self.path, "data_dir": self.data_dir,
                "seq_len": self.seq_len}


register_task("text")(TextTask)
