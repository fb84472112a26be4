"""Which MLflow store a command talks to: the one rule every command that touches a store uses
(`sweep`, `validate`, `submit`, `ui`, `sync`, `results`, `attention`, ...).

Order: the command's --tracking-uri, else the spec's `search.tracking_uri`, else
MLFLOW_TRACKING_URI, else DEFAULT_TRACKING_URI. An explicit option that contradicts the spec is
bad input: a sweep must not land in a store its spec does not name without the user noticing.
Kept free of MLflow imports so that `orchestrate --help` stays light.
"""

from __future__ import annotations

import os

from nli_models.errors import InputError

DEFAULT_TRACKING_URI = "sqlite:///mlruns.db"
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
TRACKING_URI_HELP = (
    f"MLflow tracking URI (SQLite file, http://HOST:PORT server, ...); default: the spec's "
    f"search.tracking_uri, else {TRACKING_URI_ENV}, else {DEFAULT_TRACKING_URI}"
)


def resolve_tracking_uri(
    explicit: str | None,
    spec_value: str | None = None,
    source: str = "the spec",
    default: str | None = DEFAULT_TRACKING_URI,
) -> str | None:
    """The store to use; raises InputError when `explicit` and `spec_value` disagree.
    `default=None` for a command with no sensible default (`sync` uploads to a server)."""
    if explicit and spec_value and explicit != spec_value:
        raise InputError(
            f"--tracking-uri {explicit} contradicts search.tracking_uri {spec_value} in "
            f"{source}; drop one of them"
        )
    return explicit or spec_value or os.environ.get(TRACKING_URI_ENV) or default
