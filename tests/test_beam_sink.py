"""`--sink beam` (beam_pipeline/job/beam_sink.py): the comparison sink, through
beam.io.WriteToTFRecord, writes the same records as the default shard writer, with the same
accounting."""

import collections
import json

import pytest

from dataset_format import layout, schema
from tests.helpers import build, check_invariants, errors_of, make_images, read_records

ARGS = ["--splits", "train=0.5,validation=0.5", "--num_shards", "2", "--max_error_rate", "0.5",
        "--no_transform"]


def contents(result):
    """split -> sorted [(image/filename, label id, class text, sha256)] of a build."""
    out = collections.defaultdict(list)
    for (split, _), records in read_records(result["version_dir"], result["manifest"]).items():
        for r in records:
            out[split].append((r[schema.FILENAME].decode(), r[schema.LABEL],
                               r[schema.TEXT].decode(), r[schema.SHA256].decode()))
    return {split: sorted(rows) for split, rows in out.items()}


@pytest.mark.slow
def test_beam_sink_writes_the_shard_writers_records_and_accounting(tmp_path):
    src = tmp_path / "src"
    make_images(src, {"cat": 4, "dog": 3, "fox": 2})
    make_images(src, {"dog": {"empty.jpg": b"", "text.jpg": b"not an image\n"}})
    beam = build(src, tmp_path / "beam", "--sink", "beam", *ARGS)
    shards = build(src, tmp_path / "shards", *ARGS)

    m = check_invariants(beam)  # listed = duplicates + failed + written; sizes, sha256s
    assert m["config"]["sink"] == "beam"
    assert m["accounting"] == dict(m["accounting"], listed=11, duplicates=0, failed=2, written=9)
    assert sorted(e["reason"] for e in errors_of(beam)) == ["empty_file", "not_an_image"]
    assert (sorted(errors_of(beam), key=json.dumps)
            == sorted(errors_of(shards), key=json.dumps))
    for split, info in m["splits"].items():
        assert len(info["shards"]) == 2
        assert info["label_counts"] == shards["manifest"]["splits"][split]["label_counts"]
        for shard in info["shards"]:  # one index line per record, as the shard writer writes
            with open(layout.join(beam["version_dir"], layout.index_name(shard["path"]))) as f:
                assert len(f.read().splitlines()) == shard["num_examples"]

    # The same records in each split (WriteToTFRecord picks its own shard and order).
    got = contents(beam)
    assert got == contents(shards)
    assert sum(len(rows) for rows in got.values()) == 9
    for rows in got.values():
        for _, label, text, _ in rows:
            assert m["labels"][label] == text
    assert {name for rows in got.values() for name, *_ in rows} == {
        f"{c}/{i:03d}.jpg" for c, n in (("cat", 4), ("dog", 3), ("fox", 2)) for i in range(n)}
