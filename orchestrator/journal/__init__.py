"""A sweep's records and its resume: the append-only journal of operations (operations.py), what
the driver appends to it (recorder.py: trial events and the parent run's log; parent_records.py:
the parent run opened or resumed, its description, selection and analysis; provenance.py: the
data and environment a reviewer checks) and `--resume` rebuilt from it when Tune's state is gone
(resume.py). Nothing here writes to MLflow: orchestrator.tracking.uploader applies the journal."""

__all__ = ["operations", "parent_records", "provenance", "recorder", "resume"]
