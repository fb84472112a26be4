"""The CPUs a process may use: torch-free, so that a command can decide its OpenMP settings from
it before torch loads."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: taskset, cgroups cpusets, SLURM)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
