"""Corpus-independent records: what every reader returns and every later stage consumes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NLIExample:
    premise: str
    hypothesis: str
    label: str
    pair_id: str | None = None
    genre: str | None = None


@dataclass
class NLISplit:
    """One split of a corpus with its declared label set (the order fixes the class indices)."""

    name: str
    examples: list[NLIExample]
    labels: tuple[str, ...]
    source: str = ""  # file the split was read from, for error messages and provenance
    meta: dict = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    def __len__(self) -> int:
        return len(self.examples)
