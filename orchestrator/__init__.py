"""Adapts nli_models to Ray Tune (orchestrator.ray_adapter) and MLflow (orchestrator.uploader writes,
orchestrator.tracking reads).

Importing it changes no environment variable: the `orchestrate` command sets the process defaults
when it starts (orchestrator/environment.py)."""
