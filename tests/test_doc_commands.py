"""Every `orchestrate` command that README.md and the documentation pages show in a fenced block
runs, as shown, and prints what is shown under it (docs/development.md, "The commands in these
pages are tested").

- A `console` block: each `$ orchestrate ...` line (a trailing backslash continues it) runs; the
  lines under it, up to the next `$ `, must appear in its output in that order (`...` stands for
  any lines; run ids, clock times, dates and seconds match any value). `$ echo $?` shows the exit
  code of the command before it; without it a command must exit 0.
- A `bash` block: each line that starts with `orchestrate` runs and must exit 0.
- A block with `<!-- illustrative: WHY -->` on the line before its fence is not run (a cluster,
  a download, a GPU). Any other block that holds an `orchestrate` command fails this test.

The pages run in the site's order (mkdocs.yml) in one folder with one store, as a reader would:
the replay page's examples run on the quickstart store the README made. The corpus cache
(NLI_DATA_DIR) holds the toy corpus in SNLI's official layout, so that the shrunk SNLI search
runs without a download."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from test_shipped_specs import write_corpora

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^[ ]*```(\w*)\n(.*?)^[ ]*```", re.S | re.M)  # a fence may be indented (in a list)
ILLUSTRATIVE = re.compile(r"<!-- illustrative: (.+?) -->\s*$")
ORCHESTRATE = re.compile(r"^(\$ )?orchestrate\b", re.M)
COMMAND_TIMEOUT_S = 900
# Training's numbers depend on the CPU's floating-point kernels (AVX2 and AVX-512 builds of the
# same kernels round differently, and a toy run can then select another epoch): the pages' outputs
# are those of torch's portable kernels, the same on every x86-64 CPU (README.md says so).
PORTABLE_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}
# `orchestrate ui` serves until stopped: it runs until its shown lines are out (at most this long)
SERVER_WAIT_S = 120


def documents() -> list[Path]:
    """README.md, then each page of the site's navigation (index.md is the README, the changelog
    and the generated CLI reference show no commands)."""
    def pages(nav):
        for entry in nav:
            for value in entry.values():
                yield from pages(value) if isinstance(value, list) else [value]

    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    return [REPO / "README.md", *(REPO / "docs" / page for page in pages(nav) if page != "index.md")]


@dataclass
class Command:
    line: str
    shown: list[str] = field(default_factory=list)  # expected output lines, `...` for any
    exit_code: int = 0


@dataclass
class Block:
    document: str
    lang: str
    body: str
    illustrative: str | None

    def commands(self) -> list[Command]:
        lines = _joined(self.body.splitlines())
        if self.lang == "bash":
            return [Command(line) for line in lines if line.startswith("orchestrate")]
        commands: list[Command] = []
        for line in lines:
            if line == "$ echo $?":
                commands[-1].shown.append("$ echo $?")
            elif line.startswith("$ "):
                commands.append(Command(line[2:]))
            elif commands:
                commands[-1].shown.append(line)
        for command in commands:
            if "$ echo $?" in command.shown:
                at = command.shown.index("$ echo $?")
                command.exit_code = int(command.shown[at + 1])
                command.shown = command.shown[:at]
        return commands


def _joined(lines: list[str]) -> list[str]:
    """Lines with their backslash continuations joined."""
    out: list[str] = []
    for line in lines:
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1].rstrip() + " " + line.strip()
        else:
            out.append(line)
    return out


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = ILLUSTRATIVE.search(before)
        found.append(Block(path.name, match.group(1), textwrap.dedent(match.group(2)),
                           marker.group(1) if marker else None))
    return found


def normalized(line: str) -> str:
    """A line with what differs from run to run (ids, experiment numbers, times, dates, seconds) replaced."""
    line = re.sub(r"\b[0-9a-f]{32}\b", "<ID>", line)
    line = re.sub(r"\bexperiment \d+\b", "experiment <N>", line)
    line = re.sub(r"\b\d{4}-\d\d-\d\d \d\d:\d\d\b", "<DATE>", line)
    line = re.sub(r"\b\d+:\d\d:\d\d\b", "<TIME>", line)
    line = re.sub(r"\b\d+(\.\d+)? ?(s|min)\b", "<SECONDS>", line)
    return " ".join(line.split())


def assert_shown(command: Command, output: str) -> None:
    """The shown lines appear in the output in order; `...` skips any lines."""
    actual = [normalized(line) for line in output.splitlines()]
    at = 0
    for shown in command.shown:
        if shown.strip() == "...":
            continue
        want = normalized(shown)
        while at < len(actual) and actual[at] != want:
            at += 1
        assert at < len(actual), f"`{command.line}` did not print, in this order:\n{shown}\n--- it printed:\n{output}"
        at += 1


def run_server(command: Command, folder: Path, env: dict) -> str:
    """A command that serves until stopped (`orchestrate ui`): its shown lines, then Ctrl-C (a
    server still up 30 s later is killed with its process group)."""
    log_path = folder / "server.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(["bash", "-c", command.line], cwd=folder, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    wanted = [normalized(line) for line in command.shown if line.strip() != "..."]
    deadline = time.monotonic() + SERVER_WAIT_S
    try:
        while time.monotonic() < deadline and process.poll() is None:
            printed = [normalized(line) for line in log_path.read_text().splitlines()]
            if printed and all(line in printed for line in wanted):
                break
            time.sleep(0.5)
        assert process.poll() is None, f"`{command.line}` ended (exit {process.returncode}):\n{log_path.read_text()}"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
    return log_path.read_text()


@pytest.fixture(scope="module")
def reader_folder(tmp_path_factory):
    """A reader's folder: the shipped specs under search_spaces/, and an environment whose corpus
    cache holds SNLI (the toy corpus in its layout) and whose other caches are the test's."""
    folder = tmp_path_factory.mktemp("reader")
    (folder / "search_spaces").symlink_to(REPO / "orchestrator" / "search_spaces")
    data = write_corpora(tmp_path_factory.mktemp("corpora") / "data")
    env = dict(os.environ, NLI_DATA_DIR=str(data), PYTHONUNBUFFERED="1", XDG_CACHE_HOME=str(folder / ".cache"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **PORTABLE_KERNELS)
    env.pop("MLFLOW_TRACKING_URI", None)
    assert shutil.which("orchestrate", path=env["PATH"]), "the orchestrate command is not installed"
    return folder, env


def test_every_block_with_a_command_is_console_bash_or_illustrative():
    for document in documents():
        for block in blocks(document):
            if block.illustrative is not None:
                assert block.illustrative.strip(), f"{document.name}: an illustrative marker says why"
            elif ORCHESTRATE.search(block.body):
                assert block.lang in ("console", "bash"), (
                    f"{document.name}: a ```{block.lang} block shows an orchestrate command; make it "
                    f"console or bash, or mark it <!-- illustrative: WHY -->:\n{block.body}")


@pytest.mark.parametrize("document", documents(), ids=lambda path: path.name)
def test_the_commands_a_page_shows_run_as_shown(document, reader_folder):
    folder, env = reader_folder
    for block in blocks(document):
        if block.illustrative is not None or block.lang not in ("console", "bash"):
            continue
        for command in block.commands():
            if not command.line.startswith("orchestrate"):
                continue
            if command.line.split()[:2] == ["orchestrate", "ui"]:
                assert_shown(command, run_server(command, folder, env))
                continue
            done = subprocess.run(["bash", "-c", command.line], cwd=folder, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=COMMAND_TIMEOUT_S)
            output = done.stdout
            assert done.returncode == command.exit_code, (
                f"{document.name}: `{command.line}` exited {done.returncode}, not {command.exit_code}:\n{output}")
            assert_shown(command, output)
