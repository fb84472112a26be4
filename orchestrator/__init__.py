"""Adapts nli_models to Ray Tune and MLflow, in sub-packages named by their role: `sweep` plans and
drives a sweep, `journal` records it and resumes it, `tracking` uploads the records to MLflow and
reads them back, `ray_adapter` is the only code that imports Ray, `cluster` runs sweeps on SLURM
and serves the tracking store, and `cli` is the `orchestrate` command (ARCHITECTURE.md).

Importing it changes no environment variable: the `orchestrate` command sets the process defaults
when it starts (orchestrator/sweep/environment.py)."""

__all__ = ["cli", "cluster", "journal", "ray_adapter", "sweep", "tracking"]
