"""The Python range pyproject.toml declares is the one `make test-pythons` installs and tests:
each minor version of `requires-python`, one fresh venv each (scripts/test_python_version.sh);
the suite itself runs on the interpreter CI installs, which must lie in the range. ruff's
target is the lowest of them, and the README names the range."""

from __future__ import annotations

import re
import sys
import tomllib

import pytest
from packaging.specifiers import SpecifierSet
from testkit import REPO as REPO_ROOT

pytestmark = pytest.mark.unit

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
DECLARED = SpecifierSet(PYPROJECT["project"]["requires-python"])


def declared_minors() -> list[str]:
    return [f"3.{minor}" for minor in range(8, 20) if f"3.{minor}.0" in DECLARED and f"3.{minor}.99" in DECLARED]


def test_the_declared_range_is_whole_minor_versions_from_3_11_to_3_13():
    assert declared_minors() == ["3.11", "3.12", "3.13"], DECLARED
    for edge in ("3.10.99", "3.14.0"):
        assert edge not in DECLARED, f"{DECLARED} allows {edge}, which `make test-pythons` never runs"


def test_the_suites_interpreter_is_in_the_range():
    assert "{}.{}.{}".format(*sys.version_info[:3]) in DECLARED


def test_make_test_pythons_runs_every_declared_version_and_the_quickstart_outside_the_checkout():
    makefile = (REPO_ROOT / "Makefile").read_text()
    versions = re.search(r"^PYTHON_VERSIONS \?= (.+)$", makefile, re.M).group(1).split()
    assert versions == declared_minors()
    target = re.search(r"^test-pythons:\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "scripts/test_python_version.sh $$version" in target and "|| exit 1" in target
    script = "\n".join(line for line in (REPO_ROOT / "scripts" / "test_python_version.sh").read_text().splitlines()
                       if not line.lstrip().startswith("#"))
    # a fresh venv; torch first; the project not editable; a shipped spec, swept from a folder
    # outside the checkout on a new store; the unit tests on that interpreter
    steps = ['rm -rf "$venv"', "-m venv", "install -q torch==2.13.0", 'install -q "$repo[dev,glove]"',
             'cd "$work"', "specs copy quickstart", "sweep quickstart.yaml", "results quickstart",
             'cd "$repo"', "-m pytest", "-m unit"]
    places = [script.index(step) for step in steps]
    assert places == sorted(places), steps
    assert "set -euo pipefail" in script and "-e " not in script.split("install -q")[-1].split("\n")[0]


def test_ruff_targets_the_lowest_and_the_readme_names_the_range():
    assert PYPROJECT["tool"]["ruff"]["target-version"] == "py311"
    assert "Python 3.11, 3.12 or 3.13" in (REPO_ROOT / "README.md").read_text()
