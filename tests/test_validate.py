"""`orchestrate validate`: the resolved plan, and every bad spec rejected before anything runs."""

from __future__ import annotations

import pytest
import yaml
from testkit.cli import orchestrate
from testkit.specs import BASE_SPEC, merge


def _validate(tmp_path, spec: dict):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    before = set(tmp_path.iterdir())
    result = orchestrate("validate", str(path))
    return result, path, set(tmp_path.iterdir()) - before


def test_plan_shows_trials_grid_resources_and_splits(tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # a machine with a GPU to share
    spec = merge(BASE_SPEC, {"search": {"seeds": [1, 2], "resources": {"cpu": 2, "gpu": 0.25}}})
    result, _, written = _validate(tmp_path, spec)
    assert result.returncode == 0, result.output
    out = result.output
    assert "grid: lr[2] x dropout[2] = 4 configurations" in out
    assert "-> 8 trials" in out
    assert "2.0 CPU, 0.25 GPU" in out
    assert "train 480, dev 60, test 60 pairs" in out
    assert not written  # validate writes nothing (no MLflow store, no Ray results)


def _without(spec: dict, *path: str) -> dict:
    spec = merge(spec, {})
    node = spec
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return spec


BAD_SPECS = {
    "unknown model": (
        merge(BASE_SPEC, {"model": {"name": "transformer"}}),
        ["model", "unknown model 'transformer'", "decomposable", "rocktaschel"],
    ),
    "unknown variant": (
        merge(BASE_SPEC, {"model": {"variant": "deep"}}),
        ["model", "unknown variant 'deep'", "vanilla", "intra"],
    ),
    "unknown sampler": (
        merge(BASE_SPEC, {"search": {"sampler": "bayes"}}),
        ["search.sampler", "'grid'", "'tpe'", "'cmaes'"],
    ),
    "negative learning rate in the grid": (
        merge(BASE_SPEC, {"search": {"space": {"lr": {"grid": [0.1, -0.01]}}}}),
        ["search.space.lr.grid[1]", "training.lr", "greater than 0"],
    ),
    "zero learning rate": (
        merge(BASE_SPEC, {"training": {"lr": 0}}),
        ["training.lr", "greater than 0"],
    ),
    "empty grid": (
        merge(BASE_SPEC, {"search": {"space": {"dropout": {"grid": []}}}}),
        ["search.space.dropout", "at least one value"],
    ),
    "unknown top-level key": (
        merge(BASE_SPEC, {"serach": {}}),
        ["serach", "unknown key"],
    ),
    "unknown search key": (
        merge(BASE_SPEC, {"search": {"num_sample": 3}}),
        ["search.num_sample", "unknown key"],
    ),
    "grid value of the wrong type": (
        merge(BASE_SPEC, {"search": {"space": {"batch_size": {"grid": [32, "big"]}}}}),
        ["search.space.batch_size.grid[1]", "training.batch_size", "integer"],
    ),
    "dropout out of range": (
        merge(BASE_SPEC, {"search": {"space": {"dropout": {"grid": [0.1, 1.5]}}}}),
        ["search.space.dropout.grid[1]", "dropout"],
    ),
    "unknown hyperparameter": (
        merge(BASE_SPEC, {"search": {"space": {"filter_width": {"grid": [3]}}}}),
        ["search.space.filter_width", "unknown hyperparameter", "allowed:", "hidden_size"],
    ),
    "grid with an Optuna sampler": (
        merge(BASE_SPEC, {"search": {"sampler": "tpe"}}),
        ["search", "grid values need sampler: grid", "choice"],
    ),
    "range with the grid sampler": (
        merge(BASE_SPEC, {"search": {"space": {"l2": {"loguniform": [1e-6, 1e-3]}}}}),
        ["search", "sampler 'grid' takes only grid values"],
    ),
    "seed searched in the space": (
        merge(BASE_SPEC, {"search": {"space": {"seed": {"grid": [1, 2]}}}}),
        ["search.space.seed", "search.seeds"],
    ),
    "missing model": (
        _without(BASE_SPEC, "model"),
        ["model", "Field required"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_spec_exits_2_naming_the_field(tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    spec, expected = BAD_SPECS[case]
    result, path, written = _validate(tmp_path, spec)
    assert result.returncode == 2, result.output
    assert str(path) in result.output  # names the file
    for fragment in expected:
        assert fragment in result.output, (fragment, result.output)
    assert "Traceback" not in result.output
    assert not written


def test_sweep_rejects_a_bad_spec_before_launching(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(merge(BASE_SPEC, {"training": {"lr": -1}})))
    result = orchestrate("sweep", str(path))
    assert result.returncode == 2 and "training.lr" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]  # no store, no results


def test_missing_and_malformed_files(tmp_path):
    missing = orchestrate("validate", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "nope.yaml: no such file" in missing.output
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    result = orchestrate("validate", str(broken))
    assert result.returncode == 2 and "not valid YAML" in result.output


def test_validate_runs_the_sweeps_fit_to_data_checks(tmp_path, monkeypatch):
    """A model whose embedding_dim contradicts the vectors' dimension: `validate` rejects it as
    `sweep` does (both run orchestrator.sweep.plan.check_input), before anything is written."""
    monkeypatch.chdir(tmp_path)
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("a 0.1 0.2 0.3 0.4\nthe 0.4 0.3 0.2 0.1\n")
    spec = merge(BASE_SPEC, {"data": {"vectors": {"source": str(vectors)}}})  # model: 16-d
    result, path, written = _validate(tmp_path, spec)
    assert result.returncode == 2, result.output
    assert "model.args.embedding_dim=16 but the word vectors" in result.output
    assert "have dimension 4" in result.output and "Traceback" not in result.output
    assert not written
    swept = orchestrate("sweep", str(path))
    assert swept.returncode == 2 and "have dimension 4" in swept.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml", "vectors.txt"]
    fixed = merge(spec, {"model": {"args": {"embedding_dim": 4}}})
    assert _validate(tmp_path, fixed)[0].returncode == 0


def test_validate_probes_the_tracking_store_as_sweep_does(tmp_path, monkeypatch):
    """A tracking server that does not answer: `validate` says so as `sweep` would (exit 2, the
    store named), writes nothing; a local store that does not exist yet is not created."""
    import socket

    monkeypatch.chdir(tmp_path)
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = merge(BASE_SPEC, {"search": {"tracking_uri": f"http://127.0.0.1:{port}"}})
    result, _, written = _validate(tmp_path, dead)
    assert result.returncode == 2, result.output
    assert f"MLflow tracking store http://127.0.0.1:{port} is unreachable" in result.output
    assert "Traceback" not in result.output and not written
    fresh = merge(BASE_SPEC, {"search": {"tracking_uri": f"sqlite:///{tmp_path / 'new.db'}"}})
    result, _, written = _validate(tmp_path, fresh)
    assert result.returncode == 0, result.output
    assert not written  # validate never creates the store


def test_validate_refuses_a_trial_this_machine_cannot_hold(tmp_path, monkeypatch):
    """A local sweep's trials run on this machine: a trial that asks for more CPUs or GPUs than
    it has is refused by `validate` (exit 2, nothing printed but the error), as `sweep` refuses
    it; with --slurm-* the allocation is checked instead."""
    import os

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cpus = len(os.sched_getaffinity(0))
    for resources, asked in (({"cpu": cpus + 1}, f"{cpus + 1} CPU and 0 GPU"),
                             ({"cpu": 1, "gpu": 1}, "1 CPU and 1 GPU")):
        spec = merge(BASE_SPEC, {"search": {"resources": resources}})
        result, _, written = _validate(tmp_path, spec)
        assert result.returncode == 2, result.output
        assert result.output.startswith("error: search.resources: a trial asks for " + asked)
        assert "sweep '" not in result.output and not written
    on_slurm = orchestrate("validate", str(tmp_path / "spec.yaml"), "--no-data",
                                         "--slurm-nodes", "1", "--slurm-gpus-per-node", "1")
    assert on_slurm.returncode == 0, on_slurm.output
