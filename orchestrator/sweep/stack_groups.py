"""How a sweep's trials group into stacks (search.stack): those that share every flat
hyperparameter but the ones members may differ in (SweepSpec.stacked_fields). The Ray adapter
groups a grid's Tune configs and a sampler's proposals by it (ray_adapter/stacks.py), and
`validate --estimate` counts the stacks a sweep runs (estimate_probe.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")  # a trial as group_into_stacks is given it


def stack_key(params: dict[str, Any], fields: tuple[str, ...]) -> str:
    """What a trial must share with the other members of its stack: its flat hyperparameters but
    `fields` (SweepSpec.stacked_fields), as text.

    Args:
        params: the trial's flat hyperparameters.
        fields: the hyperparameters members may differ in.
    """
    return json.dumps({name: value for name, value in params.items() if name not in fields},
                      sort_keys=True, default=str)


def group_into_stacks(trials: list[T], params_of: Callable[[T], dict[str, Any]], size: int,
                      fields: tuple[str, ...]) -> list[list[T]]:
    """Trials as stacks of at most `size`: those whose stack_key agree share stacks, taken in the
    given order.

    Args:
        trials: the trials, in the order they run.
        params_of: a trial's flat hyperparameters.
        size: the most members of a stack.
        fields: the flat hyperparameters members may differ in (SweepSpec.stacked_fields).
    """
    groups: dict[str, list[T]] = {}
    for trial in trials:
        groups.setdefault(stack_key(params_of(trial), fields), []).append(trial)
    return [members[i:i + size] for members in groups.values() for i in range(0, len(members), size)]
