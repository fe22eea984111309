"""Incremental nights with declared fields: a changed caption or tag on an unchanged image
re-frames its stored record (no decode), its split stays with its content; a field added
to the schema re-frames the images that have a value for it; nothing changed is up to date."""

import json

import pytest

from dataset_format import examples, frames, layout
from tests.helpers import FAST, build, image_bytes

pytestmark = pytest.mark.slow

COLOURS = {"a": (200, 30, 30), "b": (30, 200, 30), "c": (30, 30, 200), "d": (200, 200, 30),
           "e": (30, 200, 200), "f": (200, 30, 200)}


def _write(data, rows, schema):
    (data / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "s.json").write_text(json.dumps({"fields": schema}))


def _records(result):
    """{key: (split, parsed features)} of a published version, every shard read."""
    from dataset_format import dataset_info

    info = dataset_info.info(result["root"], result["version"])
    out = {}
    for split, s in info.splits.items():
        for shard in s.shards:
            with open(shard.path, "rb") as f:
                while (found := frames.read_frame(f, f.tell())) is not None:
                    parsed = examples.parse_features(found[0])
                    out[parsed["image/filename"].values[0].decode()] = (split, parsed)
    return out


def test_field_changes_reframe_never_decode(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for name, colour in COLOURS.items():
        (data / f"{name}.jpg").write_bytes(image_bytes(colour, size=(32, 24)))
    rows = [{"uri": f"{n}.jpg", "label": "x", "caption": f"a {n}", "tags": ["t"]}
            for n in COLOURS]
    schema = {"caption": "string", "tags": "classes"}
    _write(data, rows, schema)
    args = (*FAST, "--schema", data / "s.json", "--max_delta_share", "1",
            "--splits", "train=0.5,validation=0.5")
    first = build(data / "m.jsonl", tmp_path / "ds", *args)
    assert first["manifest"]["build"]["converted"] == len(COLOURS)
    before = _records(first)

    rows[0]["caption"] = "a new caption"
    rows[1]["tags"] = ["t", "u"]
    _write(data, rows, schema)
    second = build(data / "m.jsonl", tmp_path / "ds", *args)
    assert second["manifest"]["build"] == dict(second["manifest"]["build"], converted=0,
                                               reframed=2)
    after = _records(second)
    assert after["a.jpg"][1]["caption"].values == (b"a new caption",)
    assert after["b.jpg"][1]["tags/text"].values == (b"t", b"u")
    assert after["b.jpg"][1]["tags/label"].values == (0, 1)  # "u" appended, "t" keeps 0
    for key, (split, parsed) in before.items():
        assert after[key][0] == split  # the split stays with the content
        assert after[key][1]["image/encoded"] == parsed["image/encoded"]  # the stored bytes
    assert second["manifest"]["fields"]["fields"]["tags"]["classes"] == ["t", "u"]

    assert build(data / "m.jsonl", tmp_path / "ds", *args, expect="up_to_date")

    schema["score"] = {"type": "float"}  # an optional field added, one image has a value
    rows[2]["score"] = 0.5
    _write(data, rows, schema)
    third = build(data / "m.jsonl", tmp_path / "ds", *args)
    assert third["manifest"]["build"] == dict(third["manifest"]["build"], converted=0,
                                              reframed=1)
    assert third["manifest"]["incremental"]["reused"]["examples"] >= 1
    got = _records(third)
    assert got["c.jpg"][1]["score"].values == (0.5,)
    assert "score" not in got["d.jpg"][1]
    import pandas as pd

    cat = pd.read_parquet(f"{third['version_dir']}/{layout.CATALOG}").set_index("key")
    assert cat.loc["c.jpg", "score"] == 0.5 and pd.isna(cat.loc["d.jpg", "score"])
    assert cat.loc["a.jpg", "caption"] == "a new caption"


def test_dropped_content_duplicates_keep_the_fields_of_the_rows_kept(tmp_path):
    """--drop_content_duplicates rewrites a shard from its catalog fragment: the field
    columns and features go with the records kept."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("a", "b", "c"):
        (data / f"{name}.jpg").write_bytes(image_bytes(COLOURS["a" if name != "c" else "c"]))
    rows = [{"uri": f"{n}.jpg", "label": "x", "split": "train", "caption": f"about {n}",
             "tags": [n]} for n in ("a", "b", "c")]
    _write(data, rows, {"caption": "string", "tags": "classes"})
    result = build(data / "m.jsonl", tmp_path / "ds", *FAST, "--schema", data / "s.json",
                   "--drop_content_duplicates")
    assert result["manifest"]["accounting"]["duplicates"] == 1
    got = _records(result)
    assert sorted(got) == ["a.jpg", "c.jpg"]  # b.jpg: a's bytes, the later key
    assert got["c.jpg"][1]["caption"].values == (b"about c",)
    import pandas as pd

    cat = pd.read_parquet(f"{result['version_dir']}/{layout.CATALOG}").set_index("key")
    assert sorted(cat.index) == ["a.jpg", "c.jpg"]
    assert cat.loc["c.jpg", "caption"] == "about c" and list(cat.loc["a.jpg", "tags"]) == ["a"]


def test_a_field_removed_or_retyped_reframes_never_decodes(tmp_path):
    """A field dropped from the schema, or declared with another type whose values the
    manifest still spells, re-frames the records holding a value for it from their stored
    bytes (none decoded); records without one are kept as they are. Then the schema goes
    altogether: the records keep the image's features only."""
    from dataset_format import schema as image_schema

    data = tmp_path / "data"
    data.mkdir()
    for name, colour in COLOURS.items():
        (data / f"{name}.jpg").write_bytes(image_bytes(colour, size=(32, 24)))
    values = {"a": {"caption": "all three", "score": 3, "tags": ["t", "u"]},
              "b": {"caption": "a caption only"}, "c": {"score": 7}, "d": {"tags": ["u"]}}
    rows = [{"uri": f"{n}.jpg", "label": "x", **values.get(n, {})} for n in COLOURS]
    _write(data, rows, {"caption": "string", "score": "int", "tags": "classes"})
    args = ("--max_delta_share", "1", "--splits", "train=0.5,validation=0.5")
    first = build(data / "m.jsonl", tmp_path / "ds", *FAST, "--schema", data / "s.json", *args)
    assert first["manifest"]["build"]["converted"] == len(COLOURS)
    before = _records(first)
    assert before["a.jpg"][1]["tags/label"].values == (0, 1)

    for row in rows:  # caption removed; score int -> float; tags classes -> list[string]
        row.pop("caption", None)
    _write(data, rows, {"score": "float", "tags": {"type": "list[string]", "max_len": 4}})
    second = build(data / "m.jsonl", tmp_path / "ds", *FAST, "--schema", data / "s.json",
                   *args)
    assert second["manifest"]["build"] == dict(second["manifest"]["build"], converted=0,
                                               reframed=4)
    after = _records(second)
    a = after["a.jpg"][1]
    assert "caption" not in a and "tags/label" not in a and "tags/text" not in a
    assert a["score"] == examples.ListFeature("float", (3.0,))
    assert a["tags"] == examples.ListFeature("bytes", (b"t", b"u"))
    assert set(after["b.jpg"][1]) == set(image_schema.FEATURES)  # its only value removed
    assert after["c.jpg"][1]["score"].values == (7.0,)
    assert after["d.jpg"][1]["tags"].values == (b"u",)
    for key, (split, parsed) in before.items():
        assert after[key][0] == split
        assert after[key][1]["image/encoded"] == parsed["image/encoded"]
        if key in ("e.jpg", "f.jpg"):  # no value for any field: kept byte for byte
            assert after[key][1] == parsed
    import pandas as pd
    import pyarrow.parquet as pq

    catalog = f"{second['version_dir']}/{layout.CATALOG}"
    columns = pq.read_schema(catalog)
    assert "caption" not in columns.names and str(columns.field("score").type) == "double"
    cat = pd.read_parquet(catalog).set_index("key")
    assert cat.loc["c.jpg", "score"] == 7.0 and list(cat.loc["a.jpg", "tags"]) == ["t", "u"]

    (data / "m.jsonl").write_text("".join(
        json.dumps({"uri": r["uri"], "label": "x"}) + "\n" for r in rows))
    third = build(data / "m.jsonl", tmp_path / "ds", *FAST, *args)
    assert third["manifest"]["build"] == dict(third["manifest"]["build"], converted=0,
                                              reframed=3)
    assert "fields" not in third["manifest"]
    for key, (split, parsed) in _records(third).items():
        assert set(parsed) == set(image_schema.FEATURES), key
        assert parsed["image/encoded"] == before[key][1]["image/encoded"]
