"""The local Ray instance a sweep starts: no idle worker started ahead, and a stop at once and
complete.

Ray prestarts one worker per CPU when a driver connects; a sweep's trials never used them (each
trial's actor starts a worker with the sweep's runtime environment), and the two cost 1.0-1.2
CPU-s to start, at every sweep (benchmarks/README.md, "sweep_cpu"). The instance's processes start with SIGTERM blocked (so that
a TERM to the whole process group reaches the driver alone), so Ray's own stop, SIGTERM then a
second's wait per process then SIGKILL, spent 5 s at the end of every sweep and every Ctrl-C
waiting for the SIGKILL."""
from __future__ import annotations

import json

import pytest
from testkit.processes import run_probe

PROBE = """
import json, os, time
import ray
from orchestrator.ray_adapter.ray_runtime import init_ray, shutdown_ray
from orchestrator.ray_adapter.reaper import descendants, same_process
init_ray()
ray.get(ray.remote(lambda: 1).remote())  # a worker process too
started = descendants(os.getpid())
began = time.monotonic()
shutdown_ray()
seconds = time.monotonic() - began
deadline = time.monotonic() + 10
while any(same_process(p, s) for p, s in started.items()) and time.monotonic() < deadline:
    time.sleep(0.1)
print(json.dumps({"seconds": seconds, "started": len(started),
                  "alive": [p for p, s in started.items() if same_process(p, s)]}))
"""


@pytest.mark.ray
@pytest.mark.serial  # a measured time: alone on the machine (0.43-0.55 s there; 1.01 s once in CI beside 2 workers)
def test_the_local_instance_stops_within_a_second_leaving_no_process():
    done = run_probe(PROBE)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["started"] >= 5  # gcs_server, raylet, monitor, log monitor, dashboard, worker
    assert measured["alive"] == []
    assert measured["seconds"] < 1.0, measured  # 5 s before: 1 s for each of 5 processes


IDLE_PROBE = """
import json, os, time
from orchestrator.ray_adapter.ray_runtime import init_ray, shutdown_ray
from orchestrator.ray_adapter.reaper import descendants
init_ray()
time.sleep(3)  # Ray starts prestarted workers as the driver registers
commands = []
for pid in descendants(os.getpid()):
    try:
        commands.append(open(f"/proc/{pid}/cmdline").read().replace(chr(0), " "))
    except OSError:
        pass
shutdown_ray()
print(json.dumps(commands))
"""


@pytest.mark.ray
def test_the_local_instance_starts_no_worker_before_a_trial_asks_for_one():
    done = run_probe(IDLE_PROBE)
    assert done.returncode == 0, done.stderr[-2000:]
    commands = json.loads(done.stdout.strip().splitlines()[-1])
    assert any("raylet" in c for c in commands), commands  # the instance itself was seen
    workers = [c for c in commands if c.startswith("ray::IDLE")  # started, or still starting:
               or "default_worker.py" in " ".join(c.split(" ")[:3])]  # (the raylet names it later)
    assert workers == []  # 2 before (one per CPU), idle to the end of every sweep


@pytest.mark.unit
def test_a_term_blocked_in_a_process_shows_as_pending_until_it_is_unblocked():
    """What the stop watches for (reaper.signal_pending): Ray's TERM to one of its processes,
    which holds it blocked."""
    import signal
    import subprocess
    import sys
    import time

    from orchestrator.ray_adapter.reaper import signal_pending

    child = subprocess.Popen([sys.executable, "-c", (
        "import signal, sys, time\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
        "print('blocked', flush=True)\n"
        "time.sleep(30)")], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "blocked"
        assert not signal_pending(child.pid, signal.SIGTERM)
        child.terminate()
        time.sleep(0.2)
        assert child.poll() is None and signal_pending(child.pid, signal.SIGTERM)
        assert not signal_pending(child.pid, signal.SIGINT)
    finally:
        child.kill()
        child.wait()
    assert not signal_pending(child.pid, signal.SIGTERM)  # gone: nothing pending
