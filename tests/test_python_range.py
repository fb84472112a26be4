"""The Python range pyproject.toml declares is the one CI tests: exactly the minor version of the
interpreter running this suite (CI installs Debian 12's python3.11, the only one it can install;
the suite's `--help` and import checks, tests/test_cli_ux.py, run on it). A release that needs
another Python must widen both together."""

from __future__ import annotations

import sys
import tomllib

from packaging.specifiers import SpecifierSet
from sweep_helpers import REPO_ROOT


def test_requires_python_is_exactly_the_tested_minor():
    declared = SpecifierSet(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    major, minor = sys.version_info[:2]
    assert f"{major}.{minor}.0" in declared and f"{major}.{minor}.99" in declared, declared
    assert f"{major}.{minor - 1}.99" not in declared, f"{declared} allows {major}.{minor - 1}, which CI never runs"
    assert f"{major}.{minor + 1}.0" not in declared, f"{declared} allows {major}.{minor + 1}, which CI never runs"


def test_readme_and_ruff_name_the_same_python():
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    major, minor = sys.version_info[:2]
    assert pyproject["tool"]["ruff"]["target-version"] == f"py{major}{minor}"
    assert f"Python {major}.{minor} only" in (REPO_ROOT / "README.md").read_text()
