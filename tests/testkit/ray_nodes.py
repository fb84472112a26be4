"""Ray nodes as separate machines would run them: `ray start --block` in process groups of their
own, on free ports and temp dirs of their own (two nodes on one machine must not share Ray's
fixed defaults)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from testkit import BIN
from testkit.ports import free_ports
from testkit.processes import Group, base_env, http_ok, wait_for


def stop_ray_nodes(groups: list[Group]) -> None:
    """End Ray nodes (`ray start --block` groups) by process group, at once: their processes end
    with the group, and workers (in groups of their own) exit once their raylet is gone. Given
    SIGTERM, `ray start` outlasted a 5 s grace every time."""
    for group in groups:
        group.stop(grace_s=0)


def node_ports() -> list[str]:
    """Distinct free ports for a Ray node's own servers (testkit.ports: none given out before):
    two nodes (or Ray instances) on one machine must not both take Ray's fixed defaults."""
    flags = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
             "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")
    ports = free_ports(len(flags))
    return [item for flag, port in zip(flags, ports, strict=True) for item in (flag, str(port))]


class RayHead:
    """`ray start --head --block` on 127.0.0.1 in its own process group, with a temp dir of its
    own: `address` (GCS) is what `orchestrate sweep --address` and a worker node join,
    `dashboard` what `orchestrate submit/jobs/logs --address` talk to. With
    `autoscaled_node_types` (the `available_node_types` of a cluster config), its autoscaler
    starts nodes of those types on this machine when asked (Ray's fake multi-node provider, as
    ray.cluster_utils.AutoscalingCluster uses, which would `ray stop --force` every Ray here)."""

    def __init__(self, num_cpus: int, logs: Path, autoscaled_node_types: dict | None = None):
        gcs, dashboard, client = free_ports(3)
        self.address = f"127.0.0.1:{gcs}"
        self.dashboard = f"http://127.0.0.1:{dashboard}"
        self.temp_dir = tempfile.mkdtemp(prefix="nlirh", dir="/tmp")  # short: Ray's socket paths
        env, autoscaling = base_env(), []
        if autoscaled_node_types is not None:
            config = Path(self.temp_dir) / "autoscaler.json"
            config.write_text(json.dumps(_fake_cluster_config(self.address, num_cpus, autoscaled_node_types)))
            autoscaling = ["--autoscaling-config", str(config)]
            env.update(RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1")
        self.group = Group(
            [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
             "--port", str(gcs), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard),
             "--ray-client-server-port", str(client), "--num-cpus", str(num_cpus),
             "--num-gpus", "0", "--temp-dir", self.temp_dir, "--disable-usage-stats", *autoscaling,
             *node_ports()],
            logs / "ray-head.log", env=env,
        )
        try:
            wait_for(lambda: http_ok(f"{self.dashboard}/api/version"), 90,
                     f"the Ray dashboard at {self.dashboard}", groups=[self.group])
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        stop_ray_nodes([self.group])
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _fake_cluster_config(gcs_address: str, head_cpus: int, node_types: dict) -> dict:
    """A cluster config whose nodes Ray's fake multi-node provider starts as local processes."""
    return {
        "cluster_name": "nli-test", "max_workers": sum(t["max_workers"] for t in node_types.values()),
        "upscaling_speed": 1, "idle_timeout_minutes": 1, "auth": {"ssh_user": "test"},
        "provider": {"type": "fake_multinode", "gcs_address": gcs_address},
        "available_node_types": {
            **node_types,
            "ray.head.default": {"resources": {"CPU": head_cpus}, "node_config": {}, "max_workers": 0},
        },
        "head_node_type": "ray.head.default",
        **{key: [] for key in ("cluster_synced_files", "rsync_exclude", "rsync_filter",
                               "initialization_commands", "setup_commands", "head_setup_commands",
                               "worker_setup_commands", "head_start_ray_commands",
                               "worker_start_ray_commands")},
        "file_mounts": {}, "file_mounts_sync_continuously": False,
    }


class RayWorker:
    """`ray start --address HEAD --block`: one more node (`num_gpus` logical GPUs) in its own
    process group, with a temp dir of its own, as a separate machine would have (a shared one
    lets a node delete the other's unpacked job working dir)."""

    def __init__(self, head: RayHead, num_cpus: int, num_gpus: int, log: Path):
        self.temp_dir = tempfile.mkdtemp(prefix="nlirw", dir="/tmp")
        self.group = Group(
            [str(BIN / "ray"), "start", "--address", head.address, "--block", "--node-ip-address",
             "127.0.0.1", "--num-cpus", str(num_cpus), "--num-gpus", str(num_gpus),
             "--temp-dir", self.temp_dir, *node_ports()],
            log,
        )

    def stop(self) -> None:
        stop_ray_nodes([self.group])
        shutil.rmtree(self.temp_dir, ignore_errors=True)
