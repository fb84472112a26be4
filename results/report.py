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

from datetime import UTC, datetime
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Experiment

from results.atomic_files import file_stem
from results.report_analyses import (
    analysis_section,
    mcnemar_section,
    pareto_section,
    per_class_section,
)
from results.report_page import Section, to_html, to_markdown
from results.report_record import NOT_RECORDED, read_record
from results.report_sections import (
    checklist_section,
    data_section,
    provenance_section,
    results_section,
    search_section,
    selection_section,
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
