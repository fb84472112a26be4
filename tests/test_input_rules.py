"""The rules behind the bad-input table, one by one: the YAML loader, the strict config blocks,
secret masking and the address check."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from nli_models.config import load_run_config
from nli_models.data import prepare_data
from nli_models.errors import InputError, mask_secrets
from nli_models.strict import load_yaml
from orchestrator.cluster.ray_address import check_ray_address

pytestmark = pytest.mark.unit


def test_yes_no_on_off_are_the_text_written_and_true_false_are_booleans():
    loaded = load_yaml("labels: [yes, no, on, off, Yes, NO]\nflag: true\nother: False\n")
    assert loaded == {"labels": ["yes", "no", "on", "off", "Yes", "NO"], "flag": True, "other": False}


def test_duplicate_keys_are_refused_at_any_depth():
    with pytest.raises(yaml.YAMLError, match="duplicate key 'lr'"):
        load_yaml("training:\n  lr: 1\n  lr: 2\n")
    assert load_yaml("a: {lr: 1}\nb: {lr: 2}\n") == {"a": {"lr": 1}, "b": {"lr": 2}}


def test_unquoted_yes_no_labels_train_as_written(tmp_path):
    rows = [{"premise": f"p {i}", "hypothesis": f"h {i}", "label": ["yes", "no"][i % 2]} for i in range(20)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "run.yaml"
    config.write_text(
        "name: yesno\n"
        "model: {name: decomposable, variant: vanilla, args: {embedding_dim: 8, projection_dim: 8, hidden_size: 8}}\n"
        f"data: {{corpus: jsonl, data_dir: {tmp_path}, files: {{train: train.jsonl}}, splits: [train],\n"
        "       labels: [yes, no]}\n"
    )
    run = load_run_config(config)
    assert run.data.labels == ("yes", "no")
    assert prepare_data(run.data, cache_dir=tmp_path / "cache").labels == ("yes", "no")


def test_mask_secrets_hides_every_uri_password_and_nothing_else():
    text = ("store postgresql://nli:s3cret@db:5432/mlflow and http://u:p%40ss@h:5000/ "
            "and sqlite:///mlruns.db and http://h:5000")
    masked = mask_secrets(text)
    assert "s3cret" not in masked and "p%40ss" not in masked
    assert "postgresql://nli:***@db:5432/mlflow" in masked and "http://u:***@h:5000/" in masked
    assert "sqlite:///mlruns.db" in masked and "http://h:5000" in masked


def test_unreachable_ray_address_fails_within_seconds():
    started = time.monotonic()
    with pytest.raises(InputError, match=r"no Ray cluster answers at 127\.0\.0\.1:1"):
        check_ray_address("127.0.0.1:1")
    assert time.monotonic() - started < 10
    with pytest.raises(InputError, match="expected HOST:PORT"):
        check_ray_address("ray://headnode")
    check_ray_address(None)  # a private local Ray: nothing to check
