"""Adapts nli_models to Ray Tune (orchestrator.ray_adapter) and MLflow (orchestrator.uploader writes, orchestrator.tracking reads)."""

from orchestrator.environment import configure_environment

configure_environment()
