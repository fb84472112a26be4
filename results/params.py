"""MLflow keeps every param as a string; these turn them back into values and compare them.
Trials record their params typed too (tag nli.params, results.run_reader.trial_params): parsing
is for runs written before that tag, and passes typed values through."""

from __future__ import annotations

import math

_LITERALS = {"true": True, "false": False, "none": None, "null": None}


def parse_param(text: object) -> object:
    """'100' -> 100, '1e-4' -> 0.0001, 'False' -> False, 'None' -> None; other text unchanged.
    A value that is not text is already typed (from the nli.params tag) and returned as it is."""
    if not isinstance(text, str):
        return text
    if text.strip().lower() in _LITERALS:
        return _LITERALS[text.strip().lower()]
    for cast in (int, float):
        try:
            value = cast(text)
        except ValueError:
            continue
        # 'nan'/'inf' would make the hyperparameter JSON invalid; they stay text.
        return value if math.isfinite(value) else text
    return text


def as_int(value: str | float | None) -> int | None:
    """An integer param ('42') or count metric (252000.0) as int; None if absent or not a number."""
    parsed = parse_param(value) if isinstance(value, str) else value
    if isinstance(parsed, bool) or not isinstance(parsed, int | float):
        return None
    return int(parsed)


def same_value(expected: object, logged: object) -> bool:
    """Whether a param logged as ``logged`` (any type, usually a string) equals ``expected``:
    booleans case-insensitively, numbers numerically (100 == '100.0'), the rest as strings."""
    return canonical(expected) == canonical(logged)


def canonical(value: object) -> str:
    """One text per value whether logged as a string or typed: same_value compares these."""
    parsed = parse_param(value) if isinstance(value, str) else value
    if isinstance(parsed, bool) or parsed is None:
        return str(parsed).lower()
    if isinstance(parsed, int | float):
        return repr(float(parsed))
    return str(parsed)


def short_value(value: object) -> str:
    """A hyperparameter value as a run name or table cell shows it: 0.0003 -> '3e-4',
    0.1 -> '0.1', 100 -> '100', 1e-05 -> '1e-5'."""
    parsed = parse_param(value) if isinstance(value, str) else value
    if isinstance(parsed, bool) or not isinstance(parsed, int | float):
        return str(parsed)
    if isinstance(parsed, int):
        return str(parsed)
    if parsed != 0 and not 1e-2 <= abs(parsed) < 1e4:
        mantissa, exponent = f"{parsed:.2e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    return f"{parsed:.4g}"
