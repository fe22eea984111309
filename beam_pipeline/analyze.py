"""The tf.Transform branch of the job: train-split statistics and the one transform graph.

    shard stats ──(train temp shards)──> serialized tf.Examples ──> RecordBatches
        ──AnalyzeDataset(preprocessing_fn)──> transform_fn ──WriteTransformFn──> VDIR/transform_fn/,
                                                                          VDIR/transformed_metadata/
        ──> one manifest part {"transform": {...}} that Commit waits for

It reads back the records the shard writer just wrote (temp files, renamed only at commit),
so the statistics are those of the *stored* images and the labels are the ids already in
the records: nothing is listed, fetched or converted twice, and TFT never assigns ids.

`preprocessing_fn` is the contract between training and serving. Its raw inputs are the
parsed record keys (readers/schema.py); its outputs are model-ready:
  image  float32 [S, S, 3] = (resize(decode_jpeg(image/encoded), S×S) - mean) / std
  label  int64 [] = image/class/label, unchanged
where mean/std are per-channel (RGB, 0..255) over every pixel of the train images, each
pixel of the stored image weighted equally. The analysis decodes each JPEG with libjpeg's
DCT scaling (the same thing as Pillow's draft mode) at 1/2, 1/4 or 1/8 size, the smallest
whose shorter side is still >= `min_side` (32 px) and weights each image by its full pixel
count; on ~500×375 photos-like JPEGs that changes the mean by < 1 level and the std by < 1.5%
against a full-resolution decode (see docs/transform.md), for ~3× less decode work. The
output branch (full decode + resize) is not run during analysis.
"""

import logging

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from tensorflow_transform.beam.experimental import PTransformAnalyzer  # loads TensorFlow

from readers import schema
from readers import transform as transform_lib

ANALYSIS_MIN_SIDE = 32  # shorter side of the reduced-resolution decode used for statistics
RAW_KEYS = (schema.ENCODED, schema.LABEL, schema.TEXT)  # what the analysis parses
TFT_TEMP = "tft"  # under the version's temp dir; deleted by commit


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
    # float32 means of one small image are exact to ~1e-6; the dataset sums are float64.
    means = tf.reduce_mean(pixels, axis=0)
    squares = tf.reduce_mean(tf.square(pixels), axis=0)
    count = tf.cast(shape[0] * shape[1], tf.float64)[None]
    return tf.concat([count, tf.cast(means, tf.float64), tf.cast(squares, tf.float64)], 0)


def decode_and_resize(jpeg, image_size):
    """[B] JPEG strings -> float32 [B, S, S, 3] in 0..255 (whole image, antialiased bilinear)."""
    import tensorflow as tf

    def one(data):
        image = tf.cast(tf.io.decode_jpeg(data, channels=3, dct_method=DCT_METHOD), tf.float32)
        return tf.image.resize(image, [image_size, image_size], method="bilinear",
                               antialias=True)

    return tf.map_fn(one, jpeg, fn_output_signature=tf.TensorSpec(
        [image_size, image_size, 3], tf.float32))


def make_preprocessing_fn(image_size, labels, min_side=ANALYSIS_MIN_SIDE):
    """The TFT preprocessing_fn: raw parsed features -> {"image", "label"} (module docstring)."""
    labels = tuple(labels)

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
        # Label frequencies by the records' own ids: an asset, line i = class id i.
        vocabulary, = tft.experimental.ptransform_analyzer(
            [label], LabelVocabulary(labels), [tf.string], [[]],
            output_asset_default_values=[b""], name="label_vocabulary")
        tft.annotate_asset(transform_lib.LABEL_VOCABULARY, transform_lib.LABEL_VOCABULARY)
        del vocabulary  # tracked as an asset; the graph does not use it

        image = decode_and_resize(jpeg, image_size)
        image = (image - tf.cast(mean, tf.float32)) / tf.cast(std, tf.float32)
        return {transform_lib.IMAGE: image, transform_lib.LABEL: tf.identity(label)}

    return preprocessing_fn


class _CountLabels(beam.CombineFn):
    """Batches of label ids ([B] int64 arrays) -> counts per id, int64 [num_labels]."""

    def __init__(self, num_labels):
        self.num_labels = num_labels

    def create_accumulator(self):
        import numpy as np

        return np.zeros(self.num_labels, np.int64)

    def add_input(self, counts, batch):
        import numpy as np

        ids = np.asarray(batch[0]).reshape(-1)
        return counts + np.bincount(ids, minlength=self.num_labels)[:self.num_labels]

    def merge_accumulators(self, accumulators):
        return sum(accumulators, self.create_accumulator())

    def extract_output(self, counts):
        return counts


def _write_vocabulary(counts, labels, temp_dir):
    """counts -> path of a '<count> <name>' file, line i = class id i (TFT copies it to assets)."""
    import uuid

    import numpy as np

    from beam_pipeline import versions

    path = "/".join([temp_dir, uuid.uuid4().hex, transform_lib.LABEL_VOCABULARY])
    versions.write_bytes(path, "".join(f"{int(c)} {name}\n"
                                       for c, name in zip(counts, labels)).encode())
    return np.array(path.encode())


class LabelVocabulary(PTransformAnalyzer):
    """TFT ptransform analyzer: batches of label ids -> the vocabulary asset path.

    Counts by the ids already in the records (never re-assigned), names from the label map.
    TFT gives it `base_temp_dir` for the file it then copies into transform_fn/assets.
    """

    def __init__(self, labels):
        super().__init__()
        self.labels = tuple(labels)

    def expand(self, batches):
        return (batches                                        # -> ([B] label ids,)
                | "Count" >> beam.CombineGlobally(_CountLabels(len(self.labels)))
                # -> int64 [num_labels]
                | "Write" >> beam.Map(_write_vocabulary, self.labels, self.base_temp_dir))


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

    def __init__(self, spec, image_size, min_side=ANALYSIS_MIN_SIDE, split="train"):
        super().__init__()
        if image_size < 1:
            raise ValueError(f"transform image_size must be >= 1, not {image_size}")
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
                   | "ReadTrainRecords" >> beam.io.ReadAllFromTFRecord(
                       compression_type=CompressionTypes.UNCOMPRESSED)
                   # -> serialized tf.Example
                   | "ToRecordBatches" >> source.BeamSource())
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
    """Read back what was written -> {"transform": {...}} for manifest.json.

    mean/std are read by running the saved graph (readers.transform.normalization), which
    also proves it loads and runs before the version is published.
    """
    import tensorflow_transform as tft

    tft_output = tft.TFTransformOutput(vdir)
    mean, std = transform_lib.normalization(tft_output)
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
            "num_images": sum(counts.values()),
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
