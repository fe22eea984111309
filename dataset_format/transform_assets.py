"""The tf.Transform output's names and its two small assets, written by the build
(beam_pipeline/job/analyze.py) and read by the training side (readers/transform.py): one
owner of their text formats, below both.

    transform_fn/assets/label_vocabulary      '<train count> <class name>' per line, line i = id i
    transform_fn/assets/pixel_statistics.json {num_images, num_pixels, mean, std} (RGB, 0..255)

Pure Python: the assets are read through dataset_format/storage.py (local or gs://), so the
job, which never imports TensorFlow outside --transform's graph, reads them as readers do.
"""

import json

from dataset_format import layout, storage

IMAGE = "image"          # the transformed feature names (the graph's outputs)
LABEL = "label"
LABEL_VOCABULARY = layout.TRANSFORM_LABEL_VOCABULARY  # transform_fn/assets/<this>
STATISTICS = layout.TRANSFORM_STATISTICS              # transform_fn/assets/<this>


def label_vocabulary_text(labels, counts):
    """The label vocabulary asset's text: class names by id with their train counts."""
    return "".join(f"{int(c)} {name}\n" for c, name in zip(counts, labels))


def parse_label_vocabulary(text):
    """[(class name, train count)]; index i is label id i."""
    rows = [line.partition(" ") for line in text.split("\n") if line]
    return [(name, int(count)) for count, _, name in rows]


def statistics_text(num_images, num_pixels, mean, std):
    """The pixel statistics asset's text (float64 values as JSON numbers)."""
    return json.dumps({"num_images": int(num_images), "num_pixels": int(num_pixels),
                       "mean": list(mean), "std": list(std)})


def read_label_vocabulary(tft_output):
    """[(class name, train count)] from a `tft.TFTransformOutput`'s vocabulary asset."""
    return parse_label_vocabulary(storage.read_text(_asset(tft_output, LABEL_VOCABULARY)))


def read_statistics(tft_output):
    """The train split's pixel statistics: {num_images, num_pixels, mean, std} (RGB)."""
    return json.loads(storage.read_text(_asset(tft_output, STATISTICS)))


def _asset(tft_output, name):
    path = tft_output.vocabulary_file_by_name(name)  # any named asset, not only vocabularies
    if not path:
        raise FileNotFoundError(f"{tft_output.transform_savedmodel_dir}: no {name} asset")
    return path
