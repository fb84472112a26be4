"""One TrialResult (results/trial_result.py): what the trainable reports to Tune each epoch is named
by the contract (results/run_schema.py), reaches MLflow under those names through the sweep's
recorder, and reads back from MLflow as the TrialResult and selection record that the paper
protocol builds from the same trial's last Tune result."""

from __future__ import annotations

import pytest
from testkit.toy import decomposable, toy_run_config

from nli_models.training import make_trainer
from orchestrator.journal.operations import Journal
from orchestrator.journal.recorder import EPOCH_METRICS, SweepRecorder
from orchestrator.ray_adapter.ray_trial import epoch_metrics, trial_result
from orchestrator.ray_adapter.tuner import TrialOutcome
from orchestrator.sweep.spec import config_key
from orchestrator.tracking.tracker import Tracker
from orchestrator.tracking.uploader import JournalUploader, create_parent
from results import run_schema as rs
from results.run_reader import load_trials, metric_histories

pytestmark = pytest.mark.unit

EPOCHS = 3
CONTRACT_NAMES = {value for name, value in vars(rs).items() if name.startswith(("METRIC_", "RESULT_"))}


@pytest.fixture(scope="module")
def reported(toy, one_thread):
    """The Tune results of a real trial, as ray_trial.run_trial reports them, and its trainer."""
    trainer = make_trainer(toy_run_config(decomposable(dim=8), epochs=EPOCHS), toy)
    results = []
    trainer.fit(lambda t, result: results.append(epoch_metrics(t, result, t.finished())))
    return results, trainer


def test_every_key_the_trainable_reports_is_a_contract_name(reported):
    results, trainer = reported
    assert [r[rs.METRIC_EPOCHS_TRAINED] for r in results] == list(range(1, EPOCHS + 1))
    for result in results:
        assert set(result) <= CONTRACT_NAMES, set(result) - CONTRACT_NAMES
        assert set(EPOCH_METRICS) <= set(result)  # every per-epoch metric the recorder logs
    assert results[-1][rs.RESULT_TRIAL_FINISHED] == 1
    assert trial_result(trainer, EPOCHS).metrics().items() <= results[-1].items()


def test_mlflow_and_the_last_tune_result_give_the_same_trial_result_and_record(reported, tmp_path):
    results, _ = reported
    store = Tracker(f"sqlite:///{tmp_path / 'mlruns.db'}")
    experiment_id, parent = create_parent(store, "contract", "sweep-contract", {})
    journal = Journal(tmp_path / "tracking-journal.jsonl", experiment_id, parent)
    params = {"model": "decomposable", "variant": "vanilla", "hidden_size": 8, "lr": 0.01, "seed": 1}
    recorder = SweepRecorder(journal, base_params={}, run_tags={})
    recorder.trial_started("t1", params)
    for result in results:
        recorder.trial_result("t1", result)
    recorder.trial_completed("t1", results[-1], None)
    JournalUploader(store, journal.path).upload_available()
    journal.close()

    [trial] = load_trials(store.client, [store.client.get_experiment(experiment_id)])
    # The recorder logged the trainable's own dev accuracy at each epoch (the same key, not a
    # name that happens to be equal).
    history = metric_histories(store.client, [trial.record.run_id], rs.METRIC_DEV_ACCURACY)
    assert history[trial.record.run_id] == [
        (r[rs.METRIC_EPOCHS_TRAINED], pytest.approx(r[rs.METRIC_DEV_ACCURACY])) for r in results
    ]
    outcome = TrialOutcome("t1", params, results[-1], checkpoint=None, error=None)
    assert trial.record == outcome.result.record(
        run_id=trial.record.run_id, config_key=config_key(params),
        model_config=rs.model_config_label(params), params=params, status="FINISHED",
    )
    assert trial.record.epochs_trained == EPOCHS and trial.record.best_dev_accuracy is not None
    assert trial.record.theta_m == results[-1][rs.METRIC_THETA_M] > 0
