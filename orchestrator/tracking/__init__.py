"""MLflow, seen from a sweep: the one writer (uploader.py, which applies a sweep's journal, and
upload_batches.py, its retries and request packing), the one reader (tracker.py, the ``Tracker``),
how a sweep looks in MLflow's UI (run_view.py) and `orchestrate ui`'s server (ui_server.py)."""

__all__ = ["run_view", "tracker", "ui_server", "upload_batches", "uploader"]
