"""Readers on small fixture files: formats, label sets, and the errors on bad input."""

import json

import pytest

from nli_models.data.readers import (
    Columns,
    Labels,
    read_jsonl,
    read_multinli,
    read_rte,
    read_scitail,
    read_sick,
    read_snli,
    read_tsv,
)

pytestmark = pytest.mark.unit


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def snli_row(label, premise="A man sleeps .", hypothesis="A person rests .", pair_id="p1", **extra):
    return {
        "gold_label": label,
        "sentence1": premise,
        "sentence2": hypothesis,
        "pairID": pair_id,
        **extra,
    }


def test_snli_reads_fields_and_drops_no_consensus_pairs(tmp_path):
    path = write_jsonl(
        tmp_path / "snli.jsonl",
        [
            snli_row("entailment", pair_id="a"),
            snli_row("-", pair_id="b"),
            snli_row("contradiction", hypothesis="Nobody sleeps .", pair_id="c"),
        ],
    )
    split = read_snli(path, name="dev")
    assert split.name == "dev"
    assert split.labels == ("entailment", "neutral", "contradiction")
    assert [e.pair_id for e in split.examples] == ["a", "c"]
    assert split.examples[1].hypothesis == "Nobody sleeps ."
    assert split.meta["skipped_labels"] == 1
    assert split.source == str(path)


def test_multinli_keeps_genre(tmp_path):
    path = write_jsonl(tmp_path / "mnli.jsonl", [snli_row("neutral", genre="fiction")])
    (example,) = read_multinli(path).examples
    assert (example.genre, example.label) == ("fiction", "neutral")


SICK_HEADER = (
    "pair_ID\tsentence_A\tsentence_B\tentailment_label\trelatedness_score\tentailment_AB\t"
    "entailment_BA\tsentence_A_original\tsentence_B_original\tsentence_A_dataset\t"
    "sentence_B_dataset\tSemEval_set"
)


def sick_line(pair_id, label, semeval_set):
    return (
        f"{pair_id}\tA dog runs\tAn animal runs\t{label}\t4.5\tA_entails_B\tB_neutral_A\t"
        f"orig a\torig b\tFLICKR\tFLICKR\t{semeval_set}"
    )


def test_sick_crlf_split_column_and_label_normalisation(tmp_path):
    lines = [
        SICK_HEADER,
        sick_line(1, "ENTAILMENT", "TRAIN"),
        sick_line(2, "NEUTRAL", "TRIAL"),
        sick_line(3, "CONTRADICTION", "TEST"),
        sick_line(4, "NEUTRAL", "TRAIN"),
    ]
    path = tmp_path / "SICK.txt"
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode())
    train, dev, test = (read_sick(path, name) for name in ("train", "dev", "test"))
    assert [e.pair_id for e in train.examples] == ["1", "4"]
    assert [e.label for e in train.examples] == ["entailment", "neutral"]
    assert [e.label for e in dev.examples] == ["neutral"]
    assert [e.label for e in test.examples] == ["contradiction"]
    # no stray carriage return survives in the last column or the text
    assert not any("\r" in e.hypothesis for e in train.examples)
    with pytest.raises(ValueError, match="splits: train, dev, test"):
        read_sick(path, "validation")


def test_sick_unknown_semeval_set_names_line(tmp_path):
    path = tmp_path / "SICK.txt"
    path.write_text(
        "\n".join([SICK_HEADER, sick_line(1, "NEUTRAL", "TRAIN"), sick_line(2, "NEUTRAL", "DEV")])
    )
    with pytest.raises(ValueError, match=r"SICK\.txt:3: unknown SemEval_set 'DEV'"):
        read_sick(path, "train")


def test_scitail_two_classes_no_header(tmp_path):
    path = tmp_path / "scitail_1.0_train.tsv"
    path.write_text(
        "Plants need light.\tPlants require light.\tentails\nA cat.\tWater boils.\tneutral\n"
    )
    split = read_scitail(path)
    assert split.labels == ("entails", "neutral")
    assert [(e.premise, e.label) for e in split.examples] == [
        ("Plants need light.", "entails"),
        ("A cat.", "neutral"),
    ]


def test_rte_reads_labelled_file_and_refuses_unlabelled_test(tmp_path):
    labelled = tmp_path / "dev.tsv"
    labelled.write_text(
        'index\tsentence1\tsentence2\tlabel\n0\tHe said "no".\tHe spoke.\tentailment\n'
        "1\tIt rains.\tIt is dry.\tnot_entailment\n"
    )
    split = read_rte(labelled)
    assert split.labels == ("entailment", "not_entailment")
    assert split.examples[0].premise == 'He said "no".'  # quotes are text, not TSV quoting
    assert [e.pair_id for e in split.examples] == ["0", "1"]
    unlabelled = tmp_path / "test.tsv"
    unlabelled.write_text("index\tsentence1\tsentence2\n0\tIt rains.\tIt is wet.\n")
    with pytest.raises(ValueError, match=r"no column 'label'.*GLUE hides the RTE test labels"):
        read_rte(unlabelled)


def test_generic_tsv_without_header_reads_mnli_sample_format(tmp_path):
    path = tmp_path / "mnli_matched"
    path.write_text(
        "entailment\tThe cat sat .\tA cat sat .\ncontradiction\tIt rains .\tIt is dry .\n"
    )
    split = read_tsv(path, Columns(label=0, premise=1, hypothesis=2), header=False)
    assert [(e.hypothesis, e.label) for e in split.examples] == [
        ("A cat sat .", "entailment"),
        ("It is dry .", "contradiction"),
    ]


def test_generic_jsonl_with_column_and_label_mapping(tmp_path):
    path = write_jsonl(
        tmp_path / "x.jsonl",
        [
            {"p": "A b .", "h": "C d .", "y": "1", "id": "7"},
            {"p": "E .", "h": "F .", "y": "0", "id": "8"},
        ],
    )
    split = read_jsonl(
        path,
        Columns(premise="p", hypothesis="h", label="y", pair_id="id"),
        Labels(("entailment", "not_entailment"), mapped={"1": "entailment", "0": "not_entailment"}),
    )
    assert [(e.label, e.pair_id) for e in split.examples] == [
        ("entailment", "7"),
        ("not_entailment", "8"),
    ]


_NO_SENTENCE2 = {k: v for k, v in snli_row("entailment").items() if k != "sentence2"}


@pytest.mark.parametrize(
    "reader,name,content,error",
    [
        (read_snli, "bad.jsonl", json.dumps(snli_row("entailment")) + "\n\n{not json\n",
         r"bad\.jsonl:3: malformed JSON"),
        (read_snli, "bad.jsonl", json.dumps(snli_row("neutral")) + "\n" + json.dumps(_NO_SENTENCE2) + "\n",
         r"bad\.jsonl:2: malformed line: no field 'sentence2'"),
        (read_rte, "train.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\tonly two\n",
         r"train\.tsv:3: malformed line: 2 tab-separated fields"),
        (read_scitail, "scitail.tsv", "a\tb\tentails\nno tabs here\n",
         r"scitail\.tsv:2: malformed line: 1 tab-separated field\(s\), no column 2"),
        (read_scitail, "x.tsv", b"a\tb\tentails\n\xff\xfe\tb\tneutral\n", r"x\.tsv:2: not valid UTF-8"),
    ],
    ids=["malformed_json", "missing_field", "tsv_field_count", "headerless_tsv_short_line", "invalid_utf8"],
)
def test_bad_line_names_file_and_line(tmp_path, reader, name, content, error):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(ValueError, match=error):
        reader(path)


def test_unknown_label_names_label_location_and_allowed_labels(tmp_path):
    path = write_jsonl(tmp_path / "snli.jsonl", [snli_row("entailment"), snli_row("entails")])
    with pytest.raises(ValueError) as error:
        read_snli(path)
    message = str(error.value)
    assert "'entails'" in message
    assert "snli.jsonl:2" in message
    assert "entailment, neutral, contradiction" in message
