"""The job as one composite transform whose expand reads like DESIGN §1."""

import apache_beam as beam

from beam_pipeline.commit import Commit
from beam_pipeline.plan import ImageRef
from beam_pipeline.shards import WriteShardFn


class ImagesToTFRecords(beam.PTransform):
    """Per-shard listing files -> shards written in parallel -> committed, published version.

    The launcher has already planned every image (label, split, shard) and written one small
    listing file per shard, in shard order; so nothing per-image is grouped here at all.
    """

    def __init__(self, shard_listings, spec, encode_options, sink="shards", progress_dir=None,
                 extra_files=(), transform_image_size=0):
        super().__init__()
        self.shard_listings, self.spec = shard_listings, spec  # [(split, shard, listing path)]
        self.encode_options, self.sink = encode_options, sink
        self.progress_dir, self.extra_files = progress_dir, extra_files
        self.transform_image_size = transform_image_size  # 0: no tf.Transform analysis

    def expand(self, pbegin):
        spec = self.spec
        label_ids = {label: i for i, label in enumerate(spec.labels)}
        if self.sink == "beam":
            from beam_pipeline.tools.beam_sink import WriteWithBeamSink

            stats = (pbegin
                     | "ListingFiles" >> beam.Create([path for _, _, path in self.shard_listings])
                     | "ReadListings" >> beam.io.ReadAllFromText()
                     | "ParseRefs" >> beam.Map(ImageRef.from_json)       # -> ImageRef
                     | "WriteWithBeamSink" >> WriteWithBeamSink(spec, label_ids,
                                                                self.encode_options))
        else:
            stats = (pbegin
                     | "ListShards" >> beam.Create(self.shard_listings)  # reshuffled to workers
                     # -> (split, shard, listing file of that shard's ImageRefs)
                     | "WriteShards" >> beam.ParDo(WriteShardFn(
                         spec.tmp_dir, spec.name, spec.num_shards, label_ids,
                         self.encode_options, spec.write_index, self.progress_dir)))
            # -> shard stats (one small dict per shard)
        parts = ()
        if self.transform_image_size:
            from beam_pipeline.analyze import AnalyzeTrain

            parts = (stats | "AnalyzeTrain" >> AnalyzeTrain(spec, self.transform_image_size),)
            # -> [{"transform": {...}}] once VDIR/transform_fn/ is written
        return stats | "Commit" >> Commit(spec, self.extra_files, parts)  # -> manifest
