"""A sweep's runs as its MLflow store (`folder`/mlruns.db, as specs.write_spec sets it) holds
them, and conditions on them for processes.wait_while_driving."""

from __future__ import annotations

import atexit
import contextlib
import functools
import shutil
import sqlite3
import tempfile
from pathlib import Path


def client_for(folder: Path):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlruns.db'}")


@functools.cache
def _empty_store() -> Path:
    """A new MLflow SQLite store, its schema made by MLflow, once per test process."""
    folder = Path(tempfile.mkdtemp(prefix="nli-empty-store-"))
    atexit.register(shutil.rmtree, folder, True)
    client_for(folder).search_experiments()
    return folder / "mlruns.db"


def seed_store(folder: Path) -> None:
    """`folder`/mlruns.db as a new store, copied from `_empty_store` unless it exists. Making a
    store runs MLflow's schema migrations, ~1.2 CPU-s in every sweep that makes its own; the
    store a sweep makes itself is still tested where a spec names one that does not exist (the
    quickstart and demo, `--tracking-uri` to a new file, write_spec(new_store=True)). The Default
    experiment's artifact location is the one a driver run in `folder` would give it."""
    store = folder / "mlruns.db"
    if store.exists():
        return
    shutil.copyfile(_empty_store(), store)
    with contextlib.closing(sqlite3.connect(store)) as db, db:
        db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                    (str(folder / "mlruns" / "0"),))


def runs_of(folder: Path, experiment: str) -> tuple[list, list]:
    """(parent runs, child runs) of an experiment."""
    client = client_for(folder)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r}"
    runs = client.search_runs([found.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("nli.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("nli.role") == "trial"]
    return parents, children


def runs_so_far(folder: Path, experiment: str) -> tuple[list, list]:
    """runs_of, or no runs while the store or the experiment does not exist yet."""
    try:
        return runs_of(folder, experiment)
    except Exception:
        return [], []


def store_ready(log: Path) -> bool:
    """The driver logging to `log` has created its store: reading it before races with MLflow's
    schema migration."""
    return "parent run" in log.read_text()


def trial_running(folder: Path, experiment: str, log: Path, epochs_logged: int = 0):
    """A condition: a trial run is RUNNING (with at least one epoch logged if `epochs_logged`)."""
    from results import run_schema as rs

    def check() -> bool:
        if not store_ready(log):
            return False
        _, children = runs_so_far(folder, experiment)
        return any(
            c.info.status == "RUNNING"
            and (not epochs_logged or rs.METRIC_DEV_ACCURACY in c.data.metrics)
            for c in children
        )
    return check


def trials_finished(folder: Path, experiment: str, log: Path, count: int):
    """A condition: at least `count` trial runs are FINISHED."""
    def check() -> bool:
        if not store_ready(log):
            return False
        _, children = runs_so_far(folder, experiment)
        return sum(c.info.status == "FINISHED" for c in children) >= count
    return check
