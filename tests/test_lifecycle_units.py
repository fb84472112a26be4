"""The lifecycle's pieces without Ray: transitions, the lease as readers see it, the ledger that
decides which trials ended, and the INCOMPLETE mark in a paper comparison."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pandas as pd
import pytest

from orchestrator.sweep.lifecycle import Interruption, SweepState, TrialLedger, lease_tags
from results import run_schema as rs
from results.published import comparison_table
from results.sweeps import STALE_AFTER_S, observed_state

pytestmark = pytest.mark.unit


def test_state_moves_only_along_the_lifecycle():
    written = []
    state = SweepState(written.append)
    for target in (rs.SWEEP_PLANNED, rs.SWEEP_RUNNING, rs.SWEEP_INTERRUPTED, rs.SWEEP_RUNNING,
                   rs.SWEEP_COMPLETED):
        state.move(target)
    assert written == [rs.SWEEP_PLANNED, rs.SWEEP_RUNNING, rs.SWEEP_INTERRUPTED, rs.SWEEP_RUNNING,
                       rs.SWEEP_COMPLETED]
    with pytest.raises(RuntimeError, match="from completed to interrupted"):
        state.move(rs.SWEEP_INTERRUPTED)
    state.move(rs.SWEEP_RUNNING)  # --extend only (--resume refuses a completed sweep)
    assert written[-1] == rs.SWEEP_RUNNING
    with pytest.raises(RuntimeError, match="from planned to completed"):
        SweepState(written.append, rs.SWEEP_PLANNED).move(rs.SWEEP_COMPLETED)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_running_sweep_of_a_dead_driver_reads_as_interrupted():
    tags = {rs.TAG_SWEEP_STATE: rs.SWEEP_RUNNING, **lease_tags()}
    assert observed_state(tags) == rs.SWEEP_RUNNING  # this process holds the lease
    dead = {**tags, rs.TAG_DRIVER: f"{socket.gethostname()} {_dead_pid()}"}
    assert observed_state(dead) == rs.SWEEP_INTERRUPTED  # same host: the pid tells at once
    elsewhere = {**tags, rs.TAG_DRIVER: "another-host 1"}
    assert observed_state(elsewhere) == rs.SWEEP_RUNNING
    later = time.time() + STALE_AFTER_S + 1
    assert observed_state(elsewhere, now=later) == rs.SWEEP_INTERRUPTED  # stale heartbeat
    assert observed_state({rs.TAG_SWEEP_STATE: "finished"}) == rs.SWEEP_COMPLETED  # old stores
    assert observed_state({rs.TAG_SWEEP_STATE: rs.SWEEP_RUNNING}) == rs.SWEEP_INTERRUPTED  # no lease


class _Heard:
    def __init__(self):
        self.events = []

    def __getattr__(self, name):
        return lambda trial_id, *args: self.events.append((name, trial_id))


def test_ledger_counts_a_trial_only_when_the_driver_saw_it_end():
    heard = _Heard()
    interruption = Interruption()
    ledger = TrialLedger([heard], interruption, time_budget_s=None)
    ledger.trial_completed("all-epochs", {rs.RESULT_TRIAL_FINISHED: 1}, None)
    ledger.trial_completed("asha-stopped", {rs.RESULT_TRIAL_FINISHED: 0}, None)
    ledger.trial_completed("never-reported", {}, None)
    interruption.signal_name = "SIGINT"
    ledger.trial_completed("cut-by-the-stop", {rs.RESULT_TRIAL_FINISHED: 0}, None)
    ledger.trial_completed("last-epoch-done", {rs.RESULT_TRIAL_FINISHED: 1}, None)
    ledger.trial_errored("killed-by-the-stop", {}, "error")
    assert ledger.ended == {"all-epochs", "asha-stopped", "last-epoch-done"}
    assert ledger.cut == {"never-reported", "cut-by-the-stop", "killed-by-the-stop"}
    assert ("trial_cut", "cut-by-the-stop") in heard.events
    assert not any(name == "trial_errored" for name, _ in heard.events)

    budget = TrialLedger([heard], Interruption(), time_budget_s=0)
    assert not budget.budget_spent()  # the budget counts from the first trial's start
    stopped = []
    budget.on_tune_stop(lambda: stopped.append("tune"))
    budget.trial_started("cut-by-the-budget", {})
    budget.trial_completed("cut-by-the-budget", {rs.RESULT_TRIAL_FINISHED: 0}, None)
    assert budget.cut == {"cut-by-the-budget"} and budget.budget_spent()
    budget._budget_timer.join(10)
    assert stopped == ["tune"]  # the ledger stopped Tune when the budget ran out


def test_signal_before_the_parent_exists_aborts_at_once():
    from orchestrator.sweep.lifecycle import SweepInterrupted

    with Interruption() as interruption, pytest.raises(SweepInterrupted):
        os.kill(os.getpid(), 2)
        time.sleep(1)  # the handler runs here
    assert not interruption.requested


def test_paper_comparison_marks_rows_of_incomplete_sweeps():
    row = {"experiment": "snli_decomposable", "model_config": "decomposable/vanilla",
           "hyperparameters": json.dumps({"model": "decomposable", "variant": "vanilla", "hidden_size": 200}),
           "corpus": "snli", "train_accuracy_running": 0.9, "dev_accuracy": 0.85, "test_accuracy": 0.86,
           "theta_m": 380000, "theta_wm": 380000, "test_accuracy_per_class": None,
           "dev_accuracy_per_class": None}
    why = "sweep abc of snli_decomposable: interrupted, 3/12 trials done, 0 failed"
    table = comparison_table(pd.DataFrame([row]), "parikh2016", {"snli_decomposable": why}).to_pandas()
    ours = table[table["experiment"] == "snli_decomposable"]
    assert len(ours) and all(f"INCOMPLETE: {why}" in note for note in ours["note"])
    unmarked = comparison_table(pd.DataFrame([row]), "parikh2016").to_pandas()
    assert not any("INCOMPLETE" in str(note) for note in unmarked["note"])
