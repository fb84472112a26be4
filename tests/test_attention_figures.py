"""Attention figures: each pair's panel carries that pair's own words, whatever shares its batch.

Regression for the labels sized by the padded batch (a made-up NULL column before Rocktäschel's
premise when it was one word shorter than the longest, padding drawn, indices instead of words).
Every registered model with attention is run on one batch of pairs of different lengths.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from testkit.batches import padded

from nli_models import build_model, model_names, model_variants
from nli_models.data.batch import Batch
from nli_models.registry import model_arguments
from results.attention import NULL_TOKEN, draw_pair, pair_maps, parse_pair_ids
from results.results_errors import ResultsError

pytestmark = pytest.mark.unit

ITOS = ["<pad>", "<unk>", *(f"w{i}" for i in range(2, 40))]
# Premises 7, 6 (one shorter than the longest: the old NULL shift), 2 and hypotheses 3, 6, 1.
PREMISES = [[2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14], [15, 16]]
HYPOTHESES = [[20, 21, 22], [23, 24, 25, 26, 27, 28], [29]]


def _batch() -> Batch:
    return Batch(*padded(PREMISES), *padded(HYPOTHESES), torch.tensor([0, 1, 2]))


def _cases():
    for name in model_names():
        for variant in model_variants(name):
            if (name, variant) not in {("rocktaschel", "conditional"), ("abcnn", "bcnn")}:
                yield pytest.param(name, variant, id=f"{name}-{variant}")


def _model(name: str, variant: str):
    torch.manual_seed(0)
    extra = {"projection_dim": 8} if "projection_dim" in model_arguments(name) else {}
    args = dict(vocab_size=len(ITOS), embedding_dim=8, hidden_size=8, dropout=0.0, num_classes=3)
    return build_model(name, variant=variant, **args, **extra).eval()


def _words(ids):
    return [ITOS[i] for i in ids]


@pytest.mark.parametrize("name, variant", list(_cases()))
def test_every_panel_holds_its_own_pairs_words(name, variant):
    batch = _batch()
    with torch.no_grad():
        _, weights = _model(name, variant)(*batch.inputs(), return_attention=True)
    assert weights
    for row in range(len(batch)):
        sentences = {"premise": _words(PREMISES[row]), "hypothesis": _words(HYPOTHESES[row])}
        for panel in pair_maps(name, variant, weights, batch, row, ITOS):
            assert panel.weights.shape == (len(panel.row_labels), len(panel.col_labels))
            for labels, title in ((panel.row_labels, panel.row_title), (panel.col_labels, panel.col_title)):
                sentence = title.split(" ")[0]
                if title == "query":
                    assert len(labels) == 1
                elif "convolution" in title:  # wide convolution: n + w - 1 columns, numbered
                    assert len(labels) > len(sentences[sentence])
                    assert labels == [str(i) for i in range(1, len(labels) + 1)]
                elif name == "decomposable":
                    assert labels == [NULL_TOKEN, *sentences[sentence]], (panel.title, row)
                else:
                    assert labels == sentences[sentence], (panel.title, row)
            if not panel.title.startswith("ABCNN"):
                # Softmax rows over the pair's own words sum to 1: no padding column is drawn
                # and none of the pair's words is cut off.
                np.testing.assert_allclose(panel.weights.sum(axis=1), 1.0, atol=1e-5)


def test_rocktaschel_word_by_word_figure_ticks_are_the_words(tmp_path):
    batch = _batch()
    with torch.no_grad():
        _, weights = _model("rocktaschel", "word_by_word")(*batch.inputs(), return_attention=True)
    maps = pair_maps("rocktaschel", "word_by_word", weights, batch, 1, ITOS)
    figure = draw_pair(maps, "rocktaschel/word_by_word, dev pair 17: gold neutral, predicted neutral")
    axis = figure.axes[0]
    assert [t.get_text() for t in axis.get_xticklabels()] == _words(PREMISES[1])
    assert [t.get_text() for t in axis.get_yticklabels()] == _words(HYPOTHESES[1])
    assert axis.get_xlabel() == "premise" and axis.get_ylabel() == "hypothesis"
    assert axis.get_title() == "hypothesis attends to premise"
    assert any(a.get_label() == "<colorbar>" for a in figure.axes)  # the colour bar
    for fmt in ("png", "pdf", "svg"):
        figure.savefig(tmp_path / f"pair.{fmt}")
        assert (tmp_path / f"pair.{fmt}").stat().st_size > 1000


def test_pair_ids_are_parsed_and_bad_ones_named():
    assert parse_pair_ids("3, 17,3") == [3, 17]
    with pytest.raises(ResultsError, match="'x'"):
        parse_pair_ids("3,x")


def test_bad_pair_ids_are_a_usage_error_before_anything_is_read(tmp_path):
    from click.testing import CliRunner

    from orchestrator.cli.orchestrate import main

    result = CliRunner().invoke(
        main,
        ["attention", "0123", "--pair-ids", "3,x", "--out", str(tmp_path / "maps"),
         "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"],
    )
    assert result.exit_code == 2 and "'x' is not a pair index" in result.output
    assert not (tmp_path / "maps").exists() and not (tmp_path / "none.db").exists()
