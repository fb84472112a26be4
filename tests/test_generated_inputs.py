"""Issue 27 item 8: generated bad input (hypothesis) for the three ways input reaches the tool:
spec mappings (`validate SPEC --no-data`), `--set` overrides, and SLURM submit options
(`submit SPEC --slurm --dry-run`). Every input must end in exit 0 or 2, an error as one line
`error: ...` with no traceback, and nothing written for a rejected one; a printed batch script
must be sound, which a mutation check shows the property can tell (issue 44: it must fail with the
partition's validation switched off). tests/test_bad_inputs.py stays the hand-written regression
list.

The CLI runs in this process (click's CliRunner on orchestrator.cli.orchestrate:main): thousands of
subprocesses would take minutes of imports, and these commands touch no Ray, store or data.
At least GENERATED inputs per run in total (counted, not assumed)."""

from __future__ import annotations

import copy
import hashlib
import subprocess
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from testkit.toy import tiny_config

from orchestrator.cli.orchestrate import main

GENERATED = 2_000
PER_TEST = {"spec": 800, "set": 700, "submit": 600}
SETTINGS = settings(max_examples=max(PER_TEST.values()), deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))
SERVER = "http://mlflow.cluster.example:5000"
KEYS = [
    "name", "model", "model.name", "model.variant", "model.args", "model.args.hidden_size",
    "model.args.dropout", "data", "data.corpus", "data.toy", "data.toy.size", "data.data_dir",
    "data.splits", "training", "training.lr", "training.epochs", "training.batch_size",
    "training.optimizer", "training.l2", "training.grad_clip", "training.patience", "search",
    "search.sampler", "search.space", "search.space.lr", "search.space.lr.grid",
    "search.space.lr.loguniform", "search.space.dropout", "search.seeds", "search.resources",
    "search.resources.cpu", "search.resources.gpu", "search.max_concurrent_trials",
    "search.time_budget_s", "search.num_samples", "search.tracking_uri", "search.storage_path",
    "search.metric", "search.mode", "search.scheduler", "search.max_failures", "search.protocol",
]
counts = dict.fromkeys(PER_TEST, 0)

# No lone surrogates: a file cannot be written with one, and a command line yields only those of
# undecodable bytes (U+DC80-U+DCFF, which the real process handles: checked by hand).
chars = st.characters(blacklist_categories=("Cs",))
# No subnormal floats: the trainer turns on flush-to-zero for the process (torch.set_flush_denormal,
# CPU speed), so after any in-process training in the suite hypothesis cannot generate them.
scalars = (st.none() | st.booleans() | st.integers(-10**12, 10**12)
           | st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False)
           | st.text(chars, max_size=20))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(chars, max_size=8), inner, max_size=3), max_leaves=6)
keys = st.sampled_from(KEYS) | st.text(chars, max_size=12)
# Text that reaches options: printable, control characters (newlines), shell marks, unicode;
# no NUL, which no command line can hold (argv entries are C strings).
argv_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                    max_size=24)
option_text = argv_text | st.sampled_from(
    ["gpu", "gpu\ntouch /tmp/x", "a b", "$(id)", "`id`", "a;b", "--nodes=9", "", " ", "%j",
     "1:00:00", "0", "-1", "1-00:00:00", "\x7f", "é", "../..", "/tmp/x y"])


def _base(folder: Path) -> dict:
    spec = tiny_config(name="generated")
    spec["search"] = {"sampler": "grid", "space": {"lr": {"grid": [0.01, 0.001]}}, "seeds": [1],
                      "resources": {"cpu": 1}, "tracking_uri": SERVER,
                      "storage_path": str(folder / "ray_results")}
    return spec


def _edit(spec: dict, dotted: str, value) -> None:
    *head, last = dotted.split(".")
    node = spec
    for key in head:
        child = node.get(key) if isinstance(node, dict) else None
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[last] = value


def _digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    folder = tmp_path_factory.mktemp("generated")
    (folder / "spec.yaml").write_text(yaml.safe_dump(_base(folder), sort_keys=False))
    return folder


def _check(workspace: Path, args: list[str], kind: str) -> int:
    """Run `orchestrate ARGS`; assert the contract; returns the exit code."""
    counts[kind] += 1
    before = _digest(workspace)
    env = {"RAY_ADDRESS": None, "MLFLOW_TRACKING_URI": None, "XDG_CACHE_HOME": str(workspace / "cache")}
    result = CliRunner(env=env).invoke(main, args, catch_exceptions=True)
    shown = f"orchestrate {args!r} -> {result.exit_code}\n{result.stderr}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(shown) from result.exception
    assert result.exit_code in (0, 2), shown
    assert "Traceback" not in result.stdout + result.stderr, shown
    if result.exit_code == 2:
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, shown
        assert result.stdout == "", shown
    assert _digest(workspace) == before, f"something was written: {shown}"
    return result.exit_code


def test_generated_spec_mappings(workspace):
    spec_path = workspace / "mutated" / "spec.yaml"
    spec_path.parent.mkdir(exist_ok=True)

    @SETTINGS
    @given(edits=st.lists(st.tuples(keys, values), min_size=1, max_size=3),
           raw=st.none() | st.text(chars, max_size=60))
    def check(edits, raw):
        spec = copy.deepcopy(_base(workspace))
        for dotted, value in edits:
            _edit(spec, dotted, value)
        spec_path.write_text(raw if raw is not None else yaml.safe_dump(spec, allow_unicode=True))
        _check(workspace, ["validate", str(spec_path), "--no-data"], "spec")

    check()
    assert counts["spec"] >= PER_TEST["spec"]


def test_generated_set_overrides(workspace):
    assignment = (st.tuples(keys, values).map(
        lambda kv: f"{kv[0]}={yaml.safe_dump(kv[1], default_flow_style=True).strip()}")
        | argv_text).filter(lambda text: "\x00" not in text)

    @SETTINGS
    @given(assignments=st.lists(assignment, min_size=1, max_size=3),
           data_dir=st.none() | option_text)
    def check(assignments, data_dir):
        args = ["validate", str(workspace / "spec.yaml"), "--no-data"]
        args += [part for text in assignments for part in ("--set", text)]
        if data_dir is not None:
            args += ["--data-dir", data_dir]
        _check(workspace, args, "set")

    check()
    assert counts["set"] >= PER_TEST["set"]


def _submit_options() -> tuple[list[str], list[str]]:
    """Every option of `submit` (value options, flags), read from the command itself: an option
    added later is generated too. --slurm and --dry-run are always given; --help prints no script."""
    from orchestrator.cli.cluster_commands import submit_command

    options = [p for p in submit_command.params if isinstance(p, click.Option)]
    names = {p.opts[0]: p.is_flag for p in options if p.opts[0] not in ("--slurm", "--dry-run", "--help")}
    return sorted(n for n, flag in names.items() if not flag), sorted(n for n, flag in names.items() if flag)


SUBMIT_OPTIONS, SUBMIT_FLAGS = _submit_options()
INJECTION = "gpu\ntouch pwned"  # issue 27: ended the #SBATCH block, ran `touch` on the node


def _sound_batch_script(script: str) -> None:
    """What no option value may break: the header (up to the first blank line) is the shebang,
    `#SBATCH OPTION` lines of one option each and comments, so sbatch reads every directive and
    no value runs as a command before the settings; and bash parses the whole script."""
    header = script.split("\n\n", 1)[0].splitlines()
    assert header[0] == "#!/bin/bash", script
    for line in header[1:]:
        assert line.startswith("#"), f"a command in the #SBATCH block: {line!r}\n{script}"
        if line.startswith("#SBATCH"):
            assert len(line.split()) == 2, f"not one option: {line!r}"
    syntax = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr + script


def submit_property(workspace: Path, checks: settings = SETTINGS):
    """The property of `submit --slurm --dry-run` with generated options: the contract of _check,
    and a printed script that is sound (_sound_batch_script)."""

    @checks
    @given(options=st.lists(st.tuples(st.sampled_from(SUBMIT_OPTIONS), option_text), max_size=4),
           flags=st.lists(st.sampled_from(SUBMIT_FLAGS), max_size=2, unique=True))
    @example(options=[("--partition", INJECTION)], flags=[])
    def check(options, flags):
        args = ["submit", str(workspace / "spec.yaml"), "--slurm", "--dry-run", *flags]
        args += [part for option, value in options for part in (option, value)]
        code = _check(workspace, args, "submit")
        if code == 0:  # a script was printed: no value may have broken out of its place
            _sound_batch_script(CliRunner(env={"MLFLOW_TRACKING_URI": None}).invoke(main, args).stdout)

    return check


def test_generated_submit_options(workspace):
    assert {"--setup", "--max-requeues", "--partition", "--set", "--env"} <= set(SUBMIT_OPTIONS)
    assert {"--requeue", "--resume", "--new"} <= set(SUBMIT_FLAGS)
    submit_property(workspace)()
    assert counts["submit"] >= PER_TEST["submit"]


def test_the_submit_property_fails_when_the_partition_check_is_off(workspace, monkeypatch):
    """A mutation check: with the partition's validation switched off, the injection passes
    `submit`, and the property must catch it (a property that cannot fail proves nothing)."""
    from orchestrator.cluster import slurm

    checked = slurm.check_name
    monkeypatch.setattr(slurm, "check_name",
                        lambda option, value: None if option == "--partition" else checked(option, value))
    with pytest.raises(AssertionError, match="a command in the #SBATCH block: 'touch pwned'"):
        submit_property(workspace, settings(SETTINGS, max_examples=1))()


def test_at_least_the_promised_number_of_inputs():
    assert sum(PER_TEST.values()) >= GENERATED
