"""The tf.Transform branch of the job: train-split statistics and the one transform graph.

    shard stats ──(train temp shards, read in the worker that wrote them)──> tf.Examples
        ──> RecordBatches ──AnalyzeDataset(preprocessing_fn)──> transform_fn
        ──WriteTransformFn──> VDIR/transform_fn/, VDIR/transformed_metadata/
        ──> one manifest part {"transform": {...}} that Commit waits for

It reads back the records the shard writer just wrote (temp files, renamed only at commit),
so the statistics are those of the *stored* images and the labels are the ids already in
the records: nothing is listed, fetched or converted twice, and TFT never assigns ids.

`preprocessing_fn` is the contract between training and serving. Its raw inputs are the
parsed record keys (readers/schema.py); its outputs are model-ready:
  image  float32 [S, S, 3] = (resize(decode_jpeg(image/encoded), S×S) - mean) / std
  label  int64 [] = image/class/label, unchanged
mean/std are per channel (RGB, 0..255) over every pixel of the train images (each pixel of
the stored image weighs the same), summed by one `tft.sum` analyzer in float64. To keep the
pass cheap each JPEG is decoded with libjpeg's DCT scaling (what Pillow's draft mode does)
at 1/2, 1/4 or 1/8 size: the smallest whose shorter side is still >= S/4 (at least 32 px),
weighted by its full pixel count. Against a full-resolution decode that moves the mean by
< 0.4 levels and lowers the std by 1.5-12.5% (docs/transform.md has the measurements).
A `ptransform_analyzer` (TrainSummary) writes the label vocabulary with train frequencies, in
id order, and the same statistics as JSON: the manifest is filled from those two assets.
The output branch (full decode + resize) does not run during the analysis.
Both decodes use libjpeg's accurate integer DCT, as Pillow does (TF's default, the fast
DCT, shifts channel means by ~1 level).
"""

import logging

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from tensorflow_transform.beam.experimental import PTransformAnalyzer  # loads TensorFlow

from readers import schema
from readers import transform as transform_lib

ANALYSIS_MIN_SIDE = 32  # never analyse at a shorter side below this many pixels


def analysis_min_side(image_size):
    """Shortest side the analysis decodes at: a quarter of the model's input size (>= 32 px).

    The model sees every image resized to image_size, which already drops fine detail: on
    ~500 px photos its inputs have a 2-10% lower std than the full-resolution image, and the
    1/4-scale decode this picks for them a 1.5-12.5% lower one (docs/transform.md), for about
    a third of the decode work.
    """
    return max(ANALYSIS_MIN_SIDE, image_size // 4)


RAW_KEYS = (schema.ENCODED, schema.LABEL, schema.TEXT)  # what the analysis parses
TFT_TEMP = "tft"  # under the version's temp dir; deleted by commit
BATCH_SIZE = 64  # records per analysis batch: bounds memory whatever the JPEG sizes


def raw_feature_spec():
    """The transform's raw inputs: parsed record keys (the label text only feeds the vocabulary)."""
    return schema.feature_spec(RAW_KEYS)


DCT_METHOD = "INTEGER_ACCURATE"  # libjpeg's ISLOW, as Pillow: TF's default (IFAST) is ~1 level off


def _ratio_decode(jpeg, min_side):
    """One JPEG -> uint8 [h, w, 3] decoded at 1/8, 1/4, 1/2 or full size (libjpeg DCT scaling).

    The ratio is an op attribute, so each choice is its own branch; nested tf.cond because
    TFT's analyzer-cache hashing cannot serialize tf.switch_case.
    """
    import tensorflow as tf

    shape = tf.io.extract_jpeg_shape(jpeg)
    short = tf.minimum(shape[0], shape[1])

    def at(ratio):
        return lambda: tf.io.decode_jpeg(jpeg, channels=3, ratio=ratio, dct_method=DCT_METHOD)

    return tf.cond(short >= 8 * min_side, at(8), lambda: tf.cond(
        short >= 4 * min_side, at(4), lambda: tf.cond(short >= 2 * min_side, at(2), at(1))))


def _image_moments(jpeg, min_side):
    """One JPEG -> float64 [7]: full-size pixel count, per-channel mean, per-channel mean square."""
    import tensorflow as tf

    shape = tf.io.extract_jpeg_shape(jpeg)
    pixels = tf.reshape(tf.cast(_ratio_decode(jpeg, min_side), tf.float32), [-1, 3])
    # Centred in float32 (accurate to ~1e-6 of the variance), combined in float64.
    means = tf.reduce_mean(pixels, axis=0)
    variances = tf.reduce_mean(tf.square(pixels - means), axis=0)
    means = tf.cast(means, tf.float64)
    squares = tf.cast(variances, tf.float64) + tf.square(means)
    count = tf.cast(shape[0] * shape[1], tf.float64)[None]
    return tf.concat([count, means, squares], 0)


def decode_and_resize(jpeg, image_size):
    """[B] JPEG strings -> float32 [B, S, S, 3] in 0..255 (whole image, antialiased bilinear)."""
    import tensorflow as tf

    def one(data):
        image = tf.cast(tf.io.decode_jpeg(data, channels=3, dct_method=DCT_METHOD), tf.float32)
        return tf.image.resize(image, [image_size, image_size], method="bilinear",
                               antialias=True)

    return tf.map_fn(one, jpeg, fn_output_signature=tf.TensorSpec(
        [image_size, image_size, 3], tf.float32))


def make_preprocessing_fn(image_size, labels, min_side=None):
    """The TFT preprocessing_fn: raw parsed features -> {"image", "label"} (module docstring)."""
    labels = tuple(labels)
    min_side = min_side or analysis_min_side(image_size)

    def preprocessing_fn(inputs):
        import tensorflow as tf
        import tensorflow_transform as tft

        jpeg = inputs[schema.ENCODED]  # [B] string
        label = inputs[schema.LABEL]   # [B] int64

        def moments_of(one_jpeg):
            return _image_moments(one_jpeg, min_side)

        # Analysis only: [B, 7] = (n, n * mean rgb, n * mean square rgb) at reduced resolution,
        # summed over the split by one TFT analyzer (float64) -> [7].
        moments = tf.map_fn(moments_of, jpeg, fn_output_signature=tf.TensorSpec([7], tf.float64))
        n = moments[:, 0:1]
        sums = tft.sum(tf.concat([n, n * moments[:, 1:]], axis=1), reduce_instance_dims=False,
                       name="pixel_moments")
        mean = tf.math.divide_no_nan(sums[1:4], sums[0])
        var = tf.maximum(tf.math.divide_no_nan(sums[4:7], sums[0]) - tf.square(mean), 0.0)
        std = tf.where(var > 0, tf.sqrt(var), tf.ones_like(var))  # no data: identity scale
        # Label frequencies by the records' own ids (line i = class id i) and the same pixel
        # statistics in float64, as two assets the manifest is filled from.
        tft.experimental.ptransform_analyzer(
            [label, moments], TrainSummary(labels), [tf.string, tf.string], [[], []],
            output_asset_default_values=[b"", b"{}"], name="train_summary")
        tft.annotate_asset(transform_lib.LABEL_VOCABULARY, transform_lib.LABEL_VOCABULARY)
        tft.annotate_asset(transform_lib.STATISTICS, transform_lib.STATISTICS)

        image = decode_and_resize(jpeg, image_size)
        image = (image - tf.cast(mean, tf.float32)) / tf.cast(std, tf.float32)
        return {transform_lib.IMAGE: image, transform_lib.LABEL: tf.identity(label)}

    return preprocessing_fn


class _Summarize(beam.CombineFn):
    """Batches (label ids [B], moments [B, 7]) -> (counts per id [K], n-weighted sums [7])."""

    def __init__(self, num_labels):
        self.num_labels = num_labels

    def create_accumulator(self):
        import numpy as np

        return np.zeros(self.num_labels, np.int64), np.zeros(7, np.float64)

    def add_input(self, accumulator, batch):
        import numpy as np

        counts, sums = accumulator
        ids, moments = np.asarray(batch[0]).reshape(-1), np.asarray(batch[1], np.float64)
        counts = counts + np.bincount(ids, minlength=self.num_labels)[:self.num_labels]
        n = moments[:, :1]
        return counts, sums + np.concatenate([n, n * moments[:, 1:]], axis=1).sum(axis=0)

    def merge_accumulators(self, accumulators):
        counts, sums = self.create_accumulator()
        for c, s in accumulators:
            counts, sums = counts + c, sums + s
        return counts, sums

    def extract_output(self, accumulator):
        return accumulator


def _write_vocabulary(summary, labels, temp_dir):
    """-> path of a '<count> <name>' file, line i = class id i (TFT copies it to assets)."""
    counts, _ = summary
    return _write_asset(temp_dir, transform_lib.LABEL_VOCABULARY, "".join(
        f"{int(c)} {name}\n" for c, name in zip(counts, labels)))


def _write_statistics(summary, temp_dir):
    """-> path of a JSON file with the train split's pixel statistics (float64)."""
    import json

    import numpy as np

    counts, sums = summary
    total = max(sums[0], 1.0)
    mean = sums[1:4] / total
    std = np.sqrt(np.maximum(sums[4:7] / total - mean * mean, 0.0))
    return _write_asset(temp_dir, transform_lib.STATISTICS, json.dumps({
        "num_images": int(counts.sum()), "num_pixels": int(sums[0]),
        "mean": mean.tolist(), "std": [float(v) if v > 0 else 1.0 for v in std]}))


def _write_asset(temp_dir, name, text):
    import uuid

    import numpy as np

    from beam_pipeline import versions

    path = "/".join([temp_dir, uuid.uuid4().hex, name])
    versions.write_bytes(path, text.encode())
    return np.array(path.encode())


class TrainSummary(PTransformAnalyzer):
    """TFT ptransform analyzer: (label ids, image moments) batches -> two asset paths.

    label_vocabulary: counts by the ids already in the records (never re-assigned), names
    from the label map; pixel_statistics.json: what the tft.sum analyzer computes, in
    float64, for the manifest (no need to load the saved graph to learn the numbers).
    TFT gives it `base_temp_dir` and copies both files into transform_fn/assets.
    """

    def __init__(self, labels):
        super().__init__()
        self.labels = tuple(labels)

    def expand(self, batches):
        summary = (batches                                     # -> ([B] ids, [B, 7] moments)
                   | "Summarize" >> beam.CombineGlobally(_Summarize(len(self.labels))))
        # -> (int64 [K] counts, float64 [7] sums)
        return (summary | "WriteVocabulary" >> beam.Map(
                    _write_vocabulary, self.labels, self.base_temp_dir),
                summary | "WriteStatistics" >> beam.Map(_write_statistics, self.base_temp_dir))


def read_tfrecords(path):
    """One TFRecord file (the shard writer's framing) -> its records, CRCs checked.

    A plain generator rather than ReadAllFromTFRecord: no reshuffle, so the analysis fuses
    with the shard writer's stage and runs in the worker that just wrote the file.
    """
    from beam_pipeline.records import FrameError, read_frame

    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        offset = 0
        try:
            while (frame := read_frame(f, offset)) is not None:
                yield frame[0]
                offset += frame[1]
        except FrameError as e:
            raise IOError(f"{path}: corrupt TFRecord frame at {e}") from e


def train_shard_files(stats, split):
    """Shard stats -> the temp file of a shard of `split` that holds records (else nothing)."""
    if stats["split"] != split or not stats.get("num_examples"):
        return
    if not stats.get("temp"):
        raise ValueError(f"shard stats for {stats.get('path')!r} name no temp file; the "
                         "transform analysis needs the shard writer's files (use --sink shards "
                         "or --no_transform)")
    yield stats["temp"]


class AnalyzeTrain(beam.PTransform):
    """PCollection of shard stats -> one manifest part, after VDIR/transform_fn/ is written."""

    def __init__(self, spec, image_size, min_side=None, split="train"):
        super().__init__()
        if image_size < 1:
            raise ValueError(f"transform image_size must be >= 1, not {image_size}")
        min_side = min_side or analysis_min_side(image_size)
        if min_side < 1:
            raise ValueError(f"analysis min_side must be >= 1, not {min_side}")
        self.spec, self.image_size, self.min_side, self.split = spec, image_size, min_side, split

    def expand(self, shard_stats):
        import tensorflow_transform.beam as tft_beam
        from tensorflow_transform.tf_metadata import schema_utils
        from tfx_bsl.public import tfxio

        spec = self.spec
        if self.split not in spec.num_shards:
            logging.warning("no %s split: the tf.Transform analysis is skipped", self.split)
            return shard_stats.pipeline | "NoTransform" >> beam.Create([{}])

        source = tfxio.TFExampleBeamRecord(
            physical_format="tfrecord", telemetry_descriptors=["image_tfrecords"],
            schema=schema_utils.schema_from_feature_spec(raw_feature_spec()))
        batches = (shard_stats
                   | "TrainShardFiles" >> beam.FlatMap(train_shard_files, self.split)
                   # -> temp shard path
                   | "ReadTrainRecords" >> beam.FlatMap(read_tfrecords)
                   # -> serialized tf.Example
                   | "ToRecordBatches" >> source.BeamSource(batch_size=BATCH_SIZE))
                   # -> pyarrow.RecordBatch of the RAW_KEYS columns
        with tft_beam.Context(temp_dir=f"{spec.tmp_dir}/{TFT_TEMP}", force_tf_compat_v1=False):
            transform_fn = ((batches, source.TensorAdapterConfig())
                            | "AnalyzeDataset" >> tft_beam.AnalyzeDataset(
                                make_preprocessing_fn(self.image_size, spec.labels,
                                                      self.min_side)))
            # -> (saved transform graph in the temp dir, transformed metadata)
            written = transform_fn | "WriteTransformFn" >> tft_beam.WriteTransformFn(spec.vdir)
            # -> [None] once VDIR/transform_fn and VDIR/transformed_metadata exist
        return written | "ManifestPart" >> beam.Map(
            manifest_part, spec.vdir, spec.labels, self.image_size, self.min_side, self.split)


def manifest_part(_, vdir, labels, image_size, min_side, split):
    """Read back the two small assets just written -> {"transform": {...}} for manifest.json."""
    import tensorflow_transform as tft

    tft_output = tft.TFTransformOutput(vdir)  # reads metadata only; the graph is not loaded
    statistics = transform_lib.read_statistics(tft_output)
    mean, std = statistics["mean"], statistics["std"]
    vocabulary = transform_lib.read_label_vocabulary(tft_output)  # [(name, count)] by id
    if [name for name, _ in vocabulary] != list(labels):
        raise ValueError(f"label vocabulary {[n for n, _ in vocabulary]} does not follow the "
                         f"label map {list(labels)}")
    counts = dict(vocabulary)
    return {"transform": {
        "transform_fn": tft.TFTransformOutput.TRANSFORM_FN_DIR,
        "transformed_metadata": tft.TFTransformOutput.TRANSFORMED_METADATA_DIR,
        "tensorflow_transform": tft.__version__,
        "raw_features": list(RAW_KEYS),
        "outputs": {
            transform_lib.IMAGE: {"dtype": "float32", "shape": [image_size, image_size, 3],
                                  "value": "(resize(decode_jpeg(image/encoded)) - mean) / std"},
            transform_lib.LABEL: {"dtype": "int64", "shape": [],
                                  "value": "image/class/label (ids unchanged)"},
        },
        "image_size": image_size,
        "mean": [round(float(v), 4) for v in mean],
        "std": [round(float(v), 4) for v in std],
        "statistics": {
            "split": split,
            "num_images": statistics["num_images"],
            "num_pixels": statistics["num_pixels"],
            "weighting": "every pixel of the stored image (RGB, 0..255)",
            "resolution": f"JPEG DCT-scaled decode (1/2, 1/4 or 1/8) keeping the shorter "
                          f"side >= {min_side} px",
        },
        "label_vocabulary": {
            "path": f"{tft.TFTransformOutput.TRANSFORM_FN_DIR}/assets/"
                    f"{transform_lib.LABEL_VOCABULARY}",
            "format": "'<train count> <class name>' per line; line i is label id i",
            "train_counts": {name: counts.get(name, 0) for name in labels},
        },
    }}
