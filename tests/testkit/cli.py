"""The `orchestrate` CLI as a test drives it, with one rule for the environment it gets: this
process's, less the settings that would point it at a store or cluster outside the test
(OUTSIDE), plus the test's `env` (a None value unsets).

- `orchestrate(*args)`: in this process (click's runner; a new process costs seconds of imports),
  for commands whose claim is not about the process itself.
- `run_orchestrate(args, cwd)` / `start_orchestrate(args, cwd, log)`: the real process of this
  worktree, for exit codes, signals, kills and start-up claims.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from testkit import BIN, REPO, SEAMS

ORCHESTRATE = str(BIN / "orchestrate")
OUTSIDE = ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "OMP_WAIT_POLICY")


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    output: str  # stdout and stderr as the user's terminal shows them, interleaved


def orchestrate(*args: str, env: dict | None = None, cwd: Path | None = None) -> Result:
    """`orchestrate ARGS` in this process (in `cwd` when given, so that what it writes by default
    lands there); an exception other than the CLI's exit is raised."""
    from click.testing import CliRunner

    from orchestrator.cli.orchestrate import main

    runner = CliRunner(env={**dict.fromkeys(OUTSIDE), **(env or {})})
    before = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = runner.invoke(main, [str(a) for a in args])
    finally:
        os.chdir(before)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Result(result.exit_code, result.stdout, result.stderr, result.output)


def process_env(env: dict | None = None) -> dict[str, str]:
    """The environment of a real `orchestrate`: this worktree's code and the test seams
    (PYTHONPATH), nothing of OUTSIDE, then `env`."""
    environment = {k: v for k, v in os.environ.items() if k not in OUTSIDE}
    environment["PYTHONPATH"] = f"{REPO}{os.pathsep}{SEAMS}"
    environment.update(env or {})
    return {k: v for k, v in environment.items() if v is not None}


def run_orchestrate(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 600,
                    prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`PREFIX orchestrate ARGS` as a real process in `cwd`; its output as text."""
    return subprocess.run([*prefix, ORCHESTRATE, *map(str, args)], cwd=cwd, env=process_env(env),
                          capture_output=True, text=True, timeout=timeout)


def start_orchestrate(args: list[str], cwd: Path, log: Path, env: dict | None = None) -> subprocess.Popen:
    """`orchestrate ARGS` in its own session, so the test can kill it and every process it
    started (the local Ray instance included) by process group. Output goes to `log` (a pipe
    nobody reads would block the driver once full)."""
    with log.open("w") as handle:
        return subprocess.Popen(
            [ORCHESTRATE, *map(str, args)], cwd=cwd, env=process_env(env),
            stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
        )
