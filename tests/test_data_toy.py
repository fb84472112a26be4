"""The synthetic toy corpus."""

from collections import Counter

import pytest
import torch
from torch import nn

from nli_models.data import batch_indices, iterate_batches, make_toy_corpus, prepare_data

pytestmark = pytest.mark.unit


def test_toy_is_deterministic_and_seed_dependent():
    first = make_toy_corpus(size=600, seed=4)
    again = make_toy_corpus(size=600, seed=4)
    other = make_toy_corpus(size=600, seed=5)
    assert first["train"].examples == again["train"].examples
    assert first["train"].examples != other["train"].examples


def test_toy_splits_are_label_balanced_and_share_no_premise():
    corpus = make_toy_corpus(size=900, seed=0)
    assert sum(len(split) for split in corpus.values()) == 900
    assert [len(corpus[name]) for name in ("train", "dev", "test")] == [720, 90, 90]
    for split in corpus.values():
        counts = Counter(e.label for e in split.examples)
        assert set(counts) == {"entailment", "neutral", "contradiction"}
        assert len(set(counts.values())) == 1
        assert split.meta["synthetic"] is True
    premises = [{e.premise for e in corpus[name].examples} for name in ("train", "dev", "test")]
    assert not (premises[0] & premises[1] or premises[0] & premises[2] or premises[1] & premises[2])


def test_toy_hypotheses_follow_their_rule():
    for e in make_toy_corpus(size=300, seed=1)["train"].examples:
        assert e.hypothesis != e.premise
        if e.label == "neutral":  # adds information: longer than the premise
            assert len(e.hypothesis.split()) > len(e.premise.split())
        if e.label == "entailment":  # never longer: hypernyms and dropped modifiers
            assert len(e.hypothesis.split()) <= len(e.premise.split()) + 1


def test_toy_two_classes_balanced():
    corpus = make_toy_corpus(size=400, seed=0, num_classes=2)
    assert corpus["train"].labels == ("entailment", "not_entailment")
    counts = Counter(e.label for e in corpus["train"].examples)
    assert counts["entailment"] == counts["not_entailment"]
    with pytest.raises(ValueError, match="num_classes"):
        make_toy_corpus(num_classes=4)
    with pytest.raises(ValueError, match="toy size"):
        make_toy_corpus(size=3)


def test_toy_is_learnable_by_a_bag_of_words_model_in_a_few_epochs(tmp_path):
    """The corpus is meant for smoke tests: even averaged word vectors must learn it quickly."""
    torch.manual_seed(0)
    data = prepare_data({"corpus": "toy", "toy": {"size": 1500}}, cache_dir=tmp_path)
    embed = nn.EmbeddingBag(len(data.vocab), 32, mode="mean", padding_idx=0)
    mlp = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, data.num_classes))
    optimizer = torch.optim.Adam([*embed.parameters(), *mlp.parameters()], lr=3e-3)
    train, dev_split = data.splits["train"], data.splits["dev"]

    def logits(batch):
        p, h = embed(batch.premise), embed(batch.hypothesis)
        return mlp(torch.cat([p, h, p - h, p * h], dim=1))

    for epoch in range(6):
        for batch in iterate_batches(train, batch_indices(train, 32, shuffle=True, seed=0, epoch=epoch)):
            loss = nn.functional.cross_entropy(logits(batch), batch.label)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        dev = list(iterate_batches(dev_split, batch_indices(dev_split, 100, shuffle=False)))
        correct = sum(int((logits(b).argmax(1) == b.label).sum()) for b in dev)
    assert correct / len(dev_split) > 0.8
