"""``prepare_data``: a ``DataConfig`` in, everything a trainer needs out, cached on disk.

Steps: read the split files (or generate ``toy``), carve the dev holdout, subsample, tokenize,
build the vocabulary from train, numericalize, load the pretrained vectors. The result is stored
as one .npz keyed by a hash of the corpus files' content, the preprocessing options and the
vectors file's identity; a second call with the same inputs loads it and skips every step.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from itertools import chain
from pathlib import Path

import numpy as np
import torch

from nli_models.data.corpora import CORPORA
from nli_models.data.data_config import DataConfig, VectorsConfig
from nli_models.data.download import DOWNLOAD_URLS, default_data_dir
from nli_models.data.encode import EncodedSplit, load_arrays, numericalize, save_arrays
from nli_models.data.readers import Columns, Labels, read_jsonl, read_tsv
from nli_models.data.records import NLISplit
from nli_models.data.splits import grouped_holdout, subsample
from nli_models.data.text import Vocabulary, tokenize
from nli_models.data.toy import make_toy_corpus
from nli_models.data.vectors import (
    PretrainedVectors,
    VectorsIdentity,
    build_embedding_init,
    load_vectors,
    vector_source_fingerprint,
)
from nli_models.errors import InputError, InputFileMissing
from nli_models.files import sha256_file

# Bump when the preprocessing changes meaning (tokenizer, encoding), so old caches are not used.
# 2: extend_vocab on by default, hashed_oov extends with every word; 3: the vectors' identity
CACHE_VERSION = 3


@dataclass
class PreparedData:
    """Numpy arrays and a word list only, so it pickles small and fast (a sweep puts it in the
    Ray object store once). ``embedding_init`` gives torch views of the arrays."""

    corpus: str
    vocab: Vocabulary
    labels: tuple[str, ...]
    splits: dict[str, EncodedSplit]
    embedding_weight: np.ndarray | None = None  # float32 [V, D]
    embedding_trainable: np.ndarray | None = None  # bool [V]
    vector_coverage: float | None = None  # share of vocabulary words with a pretrained vector
    vectors_identity: VectorsIdentity | None = None  # the vectors file read, by its content
    from_cache: bool = False
    seconds: float = 0.0  # time prepare_data took
    cache_path: str | None = None
    info: dict = field(default_factory=dict)  # per-split provenance (source file, holdout, ...)

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    @property
    def embedding_dim(self) -> int | None:
        return None if self.embedding_weight is None else int(self.embedding_weight.shape[1])

    @property
    def embedding_init(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(weight, trainable_rows)`` for ``WordEmbeddings.load``; None without vectors."""
        if self.embedding_weight is None or self.embedding_trainable is None:
            return None
        return torch.from_numpy(self.embedding_weight), torch.from_numpy(self.embedding_trainable)

    def summary(self) -> dict:
        splits = {}
        for name, split in self.splits.items():
            counts = np.bincount(split.labels, minlength=self.num_classes)
            splits[name] = {
                "examples": len(split),
                "label_counts": dict(zip(self.labels, counts.tolist(), strict=True)),
                "oov_rate": round(split.oov_rate(), 4),
                "mean_premise_length": round(float(split.premise_lengths.mean()), 2),
                "mean_hypothesis_length": round(float(split.hypothesis_lengths.mean()), 2),
                **self.info.get(name, {}),
            }
        return {
            "corpus": self.corpus,
            "labels": list(self.labels),
            "vocab_size": len(self.vocab),
            "embedding_dim": self.embedding_dim,
            "vector_coverage": None
            if self.vector_coverage is None
            else round(self.vector_coverage, 4),
            "splits": splits,
            "from_cache": self.from_cache,
            "seconds": round(self.seconds, 3),
        }

    def describe(self) -> str:
        """One line for a terminal: corpus, split sizes, vocabulary, vectors, cache."""
        sizes = ", ".join(f"{name} {len(split):,}" for name, split in self.splits.items())
        vectors = ""
        if self.vector_coverage is not None:
            vectors = f", {self.embedding_dim}-d vectors cover {self.vector_coverage:.1%}"
        source = "from cache" if self.from_cache else "prepared"
        return (
            f"{self.corpus}: {sizes} pairs; {len(self.labels)} classes; vocabulary "
            f"{len(self.vocab):,}{vectors} ({source} in {self.seconds:.2f}s)"
        )


def resolve_files(config: DataConfig) -> dict[str, Path]:
    """The file of each split to read (none for toy, none for a dev made by the holdout)."""
    if config.corpus == "toy":
        return {}
    data_dir = Path(config.data_dir).expanduser() if config.data_dir else default_data_dir()
    defaults = CORPORA[config.corpus].files if config.corpus in CORPORA else {}
    files = {}
    for split in config.splits:
        if split == "dev" and config.dev_holdout:
            continue
        relative = getattr(config.files, split) or defaults[split]
        path = data_dir / relative
        if not path.is_file():
            raise InputFileMissing(_missing_file_message(config, split, path, data_dir))
        files[split] = path
    return files


def _missing_file_message(config: DataConfig, split: str, path: Path, data_dir: Path) -> str:
    message = f"{config.corpus} {split} file not found: {path}. "
    if config.corpus in DOWNLOAD_URLS:
        message += (
            f"Run `orchestrate data download {config.corpus}` (downloads into {data_dir}), or "
        )
    return message + (
        f"pass --data-dir DIR (data.data_dir) for a directory holding it, or set data.files.{split}"
    )


def cache_key(config: DataConfig, files: Mapping[str, Path]) -> str:
    """Hash of what the prepared data depends on. Corpus files count by content (SHA-256, ~1 s
    for SNLI train), so a copy on another machine or a touched file still hits; data_dir itself
    does not count. Vector files count by path, size and mtime (hashing GBs costs as much as
    loading them)."""
    digests = {path: sha256_file(path) for path in set(files.values())}
    payload = {
        "version": CACHE_VERSION,
        "config": config.model_dump(mode="json", exclude={"data_dir"}),
        "files": {split: digests[path] for split, path in sorted(files.items())},
        "vectors": vector_source_fingerprint(config.vectors.source) if config.vectors else None,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def read_splits(config: DataConfig, files: Mapping[str, Path]) -> dict[str, NLISplit]:
    """The configured splits as records: read (or generated), holdout carved, subsampled."""
    if config.corpus == "toy":
        toy = make_toy_corpus(config.toy.size, config.toy.seed, config.toy.num_classes)
        splits = {
            name: toy[name] for name in config.splits if not (name == "dev" and config.dev_holdout)
        }
    else:
        reader = _reader(config)
        splits = {split: reader(path, split) for split, path in files.items()}
    if config.dev_holdout:
        holdout = config.dev_holdout
        splits[holdout.from_split], splits["dev"] = grouped_holdout(
            splits[holdout.from_split], holdout.fraction, holdout.seed, holdout.group_by
        )
    for split, limit in config.max_examples.items():
        splits[split] = subsample(splits[split], limit, config.seed)
    empty = [f"{name} ({split.source})" for name, split in splits.items() if not split.examples]
    if empty:
        raise InputError(f"no examples in split(s): {', '.join(empty)}")
    label_sets = {split.labels for split in splits.values()}
    if len(label_sets) != 1:
        raise InputError(f"the splits declare different label sets: {sorted(label_sets)}")
    return {name: splits[name] for name in ("train", "dev", "test") if name in splits}


def _reader(config: DataConfig):
    if config.corpus in CORPORA:
        return CORPORA[config.corpus].reader
    columns = Columns(**config.columns.model_dump())
    labels = Labels(config.labels, config.label_map)
    if config.corpus == "jsonl":
        return lambda path, name: read_jsonl(path, columns, labels, name=name)
    return lambda path, name: read_tsv(path, columns, labels, header=config.tsv_header, name=name)


def _tokenize_split(split: NLISplit, lowercase: bool, memo: dict[str, list[str]]):
    # SNLI pairs each premise with ~3 hypotheses: tokenizing each distinct sentence once saves
    # about a third of the time.
    def tokens(text: str) -> list[str]:
        if text not in memo:
            memo[text] = tokenize(text, lowercase)
        return memo[text]

    premises = [tokens(e.premise) for e in split.examples]
    hypotheses = [tokens(e.hypothesis) for e in split.examples]
    return premises, hypotheses


def _load_vectors(
    options: VectorsConfig, vocab: Vocabulary, eval_tokens: set[str]
) -> tuple[Vocabulary, PretrainedVectors]:
    """One pass over the vectors file: the vocabulary's words plus, with ``extend_vocab``, the
    dev/test words that are not in it; those with a vector join the vocabulary, and with
    ``hashed_oov`` those without one too (Parikh et al. hash every OOV word to a fixed random
    vector, seen in training or not, so a dev/test word gets its bucket rather than <unk>'s)."""
    candidates = sorted(eval_tokens - vocab.stoi.keys()) if options.extend_vocab else []
    loaded = load_vectors(
        options.source,
        [*vocab.itos, *candidates],
        embedding_dim=options.embedding_dim,
        lowercase_fallback=options.lowercase_fallback,
        zip_member=options.zip_member,
    )
    if candidates:
        found = loaded.found[len(vocab) :]
        every = options.oov == "hashed_oov"
        vocab = vocab.extend(
            word for word, ok in zip(candidates, found, strict=True) if ok or every
        )
    return vocab, loaded.for_vocab(vocab)


def _build(config: DataConfig, files: Mapping[str, Path]) -> PreparedData:
    splits = read_splits(config, files)
    labels = splits["train"].labels
    memo: dict[str, list[str]] = {}
    tokenized = {
        name: _tokenize_split(split, config.lowercase, memo) for name, split in splits.items()
    }
    vocab = Vocabulary.build(chain(*tokenized["train"]), config.min_count, config.lowercase)
    prepared = PreparedData(config.corpus, vocab, labels, {})
    if config.vectors:
        options = config.vectors
        eval_tokens = {
            token
            for name, sentences in tokenized.items()
            if name != "train"
            for tokens in chain(*sentences)
            for token in tokens
        }
        vocab, vectors = _load_vectors(options, vocab, eval_tokens)
        weight, trainable = build_embedding_init(
            vocab, vectors, options.oov, options.seed, hash_buckets=options.hash_buckets,
            tune=options.tune,
        )
        prepared.vocab = vocab
        prepared.embedding_weight, prepared.embedding_trainable = weight.numpy(), trainable.numpy()
        prepared.vector_coverage = float(vectors.found[2:].mean()) if len(vocab) > 2 else 0.0
        prepared.vectors_identity = vectors.identity
    label_index = {label: i for i, label in enumerate(labels)}
    for name, split in splits.items():
        premises, hypotheses = tokenized[name]
        label_ids = [label_index[e.label] for e in split.examples]
        prepared.splits[name] = numericalize(name, premises, hypotheses, label_ids, vocab)
        prepared.info[name] = {"source": split.source, **split.meta}
    return prepared


def _to_arrays(prepared: PreparedData) -> tuple[dict[str, np.ndarray], dict]:
    arrays = {k: v for split in prepared.splits.values() for k, v in split.to_arrays().items()}
    # Words never contain whitespace (the tokenizer splits on it), so "\n" can join them.
    arrays["vocab"] = np.frombuffer("\n".join(prepared.vocab.itos).encode("utf-8"), dtype=np.uint8)
    if prepared.embedding_weight is not None:
        arrays["embedding_weight"] = prepared.embedding_weight
        arrays["embedding_trainable"] = prepared.embedding_trainable
    meta = {
        "corpus": prepared.corpus,
        "labels": list(prepared.labels),
        "splits": list(prepared.splits),
        "lowercase": prepared.vocab.lowercase,
        "min_count": prepared.vocab.min_count,
        "vector_coverage": prepared.vector_coverage,
        "vectors_identity": asdict(prepared.vectors_identity) if prepared.vectors_identity else None,
        "info": prepared.info,
    }
    return arrays, meta


def _from_arrays(arrays: dict[str, np.ndarray], meta: dict) -> PreparedData:
    itos = arrays["vocab"].tobytes().decode("utf-8").split("\n")
    return PreparedData(
        corpus=meta["corpus"],
        vocab=Vocabulary(itos, meta["lowercase"], meta["min_count"]),
        labels=tuple(meta["labels"]),
        splits={name: EncodedSplit.from_arrays(name, arrays) for name in meta["splits"]},
        embedding_weight=arrays.get("embedding_weight"),
        embedding_trainable=arrays.get("embedding_trainable"),
        vector_coverage=meta["vector_coverage"],
        vectors_identity=VectorsIdentity(**meta["vectors_identity"])
        if meta["vectors_identity"]
        else None,
        from_cache=True,
        info=meta["info"],
    )


def prepare_data(config: DataConfig | Mapping, cache_dir: str | Path | None = None) -> PreparedData:
    """Read, tokenize, encode and load vectors for ``config``, or load the cached result.

    ``cache_dir`` defaults to ``<data dir>/prepared`` ($NLI_DATA_DIR or
    ~/.cache/nli-orchestrator). Missing corpus files raise FileNotFoundError naming the path.
    """
    start = time.perf_counter()
    if not isinstance(config, DataConfig):
        config = DataConfig.model_validate(config)
    files = resolve_files(config)
    cache_dir = (
        Path(cache_dir).expanduser() if cache_dir is not None else default_data_dir() / "prepared"
    )
    path = cache_dir / f"{config.corpus}-{cache_key(config, files)[:20]}.npz"
    cached = load_arrays(path) if path.is_file() else None
    if cached is not None:
        prepared = _from_arrays(*cached)
    else:
        prepared = _build(config, files)
        save_arrays(path, *_to_arrays(prepared))
    prepared.cache_path = str(path)
    prepared.seconds = time.perf_counter() - start
    return prepared
