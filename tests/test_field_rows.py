"""The launcher's per-row work on declared fields: row_text (the check and the values' JSON
text in one pass) gives check_row's errors and values_text's bytes for every kind of row;
the class tally leaves exactly the class names of the images a build keeps; a column the
schema does not declare stops the build with one line."""

import json
import os
import random

import pytest

from beam_pipeline.errors import UserError
from beam_pipeline.launcher import listing, manifests
from beam_pipeline.refs import ImageRef
from dataset_format import field_rows, fields

SCHEMA = fields.from_json({"fields": {
    "caption": {"type": "string"},
    "score": {"type": "float", "required": True},
    "year": "int",
    "keywords": {"type": "list[string]", "max_len": 3},
    "sizes": "list[float]",
    "counts": "list[int]",
    "tags": {"type": "classes", "max_len": 4},
    "objects": {"type": "boxes", "max_len": 2, "classes": ["cat", "dog"]},
}})


def _value(rng, kind):
    """A value for a field of `kind`: mostly valid, sometimes each way it can be wrong."""
    odd = rng.choice([None, "x", 3, 2.5, True, [], [1], ["a"], {"a": 1}, float("nan"), 2**70,
                      -0.0, 1e300, 10**400])
    if rng.random() < 0.15:
        return odd
    if kind == "string":
        return rng.choice(["a cat", "é \"quoted\" \\ \n\t", "", "日本語 😀"])
    if kind == "float":
        return rng.choice([rng.random(), 3, -1e-7, 1e21, 0.1 + 0.2, -0.0])
    if kind == "int":
        return rng.choice([0, -5, 2**63 - 1, -2**63, 12345678901234])
    if kind == "keywords":
        return [rng.choice(["k", "ü", "\u2028"]) for _ in range(rng.randint(0, 4))]
    if kind == "sizes":
        return [rng.choice([0.5, 1, 1e-300, -2.25]) for _ in range(rng.randint(0, 3))]
    if kind == "counts":
        return [rng.choice([0, 200, -1, 2**62]) for _ in range(rng.randint(0, 3))]
    if kind == "tags":
        return rng.sample(["indoor", "cute", "ß", "b", "a"], rng.randint(0, 3)) + (
            ["cute"] if rng.random() < 0.05 else [])
    boxes = []
    for _ in range(rng.randint(0, 3)):
        x0, y0 = rng.choice([0, 0.0, rng.random() * 0.5]), rng.random() * 0.5
        box = {"xmin": x0, "ymin": y0, "xmax": x0 + rng.choice([0.25, 0.5, 0.6, -0.1]),
               "ymax": rng.choice([y0 + 0.25, 1, 1.5]), "label": rng.choice(["cat", "dog",
                                                                          "cow", ""])}
        if rng.random() < 0.05:
            box.pop("ymax")
        boxes.append(box)
    return boxes


KINDS = {"caption": "string", "score": "float", "year": "int", "keywords": "keywords",
         "sizes": "sizes", "counts": "counts", "tags": "tags", "objects": "objects"}


def _outcome(call):
    try:
        return "ok", call()
    except fields.FieldError as e:
        return type(e).__name__, str(e)


def test_row_text_is_check_row_then_values_text_for_any_row():
    rng = random.Random(43)
    kinds, off_path = set(), 0
    for i in range(3000):
        row = {"uri": "a.jpg", "label": "x"}
        for name, kind in KINDS.items():
            if rng.random() < 0.8:
                row[name] = _value(rng, kind)
        if rng.random() < 0.02:
            row["captoin"] = "typo"

        def old():
            values = fields.check_row(SCHEMA, row)
            return fields.values_text(values), [("tags", values["tags"])] if values.get(
                "tags") else []
        want = _outcome(old)
        got = _outcome(lambda: field_rows.row_text(SCHEMA, row))
        assert got == want, row
        kinds.add(want[0])
        off_path += want[0] != "ok"
    # every outcome came up, on the path checked inline and off it
    assert kinds == {"ok", "FieldError", "UndeclaredColumn"}
    assert 300 < off_path < 2700


def test_row_text_reads_csv_cells_as_check_row_does():
    rng = random.Random(5)
    good = {"caption": "a, \"cat\"", "score": "3", "year": "-7", "keywords": '["k"]',
            "sizes": "[1, 2.5]", "counts": "[3]", "tags": '["indoor"]',
            "objects": '[{"xmin": 0.1, "ymin": 0, "xmax": 0.5, "ymax": 0.5, "label": "cat"}]'}
    cells = ["", " ", "3", "3.5", "x", "1e400", "[1, 2]", '["indoor"]', "[", "nan"]
    seen = set()
    for _ in range(2000):
        row = {"uri": "a.jpg", "label": "x", **{
            name: good[name] if rng.random() < 0.9 else rng.choice(cells) for name in KINDS}}
        want = _outcome(lambda: fields.values_text(fields.check_row(SCHEMA, row, text=True)))
        got = _outcome(lambda: field_rows.row_text(SCHEMA, row, True)[0])
        assert got == want, row
        seen.add(want[0])
    assert seen == {"ok", "FieldError"}


def test_row_text_names_an_open_vocabulary_s_classes_only():
    schema = fields.from_json({"fields": {
        "tags": "classes", "objects": {"type": "boxes", "classes": ["cat"], "closed": False},
        "kinds": {"type": "classes", "classes": ["a", "b"]}}})
    box = {"xmin": 0.0, "ymin": 0.0, "xmax": 1.0, "ymax": 1.0, "label": "cow"}
    text, classes = field_rows.row_text(schema, {"uri": "u", "tags": ["p", "q"],
                                                 "objects": [box, dict(box, label="cat")],
                                                 "kinds": ["b"]})
    assert classes == [("tags", ["p", "q"]), ("objects", ["cow", "cat"])]  # kinds is closed
    assert text == ('{"kinds": ["b"], "objects": [{"label": "cow", "xmax": 1.0, "xmin": 0.0, '
                    '"ymax": 1.0, "ymin": 0.0}, {"label": "cat", "xmax": 1.0, "xmin": 0.0, '
                    '"ymax": 1.0, "ymin": 0.0}], "tags": ["p", "q"]}')
    assert field_rows.row_text(schema, {"uri": "u", "tags": []}) == ('{"tags": []}', [])


# --- the tally: which rows' classes reach an open vocabulary ---------------------------------

def _tally_manifest(tmp_path):
    """Rows each dropped at another stage, each with a tag no kept row has."""
    for name in ("a", "b", "c", "d", "big"):
        (tmp_path / f"{name}.jpg").write_bytes(b"\xff\xd8\xff" * (400 if name == "big" else 1))
    rows = [
        {"uri": "a.jpg", "label": "x", "tags": ["kept"], "n": 1},
        {"uri": "a.jpg", "label": "x", "tags": ["zz_duplicate"], "n": 1},  # a duplicate
        {"uri": "b.jpg", "label": "x", "tags": ["kept2"], "n": 2},
        {"uri": "b.jpg", "label": "y", "tags": ["conflict"], "n": 2},  # conflicting label
        {"uri": "c.jpg", "label": "x", "tags": ["bad_n"], "n": "2"},  # bad_field
        {"uri": "gone.jpg", "label": "x", "tags": ["missing"]},  # not_found
        {"uri": "big.jpg", "label": "x", "tags": ["too_large"]},  # over --max_image_mb
        {"uri": "d.jpg", "label": "z", "tags": ["unknown_label"]},  # not in --label_file
        {"uri": "c.jpg", "label": "x", "objects": [  # closed: its names come from the schema
            {"xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1, "label": "cat"}], "tags": []},
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("with_tally", [True, False])
def test_only_kept_images_give_their_classes(tmp_path, with_tally):
    schema = fields.from_json({"fields": {
        "tags": "classes", "n": "int",
        "objects": {"type": "boxes", "classes": ["cat", "dog"]}}})
    path = _tally_manifest(tmp_path)
    tally = field_rows.ClassTally(schema) if with_tally else None
    errors = []
    plan = listing.plan_listing(
        listing.iter_inputs([path], max_bytes=600, schema=schema, tally=tally),
        listing.Fingerprint({}, "0"), {"x", "y"}, str(tmp_path), errors.append,
        schema=schema, tally=tally)
    assert sorted(e.reason for e in errors) == [
        "bad_field", "conflicting_duplicate", "not_found", "too_large", "unknown_label"]
    assert (plan.num_images, plan.duplicates) == (3, 1)
    # of a duplicate pair, the line sorting first is kept (its tags "kept" before "zz_...")
    assert plan.classes_present == {"tags": {"kept", "kept2"}}


# --- a column the schema does not declare ----------------------------------------------------

def test_an_undeclared_column_stops_the_build_naming_it_and_the_schema_file(tmp_path):
    (tmp_path / "schema.yaml").write_text("fields:\n  tags: {type: classes}\n  n: int\n")
    schema = fields.load(str(tmp_path / "schema.yaml"))
    rows = [{"uri": "a.jpg", "label": "x", "tags": ["p"]},
            {"uri": "b.jpg", "label": "x", "tags": ["p"], "caption": "a cat"}]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(UserError) as e:
        list(manifests.list_manifest(str(path), schema))
    assert str(e.value) == (
        f"{path}:2: column 'caption' is not a field of --schema {tmp_path}/schema.yaml "
        "(fields: tags, n); declare it in the schema, or drop the column from the manifest")
    path = tmp_path / "m.csv"
    path.write_text("uri,label,tag\na.jpg,x,[]\n")
    with pytest.raises(UserError) as e:
        list(manifests.list_manifest(str(path), schema))
    assert str(e.value) == (
        f"{path}: column 'tag' is not a field of --schema {tmp_path}/schema.yaml "
        "(fields: tags, n); did you mean 'tags'?; declare it in the schema, or drop the "
        "column from the manifest")
    # check_row itself still says it per row (a FieldError, told apart by its class)
    with pytest.raises(fields.UndeclaredColumn, match="column 'caption': not a field"):
        fields.check_row(schema, rows[1])


def test_a_schema_keeps_its_file_through_its_vocabularies(tmp_path):
    (tmp_path / "s.json").write_text('{"fields": {"tags": "classes"}}')
    schema = fields.load(str(tmp_path / "s.json"))
    assert schema.source == str(tmp_path / "s.json")
    assert schema.with_classes({"tags": ["a"]}).source == schema.source
    assert schema == fields.from_json({"fields": {"tags": "classes"}})  # not compared


def test_a_field_removed_from_the_schema_but_kept_in_the_manifest_exits_2(tmp_path, capsys):
    """The build stops at launch with one line (exit 2) and publishes nothing, instead of
    one bad_field row per image."""
    from beam_pipeline import cli
    from tests.helpers import FAST, image_bytes

    rows = []
    for i in range(3):
        (tmp_path / f"{i}.jpg").write_bytes(image_bytes((10 * i, 0, 0)))
        rows.append({"uri": f"{i}.jpg", "label": "x", "tags": ["p"], "caption": f"c{i}"})
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "schema.yaml").write_text("fields:\n  tags: {type: classes}\n")  # no caption
    code = cli.main(["--input", str(tmp_path / "m.jsonl"), "--output", str(tmp_path / "out"),
                     "--schema", str(tmp_path / "schema.yaml"), *FAST])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert (code, err) == (2, [
        f"error: {tmp_path}/m.jsonl:1: column 'caption' is not a field of --schema "
        f"{tmp_path}/schema.yaml (fields: tags); declare it in the schema, or drop the "
        "column from the manifest"])
    assert not os.path.exists(tmp_path / "out" / "LATEST")


def test_schema_infer_names_a_column_it_could_not_type(tmp_path):
    """A column with no value in any row has no type to infer: the build stops naming it."""
    rows = [{"uri": "a.jpg", "label": "x", "tags": ["p"], "notes": None},
            {"uri": "b.jpg", "label": "x", "tags": [], "notes": None}]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    schema = manifests.infer_schema([str(path)])
    assert schema.names == ("tags",)
    with pytest.raises(UserError) as e:
        list(manifests.list_manifest(str(path), schema))
    assert str(e.value) == (
        f"{path}:1: column 'notes' is not a field of --schema infer (fields: tags); no row "
        "has a value to infer its type from: write a schema file for it, or drop the column")
