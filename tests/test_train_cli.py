"""`orchestrate train CONFIG.yaml`: per-epoch output and one test line on a tiny toy config;
bad input ends with exit code 2 and a message that names what is wrong (no traceback)."""

from __future__ import annotations

import json
import re

import pytest
import torch
import yaml
from testkit.cli import orchestrate
from testkit.toy import tiny_config

from nli_models.registry import model_names

pytestmark = pytest.mark.unit

EPOCH_LINE = re.compile(
    r"^epoch\s+(\d+)/(\d+)\s+train loss (\d+\.\d+) running acc (\d+\.\d\d)%\s+"
    r"dev loss (\d+\.\d+) acc (\d+\.\d\d)%\s+\(\d+\.\ds\)( \*)?$"
)
TEST_LINE = re.compile(r"^test accuracy (\d+\.\d\d)% \(best-on-dev weights; (.*)\)$")  # percent

TINY = tiny_config(dropout=0.1, epochs=2)

PAIRS = [
    ("a man is sleeping", "a person is sleeping", "entailment"),
    ("a woman runs in a park", "a man runs in a park", "contradiction"),
    ("a dog barks", "a dog barks at a cat", "neutral"),
]


@pytest.fixture(autouse=True)
def _data_cache_and_threads(tmp_path, monkeypatch):
    # prepare_data caches under $NLI_DATA_DIR/prepared: keep it out of the user's cache.
    monkeypatch.setenv("NLI_DATA_DIR", str(tmp_path / "data-cache"))
    threads = torch.get_num_threads()  # training.num_threads sets it for the whole process
    yield
    torch.set_num_threads(threads)


def write_config(tmp_path, config: dict, name: str = "run.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def merged(base: dict, **blocks) -> dict:
    config = json.loads(json.dumps(base))
    for block, values in blocks.items():
        if isinstance(values, dict) and isinstance(config.get(block), dict):
            config[block] = {**config[block], **values}
        else:
            config[block] = values
    return config


def run_train(*args: str):
    return orchestrate("train", *args)


def write_jsonl(path, rows, copies: int = 5) -> None:
    lines = [
        json.dumps({"premise": p, "hypothesis": h, "label": label}) for p, h, label in rows
    ] * copies
    path.write_text("\n".join(lines) + "\n")


def jsonl_config(tmp_path, train: str = "train.jsonl", embedding_dim: int = 8, **data) -> dict:
    write_jsonl(tmp_path / "train.jsonl", PAIRS)
    write_jsonl(tmp_path / "test.jsonl", PAIRS, copies=2)
    config = merged(
        TINY,
        model={**TINY["model"], "args": {**TINY["model"]["args"], "embedding_dim": embedding_dim}},
    )
    config["data"] = {
        "corpus": "jsonl",
        "data_dir": str(tmp_path),
        "files": {"train": train, "test": "test.jsonl"},
        "dev_holdout": {"fraction": 0.2, "group_by": "example"},
        **data,
    }
    return config


def assert_bad_input(result, *expected: str) -> str:
    output = result.output
    assert result.returncode == 2, output
    assert "Traceback" not in output
    assert output.startswith("error: ") or "\nerror: " in output, output
    for text in expected:
        assert text in output, f"{text!r} not in {output!r}"
    return output


# -- a good run ---------------------------------------------------------------------------------


def test_train_prints_epochs_and_one_test_accuracy(tmp_path):
    result = run_train(write_config(tmp_path, TINY))
    assert result.returncode == 0, result.output
    lines = result.output.splitlines()
    epochs = [m for m in map(EPOCH_LINE.match, lines) if m]
    assert [(int(m[1]), int(m[2])) for m in epochs] == [(1, 2), (2, 2)]
    for match in epochs:
        for group in (4, 6):  # train and dev accuracy, in percent
            assert 0.0 <= float(match[group]) <= 100.0
        for group in (3, 5):  # train and dev loss
            assert 0.0 < float(match[group]) < 10.0
    tests = [m for m in map(TEST_LINE.match, lines) if m]
    assert len(tests) == 1, result.output
    assert len([line for line in lines if line.startswith("test accuracy")]) == 1
    assert 0.0 <= float(tests[0][1]) <= 100.0
    assert [part.split()[0] for part in tests[0][2].split(", ")] == [
        "entailment",
        "neutral",
        "contradiction",
    ]
    assert re.search(r"^best dev accuracy \d+\.\d\d% at epoch [12]$", result.output, re.M)


def test_train_jsonl_corpus_with_vectors(tmp_path):
    (tmp_path / "vectors.txt").write_text(
        "a 0.1 0.2 0.3 0.4\nman 0.5 0.1 0.0 0.2\nperson 1 2 3 4\n"
    )
    config = jsonl_config(
        tmp_path, embedding_dim=4, vectors={"source": str(tmp_path / "vectors.txt")}
    )
    result = run_train(write_config(tmp_path, config))
    assert result.returncode == 0, result.output
    assert result.output.startswith("data: ") and "vectors" in result.output.splitlines()[0]
    assert len(re.findall(r"^test accuracy ", result.output, re.M)) == 1


def test_checkpoint_and_resume(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    first = run_train(write_config(tmp_path, TINY), "--checkpoint-dir", checkpoints)
    assert first.returncode == 0, first.output
    assert (checkpoints / "checkpoint.pt").is_file()

    longer = write_config(tmp_path, merged(TINY, training={"epochs": 3}), "longer.yaml")
    resumed = run_train(longer, "--checkpoint-dir", checkpoints, "--resume")
    assert resumed.returncode == 0, resumed.output
    assert "resumed after epoch 2" in resumed.output
    epochs = [m[1] for m in map(EPOCH_LINE.match, resumed.output.splitlines()) if m]
    assert epochs == ["3"]

    assert_bad_input(run_train(longer, "--resume"), "--resume needs --checkpoint-dir")
    assert_bad_input(
        run_train(longer, "--checkpoint-dir", tmp_path / "empty", "--resume"),
        "no checkpoint to resume",
        str(tmp_path / "empty"),
    )


def test_refit_trains_on_train_plus_dev_and_tests_the_final_weights(tmp_path):
    """`--refit EPOCHS`: a refit sweep's protocol; its equality with the sweep's own test number
    is tested in test_sweep_protocol."""
    config = write_config(tmp_path, TINY)
    result = run_train(config, "--refit", 2)
    assert result.returncode == 0, result.output
    assert "refit on train + dev (135 pairs): 2 epochs, no early stopping" in result.output
    assert re.search(r"^test accuracy \d+\.\d{2}% \(final weights of the refit; entailment ",
                     result.output, re.M)
    assert not EPOCH_LINE.search(result.output) and "best-on-dev" not in result.output
    assert_bad_input(run_train(config, "--refit", 1, "--checkpoint-dir", tmp_path / "c"),
                     "--refit trains from scratch")
    no_dev = jsonl_config(tmp_path)
    del no_dev["data"]["dev_holdout"]
    no_dev["data"]["splits"] = ["train", "test"]
    assert_bad_input(run_train(write_config(tmp_path, no_dev, "no_dev.yaml"), "--refit", 1),
                     "refit on train + dev needs dev and test splits")
    assert run_train(config, "--refit", 0).returncode == 2


# -- bad input: the config ----------------------------------------------------------------------


def test_unknown_model_lists_the_registered_ones(tmp_path):
    config = merged(TINY, model={**TINY["model"], "name": "decomposible"})
    output = assert_bad_input(run_train(write_config(tmp_path, config)), "run.yaml", "model")
    assert "unknown model 'decomposible'" in output
    assert "{'name'" not in output  # the message is not buried under a dump of the block
    for name in model_names():
        assert name in output


def test_unknown_variant_lists_the_valid_ones(tmp_path):
    config = merged(TINY, model={**TINY["model"], "variant": "intra_sentence"})
    assert_bad_input(
        run_train(write_config(tmp_path, config)),
        "unknown variant 'intra_sentence'",
        "valid variants: vanilla, intra",
    )


@pytest.mark.parametrize(
    ("block", "values", "path"),
    [
        ("training", {"learning_rate": 0.1}, "training.learning_rate"),
        ("data", {"toy": {"size": 150, "sedd": 1}}, "data.toy.sedd"),
        ("model", {**TINY["model"], "arguments": {}}, "model.arguments"),
        ("top", 1, "top"),
    ],
)
def test_unknown_key_names_the_field_path(tmp_path, block, values, path):
    config = merged(TINY, **{block: values})
    assert_bad_input(run_train(write_config(tmp_path, config)), f"run.yaml: {path}: unknown key")


def test_unknown_model_argument_is_named(tmp_path):
    args = {**TINY["model"]["args"], "hidden_sise": 8}
    config = merged(TINY, model={**TINY["model"], "args": args})
    assert_bad_input(run_train(write_config(tmp_path, config)), "hidden_sise", "allowed:")


def test_negative_lr_names_training_lr(tmp_path):
    config = merged(TINY, training={"lr": -0.1})
    assert_bad_input(
        run_train(write_config(tmp_path, config)),
        "run.yaml: training.lr:",
        "greater than 0",
        "-0.1",
    )


def test_missing_config_file(tmp_path):
    assert_bad_input(run_train(tmp_path / "nope.yaml"), "nope.yaml", "no such file")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_device_without_cuda(tmp_path):
    config = merged(TINY, training={"device": "cuda"})
    assert_bad_input(
        run_train(write_config(tmp_path, config)), "training.device='cuda'", "CUDA is not available"
    )


# -- bad input: the data ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "index,line,expected",
    [
        (3, '{"premise": "a man is sleeping", "hypothesis": ', ["{file}:4:", "malformed JSON"]),
        (6, json.dumps({"premise": "a man", "label": "neutral"}), ["{file}:7:", "'hypothesis'"]),
        (
            4,
            json.dumps({"premise": "a man", "hypothesis": "a person", "label": "entails"}),
            ["unknown label 'entails'", "{file}:5:", "entailment, neutral, contradiction"],
        ),
    ],
    ids=["malformed_json", "missing_field", "unknown_label"],
)
def test_bad_corpus_line_names_file_and_line(tmp_path, index, line, expected):
    """Line `index` of the good train.jsonl replaced by `line`: the error names the file, the
    line number and what is wrong."""
    config = jsonl_config(tmp_path, train="bad.jsonl")
    lines = (tmp_path / "train.jsonl").read_text().splitlines()
    lines[index] = line
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    assert_bad_input(
        run_train(write_config(tmp_path, config)), *(e.format(file=bad) for e in expected)
    )


def test_missing_corpus_file_is_named(tmp_path):
    config = jsonl_config(tmp_path, train="absent.jsonl")
    assert_bad_input(run_train(write_config(tmp_path, config)), str(tmp_path / "absent.jsonl"))


def test_missing_vectors_file_is_named(tmp_path):
    missing = tmp_path / "glove" / "glove.6B.50d.txt"
    config = jsonl_config(tmp_path, vectors={"source": str(missing)})
    assert_bad_input(run_train(write_config(tmp_path, config)), str(missing), "not found")


def test_vectors_dimension_mismatch_with_model_embedding_dim(tmp_path):
    vectors = tmp_path / "small.50d.txt"
    words = ["a", "man", "is", "sleeping", "person", "dog"]
    vectors.write_text("".join(f"{w} " + " ".join(["0.25"] * 5) + "\n" for w in words))
    config = jsonl_config(tmp_path, embedding_dim=8, vectors={"source": str(vectors)})
    output = assert_bad_input(run_train(write_config(tmp_path, config)), str(vectors))
    assert "model.args.embedding_dim=8" in output and "dimension 5" in output


def test_vectors_dimension_mismatch_with_vectors_embedding_dim(tmp_path):
    vectors = tmp_path / "small.txt"
    vectors.write_text("a " + " ".join(["0.5"] * 5) + "\n")
    config = jsonl_config(tmp_path, vectors={"source": str(vectors), "embedding_dim": 8})
    assert_bad_input(run_train(write_config(tmp_path, config)), str(vectors), "5-dimensional", "8")
