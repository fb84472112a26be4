"""ray_cluster.yaml passes Ray's own cluster-config validation (no cloud calls) and wires up the
project: GPU workers, the project installed after torch, the MLflow server started on the head."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import ray.autoscaler
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from orchestrator.cli.cluster_commands import server_command

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "ray_cluster.yaml"


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def test_passes_ray_schema_and_launcher_validation(config):
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)  # the file as written: no unknown keys anywhere
    # What `ray up` does before talking to the cloud: merge the provider defaults, then validate.
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    assert prepared["provider"]["type"] == "aws"
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_a_broken_config_is_rejected_by_the_same_validation(config):
    broken = copy.deepcopy(config)
    broken["available_node_types"]["gpu_worker"]["min_workers"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(broken))
    broken = copy.deepcopy(config)
    broken["head_node_type"] = "no_such_type"
    with pytest.raises(ValueError, match="head_node_type"):
        validate_config(prepare_config(broken))


def test_gpu_workers_autoscale_from_zero(config):
    workers = {k: v for k, v in config["available_node_types"].items() if k != config["head_node_type"]}
    assert workers
    for node_type in workers.values():
        assert node_type["node_config"]["InstanceType"].startswith("g5.")
        assert node_type["min_workers"] == 0 < node_type["max_workers"]
    assert config["max_workers"] >= max(n["max_workers"] for n in workers.values())
    assert "gpu" in config["docker"]["image"]


def test_setup_installs_torch_then_the_mounted_project(config):
    commands = config["setup_commands"]
    torch = next(i for i, c in enumerate(commands) if "pip install" in c and "torch" in c)
    project = next(i for i, c in enumerate(commands) if "pip install" in c and "~/nli-orchestrator" in c)
    assert torch < project
    mounts = config["file_mounts"]
    assert "~/nli-orchestrator" in mounts and "~/specs" in mounts
    for local in mounts.values():  # local paths as `ray up` resolves them from the project root
        assert (REPO / local).exists(), local
    assert (REPO / mounts["~/specs"] / "quickstart.yaml").is_file()
    for excluded in (".venv", ".git", "ray_results", "mlruns.db"):
        assert excluded in config["rsync_exclude"]


def test_head_starts_ray_and_the_tracking_server_with_valid_options(config):
    head = config["head_start_ray_commands"]
    starts = [c for c in head + config["worker_start_ray_commands"] if "ray start" in c or "ray stop" in c]
    assert starts and all("RAY_AUTH_MODE=" in c for c in starts)
    server = next(c for c in head if "orchestrate server" in c)
    words = shlex.split(server)
    args = words[words.index("server") + 1: words.index(">")]
    # The options parse with the real command (a renamed option would fail here).
    context = server_command.make_context("server", list(args))
    assert context.params["backend_store_uri"].startswith("postgresql://")
    assert context.params["artifacts_destination"].startswith("/mnt/shared/")
    assert context.params["port"] == 5000
    assert "createdb mlflow" in " ".join(head)
    assert any("/mnt/shared" in option for option in config["docker"]["run_options"])
