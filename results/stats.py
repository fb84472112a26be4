"""Statistics over seeds and paired predictions, on scipy.special's distribution functions.

* ``summarise``: mean, sample standard deviation (ddof=1) and the two-sided Student-t confidence
  interval mean ± t_{(1+c)/2, n-1} · std / sqrt(n) over seeds.
* ``mcnemar``: McNemar's test on the discordant counts of two classifiers scored on the same
  examples: exact two-sided binomial test when b + c < 25 (the chi-square approximation is poor
  for few discordant pairs), else chi-square with continuity correction (|b - c| - 1)^2 / (b + c)
  on one degree of freedom.

scipy.special, not scipy.stats: every sweep's driver loads this module for its end-of-sweep
table, and with scipy.stats (which rewrites docstrings at import time) it took about 0.6 CPU-s
more to import (benchmarks/README.md, "sweep_cpu").
tests/test_results_units.py checks each function against scipy.stats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import special

EXACT_BELOW = 25  # discordant pairs under which McNemar uses the exact binomial test


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with ``df`` >= 1 degrees of freedom (p in (0, 1))."""
    if not 0 < p < 1 or df < 1:
        raise ValueError(f"need 0 < p < 1 and df >= 1, got p={p}, df={df}")
    return float(special.stdtrit(df, p))


@dataclass(frozen=True)
class Summary:
    """Mean, sample std and confidence interval of per-seed values (None where undefined)."""

    n: int
    mean: float | None
    std: float | None
    ci_low: float | None
    ci_high: float | None


def summarise(values: Sequence[float], confidence: float = 0.95) -> Summary:
    n = len(values)
    if n == 0:
        return Summary(0, None, None, None, None)
    mean = math.fsum(values) / n
    if n == 1:
        return Summary(1, mean, None, None, None)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile((1 + confidence) / 2, n - 1) * std / math.sqrt(n)
    return Summary(n, mean, std, mean - half, mean + half)


@dataclass(frozen=True)
class McNemarResult:
    only_a_correct: int  # b
    only_b_correct: int  # c
    method: str  # "exact binomial" or "chi-square, continuity corrected"
    statistic: float | None  # chi-square value; None for the exact test
    p_value: float


def mcnemar(only_a_correct: int, only_b_correct: int) -> McNemarResult:
    b, c = only_a_correct, only_b_correct
    discordant = b + c
    if discordant == 0:
        return McNemarResult(b, c, "exact binomial", None, 1.0)
    if discordant < EXACT_BELOW:
        # Under H0 each discordant pair goes either way with probability 1/2: Bin(b + c, 1/2) is
        # symmetric, so the two-sided p-value is twice the smaller tail, capped at 1.
        p_value = 2 * special.bdtr(min(b, c), discordant, 0.5)
        return McNemarResult(b, c, "exact binomial", None, float(min(1.0, p_value)))
    statistic = (abs(b - c) - 1) ** 2 / discordant
    return McNemarResult(
        b, c, "chi-square, continuity corrected", statistic, float(special.chdtrc(1, statistic))
    )
