"""The tf.Transform branch of the job (only with --transform): train statistics, one graph.

    ShardResults ──(train shards with records)──> one analysis row per shard
        ──AnalyzeDataset(preprocessing_fn)──> transform_fn
        ──WriteTransformFn──> VDIR/transform_fn/, VDIR/transformed_metadata/
        ──> one manifest part {"transform": {...}} that Commit waits for

The statistics come from pixels the shard writer already decoded: with `moments=True` it adds
each stored image's pixel count, per-channel sums and sums of squares (exact integers) to its
ShardResult, and its label counts are there anyway. So TFT's analyzers reduce one small row
per train shard; nothing reads the written shards back and no image is decoded twice.

`preprocessing_fn` is the contract between training and serving. Its raw inputs are the
parsed record keys plus two analysis-only columns:
  image/encoded, image/class/label   the records' own keys (dataset_format/schema.py)
  shard/pixel_moments  int64 [7]     (count, sum r, g, b, sum of squares r, g, b) of a shard
  shard/label_counts   int64 [K]     train images per label id in that shard
The analysis rows fill only the two shard columns (the record keys hold placeholders the
analysis graph never reads); records and served requests carry only the record keys, and TFT
supplies the missing shard columns itself: the outputs no longer depend on them once the
analyzer's results are constants in the saved graph. Its outputs are model-ready:
  image  float32 [S, S, 3] = (resize(decode_jpeg(image/encoded), S×S) - mean) / std
  label  int64 [] = image/class/label, unchanged
mean/std are per channel (RGB, 0..255) over every stored pixel of the train images, at full
resolution: two `ptransform_analyzer`s add the rows in Python integers (exact). Normalization
gives mean/std (float64, applied as float32 constants); TrainSummary writes two assets the
manifest is filled from: the label vocabulary with train counts in id order, and the same
statistics as JSON (float64). JPEGs are decoded with libjpeg's accurate integer DCT, as Pillow and
libjpeg-turbo's default do (TF's default, the fast DCT, shifts channel means by ~1 level).
"""

import logging

import apache_beam as beam
from tensorflow_transform.beam.experimental import PTransformAnalyzer  # loads TensorFlow

from beam_pipeline.store import files
from dataset_format import layout, schema, transform_assets

MOMENTS = "shard/pixel_moments"    # int64 [7]: count, sums (r, g, b), sums of squares (r, g, b)
LABEL_COUNTS = "shard/label_counts"  # int64 [K]: images per label id
RAW_KEYS = (schema.ENCODED, schema.LABEL)  # the record keys the graph transforms
TFT_TEMP = layout.TRANSFORM_TEMP  # under the version's temp dir; deleted by commit
# TF2 graphs, as the first --transform did. TF1-compatible mode (True) skips the tf.function tracing
# in the workers but its SavedModel cannot be applied eagerly with
# `tft_output.transform_raw_features` (readers/transform.py and users do); measured on a
# loaded 2-core machine it saved ~20 s of ~45 s of fixed cost in one pair of runs.
FORCE_TF_COMPAT_V1 = False


def raw_feature_spec(num_labels):
    """The transform's raw inputs: the record keys, then the analysis-only shard columns."""
    import tensorflow as tf

    spec = schema.feature_spec(RAW_KEYS)
    spec[MOMENTS] = tf.io.FixedLenFeature([7], tf.int64)
    spec[LABEL_COUNTS] = tf.io.FixedLenFeature([num_labels], tf.int64)
    return spec


def analysis_rows(result, split, num_labels, label_ids):
    """ShardResult -> one analysis row for a shard of `split` with records (else nothing)."""
    import numpy as np

    if result.split != split or not result.written.num_examples:
        return
    moments = result.sums.pixel_moments
    if moments is None:  # --sink beam, or a shard an incremental build reused or copied
        raise ValueError(f"shard stats for {result.files.path!r} ({result.kind or 'images'})"
                         " carry no pixel moments: the transform analysis needs every train "
                         "shard written from its images (--sink shards, a full build) or "
                         "--no_transform")
    counts = np.zeros(num_labels, np.int64)
    for label, n in result.sums.label_counts.items():
        counts[label_ids[label]] = n
    # Sums of uint8 values (and squares) are integers, held exactly by the float64 stats.
    values = [moments.count, *moments.sum, *moments.sum_sq]
    yield {schema.ENCODED: b"", schema.LABEL: 0,  # placeholders: the analysis never reads them
           MOMENTS: np.array([round(v) for v in values], np.int64), LABEL_COUNTS: counts}


DCT_METHOD = "INTEGER_ACCURATE"  # libjpeg's ISLOW, as Pillow: TF's default (IFAST) is ~1 level off


def decode_and_resize(jpeg, image_size):
    """[B] JPEG strings -> float32 [B, S, S, 3] in 0..255 (whole image, antialiased bilinear)."""
    import tensorflow as tf

    def one(data):
        image = tf.cast(tf.io.decode_jpeg(data, channels=3, dct_method=DCT_METHOD), tf.float32)
        return tf.image.resize(image, [image_size, image_size], method="bilinear",
                               antialias=True)

    return tf.map_fn(one, jpeg, fn_output_signature=tf.TensorSpec(
        [image_size, image_size, 3], tf.float32))


def make_preprocessing_fn(image_size, labels):
    """The TFT preprocessing_fn: raw parsed features -> {"image", "label"} (module docstring)."""
    labels = tuple(labels)

    def preprocessing_fn(inputs):
        import tensorflow as tf
        import tensorflow_transform as tft

        # Analysis only: one row per train shard -> mean, std (float32 [3]) and two assets.
        # Two analyzers, because TFT 1.21 makes every output of a ptransform_analyzer an
        # asset as soon as one is (it wraps a None default value too).
        mean, std = tft.experimental.ptransform_analyzer(
            [inputs[MOMENTS]], Normalization(), [tf.float32, tf.float32], [[3], [3]],
            name="normalization")
        tft.experimental.ptransform_analyzer(
            [inputs[MOMENTS], inputs[LABEL_COUNTS]], TrainSummary(labels),
            [tf.string, tf.string], [[], []], output_asset_default_values=[b"", b"{}"],
            name="train_summary")
        tft.annotate_asset(transform_assets.LABEL_VOCABULARY, transform_assets.LABEL_VOCABULARY)
        tft.annotate_asset(transform_assets.STATISTICS, transform_assets.STATISTICS)

        # The output branch: never run by the analysis, only by readers and serving.
        image = decode_and_resize(inputs[schema.ENCODED], image_size)  # [B, S, S, 3]
        image = (image - mean) / tf.where(std > 0, std, tf.ones_like(std))
        return {transform_assets.IMAGE: image, transform_assets.LABEL: tf.identity(inputs[schema.LABEL])}

    return preprocessing_fn


def _sum_rows(batches, widths):
    """Batches of per-shard arrays ([B, n] each) -> per array, its column sums as Python ints.

    Python integers: exact whatever the dataset size (an int64 sum of squares would
    overflow past ~1.4e14 pixels). No rows (no train records): zeros.
    """
    totals = [[0] * n for n in widths]
    for batch in batches:
        for i, rows in enumerate(batch):
            for row in rows.tolist():
                totals[i] = [a + b for a, b in zip(totals[i], row)]
    return tuple(totals)


def normalization(moments):
    """(count, sums, sums of squares) -> (mean, std) per channel in float64; std 1 if flat."""
    import numpy as np

    count = max(moments[0], 1)
    mean = np.array(moments[1:4], np.float64) / count
    # E[x²] - E[x]² from exact integer sums: float64 rounding only (~1e-12 of the variance).
    var = np.maximum(np.array(moments[4:7], np.float64) / count - mean * mean, 0.0)
    std = np.sqrt(var)
    return mean, np.where(std > 0, std, 1.0)


def _write_vocabulary(summary, labels, temp_dir):
    """-> path of a '<count> <name>' file, line i = class id i (TFT copies it to assets)."""
    _, counts = summary
    return _write_asset(temp_dir, transform_assets.LABEL_VOCABULARY,
                        transform_assets.label_vocabulary_text(labels, counts))


def _write_statistics(summary, temp_dir):
    """-> path of a JSON file with the train split's pixel statistics (float64)."""
    moments, counts = summary
    mean, std = normalization(moments)
    return _write_asset(temp_dir, transform_assets.STATISTICS, transform_assets.statistics_text(
        sum(counts), moments[0], mean.tolist(), std.tolist()))


def _write_asset(temp_dir, name, text):
    import uuid

    import numpy as np

    path = "/".join([temp_dir, uuid.uuid4().hex, name])
    files.write_bytes(path, text.encode())
    return np.array(path.encode())


def _constant(summary, which):
    import numpy as np

    return np.asarray(normalization(summary[0])[which], np.float32)


def _sum(batches, label, widths):
    return (batches                                  # -> tuple of [B, n] int64 arrays
            | f"{label}Batches" >> beam.combiners.ToList()  # one batch per ~1000 train shards
            | f"{label}Sums" >> beam.Map(_sum_rows, widths))  # -> tuple of n Python ints each


class Normalization(beam.PTransform):
    """TFT ptransform analyzer: per-shard moment rows -> mean, std (float32 [3] each)."""

    def expand(self, batches):
        summary = _sum(batches, "Moments", (7,))        # -> ((7 ints),)
        return (summary | "Mean" >> beam.Map(_constant, 0),
                summary | "Std" >> beam.Map(_constant, 1))


class TrainSummary(PTransformAnalyzer):
    """TFT ptransform analyzer: per-shard (moments, label counts) rows -> two asset paths.

    label_vocabulary: counts by the ids the shard writer used (never re-assigned), names
    from the label map; pixel_statistics.json: mean/std in float64, for the manifest (no need
    to load the saved graph to learn the numbers). TFT gives it `base_temp_dir` and copies
    both files into transform_fn/assets.
    """

    def __init__(self, labels):
        super().__init__()
        self.labels = tuple(labels)

    def expand(self, batches):
        summary = _sum(batches, "Shards", (7, len(self.labels)))
        # ([B, 7] moments, [B, K] counts) batches -> (7 ints, K ints)
        return (summary | "WriteVocabulary" >> beam.Map(
                    _write_vocabulary, self.labels, self.base_temp_dir),
                summary | "WriteStatistics" >> beam.Map(_write_statistics, self.base_temp_dir))


class AnalyzeTrain(beam.PTransform):
    """PCollection of ShardResults -> one manifest part, after VDIR/transform_fn/ is written."""

    def __init__(self, spec, image_size, split="train"):
        super().__init__()
        if image_size < 1:
            raise ValueError(f"transform image_size must be >= 1, not {image_size}")
        self.spec, self.image_size, self.split = spec, image_size, split

    def expand(self, results):
        import tensorflow_transform as tft
        import tensorflow_transform.beam as tft_beam

        spec = self.spec
        if self.split not in spec.num_shards:
            logging.warning("no %s split: the tf.Transform analysis is skipped", self.split)
            return results.pipeline | "NoTransform" >> beam.Create([{}])

        labels = tuple(spec.labels)
        label_ids = {label: i for i, label in enumerate(labels)}
        rows = (results
                | "AnalysisRows" >> beam.FlatMap(analysis_rows, self.split, len(labels),
                                                 label_ids))
                # -> {MOMENTS: int64 [7], LABEL_COUNTS: int64 [K], record keys: placeholders}
        metadata = tft.DatasetMetadata.from_feature_spec(raw_feature_spec(len(labels)))
        with tft_beam.Context(temp_dir=f"{spec.tmp_dir}/{TFT_TEMP}",
                              force_tf_compat_v1=FORCE_TF_COMPAT_V1):
            transform_fn = ((rows, metadata)
                            | "AnalyzeDataset" >> tft_beam.AnalyzeDataset(
                                make_preprocessing_fn(self.image_size, labels)))
            # -> (saved transform graph in the temp dir, transformed metadata)
            written = transform_fn | "WriteTransformFn" >> tft_beam.WriteTransformFn(spec.vdir)
            # -> [None] once VDIR/transform_fn and VDIR/transformed_metadata exist
        return written | "ManifestPart" >> beam.Map(
            manifest_part, spec.vdir, labels, self.image_size, self.split)


def manifest_part(_, vdir, labels, image_size, split):
    """Read back the two small assets just written -> {"transform": {...}} for manifest.json."""
    import tensorflow_transform as tft

    tft_output = tft.TFTransformOutput(vdir)  # reads metadata only; the graph is not loaded
    statistics = transform_assets.read_statistics(tft_output)
    mean, std = statistics["mean"], statistics["std"]
    vocabulary = transform_assets.read_label_vocabulary(tft_output)  # [(name, count)] by id
    if [name for name, _ in vocabulary] != list(labels):
        raise ValueError(f"label vocabulary {[n for n, _ in vocabulary]} does not follow the "
                         f"label map {list(labels)}")
    counts = dict(vocabulary)
    return {"transform": {
        "transform_fn": tft.TFTransformOutput.TRANSFORM_FN_DIR,
        "transformed_metadata": tft.TFTransformOutput.TRANSFORMED_METADATA_DIR,
        "tensorflow_transform": tft.__version__,
        "raw_features": list(RAW_KEYS),
        "analysis_features": [MOMENTS, LABEL_COUNTS],  # absent from records and requests
        "outputs": {
            transform_assets.IMAGE: {"dtype": "float32", "shape": [image_size, image_size, 3],
                                  "value": "(resize(decode_jpeg(image/encoded)) - mean) / std"},
            transform_assets.LABEL: {"dtype": "int64", "shape": [],
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
            "resolution": "full resolution, exact",
            "source": "the shard writer's pixels: the decoded input for a JPEG stored as is, "
                      "the pixels it encoded for a re-encoded image",
        },
        "label_vocabulary": {
            "path": layout.join(tft.TFTransformOutput.TRANSFORM_FN_DIR, layout.TRANSFORM_ASSETS,
                                transform_assets.LABEL_VOCABULARY),
            "format": "'<train count> <class name>' per line; line i is label id i",
            "train_counts": {name: counts.get(name, 0) for name in labels},
        },
    }}
