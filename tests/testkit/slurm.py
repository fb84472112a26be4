"""A real one-node SLURM cluster on this machine for the tests (fixture `slurm_cluster`).

The session writes its own slurm.conf (this host as controller and compute node, its CPUs and
memory as `slurmd -C` finds them, private ports, state/spool/log dirs under a temp dir), runs its
own munged on a private key and socket, then `slurmctld -D -f CONF` and `slurmd -D -f CONF`, each
in a process group of its own, and stops them by pid at the end. SLURM_CONF points every sbatch,
squeue, scancel (and every job's srun) at it for the session. A system SLURM or munge, if any,
is left alone.

Skipped with the reason where slurm-wlm and munge are not installed (`make system-deps`, run by
.ci/run, installs them with apt-get) or the tests do not run as root (slurmd needs it).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from testkit.ports import free_ports
from testkit.processes import Group, wait_for

SBIN = ("/usr/sbin", "/sbin")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo", "srun")


def _find(name: str) -> str | None:
    return shutil.which(name) or next(
        (f"{d}/{name}" for d in SBIN if os.access(f"{d}/{name}", os.X_OK)), None
    )


def skip_reason() -> str | None:
    missing = [name for name in DAEMONS + CLIENTS if _find(name) is None]
    if missing:
        return (f"SLURM is not installed here (missing {', '.join(missing)}): "
                "apt-get install slurm-wlm munge (`make system-deps`, which .ci/run runs)")
    if os.geteuid() != 0:
        return "the test SLURM cluster runs slurmd as root (SlurmdUser=root); run the tests as root"
    return None


class SlurmCluster:
    def __init__(self, root: Path, node: str, conf: Path, groups: list[Group]):
        self.root, self.node, self.conf, self.groups = root, node, conf, groups

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=check)

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (the controller keeps ended jobs for MinJobAge)."""
        shown = self.run("scontrol", "show", "job", "-o", job_id, check=False).stdout
        return dict(re.findall(r"(\w+)=(\S*)", shown))

    def log_of(self, job_id: str) -> str:
        """What the controller and the node daemon logged about the job: why it ended as it did."""
        mentions = (f"jobid={job_id} ", f"job {job_id} ", f"[{job_id}.", f"job {job_id},")
        lines = [f"{name}: {line}" for name in ("slurmctld", "slurmd")
                 for line in (self.root / "log" / f"{name}.log").read_text(errors="replace").splitlines()
                 if any(m in f"{line} ".lower() for m in mentions)]
        return "\n".join([f"scontrol show job {job_id}: {self.job(job_id)}", *lines])

    def job_ids(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()

    def idle(self) -> bool:
        shown = self.run("sinfo", "-h", "-n", self.node, "-o", "%t", check=False)
        return shown.stdout.strip() == "idle"


def _node_line(node: str) -> str:
    """The node as slurmd itself finds it (CPUs, sockets, memory), so it registers as valid."""
    found = subprocess.run([_find("slurmd"), "-C"], capture_output=True, text=True, timeout=60).stdout
    fields = dict(re.findall(r"(\w+)=(\S+)", found.splitlines()[0]))
    keep = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
    return f"NodeName={node} NodeAddr=127.0.0.1 " + " ".join(f"{k}={fields[k]}" for k in keep if k in fields)


def write_conf(root: Path, node: str, munge_socket: Path) -> Path:
    for name in ("state", "spool", "log"):
        (root / name).mkdir()
    conf = root / "slurm.conf"
    controller_port, node_port = free_ports(2)
    conf.write_text(f"""\
ClusterName=nlitest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={controller_port}
SlurmdPort={node_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
# Ended jobs stay visible to scontrol for 10 minutes (there is no accounting database here).
MinJobAge=600
{_node_line(node)} State=UNKNOWN
# Preemption as many sites run it: a job in the higher-tier partition `urgent` takes the node
# from a sweep in `debug`, which SLURM requeues (with SIGTERM first, KillWait seconds to stop).
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes={node} MaxTime=INFINITE State=UP PriorityTier=2
""")
    return conf


def _start_munged(root: Path) -> tuple[Group, Path]:
    """munged on a fresh key of its own: no other munge (or its /etc/munge key) is touched."""
    directory = root / "munge"
    directory.mkdir(mode=0o711)
    key = directory / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    sock = directory / "munge.socket"
    group = Group([_find("munged"), "--foreground", "--force", f"--socket={sock}",
                   f"--key-file={key}", f"--pid-file={directory}/munged.pid",
                   f"--log-file={directory}/munged.log", f"--seed-file={directory}/munged.seed"],
                  root / "log-munged.out")
    wait_for(sock.exists, 30, "munged's socket", groups=[group])
    return group, sock


@pytest.fixture(scope="session")
def slurm_cluster():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="nlislurm", dir="/tmp"))  # short: socket paths
    node = socket.gethostname().split(".")[0]
    groups: list[Group] = []
    saved_conf = os.environ.get("SLURM_CONF")
    cluster = None
    try:
        munged, munge_socket = _start_munged(root)
        groups.append(munged)
        conf = write_conf(root, node, munge_socket)
        os.environ["SLURM_CONF"] = str(conf)
        groups.append(Group([_find("slurmctld"), "-D", "-f", str(conf)], root / "log-slurmctld.out"))
        groups.append(Group([_find("slurmd"), "-D", "-f", str(conf), "-N", node], root / "log-slurmd.out"))
        cluster = SlurmCluster(root, node, conf, groups)
        wait_for(cluster.idle, 90, f"SLURM node {node} to be idle", poll_s=1, groups=groups)
        yield cluster
    finally:
        if cluster is not None:  # no job outlives the session (slurmstepd detaches from slurmd)
            for job_id in cluster.job_ids():
                cluster.run("scancel", job_id, check=False)
            deadline = time.monotonic() + 60
            while cluster.job_ids() and time.monotonic() < deadline:
                time.sleep(1)
        for group in reversed(groups):
            group.stop()
        if saved_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved_conf
        shutil.rmtree(root, ignore_errors=True)
