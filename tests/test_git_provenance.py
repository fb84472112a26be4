"""nli.git_dirty tells a reviewer whether the code that ran is the commit recorded: a tracked
change or a foreign untracked file makes a checkout dirty; the product's own store, lock and
outputs beside the code (what `make demo` leaves in a fresh clone) do not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from orchestrator.journal.provenance import git_state

REPO = Path(__file__).resolve().parents[1]
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=folder, env=GIT_ENV, check=True, capture_output=True,
                          text=True).stdout.strip()


def _product_outputs(folder: Path) -> None:
    """What a quickstart sweep and its results leave in the folder they ran in."""
    for name in ("mlruns.db", "mlruns.db.lock", "mlartifacts/1/a/artifacts/spec.yaml",
                 "ray_results/quickstart-1/trial/result.json", "results/tables/quickstart.parquet",
                 "ray_results/tracking-journal-abc.jsonl"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("x")


def test_a_tiny_repo_is_dirty_only_for_changes_that_are_not_the_products(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("print(1)\n")
    _git(tmp_path, "add", "code.py")
    _git(tmp_path, "commit", "-qm", "one")
    head = _git(tmp_path, "rev-parse", "HEAD")
    _product_outputs(tmp_path)
    _product_outputs(tmp_path / "sub")  # a command run from a subfolder writes there
    assert git_state(tmp_path) == (head, False)
    (tmp_path / "notes.txt").write_text("an untracked file of the researcher's")
    assert git_state(tmp_path) == (head, True)
    (tmp_path / "notes.txt").unlink()
    (tmp_path / "code.py").write_text("print(2)\n")
    assert git_state(tmp_path) == (head, True)


def test_outside_a_checkout_the_state_is_unknown(tmp_path):
    assert git_state(tmp_path) == ("unknown", None)


def test_a_fresh_clone_with_a_sweeps_outputs_records_a_clean_tree(tmp_path):
    """The clone's own code decides, from the clone's folder, as a sweep run there does."""
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(REPO), str(clone))
    _product_outputs(clone)
    probe = "from pathlib import Path; import orchestrator.journal.provenance as p; " \
            "print(p.git_state(Path(p.__file__).parent))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=clone, env={**os.environ, "PYTHONPATH": str(clone)},
                         check=True, capture_output=True, text=True).stdout.strip()
    assert out == repr((_git(clone, "rev-parse", "HEAD"), False))
    # a file of the researcher's makes the same clone dirty
    (clone / "orchestrator" / "scratch.py").write_text("")
    out = subprocess.run([sys.executable, "-c", probe], cwd=clone, env={**os.environ, "PYTHONPATH": str(clone)},
                         check=True, capture_output=True, text=True).stdout.strip()
    assert out.endswith("True)")
