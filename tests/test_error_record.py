"""errors.jsonl's record (dataset_format/error_record.py) and the file commit writes from the
listing's records, the shard writers' file and the results' own (job/errors_file.py)."""

import dataclasses
import json
import os

import pytest

from beam_pipeline.job import errors_file
from beam_pipeline.job.contracts import CommitSpec, Listed, ShardResult
from dataset_format import layout
from dataset_format.error_record import ErrorRecord
from tests.helpers import REPO

# errors.jsonl as the code before ErrorRecord (records as dicts) wrote it from these inputs.
GOLDEN = (
    b'{"detail": "a broken symbolic link, or deleted while listing", "reason": "not_found", '
    b'"stage": "read", "uri": "/in/cat/gone.jpg"}\n'
    b'{"detail": "3221225472 bytes, over --max_image_mb (1024 MiB)", "reason": "too_large", '
    b'"stage": "read", "uri": "/in/caf\\u00e9/b\\u00e4d.jpg"}\n'
    b'{"detail": "its stored record is damaged (\\"x\\": crc) and ...", '
    b'"reason": "damaged_record", "stage": "read", "uri": "gs://b/dog/1.png"}\n'
    b'{"detail": "Premature end of JPEG file", "reason": "truncated", "stage": "decode", '
    b'"uri": "/in/cat/t.jpg"}\n'
    b'{"detail": "89478485 pixels > limit\\ttab", "reason": "bomb", "stage": "convert", '
    b'"uri": "/in/dog/\\u2603.gif"}\n')


def test_errors_jsonl_bytes_are_the_golden_ones(tmp_path):
    """Listing errors (keys in listing order), a shard errors file (--sink beam) and the
    results' records, non-ASCII and escapes included -> the same bytes as before."""
    root, version = str(tmp_path / "root"), "20260101T000000Z"
    vdir = layout.version_dir(root, version)
    os.makedirs(layout.tmp_dir(vdir))
    listing = tmp_path / "listing_errors.jsonl"
    listing.write_text(
        '{"uri": "/in/cat/gone.jpg", "stage": "read", "reason": "not_found", "detail": '
        '"a broken symbolic link, or deleted while listing"}\n'
        '{"uri": "/in/caf\\u00e9/b\\u00e4d.jpg", "stage": "read", "reason": "too_large", '
        '"detail": "3221225472 bytes, over --max_image_mb (1024 MiB)"}\n')
    shard_errors = tmp_path / "shard_errors.jsonl"
    shard_errors.write_text(
        '{"detail": "its stored record is damaged (\\"x\\": crc) and ...", "reason": '
        '"damaged_record", "stage": "read", "uri": "gs://b/dog/1.png"}\n')
    spec = CommitSpec(root=root, version=version, name="g", labels=("cat",),
                      num_shards={"train": 1}, listed=Listed(5, 0, str(listing)),
                      input_fingerprint="sha256:x", config={}, generator={},
                      max_error_rate=1.0, write_index=False)
    results = [
        ShardResult("train", 0, errors=(ErrorRecord("/in/cat/t.jpg", "decode", "truncated",
                                                    "Premature end of JPEG file"),)),
        ShardResult(None, None, errors=(ErrorRecord("/in/dog/\u2603.gif", "convert", "bomb",
                                                    "89478485 pixels > limit\ttab"),))]
    reasons = errors_file.write_errors(results, spec, (str(shard_errors),))
    assert reasons == {"not_found": 1, "too_large": 1, "damaged_record": 1, "truncated": 1,
                       "bomb": 1}
    assert (tmp_path / "root" / "versions" / version / layout.ERRORS).read_bytes() == GOLDEN


def test_a_record_round_trips_and_its_line_is_sorted_ascii():
    record = ErrorRecord("/in/caf\u00e9.jpg", "read", "bad_name", "rename it")
    assert record.to_json() == ('{"detail": "rename it", "reason": "bad_name", "stage": "read", '
                                '"uri": "/in/caf\\u00e9.jpg"}')
    assert ErrorRecord.from_json(record.to_json()) == record
    assert list(record.to_dict()) == ["uri", "stage", "reason", "detail"]
    with pytest.raises(ValueError, match=r"not an errors.jsonl record \(keys \['reason'\]\)"):
        ErrorRecord.from_json('{"reason": "truncated"}')
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.reason = "other"


def test_the_format_doc_example_is_a_record_line():
    """docs/format.md's errors.jsonl example is what ErrorRecord writes, and its key list is
    the record's fields."""
    doc = (REPO / "docs" / "format.md").read_text().split("\n## errors.jsonl\n", 1)[1]
    example = doc.split("```json\n", 1)[1].split("\n```", 1)[0]
    assert ErrorRecord.from_json(example).to_json() == example
    keys = [line.split("`")[1] for line in doc.split("\n\n")[2].splitlines()
            if line.startswith("- `")]
    assert keys == list(ErrorRecord("u", "s", "r", "d").to_dict())
    assert json.loads(example)["stage"] == "decode"
