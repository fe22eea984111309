"""The tf.train.Example keys (docs/format.md): the one place writer and reader take them from."""

ENCODED = "image/encoded"
FORMAT = "image/format"
HEIGHT = "image/height"
WIDTH = "image/width"
CHANNELS = "image/channels"
COLORSPACE = "image/colorspace"
LABEL = "image/class/label"
TEXT = "image/class/text"
FILENAME = "image/filename"
SHA256 = "image/key/sha256"

# key -> dtype name, as recorded in manifest["features"]; every key is a scalar.
FEATURES = {
    ENCODED: "string",
    FORMAT: "string",
    HEIGHT: "int64",
    WIDTH: "int64",
    CHANNELS: "int64",
    COLORSPACE: "string",
    LABEL: "int64",
    TEXT: "string",
    FILENAME: "string",
    SHA256: "string",
}


def feature_spec(keys=None):
    """A `tf.io.parse_example` spec for `keys` (default: all of them)."""
    import tensorflow as tf

    dtypes = {"string": tf.string, "int64": tf.int64}
    return {k: tf.io.FixedLenFeature([], dtypes[FEATURES[k]]) for k in (keys or FEATURES)}
