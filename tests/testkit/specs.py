"""The one sweep-spec writer: a spec on the toy BASE_SPEC (seconds per trial) or on the shipped
search_spaces/quickstart.yaml, with overrides merged in, written to a test's folder."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from testkit import REPO
from testkit.store import seed_store
from testkit.toy import decomposable, toy_data

QUICKSTART_PATH = REPO / "search_spaces" / "quickstart.yaml"

BASE_SPEC: dict[str, Any] = {
    "name": "tiny",
    "model": decomposable(dim=16, dropout=0.0),
    "data": toy_data(600),
    "training": {"optimizer": "adam", "lr": 0.003, "batch_size": 32, "epochs": 3},
    "search": {
        "sampler": "grid",
        "space": {"lr": {"grid": [0.001, 0.01]}, "dropout": {"grid": [0.0, 0.2]}},
        "seeds": [1],
        "max_concurrent_trials": 2,
        "resources": {"cpu": 1},
    },
}


@functools.cache
def _quickstart() -> dict:
    return yaml.safe_load(QUICKSTART_PATH.read_text())


def quickstart() -> dict:
    """search_spaces/quickstart.yaml as shipped (a fresh copy to edit)."""
    return copy.deepcopy(_quickstart())


def merge(base: dict, override: dict) -> dict:
    result = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge(result[key], value)
        else:
            result[key] = value
    return result


def write_spec(folder: Path, override: dict | None = None, replace_search: dict | None = None, *,
               base: dict | None = None, local_store: bool = True, new_store: bool = False,
               file_name: str | None = None) -> Path:
    """`base` (BASE_SPEC unless given, e.g. `quickstart()`) with `override` merged in (a `model`
    or `search.space` in it replaces the base's: arguments of two models or two grids do not
    mix), or with `replace_search` as its whole search block. With `local_store`, it logs to
    `folder`/mlruns.db and keeps Ray results in `folder`/ray_results unless it says otherwise;
    that store is there already, empty (store.seed_store), unless `new_store` leaves it to the
    sweep to make. Written to `folder`/`file_name` (NAME.yaml by default)."""
    spec = merge(BASE_SPEC if base is None else base, override or {})
    if override and "model" in override:
        spec["model"] = copy.deepcopy(override["model"])
    if replace_search is not None:
        spec["search"] = replace_search
    folder.mkdir(parents=True, exist_ok=True)
    if local_store:
        default_store = f"sqlite:///{folder / 'mlruns.db'}"
        spec["search"].setdefault("tracking_uri", default_store)
        spec["search"].setdefault("storage_path", str(folder / "ray_results"))
        if spec["search"]["tracking_uri"] == default_store and not new_store:
            seed_store(folder)
    path = folder / (file_name or f"{spec['name']}.yaml")
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def write_quickstart(folder: Path, name: str, tracking_url: str, *, epochs: int = 4,
                     grid: dict | None = None, toy_size: int | None = None,
                     storage_path: str | None = None) -> Path:
    """quickstart.yaml renamed `name`, logging to `tracking_url`, results in `folder` (or
    `storage_path`), with `epochs`, and `grid` ({param: values}) and `toy_size` when given."""
    base = quickstart()
    if grid is not None:  # the whole grid: quickstart's other parameters do not stay
        base["search"]["space"] = {k: {"grid": v} for k, v in grid.items()}
    override: dict[str, Any] = {
        "name": name, "training": {"epochs": epochs},
        "search": {"tracking_uri": tracking_url, "storage_path": storage_path or str(folder / "ray_results")},
    }
    if toy_size is not None:
        override["data"] = {"toy": {"size": toy_size}}
    return write_spec(folder, override, base=base)
