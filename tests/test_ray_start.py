"""Issue 44 item 3 through the real `orchestrate sweep` process: Ray that cannot start is one
`error:` line naming the cause and the fix, exit 1, and nothing written (no store, no parent run,
no Tune results); a start that takes longer than --ray-start-timeout ends with that error, with
the Ray processes it started gone; a spec this machine cannot hold is refused before the store
exists (item 8)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from testkit.cli import run_orchestrate
from testkit.specs import write_spec


def _short_tmpdir() -> Path:
    """A RAY_TMPDIR short enough for Ray's socket paths, private to the test."""
    return Path(tempfile.mkdtemp(prefix="nr", dir="/tmp"))


def _ray_processes_of(tmpdir: Path) -> list[int]:
    """Live processes whose command line names `tmpdir` (Ray's GCS, raylet, agents, workers)."""
    from orchestrator.cluster.slurm_node import job_processes

    return job_processes(str(tmpdir))


def _nothing_written(folder: Path) -> None:
    assert not (folder / "mlruns.db").exists()
    assert not (folder / "ray_results").exists()


def _one_error_line(result, *parts: str) -> None:
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for part in parts:
        assert part in lines[0], result.stderr


def test_socket_paths_too_long_for_ray_are_one_error_naming_ray_tmpdir(tmp_path):
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    spec = write_spec(tmp_path, {"name": "deep-tmp"}, new_store=True)
    result = run_orchestrate(["sweep", str(spec)], cwd=tmp_path, timeout=120,
                             env={"RAY_TMPDIR": str(deep), "NLI_DATA_DIR": str(tmp_path / "data")})
    _one_error_line(result, "Ray cannot start", "more than a Unix socket path may hold (107)",
                    "set RAY_TMPDIR to a short folder")
    _nothing_written(tmp_path)


def test_a_start_longer_than_the_timeout_ends_with_an_error_and_leaves_no_ray(tmp_path):
    """A start that does not finish in time, as under load (Ray's own 30 s wait ran out) or with
    a process that died while starting: here a timeout shorter than any start."""
    ray_tmp = _short_tmpdir()
    try:
        spec = write_spec(tmp_path, {"name": "slow-start"}, new_store=True)
        result = run_orchestrate(["sweep", str(spec), "--ray-start-timeout", "0.05"], cwd=tmp_path,
                                 timeout=120, env={"RAY_TMPDIR": str(ray_tmp),
                                                   "NLI_DATA_DIR": str(tmp_path / "data")})
        _one_error_line(result, "Ray did not start within 0.05 s", "--ray-start-timeout",
                        "NLI_RAY_START_TIMEOUT_S", "raise the timeout")
        _nothing_written(tmp_path)
        from testkit.processes import wait_for

        wait_for(lambda: not _ray_processes_of(ray_tmp), 30, "the failed start's Ray processes to end")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_the_start_timeout_is_a_finite_positive_number(tmp_path, value):
    spec = write_spec(tmp_path, {"name": "bad-timeout"}, new_store=True)
    for args, env in ((["--ray-start-timeout", value], {}), ([], {"NLI_RAY_START_TIMEOUT_S": value})):
        result = run_orchestrate(["sweep", str(spec), *args], cwd=tmp_path, env=env, timeout=60)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
        assert "a finite number of seconds > 0" in result.stderr
        _nothing_written(tmp_path)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-5"])
def test_wait_for_resources_is_a_finite_number_of_seconds(tmp_path, value):
    spec = write_spec(tmp_path, {"name": "bad-wait"}, new_store=True)
    result = run_orchestrate(["sweep", str(spec), "--wait-for-resources", value], cwd=tmp_path,
                             timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "--wait-for-resources" in result.stderr
    assert "a finite number of seconds >= 0" in result.stderr
    _nothing_written(tmp_path)


def test_a_spec_this_machine_cannot_hold_is_refused_before_the_store_exists(tmp_path):
    spec = write_spec(tmp_path, {"name": "too-big", "search": {"resources": {"cpu": 4096}}},
                      new_store=True)
    result = run_orchestrate(["sweep", str(spec)], cwd=tmp_path, timeout=120,
                             env={"NLI_DATA_DIR": str(tmp_path / "data")})
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "a trial asks for 4096 CPU" in result.stderr
    _nothing_written(tmp_path)


def test_the_raylets_registration_is_awaited_to_the_deadline_not_rays_30_s(monkeypatch):
    """Ray gives its raylet a fixed 30 s to register (ray/_private/node.py polls
    services.get_node): under load that ran out. Within the sweep's start the lookup is retried
    until the deadline, then fails as Ray's own would."""
    from ray._private import services

    from orchestrator.ray_adapter import ray_runtime

    now = [0.0]
    monkeypatch.setattr(ray_runtime.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(ray_runtime.time, "sleep", lambda seconds: now.__setitem__(0, now[0] + seconds))
    registers_at = 45.0  # later than Ray's 30 s

    def get_node(gcs_address, node_id):
        if now[0] < registers_at:
            raise RuntimeError("node info not available yet")
        return {"node_id": node_id}

    monkeypatch.setattr(services, "get_node", get_node)
    with ray_runtime._start_deadline(60):
        assert services.get_node("gcs", "n1") == {"node_id": "n1"}
        assert now[0] >= registers_at
    assert services.get_node is get_node  # put back
    now[0] = 0.0
    with ray_runtime._start_deadline(20), pytest.raises(RuntimeError, match="not available"):
        services.get_node("gcs", "n1")
    assert 20 <= now[0] < 21


def test_a_start_stuck_where_python_cannot_raise_still_ends_the_process():
    """A start stuck in Ray's C++ core never returns to the interpreter, so the deadline's
    SIGALRM cannot raise there (blocked here, to the same effect): the process still ends with
    the error line, exit 1, a grace after the deadline."""
    from testkit.processes import run_probe

    stuck = run_probe(
        "import signal, time\n"
        "from orchestrator.ray_adapter import ray_runtime\n"
        "ray_runtime._HUNG_EXIT_GRACE_S = 0.5\n"
        "with ray_runtime._start_deadline(0.2):\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n"
        "    time.sleep(60)\n",
        timeout=120,
    )
    assert stuck.returncode == 1, stuck.stderr
    assert stuck.stderr.startswith("error: Ray did not start within 0.2 s"), stuck.stderr
    assert stuck.stderr.count("\n") == 1, stuck.stderr


def test_a_deadline_whose_alarm_was_swallowed_still_fails_the_start():
    """Python swallows what a signal handler raises in some places (an at-fork hook: "Exception
    ignored in ... _releaseLock", seen in CI): the start then returned after its deadline and the
    sweep went on. Leaving the block after the deadline passed fails the start anyway."""
    import time

    from orchestrator.ray_adapter import ray_runtime

    with pytest.raises(ray_runtime._StartDeadline):
        with ray_runtime._start_deadline(0.05):
            try:
                time.sleep(5)
            except ray_runtime._StartDeadline:
                pass  # what an "Exception ignored in" does
    with ray_runtime._start_deadline(5):
        pass  # a start within its deadline: nothing raised


@pytest.mark.unit
@pytest.mark.parametrize("env", [{}, {"TMPDIR": "/var/tmp/x"}, {"RAY_TMPDIR": "/scratch/r", "TMPDIR": "/var/tmp/x"}])
def test_the_logs_a_failed_start_names_are_in_the_folder_ray_uses(monkeypatch, env):
    """The error line names Ray's log folder without asking Ray's private helpers: the same rule
    (RAY_TMPDIR, else TMPDIR, else /tmp) gives the folder Ray's own default does."""
    from ray._common.utils import get_default_ray_temp_dir

    from orchestrator.ray_adapter import ray_runtime

    for name in ("RAY_TMPDIR", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert ray_runtime._ray_logs() == f"{get_default_ray_temp_dir()}/session_latest/logs"



def test_a_deadline_alarm_python_cannot_raise_is_silent_and_fires_again(capfd):
    """Where the alarm lands in code Python cannot raise from (an at-fork hook in CI; a __del__
    here), Python would print "Exception ignored in ..." and its traceback: the error line would
    come after 8 lines of it. The alarm is silenced there and fires again where it can raise."""
    import time

    from orchestrator.ray_adapter import ray_runtime

    class SlowToCollect:
        def __del__(self):
            time.sleep(5)  # the deadline passes in here

    started = time.monotonic()
    with pytest.raises(ray_runtime._StartDeadline):
        with ray_runtime._start_deadline(0.05):
            SlowToCollect()  # collected at once: its __del__ runs now
            time.sleep(5)
    assert time.monotonic() - started < 2
    assert "Exception ignored" not in capfd.readouterr().err
