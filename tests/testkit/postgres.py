"""PostgreSQL on 127.0.0.1:5432 (trust auth), started when needed, with a fresh database per
module (`postgres_uri`) or per test (`fresh_postgres`); the fixtures are registered in conftest.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest

PG_HOST, PG_PORT, PG_USER = "127.0.0.1", 5432, "postgres"


def _pg_connect(database: str = "postgres"):
    import psycopg2

    return psycopg2.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname=database, connect_timeout=5)


def _ensure_postgres() -> str | None:
    """None when PostgreSQL answers (starting the local cluster if needed), else the reason."""
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 is not installed (pip install psycopg2-binary)"
    try:
        _pg_connect().close()
        return None
    except Exception as exc:
        first = str(exc).strip()
    versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    if not versions or not shutil.which("pg_ctlcluster"):
        return f"PostgreSQL not reachable at {PG_HOST}:{PG_PORT} ({first}) and no local cluster to start"
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main", "start"],
        capture_output=True, timeout=60,
    )
    try:
        _pg_connect().close()
        return None
    except Exception as exc:
        return (f"PostgreSQL not reachable at {PG_HOST}:{PG_PORT} and "
                f"`pg_ctlcluster {versions[-1]} main start` did not help: {exc}")


def new_database():
    """A new, empty database on the local PostgreSQL (trust auth), dropped afterwards; the test
    skips with the reason where PostgreSQL cannot be had."""
    reason = _ensure_postgres()
    if reason:
        pytest.skip(reason)
    name = f"nli_test_{uuid.uuid4().hex[:10]}"
    connection = _pg_connect()
    connection.autocommit = True
    connection.cursor().execute(f"CREATE DATABASE {name}")
    try:
        yield f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"
    finally:
        connection.cursor().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        connection.close()


postgres_uri = pytest.fixture(scope="module", name="postgres_uri")(new_database)
fresh_postgres = pytest.fixture(name="fresh_postgres")(new_database)  # one per test
