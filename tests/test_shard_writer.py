"""WriteShardFn in a TestPipeline: ShardTasks in, typed ShardResults out (through their coder),
and the temp shard, its index and catalog fragment agree with the result."""

import hashlib
import io

import apache_beam as beam
from apache_beam.testing import test_pipeline as beam_test
from apache_beam.testing.util import BeamAssertException, assert_that

from beam_pipeline.job.contracts import PixelMoments, ShardResult, ShardTask
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
        with open(r.temp, "rb") as f:
            data = f.read()
        offsets, offset, records = [], 0, []
        with io.BytesIO(data) as f:
            while (frame := frames.read_frame(f, offset)) is not None:
                records.append(frame[0])
                offsets.append((offset, frame[1]))
                offset += frame[1]
        with open(r.index_temp) as f:
            index = frames.parse_index(f.read())
        rows = list(catalog.iter_rows(r.catalog_temp))
        got = (r.split, r.shard, r.path, r.kind, r.origin, r.num_examples, r.num_bytes,
               r.crc32c, r.sha256, r.label_counts, [e.reason for e in r.errors], index,
               [(row["key"], row["position"], row["offset"], row["length"]) for row in rows])
        want = ("train", 0, layout.shard_name("t", "train", 0, 1), "images", "hash",
                len(expected_keys), len(data), frames.file_crc32c(data), None,
                {"cat": 2, "dog": 1}, ["not_an_image"], offsets,
                [(k, i, o, n) for i, (k, (o, n)) in enumerate(zip(expected_keys, offsets))])
        if got != want:
            raise BeamAssertException(f"{got!r}\n!=\n{want!r}")
        if moments and r.pixel_moments.count != 3 * 24 * 16:
            raise BeamAssertException(f"pixel moments {r.pixel_moments!r}")
        if not moments and r.pixel_moments is not None:
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
    result = ShardResult("train", 2, path="p", temp="t", num_examples=2, num_bytes=10,
                         crc32c="AAAAAA==", label_counts={"cat": 2}, passed_through=1,
                         errors=(ErrorRecord("x", "decode", "truncated", "Premature end"),), kind="images",
                         writer="h:1", catalog_temp="c", index_temp="i",
                         pixel_moments=PixelMoments(4, (1.0, 2.5, 3.0), (9.0, 0.25, 1e20)))
    assert ShardResult.from_json(result.to_json()) == result
    errors_only = ShardResult(None, None, errors=(ErrorRecord("y", "read", "unreadable", "gone"),))
    assert ShardResult.from_json(errors_only.to_json()) == errors_only


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
