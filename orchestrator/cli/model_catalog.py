"""What `orchestrate models` shows: registered models and each paper configuration's |θ|.

Counting builds two dozen models at a 36k-word vocabulary (half a minute with torch's import on a
busy machine), so the catalog is computed once and shipped as model_catalog.json, which the
command reads without importing torch; tests/test_cli_models.py recomputes it and fails, naming
the command that rewrites it (`python -m orchestrator.cli.model_catalog`), when a model changed."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

CATALOG_FILE = resources.files("orchestrator.cli").joinpath("model_catalog.json")

# |θ|W+M depends on the vocabulary and on which of its rows are tuned, which each paper fixes:
# - rocktaschel2016: word2vec rows fixed, the 12.1k SNLI words without a vector tuned (footnote 1:
#   "resulting in 3.65M tunable parameters");
# - gajbhiye2018: the same policy (train_oov: GloVe rows fixed, OOV rows tuned); the paper gives no
#   OOV count, so Rocktäschel's SNLI count stands in as the reference;
# - parikh2016: "All embeddings remain fixed during training" (§5.1), OOV words hashed to fixed
#   random vectors: |θ|W+M = |θ|M;
# - yin2016: word2vec rows fixed, one fixed random vector for every OOV word: |θ|W+M = |θ|M.
REFERENCE_VOCAB_SIZE = 36_000
TUNED_WORDS = {
    "rocktaschel2016": 12_100,
    "gajbhiye2018": 12_100,
    "parikh2016": 0,
    "yin2016": 0,
}


def compute_catalog() -> dict[str, Any]:
    """Registered models with their variants, and every paper configuration's |θ|M and |θ|W+M."""
    from nli_models import build_model, count_parameters, model_names, model_variants, paper_configs

    rows = []
    for paper in paper_configs():
        model = build_model(paper.model, **{**paper.config, "vocab_size": REFERENCE_VOCAB_SIZE})
        tuned_words = TUNED_WORDS[paper.paper]
        rows_mask = model.word_embeddings.trainable_rows
        rows_mask.zero_()
        rows_mask[:tuned_words] = True
        theta_m, theta_wm = count_parameters(model)
        rows.append(
            {
                "name": paper.model,
                "config": paper.config,
                "paper": paper.paper,
                "table_row": paper.table_row,
                "published_theta_m": paper.published_theta_m,
                "theta_m": theta_m,
                "theta_wm": theta_wm,
                "reference_vocab": {
                    "size": REFERENCE_VOCAB_SIZE,
                    "tuned_words": tuned_words,
                },
                "notes": paper.notes,
            }
        )
    return {"models": {name: list(model_variants(name)) for name in model_names()}, "papers": rows}


def shipped_catalog() -> dict[str, Any]:
    return json.loads(CATALOG_FILE.read_text(encoding="utf-8"))


def render_catalog(catalog: dict[str, Any]) -> str:
    lines = ["registered models:"]
    for name, variants in catalog["models"].items():
        lines.append(f"  {name:<14} variants: {', '.join(variants) or '-'}")
    lines.append("")
    lines.append(f"{'paper row':<72} {'published |θ|M':>15} {'ours |θ|M':>10} {'ours |θ|W+M':>12}")
    for row in catalog["papers"]:
        published = f"{row['published_theta_m']:,}" if row["published_theta_m"] else "-"
        lines.append(
            f"{row['paper'] + ': ' + row['table_row']:<72.72} {published:>15} "
            f"{row['theta_m']:>10,} {row['theta_wm']:>12,}"
        )
    lines.append(
        f"(|θ|W+M: the tuned embedding rows at a {REFERENCE_VOCAB_SIZE:,}-word vocabulary, as each "
        "paper tunes them)"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    CATALOG_FILE.write_text(json.dumps(compute_catalog(), indent=1) + "\n", encoding="utf-8")
