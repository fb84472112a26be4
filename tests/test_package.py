"""`python -m build` makes an sdist and, from it, a wheel that holds the shipped specs (one
source: orchestrator/search_spaces/, which the checkout's search_spaces/ links to), the
`orchestrate` entry point and the declared Python range; the wheel's own code, outside the
checkout, lists and copies the specs and validates a copied one. (The full round trip, a fresh
venv per Python version running the quickstart sweep from the installed wheel, is `make
test-pythons`.)"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[1]
SPECS = sorted((REPO / "orchestrator" / "search_spaces").glob("*.yaml"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(REPO)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(list(dist.glob("*.tar.gz"))) == 1
    (built,) = dist.glob("*.whl")
    return built


def test_the_checkouts_search_spaces_is_the_packages_folder():
    assert (REPO / "search_spaces").resolve() == (REPO / "orchestrator" / "search_spaces").resolve()


def test_the_wheel_holds_the_specs_the_entry_point_and_the_python_range(wheel):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert wheel.name.startswith(f"nli_orchestrator-{project['version']}-py3-none-any")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for spec in SPECS:
            assert archive.read(f"orchestrator/search_spaces/{spec.name}") == spec.read_bytes(), spec.name
        info = f"nli_orchestrator-{project['version']}.dist-info"
        metadata = archive.read(f"{info}/METADATA").decode()
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert {"orchestrator/cli/model_catalog.json", "results/columns.yaml", "results/templates/report.html"} <= names
    assert not any(name.startswith(("tests/", "benchmarks/")) for name in names)
    (declared,) = [line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Python: ")]
    assert SpecifierSet(declared) == SpecifierSet(project["requires-python"])
    assert "orchestrate = orchestrator.cli:main" in entry_points


@pytest.mark.check
def test_the_wheels_code_copies_a_spec_and_validates_it_outside_the_checkout(wheel, tmp_path):
    target = tmp_path / "site-packages"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    folder = tmp_path / "anywhere"
    folder.mkdir()
    env = dict(os.environ, PYTHONPATH=str(target))

    def orchestrate(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", "import sys; from orchestrator.cli import main; main()", *args],
                              cwd=folder, env=env, capture_output=True, text=True, timeout=300)

    where = subprocess.run([sys.executable, "-c", "import orchestrator; print(orchestrator.__file__)"],
                           cwd=folder, env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(target)), where
    listed = orchestrate("specs")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[:-1]] == [spec.stem for spec in SPECS]
    copied = orchestrate("specs", "copy", "quickstart")
    assert copied.returncode == 0 and copied.stdout == "wrote quickstart.yaml\n", copied.stderr
    assert (folder / "quickstart.yaml").read_bytes() == (REPO / "search_spaces" / "quickstart.yaml").read_bytes()
    again = orchestrate("specs", "copy", "quickstart")
    assert again.returncode == 2 and "exists; pass --force" in again.stderr
    validated = orchestrate("validate", "quickstart.yaml")
    assert validated.returncode == 0, validated.stderr
    assert "8 trials" in validated.stdout
