"""How a sweep looks in the MLflow UI, as values (no store is written here): trial run names,
the parent's summary params and description, MLflow's source tags, the dataset input, the runs
view the experiment holds and the links to it."""

from __future__ import annotations

import contextlib
import getpass
import json
import shlex
import socket
from pathlib import Path
from typing import Any

from nli_models.errors import mask_secrets
from orchestrator.sweep.spec import SweepSpec
from results import run_schema as rs
from results.render import format_hyperparameters
from results.tracking_uri import split_credentials


def host_tags() -> dict[str, str]:
    return {rs.TAG_HOST: socket.gethostname()}



# -- the MLflow UI as a researcher's comparison tool -------------------------------------------
# Trials are named by what the search chose; constants are logged apart (const.<name>); every run
# carries MLflow's own source/user/commit tags and the dataset it read; the parent run carries the
# sweep's summary and description, and the experiment a shared runs view the sweep links to.


def trial_start_extras(searched: dict[str, Any], dataset: dict[str, Any] | None) -> dict[str, Any]:
    """What a trial's start operation carries besides its params: run name, which params were
    searched, the dataset input."""
    return {"run_name": trial_run_name(searched), "searched": sorted(searched), "dataset": dataset}


def trial_run_name(searched: dict[str, Any]) -> str:
    """'lr=3e-4 dropout=0.1 k=100 seed=1': a trial's searched values, its seed last."""
    values = {k: v for k, v in searched.items() if k != rs.PARAM_SEED}
    name = format_hyperparameters(values)
    if rs.PARAM_SEED in searched:
        name = f"{name} seed={searched[rs.PARAM_SEED]}".strip()
    return name or "trial"


def source_tags(spec_path: str | Path, git_commit: str) -> dict[str, str]:
    """MLflow's own provenance tags, shown by its UI as the Source, User and Version columns."""
    return {
        rs.TAG_MLFLOW_GIT_COMMIT: git_commit,
        rs.TAG_MLFLOW_USER: getpass.getuser(),
        rs.TAG_MLFLOW_SOURCE_NAME: f"orchestrate sweep {Path(spec_path).name}",
        rs.TAG_MLFLOW_SOURCE_TYPE: "LOCAL",
    }


def dataset_input(record: dict[str, Any], digest: str) -> dict[str, Any]:
    """The dataset input every run of a sweep logs (plain JSON, so it can be spooled)."""
    files = record.get("files") or {}
    source = {split: f["path"] for split, f in files.items()} or {"generated": record["corpus"]}
    return {
        "name": record["corpus"],
        "digest": digest,
        "source_type": "local",
        "source": json.dumps(source, sort_keys=True),
        "schema": json.dumps({"premise": "text", "hypothesis": "text", "label": record["labels"]}),
        "profile": json.dumps(
            {
                "splits": record["splits"],
                "vocabulary_size": record["vocabulary_size"],
                "vector_coverage": record["vector_coverage"],
            }
        ),
    }


def sweep_params(spec: SweepSpec) -> dict[str, str]:
    """The parent run's params: the sweep's summary (see run_schema.SWEEP_PARAMS)."""
    search = spec.search
    space = {name: {d.kind: d.values} for name, d in search.space.items()}
    if search.configurations:
        space["configurations"] = search.configurations
    values = {
        "model": spec.model.name,
        "variant": spec.model.variant,
        "corpus": spec.data.corpus,
        "sampler": search.sampler,
        "scheduler": search.scheduler.type,
        "budget_trials": spec.num_trials(),
        "time_budget_s": search.time_budget_s,
        "grid_size": spec.grid_size(),
        "seeds": ",".join(map(str, search.seeds)),
        "metric": f"{search.metric} ({search.mode})",
        "search_space": json.dumps(space, default=str)[:6000],  # MLflow's param value limit
    }
    return {name: str(values[name]) for name in rs.SWEEP_PARAMS}


def runs_view_state(searched: list[str], metric_columns: list[str]) -> str:
    """A runs view of MLflow 3.17's UI, stored as the experiment tag
    mlflow.sharedViewState.<key> and opened by ?viewStateShareKey=<key>. The UI (useSharedView
    State in its bundle) applies the search facets searchFilter/orderByKey/orderByAsc and the view
    keys selectedColumns, runsHiddenMode, compareRunCharts, ... but drops runsExpanded, so the
    trials are shown by filtering on the trial role (children whose parent is filtered out are
    listed flat). The charts view (&compareRunsMode=CHART) opens on a parallel-coordinates chart
    of the searched hyperparameters against best dev accuracy."""
    section = "nli-hyperparameters"
    parallel = {
        "type": "PARALLEL",
        "uuid": "nli-parallel-coordinates",
        "displayName": "searched hyperparameters vs best dev accuracy",
        "runsCountToCompare": 100,
        "metricSectionId": section,
        "deleted": False,
        "isGenerated": False,
        "selectedParams": [p for p in searched if p != rs.PARAM_SEED],
        "selectedMetrics": [rs.METRIC_BEST_DEV_ACCURACY],
        "showAllRuns": True,
    }
    return json.dumps(
        {
            "searchFilter": f"tags.`{rs.TAG_ROLE}` = '{rs.ROLE_TRIAL}'",
            "orderByKey": f"metrics.`{rs.METRIC_BEST_DEV_ACCURACY}`",
            "orderByAsc": False,
            "lifecycleFilter": "Active",
            "selectedColumns": [
                *(f"metrics.`{m}`" for m in metric_columns),
                *(f"params.`{p}`" for p in searched),
                f"tags.`{rs.TAG_MODEL_CONFIG}`",
            ],
            "runsHiddenMode": "SHOW_ALL",
            "compareRunCharts": [parallel],
            "compareRunSections": [
                {"uuid": section, "name": "Hyperparameters", "display": True,
                 "isReordered": False, "deleted": False, "isGenerated": False}
            ],
        }
    )


def runs_view_path(experiment_id: str, charts: bool = False) -> str:
    """The trials view written by ``runs_view_state`` (its table, or with ``charts`` the
    parallel-coordinates chart), as a link relative to the MLflow UI it is opened in: a fragment,
    so it holds from any host, port or tunnel. ``workflowType=machine_learning`` keeps MLflow
    3.17's UI on its runs table (without it, it opens the GenAI pages unless the browser's
    localStorage says otherwise)."""
    return (
        f"#/experiments/{experiment_id}/runs?{rs.UI_WORKFLOW_PARAMETER}"
        f"&viewStateShareKey={rs.RUNS_VIEW_KEY}" + ("&compareRunsMode=CHART" if charts else "")
    )


def run_path(experiment_id: str, run_id: str) -> str:
    """A run's page, relative to the MLflow UI it is opened in (see ``runs_view_path``)."""
    return f"#/experiments/{experiment_id}/runs/{run_id}?{rs.UI_WORKFLOW_PARAMETER}"


def ui_link(base_url: str, path: str) -> str:
    """A path of ``runs_view_path`` / ``run_path`` on the UI at ``base_url``."""
    return f"{base_url.rstrip('/')}/{path}"


def tracking_server_ui(tracking_uri: str) -> str | None:
    """The UI of a store when the store is a tracking server (it serves its UI), else None: a
    database store has a UI only where `orchestrate ui` serves it."""
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    return split_credentials(tracking_uri)[0]  # printed: never its credentials


def ui_hint(tracking_uri: str, experiment_id: str) -> str:
    """Where a sweep's trials are in the MLflow UI, as `sweep` prints it: a tracking server's
    links, or the `orchestrate ui` command for this very store (a database store has no UI of
    its own; `ui` prints the links on whatever port it serves)."""
    server = tracking_server_ui(tracking_uri)
    if server is not None:
        return (
            f"trials in the MLflow UI, best on dev first: "
            f"{ui_link(server, runs_view_path(experiment_id))}\n"
            "hyperparameters against dev accuracy: "
            f"{ui_link(server, runs_view_path(experiment_id, charts=True))}"
        )
    return (
        f"trials in the MLflow UI: orchestrate ui --tracking-uri {shlex.quote(mask_secrets(tracking_uri))} "
        f"(then the experiment, Views > \"{rs.RUNS_VIEW_NAME}\")"
    )


def runs_view_envelope(state: str, now_ms: int, previous: str | None) -> str:
    """The experiment tag value MLflow 3.17's "Views" menu lists by name (its saved-view
    envelope: name, createdAt, updatedAt in ms, state = the view JSON as a string); a view
    written before keeps its creation time."""
    created = now_ms
    if previous:
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
            created = int(json.loads(previous)["createdAt"])
    return json.dumps(
        {"name": rs.RUNS_VIEW_NAME, "createdAt": created, "updatedAt": now_ms, "state": state}
    )


def _shortened(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def sweep_note(spec: SweepSpec, spec_path: str | Path, link: str, best: str | None = None) -> str:
    """The parent run's description (markdown, mlflow.note.content). The links come first: the
    run page shows the first lines of a description until "show more" is clicked."""
    params = sweep_params(spec)
    lines = [
        f"[{rs.RUNS_VIEW_NAME}]({link})" + (f" · best: {best}" if best else ""),
        "",
        f"**{spec.name}**: {params['model']}/{params['variant']} on {params['corpus']}",
        "",
        f"- search: {params['sampler']} sampler, {params['scheduler']} scheduler, "
        f"{params['grid_size']} configurations x seeds {params['seeds']} = "
        f"{params['budget_trials']} trials",
        f"- space: `{_shortened(params['search_space'], 1000)}`",  # tags hold 8000 characters
        f"- selection: best mean {spec.search.metric} over seeds on dev within each model "
        "configuration; test evaluated for the selected configuration only",
        f"- spec: `{Path(spec_path).name}` (artifact {rs.ARTIFACT_SPEC})",
    ]
    return "\n".join(lines) + "\n"
