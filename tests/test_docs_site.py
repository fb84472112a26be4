"""The documentation site builds with warnings as errors (a broken link fails it), its CLI
reference holds every command, and its pages render in headless Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

REPO = Path(__file__).resolve().parents[1]
MKDOCS = Path(sys.executable).parent / "mkdocs"


def build(project: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1",
               PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(site)], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    done = build(REPO, site)
    assert done.returncode == 0, done.stderr[-3000:]
    return site


def all_commands(group: click.Group, ctx: click.Context, prefix: str = "orchestrate"):
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        yield f"{prefix} {name}"
        if isinstance(command, click.Group):
            yield from all_commands(command, click.Context(command), f"{prefix} {name}")


@pytest.mark.check
def test_the_cli_reference_holds_every_command_and_its_options(site):
    from orchestrator.cli.orchestrate import main

    page = (site / "cli" / "index.html").read_text()
    for path in all_commands(main, click.Context(main)):
        assert f"<code>{path}</code>" in page, path
    assert "--warm-start EXPERIMENT" in page and "--tracking-uri" in page


def test_a_broken_link_fails_the_build(tmp_path):
    project = tmp_path / "project"
    shutil.copytree(REPO / "docs", project / "docs", symlinks=False)
    shutil.copy(REPO / "mkdocs.yml", project / "mkdocs.yml")
    shutil.copytree(REPO / "scripts", project / "scripts")
    with (project / "docs" / "gpus.md").open("a") as page:
        page.write("\nSee [the missing page](missing.md).\n")
    done = build(project, tmp_path / "site")
    assert done.returncode != 0
    assert "missing.md" in done.stderr


@pytest.mark.parametrize("page, heading", [("", "Quickstart"), ("sweeps/", "Commands at a glance"),
                                           ("cli/", "orchestrate sweep")])
def test_pages_render_in_chromium(site, page, heading, tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    url = (site / page / "index.html").as_uri()
    done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert heading in done.stdout and "nli-orchestrator" in done.stdout
    shot = tmp_path / "page.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900",
                    f"--screenshot={shot}", url], capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
