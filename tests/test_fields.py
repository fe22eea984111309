"""Declared fields as pure functions: the schema file, the strict check of each value (one
line naming the column and the value), inference, and the Example bytes they become."""

import json
import random

import pytest

from dataset_format import examples, fields
from dataset_format.examples import ListFeature

SCHEMA = fields.from_json({"fields": {
    "caption": {"type": "string"},
    "score": {"type": "float", "required": True},
    "year": "int",
    "keywords": {"type": "list[string]", "max_len": 3},
    "tags": {"type": "classes", "max_len": 4},
    "objects": {"type": "boxes", "max_len": 2, "classes": ["cat", "dog"]},
}})


def _error(row, text=False):
    with pytest.raises(fields.FieldError) as e:
        fields.check_row(SCHEMA, row, text=text)
    return str(e.value)


def test_a_good_row_is_checked_as_it_came():
    row = {"uri": "a.jpg", "label": "x", "caption": "a cat", "score": 3, "year": 2020,
           "keywords": ["k"], "tags": ["indoor", "cute"],
           "objects": [{"xmin": 0, "ymin": 0.1, "xmax": 0.5, "ymax": 1, "label": "cat"}]}
    got = fields.check_row(SCHEMA, row)
    assert got == {"caption": "a cat", "score": 3.0, "year": 2020, "keywords": ["k"],
                   "tags": ["indoor", "cute"],
                   "objects": [{"xmin": 0.0, "ymin": 0.1, "xmax": 0.5, "ymax": 1.0,
                                "label": "cat"}]}
    assert type(got["score"]) is float and type(got["year"]) is int
    assert fields.check_row(SCHEMA, {"uri": "a", "score": 1.5}) == {"score": 1.5}  # optional


@pytest.mark.parametrize("row, message", [
    ({"score": "3"}, "column 'score': expected float, found string: \"3\""),
    ({"score": True}, "column 'score': expected float, found bool: true"),
    ({"score": 1, "year": 2020.0}, "column 'year': expected int, found float: 2020.0"),
    ({"score": 1, "year": "2020"}, "column 'year': expected int, found string: \"2020\""),
    ({"score": 1, "caption": 7}, "column 'caption': expected string, found int: 7"),
    ({}, "column 'score': required, and missing: null"),
    ({"score": 1, "keywords": ["a", "b", "c", "d"]},
     "column 'keywords': 4 values, more than max_len 3: [\"a\", \"b\", \"c\", \"d\"]"),
    ({"score": 1, "keywords": "a"}, "column 'keywords': expected a list (list[string]): \"a\""),
    ({"score": 1, "tags": ["a", "a"]}, "column 'tags': a class is listed twice: [\"a\", \"a\"]"),
    ({"score": 1, "objects": [{"xmin": 0, "ymin": 0, "xmax": 1.2, "ymax": 1, "label": "cat"}]},
     "column 'objects': box xmax 1.2 is outside [0, 1] (coordinates are fractions of the "
     "image's width and height): [{\"xmin\": 0, \"ymin\": 0, \"xmax\": 1.2, \"ymax\": 1, "
     "\"label\": \"cat\"}]"),
    ({"score": 1, "objects": [{"xmin": 0.6, "ymin": 0, "xmax": 0.2, "ymax": 1, "label": "dog"}]},
     "column 'objects': box is inverted: xmin 0.6 > xmax 0.2: [{\"xmin\": 0.6, \"ymin\": 0, "
     "\"xmax\": 0.2, \"ymax\": 1, \"label\": \"dog\"}]"),
    ({"score": 1, "objects": [{"xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1, "label": "cow"}]},
     "column 'objects': class 'cow' is not in the schema's classes: [{\"xmin\": 0, \"ymin\": 0, "
     "\"xmax\": 1, \"ymax\": 1, \"label\": \"cow\"}]"),
    ({"score": 1, "objects": [{"x": 0}]},
     "column 'objects': a box is {xmin, ymin, xmax, ymax, label}, not {\"x\": 0}: [{\"x\": 0}]"),
    ({"score": 1, "captoin": "x"},
     "column 'captoin': not a field of the schema (did you mean 'caption'?): \"x\""),
])
def test_each_bad_value_is_one_line_naming_column_and_value(row, message):
    assert _error(row) == message


def test_csv_cells_are_read_as_the_declared_type():
    row = {"uri": "a.jpg", "score": "2.5", "year": "1999", "caption": "3", "tags": '["a"]',
           "keywords": ""}
    assert fields.check_row(SCHEMA, row, text=True) == {
        "score": 2.5, "year": 1999, "caption": "3", "tags": ["a"]}
    assert _error({"score": "1", "year": "19.5"}, text=True) == \
        "column 'year': not an int: \"19.5\""
    assert _error({"score": "1", "tags": "a|b"}, text=True) == (
        "column 'tags': not a JSON array (a CSV cell of a list or boxes field holds JSON): "
        "\"a|b\"")


@pytest.mark.parametrize("spec, message", [
    ({"fields": {"Caption": "string"}}, "field 'Caption': a field name must match"),
    ({"fields": {"label": "string"}}, "field 'label': a field name must match"),
    ({"fields": {"x": "strin"}}, "type 'strin' is not one of int, float, string, list[int], "
                                 "list[float], list[string], classes, boxes (did you mean "
                                 "'string'?)"),
    ({"fields": {"x": {"type": "int", "max_len": 3}}}, "max_len must be a whole number"),
    ({"fields": {"x": {"type": "classes", "classes": ["a", "a"]}}}, "distinct"),
    ({"fields": {"a": "boxes", "b": "boxes"}}, "fields ['a', 'b'] are both boxes"),
    ({"fields": {"x": {"type": "int", "size": 3}}}, "unknown key 'size'"),
    ({"caption": "string"}, "expected a mapping with one key, fields"),
])
def test_bad_schemas_say_what(spec, message):
    with pytest.raises(ValueError, match=None) as e:
        fields.from_json(spec, "s.yaml")
    assert message in str(e.value) and str(e.value).startswith("s.yaml")


def test_schema_file_yaml_and_json_and_dump_round_trip(tmp_path):
    yaml_file = tmp_path / "s.yaml"
    yaml_file.write_text("fields:\n  caption: string\n  tags: {type: classes, max_len: 4}\n")
    json_file = tmp_path / "s.json"
    json_file.write_text(json.dumps({"fields": {"caption": {"type": "string"},
                                                "tags": {"type": "classes", "max_len": 4}}}))
    a, b = fields.load(yaml_file), fields.load(json_file)
    assert a == b and a.names == ("caption", "tags")
    kept = tmp_path / "kept.yaml"
    kept.write_text(fields.dump(SCHEMA))
    assert fields.load(kept) == SCHEMA
    assert fields.from_json(SCHEMA.to_json()) == SCHEMA
    with pytest.raises(ValueError, match="cannot read it"):
        fields.load(tmp_path / "none.yaml")


def test_inferred_from_rows():
    rows = [{"uri": "a", "label": "x", "caption": "c", "n": 1, "w": 2, "tags": ["a", "b"],
             "boxes": [{"xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1, "label": "cat"}]},
            {"uri": "b", "label": "x", "n": 3, "w": 2.5, "tags": ["c", "d", "e"], "boxes": []}]
    got = fields.infer(rows)
    assert got.to_json() == {"fields": {
        "caption": {"type": "string"}, "n": {"type": "int"}, "w": {"type": "float"},
        "tags": {"type": "classes", "max_len": 3}, "boxes": {"type": "boxes", "max_len": 1}}}
    assert fields.infer([{"uri": "a", "n": "1", "f": "0.5", "t": "x"}], text=True).to_json() == {
        "fields": {"n": {"type": "int"}, "f": {"type": "float"}, "t": {"type": "string"}}}
    with pytest.raises(ValueError, match="column 'n': values of several types"):
        fields.infer([{"n": 1}, {"n": "a"}])


def test_example_features_match_tensorflow_bytes():
    """Field features serialize exactly as TensorFlow does, and parse back whole."""
    import tensorflow as tf

    schema = SCHEMA.with_classes({"tags": ["cute", "indoor"]})
    values = fields.check_row(schema, {
        "score": 0.25, "year": -3, "caption": "ü", "keywords": [], "tags": ["indoor"],
        "objects": [{"xmin": 0.1, "ymin": 0.2, "xmax": 0.3, "ymax": 0.4, "label": "dog"},
                    {"xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1, "label": "cat"}]})
    features = fields.features(schema, values)
    assert features["image/object/class/label"] == ListFeature("int64", (2, 1))  # from 1
    assert features["tags/label"] == ListFeature("int64", (1,))                   # from 0
    ours = examples.serialize_example({"image/class/label": 3, **features})
    parsed = tf.train.Example.FromString(ours)
    assert parsed.SerializeToString(deterministic=True) == ours
    feature = parsed.features.feature
    assert list(feature["image/object/bbox/xmin"].float_list.value) == pytest.approx([0.1, 0.0])
    assert list(feature["image/object/class/text"].bytes_list.value) == [b"dog", b"cat"]
    assert list(feature["keywords"].bytes_list.value) == []
    back = examples.parse_features(ours)
    assert back["year"] == ListFeature("int64", (-3,))
    assert back["image/class/label"] == ListFeature("int64", (3,))
    assert back["caption"] == ListFeature("bytes", ("ü".encode(),))
    assert back["image/object/bbox/ymax"].values == pytest.approx((0.4, 1.0))
    assert examples.serialize_example(back) == ours  # the way back, byte for byte
    assert examples.parse_example(ours)["image/class/label"] == 3


def _tf_example(features):
    """{key: ListFeature | bytes | int} -> the same Example built with tf.train's protos."""
    import tensorflow as tf

    def one(value):
        kind, values = (value.kind, value.values) if isinstance(value, ListFeature) else (
            "bytes" if isinstance(value, bytes) else "int64", (value,))
        if kind == "bytes":
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        if kind == "int64":
            return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))

    return tf.train.Example(features=tf.train.Features(
        feature={key: one(value) for key, value in features.items()}))


def test_encoded_fields_are_tensorflows_bytes_for_every_type():
    """The writer's per-schema encoder (fields.encoded) gives the bytes TensorFlow
    serializes for the same Example, for every field type: one-byte and longer lengths,
    ids past 127, negative and int64-extreme ints, empty lists, absent fields."""
    rng = random.Random(7)
    vocabulary = [f"c{i}" for i in range(200)]
    schema = fields.from_json({"fields": {
        "caption": "string", "score": "float", "year": "int", "nums": "list[int]",
        "ratios": "list[float]", "keywords": "list[string]", "tags": "classes",
        "objects": {"type": "boxes", "classes": vocabulary}}}).with_classes({"tags": vocabulary})

    def text():
        return "".join(rng.choice("aü€") for _ in range(rng.choice([0, 3, 50, 200, 6000])))

    def box():
        (x0, x1), (y0, y1) = sorted([rng.random(), rng.random()]), sorted([rng.random(), 1])
        return {"xmin": x0, "ymin": y0, "xmax": x1, "ymax": y1,
                "label": rng.choice(vocabulary[:rng.choice([3, 200])])}

    image = {"image/encoded": bytes(range(256)) * 20, "image/class/label": 2,
             "image/class/text": b"cat", "image/filename": b"photos/cat/0001.jpg"}
    for n in range(40):
        row = {"caption": text(), "score": rng.uniform(-1e6, 1e6),
               "year": rng.choice([0, 127, 128, -1, 2**63 - 1, -2**63]),
               "nums": [rng.choice([0, 5, 127, 300, -7, 2**40]) for _ in range(rng.randrange(5))],
               "ratios": [rng.random() for _ in range(rng.randrange(4))],
               "keywords": [text() for _ in range(rng.randrange(3))],
               "tags": rng.sample(vocabulary[:rng.choice([4, 200])], rng.randrange(4)),
               "objects": [box() for _ in range(rng.randrange(4))]}
        row = {k: v for k, v in row.items() if n < 2 or rng.random() < 0.8}
        values = fields.check_row(schema, row)
        ours = examples.serialize_example({**image, **fields.encoded(schema, values)})
        theirs = _tf_example({**image, **fields.features(schema, values)})
        assert ours == theirs.SerializeToString(deterministic=True), row
    assert examples.parse_features(ours)["image/class/text"].values == (b"cat",)


def test_encoded_fields_may_not_interleave_with_other_keys():
    """Each field's entries are written as one piece: a key sorting among a field's own
    keys is refused when the encoder is made (no schema can declare one: names have no /)."""
    schema = fields.Schema((fields.Field("tags", "classes", classes=("a",)),
                            fields.Field("tags/m", "int")))
    with pytest.raises(ValueError, match="field 'tags': key 'tags/m' sorts among its keys"):
        fields.encoded(schema, {})


def test_schema_flag_is_checked_before_any_work(tmp_path):
    from beam_pipeline.errors import UserError
    from beam_pipeline.launcher import options

    bad = tmp_path / "s.yaml"
    bad.write_text("fields:\n  tags: {type: clases}\n")
    argv = ["--input", str(tmp_path), "--output", str(tmp_path / "out")]
    with pytest.raises(UserError, match=r"s.yaml: field 'tags': type 'clases' is not one of .*"
                                        r"\(did you mean 'classes'\?\)"):
        options.parse(argv + ["--schema", str(bad)])
    _, build = options.parse(argv)
    assert "schema" not in build.build_config()  # unset: the manifest's config as before
    bad.write_text("fields:\n  tags: {type: classes}\n")
    _, build = options.parse(argv + ["--schema", str(bad)])
    assert build.field_schema().names == ("tags",) and build.build_config()["schema"] == str(bad)


def _manifest(tmp_path, name, text):
    for image in ("a.jpg", "b.jpg", "c.jpg"):
        (tmp_path / image).write_bytes(b"\xff\xd8\xff")
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_manifest_rows_carry_checked_fields_and_bad_rows_become_errors(tmp_path):
    from beam_pipeline.launcher.manifests import list_manifest
    from beam_pipeline.refs import ImageRef
    from dataset_format.error_record import ErrorRecord

    schema = fields.from_json({"fields": {"n": "int", "tags": "classes"}})
    path = _manifest(tmp_path, "m.jsonl", "".join(json.dumps(r) + "\n" for r in [
        {"uri": "a.jpg", "label": "x", "n": 1, "tags": ["p"]},
        {"uri": "b.jpg", "label": "x", "n": "1"},
        {"uri": "c.jpg", "label": "x"}]))
    items = list(list_manifest(path, schema))
    refs = sorted((i.key, i.fields) for i in items if isinstance(i, ImageRef))
    # the values ride as JSON text, keys sorted: the launcher hands it on unparsed
    assert refs == [("a.jpg", '{"n": 1, "tags": ["p"]}'), ("c.jpg", "{}")]
    errors = [i for i in items if isinstance(i, ErrorRecord)]
    assert errors == [ErrorRecord(str(tmp_path / "b.jpg"), "read", "bad_field",
                                  f"{path}:2: column 'n': expected int, found string: \"1\"")]
    # without a schema, further columns are ignored as before, and refs carry no fields
    assert all(i.fields is None for i in list_manifest(path))


def test_csv_header_names_only_declared_fields(tmp_path):
    from beam_pipeline.errors import UserError
    from beam_pipeline.launcher.manifests import list_manifest
    from beam_pipeline.refs import ImageRef

    schema = fields.from_json({"fields": {"n": "int"}})
    path = _manifest(tmp_path, "m.csv", "uri,label,n,colour\na.jpg,x,1,red\n")
    with pytest.raises(UserError, match=r"m.csv: column 'colour' is not a field of the schema "
                                        r"\(fields: n\); declare it in the schema, or drop "):
        list(list_manifest(path, schema))
    path = _manifest(tmp_path, "m2.csv", "uri,label,n\na.jpg,x,7\nb.jpg,x,\n")
    got = {i.key: fields.values_from_text(i.fields) for i in list_manifest(path, schema)
           if isinstance(i, ImageRef)}
    assert got == {"a.jpg": {"n": 7}, "b.jpg": {}}  # a CSV cell as its type; empty: absent


def test_schema_infer_prints_what_it_builds_with(tmp_path, capsys):
    from beam_pipeline.launcher import options, prepare

    path = _manifest(tmp_path, "m.jsonl", "".join(json.dumps(r) + "\n" for r in [
        {"uri": "a.jpg", "label": "x", "score": 0.5, "tags": ["p", "q"]},
        {"uri": "b.jpg", "label": "x", "score": 1, "caption": "hi"}]))
    _, build = options.parse(["--input", path, "--output", str(tmp_path / "o"),
                              "--schema", "infer"])
    schema = prepare.field_schema(build)
    printed = capsys.readouterr().out
    assert schema.to_json() == {"fields": {"score": {"type": "float"},
                                           "tags": {"type": "classes", "max_len": 2},
                                           "caption": {"type": "string"}}}
    kept = tmp_path / "kept.yaml"
    kept.write_text(printed)  # the printed text is a schema file as it is
    assert fields.load(kept) == schema


def test_record_problems_name_what_a_stored_record_breaks():
    schema = SCHEMA.with_classes({"tags": ["a", "b"]})
    good = fields.check_row(schema, {"score": 1, "tags": ["b"], "objects": [
        {"xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1, "label": "dog"}]})
    features = fields.features(schema, good)
    image_keys = {"image/encoded"}
    assert fields.record_problems(schema, features, image_keys) == []
    bad = dict(features, **{"tags/label": ListFeature("int64", (0,))})
    assert fields.record_problems(schema, bad, image_keys) == [
        "field 'tags': class id 0 is not 'b' in the manifest's vocabulary"]
    bad = dict(features, **{"image/object/bbox/xmax": ListFeature("float", (1.5,))})
    assert fields.record_problems(schema, bad, image_keys)[0].startswith(
        "field 'objects': box 0 {'xmin': 0.0, 'ymin': 0.0, 'xmax': 1.5, 'ymax': 1.0} is outside")
    bad = {k: v for k, v in features.items() if k != "score"}
    assert fields.record_problems(schema, dict(bad, colour=ListFeature("bytes", ())),
                                  image_keys) == [
        "feature 'colour' is not a declared field's key", "field 'score' is required and missing"]
