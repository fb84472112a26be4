"""The MLflow client every reader and writer of a store opens: ``mlflow_client(uri)``.

Before every REST request MLflow's client asks each request-header provider whether it applies,
and its Databricks provider answers by trying to import pyspark, dbruntime and Databricks' REPL
modules, failed imports that scan sys.path each time: 38% of a sweep's uploader thread's CPU in a
profile of 904 requests (benchmarks/README.md, "asking Databricks once"). Whether this
process runs on Databricks does not change while it runs, so here it is asked once per process;
the headers a provider in context adds are asked for on every request, as before.
"""

from __future__ import annotations

from mlflow import MlflowClient
from mlflow.tracking.request_header import registry
from mlflow.tracking.request_header.databricks_request_header_provider import (
    DatabricksRequestHeaderProvider,
)

from results.tracking_uri import client_uri


class DatabricksContextOnce(DatabricksRequestHeaderProvider):
    """MLflow's Databricks provider, its ``in_context`` answered once per process."""

    _answer: bool | None = None

    def in_context(self) -> bool:
        if self._answer is None:  # two threads asking at once both ask MLflow: the same answer
            self._answer = super().in_context()
        return self._answer


def ask_databricks_once() -> None:
    """Puts DatabricksContextOnce in place of MLflow's Databricks provider, where it stands in
    the providers' order (each header a provider adds follows those of the ones before)."""
    providers = registry._request_header_provider_registry._registry
    for index, provider in enumerate(providers):
        if type(provider) is DatabricksRequestHeaderProvider:
            providers[index] = DatabricksContextOnce()


def mlflow_client(tracking_uri: str) -> MlflowClient:
    """MlflowClient on ``client_uri(tracking_uri)`` (credentials out of the URI), Databricks
    asked once."""
    ask_databricks_once()
    return MlflowClient(tracking_uri=client_uri(tracking_uri))
