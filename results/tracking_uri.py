"""Which MLflow store a command talks to: the one rule every command that touches a store uses
(`sweep`, `validate`, `submit`, `ui`, `sync`, `results`, `attention`, ...).

Order: the command's --tracking-uri, else the spec's `search.tracking_uri`, else
MLFLOW_TRACKING_URI, else DEFAULT_TRACKING_URI. An explicit option that contradicts the spec is
bad input: a sweep must not land in a store its spec does not name without the user noticing.
Kept free of MLflow imports so that `orchestrate --help` stays light.
"""

from __future__ import annotations

import base64
import os
import socket
import urllib.parse

from nli_models.errors import InputError, mask_secrets

DEFAULT_TRACKING_URI = "sqlite:///mlruns.db"
PROBE_TIMEOUT_S = 10.0  # a store that does not answer within this is reported unreachable
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


# Backends MLflow's tracking client can open (mlflow.store.db.db_types plus HTTP and files).
DATABASE_SCHEMES = {"sqlite", "postgresql", "mysql", "mssql"}
DATABASE_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
URI_SCHEMES = DATABASE_SCHEMES | {"http", "https", "file", "databricks"}


def check_tracking_uri(uri: str) -> None:
    """InputError for a tracking URI MLflow cannot open (a typo'd scheme), before any client."""
    scheme = urllib.parse.urlsplit(uri).scheme.split("+")[0] if "://" in uri else ""
    if scheme and scheme not in URI_SCHEMES:
        raise InputError(
            f"tracking URI {mask_secrets(uri)!r}: unknown scheme {scheme!r}; allowed: "
            f"{', '.join(sorted(URI_SCHEMES))} (e.g. sqlite:///mlruns.db, http://127.0.0.1:5000, "
            "postgresql://user@host/db) or a folder"
        )


CREDENTIAL_ENVS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def split_credentials(uri: str) -> tuple[str, tuple[str, str] | None]:
    """An http(s) URI without its `user:password@`, and (user, password) percent-decoded; other
    URIs as they are (a database driver reads its own userinfo)."""
    parts = urllib.parse.urlsplit(uri) if "://" in uri else None
    if parts is None or parts.scheme not in ("http", "https") or "@" not in parts.netloc:
        return uri, None
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, _, password = userinfo.partition(":")
    bare = urllib.parse.urlunsplit(parts._replace(netloc=host))
    return bare, (urllib.parse.unquote(user), urllib.parse.unquote(password))


def client_uri(uri: str) -> str:
    """The URI to give MLflow's client: `http://user:password@host` becomes `http://host` with
    the two as MLflow's basic-auth credentials (MLFLOW_TRACKING_USERNAME / _PASSWORD of this
    process; the URI's win over the environment's), so no request line, log or error of MLflow
    carries the password."""
    bare, credentials = split_credentials(uri)
    if credentials is not None:  # `user@host` alone keeps the environment's password
        os.environ.update((k, v) for k, v in zip(CREDENTIAL_ENVS, credentials, strict=True) if v)
    return bare


def probe_database(uri: str) -> str | None:
    """Why a database server cannot be reached (None: a TCP connection opened). SQLAlchemy and
    MLflow retry a refused connection for over a minute and a half."""
    parts = urllib.parse.urlsplit(uri)
    scheme = parts.scheme.split("+")[0]
    if scheme not in DATABASE_PORTS or not parts.hostname:
        return None  # sqlite, or a socket path in the query string
    try:
        port = parts.port or DATABASE_PORTS[scheme]
        socket.create_connection((parts.hostname, port), timeout=PROBE_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        return f"{parts.hostname}:{parts.port or DATABASE_PORTS[scheme]}: {exc}"
    return None


def probe_http(uri: str) -> str | None:
    """Why an HTTP tracking server cannot be reached (None: it answered). One quick request:
    the MLflow client itself retries a refused connection for about 4 minutes."""
    import urllib.error
    import urllib.request  # here: it loads ssl, which `orchestrate --help` does without

    bare, credentials = split_credentials(uri)  # urllib would take `user:password@host` for a host
    request = urllib.request.Request(bare.rstrip("/") + "/health")
    if credentials is not None:
        token = base64.b64encode(":".join(credentials).encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return None  # it answered (auth or routing is checked by the real request)
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))
    return None


def unreachable_store(uri: str) -> str | None:
    """Why the store at ``uri`` cannot be reached within seconds (None: it answered or is a
    local file); the MLflow client itself would retry for minutes."""
    if uri.startswith(("http://", "https://")):
        return probe_http(uri)
    return probe_database(uri)


def unreachable_message(uri: str, why: str) -> str:
    """What `sweep` and `validate` say of a store they cannot reach (passwords masked)."""
    return (
        f"MLflow tracking store {mask_secrets(uri)} is unreachable: {mask_secrets(why)}. Start it "
        "(e.g. `orchestrate server`) or point --tracking-uri, search.tracking_uri or "
        "MLFLOW_TRACKING_URI at a reachable store."
    )


def missing_store(uri: str) -> str | None:
    """Why a local store does not exist (None: it does, or the store is not a local file): a
    reader such as `orchestrate ui` must not create an empty store where none was written."""
    if uri.startswith("sqlite:///"):
        path = uri.removeprefix("sqlite:///").split("?")[0]
    elif uri.startswith("file://") or "://" not in uri:
        path = uri.removeprefix("file://")
    else:
        return None
    if path in ("", ":memory:") or os.path.exists(path):
        return None
    return (
        f"MLflow tracking store {mask_secrets(uri)}: {os.path.abspath(path)} does not exist; "
        "name the store a sweep wrote with --tracking-uri (or MLFLOW_TRACKING_URI)"
    )
