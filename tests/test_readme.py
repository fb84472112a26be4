"""README.md is a product page: short, no measurement diary, its first block the two commands a
new user runs (and the Makefile's targets do what it says), every docs page linked, its picture
there."""

from __future__ import annotations

import re

import pytest
import yaml
from testkit import REPO as REPO_ROOT

pytestmark = pytest.mark.unit

README = (REPO_ROOT / "README.md").read_text()


def makefile_target(name: str) -> str:
    makefile = (REPO_ROOT / "Makefile").read_text()
    return re.search(rf"^{name}:.*\n((?:\t.*\n)+)", makefile, re.M).group(0)


def test_the_readme_is_a_page_not_a_notebook():
    assert len(README.splitlines()) <= 300
    for diary in ("this machine", "load average", "2026-", "on the eighth"):
        assert diary not in README, diary
    assert not re.search(r"\bissue \d+", README, re.I)


def test_its_first_block_is_make_demo_and_make_test_and_the_targets_do_what_it_says():
    first = re.search(r"```bash\n(.*?)```", README, re.S).group(1).splitlines()
    assert [line.split("#")[0].strip() for line in first] == ["make demo", "make test"]
    assert "quickstart sweep" in first[0] and "test suite" in first[1]
    demo = makefile_target("demo")
    assert demo.startswith("demo: install") and "orchestrate sweep search_spaces/quickstart.yaml" in demo
    test = makefile_target("test")
    assert test.startswith("test: install") and "tests/run_suite.py" in test
    assert "make test" in (REPO_ROOT / ".ci" / "run").read_text()


def test_it_links_every_page_of_the_site_and_shows_its_picture():
    nav = yaml.safe_load((REPO_ROOT / "mkdocs.yml").read_text())["nav"]

    def pages(entries):
        for entry in entries:
            for value in entry.values():
                yield from pages(value) if isinstance(value, list) else [value]

    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", README)) | {"index.md"}
    linked |= {"changelog.md"} if "](CHANGELOG.md)" in README else set()
    assert set(pages(nav)) <= linked, set(pages(nav)) - linked
    for page in linked:
        assert (REPO_ROOT / "docs" / page).is_file(), page
    (picture,) = re.findall(r"!\[[^]]+\]\((docs/images/[\w-]+\.png)\)", README)
    assert (REPO_ROOT / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
