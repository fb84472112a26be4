"""A trial sees exactly the devices Ray gave it, and records what it trained on (issue 24, item 2).

The machine has no GPU: Ray's logical GPUs (ray.init(num_gpus=...)) stand in for them, and a
CUDA_VISIBLE_DEVICES the node's processes inherit stands in for a GPU node's devices."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from testkit import REPO

from orchestrator.sweep.spec import SweepSpec
from results import run_schema as rs

pytestmark = pytest.mark.ray

# Three tasks on a local Ray with 2 logical GPUs, on a "node" whose processes see GPUs 0 and 1:
# Ray's own behaviour for a 0-GPU task, then trial_device in a 0-GPU and in a 1-GPU task.
PROBE = """
import json, os, ray
os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
ray.init(address="local", num_cpus=1, num_gpus=2, include_dashboard=False, logging_level="ERROR")
from orchestrator.ray_adapter.ray_trial import trial_device

@ray.remote(num_gpus=0)
def left_by_ray():
    return os.environ.get("CUDA_VISIBLE_DEVICES")

@ray.remote
def trial():
    device = trial_device("auto")
    import torch
    return {"device": device, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "gpu_ids": ray.get_gpu_ids(), "cuda_devices": torch.cuda.device_count()}

print(json.dumps({
    "ray_zero_gpu": ray.get(left_by_ray.remote()),
    "zero_gpu": ray.get(trial.options(num_gpus=0).remote()),
    "one_gpu": ray.get(trial.options(num_gpus=1).remote()),
}))
"""


def test_a_trial_sees_only_the_gpus_ray_gave_it():
    env = {"PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # Ray 2.60 leaves a 0-GPU worker the node's devices: what trial_device corrects.
    assert seen["ray_zero_gpu"] == "0,1"
    assert seen["zero_gpu"] == {"device": "cpu", "visible": "", "gpu_ids": [], "cuda_devices": 0}
    one = seen["one_gpu"]
    assert one["device"] == "auto" and len(one["gpu_ids"]) == 1
    assert one["visible"] == str(one["gpu_ids"][0])  # set by Ray to the GPU it gave


def test_a_cuda_device_without_gpu_resources_is_refused():
    base = {"name": "s", "model": {"name": "decomposable"}, "data": {"corpus": "toy"}}
    with pytest.raises(ValueError, match=r"training.device 'cuda' needs search.resources.gpu > 0"):
        SweepSpec.model_validate({**base, "training": {"device": "cuda"}})
    spec = SweepSpec.model_validate(
        {**base, "training": {"device": "cuda"}, "search": {"resources": {"gpu": 0.5}}}
    )
    assert spec.search.resources.gpu == 0.5


def test_the_parent_counts_the_devices_its_trials_recorded():
    from types import SimpleNamespace

    from orchestrator.journal.parent_records import trial_devices

    def run(**tags):  # what the journal holds of a trial (operations.TrialProgress)
        return SimpleNamespace(tags=tags)

    trials = [run(**{rs.TAG_DEVICE: "cuda:0", rs.TAG_DEVICE_NAME: "NVIDIA A10G"})] * 3 + [
        run(**{rs.TAG_DEVICE: "cpu", rs.TAG_DEVICE_NAME: "AMD EPYC"}), run()]
    assert trial_devices(trials) == "cpu (AMD EPYC) x1; cuda:0 (NVIDIA A10G) x3"
    assert trial_devices([run()]) == "none recorded"
