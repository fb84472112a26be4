"""Text renderings of a table: Markdown, CSV or a LaTeX table (booktabs).

The results table is rendered through ``results_view``: for Markdown and LaTeX a compact set of
the columns a paper prints (corpus, model, the selected values of the searched hyperparameters,
|θ|M as a count like 252K, accuracies in percent as mean ± std over seeds, the test mean's 95%
interval, seeds and trials), optionally a majority-class baseline row and one row per seed; CSV
gets every numeric column of the wide view for spreadsheets. The Parquet file stays the complete,
machine-readable record. Floats show two decimals, nulls are empty cells.
"""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa

from results.params import short_value

# results-table column -> header in the wide (CSV) view
_WIDE = {
    "experiment": "experiment",
    "corpus": "corpus",
    "model_config": "model config",
    "k": "k",
    "theta_wm": "params (W+M)",
    "theta_m": "params (M)",
    "train_accuracy_running": "train (running)",
    "dev_accuracy": "dev",
    "dev_accuracy_std": "dev std",
    "test_accuracy": "test",
    "test_accuracy_std": "test std",
    "test_accuracy_ci95_low": "test 95% CI low",
    "test_accuracy_ci95_high": "test 95% CI high",
    "n_seeds": "seeds",
    "n_trials": "trials",
    "epochs_trained": "epochs",
    "total_trial_time_s": "compute (h)",
}
_PERCENT = [c for c in _WIDE if c.startswith(("train_accuracy", "dev_accuracy", "test_accuracy"))]
_COUNTS = ["k", "theta_wm", "theta_m", "n_seeds", "n_trials"]

_LATEX_SPECIALS = {c: "\\" + c for c in "&%$#_{}"} | {
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "\\": r"\textbackslash{}",
}


def format_count(value: float | int | None) -> str:
    """A parameter or example count as papers print it: 252103 -> '252K', 3_900_000 -> '3.9M',
    999 -> '999'; '' for a null."""
    if value is None or pd.isna(value):
        return ""
    value = int(value)
    for scale, suffix in ((10**9, "B"), (10**6, "M"), (10**3, "K")):
        if abs(value) >= scale:
            scaled = value / scale
            text = f"{scaled:.1f}" if abs(scaled) < 10 else f"{scaled:.0f}"
            return text.removesuffix(".0") + suffix
    return str(value)


# Names papers use for a hyperparameter (Rocktäschel et al.'s k is the hidden size).
_SHORT_NAMES = {"hidden_size": "k"}


def format_hyperparameters(values: dict) -> str:
    """{'lr': 0.0003, 'dropout': 0.1, 'hidden_size': 100} -> 'lr=3e-4 dropout=0.1 k=100'
    (in the given order)."""
    return " ".join(
        f"{_SHORT_NAMES.get(name, name)}={short_value(value)}" for name, value in values.items()
    )


def wide_view(table: pa.Table) -> pd.DataFrame:
    """Every numeric column of the results table a reader compares (CSV)."""
    frame = table.to_pandas()[list(_WIDE)]
    frame[_PERCENT] = frame[_PERCENT] * 100
    frame[_COUNTS] = frame[_COUNTS].astype("Int64")  # nulls made them float; show integers
    frame["total_trial_time_s"] = frame["total_trial_time_s"] / 3600
    return frame.rename(columns=_WIDE)


def _percent(value) -> str:
    return "" if value is None or pd.isna(value) else f"{value * 100:.2f}"


def _mean_std(mean, std) -> str:
    if mean is None or pd.isna(mean):
        return ""
    return _percent(mean) + ("" if std is None or pd.isna(std) else f" ± {_percent(std)}")


def _evaluation(index) -> str:
    """Which test evaluation a test number is, when it is not the sweep's first (--extend)."""
    return "" if index is None or pd.isna(index) or index <= 1 else f" (evaluation {int(index)})"


def _interval(low, high) -> str:
    if low is None or pd.isna(low):
        return ""
    return f"[{_percent(low)}, {_percent(high)}]"


def results_view(
    table: pa.Table,
    seeds: pa.Table | None = None,
    baselines: dict[str, tuple[str, float]] | None = None,
) -> pd.DataFrame:
    """The compact view (Markdown, LaTeX). ``seeds``: the per-seed table, whose rows follow
    their configuration's row; ``baselines``: corpus -> (majority class, its test share)."""
    frame = table.to_pandas()
    per_seed = seeds.to_pandas() if seeds is not None else None
    # The experiment only tells rows apart when one model appears twice on one corpus.
    show_experiment = bool(frame.duplicated(["corpus", "model_config"]).any())
    rows = []
    for corpus, (label, share) in sorted((baselines or {}).items()):
        rows.append({"corpus": corpus, "model": f"majority class ({label})", "test": _percent(share)})
    for _, row in frame.iterrows():
        rows.append(
            {
                "experiment": row["experiment"],
                "corpus": row["corpus"],
                "model": row["model_config"],
                "selected hyperparameters": format_hyperparameters(
                    json.loads(row["searched_hyperparameters"] or "{}")
                ),
                "|θ|M": format_count(row["theta_m"]),
                "train (running)": _percent(row["train_accuracy_running"]),
                "dev": _mean_std(row["dev_accuracy"], row["dev_accuracy_std"]),
                "test": _mean_std(row["test_accuracy"], row["test_accuracy_std"])
                + _evaluation(row["test_evaluation"]),
                "test 95% CI": _interval(row["test_accuracy_ci95_low"], row["test_accuracy_ci95_high"]),
                "seeds": str(row["n_seeds"]),
                "trials": str(row["n_trials"]),
            }
        )
        if per_seed is not None:
            mine = per_seed[
                (per_seed["experiment"] == row["experiment"])
                & (per_seed["model_config"] == row["model_config"])
            ]
            for _, seed in mine.iterrows():
                rows.append(
                    {
                        "experiment": row["experiment"],
                        "corpus": row["corpus"],
                        "model": f"  seed {seed['seed']}",
                        "train (running)": _percent(seed["train_accuracy_running"]),
                        "dev": _percent(seed["dev_accuracy"]),
                        "test": _percent(seed["test_accuracy"]),
                    }
                )
    columns = [
        "corpus", "model", "selected hyperparameters", "|θ|M", "train (running)", "dev", "test",
        "test 95% CI", "seeds", "trials",
    ]
    if show_experiment:
        columns.insert(0, "experiment")
    return pd.DataFrame(rows, columns=columns).fillna("")


def render(
    frame: pd.DataFrame, fmt: str, caption: str | None = None, label: str | None = None
) -> str:
    """``frame`` as Markdown, CSV or LaTeX; a LaTeX caption and label make it a table float."""
    if fmt == "csv":
        return frame.to_csv(index=False, float_format="%.2f")
    header = [str(c) for c in frame.columns]
    body = [[_cell(v) for v in row] for row in frame.itertuples(index=False)]
    if fmt == "md":
        return _markdown(header, body)
    return _latex(frame, header, body, caption, label)


def _cell(value: object) -> str:
    if pd.isna(value):
        return ""
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _markdown(header: list[str], body: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", r"\|") for c in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *map(line, body)]) + "\n"


def _latex_text(text: str) -> str:
    escaped = "".join(_LATEX_SPECIALS.get(ch, ch) for ch in text)
    # Unicode a pdflatex document without extra packages cannot set.
    return (
        escaped.replace("±", r"$\pm$").replace("|θ|", r"$|\theta|$").replace("θ", r"$\theta$")
    )


def _latex(
    frame: pd.DataFrame,
    header: list[str],
    body: list[list[str]],
    caption: str | None,
    label: str | None,
) -> str:
    align = "".join(_align(frame[c]) for c in frame.columns)

    def line(cells: list[str]) -> str:
        return " & ".join(_latex_text(c) for c in cells) + r" \\"

    tabular = [
        rf"\begin{{tabular}}{{{align}}}",
        r"\toprule",
        line(header),
        r"\midrule",
        *map(line, body),
        r"\bottomrule",
        r"\end{tabular}",
    ]
    if caption is None and label is None:
        return "\n".join(tabular) + "\n"
    float_lines = [r"\begin{table}[t]", r"\centering"]
    if caption is not None:
        float_lines.append(rf"\caption{{{_latex_text(caption)}}}")
    if label is not None:
        float_lines.append(rf"\label{{{label}}}")
    return "\n".join([*float_lines, *tabular, r"\end{table}"]) + "\n"


def _align(column: pd.Series) -> str:
    if pd.api.types.is_numeric_dtype(column.dtype):
        return "r"
    # Text columns of numbers ("82.00 ± 1.00", "252K") align right too.
    cells = [str(v) for v in column if str(v)]
    numeric = cells and all(c[:1].isdigit() or c[:1] in "[-" for c in cells)
    return "r" if numeric else "l"
