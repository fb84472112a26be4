"""A SIGTERM that reaches the driver just after Ray started is the sweep's to handle: ray.init
puts its own handler on SIGTERM (sys.exit(15)), which once ended a SLURM job's sweep with exit
15 instead of 3 (interrupted, resumable) when the time-limit TERM came while the sweep opened."""
from __future__ import annotations

import pytest
from testkit.processes import run_probe

# The sweep's handler stands in as one that exits 3; the TERM comes right after init_ray.
PROBE = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(3))
from orchestrator.ray_adapter.ray_runtime import init_ray
init_ray()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)
sys.exit(0)
"""


# The TERM comes inside init_ray, just after ray.init put its handler on (the window that ended a
# SLURM job's driver with exit 15 while it joined the job's Ray head).
DURING = """
import os, signal, sys, time
import ray
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(3))
connect = ray.init
def connect_then_term(*args, **kwargs):
    connected = connect(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    return connected
ray.init = connect_then_term
from orchestrator.ray_adapter.ray_runtime import init_ray
init_ray()
time.sleep(30)
sys.exit(0)
"""


@pytest.mark.ray
@pytest.mark.parametrize("probe", [PROBE, DURING], ids=["after-init_ray", "inside-init_ray"])
def test_a_term_after_ray_started_reaches_the_sweeps_own_handler(probe):
    done = run_probe(probe)
    assert done.returncode == 3, (done.returncode, done.stderr[-2000:])
