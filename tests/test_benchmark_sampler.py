"""What benchmarks.sweeps.CpuSampler counts each process of a sweep as, from its command line: the
raylet's own command line names default_worker.py (the command it starts workers with), and was
once counted as an idle worker; Ray's agents rename themselves ray::..., and were once counted as
trial workers when first seen renamed."""
from __future__ import annotations

from benchmarks.sweeps import _categorize

RAYLET = ("/v/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/s "
          "--python_worker_command=/v/bin/python /v/ray/_private/workers/setup_worker.py "
          "/v/ray/_private/workers/default_worker.py --node-ip-address=127.0.0.1 --head")


def test_each_process_of_a_local_ray_instance_gets_its_kind():
    assert _categorize(RAYLET) == "ray raylet"
    assert _categorize("/v/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp/l") == "ray gcs_server"
    starting = "/v/bin/python /v/ray/_private/workers/setup_worker.py /v/ray/_private/workers/default_worker.py"
    assert _categorize(starting) == _categorize("ray::IDLE ") == "ray workers (starting or idle)"
    assert _categorize("ray::ImplicitFunc.train ") == "trial workers"
    assert _categorize("ray::DashboardAgent ") == "ray dashboard agent"
    assert _categorize("ray::RuntimeEnvAgent ") == "ray runtime_env agent"
    assert _categorize("/v/bin/python /v/ray/dashboard/dashboard.py --host=127.0.0.1") == "ray dashboard"
    assert _categorize("/v/bin/python -m orchestrator.ray_adapter.reaper 42") == "other children"
