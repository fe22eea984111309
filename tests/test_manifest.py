"""dataset_format/manifest.py: manifest.json as one typed value, read and written byte for byte."""

import dataclasses
import json

import pytest

from dataset_format import dataset_info, layout
from dataset_format.manifest import Accounting, Manifest, ShardEntry, SplitEntry

OLD = {  # a format-3 manifest as a build writes it, with a section and a shard key this
    # code does not model (a newer writer's): both must survive a read and a write
    "format_version": 3, "name": "c", "version": "20260401T000000Z",
    "created_at": "2026-04-01T12:30:05Z", "generator": {"package": "x"},
    "input_fingerprint": "sha256:f", "config": {"k": 1}, "labels": ["cat", "dog"],
    "label_offset": 0, "features": {"image/encoded": "bytes"}, "key_scheme": "relpath",
    "splits": {"train": {"num_examples": 3, "num_bytes": 40,
                         "label_counts": {"cat": 2, "dog": 1},
                         "shards": [{"path": "../20260301T000000Z/c-train.tfrecord-00000-of-00001",
                                     "num_examples": 3, "num_bytes": 40, "crc32c": "AAAAAA==",
                                     "origin": "hash", "future_key": [1, 2]}]}},
    "accounting": {"listed": 5, "duplicates": 1, "failed": 1, "written": 3, "leaks": 0,
                   "passed_through": 1},
    "errors": {"path": "errors.jsonl", "count": 1, "by_reason": {"truncated": 1}},
    "catalog": {"path": "catalog.parquet", "rows": 3},
    "split_map": {"path": "split_map.parquet", "contents": 3},
    "a_future_section": {"x": 1},
    "incremental": {"from": "20260301T000000Z", "removed": 1,
                    "reused": {"shards": 1, "examples": 3, "bytes": 40},
                    "rewritten": {"shards": 0, "examples": 0, "bytes": 0},
                    "added_shards": {"shards": 0, "examples": 0, "bytes": 0},
                    "bytes_reused_share": 1.0},
    "build": {"writer_processes": 1, "converted": 0, "reframed": 0, "resumed_shards": 0,
              "repaired": 0},
    "tfds": {"version": "3.0.0", "files": ["dataset_info.json"]},
}


def test_a_manifest_reads_typed_and_writes_the_same_bytes():
    text = json.dumps(OLD, indent=2) + "\n"
    m = Manifest.from_json(text)
    assert m.to_json() == text
    train = m.splits["train"]
    assert isinstance(train, SplitEntry) and isinstance(train.shards[0], ShardEntry)
    assert (train.shards[0].path, train.shards[0].crc32c, train.shards[0].origin) == (
        "../20260301T000000Z/c-train.tfrecord-00000-of-00001", "AAAAAA==", "hash")
    assert train.shards[0].extra == {"future_key": [1, 2]}
    assert m.accounting == Accounting(listed=5, duplicates=1, failed=1, written=3, leaks=0,
                                      passed_through=1)
    assert m.accounting.listed == m.accounting.written + m.accounting.duplicates + m.accounting.failed
    assert m.catalog.rows == 3 and m.errors.by_reason == {"truncated": 1}
    assert m.incremental.previous == "20260301T000000Z" and m.incremental.bytes_reused_share == 1.0
    assert m.build.writer_processes == 1 and m.has_split_map
    assert m.sections["a_future_section"] == {"x": 1}


def test_it_answers_as_the_json_object_does():
    m = Manifest.from_dict(OLD)
    assert m == OLD and dict(m) == OLD and list(m) == list(OLD)
    assert m["splits"]["train"]["label_counts"] == {"cat": 2, "dog": 1}
    assert m.get("transform") is None and "catalog" in m and "transform" not in m
    with pytest.raises(TypeError):
        m["name"] = "other"  # read-only: a stage that changes it returns a new one
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.name = "other"


def test_sections_added_later_are_written_after_the_keys_it_has():
    m = Manifest.from_dict({k: v for k, v in OLD.items() if k != "tfds"})
    later = m.with_sections({"tfds": OLD["tfds"]}, {"transform": {"x": 1}})
    assert list(later) == list(OLD) + ["transform"]
    assert "tfds" not in m  # the original is unchanged


def test_an_older_manifest_without_optional_parts_round_trips():
    old = {k: OLD[k] for k in ("format_version", "name", "version", "labels", "splits")}
    old["splits"] = {"train": {"num_examples": 3, "shards": [{"path": "a", "num_examples": 3}]}}
    text = json.dumps(old, indent=2) + "\n"
    m = Manifest.from_json(text)
    assert m.to_json() == text
    assert m.catalog is None and m.accounting is None and m.incremental is None
    assert m.splits["train"].num_bytes is None and m.splits["train"].shards[0].crc32c is None


def test_dataset_info_wraps_the_typed_manifest(tmp_path):
    vdir = tmp_path / "versions" / OLD["version"]
    vdir.mkdir(parents=True)
    (vdir / layout.MANIFEST).write_text(json.dumps(OLD, indent=2) + "\n")
    info = dataset_info.info(str(vdir))
    assert isinstance(info.manifest, Manifest) and info.has_catalog and info.has_split_map
    assert info.catalog == layout.join(str(vdir), "catalog.parquet")
    shard = info.split("train").shards[0]
    assert (shard.num_examples, shard.num_bytes, shard.name) == (3, 40, OLD["splits"]["train"]["shards"][0]["path"])
    assert info.labels == ("cat", "dog") and info.catalog_rows == 3


def test_a_real_build_writes_what_the_type_reads_and_writes(built_dataset):
    vdir = dataset_info.resolve(str(built_dataset["root"]))
    text = open(layout.join(vdir, layout.MANIFEST)).read()
    m = Manifest.from_json(text)
    assert m.to_json() == text  # the type and the writer agree on every byte
    assert set(m.sections) <= {"split_map", "stored_images", "content_duplicates",
                               "near_duplicates", "tfds", "transform"}, "a field is untyped"
    a = m.accounting
    assert a.listed == a.written + a.duplicates + a.failed + (a.leaks or 0)
    assert sum(s.num_examples for s in m.splits.values()) == a.written
