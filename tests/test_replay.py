"""Issue 30 items 1 and 4, issue 44 item 6: `orchestrate replay` through the CLI, on a store
that `orchestrate sweep` recorded (module scope, in this process on the module's Ray instance):
a completed grid sweep whose lr=1e10 configurations diverge (so the record lacks them), an
experiment whose only sweep is interrupted (its time budget ran out before any trial ended), and
a sweep over a continuous range, which cannot be replayed."""

from __future__ import annotations

import dataclasses
from typing import get_args

import pyarrow.parquet as pq
import pytest
from testkit.cli import orchestrate, run_orchestrate
from testkit.specs import write_spec
from testkit.store import client_for, runs_of
from testkit.toy import toy_data

from nli_models.config import validate_config
from nli_models.strict import load_yaml
from orchestrator.cli.replay_commands import SAMPLERS, SCHEDULERS
from orchestrator.sweep.replay import Budget, Strategy, recorded_trials, replay
from orchestrator.sweep.spec import SchedulerConfig, SearchConfig, SweepSpec
from results import run_schema as rs
from results.replay_record import read_recording
from results.replay_report import ReplayRun, plot_replay, run_rows, strategy_table, strategy_view
from results.run_reader import open_client

EXPERIMENT = "replayed"
GRID = {"lr": {"grid": [0.001, 0.01, 1e10]}, "dropout": {"grid": [0.0, 0.2]}}


@pytest.fixture(scope="module")
def store(ray_session, tmp_path_factory):
    """The recorded sweeps, run in this process on the module's Ray instance (replay's claims are
    about what it reads from their records, not about the sweeps' processes)."""
    folder = tmp_path_factory.mktemp("replay")
    env = {"NLI_DATA_DIR": str(folder / "data-cache")}
    spec = write_spec(folder, {"name": EXPERIMENT, "search": {"space": GRID}})
    recorded = orchestrate("sweep", spec, cwd=folder, env=env)
    # The two lr=1e10 trials diverge (runs FAILED); the sweep completes and selects.
    assert recorded.returncode == 0 and "2 diverged" in recorded.stdout, recorded.output
    unfinished = write_spec(folder, {
        "name": "unfinished", "data": toy_data(4000), "training": {"epochs": 40},
        "search": {"time_budget_s": 2, "space": {"lr": {"grid": [0.001]}, "dropout": {"grid": [0.0]}}},
    })
    cut = orchestrate("sweep", unfinished, cwd=folder, env=env)
    assert cut.returncode == 3, cut.output
    sampled = write_spec(folder, {"name": "sampled", "training": {"epochs": 1}}, replace_search={
        "sampler": "random", "num_samples": 2, "space": {"lr": {"loguniform": [0.001, 0.01]}},
        "max_concurrent_trials": 2, "resources": {"cpu": 1},
    })
    done = orchestrate("sweep", sampled, cwd=folder, env=env)
    assert done.returncode == 0, done.output
    return folder


def _replay(store, out: str, *args: str):
    """`orchestrate replay` in this process (its claims are its files and exit code; a new
    process costs seconds of imports)."""
    return orchestrate("replay", *args, "--out", store / out, "--tracking-uri", f"sqlite:///{store / 'mlruns.db'}",
                       cwd=store)


def _recorded(store):
    [parent], children = runs_of(store, EXPERIMENT)
    return parent, {c.info.run_id: c for c in children}


def test_grid_fifo_replay_selects_the_sweeps_configuration_and_reports_what_the_record_lacks(store):
    parent, children = _recorded(store)
    result = _replay(store, "grid/replay.parquet", EXPERIMENT, "--sampler", "grid",
                     "--scheduler", "fifo", "--repeats", "2", "--format", "md")
    assert result.returncode == 0, result.stdout + result.stderr
    runs = pq.read_table(store / "grid/replay.runs.parquet").to_pylist()
    assert [r["repeat"] for r in runs] == [0, 1]
    finished = [c for c in children.values() if c.info.status == "FINISHED"]
    assert len(finished) == 4
    recorded_epochs = sum(int(c.data.metrics[rs.METRIC_EPOCHS_TRAINED]) for c in finished)
    for run in runs:
        # The same selection as the real sweep, and the test number it recorded for it.
        assert run["selected_run_id"] == parent.data.tags[rs.TAG_BEST_RUN]
        assert run["same_as_sweep"] is True
        assert run["test_accuracy"] == pytest.approx(parent.data.metrics[rs.METRIC_SWEEP_TEST_ACCURACY])
        # The diverged configurations are missing, not invented; every finished one ran fully.
        assert run["missing"] == 2 and run["trials"] == 4 and run["cut"] == 0
        assert run["trial_epochs"] == recorded_epochs
        best = max(c.data.metrics[rs.METRIC_BEST_DEV_ACCURACY] for c in finished)
        assert run["best_dev_accuracy"] == pytest.approx(best)
    [row] = pq.read_table(store / "grid/replay.parquet").to_pylist()
    assert row["strategy"] == "grid+fifo" and row["same_as_sweep"] == 2 and row["missing"] == 2
    assert (store / "grid/replay.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (store / "grid/replay.md").read_text()
    assert "| grid+fifo | 2 |" in markdown and markdown.splitlines()[2] in result.stdout
    # Each header names the statistic over repeats it shows.
    assert markdown.splitlines()[0] == (
        "| strategy | repeats | trials (mean) | missing (mean) | trial-epochs (mean) | "
        "simulated (mean) | best dev (median, min-max) | selected dev (mean) | "
        "selection (most often) | = sweep's (repeats) | test of selection (mean) |")


def test_every_strategy_replays_and_test_accuracy_comes_only_from_the_record(store):
    _, children = _recorded(store)
    result = _replay(store, "all/replay.parquet", EXPERIMENT, "--repeats", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    table = pq.read_table(store / "all/replay.parquet")
    assert table.schema.metadata[b"nli.table"] == b"replay"
    strategies = table.column("strategy").to_pylist()
    assert strategies == [f"{a}+{b}" for a in ("grid", "random", "tpe", "cmaes", "nsga2")
                          for b in ("fifo", "asha", "median")]
    runs = pq.read_table(store / "all/replay.runs.parquet").to_pylist()
    assert len(runs) == 15 * 3
    epochs = {(r["strategy"], r["repeat"]): r["trial_epochs"] for r in runs}
    for repeat in range(3):  # the same grid points: a scheduler only ever stops trials early
        assert epochs[("grid+asha", repeat)] < epochs[("grid+fifo", repeat)]
        assert epochs[("grid+median", repeat)] <= epochs[("grid+fifo", repeat)]
    for run in runs:
        selected = children[run["selected_run_id"]]
        recorded_test = selected.data.metrics.get(rs.METRIC_TEST_ACCURACY)
        if recorded_test is None:
            assert run["test_accuracy"] is None
        else:
            assert run["test_accuracy"] == pytest.approx(recorded_test)
    assert "note: CMA-ES samples only numeric ranges" in result.stdout
    # The figure: small multiples, one column per sampler with its three schedulers, so that
    # 15 strategies are not 15 overlapping bands in one panel.
    from PIL import Image

    with Image.open(store / "all/replay.png") as image:
        width, height = image.size
    assert width > 2.5 * height  # five sampler columns, two rows (time, trial-epochs)


def test_figure_panels_hold_one_sampler_each():
    """In process: the figure's axes are a 2 x samplers grid, each panel with that sampler's
    schedulers only (one median line each)."""
    runs = [ReplayRun(f"{sampler}+{scheduler}", seed, epochs=[(10.0, 0.5), (20.0, 0.6)])
            for sampler in ("grid", "random", "tpe") for scheduler in ("fifo", "asha")
            for seed in range(2)]
    figure = plot_replay(runs, "replay of x")
    axes = figure.get_axes()
    assert len(axes) == 2 * 3
    assert [a.get_title() for a in axes[:3]] == ["grid", "random", "tpe"]
    for panel in axes:
        assert [line.get_label() for line in panel.get_lines()] == ["fifo", "asha"]


def test_a_strategy_that_selected_nothing_says_so():
    empty = run_rows([ReplayRun("random+fifo", 1)], ["lr"], None, lambda ids: 0.5)
    view = strategy_view(strategy_table(empty))
    assert view["test of selection (mean)"].tolist() == ["not recorded"]


def test_a_cut_curve_and_the_budgets_end_replays_where_the_record_and_budget_say(store):
    """In process, on the recorded store: a trial whose recorded curve a scheduler had cut ends
    there when the replay would go on (counted past_record); a budget of trial-epochs or
    simulated seconds cuts the trials still running, which are not selected."""
    record = read_recording(open_client(f"sqlite:///{store / 'mlruns.db'}"), EXPERIMENT)
    spec = validate_config(SweepSpec, load_yaml(record.spec_text), "spec.yaml")
    assert record.concurrency == 2  # trial runs overlapping in the record: max_concurrent_trials
    first, *others = record.trials
    cut = dataclasses.replace(first, cut_by_scheduler=True,
                              curves={name: values[:1] for name, values in first.curves.items()})
    grid_fifo = Strategy("grid", "fifo")
    run = replay(spec, recorded_trials(spec, [cut, *others]), grid_fifo, 0, Budget(trials=6), 2)
    assert [(t.record.run_id, t.record.epochs_trained) for t in run.trials if t.past_record] == [
        (first.run_id, 1)]
    keyed = recorded_trials(spec, list(record.trials))
    by_epochs = replay(spec, keyed, grid_fifo, 0, Budget(trials=6, epochs=2), 2)
    assert len(by_epochs.epochs) == 2 and by_epochs.cut == 2 and by_epochs.selection() == []
    before_first_epoch = min(t.epoch_time_s[0] for t in record.trials) / 2
    by_seconds = replay(spec, keyed, grid_fifo, 0, Budget(trials=6, seconds=before_first_epoch), 2)
    assert by_seconds.epochs == [] and by_seconds.cut == 2 and by_seconds.trials == []


@pytest.mark.parametrize(("args", "message"), [
    (["no-such-experiment"], "error: unknown experiment(s): no-such-experiment; experiments in "
                             "this tracking store:"),
    (["unfinished"], "error: experiment 'unfinished' has no completed sweep to replay"),
    ([EXPERIMENT, "--sampler", "hyperband"], "error: orchestrate replay: invalid value for "
                                             "'--sampler': 'hyperband' is not one of"),
    ([EXPERIMENT, "--budget", "hours=2"], "error: --budget 'hours=2': give each of trials=N"),
    ([EXPERIMENT, "--budget", "trials=0"], "error: --budget 'trials=0'"),
    (["sampled"], "error: sampled: sweep "),  # the rest: test_a_continuous_range_is_refused
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(store, args, message):
    # The real process: the claim is what the terminal shows (one line), warnings included.
    result = run_orchestrate(["replay", *args, "--out", str(store / "bad/replay.parquet"),
                              "--tracking-uri", f"sqlite:///{store / 'mlruns.db'}"], cwd=store)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""
    assert not (store / "bad").exists()
    assert client_for(store).get_experiment_by_name("no-such-experiment") is None


def test_a_continuous_range_is_refused_saying_why(store):
    """Issue 44: a sweep over a loguniform range printed every strategy with 0 trials and nan.
    No sampler can replay it (each draws values no recorded trial trained): exit 2, one line
    naming the range, nothing written."""
    [parent], _ = runs_of(store, "sampled")
    result = _replay(store, "sampled/replay.parquet", "sampled", "--repeats", "2")
    assert result.returncode == 2, result.output
    assert result.stderr.strip() == (
        f"error: sampled: sweep {parent.info.run_id}: its search space cannot be replayed: lr is "
        "a continuous range (loguniform [0.001, 0.01]) with no finite set of points to look up "
        "in the record; a sampler would draw values no recorded trial trained. Replay a sweep "
        "whose space is grid, choice or randint values")
    assert not (store / "sampled").exists()


def test_the_cli_offers_every_sampler_and_scheduler_a_spec_takes():
    """replay_commands lists them without importing the spec (`--help` stays light): kept equal here."""
    assert SAMPLERS == get_args(SearchConfig.model_fields["sampler"].annotation)
    assert SCHEDULERS == get_args(SchedulerConfig.model_fields["type"].annotation)
