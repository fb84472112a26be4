"""The sections of `orchestrate report` that describe the record: provenance, data, search,
selection protocol, results and the ACL Rolling Review checklist (the analyses' sections:
results/report_analyses.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pandas as pd
from mlflow.entities import Run

from results import run_schema as rs
from results.evp import evp_table, plot_evp
from results.predictions import majority_class
from results.render import format_count, format_hyperparameters, results_view
from results.report_page import Section
from results.report_record import NOT_RECORDED, Record
from results.run_reader import (
    sweep_metric,
)
from results.sweeps import observed_state


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


