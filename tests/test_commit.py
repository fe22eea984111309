"""Commit's steps: the manifest as a pure function of typed values, and the Commit transform in
a TestPipeline over ShardResults (shards renamed, duplicates dropped, LATEST moved)."""

import datetime
import hashlib
import json
import os

import apache_beam as beam
from apache_beam.testing import test_pipeline as beam_test
from apache_beam.testing.util import BeamAssertException, assert_that

from beam_pipeline.job.commit import Commit
from beam_pipeline.job.contracts import CommitSpec, Dedup, Listed
from beam_pipeline.job.contracts import Made, ShardFiles, ShardResult, Sums, Writer, Written
from beam_pipeline.job.manifest import Finalized, build_manifest
from beam_pipeline.store import catalog, files
from dataset_format import frames, layout
from dataset_format.catalog_schema import CatalogRow
from dataset_format.error_record import ErrorRecord

VERSION = "20260401T000000Z"
ERROR = ErrorRecord("x", "decode", "truncated", "Premature end of JPEG file")


def _spec(root, **kw):
    return CommitSpec(**dict(
        root=str(root), version=VERSION, name="c", labels=("cat", "dog"),
        num_shards={"train": 2, "test": 1}, listed=Listed(5, 1, None),
        input_fingerprint="sha256:f", config={"k": 1}, generator={"package": "x"},
        max_error_rate=1.0, write_index=False), **kw)


def test_build_manifest_is_a_function_of_spec_and_finalized_values():
    spec = _spec("/nowhere", increment={"from": "20260301T000000Z", "removed": 1})
    results = (ShardResult("train", 0, kind="reuse", written=Written(2, 30),
                           made=Made(passed_through=1), sums=Sums({"cat": 2}),
                           writer=Writer("a:1")),
               ShardResult("train", 1, kind="images", written=Written(1, 10),
                           made=Made(converted=1), sums=Sums({"dog": 1}), errors=(ERROR,),
                           writer=Writer("a:1")),
               ShardResult(None, None, errors=(ERROR,)))
    entry = {"path": "s", "num_examples": 2, "num_bytes": 30, "sha256": "h", "origin": "hash"}
    done = Finalized(
        results=results,
        shards={"test": [dict(entry, num_examples=0, num_bytes=0)],
                "train": [entry, dict(entry, num_examples=1, num_bytes=10, origin="delta")]},
        errors=(ERROR,) * 2 + (ErrorRecord("y", "read", "not_found", "gone"),),
        catalog_rows=3, longer_sides={24: 2, 30: 1},
        content_duplicates={"groups": 1, "across_splits": 0, "path": "duplicates.jsonl"},
        dropped=1)
    created = datetime.datetime(2026, 4, 1, 12, 30, 5, tzinfo=datetime.timezone.utc)
    m = build_manifest(spec, done, created, parts=({"transform": {"x": 1}},))
    assert m["created_at"] == "2026-04-01T12:30:05Z"
    assert list(m["splits"]) == ["test", "train"]
    assert m["splits"]["train"]["label_counts"] == {"cat": 2, "dog": 1}
    assert m["splits"]["test"]["label_counts"] == {"cat": 0, "dog": 0}
    assert (m["splits"]["train"]["num_examples"], m["splits"]["train"]["num_bytes"]) == (3, 40)
    assert m["accounting"] == {"listed": 5, "duplicates": 2, "failed": 3, "written": 3,
                               "leaks": 0, "passed_through": 1}
    assert m["errors"] == {"path": layout.ERRORS, "count": 3,
                           "by_reason": {"truncated": 2, "not_found": 1}}
    assert m["catalog"] == {"path": layout.CATALOG, "rows": 3}
    assert m["stored_images"] == {"median_longer_side": 24, "max_longer_side": 30}
    assert m["content_duplicates"]["dropped"] == 1
    assert m["incremental"]["reused"] == {"shards": 1, "examples": 2, "bytes": 30}
    assert m["incremental"]["added_shards"] == {"shards": 1, "examples": 1, "bytes": 10}
    assert m["incremental"]["bytes_reused_share"] == 0.75
    assert m["build"] == {"writer_processes": 1, "converted": 1, "reframed": 0,
                          "resumed_shards": 0, "repaired": 0}
    assert m["transform"] == {"x": 1}
    assert build_manifest(spec, done, created, parts=({"transform": {"x": 1}},)) == m


def _temp_shard(tmp, split, shard, payloads):
    """A temp shard of `payloads` (bytes), its catalog fragment -> its ShardResult."""
    final = layout.shard_name("c", split, shard, 2 if split == "train" else 1)
    temp = layout.join(tmp, final + ".attempt")
    data, rows = b"", []
    for position, payload in enumerate(payloads):
        frame = frames.tfrecord_frame(payload)
        rows.append({"key": f"{split}/{shard}/{position}", "uri": "u", "label": "cat",
                     "label_id": 0, "split": split, "shard": shard, "file": final,
                     "position": position, "offset": len(data), "length": len(frame),
                     "sha256": hashlib.sha256(payload).hexdigest(), "height": 4, "width": 6,
                     "input_size": 1, "input_stamp": "0:0", "input_sha256": "00" * 32})
        data += frame
    files.write_bytes(temp, data)
    with catalog.FragmentWriter(temp + layout.FRAGMENT_SUFFIX) as fragment:
        for row in rows:
            fragment.append(CatalogRow.from_dict(row))
    return ShardResult(split, shard, kind="images",
                       files=ShardFiles(path=final, temp=temp,
                                        catalog_temp=temp + layout.FRAGMENT_SUFFIX),
                       written=Written(len(payloads), len(data), frames.file_crc32c(data)),
                       sums=Sums({"cat": len(payloads)}), writer=Writer("h:1"))


def test_commit_transform_drops_content_duplicates_and_publishes(tmp_path):
    spec = _spec(tmp_path / "root", dedup=Dedup(drop_content_duplicates=True))
    os.makedirs(spec.tmp_dir)
    results = [_temp_shard(spec.tmp_dir, "train", 0, [b"a", b"b"]),
               _temp_shard(spec.tmp_dir, "train", 1, [b"c", b"a"]),  # b"a" again: dropped
               ShardResult(None, None, errors=(ERROR,))]

    def check(manifests):
        m = manifests[0]
        got = (m["accounting"], m["content_duplicates"], m["catalog"]["rows"],
               [s["num_examples"] for s in m["splits"]["train"]["shards"]],
               [s["num_examples"] for s in m["splits"]["test"]["shards"]])
        want = ({"listed": 5, "duplicates": 2, "failed": 1, "written": 3, "leaks": 0,
                 "passed_through": 0},
                {"groups": 1, "across_splits": 0, "path": "duplicates.jsonl", "dropped": 1},
                3, [2, 1], [0])
        if got != want:
            raise BeamAssertException(f"{got!r} != {want!r}")

    with beam_test.TestPipeline() as p:
        manifest = p | beam.Create(results).with_output_types(ShardResult) | Commit(spec)
        assert_that(manifest, check)
    train1 = layout.join(spec.vdir, layout.shard_name("c", "train", 1, 2))
    with open(train1, "rb") as f:
        assert f.read() == frames.tfrecord_frame(b"c")
    with open(layout.join(spec.vdir, layout.ERRORS)) as f:
        assert [json.loads(line)["reason"] for line in f] == ["truncated"]
    assert files.read_json(layout.join(spec.root, layout.LATEST))["version"] == VERSION
    assert not os.path.exists(spec.tmp_dir)


def test_catalog_tables_use_the_system_allocator():
    """Arrow's mimalloc pool held tens of MB per thread for a few MB of catalog tables: a
    process that imports the package first allocates them with the system's."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", "import beam_pipeline, pyarrow as pa; "
                          "print(pa.default_memory_pool().backend_name)"],
                         env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "system"


def test_a_shard_entry_has_the_crc32c_or_else_the_sha256_of_a_reused_older_shard():
    from beam_pipeline.job.commit import checksum

    assert checksum(ShardResult("train", 0, written=Written(crc32c="AAAAAA=="))) == {
        "crc32c": "AAAAAA=="}
    assert checksum(ShardResult("train", 0, written=Written(sha256="ab" * 32))) == {
        "sha256": "ab" * 32}
