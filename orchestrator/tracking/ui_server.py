"""`orchestrate ui`: MLflow's own server (its ASGI app, as `mlflow ui` runs it) on 127.0.0.1, with
two pages in front for a researcher who starts from the home page:

- `/`, MLflow's home page, sets the browser's workflow type to machine learning first. MLflow
  3.17.2's UI opens an experiment on its runs table or on its GenAI pages (traces, judges) by
  ``?workflowType=``, else the localStorage key ``mlflow.workflowType_v1``, else GenAI; every
  experiment, run and link the home page leads to then stays on the runs table. From there a
  sweep's sorted trials are its experiment, then "Views", then the sweep's view (3 clicks).
- `/sweeps` lists every sweep's trials view (table and parallel-coordinates chart): 1 click.

Links are relative (`./#/experiments/...`), so they hold on any port or through an ssh tunnel.
"""

from __future__ import annotations

import html
import json
import logging
import os
import warnings

from results import run_schema as rs

SWEEPS_PAGE = "/sweeps"
# Loggers that print INFO lines on every start and request; `orchestrate ui -v` shows them.
THIRD_PARTY_LOGGERS = ("mlflow", "alembic", "uvicorn", "uvicorn.error", "uvicorn.access", "huey")


def _set_workflow_script() -> str:
    key, value = json.dumps(rs.UI_WORKFLOW_STORAGE_KEY), json.dumps(json.dumps("machine_learning"))
    return f"<script>try{{localStorage.setItem({key},{value})}}catch(e){{}}</script>"


def home_page(index_html: str) -> str:
    """MLflow's index.html with the workflow type set before its bundle runs."""
    return index_html.replace("<head>", "<head>" + _set_workflow_script(), 1)


def sweeps_page(views: dict[str, str]) -> str:
    """The sweeps of the store (experiment name -> id), each with its trials table and chart."""
    from orchestrator.tracking.run_view import runs_view_path

    rows = "".join(
        f'<li><b>{html.escape(name)}</b>: <a href="./{html.escape(runs_view_path(eid))}">'
        f"{html.escape(rs.RUNS_VIEW_NAME)}</a> · "
        f'<a href="./{html.escape(runs_view_path(eid, charts=True))}">'
        "hyperparameters against dev accuracy (chart)</a></li>"
        for name, eid in views.items()
    )
    body = f"<ul>{rows}</ul>" if rows else "<p>No sweeps in this store yet.</p>"
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Sweeps</title>"
        + _set_workflow_script()
        + "<style>body{font-family:sans-serif;margin:2em}li{margin:.5em 0}</style></head>"
        f"<body><h1>Sweeps</h1>{body}<p><a href='./'>MLflow home</a></p></body></html>"
    )


def _app(tracking_uri: str):
    """MLflow's FastAPI app with `/` and `/sweeps` served first."""
    from mlflow.server import app as flask_app
    from mlflow.server.fastapi_app import app
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    from orchestrator.tracking.tracker import sweep_views

    with open(os.path.join(flask_app.static_folder, "index.html"), encoding="utf-8") as handle:
        home = home_page(handle.read())

    async def serve_home(_request):
        return HTMLResponse(home)

    async def serve_sweeps(_request):
        return HTMLResponse(sweeps_page(await run_in_threadpool(sweep_views, tracking_uri)))

    app.router.routes[0:0] = [Route("/", serve_home), Route(SWEEPS_PAGE, serve_sweeps)]
    return app


def serve(tracking_uri: str, port: int, verbose: bool) -> None:
    """Run the UI on 127.0.0.1:PORT until interrupted (what `mlflow ui` sets up: the store,
    artifacts served from ./mlartifacts for runs that log through the server, one worker,
    no job executor)."""
    from mlflow.server import constants

    os.environ.update({
        constants.BACKEND_STORE_URI_ENV_VAR: tracking_uri,
        constants.REGISTRY_STORE_URI_ENV_VAR: tracking_uri,
        constants.ARTIFACT_ROOT_ENV_VAR: "mlflow-artifacts:/",
        constants.SERVE_ARTIFACTS_ENV_VAR: "true",
        constants.ARTIFACTS_DESTINATION_ENV_VAR: os.path.abspath("mlartifacts"),
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    })
    level = logging.INFO if verbose else logging.WARNING
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(level)
    if not verbose:  # starlette's deprecation of the WSGI bridge MLflow uses: not the user's concern
        warnings.filterwarnings("ignore", message=r"starlette\.middleware\.wsgi is deprecated")
    import uvicorn
    from mlflow.server.handlers import initialize_backend_stores

    initialize_backend_stores(tracking_uri, tracking_uri, "mlflow-artifacts:/")
    uvicorn.run(_app(tracking_uri), host="127.0.0.1", port=port, workers=1,
                log_level="info" if verbose else "warning", access_log=verbose)
