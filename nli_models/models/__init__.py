"""Importing this package registers every model (each module's @register_model runs on import)."""

from nli_models.models import abcnn, cam, decomposable, rocktaschel  # noqa: F401
