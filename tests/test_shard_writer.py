"""WriteShardFn in a TestPipeline: ShardTasks in, typed ShardResults out (through their coder),
and the temp shard, its index and catalog fragment agree with the result."""

import hashlib
import io
import pickle

import apache_beam as beam
from apache_beam.testing import test_pipeline as beam_test
from apache_beam.testing.util import BeamAssertException, assert_that

from beam_pipeline.job.contracts import (Made, PixelMoments, ShardFiles, ShardResult, ShardTask,
                                         Sums, Writer, Written)
from beam_pipeline.job.images import EncodeOptions
from beam_pipeline.job.shards import WriteShardFn
from beam_pipeline.refs import ImageRef
from beam_pipeline.store import catalog
from dataset_format import frames, layout
from dataset_format.error_record import ErrorRecord
from tests.helpers import CLASS_COLOURS, image_bytes

LABEL_IDS = {"cat": 0, "dog": 1}


def _task(tmp_path, inputs, shard=0):
    """{key: bytes} -> a ShardTask whose listing names those files, in that order."""
    refs = []
    for key, data in inputs.items():
        path = tmp_path / "in" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        refs.append(ImageRef(key=key, uri=str(path), label=key.split("/")[0], split="train",
                             size=len(data), stamp="15:15"))
    listing = tmp_path / f"listing-{shard}.jsonl"
    listing.write_text("".join(r.to_json() + "\n" for r in refs))
    return ShardTask("train", shard, str(listing))


def _check(expected_keys, moments):
    def check(results):
        if len(results) != 1 or not isinstance(results[0], ShardResult):
            raise BeamAssertException(f"one ShardResult expected, got {results!r}")
        r = results[0]
        with open(r.files.temp, "rb") as f:
            data = f.read()
        offsets, offset, records = [], 0, []
        with io.BytesIO(data) as f:
            while (frame := frames.read_frame(f, offset)) is not None:
                records.append(frame[0])
                offsets.append((offset, frame[1]))
                offset += frame[1]
        with open(r.files.index_temp) as f:
            index = frames.parse_index(f.read())
        rows = list(catalog.iter_rows(r.files.catalog_temp))
        w = r.written
        got = (r.split, r.shard, r.files.path, r.kind, r.origin, w.num_examples, w.num_bytes,
               w.crc32c, w.sha256, r.sums.label_counts, [e.reason for e in r.errors], index,
               [(row["key"], row["position"], row["offset"], row["length"]) for row in rows])
        want = ("train", 0, layout.shard_name("t", "train", 0, 1), "images", "hash",
                len(expected_keys), len(data), frames.file_crc32c(data), None,
                {"cat": 2, "dog": 1}, ["not_an_image"], offsets,
                [(k, i, o, n) for i, (k, (o, n)) in enumerate(zip(expected_keys, offsets))])
        if got != want:
            raise BeamAssertException(f"{got!r}\n!=\n{want!r}")
        if moments and r.sums.pixel_moments.count != 3 * 24 * 16:
            raise BeamAssertException(f"pixel moments {r.sums.pixel_moments!r}")
        if not moments and r.sums.pixel_moments is not None:
            raise BeamAssertException("moments without --transform")
    return check


def test_write_shard_fn_yields_results_that_match_their_files(tmp_path):
    """Without and with --transform's pixel moments: two writers in one pipeline (a
    TestPipeline costs ~2 s to start)."""
    inputs = {"cat/a.jpg": image_bytes(CLASS_COLOURS["cat"]),
              "dog/b.jpg": image_bytes(CLASS_COLOURS["dog"]),
              "cat/broken.jpg": b"not an image",
              "cat/c.jpg": image_bytes((221, 40, 40))}
    task = _task(tmp_path, inputs)
    with beam_test.TestPipeline() as p:
        tasks = p | beam.Create([task])
        for moments in (False, True):
            results = (tasks
                       | f"Write{moments}" >> beam.ParDo(WriteShardFn(
                           str(tmp_path / f"v{moments}" / "tmp"), "t", {"train": 1}, LABEL_IDS,
                           EncodeOptions(), write_index=True, moments=moments))
                       .with_output_types(ShardResult))
            assert_that(results, _check(["cat/a.jpg", "dog/b.jpg", "cat/c.jpg"], moments),
                        label=f"Check{moments}")


def test_shard_task_keeps_the_index_line_format():
    line = '["train", 3, "gs://b/x/listing/train-00003.jsonl", "copy", "delta"]'
    task = ShardTask.from_json(line)
    assert task == ShardTask("train", 3, "gs://b/x/listing/train-00003.jsonl", "copy", "delta")
    assert task.to_json() == line


def test_shard_result_round_trips_through_json():
    result = ShardResult(
        "train", 2, kind="images",
        files=ShardFiles(path="p", temp="t", index_temp="i", catalog_temp="c"),
        written=Written(2, 10, crc32c="AAAAAA=="), made=Made(passed_through=1),
        sums=Sums({"cat": 2}, PixelMoments(4, (1.0, 2.5, 3.0), (9.0, 0.25, 1e20))),
        errors=(ErrorRecord("x", "decode", "truncated", "Premature end"),),
        writer=Writer("h:1"))
    assert ShardResult.from_json(result.to_json()) == result
    assert pickle.loads(pickle.dumps(result)) == result  # Beam may pickle it
    errors_only = ShardResult(None, None, errors=(ErrorRecord("y", "read", "unreadable", "gone"),))
    assert ShardResult.from_json(errors_only.to_json()) == errors_only


# A finished attempt's ShardResult as its catalog fragment records it (job/attempts.py) and a
# later run resumes from: the one flat object the ShardResult had before its parts.
FLAT_JSON = (
    '{"split": "train", "shard": 3, "path": "p-train.tfrecord-00003-of-00004", "temp": '
    '"/v/.tmp/p.abc", "num_examples": 7, "num_bytes": 1234, "crc32c": "AAAAAA==", "sha256": '
    'null, "label_counts": {"cat": 4, "dog": 3}, "errors": [{"uri": "/in/x.jpg", "stage": '
    '"decode", "reason": "truncated", "detail": "Premature end"}], "passed_through": 2, '
    '"converted": 5, "reframed": 1, "repaired": 1, "kind": "images", "origin": "hash", '
    '"writer": "host:12", "catalog_temp": "/v/.tmp/p.abc.catalog.parquet", "index_temp": '
    '"/v/.tmp/p.abc.index", "pixel_moments": {"count": 10, "sum": [1.0, 2.0, 3.0], "sum_sq": '
    '[4.0, 5.0, 6.0]}, "resumed": true, "shared": "../V/p", "build": {"package": "1.0", '
    '"codecs": {"pillow": "10"}}}')

EMPTY_JSON = (
    '{"split": null, "shard": null, "path": null, "temp": null, "num_examples": 0, '
    '"num_bytes": 0, "crc32c": null, "sha256": null, "label_counts": {}, "errors": [], '
    '"passed_through": 0, "converted": 0, "reframed": 0, "repaired": 0, "kind": null, '
    '"origin": "hash", "writer": null, "catalog_temp": null, "index_temp": null, '
    '"pixel_moments": null, "resumed": false, "shared": null, "build": null}')


def test_shard_result_json_is_the_flat_record_a_failed_runs_fragment_keeps():
    result = ShardResult(
        "train", 3, kind="images", origin="hash",
        files=ShardFiles(path="p-train.tfrecord-00003-of-00004", temp="/v/.tmp/p.abc",
                         index_temp="/v/.tmp/p.abc.index",
                         catalog_temp="/v/.tmp/p.abc.catalog.parquet", shared="../V/p"),
        written=Written(7, 1234, crc32c="AAAAAA=="), made=Made(2, 5, 1, 1, resumed=True),
        sums=Sums({"cat": 4, "dog": 3}, PixelMoments(10, (1.0, 2.0, 3.0), (4.0, 5.0, 6.0))),
        errors=(ErrorRecord("/in/x.jpg", "decode", "truncated", "Premature end"),),
        writer=Writer("host:12", {"package": "1.0", "codecs": {"pillow": "10"}}))
    assert result.to_json() == FLAT_JSON
    assert ShardResult.from_json(FLAT_JSON) == result
    assert ShardResult(None, None).to_json() == EMPTY_JSON
    slim = result.slim()
    assert (slim.sums, slim.errors, slim.written) == (Sums(), (), result.written)


def test_shard_out_writes_the_frames_of_records_given_in_pieces(monkeypatch):
    """The writer's buffered output: the same bytes as framing each joined record, in any
    buffer size (a piece larger than the buffer goes straight to the file), and the CRC-32C
    of exactly those bytes."""
    from beam_pipeline.job import records, shard_file
    from beam_pipeline.job.images import Encoded

    encoded = [Encoded(bytes(range(256)) * n, 7, 9, True) for n in (1, 40, 3)]
    made = [records.example_parts(e, 2, "cat", f"cat/{i}.jpg") for i, e in enumerate(encoded)]
    want = b"".join(frames.tfrecord_frame(records.make_example(e, 2, "cat", f"cat/{i}.jpg"))
                    for i, e in enumerate(encoded))
    for size in (64, 4096, 1 << 20):
        monkeypatch.setattr(shard_file._FrameBuffer, "SIZE", size)
        out = io.BytesIO()
        with shard_file._FrameBuffer(out) as shard:
            lengths = [shard.write_frame(parts, length) for parts, length in made]
        assert out.getvalue() == want, size
        assert sum(lengths) == len(want)
        assert frames.crc32c_text(shard.crc) == frames.file_crc32c(want)
