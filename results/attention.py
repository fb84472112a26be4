"""`orchestrate attention RUN`: premise-hypothesis attention heatmaps (Rocktäschel Figs. 2-3).

A trial's checkpoint artifact holds its weights and its training config, so the model and its
vocabulary are rebuilt from the run alone; the best-on-dev weights are used.

A model returns its attention padded to the longest sentence of the batch; each pair's panel is
cut to that pair's own words (its mask), so the labels are the pair's words whatever else shares
the batch. What an axis holds is known per model, not guessed from the tensor's size: the
decomposable model prepends a NULL token to both sentences (Parikh §3.3), Rocktäschel's
single-vector attention and CAM's intra-attention have one query row, and ABCNN's wide
convolution columns are not words (n + w - 1 of them for n words).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from matplotlib.figure import Figure

from nli_models.config import RunConfig, validate_config
from nli_models.data import prepare_data
from nli_models.data.batch import Batch
from nli_models.data.encode import make_batch
from nli_models.errors import InputError
from nli_models.strict import load_yaml
from nli_models.training import (
    CHECKPOINT_FILE,
    TRIAL_CONFIG_FILE,
    build_for_data,
    read_checkpoint,
)
from results.figures import figure_files, new_figure
from results.results_errors import ResultsError
from results.run_schema import ARTIFACT_CHECKPOINT_DIR

ATTENTION_ARTIFACT_DIR = "attention"
NULL_TOKEN = "NULL"

_QUERY_LABELS = {"rocktaschel": "$h_N$", "cam": "summary"}  # what a single query row is


@dataclass(frozen=True)
class AttentionMap:
    """One panel: a pair's attention cut to its own words, with the labels of both axes."""

    title: str
    weights: np.ndarray  # [len(row_labels), len(col_labels)]
    row_labels: list[str]
    col_labels: list[str]
    row_title: str
    col_title: str


def _sentences_of(name: str) -> tuple[str, str]:
    """(rows, columns) of a named attention tensor."""
    if name.startswith("premise_to_hypothesis"):
        return "premise", "hypothesis"
    if name.endswith("_intra"):
        sentence = name.removesuffix("_intra")
        return sentence, sentence
    return "hypothesis", "premise"  # hypothesis_to_premise; ABCNN maps are [B, Lh, Lp]


def _title(name: str) -> str:
    block = re.fullmatch(r"block(\d+)_(input|conv)", name)
    if block:
        where = "input words" if block[2] == "input" else "convolution columns"
        return f"ABCNN block {block[1]}: attention over {where}"
    if name.endswith("_intra"):
        return f"intra-sentence attention ({name.removesuffix('_intra')})"
    rows, cols = _sentences_of(name)
    return f"{rows} attends to {cols}"


def _has_query_row(model: str, variant: str | None, name: str) -> bool:
    return (model == "rocktaschel" and variant == "attention") or (
        model == "cam" and name.endswith("_intra")
    )


def _axis(
    model: str, name: str, sentence: str, tokens: list[str], size: int, padded: int
) -> tuple[list[str], str]:
    """Labels and title of the ``sentence`` axis of map ``name`` for one pair. ``size`` is the
    tensor's axis length, ``padded`` the batch's padded length of that sentence."""
    if model == "decomposable":
        return [NULL_TOKEN, *tokens], sentence
    if name.startswith("block") and name.endswith("_conv"):
        extra = size - padded  # wide convolution: w - 1 columns more than words
        return [str(i) for i in range(1, len(tokens) + extra + 1)], f"{sentence} (convolution column)"
    return tokens, sentence


def pair_maps(
    model: str,
    variant: str | None,
    weights: dict[str, torch.Tensor],
    batch: Batch,
    row: int,
    itos: Sequence[str],
) -> list[AttentionMap]:
    """The attention panels of batch row ``row``, each cut to that pair's words."""
    words = {
        "premise": [itos[t] for t in batch.premise[row][batch.premise_mask[row]].tolist()],
        "hypothesis": [itos[t] for t in batch.hypothesis[row][batch.hypothesis_mask[row]].tolist()],
    }
    padded = {"premise": batch.premise.shape[1], "hypothesis": batch.hypothesis.shape[1]}
    maps = []
    # Between-sentence maps first, then each sentence's own (intra) attention.
    for name, tensor in sorted(weights.items(), key=lambda item: (item[0].endswith("_intra"), item[0])):
        rows_of, cols_of = _sentences_of(name)
        cols, col_title = _axis(model, name, cols_of, words[cols_of], tensor.shape[2], padded[cols_of])
        if _has_query_row(model, variant, name):
            rows, row_title = [_QUERY_LABELS[model]], "query"
        else:
            rows, row_title = _axis(
                model, name, rows_of, words[rows_of], tensor.shape[1], padded[rows_of]
            )
        matrix = tensor[row, : len(rows), : len(cols)].float().numpy()
        maps.append(AttentionMap(_title(name), matrix, rows, cols, row_title, col_title))
    return maps


def draw_pair(maps: Sequence[AttentionMap], title: str) -> Figure:
    """The panels side by side on one shared 0-1 colour scale, sized to the words shown."""
    widths = [max(len(m.col_labels), 2) for m in maps]
    height = max(len(m.row_labels) for m in maps)
    width = max(0.32 * sum(widths) + 2.2 * len(maps) + 1.2, 0.1 * len(title) + 1.0, 4.5)
    figure = new_figure(width, max(3.2, 0.32 * height + 3.0))
    axes = figure.subplots(1, len(maps), squeeze=False, width_ratios=widths)[0]
    image = None
    for axis, panel in zip(axes, maps, strict=True):
        image = axis.imshow(panel.weights, cmap="Greys", vmin=0.0, vmax=1.0, aspect="equal")
        axis.set_xticks(range(len(panel.col_labels)), panel.col_labels, rotation=90)
        axis.set_yticks(range(len(panel.row_labels)), panel.row_labels)
        axis.xaxis.tick_top()
        axis.xaxis.set_label_position("top")
        axis.set_xlabel(panel.col_title, fontweight="bold")
        axis.set_ylabel(panel.row_title, fontweight="bold")
        axis.set_title(panel.title, fontsize="medium")  # placed above the top tick labels
    figure.colorbar(image, ax=list(axes), label="attention weight", shrink=0.8)
    figure.suptitle(title)
    return figure


def load_trial(run_id: str, client) -> tuple[RunConfig, dict]:
    """The run's training config and checkpoint payload (tensors and plain values only: a
    checkpoint holding anything else is refused unread, see read_checkpoint)."""
    with tempfile.TemporaryDirectory(prefix="nli-attention-") as local:
        try:
            folder = Path(client.download_artifacts(run_id, ARTIFACT_CHECKPOINT_DIR, local))
        except Exception as exc:  # MLflow raises several types for a missing artifact
            raise ResultsError(
                f"run {run_id} has no '{ARTIFACT_CHECKPOINT_DIR}' artifact: {exc}"
            ) from None
        if not (folder / TRIAL_CONFIG_FILE).exists():
            raise ResultsError(f"run {run_id}: checkpoint artifact lacks {TRIAL_CONFIG_FILE}")
        source = f"run {run_id}: {ARTIFACT_CHECKPOINT_DIR}/{TRIAL_CONFIG_FILE}"
        try:
            raw = load_yaml((folder / TRIAL_CONFIG_FILE).read_text())
        except yaml.YAMLError as exc:
            raise ResultsError(f"{source}: not valid YAML: {exc}") from None
        config = validate_config(RunConfig, raw, source)
        try:
            payload = read_checkpoint(folder / CHECKPOINT_FILE)
        except InputError as exc:  # name the run, not the temporary download folder
            raise ResultsError(
                f"run {run_id}: {ARTIFACT_CHECKPOINT_DIR}/"
                f"{str(exc).removeprefix(str(folder) + '/')}"
            ) from None
    return config, payload


def parse_pair_ids(text: str) -> list[int]:
    """'3,17' -> [3, 17]; InputError-style ResultsError naming the bad item."""
    ids = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit():
            raise ResultsError(f"--pair-ids: {item!r} is not a pair index (e.g. --pair-ids 3,17)")
        ids.append(int(item))
    return list(dict.fromkeys(ids))


def attention_heatmaps(
    client, run_id: str, pair_ids: Sequence[int], out_dir: Path, split: str = "dev"
) -> list[Path]:
    """Figures of the pairs ``pair_ids`` (indices into ``split``, file order) of a trial run,
    each as PNG, PDF and SVG; logged to the run under attention/. Returns the paths written."""
    config, payload = load_trial(run_id, client)
    data = prepare_data(config.data)
    if split not in data.splits:
        raise ResultsError(f"split {split!r} not in the run's data (has {', '.join(data.splits)})")
    size = len(data.splits[split])
    beyond = [i for i in pair_ids if i >= size]
    if beyond:
        raise ResultsError(
            f"pair id(s) {', '.join(map(str, beyond))} beyond the {split} split "
            f"({size} pairs, ids 0-{size - 1})"
        )
    model = build_for_data(config, data)
    model.load_state_dict(payload["best_model"] or payload["model"])
    model.eval()
    batch = make_batch(data.splits[split], np.asarray(pair_ids, dtype=np.int64))
    with torch.no_grad():
        logits, weights = model(*batch.inputs(), return_attention=True)
    if not weights:
        raise ResultsError(
            f"run {run_id}: model {config.model.name}/{config.model.variant} has no attention"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for row, pair_id in enumerate(pair_ids):
        maps = pair_maps(config.model.name, config.model.variant, weights, batch, row, data.vocab.itos)
        gold = data.labels[int(batch.label[row])]
        predicted = data.labels[int(logits[row].argmax())]
        model_name = "/".join(filter(None, (config.model.name, config.model.variant)))
        figure = draw_pair(
            maps, f"{model_name}, {split} pair {pair_id}: gold {gold}, predicted {predicted}"
        )
        for path, content in figure_files(figure, out_dir / f"attention_{split}_{pair_id:05d}.png"):
            path.write_bytes(content)
            written.append(path)
    for path in written:
        client.log_artifact(run_id, str(path), ATTENTION_ARTIFACT_DIR)
    return written
