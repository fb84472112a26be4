"""results.mlflow_client: MLflow's client asks whether this process runs on Databricks once per
process instead of before every request, and still adds the Databricks headers when it does."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from mlflow.tracking.request_header import registry
from mlflow.tracking.request_header.databricks_request_header_provider import (
    DatabricksRequestHeaderProvider,
)
from testkit import REPO

from results.mlflow_client import DatabricksContextOnce, ask_databricks_once, mlflow_client


class _Counted:
    """A stand-in for DatabricksRequestHeaderProvider.in_context (``method``) giving ``answer``
    and counting its calls."""

    def __init__(self, answer: bool):
        self.calls = 0

        def method(provider) -> bool:
            self.calls += 1
            return answer

        self.method = method


def test_every_client_of_orchestrator_and_results_is_opened_by_mlflow_client():
    """ARCHITECTURE.md: no other module builds an MlflowClient or uses MLflow's fluent API."""
    opened = re.compile(r"MlflowClient\(|\bmlflow\.(set_tracking_uri|start_run|log_\w+|search_runs|get_run)\(")
    elsewhere = [f"{path.relative_to(REPO)}:{number}"
                 for package in ("orchestrator", "results") for path in sorted((REPO / package).rglob("*.py"))
                 if path.name != "mlflow_client.py"
                 for number, line in enumerate(path.read_text().splitlines(), 1) if opened.search(line)]
    assert elsewhere == []
    assert opened.search((REPO / "results" / "mlflow_client.py").read_text())  # the pattern finds one


def _providers() -> list:
    return list(registry._request_header_provider_registry)


def test_the_databricks_provider_is_replaced_where_it_stood_once():
    before = [type(p) for p in _providers()]
    ask_databricks_once()
    ask_databricks_once()
    after = [type(p) for p in _providers()]
    assert DatabricksRequestHeaderProvider not in after
    assert after.count(DatabricksContextOnce) == 1
    assert len(after) == len(before)
    index = after.index(DatabricksContextOnce)
    assert before[index] in (DatabricksRequestHeaderProvider, DatabricksContextOnce)


@pytest.mark.parametrize("on_databricks", [False, True])
def test_in_context_is_asked_once_and_headers_follow_the_answer(monkeypatch, on_databricks):
    counted = _Counted(on_databricks)
    monkeypatch.setattr(DatabricksRequestHeaderProvider, "in_context", counted.method)
    monkeypatch.setattr(DatabricksRequestHeaderProvider, "request_headers",
                        lambda self: {"x-databricks-probe": "yes"})
    provider = DatabricksContextOnce()
    answers = [provider.in_context() for _ in range(20)]
    assert answers == [on_databricks] * 20
    assert counted.calls == 1
    monkeypatch.setattr(registry._request_header_provider_registry, "_registry",
                        [provider, *(p for p in _providers() if not isinstance(p, DatabricksRequestHeaderProvider))])
    for _ in range(5):
        headers = registry.resolve_request_headers()
        assert ("x-databricks-probe" in headers) is on_databricks
    assert counted.calls == 1


class _Server(BaseHTTPRequestHandler):
    """Answers every MLflow REST call with an empty result, counting the requests."""

    requests = 0

    def do_GET(self):  # noqa: N802 (http.server's name)
        _Server.requests += 1
        body = json.dumps({"experiments": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET  # noqa: N815

    def log_message(self, *args):
        pass


def test_a_client_over_http_asks_databricks_once_for_many_requests(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = mlflow_client(f"http://127.0.0.1:{server.server_address[1]}")
        [provider] = [p for p in _providers() if isinstance(p, DatabricksContextOnce)]
        monkeypatch.setattr(provider, "_answer", None)  # as in a new process
        counted = _Counted(False)
        monkeypatch.setattr(DatabricksRequestHeaderProvider, "in_context", counted.method)
        before = _Server.requests
        for _ in range(10):
            assert client.search_experiments() == []
        assert _Server.requests - before >= 10  # the requests reached the server
        assert counted.calls == 1
    finally:
        server.shutdown()
        server.server_close()
