"""NLI models of four papers, their data pipeline and a plain PyTorch trainer (no Ray, no MLflow)."""

from nli_models.registry import (
    PaperConfig,
    build_model,
    check_config,
    count_parameters,
    model_names,
    model_variants,
    paper_configs,
    register_model,
)

__all__ = [
    "PaperConfig",
    "build_model",
    "check_config",
    "count_parameters",
    "model_names",
    "model_variants",
    "paper_configs",
    "register_model",
]
