"""Adapts nli_models to Ray Tune (orchestrator.ray_adapter) and MLflow (orchestrator.tracking)."""

from orchestrator.environment import configure_environment

configure_environment()
