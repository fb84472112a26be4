"""Published results (results/published_rows.py) compared with the results table.

Matching: a published row's ``match`` names params; one of our rows matches when each of those
params, as logged for its selected configuration, equals the published value (numbers
numerically, booleans case-insensitively; see ``results.params.same_value``) and its corpus (tag
nli.corpus) is the published row's dataset.

Protocols: ``PROTOCOLS`` holds every setting each paper states about how it trained (training
file and size, the dev and test sets' sizes, the vectors file by its content and its coverage of
the vocabulary, whether they are tuned, OOV policy, optimiser and its
parameters, budget, patience, initialisation, batch size, each model hyperparameter, the reading
of each reconstructed part, layerwise training, refit), in the names of a run's protocol
fingerprint (run_schema.PROTOCOL_FIELDS) and of its logged params; a published row's ``setup``
adds what the paper states for that row alone (Yin Table 2, Parikh's learning rates).
``our_setup`` gathers the same names for one of our rows and ``protocol_differences`` lists every
one that differs. A published row whose system cannot be run here (``runnable`` false: Yin Table
6's feature-based rows) is never comparable. A published row none of ours matches gets the reason
(``why_unmatched``: the dataset ours ran on, the model, variant or size not run). ``REPRODUCTIONS`` holds known public reproductions
of a row (results.paper_table shows both).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from results.params import as_int, parse_param, same_value
from results.published_rows import (
    NO_REPRODUCTION,
    NOT_COMPARED,
    PAPERS,
    PROTOCOLS,
    REPRODUCTIONS,
    AtLeast,
    OneOf,
    Present,
    PublishedRow,
    VectorsFile,
    show_setting,
)
from results.run_schema import CLASS_ACCURACY_PREFIX, DEV_CLASS_ACCURACY_PREFIX
from results.schema import arrow_table, describe, table_columns

if TYPE_CHECKING:
    import pandas as pd  # imported where used: `orchestrate --help` must not load pandas
    import pyarrow as pa

ACCURACY = ("train_accuracy", "dev_accuracy", "test_accuracy")
# Our train accuracy is a running average over training batches (run_schema), the papers' an
# evaluation: compared all the same, with the difference listed.
OUR_COLUMN = {"train_accuracy": "train_accuracy_running"}
PARAMETER_COUNTS = ("theta_wm", "theta_m")


def reproductions(paper: str, published: PublishedRow) -> str:
    found = [
        text
        for key, match, text in REPRODUCTIONS
        if key == paper and all(published.match.get(k) == v for k, v in match.items())
    ]
    return "; ".join(found) or NO_REPRODUCTION.get(paper, "none listed")


def paper_setup(paper: str, published: PublishedRow) -> dict[str, object]:
    """Every setting ``paper`` states for ``published``: the paper's protocol and the row's own."""
    setup = {**PROTOCOLS.get((paper, published.dataset), {}), **published.setup}
    return {name: value for name, value in setup.items() if value is not NOT_COMPARED}


def our_setup(
    fingerprint: Mapping[str, str] | None,
    params: Mapping[str, object],
    epochs_trained: float | None = None,
    refit: bool = False,
) -> dict[str, object] | None:
    """One of our rows in the names of paper_setup: its protocol fingerprint (tag values, as
    text), its params, and what follows from them: ``vectors`` as a VectorsFile (name, word
    count, dimension, hash), ``vectors_tuned`` (no OOV policy tunes the
    pretrained rows, nli_models.data.vectors, unless data.vectors.tune, which the fingerprint of
    newer runs records) and ``steps_trained`` (the epochs it trained, a mean
    over seeds where there are several, times the batches of an epoch, capped by max_steps; with ``refit``, the epochs are the refit's on
    train + dev). None when the run has no fingerprint."""
    if fingerprint is None:
        return None
    ours: dict[str, object] = {**params, **fingerprint}
    has_vectors = str(fingerprint.get("vectors")) not in ("None", "")
    if has_vectors:  # runs from before vector fingerprints recorded no word count nor hash
        ours["vectors"] = VectorsFile(
            str(fingerprint["vectors"]),
            as_int(fingerprint.get("vectors_words")),
            as_int(fingerprint.get("vectors_dim")),
            str(fingerprint["vectors_sha256"]) if "vectors_sha256" in fingerprint else None,
        )
    if "vectors_tuned" not in fingerprint:  # runs from before data.vectors.tune never tuned them
        ours["vectors_tuned"] = False if has_vectors else None
    train_size, batch_size = as_int(ours.get("train_size")), as_int(ours.get("batch_size"))
    if refit and train_size:
        train_size += as_int(ours.get("dev_size")) or 0
    if epochs_trained is not None and not math.isnan(epochs_trained) and train_size and batch_size:
        # A mean over seeds may be fractional: the mean of their steps.
        steps = round(epochs_trained * math.ceil(train_size / batch_size))
        max_steps = as_int(ours.get("max_steps"))
        ours["steps_trained"] = steps if max_steps is None else min(steps, max_steps)
    return ours


def protocol_differences(
    paper: str, published: PublishedRow, ours: Mapping[str, object] | None
) -> list[str]:
    """Every way one of our rows (our_setup) differs from what the paper states for
    ``published``; a run without a fingerprint differs in being unknown, and a published system
    this code does not run differs from any of ours."""
    if ours is None:
        return ["protocol not recorded (the run predates protocol fingerprints)"]
    differences = []
    if not published.runnable:
        differences.append(f"the published system is not run here: {published.note}")
    for name, theirs in paper_setup(paper, published).items():
        mine = ours.get(name, MISSING)
        if not _same_setting(name, mine, theirs):
            shown = "not recorded" if mine is MISSING else _show_ours(theirs, mine)
            differences.append(f"{name} {shown} (paper {show_setting(theirs)})")
    return differences


CLASSES = {"snli": 3, "sick": 3, "scitail": 2}


def theta_m_at_paper_setup(
    paper: str, published: PublishedRow, params: Mapping[str, object]
) -> int | None:
    """|θ|M of our model with every model setting ``paper`` states for ``published`` and word
    vectors of the paper's dimension; our row's ``params`` fill in the rest (settings the paper
    searched over included). For papers that print no parameter count (Yin et al., CAM): how
    much smaller or larger the network we ran is than the paper's. None when the model cannot
    be built."""
    from nli_models.registry import build_model, count_parameters, model_arguments

    name = str(published.match["model"])
    arguments = set(model_arguments(name)) - {"vocab_size", "num_classes", "embedding_dim"}
    stated = {
        k: v
        for k, v in paper_setup(paper, published).items()
        if not isinstance(v, OneOf | Present | VectorsFile | AtLeast)
    }
    vectors = paper_setup(paper, published).get("vectors")
    setup = {**params, **published.match, **stated}
    model_args = {k: parse_param(v) for k, v in setup.items() if k in arguments}
    try:
        model = build_model(
            name,
            **model_args,
            vocab_size=10,
            num_classes=CLASSES[published.dataset],
            embedding_dim=vectors.dim if isinstance(vectors, VectorsFile) else 300,
        )
    except (ValueError, TypeError):
        return None
    return count_parameters(model)[0]


MISSING = object()  # a setting our run did not record (an older run, another model)


def _same_setting(name: str, ours: object, theirs: object) -> bool:
    if ours is MISSING:
        return False
    if isinstance(theirs, OneOf):
        return any(same_value(value, ours) for value in theirs.values)
    if isinstance(theirs, Present):
        return not same_value(None, ours)
    if isinstance(theirs, VectorsFile):
        return theirs.same_file(ours)
    if isinstance(theirs, AtLeast):
        share = parse_param(ours)
        return isinstance(share, int | float) and share >= theirs.floor
    return same_value(theirs, ours)


def _show_ours(theirs: object, mine: object) -> str:
    share = parse_param(mine)
    if isinstance(theirs, AtLeast) and isinstance(share, int | float):
        return f"{share:.1%}"
    return show_setting(mine)


COLUMNS = table_columns("comparison")

__doc__ += "\nComparison table columns (one row per published value and matching row of ours):\n\n"
__doc__ += describe(COLUMNS)


def comparison_table(
    results: pd.DataFrame, paper: str, incomplete: Mapping[str, str] | None = None
) -> pa.Table:
    """Every published value of ``paper`` beside each of our rows (the results table) that
    matches it, or beside nulls when none does: published rows are never dropped.
    ``incomplete`` (experiment -> why) marks, in the note, our rows from unfinished sweeps."""
    incomplete = incomplete or {}
    ours = [(row, json.loads(row["hyperparameters"])) for _, row in results.iterrows()]
    rows = []
    for published in PAPERS[paper]:
        matching = [
            row
            for row, params in ours
            if matches_row(published.match, params) and same_corpus(row, published.dataset)
        ]
        for metric, value in published.values.items():
            for row in matching or [None]:
                mine = None if row is None else our_value(row, metric)
                rows.append(
                    {
                        "paper": paper,
                        "table": published.table,
                        "row": published.row,
                        "dataset": published.dataset,
                        "metric": metric,
                        "published": value,
                        "experiment": None if row is None else row["experiment"],
                        "model_config": None if row is None else row["model_config"],
                        "ours": mine,
                        "difference": None if mine is None else mine - value,
                        "note": _note(published.note, row, incomplete),
                    }
                )
    return arrow_table(rows, COLUMNS, "comparison", paper=paper)


def _note(note: str | None, row: pd.Series | None, incomplete: Mapping[str, str]) -> str | None:
    if row is None or row["experiment"] not in incomplete:
        return note
    mark = f"INCOMPLETE: {incomplete[row['experiment']]}"
    return f"{note}; {mark}" if note else mark


def same_corpus(row: pd.Series, dataset: str) -> bool:
    import pandas as pd

    corpus = row.get("corpus")
    return corpus is None or pd.isna(corpus) or corpus == dataset  # untagged rows still match


def why_unmatched(published: PublishedRow, results: pd.DataFrame) -> str:
    """Why no row of ``results`` matches ``published``: the dataset ours ran on when none ran on
    the row's, then the first of the row's params (model, variant, architecture, in the row's
    order) that no run on that dataset (or, failing it, any run) has, with the values that ran."""
    if results.empty:
        return "no run of ours to compare"
    rows = [(row, json.loads(row["hyperparameters"])) for _, row in results.iterrows()]
    reasons = []
    candidates = [(row, params) for row, params in rows if same_corpus(row, published.dataset)]
    if not candidates:
        ran = sorted({str(row.get("corpus")) for row, _ in rows})
        reasons.append(f"dataset is {', '.join(ran)}, not {published.dataset}")
        candidates = rows
    for name, value in published.match.items():
        hits = [(r, p) for r, p in candidates if name in p and same_value(value, p[name])]
        if not hits:
            ran = sorted({show_setting(p.get(name)) for _, p in candidates})
            reasons.append(f"{name} {show_setting(value)} was not run (ran: {', '.join(ran)})")
            break
        candidates = hits
    return "; ".join(reasons)


def matches_row(match: Mapping[str, object], params: Mapping[str, object]) -> bool:
    return all(key in params and same_value(value, params[key]) for key, value in match.items())


def our_value(row: pd.Series, metric: str) -> float | None:
    """Our value of ``metric`` in the published unit (percent for accuracies); None if unknown."""
    import pandas as pd

    if metric in ACCURACY:
        value = 100 * row[OUR_COLUMN.get(metric, metric)]
    elif metric in PARAMETER_COUNTS:
        value = row[metric]
    else:
        for prefix, column in (
            (CLASS_ACCURACY_PREFIX, "test_accuracy_per_class"),
            (DEV_CLASS_ACCURACY_PREFIX, "dev_accuracy_per_class"),
        ):
            if metric.startswith(prefix) and isinstance(row[column], str):
                per_class = json.loads(row[column])
                value = 100 * per_class.get(metric.removeprefix(prefix), math.nan)
                break
        else:
            return None
    return None if pd.isna(value) else float(value)


def model_rows(params: Mapping[str, object]) -> list[tuple[str, PublishedRow]]:
    """(paper, row) of every runnable published row of the model and variant ``params`` name,
    whatever its other settings (the rows a Pareto front of that model is drawn beside)."""
    return [
        (paper, published)
        for paper, rows in PAPERS.items()
        for published in rows
        if published.runnable
        and matches_row({k: published.match[k] for k in ("model", "variant") if k in published.match}, params)
    ]


def runs_paper_configuration(paper: str, published: PublishedRow, params: Mapping[str, object]) -> bool:
    """Whether a trial with ``params`` trains ``published``'s own configuration: the row's
    architecture (its match) and every setting the paper states for it that the trial logged as
    a param (lr, dropout, batch size, ...; the data protocol is compared by `results --paper`)."""
    setup = paper_setup(paper, published)
    return matches_row(published.match, params) and all(
        _same_setting(name, params[name], theirs) for name, theirs in setup.items() if name in params
    )
