"""What `orchestrate models` shows: registered models and each paper configuration's |θ|."""

from __future__ import annotations

from typing import Any

from nli_models import build_model, count_parameters, model_names, model_variants, paper_configs

# |θ|W+M depends on the vocabulary and on how many of its words have pretrained vectors. The
# catalogue reports it for Rocktäschel's SNLI setting: 12.1k words without word2vec vectors are
# tuned (footnote 1), the other rows stay fixed.
REFERENCE_VOCAB_SIZE = 36_000
REFERENCE_TUNED_WORDS = 12_100


def catalog() -> list[dict[str, Any]]:
    rows = []
    for paper in paper_configs():
        model = build_model(paper.model, **{**paper.config, "vocab_size": REFERENCE_VOCAB_SIZE})
        rows_mask = model.word_embeddings.trainable_rows
        rows_mask.zero_()
        rows_mask[:REFERENCE_TUNED_WORDS] = True
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
                    "tuned_words": REFERENCE_TUNED_WORDS,
                },
                "notes": paper.notes,
            }
        )
    return rows


def render_catalog(rows: list[dict[str, Any]]) -> str:
    lines = ["registered models:"]
    for name in model_names():
        lines.append(f"  {name:<14} variants: {', '.join(model_variants(name)) or '-'}")
    lines.append("")
    lines.append(f"{'paper row':<72} {'published |θ|M':>15} {'ours |θ|M':>10}")
    for row in rows:
        published = f"{row['published_theta_m']:,}" if row["published_theta_m"] else "-"
        lines.append(f"{row['paper'] + ': ' + row['table_row']:<72.72} {published:>15} {row['theta_m']:>10,}")
    return "\n".join(lines)
