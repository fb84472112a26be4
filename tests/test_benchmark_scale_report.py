"""What `benchmarks.run scale_cluster` reports from its measurements: the 10,000-trial ratio and
the memory slope only when two sizes or more give a fit (one size printed "nanx ... MISSED" and
"nan" fits), and issue 26's goal at the largest size (ratio <= 1.10x, driver CPU gap <= 20 ms per
trial) for every run. The measurements here are made up; nothing is run."""

from __future__ import annotations

import pytest

from benchmarks.scale_cluster import fits, summary_md, targets

pytestmark = pytest.mark.unit


def _run(n: int, plain_s: float, ours_s: float, plain_cpu_ms: float, ours_cpu_ms: float) -> dict:
    def path(wall_s: float, cpu_ms: float) -> dict:
        return {"wall_s": wall_s, "driver_cpu_s": cpu_ms * n / 1000, "driver_peak_rss_mb": 700 + n / 100,
                "events_per_s": 8.0, "flush_after_tune_s": 0.1, "uploader_cpu_s": 0.02 * n,
                "uploader_backlog_max": 50}
    return {"plain": path(plain_s, plain_cpu_ms), "ours": path(ours_s, ours_cpu_ms), "ideal_s": n * 0.19,
            "ratio_ours_to_plain": ours_s / plain_s, "loadavg_before": [0.5, 0.4, 0.3],
            "tracking_check": {"events_reported": 3 * n, "rows_in_mlflow": 3 * n, "lost": 0, "doubled": 0}}


def _by_name(rows: list[dict]) -> dict[str, dict]:
    return {row["target"].split(":")[0]: row for row in rows}


def test_one_size_reports_no_fit_and_judges_the_run_against_issue_26():
    runs = {"1000": _run(1000, plain_s=532.0, ours_s=579.0, plain_cpu_ms=587.0, ours_cpu_ms=606.0)}
    rows = _by_name(targets((1000,), runs, fits(runs)))
    text = summary_md((1000,), runs, fits(runs), slots=16)
    assert "nan" not in text.lower() and "No fits over N: one size measured" in text
    assert all("nan" not in row["measured"].lower() for row in rows.values()), rows
    assert rows["our wall / plain Tune's wall"]["met"] is None  # not measured, not missed
    assert "not extrapolated: one size measured (N=1000)" in rows["our wall / plain Tune's wall"]["measured"]
    assert rows["driver memory"]["met"] is None
    this_run = rows["this run at N=1000"]
    assert this_run["measured"] == "1.088x, +19.0 ms/trial" and this_run["met"] is True


def test_the_run_misses_issue_26_on_either_figure():
    slow = {"1000": _run(1000, plain_s=500.0, ours_s=560.0, plain_cpu_ms=600.0, ours_cpu_ms=600.0)}
    costly = {"1000": _run(1000, plain_s=500.0, ours_s=500.0, plain_cpu_ms=600.0, ours_cpu_ms=621.0)}
    for runs in (slow, costly):
        assert _by_name(targets((1000,), runs, fits(runs)))["this run at N=1000"]["met"] is False


def test_two_sizes_extrapolate_to_10000():
    runs = {"100": _run(100, plain_s=60.0, ours_s=62.0, plain_cpu_ms=600.0, ours_cpu_ms=610.0),
            "1000": _run(1000, plain_s=510.0, ours_s=530.0, plain_cpu_ms=590.0, ours_cpu_ms=600.0)}
    fit = fits(runs)
    rows = _by_name(targets((100, 1000), runs, fit))
    ratio = rows["our wall / plain Tune's wall"]
    # ours = 10 + 0.52 N, plain = 10 + 0.5 N: at 10,000 trials 5210 / 5010
    assert ratio["measured"].startswith(f"{5210 / 5010:.3f}x extrapolated from linear fits over N=100, 1000")
    assert ratio["met"] is True
    assert "R²" in rows["driver memory"]["measured"]
    assert "Extrapolated to 10,000 trials: ours 5210 s, plain 5010 s" in summary_md((100, 1000), runs, fit, slots=16)
