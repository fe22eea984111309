"""`--sink beam`: the same records through beam.io.WriteToTFRecord, for comparison.

Here every serialized record (image bytes included) crosses the shuffle that
WriteToTFRecord does to form shards; on the DirectRunner that group sits in memory, which
is why `--sink shards` is the default (docs/architecture.md). The benchmark compares the two.

It writes no catalog, but it does write the split map (commit.py): each written input's
sha256, size, split and listing md5 go to one small Parquet file under VDIR/.tmp/ that
commit adds to the map, so a split decided by a `--sink beam` build (say with --resplit)
stays decided in the builds after it, whatever their sink.
"""

import hashlib
import io

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.job import images, records
from beam_pipeline.job.contracts import ShardFiles, ShardResult, Sums, Written
from beam_pipeline.job.inputs import fetch
from beam_pipeline.store import files
from dataset_format import frames, layout, schema
from dataset_format.error_record import ErrorRecord


CONTENTS = "beam_sink_contents.parquet"  # under VDIR/.tmp/: what the split map adds


class ToRecordFn(beam.DoFn):
    """ImageRef -> (split, serialized Example); rejected inputs to the 'errors' output, and
    each written input's (sha256, size, split, md5) to the 'contents' output."""

    def __init__(self, label_ids, encode_options):
        self.label_ids, self.encode_options = label_ids, encode_options

    def process(self, ref):
        try:
            data, error = fetch(ref.uri, 0, ref.stamp)  # transient storage errors raise
            if error is not None:
                raise (error if isinstance(error, images.ImageError) else images.ImageError(
                    "read", "unreadable", f"{type(error).__name__}: {error}")) from error
            encoded = images.convert(data, self.encode_options)
        except images.ImageError as e:
            yield beam.pvalue.TaggedOutput("errors", ErrorRecord(ref.uri, e.stage, e.reason,
                                                                 e.detail))
            return
        yield ref.split, records.make_example(encoded, self.label_ids[ref.label], ref.label,
                                              ref.key)
        yield beam.pvalue.TaggedOutput(
            "contents", (hashlib.sha256(data).hexdigest(), len(data), ref.split, ref.md5))


def write_contents(rows, path):
    """[(input sha256, size, split, md5)] -> a Parquet file at `path` with the catalog's
    column names (split_map.add_catalog reads it as it reads a catalog) -> the empty
    ShardResult that orders it before commit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = sorted(rows)
    table = pa.table({"input_sha256": pa.array([r[0] for r in rows], pa.string()),
                      "input_size": pa.array([r[1] for r in rows], pa.int64()),
                      "split": pa.array([r[2] for r in rows], pa.string()),
                      "input_md5": pa.array([r[3] for r in rows], pa.string())})
    with files.create_final(path) as raw:
        pq.write_table(table, raw, compression="zstd")
    return ShardResult(split=None, shard=None)


def shard_result(path, split, write_index):
    """The ShardResult of a finished shard file, read back (WriteToTFRecord reports only its
    name)."""
    from tensorflow.core.example import example_pb2

    with FileSystems.open(path) as f:
        data = f.read()
    counts, offset, offsets = {}, 0, []
    with io.BytesIO(data) as f:
        while (frame := frames.read_frame(f, offset)) is not None:
            record, frame_length = frame
            example = example_pb2.Example.FromString(record)
            label = example.features.feature[schema.TEXT].bytes_list.value[0].decode()
            counts[label] = counts.get(label, 0) + 1
            offsets.append((offset, frame_length))
            offset += frame_length
    index_temp = None
    if write_index:
        index_temp = path + layout.INDEX_SUFFIX
        with FileSystems.create(index_temp) as f:
            f.write(frames.index_bytes(offsets))
    return ShardResult(split=split, shard=layout.parse_shard_name(path)[2],
                       files=ShardFiles(temp=path, index_temp=index_temp),
                       written=Written(len(offsets), len(data), crc32c=frames.file_crc32c(data)),
                       sums=Sums(label_counts=counts))


def _errors_as_result(errors):
    return ShardResult(split=None, shard=None, errors=tuple(errors))


class WriteWithBeamSink(beam.PTransform):
    """ImageRefs -> ShardResults, like WriteShardFn's, via WriteToTFRecord per split."""

    def __init__(self, spec, label_ids, encode_options):
        super().__init__()
        self.spec, self.label_ids, self.encode_options = spec, label_ids, encode_options

    def expand(self, refs):
        spec = self.spec
        converted = refs | "ToRecords" >> beam.ParDo(
            ToRecordFn(self.label_ids, self.encode_options)).with_outputs(
                "errors", "contents", main="records")
        outputs = [converted.errors
                   | "AllErrors" >> beam.combiners.ToList()
                   | "ErrorsAsResult" >> beam.Map(_errors_as_result).with_output_types(ShardResult),
                   converted.contents
                   | "AllContents" >> beam.combiners.ToList()
                   | "ContentsFile" >> beam.Map(write_contents,
                                                layout.join(spec.tmp_dir, CONTENTS))
                   .with_output_types(ShardResult)]
        for split, n in sorted(spec.num_shards.items()):
            prefix = layout.join(spec.tmp_dir, f"{spec.name}-{split}.tfrecord")
            outputs.append(
                converted.records
                | f"Only_{split}" >> beam.Filter(lambda kv, s=split: kv[0] == s)
                | f"Values_{split}" >> beam.Values()
                | f"WriteToTFRecord_{split}" >> beam.io.WriteToTFRecord(
                    prefix, num_shards=n, shard_name_template="-SSSSS-of-NNNNN")
                | f"Results_{split}" >> beam.Map(shard_result, split, spec.write_index)
                .with_output_types(ShardResult))
        return outputs | "Flatten" >> beam.Flatten()
