"""The dataset's tf.Transform output on the reading side: load it, apply it, serve with it.

A build with `--transform` writes VDIR/transform_fn/ and VDIR/transformed_metadata/ and
records them under manifest["transform"]. The saved graph maps raw parsed features
(`image/encoded`, `image/class/label`) to model-ready ones (its analysis-only `shard/*`
inputs are never fed: TFT supplies them, and no output depends on them):

    image  float32 [S, S, 3]  (resize(decode_jpeg(image/encoded), S×S) - mean) / std
    label  int64   []         image/class/label, unchanged

`make_dataset(..., transform=True)` normalizes with the graph's own statistics
(`statistics_of`) after the reader's crops, flips and resize: the graph's values, at the
reader's speed (the graph's exact decode and antialiased resize ran at a quarter of it). A
Keras model that embeds `tft_output.transform_features_layer()` applies the very graph at
serving time, so a saved model can take raw JPEG bytes (see `serving_signatures` and
docs/transform.md); `record_fn` applies it in a tf.data map.

TensorFlow and tensorflow_transform load when a function here runs, not at import. Note that
importing tensorflow_transform sets TF_USE_LEGACY_KERAS=1 (its layer is a Keras 2 `tf_keras`
model), so build the model that embeds the layer with `tf_keras`.
"""

from dataset_format import dataset_info as info_lib, layout, schema
from dataset_format.transform_assets import (IMAGE, LABEL, LABEL_VOCABULARY,  # noqa: F401
                                             STATISTICS, read_label_vocabulary,
                                             read_statistics)
_SERVING_KEYS = ("image/encoded",)      # what a served request has to carry


def load(path):
    """A `tft.TFTransformOutput` for a dataset root, version dir or `readers.info()` result."""
    import tensorflow_transform as tft

    ds_info = path if isinstance(path, info_lib.DatasetInfo) else info_lib.info(path)
    if not ds_info.manifest.get("transform"):
        raise ValueError(f"{ds_info.version_dir}: this version has no tf.Transform output "
                         "(built with --no_transform, or before it existed); rebuild with "
                         "--transform to read it with transform=True")
    return tft.TFTransformOutput(ds_info.version_dir)


def statistics_of(ds_info):
    """(mean, std) per RGB channel, 0..255 scale: the train statistics the saved graph
    normalizes with, read from its asset (float64) without loading tensorflow_transform."""
    import json

    import tensorflow as tf

    entry = ds_info.manifest.get("transform")
    if not entry:
        raise ValueError(f"{ds_info.version_dir}: this version has no tf.Transform output "
                         "(built with --no_transform, or before it existed); rebuild with "
                         "--transform to read it with transform=True")
    asset = layout.join(ds_info.version_dir, entry.get("transform_fn", layout.TRANSFORM_FN),
                        layout.TRANSFORM_ASSETS, STATISTICS)
    if tf.io.gfile.exists(asset):
        with tf.io.gfile.GFile(asset, "r") as f:
            statistics = json.load(f)
        return list(statistics["mean"]), list(statistics["std"])
    return list(entry["mean"]), list(entry["std"])  # rounded to 4 decimals


def record_fn(tft_output, label_shift=0):
    """A tf.data map function: serialized tf.Example -> (image [S, S, 3] float32, label int64).

    Extra positional arguments (e.g. per-element seeds) are ignored: the transform is
    deterministic preprocessing, not augmentation.
    """
    import tensorflow as tf

    layer = tft_output.transform_features_layer()
    spec = schema.feature_spec((schema.ENCODED, schema.LABEL))

    def to_example(record, *unused):
        raw = tf.io.parse_example(record[None], spec)  # a batch of one: the graph is batched
        out = layer(raw)
        return out[IMAGE][0], out[LABEL][0] + label_shift

    to_example.tft_layer = layer  # keep the loaded graph alive with the function
    return to_example


def transform_jpegs(tft_output, jpegs):
    """Apply the saved transform by hand to raw JPEG bytes -> dict of transformed tensors."""
    import tensorflow as tf

    return tft_output.transform_raw_features(
        {schema.ENCODED: tf.constant(list(jpegs), tf.string)}, drop_unused_features=True)


def normalization(tft_output):
    """(mean, std) per RGB channel, 0..255 scale, as applied by the saved graph.

    Runs the graph on two flat JPEGs, black and white (they decode exactly), and inverts
    out = (v - mean) / std: std = 255 / (out_white - out_black), mean = -out_black * std.
    """
    import numpy as np
    import tensorflow as tf

    flats = [tf.io.encode_jpeg(tf.fill([16, 16, 3], tf.constant(v, tf.uint8)), quality=100)
             .numpy() for v in (0, 255)]
    image = transform_jpegs(tft_output, flats)[IMAGE].numpy().astype(np.float64)
    black, white = image[0].mean(axis=(0, 1)), image[1].mean(axis=(0, 1))
    std = 255.0 / (white - black)
    return (-black * std).tolist(), std.tolist()


def serving_signatures(model, tft_output):
    """Signatures for `tf.saved_model.save(model, path, signatures=...)` that embed the transform.

    `serving_default` takes serialized tf.Examples ("examples", [None] string) and
    `serving_jpeg` raw image bytes ("image_bytes", [None] string); both return the model's
    output for the transformed image. The layer is attached to `model` so it is saved with it.
    """
    import tensorflow as tf

    model.tft_layer = tft_output.transform_features_layer()
    spec = schema.feature_spec(_SERVING_KEYS)

    def predict(raw):
        return {"outputs": model(model.tft_layer(raw)[IMAGE])}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve_examples(examples):
        return predict(tf.io.parse_example(examples, spec))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
    def serve_jpeg(image_bytes):
        return predict({schema.ENCODED: image_bytes})

    return {"serving_default": serve_examples, "serving_jpeg": serve_jpeg}
