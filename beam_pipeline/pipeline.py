"""The job as one composite transform whose expand reads like DESIGN §1."""

import apache_beam as beam

from beam_pipeline import plan
from beam_pipeline.commit import Commit
from beam_pipeline.plan import ImageRef
from beam_pipeline.shards import WriteShardFn


def plan_shard(ref, label_ids, num_shards):
    """ImageRef -> ((split, shard), (position, ImageRef, label id)); only small things move."""
    position = plan.shard_position(ref.split, ref.key)
    shard = min(int(position * num_shards[ref.split]), num_shards[ref.split] - 1)
    return (ref.split, shard), (position, ref, label_ids[ref.label])


class ImagesToTFRecords(beam.PTransform):
    """Listing file -> shards written in parallel -> committed, published version."""

    def __init__(self, listing_path, spec, encode_options, sink="shards", progress_dir=None,
                 extra_files=(), transform_image_size=0):
        super().__init__()
        self.listing_path, self.spec = listing_path, spec
        self.encode_options, self.sink = encode_options, sink
        self.progress_dir, self.extra_files = progress_dir, extra_files
        self.transform_image_size = transform_image_size  # 0: no tf.Transform analysis

    def expand(self, pbegin):
        spec = self.spec
        label_ids = {label: i for i, label in enumerate(spec.labels)}
        refs = (pbegin
                | "ReadListing" >> beam.io.ReadFromText(self.listing_path)
                | "ParseRefs" >> beam.Map(ImageRef.from_json))           # -> ImageRef
        if self.sink == "beam":
            from beam_pipeline.beam_sink import WriteWithBeamSink

            stats = refs | "WriteWithBeamSink" >> WriteWithBeamSink(
                spec, label_ids, self.encode_options)
        else:
            stats = (refs
                     | "Plan" >> beam.Map(plan_shard, label_ids, spec.num_shards)
                     # -> ((split, shard), (position, ImageRef, label id))
                     | "GroupByShard" >> beam.GroupByKey()
                     # -> ((split, shard), [(position, ImageRef, label id)])
                     | "WriteShards" >> beam.ParDo(WriteShardFn(
                         spec.tmp_dir, spec.name, spec.num_shards, self.encode_options,
                         spec.write_index, self.progress_dir)))          # -> shard stats
        parts = ()
        if self.transform_image_size:
            from beam_pipeline.analyze import AnalyzeTrain

            parts = (stats | "AnalyzeTrain" >> AnalyzeTrain(spec, self.transform_image_size),)
            # -> [{"transform": {...}}] once VDIR/transform_fn/ is written
        return stats | "Commit" >> Commit(spec, self.extra_files, parts)  # -> manifest
