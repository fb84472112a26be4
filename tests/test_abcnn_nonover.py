"""ABCNN's NONOVER copy (Yin et al. §5.4): the pair without its shared words, read by a second
network whose scores join the ORIG network's in the one LR layer."""

from __future__ import annotations

import pytest
import torch

from nli_models.data.text import UNK_INDEX
from nli_models.models.abcnn import nonoverlapping
from nli_models.models.pair_classifier import Sentences
from nli_models.registry import build_model

pytestmark = pytest.mark.unit

# Table 5's pairs in SICK's own casing: the shared sentence-initial "A" goes, "a full" stays.
TABLE_5 = [
    ("Children in red shirts are playing in the leaves", "Three kids are sitting in the leaves",
     "Children red shirts playing", "Three kids sitting"),
    ("Three boys are jumping in the leaves", "Three kids are jumping in the leaves", "boys", "kids"),
    ("A man is jumping into an empty pool", "A man is jumping into a full pool", "an empty", "a full"),
]
WORDS = ["<pad>", "<unk>", *sorted({w for row in TABLE_5 for text in row for w in text.split()})]
INDEX = {word: i for i, word in enumerate(WORDS)}


def sentences(texts: list[str], length: int = 12) -> Sentences:
    ids = torch.zeros(len(texts), length, dtype=torch.long)
    for row, text in enumerate(texts):
        ids[row, : len(text.split())] = torch.tensor([INDEX[w] for w in text.split()])
    return Sentences(ids, ids != 0)


def words(batch: Sentences) -> list[str]:
    return [" ".join(WORDS[i] for i in ids[mask]) for ids, mask in zip(*batch, strict=True)]


def test_nonover_removes_shared_words_case_sensitively_as_table_5():
    premise = sentences([row[0] for row in TABLE_5])
    hypothesis = sentences([row[1] for row in TABLE_5])
    assert words(nonoverlapping(premise, hypothesis)) == [row[2] for row in TABLE_5]
    assert words(nonoverlapping(hypothesis, premise)) == [row[3] for row in TABLE_5]


def test_a_sentence_with_only_shared_words_becomes_the_single_empty_token():
    same = sentences(["A man is jumping", "Three kids"])
    other = sentences(["A man is jumping into a full pool", "kids"])
    result = nonoverlapping(same, other)
    assert result.ids[0].tolist() == [UNK_INDEX] and result.mask.tolist() == [[True], [True]]
    assert words(result) == ["<unk>", "Three"]


def model(nonover: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("abcnn", vocab_size=len(WORDS), embedding_dim=6, num_classes=3,
                       variant="abcnn3", hidden_size=4, num_blocks=2, max_length=12,
                       nonover=nonover).eval()


@pytest.mark.parametrize("phase", [1, 2])
def test_lr_columns_are_orig_then_nonover_per_block(phase):
    """With the NONOVER columns of the LR layer zeroed, the network is the ORIG network (same
    weights), in every layerwise phase: the scores are ordered block by block."""
    plain, both = model(False), model(True)
    both.load_state_dict({**both.state_dict(), **{k: v for k, v in plain.state_dict().items() if k != "output.weight"}})
    weight = torch.zeros_like(both.output.weight).view(3, -1, 2, 2)  # class, block, copy, score
    weight[:, :, 0] = plain.output.weight.view(3, -1, 2)
    both.output.weight.data.copy_(weight.view(3, -1))
    plain.train_blocks_up_to(phase)
    both.train_blocks_up_to(phase)
    batch = (*sentences([r[0] for r in TABLE_5]), *sentences([r[1] for r in TABLE_5]))
    torch.testing.assert_close(both(*batch), plain(*batch))
    trainable = {name for name, p in both.named_parameters() if p.requires_grad}
    assert {f"nonover_blocks.{phase - 1}.conv.weight", f"blocks.{phase - 1}.conv.weight"} <= trainable
    assert not any(name.startswith(f"nonover_blocks.{2 - phase}.") for name in trainable)


def test_nonover_scores_change_the_output():
    both = model(True)
    batch = (*sentences([r[0] for r in TABLE_5]), *sentences([r[1] for r in TABLE_5]))
    before = both(*batch)
    with torch.no_grad():
        both.nonover_blocks[1].conv.bias.add_(1.0)
    assert not torch.allclose(both(*batch), before)
