"""benchmarks/README.md is one page of current measurements, not a diary (the history is in
`git log -p benchmarks/README.md`): every benchmark script has its line, the docs site shows the
same file, and what cites it cites a heading that is there."""

from __future__ import annotations

import re

import pytest
from testkit import REPO as REPO_ROOT

pytestmark = pytest.mark.unit

PAGE = REPO_ROOT / "benchmarks" / "README.md"
TEXT = PAGE.read_text()
HEADINGS = [line.lstrip("#").strip() for line in TEXT.splitlines() if line.startswith("#")]
# A citation names a heading (or words of one) in quotes: benchmarks/README.md, "sweep_cpu".
CITATION = re.compile(r'benchmarks/README\.md,? "([^"]+)"')
NUMBERED = re.compile(r"benchmarks/README\.md,? (section|finding) \d+", re.I)


def test_the_page_is_current_measurements_not_a_diary():
    assert len(TEXT.splitlines()) <= 350
    for diary in ("this machine", "on the eighth", "the run before"):
        assert diary not in TEXT, diary
    assert not re.search(r"\bissues? \d+", TEXT, re.I)
    assert not any(re.match(r"\d+\.", heading) for heading in HEADINGS), "numbered sections"
    assert "git log -p benchmarks/README.md" in TEXT


def test_every_script_of_benchmarks_has_its_line():
    table = TEXT.split("## What each script measures", 1)[1].split("\n## ", 1)[0]
    for script in sorted((REPO_ROOT / "benchmarks").glob("*.py")):
        if script.name != "__init__.py":
            assert f"`{script.name}`" in table, script.name


def test_the_docs_site_shows_this_file():
    assert (REPO_ROOT / "docs" / "benchmarks.md").resolve() == PAGE.resolve()


def test_what_cites_the_page_cites_a_heading_that_is_there():
    everywhere = [REPO_ROOT / "README.md", *(REPO_ROOT / "docs").glob("*.md"),
                  *(REPO_ROOT / "tests").glob("*.py"), *(REPO_ROOT / "benchmarks").glob("*.py"),
                  *REPO_ROOT.glob("orchestrator/**/*.py"), *REPO_ROOT.glob("results/**/*.py"),
                  *REPO_ROOT.glob("nli_models/**/*.py")]
    numbered = [f"{path.name}: {match.group(0)}" for path in everywhere
                for match in NUMBERED.finditer(path.read_text())]
    assert not numbered, numbered
    for path in everywhere:
        for cited in CITATION.findall(path.read_text()):
            assert any(cited in heading for heading in HEADINGS), f"{path.name}: {cited!r}"
