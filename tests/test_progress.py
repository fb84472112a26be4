"""The sweep's progress line tells the truth: the ETA counts the epochs still to run, so it is not
0:00:00 while a trial trains; a line announces the test evaluation; figures are rounded."""

from __future__ import annotations

import io

import pytest

from orchestrator.sweep import progress as progress_module
from orchestrator.sweep.progress import ProgressPrinter
from results import run_schema as rs

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", fake)
    return fake


def test_eta_from_finished_trial_epochs(clock):
    printer = ProgressPrinter(4, stream=io.StringIO(), epochs_per_trial=10)
    printer.trial_started("a", {})
    printer.trial_started("b", {})
    assert printer.eta() == "?"  # no epoch finished yet: no rate to extrapolate
    clock.now += 100
    for epoch in range(1, 6):
        printer.trial_result("a", {rs.METRIC_EPOCHS_TRAINED: epoch, "dev_accuracy": 0.5})
        printer.trial_result("b", {rs.METRIC_EPOCHS_TRAINED: epoch, "dev_accuracy": 0.52460984})
    # 10 trial-epochs in 100 s; to come: 5 + 5 for the running pair, 10 + 10 for the pending
    assert printer.eta() == "0:05:00"
    assert "best dev_accuracy 52.46% |" in printer.line()  # rounded, in percent


def test_eta_is_not_zero_while_the_last_trial_trains(clock):
    printer = ProgressPrinter(4, stream=io.StringIO(), epochs_per_trial=10, finished_before="abc")
    printer.trial_started("d", {})
    clock.now += 20
    printer.trial_result("d", {rs.METRIC_EPOCHS_TRAINED: 2, "dev_accuracy": 0.4})
    assert printer.eta() == "0:01:20"  # 8 epochs left at 10 s each (the old ETA said 0:00:00)


def test_test_evaluation_phase_has_a_line(clock):
    stream = io.StringIO()
    printer = ProgressPrinter(1, stream=stream)
    clock.now += 61.6
    printer.phase("trials ended; evaluating the selected configuration on test")
    assert stream.getvalue() == "[0:01:02] trials ended; evaluating the selected configuration on test\n"


def test_the_last_line_is_printed_once(clock):
    """The last trial's end and the sweep's end say the same: one line, not two or three."""
    stream = io.StringIO()
    printer = ProgressPrinter(1, stream=stream, epochs_per_trial=1)
    printer.trial_started("a", {})
    clock.now += 30
    printer.trial_result("a", {rs.METRIC_EPOCHS_TRAINED: 1, "dev_accuracy": 0.5})
    printer.trial_completed("a", {"dev_accuracy": 0.5}, None)
    printer.sweep_ended()
    lines = [line for line in stream.getvalue().splitlines() if "1 done" in line]
    assert len(lines) == 1, stream.getvalue()


def test_a_resumed_sweep_counts_the_whole_sweep(clock):
    """Done so far and the sweep's best, not this session's alone."""
    printer = ProgressPrinter(8, stream=io.StringIO(), epochs_per_trial=4, finished_before="abcde",
                              best_so_far=0.8125)
    printer.trial_started("f", {})
    clock.now += 10
    printer.trial_result("f", {rs.METRIC_EPOCHS_TRAINED: 1, "dev_accuracy": 0.6})
    line = printer.line()
    assert "5 done, 1 running, 2 pending" in line and "best dev_accuracy 81.25%" in line


def test_a_trial_finished_before_the_resume_and_run_again_counts_once(clock):
    """Issue 44: after a double SIGKILL and --resume, "5 done (of 4)": Tune's state, saved before
    the driver died, ran a trial again that the journal had already seen finish."""
    printer = ProgressPrinter(4, stream=io.StringIO(), epochs_per_trial=1, finished_before="abc")
    printer.trial_started("c", {})  # again
    assert "2 done, 1 running, 1 pending" in printer.line()
    printer.trial_completed("c", {"dev_accuracy": 0.5}, None)
    printer.trial_started("d", {})
    printer.trial_completed("d", {"dev_accuracy": 0.5}, None)
    assert "4 done, 0 running, 0 pending, 0 failed (of 4)" in printer.line()
