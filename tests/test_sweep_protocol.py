"""A real sweep (local Ray, SQLite MLflow, toy corpus) records each trial's protocol fingerprint,
ends step-budgeted trials as finished (not as scheduler-stopped), and with
search.protocol.refit_on_train_dev tests the selected configuration after a refit on train + dev."""

from __future__ import annotations

import re

import pytest
from testkit.cli import orchestrate, run_orchestrate
from testkit.specs import write_spec
from testkit.store import runs_of

from nli_models.config import RunConfig
from nli_models.data import prepare_data
from nli_models.training import refit_and_test
from orchestrator.sweep.spec import apply_hyperparameters, load_spec
from results import run_schema as rs

pytestmark = pytest.mark.ray


def test_fingerprint_on_every_trial_and_refit_on_train_plus_dev(ray_session, workdir):
    spec_path = write_spec(
        workdir,
        {"training": {"epochs": 5, "max_steps": 40}},
        replace_search={
            "sampler": "grid",
            "space": {"lr": {"grid": [0.001, 0.01]}},
            "seeds": [1],
            "max_concurrent_trials": 2,
            "resources": {"cpu": 1},
            "protocol": {"refit_on_train_dev": True},
        },
    )
    swept = orchestrate("sweep", spec_path)
    assert swept.returncode == 0, swept.output
    assert "sweep finished: 2 trials (0 failed)" in swept.output

    _, children = runs_of(workdir, "tiny")
    spec = load_spec(spec_path)
    data = prepare_data(spec.data)
    for run in children:
        tags = run.data.tags
        protocol = {
            f: tags[rs.TAG_PROTOCOL_PREFIX + f] for f in rs.PROTOCOL_FIELDS
        }  # every field, on every trial
        assert protocol["corpus"] == "toy"
        assert protocol["train_size"] == str(len(data.splits["train"]))
        assert protocol["train_file"].startswith("toy(size=600")
        assert (protocol["epochs"], protocol["max_steps"]) == ("5", "40")
        assert protocol["refit_on_train_dev"] == "True"
        assert protocol["lr"] == str(float(run.data.params["lr"]))  # the trial's own value
        assert (protocol["optimizer"], protocol["batch_size"]) == ("adam", "32")
        assert protocol["vectors"] == "None" and protocol["init"] == "default"
        # 40 steps of batch 32 on 480 pairs: 2 whole epochs and a part, a finished trial
        assert run.data.metrics[rs.METRIC_EPOCHS_TRAINED] == 3
        assert tags[rs.TAG_EARLY_STOPPED] == "false"

    selected = [r for r in children if r.data.tags.get(rs.TAG_SELECTED) == "true"]
    assert len(selected) == 1
    run = selected[0]
    params = {"lr": float(run.data.params["lr"]), "seed": 1}
    config: RunConfig = apply_hyperparameters(spec.base_config(), params)
    epochs = int(run.data.metrics[rs.METRIC_BEST_EPOCH])
    refit, expected = refit_and_test(config, data, epochs)
    assert run.data.metrics[rs.METRIC_TEST_ACCURACY] == pytest.approx(expected.accuracy)
    # The refit says what it does and how far it is (issue 44: minutes of it were silent).
    pairs = len(data.splits["train"]) + len(data.splits["dev"])
    assert (f"refit of {{'lr': {params['lr']}, 'seed': 1}} on train + dev ({pairs:,} pairs): "
            f"{epochs} epochs (the selection run's best epoch {epochs}), then test") in swept.output
    progress = re.findall(r"^  refit epoch (\d+)/(\d+): \d+ s, about \d+ s left$", swept.output, re.M)
    assert progress == [(str(e), str(epochs)) for e in range(1, epochs + 1)]
    # The record says what the test number came from: the refit's epochs and time, on the run
    # and (the best run's) on the parent.
    assert run.data.metrics[rs.METRIC_REFIT_EPOCHS] == refit.state.epoch == epochs
    assert run.data.metrics[rs.METRIC_REFIT_TIME] > 0
    (parent,), _ = runs_of(workdir, "tiny")
    assert parent.data.metrics[rs.METRIC_SWEEP_REFIT_EPOCHS] == epochs
    assert parent.data.metrics[rs.METRIC_SWEEP_REFIT_TIME] == run.data.metrics[rs.METRIC_REFIT_TIME]

    # `best` exports what reproduces that test number: the config and `train --refit EPOCHS`.
    best = workdir / "best.yaml"
    exported = run_orchestrate(["best", "tiny", "--out", str(best)], cwd=workdir)
    assert exported.returncode == 0, exported.stderr
    test = run.data.metrics[rs.METRIC_TEST_ACCURACY]
    assert f"test accuracy {test:.2%}, of a refit on train + dev" in best.read_text()
    assert f"`orchestrate train {best} --refit {epochs}` reproduces it" in best.read_text()
    trained = run_orchestrate(["train", str(best), "--refit", str(epochs)], cwd=workdir)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert f"refit on train + dev (540 pairs): {epochs} epochs" in trained.stdout
    assert f"test accuracy {test:.2%} (final weights of the refit" in trained.stdout
