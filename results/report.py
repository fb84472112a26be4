"""`orchestrate report EXPERIMENT --out DIR`: one page per experiment that a reviewer can read
without the tool, as self-contained HTML (figures embedded as base64 PNG) and as Markdown (figures
beside it in EXPERIMENT_files/).

Everything on the page comes from the tracking store: the sweeps' tags and provenance artifacts
(provenance/data.json, provenance/environment.json, spec.yaml), the trial runs, the results
table, the selected runs' test predictions. What the store does not hold is said so on the page
("not recorded"), never guessed. The last section answers the ACL Rolling Review Responsible NLP
checklist from the record and lists the items only the authors can answer.
"""

from __future__ import annotations

import base64
import html
import json
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import yaml
from matplotlib.figure import Figure
from mlflow import MlflowClient
from mlflow.entities import Experiment, Run

from results import run_schema as rs
from results.analysis import (
    importance_with_notes,
    plot_importance,
    plot_learning_curves,
    plot_parallel_coordinates,
    top_trials,
)
from results.atomic_files import file_stem
from results.compare import compare_predictions, describe_comparison
from results.evp import evp_table, plot_evp
from results.figures import figure_bytes, new_figure
from results.pareto import describe_front, pareto_front, plot_front, sweep_objectives
from results.predictions import majority_class, read_predictions
from results.render import format_count, format_hyperparameters, render, results_view
from results.results_errors import ResultsError
from results.run_reader import (
    TrialRun,
    download_predictions,
    fetch_test_metrics,
    load_trials,
    metric_histories,
    sweep_metric,
)
from results.sweeps import observed_state
from results.table import build_table

NOT_RECORDED = "not recorded"


# -- blocks: one description of the page, rendered to HTML and Markdown -------------------------
@dataclass
class Section:
    title: str
    blocks: list = field(default_factory=list)

    def text(self, markdown: str) -> Section:
        self.blocks.append(("text", markdown))
        return self

    def bullets(self, items: Sequence[str]) -> Section:
        self.blocks.append(("bullets", list(items)))
        return self

    def table(self, frame: pd.DataFrame) -> Section:
        self.blocks.append(("table", frame))
        return self

    def figure(self, figure: Figure | None, name: str, caption: str) -> Section:
        if figure is not None:
            self.blocks.append(("figure", (figure_bytes(figure, "png"), name, caption)))
        return self

    def code(self, text: str) -> Section:
        self.blocks.append(("code", text))
        return self


def _inline_html(text: str) -> str:
    """Markdown's `code` and **bold** in escaped text, the only inline marks the page uses."""
    parts = html.escape(text).split("`")
    out = "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))
    bold = out.split("**")
    return "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(bold))


_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#1d1d1f;line-height:1.45}
h1{font-size:1.7em;border-bottom:2px solid #333;padding-bottom:.2em}
h2{font-size:1.3em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.8em 0;font-size:.9em}
th,td{border-top:1px solid #ddd;border-bottom:1px solid #ddd;padding:.3em .6em;text-align:left;
vertical-align:top}
th{background:#f3f3f3}
figure{margin:1em 0}
img{max-width:100%;max-height:460px;border:1px solid #eee}
figcaption{font-size:.9em;color:#555}
code,pre{background:#f6f6f6;font-size:.88em}
pre{padding:.6em;white-space:pre-wrap}
"""


def to_html(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    body = [f"<h1>{html.escape(title)}</h1>", f"<p>{_inline_html(subtitle)}</p>", "<nav><ol>"]
    body += [f'<li><a href="#s{i}">{html.escape(s.title)}</a></li>' for i, s in enumerate(sections)]
    body.append("</ol></nav>")
    for i, section in enumerate(sections):
        body.append(f'<h2 id="s{i}">{html.escape(section.title)}</h2>')
        for kind, content in section.blocks:
            if kind == "text":
                body.append(f"<p>{_inline_html(content)}</p>")
            elif kind == "bullets":
                items = "".join(f"<li>{_inline_html(item)}</li>" for item in content)
                body.append(f"<ul>{items}</ul>")
            elif kind == "table":
                body.append(content.to_html(index=False, escape=True, na_rep="", border=0))
            elif kind == "code":
                body.append(f"<pre>{html.escape(content)}</pre>")
            else:
                png, name, caption = content
                data = base64.b64encode(png).decode()
                body.append(
                    f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
                    f"<figcaption>{_inline_html(caption)}</figcaption></figure>"
                )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


def _markdown_inline(text: str) -> str:
    """`text` for Markdown, escaped as the HTML page escapes it: <, > and & as entities and [ ]
    backslashed outside `code` spans (whose content Markdown shows as is). Values from the store
    (experiment names, params, tags) may hold backticks that would move a span's end: a text
    whose backticks do not pair up one by one is escaped whole."""
    def escape(part: str) -> str:
        return html.escape(part, quote=False).replace("[", r"\[").replace("]", r"\]")

    if "``" in text or "\\`" in text or text.count("`") % 2:
        return escape(text)
    parts = text.split("`")
    return "`".join(p if i % 2 else escape(p) for i, p in enumerate(parts))


def _markdown_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """Every cell as escaped text on one line (a newline would end the table's row)."""
    text = frame.astype(object).fillna("")
    return text.map(lambda v: _markdown_inline(" ".join(v.splitlines())) if isinstance(v, str) else v)


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in `text`, which cannot end it early."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def to_markdown(
    title: str, subtitle: str, sections: Sequence[Section], image_dir: str
) -> tuple[str, list[tuple[str, bytes]]]:
    """The page as Markdown and its images as (relative path, PNG bytes). What comes from the
    store is escaped as in the HTML page: raw HTML in a name or param shows as text."""
    md = _markdown_inline
    lines, images = [f"# {md(title)}", "", md(subtitle), ""], []
    for section in sections:
        lines += [f"## {md(section.title)}", ""]
        for kind, content in section.blocks:
            if kind == "text":
                lines += [md(content), ""]
            elif kind == "bullets":
                lines += [*(f"- {md(item)}" for item in content), ""]
            elif kind == "table":
                lines += [render(_markdown_cells(content), "md")]
            elif kind == "code":
                fence = _fence(content)
                lines += [fence, content.rstrip(), fence, ""]
            else:
                png, name, caption = content
                path = f"{image_dir}/{name}.png"
                images.append((path, png))
                lines += [f"![{md(caption)}]({path})", "", f"*{md(caption)}*", ""]
    return "\n".join(lines), images


# -- reading the record ------------------------------------------------------------------------
@dataclass
class Record:
    experiment: Experiment
    sweeps: list[Run]
    trials: list[TrialRun]
    table: pa.Table
    artifacts: dict[str, dict]  # parent run id -> {"data": ..., "environment": ..., "spec": ...}
    predictions: dict[str, pd.DataFrame]  # selected run id -> test predictions
    histories: dict[str, list[tuple[int, float]]]


def _artifact(client: MlflowClient, run_id: str, path: str, scratch: Path):
    try:
        local = Path(client.download_artifacts(run_id, path, str(scratch / run_id)))
    except Exception:  # absent artifact: MLflow raises several types; the page says so
        return None
    text = local.read_text()
    return json.loads(text) if path.endswith(".json") else yaml.safe_load(text)


def read_record(client: MlflowClient, experiment: Experiment) -> Record:
    sweeps = client.search_runs(
        [experiment.experiment_id],
        f"tags.`{rs.TAG_ROLE}` = '{rs.ROLE_SWEEP}'",
        order_by=["attributes.start_time ASC"],
    )
    trials = load_trials(client, [experiment])
    table = build_table(trials, lambda run_id: fetch_test_metrics(client, run_id), [experiment.name])
    artifacts, predictions = {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        for sweep in sweeps:
            run_id = sweep.info.run_id
            artifacts[run_id] = {
                "data": _artifact(client, run_id, rs.ARTIFACT_DATA_RECORD, Path(scratch)),
                "environment": _artifact(client, run_id, rs.ARTIFACT_ENVIRONMENT, Path(scratch)),
                "spec": _artifact(client, run_id, rs.ARTIFACT_SPEC, Path(scratch)),
            }
        for run_id in table.column("selected_run_id").to_pylist():
            try:
                path = download_predictions(client, run_id, Path(scratch) / run_id)
            except ResultsError:
                continue
            predictions[run_id] = read_predictions(path)
    top = top_trials(trials, experiment.name)
    histories = metric_histories(client, [t.record.run_id for t in top], rs.METRIC_DEV_ACCURACY)
    return Record(experiment, sweeps, trials, table, artifacts, predictions, histories)


# -- sections ----------------------------------------------------------------------------------
def _time(ms: int | None) -> str:
    if not ms:
        return NOT_RECORDED
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _hours(seconds: float | None) -> str:
    return NOT_RECORDED if seconds is None else f"{seconds / 3600:.2f} h"


def _present(param: str | None) -> str | None:
    """A logged param, None when absent or logged as the text 'None'."""
    return None if param in (None, "None") else param


def _state(run: Run) -> str:
    """The sweep's state as every reader sees it (a dead driver's `running` is `interrupted`)."""
    return observed_state(run.data.tags) if rs.TAG_SWEEP_STATE in run.data.tags else NOT_RECORDED


def _devices(tags: dict[str, str], environment: dict) -> str:
    """What the sweep's trials trained on (nli.trial_devices); sweeps recorded before it carry
    only the driver's guess (environment.json's `device`)."""
    return tags.get(rs.TAG_TRIAL_DEVICES) or environment.get("device", NOT_RECORDED)


def _test_evaluation(tags) -> str:
    """Which test evaluation the sweep's test accuracy is, once --extend evaluated test again."""
    evaluation = rs.evaluation_of(tags)
    return f" (test evaluation {evaluation})" if evaluation > 1 else ""


def provenance_section(record: Record) -> Section:
    section = Section("Provenance")
    rows = []
    for sweep in record.sweeps:
        tags, info = sweep.data.tags, sweep.info
        environment = record.artifacts[info.run_id]["environment"] or {}
        packages = environment.get("packages") or {}
        versions = {
            "python": environment.get("python") or tags.get(rs.TAG_PYTHON_VERSION),
            "torch": packages.get("torch") or tags.get(rs.TAG_TORCH_VERSION),
            "ray": packages.get("ray") or tags.get(rs.TAG_RAY_VERSION),
            "mlflow": packages.get("mlflow"),
            "optuna": packages.get("optuna"),
        }
        gpus = environment.get("gpus")
        memory = environment.get("memory_bytes")
        rows.append(
            {
                "sweep run": info.run_id[:12],
                "state": _state(sweep),
                "started": _time(info.start_time),
                "wall time": _hours((info.end_time - info.start_time) / 1000)
                if info.end_time
                else NOT_RECORDED,
                "git commit": tags.get(rs.TAG_GIT_COMMIT, NOT_RECORDED)[:12],
                "dirty": tags.get(rs.TAG_GIT_DIRTY, NOT_RECORDED),
                "spec hash": tags.get(rs.TAG_SPEC_HASH, NOT_RECORDED)[:12],
                "versions": ", ".join(f"{k} {v}" for k, v in versions.items() if v) or NOT_RECORDED,
                "host": tags.get(rs.TAG_HOST, NOT_RECORDED),
                "hardware": NOT_RECORDED
                if not environment
                else f"{environment.get('cpu_count')} CPUs, "
                + (f"{memory / 2**30:.0f} GiB, " if memory else "")
                + (", ".join(gpus) if gpus else "no GPU"),
                "device": _devices(tags, environment),
                "best dev / test (%)": " / ".join(
                    "-" if v is None else f"{v * 100:.2f}"
                    for v in (
                        sweep_metric(sweep, rs.METRIC_SWEEP_BEST_DEV_ACCURACY),
                        sweep_metric(sweep, rs.METRIC_SWEEP_TEST_ACCURACY),
                    )
                )
                + _test_evaluation(tags),
            }
        )
    if rows:
        section.table(pd.DataFrame(rows))
    else:
        section.text("No sweep (parent) run in this experiment: provenance not recorded.")
    dirty = [r for r in rows if r["dirty"] == "true"]
    if dirty:
        section.text(
            f"**Warning**: {len(dirty)} sweep(s) ran from a working tree with uncommitted changes; "
            "the commit alone does not reproduce them."
        )
    return section


def data_section(record: Record) -> Section:
    section = Section("Data")
    shown = False
    for sweep in record.sweeps:
        data = record.artifacts[sweep.info.run_id]["data"]
        if not data:
            continue
        if shown and data == record.artifacts[record.sweeps[0].info.run_id]["data"]:
            continue
        shown = True
        files = data.get("files") or {}
        section.text(f"Corpus `{data['corpus']}` (sweep {sweep.info.run_id[:12]}).")
        if files:
            section.table(
                pd.DataFrame(
                    [
                        {"split": split, "file": f["path"], "SHA-256": f["sha256"],
                         "size": f"{f['bytes']:,} B"}
                        for split, f in files.items()
                    ]
                )
            )
        else:
            section.text("No corpus files: the data is generated from its configuration:")
            config = {k: v for k, v in (data.get("config") or {}).items() if v not in (None, {}, [])}
            section.code(json.dumps(config))
        coverage = data.get("vector_coverage")
        section.bullets(
            [
                "pairs per split: "
                + ", ".join(f"{k} {v:,}" for k, v in (data.get("splits") or {}).items()),
                f"classes: {', '.join(data.get('labels') or [])}",
                f"vocabulary: {data.get('vocabulary_size', NOT_RECORDED):,} words",
                "word vectors: "
                + (
                    f"{(data.get('vectors') or {}).get('source')}, {data.get('embedding_dim')}-d, "
                    f"covering {coverage:.1%} of the vocabulary"
                    if data.get("vectors") and coverage is not None
                    else "none (trained from scratch)"
                ),
            ]
        )
    if not shown:
        corpora = sorted({t.corpus for t in record.trials if t.corpus})
        section.text(
            f"Corpus: {', '.join(corpora) or NOT_RECORDED}. Files, SHA-256, sizes, vocabulary and "
            f"vector coverage: {NOT_RECORDED} (the sweeps predate the "
            f"`{rs.ARTIFACT_DATA_RECORD}` artifact)."
        )
    return section


def search_section(record: Record) -> Section:
    section = Section("Hyperparameter search")
    statuses = pd.Series([t.record.status for t in record.trials]).value_counts().to_dict()
    for sweep in record.sweeps:
        params = sweep.data.params
        spec = record.artifacts[sweep.info.run_id]["spec"] or {}
        search = spec.get("search") or {}
        space = params.get("search_space") or (json.dumps(search.get("space")) if search else None)
        section.text(f"Sweep {sweep.info.run_id[:12]} ({_state(sweep)}):")
        section.bullets(
            [
                f"model: {params.get('model') or (spec.get('model') or {}).get('name', NOT_RECORDED)}"
                f"/{params.get('variant') or (spec.get('model') or {}).get('variant', '-')}",
                f"sampler: {params.get('sampler') or search.get('sampler', NOT_RECORDED)}; "
                f"scheduler: {params.get('scheduler') or (search.get('scheduler') or {}).get('type', NOT_RECORDED)}",
                f"budget: {params.get('budget_trials', NOT_RECORDED)} trials "
                f"({params.get('grid_size', NOT_RECORDED)} configurations x seeds "
                f"{params.get('seeds') or search.get('seeds', NOT_RECORDED)}); time budget "
                f"{_present(params.get('time_budget_s')) or search.get('time_budget_s') or 'none'}",
                f"space: `{space or NOT_RECORDED}`",
            ]
        )
    compute = sum(t.metrics.get(rs.METRIC_TRIAL_TIME, 0.0) for t in record.trials)
    section.text(
        f"Trials in the store: {len(record.trials)} ("
        + ", ".join(f"{n} {s.lower()}" for s, n in sorted(statuses.items()))
        + f"); total training time {_hours(compute)}."
    )
    return section


def selection_section(record: Record) -> Section:
    section = Section("Selection protocol").text(
        "Within each model configuration (architecture row), the hyperparameters with the best "
        "mean `best_dev_accuracy` over seeds are selected, using FINISHED trials only (ties: "
        "higher minimum over seeds, fewer parameters, smallest configuration key). A trial's dev "
        "accuracy is that of its best dev epoch. Test data is evaluated for the selected "
        "configuration alone, after the search (Rocktäschel et al. 2016, §3); no other "
        "configuration's test accuracy exists in the record. What each row's selected runs "
        "trained and where its test number comes from:"
    )
    section.bullets([_protocol_ran(row) for _, row in record.table.to_pandas().iterrows()])
    refits = [
        f"sweep {sweep.info.run_id[:12]}: the refit of its best run trained "
        f"{sweep.data.metrics[rs.METRIC_SWEEP_REFIT_EPOCHS]:g} epochs in "
        f"{sweep.data.metrics.get(rs.METRIC_SWEEP_REFIT_TIME, 0.0):.1f} s"
        for sweep in record.sweeps
        if rs.METRIC_SWEEP_REFIT_EPOCHS in sweep.data.metrics
    ]
    return section.bullets(refits) if refits else section


def _protocol_ran(row: pd.Series) -> str:
    """One row's protocol as its selected run's fingerprint (nli.protocol.*) records it."""
    head = f"{row['model_config']}: "
    if not isinstance(row["protocol"], str):
        return head + f"protocol {NOT_RECORDED} (the runs predate protocol fingerprints)"
    protocol = json.loads(row["protocol"])
    budget = f"at most {protocol.get('epochs', NOT_RECORDED)} epochs"
    if _present(protocol.get("max_steps")):
        budget += f" or {int(protocol['max_steps']):,} optimizer steps, whichever comes first"
    patience = _present(protocol.get("patience"))
    budget += (
        f"; early stopping after {patience} epochs without a better dev accuracy"
        if patience else "; no early stopping"
    )
    if protocol.get("layerwise") == "True":
        budget += (
            "; layerwise: one phase per block with that budget, each starting from the previous "
            "phase's best-dev weights (Yin et al. §5.1.2)"
        )
    if protocol.get("refit_on_train_dev") == "True":
        test = (
            "test: each selected seed retrained on train + dev for its best epoch count (refit; "
            "layerwise: that count / blocks per phase, rounded up), with no early stopping, and "
            "tested once on the refit's final weights, not those of the best dev epoch; dev is "
            "part of that training data, and with layerwise training the phase boundary is "
            "still chosen on it (Yin et al. §5.4)"
        )
    else:
        test = "test: the best-dev-epoch weights of each selected seed"
    return f"{head}{budget}; {test}."


def results_section(record: Record) -> Section:
    section = Section("Results")
    baselines = {}
    frame = record.table.to_pandas()
    for _, row in frame.iterrows():
        predictions = record.predictions.get(row["selected_run_id"])
        if predictions is not None and row["corpus"] and row["corpus"] not in baselines:
            baselines[row["corpus"]] = majority_class(predictions)
    section.table(results_view(record.table, baselines=baselines))
    one_seed = bool(len(frame)) and bool((frame["n_seeds"] <= 1).all())
    spread = (
        "dev and test of the selected configuration's single seed (no std and no interval "
        "with one seed; run more seeds for them)" if one_seed else
        "dev and test as mean ± sample std over the selected configuration's seeds; test 95% CI "
        "is the Student-t interval of the mean"
    )
    section.text(
        f"Accuracy in %: train at the best dev epoch; {spread}. "
        "|θ|M: trainable parameters without word embeddings. The majority-class row predicts the "
        "test set's most frequent class (a tie between classes is labelled as such)."
    )
    curves = evp_table(record.trials)
    if len(curves):
        section.figure(plot_evp(curves, "trials"), "evp", "Expected validation performance over trials")
        if curves.column("budget_hours").null_count < len(curves):
            section.figure(
                plot_evp(curves, "hours"), "evp_hours", "Expected validation performance over hours"
            )
    return section


def pareto_section(record: Record) -> Section:
    """The front of the experiment's trials over its sweeps' objectives (results.pareto)."""
    section = Section("Pareto front")
    name = record.experiment.name
    try:
        objectives = sweep_objectives([sweep.data.tags for sweep in record.sweeps], name)
        front = pareto_front(record.trials, name, objectives)
    except ResultsError as exc:
        return section.text(f"No front: {exc}.")
    searched = any(rs.TAG_OBJECTIVES in sweep.data.tags for sweep in record.sweeps)
    rules = sorted({sweep.data.tags[rs.TAG_SELECTION_RULE] for sweep in record.sweeps
                    if rs.TAG_SELECTION_RULE in sweep.data.tags})
    section.text(
        ("The sweep searched these objectives together (search.objectives). " if searched else
         "The sweep searched one metric; the front is drawn over dev accuracy and |θ|M. ")
        + "A trial is on the front when no other is at least as good in every objective and "
        "better in one. The tested configuration was chosen on dev alone, by the rule the sweep "
        f"recorded: {'; '.join(rules) or NOT_RECORDED}."
    )
    # As text and bullets, which are escaped: names in it come from the store (a code block is not).
    header, *lines = describe_front(front).splitlines()
    section.text(header).bullets([line.strip() for line in lines])
    return section.figure(plot_front(front), "pareto", f"Pareto front of {name}")


FEW_TRIALS_FOR_IMPORTANCE = 30  # below this, the importance figure gets a caveat


def analysis_section(record: Record) -> Section:
    section = Section("Analysis of the search")
    name = record.experiment.name
    importance, notes = importance_with_notes(record.trials)
    section.figure(plot_importance(importance, name), "importance",
                   "Hyperparameter importance (Optuna fANOVA and PED-ANOVA) for best dev accuracy")
    if name in notes:
        section.text(f"Importance: not computed: {notes[name]}.")
    elif len(record.trials) < FEW_TRIALS_FOR_IMPORTANCE:
        section.text(
            f"**Caveat**: importance from {len(record.trials)} trials is a rough indication at "
            f"best (fANOVA's random forest and PED-ANOVA's top-quantile split need tens of "
            f"trials; below {FEW_TRIALS_FOR_IMPORTANCE}, near-equal importances mean \"not "
            "enough trials to tell\", not \"equally important\")."
        )
    section.figure(plot_parallel_coordinates(record.trials, name), "parallel_coordinates",
                   "Searched hyperparameters against best dev accuracy, one line per trial")
    top = top_trials(record.trials, name)
    if top:
        section.figure(
            plot_learning_curves(top, record.histories, f"{name}: top {len(top)} trials"),
            "learning_curves", "Dev accuracy per epoch of the best trials",
        )
    return section


def _confusion_figure(predictions: pd.DataFrame, title: str) -> Figure:
    names = dict(zip(predictions["label"], predictions["label_name"], strict=False))
    labels = sorted(names)
    matrix = np.zeros((len(labels), len(labels)), dtype=int)
    index = {label: i for i, label in enumerate(labels)}
    for gold, predicted in zip(predictions["label"], predictions["prediction"], strict=True):
        if predicted in index:
            matrix[index[gold], index[predicted]] += 1
    figure = new_figure(1.3 * len(labels) + 2.5, 1.1 * len(labels) + 1.8)
    axes = figure.subplots()
    image = axes.imshow(matrix, cmap="Blues")
    tick_names = [names[label] for label in labels]
    axes.set_xticks(range(len(labels)), tick_names, rotation=30, ha="right")
    axes.set_yticks(range(len(labels)), tick_names)
    axes.set_xlabel("predicted")
    axes.set_ylabel("gold")
    for (i, j), count in np.ndenumerate(matrix):
        colour = "white" if count > matrix.max() / 2 else "black"
        axes.text(j, i, str(count), ha="center", va="center", color=colour)
    figure.colorbar(image, ax=axes, label="test pairs")
    axes.set_title(title, fontsize="small")
    return figure


def per_class_section(record: Record) -> Section:
    section = Section("Per-class accuracy and confusion")
    frame = record.table.to_pandas()
    shown = False
    for number, (_, row) in enumerate(frame.iterrows()):
        predictions = record.predictions.get(row["selected_run_id"])
        if predictions is None:
            continue
        shown = True
        correct = predictions["label"] == predictions["prediction"]
        per_class = (
            predictions.assign(correct=correct)
            .groupby("label_name")
            .agg(pairs=("correct", "size"), accuracy=("correct", "mean"))
            .reset_index()
            .rename(columns={"label_name": "class"})
        )
        per_class["accuracy"] = (per_class["accuracy"] * 100).round(2)
        section.text(f"**{row['model_config']}** (selected run {row['selected_run_id'][:12]}):")
        section.table(per_class)
        section.figure(
            _confusion_figure(predictions, row["model_config"]),
            f"confusion_{number}",
            f"Test confusion matrix of {row['model_config']}",
        )
    if not shown:
        section.text(f"Test predictions: {NOT_RECORDED} (no selected run logged "
                     f"`{rs.ARTIFACT_TEST_PREDICTIONS}`).")
    return section


def mcnemar_section(record: Record) -> Section:
    section = Section("McNemar test between the top models")
    frame = record.table.to_pandas()
    ranked = frame[frame["selected_run_id"].isin(record.predictions)].sort_values(
        "dev_accuracy", ascending=False
    )
    if len(ranked) < 2:
        return section.text(
            "Fewer than two models with test predictions: no paired comparison possible."
        )
    first, second = ranked.iloc[0], ranked.iloc[1]
    with tempfile.TemporaryDirectory() as scratch:
        paths = []
        for name, row in (("a", first), ("b", second)):
            path = Path(scratch) / f"{name}.parquet"
            record.predictions[row["selected_run_id"]].reset_index().to_parquet(path)
            paths.append(path)
        comparison = compare_predictions(
            first["model_config"], paths[0], second["model_config"], paths[1]
        )
    section.text("The two best models on dev, on their selected runs' test predictions:")
    return section.code(describe_comparison(comparison))


AUTHOR = "needs the authors"


def checklist_section(record: Record) -> Section:
    """ACL Rolling Review Responsible NLP checklist: answered from the record, or marked."""
    frame = record.table.to_pandas()
    data = next((a["data"] for a in record.artifacts.values() if a["data"]), None)
    environment = next((a["environment"] for a in record.artifacts.values() if a["environment"]), None)
    compute = sum(t.metrics.get(rs.METRIC_TRIAL_TIME, 0.0) for t in record.trials)
    params = ", ".join(
        f"{r['model_config']}: |θ|M {format_count(r['theta_m'])}, |θ|W+M {format_count(r['theta_wm'])}"
        for _, r in frame.iterrows()
    )
    selected = "; ".join(
        f"{r['model_config']}: "
        + (format_hyperparameters(json.loads(r["searched_hyperparameters"] or "{}")) or "nothing searched")
        for _, r in frame.iterrows()
    )
    seeds = ", ".join(
        f"{r['model_config']}: {r['n_seeds']} seed{'' if r['n_seeds'] == 1 else 's'}"
        for _, r in frame.iterrows()
    )
    single_seed = bool(len(frame)) and bool((frame["n_seeds"] <= 1).all())
    hardware = NOT_RECORDED
    if environment:
        devices = "; ".join(sorted({
            _devices(sweep.data.tags, record.artifacts[sweep.info.run_id]["environment"] or {})
            for sweep in record.sweeps
        }))
        hardware = (f"{environment.get('cpu_count')} CPUs, trials on {devices}, "
                    f"GPUs: {', '.join(environment.get('gpus') or []) or 'none'}")
    packages = (
        ", ".join(f"{k} {v}" for k, v in (environment or {}).get("packages", {}).items() if v)
        or NOT_RECORDED
    )
    splits = (
        ", ".join(f"{k} {v:,}" for k, v in data["splits"].items()) if data else NOT_RECORDED
    )
    answered = [
        f"**B6** (statistics of the data: splits): {splits}",
        f"**C1** (parameters, compute budget, infrastructure): {params or NOT_RECORDED}; "
        f"{_hours(compute)} of training over {len(record.trials)} trials; {hardware}",
        "**C2** (setup, hyperparameter search, best-found values): see the sections on the search "
        f"and the selection protocol; selected (searched values): {selected or NOT_RECORDED}",
        "**C3** (descriptive statistics: error bars, number of runs): "
        + ("one seed per configuration, so no error bars over seeds" if single_seed
           else "mean ± std and 95% Student-t intervals over seeds")
        + f" ({seeds or NOT_RECORDED}); expected validation "
        "performance over the budget; McNemar test between the top models",
        f"**C4** (existing packages and versions): {packages}",
    ]
    author = [
        f"**A1** limitations; **A2** risks — {AUTHOR}",
        f"**B1** citing the creators of the corpus and vectors; **B2** licences; **B3** intended "
        f"use; **B4** personal or offensive content; **B5** documentation of the artifacts — {AUTHOR}",
        f"**D1–D5** human annotators or participants — {AUTHOR} (none recorded by the tool)",
        f"**E1** use of AI assistants — {AUTHOR}",
    ]
    return (
        Section("Reproducibility checklist (ACL Rolling Review)")
        .text("Answered from the record:")
        .bullets(answered)
        .text("Items only the authors can answer:")
        .bullets(author)
    )


def build_report(client: MlflowClient, experiment: Experiment) -> tuple[str, str, list[Section]]:
    record = read_record(client, experiment)
    corpora = ", ".join(sorted({c for c in record.table.column("corpus").to_pylist() if c}))
    title = f"Experiment {experiment.name}"
    subtitle = (
        f"Corpus {corpora or NOT_RECORDED}; {len(record.sweeps)} sweep(s), "
        f"{len(record.trials)} trial runs; generated "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} by `orchestrate report` from the "
        "MLflow record."
    )
    sections = [
        provenance_section(record),
        data_section(record),
        search_section(record),
        selection_section(record),
        results_section(record),
        pareto_section(record),
        analysis_section(record),
        per_class_section(record),
        mcnemar_section(record),
        checklist_section(record),
    ]
    return title, subtitle, sections


def report_files(
    client: MlflowClient, experiment: Experiment, out_dir: Path
) -> list[tuple[Path, str | bytes]]:
    """EXPERIMENT.html (self-contained), EXPERIMENT.md and the Markdown's images, inside
    `out_dir` whatever the experiment is called (results.atomic_files.file_stem)."""
    title, subtitle, sections = build_report(client, experiment)
    stem = file_stem(experiment.name)
    markdown, images = to_markdown(title, subtitle, sections, f"{stem}_files")
    return [
        (out_dir / f"{stem}.html", to_html(title, subtitle, sections)),
        (out_dir / f"{stem}.md", markdown),
        *((out_dir / path, png) for path, png in images),
    ]
