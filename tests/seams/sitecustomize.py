"""Test-only seams: delays and fault injection that tests ask for through environment variables
which the product never reads. The test kit puts this folder on PYTHONPATH (tests/conftest.py for
the test process and what it starts, testkit.cli for `orchestrate` processes), so Python imports
this module at start-up in every process of a test, Ray's workers included; it wraps product
functions as their modules load. A variable unset: the wrapper only calls the product function."""

from __future__ import annotations

import importlib.abc
import os
import signal
import sys
import time
from pathlib import Path

FAIL_ONCE_ENV = "NLI_FAIL_ONCE_AT_EPOCH"  # "EPOCH:MARKER_DIR": each trial fails once at EPOCH
EPOCH_DELAY_ENV = "NLI_EPOCH_DELAY_S"  # every epoch of a trial lasts this much longer
# after each seed's test evaluation the driver waits this long (a signal cuts it short): a signal
# lands during the test evaluation
TEST_DELAY_ENV = "NLI_TEST_EVALUATION_DELAY_S"
# "MARKER_DIR": the first time a driver's scheduler stops a stack's member, the driver gets a
# SIGINT before it ends that member (once: a marker file stays in MARKER_DIR)
SIGINT_AT_MEMBER_STOP_ENV = "NLI_SIGINT_AT_MEMBER_STOP"


def _fail_once(epoch: int) -> None:
    setting = os.environ.get(FAIL_ONCE_ENV)
    if not setting:
        return
    from ray import tune

    at_epoch, marker_dir = setting.split(":", 1)
    marker = Path(marker_dir) / tune.get_context().get_trial_id()
    if epoch == int(at_epoch) and not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        raise RuntimeError(f"injected failure at epoch {epoch} ({FAIL_ONCE_ENV})")


def _slow_or_failing_epochs(ray_trial) -> None:
    """A trial's epoch, before Tune hears of it (ray_trial.epoch_metrics builds its report):
    fails once (FAIL_ONCE_ENV), then lasts EPOCH_DELAY_ENV longer."""
    epoch_metrics = ray_trial.epoch_metrics

    def delayed_epoch_metrics(trainer, result, finished):
        _fail_once(result.epoch)
        time.sleep(float(os.environ.get(EPOCH_DELAY_ENV) or 0))
        return epoch_metrics(trainer, result, finished)

    delayed_epoch_metrics.__wrapped__ = epoch_metrics
    ray_trial.epoch_metrics = delayed_epoch_metrics


def _slow_or_failing_stack_epochs(stack_trial) -> None:
    """A stacked trial's epoch, before Tune hears of it (stack_trial.member_results builds its
    report): fails once, then lasts EPOCH_DELAY_ENV longer, once for all its members (their
    ray_trial.epoch_metrics unwrapped)."""
    member_results = stack_trial.member_results
    stack_trial.epoch_metrics = getattr(stack_trial.epoch_metrics, "__wrapped__", stack_trial.epoch_metrics)

    def delayed_member_results(trainer, results, device):
        _fail_once(trainer.epoch)
        time.sleep(float(os.environ.get(EPOCH_DELAY_ENV) or 0))
        return member_results(trainer, results, device)

    stack_trial.member_results = delayed_member_results


def _slow_test_evaluations(sweep) -> None:
    """Each seed's test evaluation (protocol._evaluate_selected) followed by TEST_DELAY_ENV seconds
    of waiting, cut short by a signal: the driver's Interruption is the SIGINT handler's owner."""
    evaluate_selected = sweep._evaluate_selected

    def delayed_evaluate_selected(*args, **kwargs):
        evaluated = evaluate_selected(*args, **kwargs)
        interruption = _interruption()
        deadline = time.monotonic() + float(os.environ.get(TEST_DELAY_ENV) or 0)
        while time.monotonic() < deadline and not getattr(interruption, "requested", False):
            time.sleep(0.1)
        return evaluated

    sweep._evaluate_selected = delayed_evaluate_selected


def _interruption() -> object | None:
    """The driver's Interruption (lifecycle.py), the SIGINT handler's owner."""
    return getattr(signal.getsignal(signal.SIGINT), "__self__", None)


def _signal_at_member_stop(stacks) -> None:
    """The driver's per-member scheduler (stacks.MemberScheduler.stops): the first stop it decides
    is returned only once a SIGINT to the driver has been handled, so the member's end is told
    with the sweep interrupted."""
    stops = stacks.MemberScheduler.stops

    def stops_then_signal(self, trial_id, result):
        stopping = stops(self, trial_id, result)
        marker_dir = os.environ.get(SIGINT_AT_MEMBER_STOP_ENV)
        marker = Path(marker_dir) / "signalled" if marker_dir else None
        if stopping and marker is not None and not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            os.kill(os.getpid(), signal.SIGINT)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not getattr(_interruption(), "requested", False):
                time.sleep(0.05)
        return stopping

    stacks.MemberScheduler.stops = stops_then_signal


SEAMS = {"orchestrator.ray_adapter.ray_trial": _slow_or_failing_epochs,
         "orchestrator.ray_adapter.stack_trial": _slow_or_failing_stack_epochs,
         "orchestrator.sweep.protocol": _slow_test_evaluations,
         "orchestrator.ray_adapter.stacks": _signal_at_member_stop}


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds a module of SEAMS as the other finders would, and wraps its functions once it ran."""

    def find_spec(self, name, path, target=None):
        if name not in SEAMS:
            return None
        for finder in sys.meta_path:
            found = finder.find_spec(name, path, target) if finder is not self and hasattr(finder, "find_spec") else None
            if found is not None:
                break
        else:
            return None
        exec_module = found.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            SEAMS[name](module)

        found.loader.exec_module = exec_and_wrap
        return found


def install() -> None:
    """Wrap the modules of SEAMS: those loaded already now, the others when they load."""
    if any(isinstance(finder, _WrapOnImport) for finder in sys.meta_path):
        return
    for name, wrap in SEAMS.items():
        if name in sys.modules:
            wrap(sys.modules[name])
    sys.meta_path.insert(0, _WrapOnImport())


install()
