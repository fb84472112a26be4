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
from orchestrator.ray_adapter import init_ray
init_ray()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)
sys.exit(0)
"""


@pytest.mark.ray
def test_a_term_after_ray_started_reaches_the_sweeps_own_handler():
    done = run_probe(PROBE)
    assert done.returncode == 3, (done.returncode, done.stderr[-2000:])
