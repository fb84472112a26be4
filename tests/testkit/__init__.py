"""Test support, one module per job; importing any of them loads no heavy library (torch, MLflow,
Ray, pandas load inside the functions that need them), so collecting the suite stays fast.

- cli: `orchestrate` in this process (`orchestrate`) or as a real process (`run_orchestrate`,
  `start_orchestrate`), with one rule for the environment either gets.
- specs: the one sweep-spec writer (`write_spec`, on the toy BASE_SPEC or search_spaces/quickstart.yaml).
- toy: small model/data/training configs on the generated toy corpus.
- batches: the one model-input batch builder.
- store: a sweep's runs as MLflow holds them, and conditions on them to wait for.
- processes: process groups, waits, kills.
- ports: the ports the suite's own servers take, a band per test process.
- ray_nodes, postgres, tracking_server, slurm, browser: the real components some tests drive.
- SEAMS: the folder of the test-only delays and fault injection (tests/seams/sitecustomize.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Test-only seams (tests/seams/sitecustomize.py): on PYTHONPATH in every process a test starts.
SEAMS = REPO / "tests" / "seams"
BIN = Path(sys.executable).parent
