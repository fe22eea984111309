"""The job as one composite transform whose expand reads like the data flow
(docs/architecture.md, "The job")."""

import apache_beam as beam

from beam_pipeline.job.beam_sink import WriteWithBeamSink
from beam_pipeline.job.commit import Commit
from beam_pipeline.job.contracts import ShardResult, ShardTask
from beam_pipeline.job import tfds_metadata
from beam_pipeline.job.heartbeat import KeepLockAlive
from beam_pipeline.refs import ImageRef
from beam_pipeline.job.shards import WriteShardFn
from beam_pipeline.store import files
from dataset_format import fields as field_types
from dataset_format.fields import NO_LABEL


class ImagesToTFRecords(beam.PTransform):
    """Shard index -> shards written in parallel -> committed, published version.

    The launcher has already planned every image (label, split, shard) and written one small
    listing file per shard, in shard order, and an index of those files; so nothing
    per-image is grouped here at all, and the job graph stays small at any scale.
    """

    def __init__(self, shards_index, spec, encode_options, sink="shards", progress_dir=None,
                 transform_image_size=0, writers_per_process=None):
        super().__init__()
        self.shards_index, self.spec = shards_index, spec  # a ShardTask per line
        self.encode_options, self.sink = encode_options, sink
        self.progress_dir = progress_dir
        self.transform_image_size = transform_image_size  # 0: no tf.Transform analysis
        self.writers_per_process = writers_per_process  # --number_of_worker_harness_threads

    def expand(self, pbegin):
        spec = self.spec
        label_ids = {label: i for i, label in enumerate(spec.labels)}
        if spec.fields:  # a manifest row with fields may have no class: id -1
            label_ids[""] = NO_LABEL
        shards = (pbegin
                  | "ShardIndex" >> beam.Create([self.shards_index])
                  | "ReadShardIndex" >> beam.FlatMap(read_shard_index)      # -> ShardTask
                  | "ToWorkers" >> beam.Reshuffle()
                  # fused with the writers: each of their processes beats ROOT/.lock
                  | "KeepLockAlive" >> beam.ParDo(KeepLockAlive(spec.root, spec.version))
                  .with_output_types(ShardTask))
        if self.sink == "beam":
            results = (shards
                       | "ListingFiles" >> beam.Map(lambda task: task.listing)
                       | "ReadListings" >> beam.io.ReadAllFromText()
                       | "ParseRefs" >> beam.Map(ImageRef.from_json)       # -> ImageRef
                       | "WriteWithBeamSink" >> WriteWithBeamSink(spec, label_ids,
                                                                  self.encode_options))
        else:
            results = (shards
                       | "WriteShards" >> beam.ParDo(WriteShardFn(
                           spec.tmp_dir, spec.name, spec.num_shards, label_ids,
                           self.encode_options, spec.write_index,
                           progress_dir=self.progress_dir,
                           moments=bool(self.transform_image_size),
                           previous_vdir=spec.previous_vdir,
                           phash=spec.dedup.near_duplicates,
                           # commit may rewrite shards: each attempt writes a temp name
                           direct=not spec.dedup.rewrites,
                           previous_build=spec.previous_build,
                           writers_per_process=self.writers_per_process,
                           fields=spec.fields and field_types.from_json(spec.fields)))
                       .with_output_types(ShardResult))
            # -> ShardResult, one per shard (with --transform, + pixel_moments)
        parts = ()
        if self.transform_image_size:
            # lazy: tensorflow-transform (and TensorFlow) load only with --transform
            from beam_pipeline.job.analyze import AnalyzeTrain

            parts = (results | "AnalyzeTrain" >> AnalyzeTrain(spec, self.transform_image_size),)
            # -> [{"transform": {...}}] once VDIR/transform_fn/ is written
        # commit writes the TFDS files beside the manifest (tfds_metadata.write)
        return results | "Commit" >> Commit(spec, (tfds_metadata.write,), parts)  # -> Manifest


def read_shard_index(path):
    """The shard index file the launcher wrote -> one ShardTask per shard."""
    with files.open_read(path) as f:
        for line in f:
            if line.strip():
                yield ShardTask.from_json(line)
