"""Every spec the project ships (search_spaces/ and the annotated example of docs/sweeps.md) validates as
written and, shrunk with `--set` to one trial of one epoch on toy pairs written in its corpus's
official format (`--data-dir`), sweeps. Four of the shrunk sweeps are the false "comparable"
cases of issue 25, and `orchestrate results --paper` lists each one's differences; the SICK one
is also issue 44's (30 of SICK's 4,906 test pairs, a 4-word file named like the published
word2vec vectors), and the quickstart's (a toy corpus) says why no published row matches it."""

from __future__ import annotations

import hashlib
import json
import re
import struct
import zlib
from pathlib import Path

import pandas as pd
import pytest
import yaml
from testkit.cli import orchestrate

from nli_models.data.toy import make_toy_corpus

# About 15 s a spec (a sweep of one trial, its selection and analysis): 3 minutes in all.
pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[1]
SPACES = sorted((REPO_ROOT / "search_spaces").glob("*.yaml"))
VECTOR_DIM = 8


def annotated_spec(folder: Path) -> Path:
    """docs/sweeps.md's annotated spec (its one YAML block that is a whole spec), as a file."""
    text = (REPO_ROOT / "docs" / "sweeps.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    (spec,) = [b for b in blocks if b.startswith("name:")]
    path = folder / "annotated_spec.yaml"
    path.write_text(spec)
    return path


def write_corpora(folder: Path) -> Path:
    """The toy corpus as SNLI jsonl, SICK.txt and SciTail tsv (the official layouts, under one
    data dir), and a GloVe-style text file with a VECTOR_DIM-d vector for every word."""
    # 300 pairs: the annotated spec carves a 10% dev holdout out of the 10 premises of SNLI dev.
    three, two = make_toy_corpus(300, seed=0), make_toy_corpus(60, seed=0, num_classes=2)
    snli = folder / "snli_1.0"
    snli.mkdir(parents=True)
    words = set()
    for name, split in three.items():
        lines = [
            json.dumps({"gold_label": e.label, "sentence1": e.premise, "sentence2": e.hypothesis,
                        "pairID": e.pair_id})
            for e in split.examples
        ]
        (snli / f"snli_1.0_{name}.jsonl").write_text("\n".join(lines) + "\n")
        words |= {w for e in split.examples for w in f"{e.premise} {e.hypothesis}".split()}
    sick = ["pair_ID\tsentence_A\tsentence_B\tentailment_label\tSemEval_set"]
    sets = {"train": "TRAIN", "dev": "TRIAL", "test": "TEST"}
    for name, split in three.items():
        sick += [
            f"{i}\t{e.premise}\t{e.hypothesis}\t{e.label.upper()}\t{sets[name]}"
            for i, e in enumerate(split.examples, start=len(sick))
        ]
    (folder / "sick").mkdir()
    (folder / "sick" / "SICK.txt").write_text("\n".join(sick) + "\n")
    scitail = folder / "SciTailV1.1" / "tsv_format"
    scitail.mkdir(parents=True)
    for name, split in two.items():
        label = {"entailment": "entails", "not_entailment": "neutral"}
        lines = [f"{e.premise}\t{e.hypothesis}\t{label[e.label]}" for e in split.examples]
        (scitail / f"scitail_1.0_{name}.tsv").write_text("\n".join(lines) + "\n")
    vectors = [f"{w} " + " ".join(f"{(zlib.crc32(w.encode()) >> i) % 7 / 7 - 0.4:.3f}"
                                  for i in range(VECTOR_DIM))
               for w in sorted(words)]
    (folder / "vectors.txt").write_text("\n".join(vectors) + "\n")
    # Issue 44: 4 words, 300-d, under the published word2vec file's name.
    with (folder / MISNAMED_VECTORS).open("wb") as out:
        out.write(b"4 300\n")
        for word in sorted(words)[:4]:
            out.write(word.encode() + b" " + struct.pack("<300f", *[0.01] * 300) + b"\n")
    return folder


MISNAMED_VECTORS = "GoogleNews-vectors-negative300.bin"


def shrunk(spec_path: Path, data_dir: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """`--set`/`--data-dir` options that make `spec_path` one trial of one epoch on the toy
    files of `data_dir`, tracked in one store beside it; `extra` assignments go last (they win)."""
    spec = yaml.safe_load(spec_path.read_text())
    search = spec["search"]
    assignments = [
        "training.epochs=1",
        "search.seeds=[1]",
        "search.max_concurrent_trials=1",
        "search.resources={cpu: 1, gpu: 0}",
        f"search.tracking_uri={store_uri(data_dir)}",
        f"search.storage_path={data_dir.parent / 'ray_results'}",
        "search.space={"
        + ", ".join(f"{k}: {{grid: [{json.dumps(first_value(v))}]}}" for k, v in search.get("space", {}).items())
        + "}",
        "search.sampler=grid",
    ]
    if search.get("configurations"):
        assignments.append(f"search.configurations=[{json.dumps(search['configurations'][0])}]")
    if spec["data"]["corpus"] == "toy":
        assignments.append("data.toy.size=90")
    if spec["data"].get("vectors"):
        assignments += [
            f"data.vectors.source={data_dir / 'vectors.txt'}",
            f"data.vectors.embedding_dim={VECTOR_DIM}",
            f"model.args.embedding_dim={VECTOR_DIM}",
        ]
    options = [option for a in (*assignments, *extra) for option in ("--set", a)]
    return [*options, "--data-dir", str(data_dir)]


def store_uri(data_dir: Path) -> str:
    return f"sqlite:///{data_dir.parent / 'mlruns.db'}"  # one store: its schema is made once


def first_value(domain: dict) -> object:
    kind, values = next(iter(domain.items()))
    return values[0] if isinstance(values, list) else values


# The false "comparable" cases: spec -> (extra --set, paper, differences it must list).
FALSE_COMPARABLE = {
    "sick_abcnn": (
        ("model.args.hidden_size=20", "model.args.filter_width=4",
         "search.configurations=[{variant: abcnn3, num_blocks: 2}]",
         "search.space={lr: {grid: [0.5]}, l2: {grid: [0.0007]}}",
         f"data.vectors.source=DATA_DIR/{MISNAMED_VECTORS}", "data.vectors.embedding_dim=300",
         "model.args.embedding_dim=300"),
        "yin2016",
        ["hidden_size 20 (paper 50)", "filter_width 4 (paper 3)", "lr 0.5 (paper 0.09)",
         "dev_size 30 (paper 495)", "test_size 30 (paper 4,906)",  # toy pairs (300: 240/30/30)
         "vectors GoogleNews-vectors-negative300.bin: 4 words, 300-d, sha256 SHA256 "
         "(paper GoogleNews-vectors-negative300: 3,000,000 words, 300-d)"],
    ),
    "snli_cam": (
        ("model.args.dropout=0.0",),  # the first configuration, made the literal reading
        "gajbhiye2018",
        ["intra_output repeat (paper scale)", "dropout 0.0 (paper 0.4)",
         "vectors_tuned false (paper true)"],
    ),
    "snli_wbw": (
        ("search.space={lr: {grid: [0.1]}}",),
        "rocktaschel2016",
        ["lr 0.1 (paper one of 0.0001, 0.0003, 0.001)",
         "delimiter_id None (paper a delimiter token read before the hypothesis)"],
    ),
    "snli_decomposable": (
        ("training.epochs=2",),
        "parikh2016",
        ["steps_trained"],  # 2 epochs, not 50M steps (the step count depends on the toy split)
    ),
}
# The shrunk spec that matches no published row: the paper, and why its rows say it did not run.
UNMATCHED = {
    "quickstart": ("parikh2016", "dataset is toy, not snli; hidden_size 200 was not run (ran: 50)"),
}
EXTRA = {
    "snli_cam": ("search.configurations=[{variant: full, intra_output: repeat}]",),
    "annotated_spec": ("name=annotated_spec",),  # its own experiment: search_spaces/snli_wbw has one
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_corpora(tmp_path_factory.mktemp("shipped") / "data")


def _cli(args: list[str]):
    return orchestrate(*args)


@pytest.mark.parametrize("spec_path", [*SPACES, "annotated"], ids=lambda p: getattr(p, "stem", p))
def test_spec_validates_as_written_and_sweeps_shrunk(spec_path, data_dir, ray_session, tmp_path):
    if spec_path == "annotated":
        spec_path = annotated_spec(tmp_path)
    as_written = _cli(["validate", str(spec_path), "--no-data"])
    assert as_written.returncode == 0, as_written.output

    name = spec_path.stem
    extra, paper, expected = FALSE_COMPARABLE.get(name, ((), None, []))
    extra = tuple(e.replace("DATA_DIR", str(data_dir)) for e in extra)
    sha256 = hashlib.sha256((data_dir / MISNAMED_VECTORS).read_bytes()).hexdigest()[:12]
    expected = [e.replace("SHA256", sha256) for e in expected]
    options = shrunk(spec_path, data_dir, (*EXTRA.get(name, ()), *extra))
    planned = _cli(["validate", str(spec_path), *options])
    assert planned.returncode == 0, planned.output
    assert "-> 1 trials" in planned.output and re.search(r"  data: .*train \d+", planned.output)

    swept = _cli(["sweep", str(spec_path), *options])
    assert swept.returncode == 0, swept.output
    assert "sweep finished: 1 trial (0 failed)" in swept.output
    experiment = yaml.safe_load(spec_path.read_text())["name"]
    out = tmp_path / "table.parquet"
    if name in UNMATCHED:
        other_paper, why = UNMATCHED[name]
        compared = _cli(["results", experiment, "--tracking-uri", store_uri(data_dir),
                         "--out", str(out), "--paper", other_paper])
        assert compared.returncode == 0, compared.output
        assert "none compared: no row of ours matches a published row" in compared.output
        assert f"- Our approach (vanilla) (Table 1): {why}" in compared.output
        wide = pd.read_parquet(out.with_suffix(f".{other_paper}-table.parquet"))
        assert wide["experiment"].isna().all() and why in set(wide["unmatched_because"])
    if paper is None:
        return
    compared = _cli(["results", experiment, "--tracking-uri", store_uri(data_dir),
                     "--out", str(out), "--paper", paper])
    assert compared.returncode == 0, compared.output
    if name == "sick_abcnn":  # the vectors cover the 4 words of the toy vocabulary they hold
        coverage = re.search(r"vector_coverage (\d+\.\d)% \(paper at least 50%", compared.output)
        assert coverage and 0 < float(coverage[1]) < 50, compared.output
        wide = pd.read_parquet(out.with_suffix(f".{paper}-table.parquet"))
        footnote = wide.set_index("row").loc["ABCNN-3 two-conv, no linguistic features"]
        assert not footnote["comparable"]
        assert set(expected) <= set(json.loads(footnote["differences"]))
    assert "NOT COMPARABLE" in compared.output
    assert "| comparable |" not in compared.output
    listed = compared.output.split("Protocol differences from the paper:")[1]
    for difference in expected:
        assert difference in listed, (difference, compared.output)
