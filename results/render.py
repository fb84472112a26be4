"""Text renderings of a table: Markdown, CSV or a LaTeX tabular.

The results table is rendered through ``results_view``: the columns a reader compares, with
accuracies in percent and compute time in hours. The Parquet file stays the complete,
machine-readable record; every format shows the same view, floats with two decimals and nulls
as empty cells.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    import pandas as pd  # imported where used: `orchestrate --help` must not load pandas

SUFFIXES = {"md": ".md", "csv": ".csv", "latex": ".tex"}

# results-table column -> header in the rendered view
_VIEW = {
    "experiment": "experiment",
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
_PERCENT = [c for c in _VIEW if c.startswith(("train_accuracy", "dev_accuracy", "test_accuracy"))]
_COUNTS = ["k", "theta_wm", "theta_m", "n_seeds", "n_trials"]

_LATEX_SPECIALS = {c: "\\" + c for c in "&%$#_{}"} | {
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "\\": r"\textbackslash{}",
}


def results_view(table: pa.Table) -> pd.DataFrame:
    frame = table.to_pandas()[list(_VIEW)]
    frame[_PERCENT] = frame[_PERCENT] * 100
    frame[_COUNTS] = frame[_COUNTS].astype("Int64")  # nulls made them float; show integers
    frame["total_trial_time_s"] = frame["total_trial_time_s"] / 3600
    return frame.rename(columns=_VIEW)


def render(frame: pd.DataFrame, fmt: str) -> str:
    if fmt == "csv":
        return frame.to_csv(index=False, float_format="%.2f")
    header = [str(c) for c in frame.columns]
    body = [[_cell(v) for v in row] for row in frame.itertuples(index=False)]
    return _markdown(header, body) if fmt == "md" else _latex(frame, header, body)


def _cell(value: object) -> str:
    import pandas as pd

    if pd.isna(value):
        return ""
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _markdown(header: list[str], body: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", r"\|") for c in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *map(line, body)]) + "\n"


def _latex(frame: pd.DataFrame, header: list[str], body: list[list[str]]) -> str:
    import pandas as pd

    align = "".join("r" if pd.api.types.is_numeric_dtype(t) else "l" for t in frame.dtypes)

    def line(cells: list[str]) -> str:
        return " & ".join("".join(_LATEX_SPECIALS.get(ch, ch) for ch in c) for c in cells) + r" \\"

    return (
        "\n".join(
            [
                rf"\begin{{tabular}}{{{align}}}",
                r"\hline",
                line(header),
                r"\hline",
                *map(line, body),
                r"\hline",
                r"\end{tabular}",
            ]
        )
        + "\n"
    )
