"""The OpenMP wait policy of each training process, chosen from the cores it owns (issue 24,
item 8; `orchestrate train` is covered in test_cli_ux.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from testkit import REPO
from testkit.cli import run_orchestrate
from testkit.specs import write_spec
from testkit.store import runs_of

from orchestrator.sweep import environment
from orchestrator.sweep.environment import WAIT_POLICY, trials_own_cores, wait_policy
from results import run_schema as rs


def test_trials_own_their_cores_when_ray_cannot_put_more_threads_on_a_node():
    assert trials_own_cores(1, None, None) and trials_own_cores(2.5, None, None)
    # Half a CPU each, one thread each: 4 trials on 2 CPUs share them, unless at most 2 run.
    assert not trials_own_cores(0.5, None, node_cpus=2)
    assert trials_own_cores(0.5, 2, node_cpus=2)
    assert not trials_own_cores(0.5, 3, node_cpus=2)
    assert not trials_own_cores(0.5, 2, node_cpus=None)  # a cluster's nodes: unknown here


def test_the_users_policy_always_wins(monkeypatch):
    monkeypatch.setitem(environment._users, WAIT_POLICY, None)
    assert (wait_policy(True), wait_policy(False)) == ("ACTIVE", "PASSIVE")
    monkeypatch.setitem(environment._users, WAIT_POLICY, "PASSIVE")
    assert (wait_policy(True), wait_policy(False)) == ("PASSIVE", "PASSIVE")


# A job started by init_ray(wait_policy=ACTIVE); each task loads torch with OMP_DISPLAY_ENV set,
# so libgomp prints the policy it read (to fd 2, caught in a file).
PROBE = """
import json, ray
from orchestrator.ray_adapter.ray_runtime import init_ray
init_ray(wait_policy="ACTIVE")

@ray.remote(num_cpus=1)
def policy_read_by_openmp():
    import os, sys, tempfile
    assert "torch" not in sys.modules
    os.environ["OMP_DISPLAY_ENV"] = "true"
    with tempfile.TemporaryFile() as caught:
        saved = os.dup(2)
        os.dup2(caught.fileno(), 2)
        try:
            import torch  # noqa: F401
        finally:
            os.dup2(saved, 2)
        caught.seek(0)
        text = caught.read().decode()
    return [line.split("=")[1].strip(" '") for line in text.splitlines() if "OMP_WAIT_POLICY" in line]

passive = {"env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}}
print(json.dumps([ray.get(policy_read_by_openmp.remote()),
                  ray.get(policy_read_by_openmp.options(runtime_env=passive).remote()),
                  ray.cluster_resources()["CPU"]]))
"""


@pytest.mark.ray
def test_a_trial_process_loads_torch_with_the_policy_the_driver_chose():
    env = {"PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "PATH": "/usr/bin:/bin"}
    # Under `taskset -c 0` the local Ray counts the one CPU this process may use, not the machine's.
    done = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", PROBE], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [["ACTIVE"], ["PASSIVE"], 1.0]


@pytest.mark.ray
@pytest.mark.parametrize(("cpu", "policy"), [(1, "ACTIVE"), (0.5, "PASSIVE")])
def test_a_sweeps_trials_record_the_policy_of_their_cores(tmp_path, cpu, policy):
    """The real `orchestrate sweep` on a local Ray with this process's CPUs: whole CPUs per
    trial spin, half CPUs (two 1-thread trials per CPU) wait passively."""
    spec = write_spec(tmp_path, {"training": {"epochs": 1}, "search": {
        "space": {"lr": {"grid": [0.01]}}, "resources": {"cpu": cpu}, "max_concurrent_trials": None}})
    done = run_orchestrate(["sweep", str(spec)], cwd=tmp_path, env={WAIT_POLICY: None})
    assert done.returncode == 0, done.stderr
    _, children = runs_of(tmp_path, "tiny")
    assert [c.data.tags[rs.TAG_OMP_WAIT_POLICY] for c in children] == [policy, policy]
    assert {c.data.tags[rs.TAG_DEVICE] for c in children} == {"cpu"}
