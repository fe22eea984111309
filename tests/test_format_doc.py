"""docs/format.md against the code and a real build: every manifest field it names is in
the manifest a build writes (and every field a build writes is named), and its Example-key
and catalog-column tables are the schema's."""

import re

import pytest

from dataset_format import catalog_schema, schema
from tests.helpers import REPO, build, make_images

DOC = (REPO / "docs" / "format.md").read_text()
# Maps whose keys are data (option names, class names, reasons), not format fields.
FREE_FORM = {"config", "generator", "features", "splits.SPLIT.label_counts",
             "errors.by_reason", "transform", "build.workers"}


def section(title):
    return DOC.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def table(title):
    """The first column (`name`) and second column of a section's table rows."""
    return {m[1]: m[2].strip() for m in
            re.finditer(r"^\| `([^`]+)` \| ([^|]+) \|", section(title), re.M)}


def documented_fields():
    return table("manifest.json")


def resolve(manifest, path):
    """Values at a documented path: SPLIT matches every split, [] every list element."""
    values = [manifest]
    for part in path.split("."):
        name, many = (part[:-2], True) if part.endswith("[]") else (part, False)
        values = ([v for d in values for v in d.values()] if name == "SPLIT"
                  else [d[name] for d in values if name in d])
        if many:
            values = [v for lst in values for v in lst]
    return values


def paths(value, prefix=""):
    """Every field path of a manifest, in the doc's notation."""
    if prefix.rstrip(".") in FREE_FORM or not isinstance(value, dict):
        return
    for key, v in value.items():
        name = "SPLIT" if prefix == "splits." else key
        path = prefix + name
        if isinstance(v, list) and v and isinstance(v[0], dict):
            yield path
            for item in v:
                yield from paths(item, path + "[].")
        else:
            yield path
            yield from paths(v, path + ".")


def check(manifest, conditions):
    fields = documented_fields()
    for path, present in fields.items():
        if present in conditions:
            assert resolve(manifest, path), f"docs/format.md names {path}; the build has none"
    undocumented = set(paths(manifest)) - set(fields)
    assert not undocumented, f"written but not in docs/format.md: {sorted(undocumented)}"


def test_the_example_keys_table_is_the_schema():
    types = {"bytes": "string", "int64": "int64"}
    assert {k: types[t] for k, t in table("Example keys").items()} == schema.FEATURES


def test_the_catalog_table_is_the_parquet_schema():
    assert table("catalog.parquet") == {f.name: str(f.type).replace("double", "float64")
                                        for f in catalog_schema.arrow_schema()}


def test_every_manifest_field_of_a_full_build_is_documented_and_present(built_dataset):
    check(built_dataset["manifest"], {"always", "unless `--sink beam`"})


@pytest.mark.slow
def test_incremental_and_near_duplicate_fields_are_documented_and_present(tmp_path):
    make_images(tmp_path / "in", {"cat": 3, "dog": 3})
    args = ("--num_shards", "1", "--near_duplicates")
    build(tmp_path / "in", tmp_path / "ds", *args)
    make_images(tmp_path / "in", {"owl": 1})
    again = build(tmp_path / "in", tmp_path / "ds", *args)
    assert "incremental" in again["manifest"]
    check(again["manifest"], {"always", "unless `--sink beam`", "incremental builds",
                              "with `--near_duplicates`"})
    # (the `transform` part is docs/transform.md's, checked by tests/test_transform.py)
