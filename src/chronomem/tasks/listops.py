"""ListOps as in the Long Range Arena (Tay et al. 2021; Nangia & Bowman 2018): generator, files, task.

An expression nests the operators MIN, MAX, MED (floor of the median) and SM (sum modulo 10) over
the values 0-9, for example ``[MAX 2 9 [MIN 4 7 ] 0 ]`` = 9. The label (10 classes) is its value.

Facts matched from the LRA generator and input pipeline (google-research/long-range-arena,
``lra_benchmarks/data/listops.py`` and ``lra_benchmarks/listops/input_pipeline.py``):

* A node at depth < ``max_depth`` (the root has depth 1) is an operator with probability 0.25, else
  a value; nodes at ``max_depth`` are values. An operator takes ``randint(2, max_args)`` arguments
  and draws one of the four operators uniformly; values are uniform on 0-9. LRA: ``max_depth`` 10,
  ``max_args`` 10.
* The length of an expression is its number of tokens: operators, values and the closing ``]``.
  LRA keeps expressions with ``min_length < length < max_length`` (strict; 500 and 2000) and
  duplicates are dropped; 96,000 / 2,000 / 2,000 train / val / test.
* Files are TSV with the header ``Source\\tTarget``. The source text puts every binary node of the
  generator's tree in parentheses: ``[MAX 2 9 ]`` is written ``( ( ( [MAX 2 ) 9 ) ] )``.
* Tokenisation (the fixed LRA pipeline): parentheses are deleted, the rest is split on whitespace,
  so the tokens are ``[MAX`` ``[MIN`` ``[MED`` ``[SM`` ``]`` and the digits (15 symbols); id 0 is
  padding and batches are padded with it.

Deviations: token ids are fixed here (``VOCAB``: padding 0, digits 1-10, operators 11-14, ``]`` 15;
``vocab_size`` 16). LRA numbers the same 15 tokens in the order of a Python set built from the
validation file and keeps one unused out-of-vocabulary id (its vocabulary size is 17); an unknown
token raises ``ValueError`` here. Training batches are drawn uniformly with replacement from the
training set (LRA shuffles epochs). MED follows LRA's ``int(np.median(...))``: the mean of the two
middle values for an even count, rounded down.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from chronomem.registry import register_task
from chronomem.tasks.base import Batch, Task

MIN, MAX, MED, SM, END = "[MIN", "[MAX", "[MED", "[SM", "]"
OPERATORS = (MIN, MAX, MED, SM)
VALUE_P = 0.25  # LRA: probability that a node below the maximum depth is an operator
HEADER = ("Source", "Target")
SPLITS = ("train", "val", "test")

PAD = 0
TOKENS = tuple(str(v) for v in range(10)) + OPERATORS + (END,)
VOCAB = {token: i + 1 for i, token in enumerate(TOKENS)}  # 0 is padding
ID_TO_TOKEN = {i: token for token, i in VOCAB.items()}

# An expression tree: an int (a value) or a pair (operator, tuple of sub-trees).
Tree = int | tuple


# --------------------------------------------------------------------------------------------
# Semantics
# --------------------------------------------------------------------------------------------


def apply(op: str, args: Sequence[int]) -> int:
    """The value of one operator applied to already evaluated arguments."""
    if op == MIN:
        return min(args)
    if op == MAX:
        return max(args)
    if op == MED:  # LRA: int(np.median(args)); the median of an even count is the mean of the middle two
        s = sorted(args)
        mid = len(s) // 2
        return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) // 2
    if op == SM:
        return sum(args) % 10
    raise ValueError(f"unknown operator {op!r}; expected one of {OPERATORS}")


def evaluate(expression: str | Sequence[str]) -> int:
    """Exact value of an expression given as source text (parentheses allowed) or as tokens.

    A stack machine over the tokens: an operator opens a frame, a value is appended to the open
    frame, ``]`` closes it and appends its value to the frame below. Malformed input raises
    ``ValueError``.
    """
    tokens = tokenize(expression) if isinstance(expression, str) else list(expression)
    frames: list[tuple[str, list[int]]] = []
    result: int | None = None
    for i, token in enumerate(tokens):
        if result is not None:
            raise ValueError(f"tokens after the end of the expression at position {i}: {token!r}")
        if token in OPERATORS:
            frames.append((token, []))
            continue
        if token == END:
            if not frames:
                raise ValueError(f"unbalanced ']' at position {i}")
            op, args = frames.pop()
            if not args:
                raise ValueError(f"operator {op} without arguments (closed at position {i})")
            value = apply(op, args)
        elif len(token) == 1 and token.isdigit():
            value = int(token)
        else:
            raise ValueError(f"unknown token {token!r} at position {i}; expected one of {TOKENS}")
        if frames:
            frames[-1][1].append(value)
        else:
            result = value
    if frames or result is None:
        raise ValueError(f"{len(frames)} operator(s) not closed" if frames else "empty expression")
    return result


# --------------------------------------------------------------------------------------------
# Text formats
# --------------------------------------------------------------------------------------------


def tokenize(source: str) -> list[str]:
    """LRA tokenisation of a source line: delete parentheses, split on whitespace."""
    return source.replace("(", " ").replace(")", " ").split()


def encode(tokens: Iterable[str]) -> np.ndarray:
    """Token strings -> ids (``VOCAB``); unknown tokens raise ``ValueError``."""
    try:
        return np.fromiter((VOCAB[t] for t in tokens), dtype=np.uint8)
    except KeyError as err:
        raise ValueError(f"unknown token {err.args[0]!r}; expected one of {TOKENS}") from None


def decode(ids: Iterable[int]) -> list[str]:
    """Ids -> token strings, padding dropped."""
    return [ID_TO_TOKEN[int(i)] for i in ids if int(i) != PAD]


def parse(expression: str | Sequence[str]) -> Tree:
    """Source text or tokens -> tree (``int`` or ``(operator, args)``); bad input raises ``ValueError``."""
    tokens = tokenize(expression) if isinstance(expression, str) else list(expression)
    stack: list[tuple[str, list]] = []
    root: Tree | None = None
    for i, token in enumerate(tokens):
        if root is not None:
            raise ValueError(f"tokens after the end of the expression at position {i}: {token!r}")
        if token in OPERATORS:
            stack.append((token, []))
            continue
        if token == END:
            if not stack or not stack[-1][1]:
                raise ValueError(f"unbalanced or empty ']' at position {i}")
            op, args = stack.pop()
            node: Tree = (op, tuple(args))
        elif len(token) == 1 and token.isdigit():
            node = int(token)
        else:
            raise ValueError(f"unknown token {token!r} at position {i}")
        if stack:
            stack[-1][1].append(node)
        else:
            root = node
    if stack or root is None:
        raise ValueError("incomplete expression" if stack else "empty expression")
    return root


def to_tokens(tree: Tree) -> list[str]:
    out: list[str] = []

    def walk(node: Tree) -> None:
        if isinstance(node, int):
            out.append(str(node))
            return
        op, args = node
        out.append(op)
        for arg in args:
            walk(arg)
        out.append(END)

    walk(tree)
    return out


def to_source(tree: Tree) -> str:
    """LRA source text: the generator builds ``((op, a1), a2) ... , ])`` pairs, each written ``( l r )``."""
    if isinstance(tree, int):
        return str(tree)
    op, args = tree
    text = op
    for part in [to_source(a) for a in args] + [END]:
        text = f"( {text} {part} )"
    return text


def depth(tree: Tree) -> int:
    """Depth of a tree: a value has depth 1 (LRA counts the root as depth 1)."""
    return 1 if isinstance(tree, int) else 1 + max(depth(a) for a in tree[1])


def arities(tree: Tree) -> list[int]:
    """Argument counts of every operator in the tree."""
    if isinstance(tree, int):
        return []
    return [len(tree[1])] + [n for a in tree[1] for n in arities(a)]


# --------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------


class _TooLong(Exception):
    pass


def generate_tree(
    rng: random.Random, max_depth: int = 10, max_args: int = 10, max_length: int | None = None,
    operators: Sequence[str] = OPERATORS,
) -> tuple[Tree | None, int, int]:
    """One random expression with the LRA rules: ``(tree, length, value)``.

    The value is computed bottom-up while the tree grows (not by re-reading it with ``evaluate``). With
    ``max_length`` the draw stops as soon as the length reaches it and ``None`` is returned for the
    tree: an expression that long would be rejected anyway, so the accepted ones keep LRA's
    distribution. ``operators`` (default LRA's four) are the ones drawn from, uniformly.
    """
    length = 0

    def grow(level: int) -> tuple[Tree, int]:
        nonlocal length
        # LRA: r = random() below the maximum depth, else 1; the node is a value when r > VALUE_P.
        if level >= max_depth or rng.random() > VALUE_P:
            length += 1
            if max_length is not None and length >= max_length:
                raise _TooLong
            v = rng.randrange(10)
            return v, v
        op = rng.choice(operators)
        length += 2  # the operator token and its closing ']'
        children = [grow(level + 1) for _ in range(rng.randint(2, max_args))]
        return (op, tuple(c[0] for c in children)), apply(op, [c[1] for c in children])

    try:
        tree, value = grow(1)
    except _TooLong:
        return None, length, -1
    if max_length is not None and length >= max_length:
        return None, length, -1
    return tree, length, value


def generate(
    num: int,
    min_length: int,
    max_length: int,
    seed: int | str = 0,
    max_depth: int = 10,
    max_args: int = 10,
    exclude: set | None = None,
    max_tries: int | None = None,
    operators: Sequence[str] = OPERATORS,
) -> list[tuple[Tree, int]]:
    """``num`` distinct expressions with ``min_length < length < max_length`` (LRA's strict bounds).

    ``exclude`` holds the expressions that must not be produced (e.g. the test set when drawing the
    training set), each as the bytes of its token ids, ``encode(tokens).tobytes()``, and is extended
    with the new ones. Returns ``[(tree, label)]``.
    """
    return [(tree, value) for tree, value, _ in draw(num, min_length, max_length, seed, max_depth, max_args,
                                                     exclude, max_tries, operators)]


def draw(
    num: int,
    min_length: int,
    max_length: int,
    seed: int | str = 0,
    max_depth: int = 10,
    max_args: int = 10,
    exclude: set | None = None,
    max_tries: int | None = None,
    operators: Sequence[str] = OPERATORS,
) -> Iterator[tuple[Tree, int, np.ndarray]]:
    """``generate`` one expression at a time: yields ``(tree, label, token ids)``, the same expressions in
    the same order. A caller that keeps only the ids (uint8, one byte a token) holds a data set in a
    small part of the memory its trees would take."""
    _check_lengths(min_length, max_length)
    if max_depth < 1 or max_args < 2:
        raise ValueError(f"need max_depth >= 1 and max_args >= 2, got {max_depth}, {max_args}")
    operators = check_operators(operators)
    rng = random.Random(seed if isinstance(seed, int) else _stable_int(seed))
    # Keys are bytes, not tuples of token strings: each token of such a tuple is its own str object
    # (``to_tokens`` calls ``str``), about 50 bytes a token against 1 here.
    seen = exclude if exclude is not None else set()
    found, tries, limit = 0, 0, max_tries if max_tries is not None else 20_000 * max(num, 1) + 100_000
    while found < num:
        tries += 1
        if tries > limit:
            raise RuntimeError(
                f"found only {found} of {num} ListOps expressions with {min_length} < length < "
                f"{max_length} after {limit} draws; widen the length range or raise max_depth"
            )
        tree, length, value = generate_tree(rng, max_depth, max_args, max_length, operators)
        if tree is None or length <= min_length:
            continue
        ids = encode(to_tokens(tree))
        key = ids.tobytes()
        if key in seen:
            continue
        seen.add(key)
        found += 1
        yield tree, value, ids


def augment(tokens: Sequence[str], k: int) -> list[str]:
    """Paper 002 Table 5: ``k`` copies of an expression joined under a MAX operator (same value).

    ``k = 1`` returns the expression unchanged (the x1 column is the original data); ``k >= 2`` gives
    ``[MAX e e ... e ]`` of length ``k * len(e) + 2``, one level deeper than ``e`` (so it may exceed
    LRA's maximum depth of 10, and ``k`` up to 10 keeps LRA's argument count).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"augment factor k must be a positive integer, got {k!r}")
    tokens = list(tokens)
    return tokens if k == 1 else [MAX] + tokens * k + [END]


def check_operators(operators: Sequence[str]) -> tuple[str, ...]:
    """``operators`` as a tuple of distinct names from ``OPERATORS``; anything else raises ``ValueError``."""
    if isinstance(operators, str) or not operators or len(set(operators)) != len(operators) \
            or any(op not in OPERATORS for op in operators):
        raise ValueError(f"operators must be distinct names from {OPERATORS}, got {operators!r}")
    return tuple(operators)


def _check_lengths(min_length: int, max_length: int) -> None:
    if not 0 <= min_length < max_length - 1:
        raise ValueError(
            f"need 0 <= min_length < max_length - 1 (LRA keeps min_length < length < max_length), "
            f"got min_length={min_length}, max_length={max_length}"
        )


def _stable_int(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


# --------------------------------------------------------------------------------------------
# TSV files (the official basic_{train,val,test}.tsv)
# --------------------------------------------------------------------------------------------


def write_tsv(path: str | Path, examples: Iterable[tuple[Tree | str | Sequence[str], int]]) -> None:
    """Write ``(expression, label)`` rows in the LRA format (header ``Source\\tTarget``, LRA source text)."""
    with _tsv_rows(path) as write:
        for expression, label in examples:
            write(expression if isinstance(expression, (int, tuple)) else parse(expression), label)


@contextmanager
def _tsv_rows(path: str | Path | None) -> Iterator[Callable[[Tree, int], None]]:
    """A ``write(tree, label)`` that appends one row to the TSV file ``path`` as soon as it is drawn (no
    list of trees is kept); the file appears under its name only once complete (a temporary file,
    renamed). With ``path`` None the rows are dropped."""
    if path is None:
        yield lambda tree, label: None
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write("\t".join(HEADER) + "\n")
        yield lambda tree, label: f.write(f"{to_source(tree)}\t{int(label)}\n")
    tmp.replace(path)


def read_tsv(
    path: str | Path, limit: int | None = None, check_labels: bool = False
) -> tuple[list[np.ndarray], np.ndarray]:
    """Read an LRA ListOps TSV file: ``(token id arrays, labels)``.

    Each line must be ``source<TAB>label`` with a label in 0-9 and a source of known tokens;
    otherwise ``ValueError`` names the file and line number. ``check_labels`` also parses every
    expression and compares its value with the label (slow on the full files).
    """
    path = Path(path)
    ids, labels = [], []
    with open(path) as f:
        header = f.readline().rstrip("\r\n")
        if tuple(header.split("\t")) != HEADER:
            raise ValueError(f"{path}, line 1: expected the header 'Source\\tTarget', got {header[:60]!r}")
        for lineno, line in enumerate(f, start=2):
            if limit is not None and len(labels) >= limit:
                break
            line = line.rstrip("\r\n")
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                raise ValueError(f"{path}, line {lineno}: expected 2 tab-separated fields, got {len(fields)}")
            source, target = fields
            if not (target.strip().isdigit() and 0 <= int(target) <= 9):
                raise ValueError(f"{path}, line {lineno}: the target must be an integer 0..9, got {target!r}")
            tokens = tokenize(source)
            if not tokens:
                raise ValueError(f"{path}, line {lineno}: empty source")
            try:
                encoded = encode(tokens)
                if check_labels and evaluate(tokens) != int(target):
                    raise ValueError(f"the label {target} differs from the value {evaluate(tokens)}")
            except ValueError as err:
                raise ValueError(f"{path}, line {lineno}: {err}") from None
            ids.append(encoded)
            labels.append(int(target))
    return ids, np.asarray(labels, dtype=np.int64)


# --------------------------------------------------------------------------------------------
# The task
# --------------------------------------------------------------------------------------------


class ListOpsTask(Task):
    """ListOps classification: ``inputs [B, N]`` token ids padded with 0 to the longest in the batch,
    ``mask`` True on real tokens, ``targets [B]`` in 0..9.

    Generated (defaults: the LRA sizes; splits are generated lazily on first use) or read from the
    official files (``data_dir`` holding ``basic_{train,val,test}.tsv``; ``num_*`` then cap the number
    of examples read). The test set is drawn first from its own seed stream, then validation, then
    training, each excluding what came before, so the test set does not depend on ``num_train``.
    ``augment=k`` serves every example as ``k`` copies under a MAX (paper 002 Table 5).
    ``cache_dir`` (optional) keeps generated splits as TSV files and reloads them. Generating a split
    shows its progress on stderr (``chronomem.progress``: a bar on a terminal, else a line every
    ~10 s, and a last line if it took that long); ``progress=False`` silences it.
    """

    name = "listops"
    kind = "classify"
    num_classes = 10
    vocab_size = len(VOCAB) + 1  # 15 tokens + padding
    causal = False

    def __init__(
        self,
        min_length: int = 500,
        max_length: int = 2000,
        num_train: int = 96_000,
        num_val: int = 2_000,
        num_test: int = 2_000,
        seed: int = 0,
        data_dir: str | None = None,
        augment: int = 1,
        max_depth: int = 10,
        max_args: int = 10,
        operators: Sequence[str] = OPERATORS,
        cache_dir: str | None = None,
        progress: bool = True,
    ):
        for name, value in (("num_train", num_train), ("num_val", num_val), ("num_test", num_test)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if data_dir is None:
            _check_lengths(min_length, max_length)
        if isinstance(augment, bool) or not isinstance(augment, int) or augment < 1:
            raise ValueError(f"augment must be a positive integer, got {augment!r}")
        self.min_length, self.max_length = min_length, max_length
        self.sizes = {"train": num_train, "val": num_val, "test": num_test}
        self.seed, self.augment = seed, augment
        self.max_depth, self.max_args = max_depth, max_args
        self.operators = check_operators(operators)
        self.data_dir = None if data_dir is None else str(data_dir)
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        self.progress = progress  # not in describe(): it changes no data
        self._base: dict[str, tuple[list[np.ndarray], np.ndarray]] = {}  # as generated / read
        self._data: dict[str, tuple[list[np.ndarray], np.ndarray]] = {}  # as served (augmented)
        self._exclude: set[bytes] = set()  # the token ids of every expression generated so far (``draw``)

    # -- data --------------------------------------------------------------------------------

    def split(self, split: str) -> tuple[list[np.ndarray], np.ndarray]:
        """``(token id arrays, labels)`` of a split (after augmentation), built on first use."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if split not in self._data:
            ids, labels = self._base_split(split)
            if self.augment > 1:
                ids = [_augment_ids(x, self.augment) for x in ids]
            self._data[split] = (ids, labels)
        return self._data[split]

    def _base_split(self, split: str) -> tuple[list[np.ndarray], np.ndarray]:
        if split not in self._base:
            if self.data_dir is not None:
                path = Path(self.data_dir) / f"basic_{split}.tsv"
                self._base[split] = read_tsv(path, limit=self.sizes[split])
            else:
                for s in ("test", "val", "train"):  # in this order: each excludes the ones before it
                    if s not in self._base:
                        self._base[s] = self._generate(s)
                    if s == split:
                        break
        return self._base[split]

    def _cache_path(self, split: str) -> Path | None:
        if self.cache_dir is None:
            return None
        ops = "" if self.operators == OPERATORS else "-" + "".join(op[1:].lower() for op in self.operators)
        key = (f"{self.min_length}-{self.max_length}-d{self.max_depth}-a{self.max_args}{ops}-s{self.seed}-"
               f"{self.sizes['test']}-{self.sizes['val']}-{self.sizes['train']}")
        return Path(self.cache_dir) / f"listops-{key}-{split}.tsv"

    def _generate(self, split: str) -> tuple[list[np.ndarray], np.ndarray]:
        from chronomem.progress import Progress

        cache = self._cache_path(split)
        if cache is not None and cache.exists():
            ids, labels = read_tsv(cache)
            self._exclude.update(x.tobytes() for x in ids)
            return ids, labels
        seed = f"listops/{self.seed}/{split}"  # one stream per split
        progress = Progress(self.sizes[split], f"listops {split} split", self.progress, unit="expression")
        ids, labels = [], []
        # Only the token ids are kept: the LRA training set's trees would take gigabytes.
        with _tsv_rows(cache) as write:
            for tree, value, encoded in draw(self.sizes[split], self.min_length, self.max_length, seed,
                                             self.max_depth, self.max_args, exclude=self._exclude,
                                             operators=self.operators):
                write(tree, value)
                ids.append(encoded)
                labels.append(value)
                progress.update(len(ids))
        progress.close(only_if_long=True)
        return ids, np.asarray(labels, dtype=np.int64)

    def label_counts(self, split: str = "train") -> dict[int, int]:
        labels = self.split(split)[1]
        counts = Counter(labels.tolist())
        return {c: counts.get(c, 0) for c in range(10)}

    def lengths(self, split: str = "train") -> np.ndarray:
        return np.asarray([len(x) for x in self.split(split)[0]])

    # -- batches -----------------------------------------------------------------------------

    @staticmethod
    def collate(ids: Sequence[np.ndarray], labels: Sequence[int]) -> Batch:
        """Pad to the longest sequence with ``PAD`` (0); ``mask`` marks the real tokens."""
        longest = max(len(x) for x in ids)
        inputs = np.zeros((len(ids), longest), dtype=np.int64)
        for row, x in enumerate(ids):
            inputs[row, : len(x)] = x
        inputs = torch.from_numpy(inputs)
        return Batch(inputs, torch.as_tensor(np.asarray(labels), dtype=torch.long), mask=inputs != PAD)

    def sample(self, batch_size: int, generator: torch.Generator, split: str = "train") -> Batch:
        ids, labels = self.split(split)
        if not ids:
            raise ValueError(f"the {split} split of this ListOps task is empty")
        index = torch.randint(len(ids), (batch_size,), generator=generator).tolist()
        return self.collate([ids[i] for i in index], labels[index])

    def eval_batches(self, batch_size: int, num_examples: int, split: str = "test") -> Iterator[Batch]:
        """The first ``num_examples`` examples of the split (all of them if fewer), in order."""
        ids, labels = self.split(split)
        n = min(num_examples, len(ids))
        for start in range(0, n, batch_size):
            stop = min(n, start + batch_size)
            yield self.collate(ids[start:stop], labels[start:stop])

    def with_augment(self, k: int) -> ListOpsTask:
        """The same data served ``k`` times longer (shares the already built base splits)."""
        options = {**self.describe(), "augment": k}
        options.pop("name")
        other = ListOpsTask(**options, progress=self.progress)
        other._base, other._exclude = self._base, self._exclude
        return other

    def describe(self) -> dict:
        return {
            "name": self.name, "min_length": self.min_length, "max_length": self.max_length,
            "num_train": self.sizes["train"], "num_val": self.sizes["val"], "num_test": self.sizes["test"],
            "seed": self.seed, "data_dir": self.data_dir, "augment": self.augment,
            "max_depth": self.max_depth, "max_args": self.max_args, "operators": list(self.operators),
            "cache_dir": self.cache_dir,
        }


def _augment_ids(ids: np.ndarray, k: int) -> np.ndarray:
    """``augment`` on token ids."""
    if k == 1:
        return ids
    return np.concatenate([[VOCAB[MAX]], np.tile(ids, k), [VOCAB[END]]]).astype(np.uint8)


register_task("listops")(ListOpsTask)
