"""Where sweeps run besides this process: SLURM batch jobs (slurm.py, the commands and signals;
slurm_jobs.py, SLURM's tools and the record of submissions; slurm_script.py, the batch script;
slurm_node.py, the helpers it runs on the job's nodes), the MLflow tracking server of `orchestrate
server` (tracking_server.py), whether a Ray address answers without importing Ray
(ray_address.py) and free ports (ports.py). Ray Jobs are orchestrator.ray_adapter.ray_jobs: only
the Ray adapter imports Ray."""

__all__ = [
    "ports",
    "ray_address",
    "slurm",
    "slurm_jobs",
    "slurm_node",
    "slurm_script",
    "tracking_server",
]
