"""`orchestrate attention RUN`: premise-hypothesis attention heatmaps (Rocktäschel Figs. 2-3).

A trial's checkpoint artifact holds its weights and its training config, so the model and its
vocabulary are rebuilt from the run alone; the best-on-dev weights are used.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from nli_models.config import RunConfig, validate_config  # noqa: E402
from nli_models.data import iterate_batches, prepare_data  # noqa: E402
from nli_models.errors import InputError  # noqa: E402
from nli_models.strict import load_yaml  # noqa: E402
from nli_models.training import (  # noqa: E402
    CHECKPOINT_FILE,
    TRIAL_CONFIG_FILE,
    build_for_data,
    read_checkpoint,
)
from results.errors import ResultsError  # noqa: E402
from results.run_schema import ARTIFACT_CHECKPOINT_DIR  # noqa: E402

ATTENTION_ARTIFACT_DIR = "attention"


def _axis_labels(size: int, tokens: list[str]) -> list[str]:
    """Tokens for an attention axis: the sentence, the sentence after a NULL token (Parikh), or
    positions when the axis is not word-aligned (ABCNN's wide convolution, a single query)."""
    if size == len(tokens):
        return tokens
    if size == len(tokens) + 1:
        return ["NULL", *tokens]
    return [str(i) for i in range(size)]


def _axes_of(name: str) -> tuple[str, str]:
    if name.startswith("hypothesis_to_premise"):
        return "hypothesis", "premise"
    if name.startswith("premise_to_hypothesis"):
        return "premise", "hypothesis"
    if name.endswith("_intra"):
        sentence = name.removesuffix("_intra")
        return sentence, sentence
    return "premise", "hypothesis"  # ABCNN attention matrices: rows s0, columns s1


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


def attention_heatmaps(client, run_id: str, pairs: int, out_dir: Path, split: str = "dev") -> list[Path]:
    config, payload = load_trial(run_id, client)
    data = prepare_data(config.data)
    if split not in data.splits:
        raise ResultsError(f"split {split!r} not in the run's data (has {', '.join(data.splits)})")
    model = build_for_data(config, data)
    model.load_state_dict(payload["best_model"] or payload["model"])
    model.eval()
    batch = next(iterate_batches(data.splits[split], pairs, shuffle=False))
    with torch.no_grad():
        logits, weights = model(*batch.inputs(), return_attention=True)
    if not weights:
        raise ResultsError(
            f"run {run_id}: model {config.model.name}/{config.model.variant} has no attention"
        )
    itos = data.vocab.itos
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for i in range(len(batch)):
        sentences = {
            "premise": [itos[t] for t in batch.premise[i][batch.premise_mask[i]].tolist()],
            "hypothesis": [itos[t] for t in batch.hypothesis[i][batch.hypothesis_mask[i]].tolist()],
        }
        figure, axes = plt.subplots(1, len(weights), figsize=(6 * len(weights), 5), squeeze=False)
        for axis, (name, tensor) in zip(axes[0], sorted(weights.items()), strict=True):
            rows_of, cols_of = _axes_of(name)
            rows = _axis_labels(tensor.shape[1], sentences[rows_of])
            cols = _axis_labels(tensor.shape[2], sentences[cols_of])
            matrix = tensor[i, : len(rows), : len(cols)].float().numpy()
            axis.imshow(matrix, cmap="Greys", aspect="auto")
            axis.set_xticks(range(len(cols)), cols, rotation=90)
            axis.set_yticks(range(len(rows)), rows)
            axis.set_title(name)
        gold = data.labels[int(batch.label[i])]
        predicted = data.labels[int(logits[i].argmax())]
        figure.suptitle(f"pair {i}: gold {gold}, predicted {predicted}")
        figure.tight_layout()
        path = out_dir / f"attention_{split}_{i:03d}.png"
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)
    for path in written:
        client.log_artifact(run_id, str(path), ATTENTION_ARTIFACT_DIR)
    return written
