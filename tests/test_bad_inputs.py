"""Issue 14's bad-input table: every case is a real `orchestrate` command line on a workspace
holding a tracking store with runs, output folders and input files. Each must exit 2 with a
message naming what is wrong, print no traceback, and leave the workspace byte-for-byte as it
was (the store included).

How it runs: the ~100 cases go through one subprocess that calls `orchestrator.cli.orchestrate:main` (the
same object the `orchestrate` script calls) once per case, in standalone mode, with its own
argv, stdout and stderr, and reports exit code and output per case; one parametrized test then
asserts each case. A subprocess per case would pay ~3-10 s of imports each (minutes on a busy
machine); click's CliRunner inside pytest would share pytest's process state. A few cases are
also run as separate `orchestrate` processes (test_real_process_*) to show the in-process run
and the real command agree.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch
import yaml
from testkit.cli import run_orchestrate
from testkit.toy import tiny_config

TESTS = Path(__file__).resolve().parent
REPO_ROOT = TESTS.parent
# The module fixture runs every case (minutes on a busy machine) inside the first test.
pytestmark = pytest.mark.timeout(1500)

# -- the workspace --------------------------------------------------------------------------------

TOY = {
    **tiny_config(name="bad"),
    "search": {"sampler": "grid", "space": {"lr": {"grid": [0.01]}}, "seeds": [1], "resources": {"cpu": 1}},
}
GOOD_ROWS = [
    {"premise": "a man sleeps", "hypothesis": "a person sleeps", "label": "entailment"},
    {"premise": "a dog runs", "hypothesis": "a cat runs", "label": "contradiction"},
    {"premise": "a girl sings", "hypothesis": "a girl sings well", "label": "neutral"},
] * 4


def _jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _with(base: dict, *edits: tuple[str, object]) -> dict:
    """A copy of `base` with dotted keys set (value None deletes the key)."""
    spec = copy.deepcopy(base)
    for dotted, value in edits:
        *head, last = dotted.split(".")
        node = spec
        for key in head:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return spec


def _jsonl_spec(ws: Path, train: str = "train.jsonl", **data) -> dict:
    spec = _with(TOY, ("data", {
        "corpus": "jsonl", "data_dir": str(ws / "inputs"),
        "files": {"train": train, "dev": "dev.jsonl"}, "splits": ["train", "dev"], **data,
    }))
    return spec


def _vectors_spec(ws: Path, source: str, **vectors) -> dict:
    spec = _jsonl_spec(ws)
    spec["data"]["vectors"] = {"source": str(ws / "inputs" / source), **vectors}
    return spec


class _Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def build_workspace(ws: Path) -> None:
    """Inputs under ws/inputs; a store with an experiment and a sweep in ws/mlruns.db; an output
    folder with a file in it; a plain file `afile` to put outputs under."""
    from orchestrator.tracking.tracker import Tracker
    from orchestrator.tracking.uploader import create_parent
    from results import run_schema as rs

    inputs = ws / "inputs"
    inputs.mkdir(parents=True)
    (inputs / "train.jsonl").write_text(_jsonl(GOOD_ROWS))
    (inputs / "dev.jsonl").write_text(_jsonl(GOOD_ROWS[:3]))
    (inputs / "empty.jsonl").write_text("")
    (inputs / "malformed.jsonl").write_text(_jsonl(GOOD_ROWS[:2]) + '{"premise": "x",\n')
    (inputs / "array.jsonl").write_text(_jsonl(GOOD_ROWS[:2]) + "[1, 2]\n")
    (inputs / "nofield.jsonl").write_text(_jsonl(GOOD_ROWS[:2]) + json.dumps({"premise": "x", "label": "neutral"}) + "\n")
    (inputs / "badlabel.jsonl").write_text(_jsonl(GOOD_ROWS[:2]) + json.dumps({**GOOD_ROWS[0], "label": "maybe"}) + "\n")
    (inputs / "latin1.jsonl").write_bytes(_jsonl(GOOD_ROWS[:2]).encode() + '{"premise": "caf\xe9"}\n'.encode("latin-1"))
    (inputs / "numlabel.jsonl").write_text(_jsonl(GOOD_ROWS[:2]) + json.dumps({**GOOD_ROWS[0], "label": 3}) + "\n")
    header = "premise\thypothesis\tlabel\n"
    (inputs / "ragged.tsv").write_text(header + "a man\ta person\tentailment\nonly one field\n")
    (inputs / "noheader.tsv").write_text("sentence1\tsentence2\tgold\na\tb\tentailment\n")
    (inputs / "dev.tsv").write_text(header + "a man\ta person\tentailment\n")
    words = ["a", "man", "sleeps", "person", "dog", "runs", "cat", "girl", "sings", "well"]
    (inputs / "vec3.txt").write_text("".join(f"{w} 0.1 0.2 0.3\n" for w in words))
    (inputs / "vec8.txt").write_text("".join(f"{w} {' '.join(['0.1'] * 8)}\n" for w in words))
    (inputs / "garbage.txt").write_text("a 0.1 0.2 zz 0.4 0.5 0.6 0.7 0.8\n")
    (inputs / "ragged_vec.txt").write_text(f"a {' '.join(['0.1'] * 8)}\nman 0.1 0.2\n")
    (inputs / "binary.vec").write_bytes(b"\x00\x01\xff\xfe" * 64)
    (inputs / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    (inputs / "list.yaml").write_text("- 1\n- 2\n")
    (inputs / "broken.yaml").write_text("name: x\nmodel: {name: [\n")
    (inputs / "dup.yaml").write_text(yaml.safe_dump(TOY, sort_keys=False) + "name: again\n")
    (inputs / "tabs.yaml").write_text("name: x\n\tmodel: 1\n")
    (inputs / "folder.yaml").mkdir()
    checkpoints = inputs / "poisoned"
    checkpoints.mkdir()
    torch.save({"model": _Payload(str(ws.parent / "code-ran")), "optimizer": {}, "state": {}, "rng": {}},
               checkpoints / "checkpoint.pt")
    (inputs / "truncated").mkdir()
    (inputs / "truncated" / "checkpoint.pt").write_bytes(b"PK\x03\x04 not a checkpoint")
    for name, spec in SPECS.items():
        spec = spec(ws) if callable(spec) else spec
        spec = _with(spec, ("search.tracking_uri", spec.get("search", {}).get(
            "tracking_uri", f"sqlite:///{ws / 'mlruns.db'}")),
            ("search.storage_path", str(ws / "ray_results")))
        (inputs / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    for name, text in RAW_SPECS.items():
        (inputs / f"{name}.yaml").write_text(text)
    (ws / "out").mkdir()
    (ws / "out" / "kept.txt").write_text("an earlier result\n")
    (ws / "afile").write_text("a file, not a folder\n")
    tracker = Tracker(f"sqlite:///{ws / 'mlruns.db'}")
    tracker.check_reachable()
    create_parent(tracker, "existing", "sweep-existing", {rs.TAG_SWEEP_STATE: "completed"})


def tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


# -- the cases ------------------------------------------------------------------------------------

SPECS = {
    "epochs_true": _with(TOY, ("training.epochs", True)),
    "seed_true": _with(TOY, ("training.seed", True)),
    "batch_true": _with(TOY, ("training.batch_size", False)),
    "l2_inf": _with(TOY, ("training.l2", float("inf"))),
    "lr_nan": _with(TOY, ("training.lr", float("nan"))),
    "lr_grid_inf": _with(TOY, ("search.space.lr", {"grid": [float("inf")]})),
    "dropout_grid_inf": _with(TOY, ("search.space.dropout", {"grid": [0.1, float("-inf")]})),
    "uniform_inf": _with(TOY, ("search.sampler", "random"), ("search.space.lr", {"uniform": [0.001, float("inf")]})),
    "arg_inf": _with(TOY, ("model.args.dropout", float("inf"))),
    "hidden_zero": _with(TOY, ("model.args.hidden_size", 0)),
    "hidden_grid_zero": _with(TOY, ("search.space.hidden_size", {"grid": [8, 0]})),
    "top_unknown": _with(TOY, ("trainig", {"lr": 1})),
    "training_unknown": _with(TOY, ("training.learning_rate", 0.1)),
    "search_unknown": _with(TOY, ("search.samplr", "grid")),
    "scheduler_unknown": _with(TOY, ("search.scheduler", {"type": "asha", "grace": 1})),
    "domain_unknown": _with(TOY, ("search.space.lr", {"grdi": [0.1]})),
    "data_unknown": _with(TOY, ("data.corpuss", "toy")),
    "resources_unknown": _with(TOY, ("search.resources", {"cpus": 1})),
    "toy_unknown": _with(TOY, ("data.toy.sizes", 100)),
    "lr_negative": _with(TOY, ("training.lr", -0.1)),
    "batch_zero": _with(TOY, ("training.batch_size", 0)),
    "epochs_zero": _with(TOY, ("training.epochs", 0)),
    "epochs_fraction": _with(TOY, ("training.epochs", 2.5)),
    "optimizer_sgd": _with(TOY, ("training.optimizer", "sgd")),
    "precision_fp16": _with(TOY, ("training.precision", "fp16")),
    "patience_zero": _with(TOY, ("training.patience", 0)),
    "grad_clip_zero": _with(TOY, ("training.grad_clip", 0)),
    "threads_zero": _with(TOY, ("training.num_threads", 0)),
    "device_bogus": _with(TOY, ("training.device", "tpu")),
    "model_unknown": _with(TOY, ("model.name", "bert")),
    "variant_unknown": _with(TOY, ("model.variant", "deluxe")),
    "arg_unknown": _with(TOY, ("model.args.heads", 4)),
    "arg_reserved": _with(TOY, ("model.args.vocab_size", 10)),
    "name_space": _with(TOY, ("name", "my sweep")),
    "name_missing": _with(TOY, ("name", None)),
    "model_missing": _with(TOY, ("model", None)),
    "data_missing": _with(TOY, ("data", None)),
    "corpus_unknown": _with(TOY, ("data.corpus", "imdb")),
    "sampler_unknown": _with(TOY, ("search.sampler", "bayes")),
    "grid_with_tpe": _with(TOY, ("search.sampler", "tpe")),
    "uniform_with_grid": _with(TOY, ("search.space.lr", {"uniform": [0.001, 0.1]})),
    "seeds_duplicate": _with(TOY, ("search.seeds", [1, 1])),
    "seeds_empty": _with(TOY, ("search.seeds", [])),
    "num_samples_zero": _with(TOY, ("search.sampler", "random"), ("search.num_samples", 0),
                              ("search.space.lr", {"choice": [0.1]})),
    "space_unknown_hp": _with(TOY, ("search.space.momentum", {"grid": [0.9]})),
    "space_seed": _with(TOY, ("search.space.seed", {"grid": [1, 2]})),
    "loguniform_zero": _with(TOY, ("search.sampler", "random"), ("search.space.lr", {"loguniform": [0, 0.1]})),
    "uniform_reversed": _with(TOY, ("search.sampler", "random"), ("search.space.lr", {"uniform": [0.1, 0.01]})),
    "grid_empty": _with(TOY, ("search.space.lr", {"grid": []})),
    "two_kinds": _with(TOY, ("search.space.lr", {"grid": [0.1], "choice": [0.2]})),
    "concurrency_zero": _with(TOY, ("search.max_concurrent_trials", 0)),
    "budget_negative": _with(TOY, ("search.time_budget_s", -5)),
    "cpu_zero": _with(TOY, ("search.resources", {"cpu": 0})),
    "cpu_inf": _with(TOY, ("search.resources", {"cpu": float("inf")})),
    "cpu_true": _with(TOY, ("search.resources", {"cpu": True})),
    "metric_unknown": _with(TOY, ("search.metric", "f1")),
    "mode_unknown": _with(TOY, ("search.mode", "maximum")),
    "failures_negative": _with(TOY, ("search.max_failures", -1)),
    **{f"objectives_{case}": _with(
        TOY, ("search.sampler", "tpe"), ("search.space.lr", {"choice": [0.01, 0.1]}),
        ("search.objectives", [{"dev_accuracy": "max"}, {"theta_m": "min"}]), *edits,
    ) for case, edits in (
        ("unknown", [("search.objectives", [{"accuracy": "max"}, {"theta_m": "min"}])]),
        ("direction", [("search.objectives", [{"dev_accuracy": "max"}, {"theta_m": "minimize"}])]),
        ("not_mapping", [("search.objectives", ["dev_accuracy", {"theta_m": "min"}])]),
        ("single", [("search.objectives", [{"dev_accuracy": "max"}])]),
        ("repeated", [("search.objectives", [{"theta_m": "min"}, {"theta_m": "min"}])]),
        ("cmaes", [("search.sampler", "cmaes"), ("search.space.lr", {"loguniform": [0.001, 0.1]})]),
        ("asha", [("search.scheduler", {"type": "asha"})]),
        ("median", [("search.scheduler", {"type": "median"})]),
        ("seeds", [("search.seeds", [1, 2])]),
        ("metric", [("search.metric", "dev_loss")]),
    )},
    "toy_size_small": _with(TOY, ("data.toy.size", 5)),
    "splits_no_train": _with(TOY, ("data.splits", ["dev", "test"])),
    "max_examples_zero": _with(TOY, ("data.max_examples", {"train": 0})),
    "holdout_fraction": _with(TOY, ("data.dev_holdout", {"fraction": 1.5})),
    "lowercase_text": _with(TOY, ("data.lowercase", "maybe")),
    "toy_block_on_jsonl": lambda ws: _with(_jsonl_spec(ws), ("data.toy", {"size": 100})),
    "jsonl_no_train_file": lambda ws: _with(_jsonl_spec(ws), ("data.files", {"dev": "dev.jsonl"})),
    "tsv_int_columns_with_header": lambda ws: _with(_jsonl_spec(ws), ("data.corpus", "tsv"),
                                                    ("data.columns", {"premise": 0, "hypothesis": 1, "label": 2})),
    "labels_single": lambda ws: _jsonl_spec(ws, labels=["only"]),
    "label_map_unknown": lambda ws: _jsonl_spec(ws, label_map={"yes": "maybe"}),
    "vectors_suffix": lambda ws: _vectors_spec(ws, "vectors.csv"),
    "tracking_scheme": _with(TOY, ("search.tracking_uri", "foo://nowhere")),
    "tracking_postgres_down": _with(TOY, ("search.tracking_uri", "postgresql://nli:s3cretpw@127.0.0.1:1/mlflow")),
    # data and vectors: read before anything is written
    "data_missing_file": lambda ws: _jsonl_spec(ws, train="nope.jsonl"),
    "data_empty": lambda ws: _jsonl_spec(ws, train="empty.jsonl"),
    "data_malformed": lambda ws: _jsonl_spec(ws, train="malformed.jsonl"),
    "data_array": lambda ws: _jsonl_spec(ws, train="array.jsonl"),
    "data_nofield": lambda ws: _jsonl_spec(ws, train="nofield.jsonl"),
    "data_badlabel": lambda ws: _jsonl_spec(ws, train="badlabel.jsonl"),
    "data_latin1": lambda ws: _jsonl_spec(ws, train="latin1.jsonl"),
    "data_numlabel": lambda ws: _jsonl_spec(ws, train="numlabel.jsonl"),
    "tsv_ragged": lambda ws: _with(_jsonl_spec(ws), ("data.corpus", "tsv"),
                                   ("data.files", {"train": "ragged.tsv", "dev": "dev.tsv"})),
    "tsv_no_column": lambda ws: _with(_jsonl_spec(ws), ("data.corpus", "tsv"),
                                      ("data.files", {"train": "noheader.tsv", "dev": "dev.tsv"})),
    "vectors_missing": lambda ws: _vectors_spec(ws, "nope.txt"),
    "vectors_dim": lambda ws: _vectors_spec(ws, "vec3.txt"),
    "vectors_dim_declared": lambda ws: _vectors_spec(ws, "vec8.txt", embedding_dim=300),
    "vectors_garbage": lambda ws: _vectors_spec(ws, "garbage.txt"),
    "vectors_ragged": lambda ws: _vectors_spec(ws, "ragged_vec.txt"),
    "resume_unknown": _with(TOY, ("name", "never-ran")),
    "existing": _with(TOY, ("name", "existing")),
    "cpu_too_many": _with(TOY, ("search.resources", {"cpu": 64})),
    # ABCNN-1's W_0 has max_length columns: the toy corpus has longer sentences
    "abcnn_max_length": _with(TOY, ("model", {"name": "abcnn", "variant": "abcnn1",
                                              "args": {"embedding_dim": 8, "hidden_size": 6, "max_length": 4}})),
    "abcnn_max_length_grid": _with(TOY, ("model", {"name": "abcnn", "variant": "abcnn3", "args": {"embedding_dim": 8, "hidden_size": 6}}),
                                   ("search.space.max_length", {"grid": [40, 4]})),
}
RAW_SPECS = {
    "dup_nested": yaml.safe_dump(TOY, sort_keys=False).replace("  lr: 0.01\n", "  lr: 0.01\n  lr: 0.02\n", 1),
}

S = "inputs/{}.yaml"
CASES: list[tuple[str, list[str], str]] = [
    # (case id, argv, expected fragment of the error)
    ("epochs_true", ["validate", S, "--no-data"], "training.epochs: expected a number"),
    ("seed_true", ["validate", S, "--no-data"], "training.seed: expected a number"),
    ("batch_true", ["validate", S, "--no-data"], "training.batch_size: expected a number"),
    ("l2_inf", ["validate", S, "--no-data"], "training.l2: Input should be a finite number"),
    ("lr_nan", ["validate", S, "--no-data"], "training.lr: Input should be a finite number"),
    ("lr_grid_inf", ["validate", S, "--no-data"], "search.space.lr: grid[0]: must be a finite number"),
    ("dropout_grid_inf", ["validate", S, "--no-data"], "search.space.dropout: grid[1]: must be a finite number"),
    ("uniform_inf", ["validate", S, "--no-data"], "search.space.lr.uniform.1: Input should be a finite number"),
    ("arg_inf", ["validate", S, "--no-data"], "model: args.dropout: must be a finite number"),
    ("hidden_zero", ["validate", S, "--no-data"], "model.args: hidden_size must be an integer >= 1"),
    ("hidden_grid_zero", ["validate", S, "--no-data"], "search.space.hidden_size.grid[1]: hidden_size must be"),
    ("top_unknown", ["validate", S, "--no-data"], "trainig: unknown key; allowed: name, model, data, training, search"),
    ("training_unknown", ["validate", S, "--no-data"], "training.learning_rate: unknown key; allowed: optimizer, adagrad_accumulator, lr,"),
    ("search_unknown", ["validate", S, "--no-data"], "search.samplr: unknown key; allowed: sampler, space,"),
    ("scheduler_unknown", ["validate", S, "--no-data"], "search.scheduler.grace: unknown key; allowed: type, grace_period"),
    ("domain_unknown", ["validate", S, "--no-data"], "search.space.lr.grdi: unknown key; allowed: grid, choice"),
    ("data_unknown", ["validate", S, "--no-data"], "data.corpuss: unknown key; allowed: corpus, data_dir"),
    ("resources_unknown", ["validate", S, "--no-data"], "search.resources.cpus: unknown key; allowed: cpu, gpu"),
    ("toy_unknown", ["validate", S, "--no-data"], "data.toy.sizes: unknown key; allowed: size, seed, num_classes"),
    ("lr_negative", ["validate", S, "--no-data"], "training.lr: Input should be greater than 0"),
    ("batch_zero", ["validate", S, "--no-data"], "training.batch_size: Input should be greater than or equal to 1"),
    ("epochs_zero", ["validate", S, "--no-data"], "training.epochs: Input should be greater than or equal to 1"),
    ("epochs_fraction", ["validate", S, "--no-data"], "training.epochs: Input should be a valid integer"),
    ("optimizer_sgd", ["validate", S, "--no-data"], "training.optimizer: Input should be 'adam' or 'adagrad'"),
    ("precision_fp16", ["validate", S, "--no-data"], "training.precision: 'fp16' is not offered (it needs loss scaling"),
    ("patience_zero", ["validate", S, "--no-data"], "training.patience: Input should be greater than or equal to 1"),
    ("grad_clip_zero", ["validate", S, "--no-data"], "training.grad_clip: Input should be greater than 0"),
    ("threads_zero", ["validate", S, "--no-data"], "training.num_threads: Input should be greater than or equal to 1"),
    ("device_bogus", ["validate", S, "--no-data"], "training.device: String should match pattern"),
    ("model_unknown", ["validate", S, "--no-data"], "unknown model 'bert'; registered models:"),
    ("variant_unknown", ["validate", S, "--no-data"], "unknown variant 'deluxe' for model 'decomposable'; valid variants:"),
    ("arg_unknown", ["validate", S, "--no-data"], "heads"),
    ("arg_reserved", ["validate", S, "--no-data"], "args.vocab_size is set from the data"),
    ("name_space", ["validate", S, "--no-data"], "name: String should match pattern"),
    ("name_missing", ["validate", S, "--no-data"], "name: Field required"),
    ("model_missing", ["validate", S, "--no-data"], "model: Field required"),
    ("data_missing", ["validate", S, "--no-data"], "data: Field required"),
    ("corpus_unknown", ["validate", S, "--no-data"], "data.corpus: Input should be 'toy'"),
    ("sampler_unknown", ["validate", S, "--no-data"], "search.sampler: Input should be 'grid', 'random', 'tpe', 'cmaes' or 'nsga2'"),
    ("grid_with_tpe", ["validate", S, "--no-data"], "space.lr: grid values need sampler: grid"),
    ("uniform_with_grid", ["validate", S, "--no-data"], "space.lr: sampler 'grid' takes only grid values"),
    ("seeds_duplicate", ["validate", S, "--no-data"], "seeds must be distinct"),
    ("seeds_empty", ["validate", S, "--no-data"], "search.seeds: List should have at least 1 item"),
    ("num_samples_zero", ["validate", S, "--no-data"], "search.num_samples: Input should be greater than or equal to 1"),
    ("space_unknown_hp", ["validate", S, "--no-data"], "search.space.momentum: unknown hyperparameter 'momentum'"),
    ("space_seed", ["validate", S, "--no-data"], "search.space.seed: 'seed' cannot be searched here"),
    ("loguniform_zero", ["validate", S, "--no-data"], "loguniform needs low > 0"),
    ("uniform_reversed", ["validate", S, "--no-data"], "uniform needs [low, high] with low < high"),
    ("grid_empty", ["validate", S, "--no-data"], "grid must list at least one value"),
    ("two_kinds", ["validate", S, "--no-data"], "give exactly one of grid, choice"),
    ("concurrency_zero", ["validate", S, "--no-data"], "search.max_concurrent_trials: Input should be greater than or equal to 1"),
    ("budget_negative", ["validate", S, "--no-data"], "search.time_budget_s: Input should be greater than 0"),
    ("cpu_zero", ["validate", S, "--no-data"], "search.resources.cpu: Input should be greater than 0"),
    ("cpu_inf", ["validate", S, "--no-data"], "search.resources.cpu: Input should be a finite number"),
    ("cpu_true", ["validate", S, "--no-data"], "search.resources.cpu: expected a number"),
    ("metric_unknown", ["validate", S, "--no-data"], "search.metric: Input should be 'dev_accuracy' or 'dev_loss'"),
    ("mode_unknown", ["validate", S, "--no-data"], "search.mode: Input should be 'max' or 'min'"),
    ("failures_negative", ["validate", S, "--no-data"], "search.max_failures: Input should be greater than or equal to 0"),
    ("toy_size_small", ["validate", S, "--no-data"], "data.toy.size: Input should be greater than or equal to 30"),
    ("splits_no_train", ["validate", S, "--no-data"], "data.splits must include 'train'"),
    ("max_examples_zero", ["validate", S, "--no-data"], "data.max_examples.train: Input should be greater than 0"),
    ("holdout_fraction", ["validate", S, "--no-data"], "data.dev_holdout.fraction: Input should be less than 1"),
    ("lowercase_text", ["validate", S, "--no-data"], "data.lowercase: Input should be a valid boolean"),
    ("toy_block_on_jsonl", ["validate", S, "--no-data"], "data.toy only applies to corpus 'toy'"),
    ("jsonl_no_train_file", ["validate", S, "--no-data"], "set data.files.train"),
    ("tsv_int_columns_with_header", ["validate", S, "--no-data"], "data.columns must be field names for corpus 'tsv'"),
    ("labels_single", ["validate", S, "--no-data"], "data.labels must be 2 or more distinct labels"),
    ("label_map_unknown", ["validate", S, "--no-data"], "data.label_map maps onto ['maybe']"),
    ("vectors_suffix", ["validate", S, "--no-data"], "vectors.csv'"),
    ("dup_nested", ["validate", S, "--no-data"], "line 19: not valid YAML: found duplicate key 'lr' (first at line 18)"),
    ("dup", ["validate", S, "--no-data"], "not valid YAML: found duplicate key 'name' (first at line 1)"),
    ("list", ["validate", S, "--no-data"], "expected a mapping at the top level, got list"),
    ("broken", ["validate", S, "--no-data"], "broken.yaml: line 3: not valid YAML"),
    ("tabs", ["validate", S, "--no-data"], "tabs.yaml: line 2: not valid YAML"),
    ("latin1", ["validate", S, "--no-data"], "latin1.yaml: cannot be read as a YAML file"),
    ("folder", ["validate", S, "--no-data"], "File 'inputs/folder.yaml' is a directory"),
    ("nope", ["validate", S, "--no-data"], "inputs/nope.yaml: no such file"),
    # the same checks guard `sweep` and `train`
    ("epochs_true", ["sweep", S], "training.epochs: expected a number"),
    ("lr_grid_inf", ["sweep", S], "search.space.lr: grid[0]: must be a finite number"),
    ("dup_nested", ["sweep", S], "found duplicate key 'lr'"),
    ("l2_inf", ["train", S], "training.l2: Input should be a finite number"),
    ("epochs_true", ["train", S], "training.epochs: expected a number"),
    # data and vectors (read by validate, and by sweep before the parent run exists)
    ("data_missing_file", ["sweep", S], "nope.jsonl"),
    ("data_empty", ["sweep", S], "no examples in split(s): train"),
    ("data_malformed", ["sweep", S], "malformed.jsonl:3: malformed JSON"),
    ("data_array", ["sweep", S], "array.jsonl:3: expected a JSON object, got list"),
    ("data_nofield", ["sweep", S], "nofield.jsonl:3: malformed line: no field 'hypothesis'"),
    ("data_badlabel", ["sweep", S], "badlabel.jsonl:3: unknown label 'maybe'"),
    ("data_latin1", ["sweep", S], "latin1.jsonl:3: not valid UTF-8"),
    ("data_numlabel", ["sweep", S], "numlabel.jsonl:3: field 'label' should be a string, got 3"),
    ("tsv_ragged", ["sweep", S], "ragged.tsv:3: malformed line"),
    ("tsv_no_column", ["sweep", S], "noheader.tsv"),
    ("vectors_missing", ["sweep", S], "word vectors file not found"),
    ("vectors_dim", ["sweep", S], "model.args.embedding_dim=8 but the word vectors"),
    ("vectors_dim_declared", ["sweep", S], "8-dimensional vectors but embedding_dim is 300"),
    ("vectors_garbage", ["sweep", S], "garbage.txt:1: a value is not a number"),
    ("vectors_ragged", ["sweep", S], "ragged_vec.txt:2: 2 values, expected 8"),
    ("data_badlabel", ["validate", S], "badlabel.jsonl:3: unknown label 'maybe'"),
    ("data_badlabel", ["train", S], "badlabel.jsonl:3: unknown label 'maybe'"),
    # tracking stores, cluster addresses, sweeps in the store
    ("tracking_scheme", ["sweep", S], "unknown scheme 'foo'; allowed: databricks, file, http"),
    ("tracking_postgres_down", ["sweep", S], "postgresql://nli:***@127.0.0.1:1/mlflow is unreachable"),
    ("epochs_true", ["sweep", S, "--resume", "--new"], "--resume and --new exclude each other"),
    ("resume_unknown", ["sweep", S, "--resume"], "experiment 'never-ran' holds no sweep to resume"),
    ("existing", ["sweep", S], "experiment 'existing' already holds completed sweep run"),
    ("resume_unknown", ["sweep", S, "--address", "127.0.0.1:1"], "--address '127.0.0.1:1': no Ray cluster answers"),
    ("resume_unknown", ["sweep", S, "--address", "headnode"], "--address 'headnode': expected HOST:PORT"),
    # output paths
    (None, ["results", "existing", "--out", "afile/t.parquet"], "--out"),
    (None, ["results", "existing", "--out", "out"], "File 'out' is a directory"),
    (None, ["results", "existing", "--out", "out/t.csv"], "must end in .parquet"),
    (None, ["results", "existing", "--out", "out/t.parquet", "--evp", "afile/e.png"], "--evp"),
    (None, ["results", "no-such-experiment", "--out", "out/t.parquet"], "no-such-experiment"),
    (None, ["results", "--tracking-uri", "postgresql://nli:s3cretpw@127.0.0.1:1/mlflow", "--out",
            "out/t.parquet"], "postgresql://nli:***@127.0.0.1:1/mlflow is unreachable"),
    (None, ["ui", "--tracking-uri", "postgresql://nli:s3cretpw@127.0.0.1:1/mlflow"],
     "postgresql://nli:***@127.0.0.1:1/mlflow is unreachable"),
    (None, ["sweeps", "--tracking-uri", "postgresql://nli:s3cretpw@127.0.0.1:1/mlflow"],
     "postgresql://nli:***@127.0.0.1:1/mlflow is unreachable"),
    (None, ["attention", "0123456789abcdef", "--out", "afile/plots"], "afile is a file"),
    # ~USER of a user this machine does not have (pathlib raises RuntimeError): the option named
    (None, ["results", "existing", "--out", "~nosuchuser0/t.parquet"],
     "--out ~nosuchuser0/t.parquet: no user 'nosuchuser0' on this machine"),
    ("existing", ["validate", S, "--no-data", "--set", "data.data_dir=~nosuchuser0/d"],
     "data.data_dir ~nosuchuser0/d: no user 'nosuchuser0' on this machine"),
    ("existing", ["submit", S, "--slurm", "--dry-run", "--set", "search.tracking_uri=http://10.0.0.5:5000",
                  "--log-dir", "~nosuchuser0/logs"], "--log-dir ~nosuchuser0/logs: no user 'nosuchuser0'"),
    (None, ["data", "download", "snli", "--data-dir", "afile/cache"], "--data-dir"),
    (None, ["data", "download", "imdb"], "'imdb' is not one of"),
    (None, ["ui", "--port", "99999"], "99999 is not in the range 1<=x<=65535"),
    (None, ["ui", "--port", "0"], "0 is not in the range"),
    # train: checkpoints and flags
    ("epochs_true", ["train", "inputs/nope.yaml"], "inputs/nope.yaml: no such file"),
    ("toy_size_small", ["train", "inputs/data_badlabel.yaml", "--resume"], "--resume needs --checkpoint-dir"),
    (None, ["train", "inputs/data_badlabel.yaml", "--checkpoint-dir", "inputs/poisoned", "--resume"],
     "badlabel.jsonl:3: unknown label 'maybe'"),
    (None, ["train", "inputs/hidden_grid_zero.yaml", "--checkpoint-dir", "inputs/poisoned", "--resume"],
     "inputs/poisoned/checkpoint.pt: refused to load"),
    (None, ["train", "inputs/hidden_grid_zero.yaml", "--checkpoint-dir", "inputs/truncated", "--resume"],
     "inputs/truncated/checkpoint.pt: refused to load"),
    # search.objectives (a Pareto front): refused by `sweep` before anything is written
    ("objectives_unknown", ["sweep", S], "search: objectives[0]: unknown objective 'accuracy'; allowed: "
     "dev_accuracy, theta_m, theta_wm, trial_time_s"),
    ("objectives_unknown", ["validate", S, "--no-data"], "search: objectives[0]: unknown objective 'accuracy'"),
    ("objectives_direction", ["sweep", S], "search: objectives[1].theta_m: direction 'minimize'; allowed: max, min"),
    ("objectives_not_mapping", ["sweep", S], "search: objectives[0]: write one NAME: max|min per entry"),
    ("objectives_single", ["sweep", S], "search: objectives: give two or more distinct objectives"),
    ("objectives_repeated", ["sweep", S], "search: objectives: give two or more distinct objectives"),
    ("objectives_cmaes", ["sweep", S], "search: sampler: 'cmaes' (Optuna's CMA-ES) optimises one objective; "
     "with objectives use grid, random, tpe or nsga2"),
    ("objectives_asha", ["sweep", S], "search: scheduler.type: 'asha' stops trials on one metric; with objectives use fifo"),
    ("objectives_median", ["sweep", S], "search: scheduler.type: 'median' stops trials on one metric"),
    ("objectives_seeds", ["sweep", S], "search: seeds: with objectives, sampler 'tpe' takes one seed"),
    ("objectives_metric", ["sweep", S], "search: metric/mode: give either search.metric and search.mode or "
     "search.objectives"),
    # a corpus with sentences longer than the model takes: refused before launch, not trial by trial
    ("abcnn_max_length", ["sweep", S], "model.args.max_length=4, but the corpus has a sentence of"),
    ("abcnn_max_length", ["validate", S], "set model.args.max_length: "),
    ("abcnn_max_length", ["train", S], "abcnn1's attention on the input (W_0, max_length columns) takes none longer"),
    ("abcnn_max_length_grid", ["sweep", S], "model.args.max_length=4, but the corpus has a sentence of"),
    # needs a running Ray to see the cluster's size: last, as it is the slowest
    # Refused before Ray starts or a store is created (issue 44).
    ("cpu_too_many", ["sweep", S], "search.resources: a trial asks for 64 CPU and 0 GPU, but this "
     "machine gives a local sweep"),
]
ARGVS = [[a.format(spec) if spec else a for a in argv] for spec, argv, _ in CASES]
IDS = [f"{i:03d}-{argv[0]}-{spec or argv[1]}" for i, (spec, argv, _) in enumerate(CASES)]

# -- the runner -----------------------------------------------------------------------------------


def run_cases(ws: Path, argvs: list[list[str]], report: Path) -> None:
    """In a fresh process: each argv through the real CLI object, the workspace hashed around it."""
    from orchestrator.cli.orchestrate import main

    os.chdir(ws)
    results = []
    for argv in argvs:
        before = tree_digest(ws)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main.main(argv, prog_name="orchestrate", standalone_mode=True)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # what would reach the user as a traceback
                traceback.print_exc()
                code = 1
        results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(),
                        "unchanged": tree_digest(ws) == before})
    report.write_text(json.dumps(results))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """One workspace for the module (building it creates an MLflow store: seconds): every case
    must leave it as it was, and every test checks that it did."""
    ws = tmp_path_factory.mktemp("bad-inputs") / "ws"
    build_workspace(ws)
    return ws


@pytest.fixture(scope="module")
def outcomes(workspace) -> list[dict]:
    ws = workspace
    root = ws.parent
    report = root / "report.json"
    env = {**os.environ, "NLI_DATA_DIR": str(root / "data-cache"), "MLFLOW_TRACKING_URI": f"sqlite:///{ws / 'mlruns.db'}"}
    # This module and the code under test importable in the child, as they are here.
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(TESTS), env.get("PYTHONPATH", "")])
    code = (
        "import json, sys; from pathlib import Path; from test_bad_inputs import run_cases; "
        "run_cases(Path(sys.argv[1]), json.loads(sys.argv[2]), Path(sys.argv[3]))"
    )
    finished = subprocess.run(
        [sys.executable, "-c", code, str(ws), json.dumps(ARGVS), str(report)],
        env=env, capture_output=True, text=True, timeout=1400,
    )
    assert finished.returncode == 0, finished.stderr[-5000:]
    assert not (root / "code-ran").exists()  # the poisoned checkpoint ran nothing
    return json.loads(report.read_text())


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_bad_input_is_exit_2_with_message_and_nothing_written(outcomes, index):
    spec, argv, expected = CASES[index]
    outcome = outcomes[index]
    shown = outcome["stdout"] + outcome["stderr"]
    assert outcome["code"] == 2, shown
    assert "Traceback" not in shown, shown
    assert expected in shown, f"{expected!r} not in {shown!r}"
    assert "s3cretpw" not in shown
    assert outcome["unchanged"], f"the workspace changed: {shown}"


def test_the_table_is_big_enough():
    assert len(CASES) >= 80


# -- the same through real processes ------------------------------------------------------------


@pytest.mark.parametrize("index", [0, 101, 104])
def test_real_process_agrees(workspace, tmp_path, index):
    spec, argv, expected = CASES[index]
    ws = workspace
    before = tree_digest(ws)
    result = run_orchestrate(ARGVS[index], cwd=ws, env={"NLI_DATA_DIR": str(tmp_path / "data-cache")},
                             timeout=300)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and expected in result.stderr
    assert tree_digest(ws) == before
