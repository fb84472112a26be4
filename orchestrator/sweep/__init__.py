"""Planning and driving a sweep: the spec (spec.py), how its trials group into stacks
(stack_groups.py), the checks and plan `validate` prints (plan.py), the time estimate
(estimate.py, its probe estimate_probe.py), the driver that runs Tune (driver.py) and the paper
protocol it applies (protocol.py), its state machine, signals, lease and trial ledger
(lifecycle.py), the terminal progress (progress.py), `--extend` and `--warm-start` (extend.py,
warm_start.py), a finished sweep replayed as a benchmark (replay.py) and the process defaults
every command sets first (environment.py)."""

__all__ = [
    "driver",
    "environment",
    "estimate",
    "estimate_probe",
    "extend",
    "lifecycle",
    "plan",
    "progress",
    "protocol",
    "replay",
    "spec",
    "stack_groups",
    "warm_start",
]
