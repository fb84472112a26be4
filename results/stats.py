"""Statistics over seeds and paired predictions, in the standard library only (no scipy).

* ``t_quantile``: Student-t quantiles for integer degrees of freedom, by bisection on the exact
  closed-form CDF (Abramowitz & Stegun 26.7.3-4), so any confidence level and any df work without
  a lookup table; t_{0.975} is 12.706 for df=1, 4.303 for df=2, 2.776 for df=4, 2.262 for df=9.
* ``summarise``: mean, sample standard deviation (ddof=1) and the two-sided Student-t confidence
  interval mean ± t_{(1+c)/2, n-1} · std / sqrt(n) over seeds.
* ``mcnemar``: McNemar's test on the discordant counts of two classifiers scored on the same
  examples: exact two-sided binomial test when b + c < 25 (the chi-square approximation is poor
  for few discordant pairs), else chi-square with continuity correction (|b - c| - 1)^2 / (b + c)
  and its df=1 survival function erfc(sqrt(x / 2)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

EXACT_BELOW = 25  # discordant pairs under which McNemar uses the exact binomial test


def _t_central_probability(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` degrees of freedom (A&S 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    cos2 = math.cos(theta) ** 2
    if df % 2:
        term, total = 1.0, 0.0
        for j in range(1, (df - 1) // 2 + 1):
            total += term
            term *= cos2 * (2 * j) / (2 * j + 1)
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    term, total = 1.0, 0.0
    for j in range(1, df // 2 + 1):
        total += term
        term *= cos2 * (2 * j - 1) / (2 * j)
    return math.sin(theta) * total


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with integer ``df`` >= 1 (p in (0, 1))."""
    if not 0 < p < 1 or df < 1:
        raise ValueError(f"need 0 < p < 1 and df >= 1, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    target = 2 * p - 1
    low, high = 0.0, 1.0
    while _t_central_probability(high, df) < target:
        low, high = high, 2 * high
    while high - low > 1e-12 * high:
        middle = (low + high) / 2
        if _t_central_probability(middle, df) < target:
            low = middle
        else:
            high = middle
    return (low + high) / 2


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
    if discordant < EXACT_BELOW:
        # Under H0 each discordant pair goes either way with probability 1/2; exact integers keep
        # the tail free of rounding until the final division.
        tail = Fraction(sum(math.comb(discordant, k) for k in range(min(b, c) + 1)), 2**discordant)
        return McNemarResult(b, c, "exact binomial", None, float(min(Fraction(1), 2 * tail)))
    statistic = (abs(b - c) - 1) ** 2 / discordant
    p_value = math.erfc(math.sqrt(statistic / 2))
    return McNemarResult(b, c, "chi-square, continuity corrected", statistic, p_value)
