"""Readers: one file of a corpus in, one ``NLISplit`` (records + declared label set) out.

Every format goes through the same two steps: a row source that yields ``(location, row)`` pairs,
where ``location`` is ``"file:line"``, and ``_build_split`` that maps a row onto an ``NLIExample``
with a column mapping (``Columns``) and a label scheme (``Labels``). The corpus readers (SNLI, MultiNLI, SICK, SciTail,
RTE) are the generic JSONL/TSV readers with their corpus's columns and labels filled in.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nli_models.data.records import NLIExample, NLISplit
from nli_models.errors import InputError

NLI_LABELS = ("entailment", "neutral", "contradiction")
SCITAIL_LABELS = ("entails", "neutral")
RTE_LABELS = ("entailment", "not_entailment")

Row = Mapping[Any, Any]  # a JSON object, or a TSV line keyed by column name or index


@dataclass(frozen=True)
class Columns:
    """Where each field of an example is in a row: a key (JSONL, TSV with header) or a 0-based
    column index (TSV without header). ``pair_id`` and ``genre`` are optional."""

    premise: str | int = "premise"
    hypothesis: str | int = "hypothesis"
    label: str | int = "label"
    pair_id: str | int | None = None
    genre: str | int | None = None

    def keys(self) -> tuple[str | int, ...]:
        """Every configured key, so a header can be checked once before any row is read."""
        optional = (self.pair_id, self.genre)
        return (self.premise, self.hypothesis, self.label, *(k for k in optional if k is not None))


@dataclass(frozen=True)
class Labels:
    """A corpus's label set and how a row's raw label maps onto it: ``mapped`` renames raw labels
    (SICK's ENTAILMENT -> entailment), a ``skipped`` one drops the row (SNLI's '-', counted)."""

    allowed: tuple[str, ...] = NLI_LABELS
    mapped: Mapping[str, str] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()


def numbered_lines(path: str | Path) -> Iterator[tuple[str, str]]:
    """Yield ``("file:line", text)`` for every non-blank line, without its line end.

    Reads bytes and splits on ``\\n`` only, so CRLF files (SICK) work and a stray ``\\r`` inside
    a field does not split a line; undecodable bytes are reported with their location.
    """
    path = Path(path)
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            location = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise InputError(f"{location}: not valid UTF-8 ({error.reason})") from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            line = line.rstrip("\r\n")
            if line.strip():
                yield location, line


def jsonl_rows(path: str | Path) -> Iterator[tuple[str, Row]]:
    for location, line in numbered_lines(path):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(f"{location}: malformed JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise InputError(f"{location}: expected a JSON object, got {type(row).__name__}")
        yield location, row


def tsv_rows(path: str | Path, header: bool) -> Iterator[tuple[str, Row]]:
    """Tab-separated rows keyed by header name (``header=True``) or by column index.

    No quoting: NLI text contains quote characters that are part of the sentence.
    """
    names: list[str] | None = None
    for location, line in numbered_lines(path):
        fields = line.split("\t")
        if header and names is None:
            names = fields
            continue
        if names is None:
            yield location, dict(enumerate(fields))
        elif len(fields) != len(names):
            raise InputError(
                f"{location}: malformed line: {len(fields)} tab-separated fields, the header has "
                f"{len(names)} ({', '.join(names)})"
            )
        else:
            yield location, dict(zip(names, fields, strict=True))


def _field(row: Row, key: str | int, location: str) -> str:
    if key not in row:
        if isinstance(key, int):
            raise InputError(
                f"{location}: malformed line: {len(row)} tab-separated field(s), "
                f"no column {key} (0-based)"
            )
        raise InputError(f"{location}: malformed line: no field {key!r}")
    value = row[key]
    if not isinstance(value, str):
        raise InputError(f"{location}: field {key!r} should be a string, got {value!r}")
    return value


def _build_split(
    name: str,
    path: str | Path,
    rows: Iterable[tuple[str, Row]],
    columns: Columns,
    labels: Labels,
    keep: Callable[[str, Row], bool] | None = None,
) -> NLISplit:
    """Map rows onto examples; ``keep(location, row)`` filters rows (SICK's SemEval_set)."""
    examples: list[NLIExample] = []
    skipped = 0
    for location, row in rows:
        if keep is not None and not keep(location, row):
            continue
        raw_label = _field(row, columns.label, location).strip()
        if raw_label in labels.skipped:
            skipped += 1
            continue
        label = labels.mapped.get(raw_label, raw_label)
        if label not in labels.allowed:
            raise InputError(
                f"{location}: unknown label {raw_label!r}; allowed labels: "
                f"{', '.join(labels.allowed)}"
                + (f" (or mapped: {', '.join(sorted(labels.mapped))})" if labels.mapped else "")
            )
        examples.append(
            NLIExample(
                premise=_field(row, columns.premise, location),
                hypothesis=_field(row, columns.hypothesis, location),
                label=label,
                pair_id=None if columns.pair_id is None else _field(row, columns.pair_id, location),
                genre=None if columns.genre is None else _field(row, columns.genre, location),
            )
        )
    return NLISplit(
        name=name,
        examples=examples,
        labels=tuple(labels.allowed),
        source=str(path),
        meta={"skipped_labels": skipped} if labels.skipped else {},
    )


def read_jsonl(
    path: str | Path, columns: Columns = Columns(), labels: Labels = Labels(), name: str = "train"
) -> NLISplit:
    """Generic JSONL reader: one JSON object per line, fields named by ``columns``."""
    return _build_split(name, path, jsonl_rows(path), columns, labels)


def read_tsv(
    path: str | Path,
    columns: Columns = Columns(),
    labels: Labels = Labels(),
    header: bool = True,
    name: str = "train",
) -> NLISplit:
    """Generic TSV reader; with ``header=False`` the columns are 0-based indices, e.g. the
    MultiNLI samples: ``Columns(label=0, premise=1, hypothesis=2)``."""
    if header:
        _require_header(path, columns.keys())
    return _build_split(name, path, tsv_rows(path, header=header), columns, labels)


def _require_header(path: str | Path, names: Iterable[str | int], explain: str = "") -> None:
    """Fail before reading rows when a TSV header lacks a column (names the file and header)."""
    first = next(numbered_lines(path), None)
    header = [] if first is None else first[1].split("\t")
    missing = [name for name in names if name not in header]
    if missing:
        raise InputError(
            f"{path}: header has no column {', '.join(map(repr, missing))} "
            f"(header: {', '.join(header) or 'empty file'}){explain}"
        )


# The '-' gold label marks pairs without annotator consensus; SNLI and MultiNLI papers drop them.
_SNLI_COLUMNS = Columns("sentence1", "sentence2", "gold_label", pair_id="pairID")
_SNLI_LABELS = Labels(NLI_LABELS, skipped=("-",))


def read_snli(path: str | Path, name: str = "train") -> NLISplit:
    """SNLI 1.0 jsonl; pairs with gold label '-' are dropped (count in ``meta``)."""
    return read_jsonl(path, _SNLI_COLUMNS, _SNLI_LABELS, name=name)


def read_multinli(path: str | Path, name: str = "train") -> NLISplit:
    """MultiNLI 1.0 jsonl (SNLI's fields plus ``genre``); '-' gold labels are dropped."""
    columns = Columns("sentence1", "sentence2", "gold_label", pair_id="pairID", genre="genre")
    return read_jsonl(path, columns, _SNLI_LABELS, name=name)


# SICK ships as one file; the SemEval_set column says which split a pair belongs to.
SICK_SETS = {"train": "TRAIN", "dev": "TRIAL", "test": "TEST"}
_SICK_COLUMNS = Columns("sentence_A", "sentence_B", "entailment_label", pair_id="pair_ID")


def read_sick(path: str | Path, name: str = "train") -> NLISplit:
    """SICK.txt (tab-separated, header, CRLF tolerated): the pairs whose SemEval_set is
    TRAIN / TRIAL / TEST for ``name`` train / dev / test. Labels are lowercased."""
    if name not in SICK_SETS:
        raise InputError(f"SICK has no split {name!r}; splits: {', '.join(SICK_SETS)}")
    _require_header(path, (*_SICK_COLUMNS.keys(), "SemEval_set"))
    wanted = SICK_SETS[name]

    def keep(location: str, row: Row) -> bool:
        semeval_set = row["SemEval_set"].strip()
        if semeval_set not in SICK_SETS.values():
            raise InputError(
                f"{location}: unknown SemEval_set {semeval_set!r}; allowed: "
                f"{', '.join(SICK_SETS.values())}"
            )
        return semeval_set == wanted

    labels = Labels(NLI_LABELS, mapped={label.upper(): label for label in NLI_LABELS})
    rows = tsv_rows(path, header=True)
    return _build_split(name, path, rows, _SICK_COLUMNS, labels, keep=keep)


def read_scitail(path: str | Path, name: str = "train") -> NLISplit:
    """SciTail 1.1 tsv_format: ``premise<TAB>hypothesis<TAB>label``, no header; 2 classes."""
    columns = Columns(premise=0, hypothesis=1, label=2)
    return read_tsv(path, columns, Labels(SCITAIL_LABELS), header=False, name=name)


def read_rte(path: str | Path, name: str = "train") -> NLISplit:
    """GLUE RTE tsv (header index, sentence1, sentence2, label); 2 classes.

    GLUE's own RTE test.tsv has no label column (the labels are hidden for the leaderboard). An
    unlabelled split cannot be trained or scored on, so it is refused with an explanation rather
    than read with placeholder labels.
    """
    columns = Columns("sentence1", "sentence2", "label", pair_id="index")
    _require_header(
        path,
        columns.keys(),
        explain="; GLUE hides the RTE test labels: use the labelled dev.tsv as the test split "
        "and carve a dev holdout out of train (data.dev_holdout)",
    )
    return read_tsv(path, columns, Labels(RTE_LABELS), header=True, name=name)
