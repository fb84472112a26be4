"""Unit tests of the results package's pure parts: selection rule, statistics, EVP, rendering."""

import os

os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"  # before anything imports mlflow

import json
import math
import random
from dataclasses import replace

import pandas as pd
import pytest

from results.evp import expected_max_curve
from results.params import as_int, parse_param, same_value
from results.published import comparison_table
from results.render import render
from results.run_reader import TrialRun
from results.selection import TrialRecord, seed_runs, select_configuration
from results.stats import mcnemar, summarise, t_quantile
from results.table import build_table

pytestmark = pytest.mark.unit

MODEL_CONFIG = "rocktaschel/attention hidden_size=100"


def trial(config_key, dev, seed=1, status="FINISHED", theta_m=None, model_config=MODEL_CONFIG):
    return TrialRecord(
        run_id=f"{config_key}-{seed}-{status}",
        config_key=config_key,
        model_config=model_config,
        params={"seed": str(seed)},
        best_dev_accuracy=dev,
        seed=seed,
        status=status,
        theta_m=theta_m,
    )


def seeds(config_key, *devs, theta_m=None):
    return [trial(config_key, dev, seed, theta_m=theta_m) for seed, dev in enumerate(devs, 1)]


# --- selection rule -------------------------------------------------------------------------


def test_highest_mean_dev_accuracy_wins():
    trials = seeds("a", 0.80, 0.90) + seeds("b", 0.86, 0.86) + seeds("c", 0.70)
    assert select_configuration(trials) == "b"  # mean 0.86 beats 0.85 despite a's 0.90 seed


def test_mean_tie_goes_to_the_higher_minimum():
    # Both means are exactly 0.82; the same floats in another order must not break the tie.
    trials = seeds("a", 0.80, 0.82, 0.84) + seeds("b", 0.83, 0.81, 0.82)
    assert select_configuration(trials) == "b"


def test_then_fewer_parameters_then_smallest_config_key():
    assert select_configuration(seeds("a", 0.8, theta_m=200) + seeds("b", 0.8, theta_m=100)) == "b"
    assert select_configuration(seeds("a", 0.8, theta_m=100) + seeds("b", 0.8)) == "a"
    tied = seeds("zz", 0.8) + seeds("mm", 0.8) + seeds("qq", 0.8)
    for _ in range(5):
        random.shuffle(tied)
        assert select_configuration(tied) == "mm"


def test_only_finished_runs_count_and_early_stopped_ones_do():
    trials = [
        trial("killed", 0.99, status="KILLED"),
        trial("failed", None, status="FAILED"),
        trial("running", 0.95, status="RUNNING"),
        trial("stopped_early", 0.70),  # a scheduler's stop is still FINISHED
        *seeds("normal", 0.65),
    ]
    assert select_configuration(trials) == "stopped_early"


def repeated_proposal():
    """TPE proposed configuration a twice with seed 1: ASHA stopped one run after 1 epoch."""
    a_full = replace(trial("a", 0.90), run_id="a-full", epochs_trained=10)
    a_stopped = replace(trial("a", 0.50), run_id="a-stopped", epochs_trained=1)
    return [a_stopped, a_full, replace(trial("b", 0.85), epochs_trained=10)]


def test_a_repeated_configuration_and_seed_counts_once_the_longest_trained_run():
    trials = repeated_proposal()
    assert [t.run_id for t in seed_runs(trials)] == ["a-full", "b-1-FINISHED"]
    assert select_configuration(trials) == "a"  # counting both runs, a's mean 0.70 would lose to b


def test_the_results_table_counts_a_repeated_seed_once():
    runs = [TrialRun(record=t, experiment="e", parent_run_id="p", tagged_selected=False,
                     metrics={"best_dev_accuracy": t.best_dev_accuracy}) for t in repeated_proposal()]
    [row] = build_table(runs, lambda run_id: {}, ["e"]).to_pylist()
    assert row["n_trials"] == 3 and row["n_seeds"] == 1 and row["dev_accuracy"] == 0.90


def test_selection_refuses_mixed_or_empty_input():
    with pytest.raises(ValueError, match="several model configurations"):
        select_configuration(seeds("a", 0.8) + [trial("b", 0.9, model_config="other")])
    with pytest.raises(ValueError, match="no FINISHED trial"):
        select_configuration([trial("a", 0.9, status="FAILED")])


# --- statistics -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042), (1000, 1.962)],
)
def test_t_quantile_matches_published_tables(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=5e-4)


def test_mean_std_and_confidence_interval_over_seeds():
    summary = summarise([0.80, 0.82, 0.84])
    half_width = 4.302652729911275 * 0.02 / math.sqrt(3)  # t_{0.975,2} * std / sqrt(n)
    assert (summary.n, summary.mean, summary.std) == (3, pytest.approx(0.82), pytest.approx(0.02))
    assert summary.ci_low == pytest.approx(0.82 - half_width)
    assert summary.ci_high == pytest.approx(0.82 + half_width)
    one = summarise([0.5])
    assert (one.mean, one.std, one.ci_low) == (0.5, None, None)
    assert summarise([]).mean is None


def test_mcnemar_exact_binomial_for_few_discordant_pairs():
    result = mcnemar(3, 10)  # 13 discordant: 2 * P(X <= 3), X ~ Bin(13, 1/2)
    assert result.method == "exact binomial"
    assert result.p_value == pytest.approx(2 * (1 + 13 + 78 + 286) / 2**13)
    assert mcnemar(0, 0).p_value == 1.0
    assert mcnemar(5, 5).p_value == 1.0  # the doubled tail is capped at 1


def test_mcnemar_chi_square_with_continuity_correction():
    result = mcnemar(30, 15)  # (|30 - 15| - 1)^2 / 45 = 196 / 45
    assert result.method == "chi-square, continuity corrected"
    assert result.statistic == pytest.approx(196 / 45)
    assert result.p_value == pytest.approx(0.036888, abs=1e-6)  # chi2(df=1) survival at 4.3556


def test_statistics_agree_with_scipy_stats():
    """results.stats computes on scipy.special (a cheaper import): the same values as
    scipy.stats' t.ppf, binomtest (two-sided, p = 1/2) and chi2.sf."""
    from scipy import stats

    for df in (1, 2, 3, 7, 29, 200):
        for p in (0.005, 0.025, 0.3, 0.5, 0.9, 0.975):
            assert t_quantile(p, df) == pytest.approx(float(stats.t.ppf(p, df)), rel=1e-9, abs=1e-12)
    for b in range(25):
        for c in range(25 - b):
            result = mcnemar(b, c)
            if b + c == 0:
                continue
            expected = stats.binomtest(b, b + c, 0.5, alternative="two-sided").pvalue
            assert result.p_value == pytest.approx(min(1.0, expected), rel=1e-9)
    for b, c in ((30, 15), (12, 13), (100, 40), (60, 0)):
        result = mcnemar(b, c)
        assert result.p_value == pytest.approx(float(stats.chi2.sf(result.statistic, 1)), rel=1e-9)


# --- expected validation performance ---------------------------------------------------------


def test_expected_max_curve_against_hand_computation():
    curve = expected_max_curve([0.6, 0.8, 0.7])
    # Sorted 0.6, 0.7, 0.8; weights (i/3)^n - ((i-1)/3)^n: n=2 -> 1/9, 3/9, 5/9; n=3 -> 1, 7, 19 /27
    expected_means = [0.7, (0.6 + 3 * 0.7 + 5 * 0.8) / 9, (0.6 + 7 * 0.7 + 19 * 0.8) / 27]
    assert [mean for mean, _ in curve] == pytest.approx(expected_means)
    variance_one = (0.36 + 0.49 + 0.64) / 3 - 0.7**2
    assert curve[0][1] == pytest.approx(math.sqrt(variance_one))
    assert expected_max_curve([0.5, 0.5]) == [(0.5, 0.0), (0.5, 0.0)]


# --- params and rendering ---------------------------------------------------------------------


def test_params_parse_and_compare_as_logged_strings():
    assert [parse_param(v) for v in ("100", "1e-4", "False", "None", "adam", "nan")] == [
        100,
        0.0001,
        False,
        None,
        "adam",
        "nan",
    ]
    assert same_value(100, "100.0") and same_value(False, "false") and same_value("adam", "adam")
    assert not same_value(True, "False") and not same_value(100, "159")
    assert (as_int("42"), as_int(252000.0), as_int("True"), as_int(None)) == (
        42,
        252000,
        None,
        None,
    )


def test_render_formats_escape_and_blank_nulls():
    frame = pd.DataFrame({"model config": ["a|b", "x_y & z"], "test": [82.0, float("nan")]})
    assert render(frame, "md").splitlines() == [
        "| model config | test |",
        "| --- | --- |",
        r"| a\|b | 82.00 |",
        "| x_y & z |  |",
    ]
    assert render(frame, "csv").splitlines() == ["model config,test", "a|b,82.00", "x_y & z,"]
    latex = render(frame, "latex")
    assert latex.startswith("\\begin{tabular}{lr}\n\\toprule\nmodel config & test \\\\")
    assert r"x\_y \& z &  \\" in latex and latex.rstrip().endswith(r"\end{tabular}")


def test_paper_rows_match_only_rows_trained_on_the_papers_corpus():
    params = {"model": "rocktaschel", "variant": "word_by_word", "hidden_size": 100, "two_way": False}
    frame = pd.DataFrame(
        [
            {"experiment": e, "model_config": "wbw", "corpus": corpus,
             "hyperparameters": json.dumps(params), "test_accuracy": acc, "train_accuracy_running": 0.9,
             "dev_accuracy": 0.8, "theta_m": 252_103, "theta_wm": 3_900_000,
             "test_accuracy_per_class": None, "dev_accuracy_per_class": None}
            for e, corpus, acc in (("on-snli", "snli", 0.83), ("on-sick", "sick", 0.5))
        ]
    )
    table = comparison_table(frame, "rocktaschel2016").to_pandas()
    wbw = table[(table["row"] == "Word-by-word attention, k=100") & (table["metric"] == "test_accuracy")]
    assert list(wbw["experiment"]) == ["on-snli"]
    assert wbw["ours"].iloc[0] == pytest.approx(83.0)


def test_evp_budget_ticks_label_every_trial_count_and_the_ends():
    from results.evp import budget_ticks

    assert budget_ticks(1, 6, integers=True) == [1, 2, 3, 4, 5, 6]  # was: only 1 and 2
    assert budget_ticks(1, 40, integers=True) == [1, 2, 5, 10, 20, 40]
    assert budget_ticks(0.025, 0.147, integers=False) == pytest.approx([0.025, 0.05, 0.1, 0.147])


def test_latex_is_a_booktabs_float_with_caption_and_label():
    frame = pd.DataFrame({"model": ["wbw"], "|θ|M": ["252K"], "dev": ["82.00 ± 1.00"]})
    latex = render(frame, "latex", caption="Accuracy (%) on snli", label="tab:snli")
    assert latex.splitlines()[:5] == [
        r"\begin{table}[t]",
        r"\centering",
        r"\caption{Accuracy (\%) on snli}",
        r"\label{tab:snli}",
        r"\begin{tabular}{lrr}",
    ]
    assert r"\toprule" in latex and r"\midrule" in latex and r"\bottomrule" in latex
    assert "\\hline" not in latex
    assert r"$|\theta|$M" in latex and r"82.00 $\pm$ 1.00" in latex
    assert latex.rstrip().endswith(r"\end{table}")


def test_counts_and_hyperparameters_are_written_as_papers_write_them():
    from results.params import short_value
    from results.render import format_count, format_hyperparameters

    assert [format_count(n) for n in (252_103, 3_900_000, 999, 111_000, 12_345_678, None)] == [
        "252K", "3.9M", "999", "111K", "12M", "",
    ]
    assert [short_value(v) for v in (0.0003, "0.0003", 0.1, 100, "1e-05", 1.0, "adam", True)] == [
        "3e-4", "3e-4", "0.1", "100", "1e-5", "1", "adam", "True",
    ]
    assert format_hyperparameters({"lr": 3e-4, "dropout": 0.1, "k": 100}) == "lr=3e-4 dropout=0.1 k=100"


def test_evp_band_stays_in_the_observed_range_and_axes_say_log_and_minutes():
    """Two draws, 0.80 and 0.84: the ±1 std band of the expected maximum never rises above the
    best observed 84% (nor below the worst); a 3-minute budget is read in minutes on a log axis."""
    from results.evp import COLUMNS, expected_max_curve, plot_evp
    from results.schema import arrow_table

    curve = expected_max_curve([0.80, 0.84])
    rows = [{"experiment": "e", "corpus": "toy", "model_config": "m", "n": n, "expected_best_dev_accuracy": mean,
             "std": std, "n_draws": 2, "min_observed_dev_accuracy": 0.80, "max_observed_dev_accuracy": 0.84,
             "budget_hours": n * 90 / 3600} for n, (mean, std) in enumerate(curve, start=1)]
    assert curve[-1][0] + curve[-1][1] > 0.84  # unclipped, the band would rise above the best draw
    table = arrow_table(rows, COLUMNS, "evp")
    for budget in ("trials", "hours"):
        axes = plot_evp(table, budget).axes[0]
        band = axes.collections[0].get_paths()[0].vertices[:, 1]
        assert 80.0 - 1e-9 <= band.min() and band.max() <= 84.0 + 1e-9
        assert "log scale" in axes.get_xlabel()
    assert "minutes" in axes.get_xlabel() and "up to 3 minutes" in axes.get_title()
    assert [t.get_text() for t in axes.get_xticklabels()] == ["1.5", "2", "3"]


def test_a_tie_has_no_majority_class():
    """A balanced test set: the baseline row says the classes are tied, not one arbitrary name."""
    import pandas as pd

    from results.predictions import majority_class

    balanced = pd.DataFrame({"label_name": ["neutral", "entailment", "contradiction"] * 4})
    assert majority_class(balanced) == ("contradiction / entailment / neutral tied", pytest.approx(1 / 3))
    skewed = pd.DataFrame({"label_name": ["neutral", "entailment", "neutral"]})
    assert majority_class(skewed) == ("neutral", pytest.approx(2 / 3))
