"""Old import names of testkit.slurm, for test modules written before it (delete once none imports
this)."""

from testkit.slurm import SlurmCluster, skip_reason  # noqa: F401
