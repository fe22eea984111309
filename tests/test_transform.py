"""tf.Transform (`--transform`, off by default): statistics from the shard writer, the saved
graph, the reader and serving.

One real build (in-process FnApiRunner, --transform) is shared by the module. Its inputs use
the ROOT/<split>/<class>/ layout so the splits are known: train images are smooth colour
fields with noise in reds and greys, all baseline JPEGs (stored as is) but one PNG (stored
re-encoded); validation/test images are saturated blue and green, so any leak of them into
the statistics would move the blue/green means by tens of levels.

The statistics are exact over the stored pixels at full resolution (docs/transform.md): the
manifest's mean/std equal a NumPy pass over the decoded stored train JPEGs (and, for the
re-encoded PNG, the pixels that were encoded) to float rounding.
"""

import hashlib
import io
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from dataset_format import layout, schema
from tests.helpers import REPO, fields_of

IMAGE_SIZE = 32   # --transform_image_size: small, so the graph runs fast in tests
CLASSES = ("apple", "beet", "cherry")
TRAIN_COUNTS = {"apple": 7, "beet": 5, "cherry": 3}  # unbalanced, so frequencies mean something
REENCODED = "train/beet/01.png"  # the one train input that is not stored byte for byte


def _photo(rng, size, tint):
    """A smooth colour field with noise and an edge, like a small photo; RGB uint8."""
    w, h = size
    low = rng.uniform(0, 1, (4, 5, 3)) * 120 + np.asarray(tint, np.float64)
    field = np.asarray(Image.fromarray(low.clip(0, 255).astype(np.uint8)).resize(
        (w, h), Image.BICUBIC), np.float64)
    field[:, : w // 3] *= 0.6
    field += rng.normal(0, 6, field.shape)
    return Image.fromarray(field.clip(0, 255).astype(np.uint8))


def _encode(img, fmt="JPEG"):
    buf = io.BytesIO()
    img.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def _pixels(data):
    """Every pixel of an encoded image, decoded in full by Pillow: float64 [N, 3]."""
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), np.float64).reshape(-1, 3)


def _write_inputs(root):
    """-> {sha256 of the input bytes: the input bytes} of every train input."""
    rng = np.random.default_rng(6)
    sizes = [(96, 72), (120, 90), (80, 100), (300, 225), (520, 390)]
    train, n = {}, 0
    for label, count in TRAIN_COUNTS.items():
        tint = {"apple": (110, 20, 10), "beet": (90, 40, 50), "cherry": (70, 60, 60)}[label]
        for i in range(count):
            name = f"train/{label}/{i:02d}.jpg"
            fmt = "PNG" if name.replace(".jpg", ".png") == REENCODED else "JPEG"
            data = _encode(_photo(rng, sizes[n % len(sizes)], tint), fmt)
            path = os.path.join(root, name if fmt == "JPEG" else REENCODED)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
            train[hashlib.sha256(data).hexdigest()] = data
            n += 1
    for split, channel in (("validation", 2), ("test", 1)):  # saturated blue / green
        for i, label in enumerate(CLASSES * 2):
            colour = [8 * i, 8 * i, 8 * i]
            colour[channel] = 255 - 4 * i  # a shade per image: every record looks different
            path = os.path.join(root, split, label, f"{i:02d}.jpg")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(_encode(Image.new("RGB", (200 + 10 * i, 150), tuple(colour))))
    return train


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from beam_pipeline import cli

    src = tmp_path_factory.mktemp("transform_inputs")
    train_inputs = _write_inputs(str(src))
    root = str(tmp_path_factory.mktemp("transform_built") / "dataset")
    result = cli.run(["--input", str(src), "--output", root, "--name", "veg", "--transform",
                      "--num_shards", "2", "--transform_image_size", str(IMAGE_SIZE)])
    assert result.status == "published", result
    return dict(fields_of(result), root=root, train_inputs=train_inputs)


@pytest.fixture(scope="module")
def tft_output(built):
    from readers import transform as transform_lib

    return transform_lib.load(built["root"])


def _records(built, split):
    """[(serialized, parsed dict)] of a split, in manifest (reader eval) order."""
    import tensorflow as tf

    vdir, manifest = built["version_dir"], built["manifest"]
    files = [layout.join(vdir, s["path"]) for s in manifest["splits"][split]["shards"]]
    spec = schema.feature_spec()
    return [(r.numpy(), tf.io.parse_single_example(r, spec))
            for r in tf.data.TFRecordDataset(files)]


def _stored_train_pixels(built):
    """The pixels the statistics promise: each stored train JPEG decoded in full; for the
    re-encoded input, the pixels that were encoded (the PNG's own)."""
    inputs, pixels, reencoded = built["train_inputs"], [], 0
    for _, ex in _records(built, "train"):
        data = ex[schema.ENCODED].numpy()
        if hashlib.sha256(data).hexdigest() in inputs:  # stored as is
            pixels.append(_pixels(data))
        else:
            assert ex[schema.FILENAME].numpy().decode().endswith(".png")
            png = next(d for d in inputs.values() if d.startswith(b"\x89PNG"))
            pixels.append(_pixels(png))
            reencoded += 1
    assert reencoded == 1
    return np.concatenate(pixels)


# --- the build ------------------------------------------------------------------------------

@pytest.mark.slow
def test_manifest_records_the_transform_output(built):
    manifest, vdir = built["manifest"], built["version_dir"]
    t = manifest["transform"]
    assert (t["transform_fn"], t["transformed_metadata"]) == ("transform_fn",
                                                              "transformed_metadata")
    assert os.path.isfile(os.path.join(vdir, "transform_fn", "saved_model.pb"))
    assert os.path.isfile(os.path.join(vdir, "transformed_metadata", "schema.pbtxt"))
    assert t["image_size"] == IMAGE_SIZE and t["statistics"]["split"] == "train"
    assert t["statistics"]["resolution"] == "full resolution, exact"
    assert t["raw_features"] == [schema.ENCODED, schema.LABEL]
    assert t["outputs"]["image"]["shape"] == [IMAGE_SIZE, IMAGE_SIZE, 3]
    assert t["outputs"]["label"]["dtype"] == "int64"
    # The TFT temp dir went with the version's .tmp; nothing else was left behind.
    assert not os.path.exists(os.path.join(vdir, ".tmp"))


@pytest.mark.slow
def test_label_vocabulary_counts_train_ids_in_id_order(built, tft_output):
    from readers import transform as transform_lib

    manifest = built["manifest"]
    vocabulary = transform_lib.read_label_vocabulary(tft_output)
    assert [name for name, _ in vocabulary] == manifest["labels"] == sorted(CLASSES)
    assert dict(vocabulary) == TRAIN_COUNTS == manifest["splits"]["train"]["label_counts"]
    assert manifest["transform"]["label_vocabulary"]["train_counts"] == TRAIN_COUNTS
    assert manifest["transform"]["statistics"]["num_images"] == sum(TRAIN_COUNTS.values())


@pytest.mark.slow
def test_statistics_are_exact_over_the_stored_train_pixels(built, tft_output):
    from readers import transform as transform_lib

    t = built["manifest"]["transform"]
    pixels = _stored_train_pixels(built)
    statistics = transform_lib.read_statistics(tft_output)  # full float64
    assert statistics["num_pixels"] == t["statistics"]["num_pixels"] == len(pixels)
    np.testing.assert_allclose(statistics["mean"], pixels.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(statistics["std"], pixels.std(axis=0), rtol=1e-9)
    np.testing.assert_allclose(t["mean"], pixels.mean(axis=0), atol=1e-4)  # rounded
    # The manifest's numbers are the ones the saved graph applies (float32 constants).
    graph_mean, graph_std = transform_lib.normalization(tft_output)
    np.testing.assert_allclose(graph_mean, statistics["mean"], atol=1e-3)
    np.testing.assert_allclose(graph_std, statistics["std"], rtol=1e-5)


@pytest.mark.slow
def test_validation_and_test_images_do_not_influence_the_statistics(built):
    t = built["manifest"]["transform"]
    train = _stored_train_pixels(built)
    others = [_pixels(ex[schema.ENCODED].numpy()) for split in ("validation", "test")
              for _, ex in _records(built, split)]
    everything = np.concatenate([train] + others)
    assert np.all(np.abs(everything.mean(0) - train.mean(0))[1:] > 10)  # a leak would show
    np.testing.assert_allclose(t["mean"], train.mean(0), atol=1e-4)


# --- the analysis rows (no Beam) ------------------------------------------------------------

def test_analysis_rows_carry_exact_shard_sums():
    from beam_pipeline.job import analyze
    from beam_pipeline.job.contracts import PixelMoments, ShardFiles, ShardResult, Sums, Written

    def stats_of(split, shard, n, path, counts=None, moments=None):
        return ShardResult(split, shard, files=ShardFiles(path), written=Written(n),
                           sums=Sums(counts or {}, moments))

    labels = {"a": 0, "b": 1, "c": 2}
    big = 255.0 ** 2 * 4e10  # a shard's sum of squares beyond float32, exact in float64
    stats = [stats_of("train", 0, 3, "x", {"c": 2, "a": 1},
                      PixelMoments(12, (1.0, 2.0, 3.0), (4.0, 5.0, big))),
             stats_of("train", 1, 0, "y"),
             stats_of("validation", 0, 2, "z", {"a": 2}, PixelMoments(1))]
    rows = [r for s in stats for r in analyze.analysis_rows(s, "train", 3, labels)]
    assert len(rows) == 1
    assert rows[0][analyze.MOMENTS].tolist() == [12, 1, 2, 3, 4, 5, int(big)]
    assert rows[0][analyze.LABEL_COUNTS].tolist() == [1, 0, 2]
    with pytest.raises(ValueError, match="--no_transform"):  # e.g. --sink beam's stats
        list(analyze.analysis_rows(stats_of("train", 2, 1, "w", {"a": 1}), "train", 3, labels))


def test_rows_sum_exactly_to_numpy_statistics():
    """Per-shard integer sums, added in Python ints -> float64 mean/std as NumPy's."""
    from beam_pipeline.job import analyze, images

    rng = np.random.default_rng(0)
    shards = [rng.integers(0, 256, (n, 3), dtype=np.uint8) for n in (5000, 7, 12345)]
    rows = []
    for shard in shards:
        count, sums, squares = images.pixel_moments(shard.reshape(-1, 1, 3))
        rows.append([count, *sums, *squares])
    batches = [(np.array(rows[:2], np.int64), np.ones((2, 3), np.int64)),
               (np.array(rows[2:], np.int64), np.ones((1, 3), np.int64))]
    moments, counts = analyze._sum_rows(batches, (7, 3))
    assert counts == [3, 3, 3]
    mean, std = analyze.normalization(moments)
    everything = np.concatenate(shards).astype(np.float64)
    np.testing.assert_allclose(mean, everything.mean(0), rtol=1e-13)
    np.testing.assert_allclose(std, everything.std(0), rtol=1e-10)
    no_rows = analyze._sum_rows([], (7, 3))
    assert no_rows == ([0] * 7, [0] * 3)
    assert analyze.normalization(no_rows[0])[1].tolist() == [1.0, 1.0, 1.0]  # identity


# --- the default build never loads tf.Transform -----------------------------------------------

@pytest.mark.slow
def test_a_default_build_imports_neither_tensorflow_transform_nor_tensorflow(tmp_path):
    """Launcher and job in one process (in-process FnApiRunner): what they import is here."""
    src = tmp_path / "in"
    for label in ("a", "b"):
        (src / label).mkdir(parents=True)
        for i in range(3):
            (src / label / f"{i}.jpg").write_bytes(
                _encode(Image.new("RGB", (16, 16), (9 * i, 9, 9))))
    code = ("import sys\n"
            "from beam_pipeline import cli\n"
            f"assert cli.main(['--input', {str(src)!r}, '--output', {str(tmp_path / 'out')!r}])"
            " == 0\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'tensorflow_transform', 'tfx_bsl')))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


# --- the reader -----------------------------------------------------------------------------

@pytest.mark.slow
def test_reader_batch_equals_the_saved_transform_applied_by_hand(built, tft_output):
    import tensorflow as tf

    import readers

    records = [ex for _, ex in _records(built, "validation")]
    ds = readers.make_dataset(built["root"], "validation", batch_size=len(records),
                              transform=True, image_size=IMAGE_SIZE)
    images, labels = next(iter(ds))
    assert images.shape == (len(records), IMAGE_SIZE, IMAGE_SIZE, 3)
    assert images.dtype == tf.float32 and labels.dtype == tf.int32

    by_hand = tft_output.transform_raw_features({
        schema.ENCODED: tf.stack([ex[schema.ENCODED] for ex in records]),
        schema.LABEL: tf.stack([ex[schema.LABEL] for ex in records])})
    # The reader interleaves shard files; pair each of its images with its record by content.
    diffs = np.abs(images.numpy()[:, None] - by_hand["image"].numpy()[None]).max(axis=(2, 3, 4))
    match = diffs.argmin(axis=1)
    assert sorted(match) == list(range(len(records)))
    # The reader crops and decodes with TensorFlow's fast DCT; the graph resizes the whole
    # image, decoded exactly: on these flat images, within a level (std is ~60 levels).
    assert diffs[np.arange(len(records)), match].max() < 0.05
    assert labels.numpy().tolist() == by_hand["label"].numpy()[match].tolist()
    assert by_hand["label"].numpy().tolist() == [int(ex[schema.LABEL]) for ex in records]

    # Normalized with the train statistics: (pixel - mean) / std of a flat validation image.
    t = built["manifest"]["transform"]
    jpeg = records[int(match[0])][schema.ENCODED].numpy()
    pixel = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), np.float64)[75, 100]
    expected = (pixel - np.asarray(t["mean"])) / np.asarray(t["std"])
    np.testing.assert_allclose(images.numpy()[0, IMAGE_SIZE // 2, IMAGE_SIZE // 2], expected,
                               atol=0.02)


@pytest.mark.slow
def test_reader_without_a_transform_output_says_how_to_get_one(tmp_path):
    import readers
    from beam_pipeline import cli

    src = tmp_path / "in"
    for label in ("a", "b"):
        (src / label).mkdir(parents=True)
        (src / label / "0.jpg").write_bytes(_encode(Image.new("RGB", (16, 16), (9, 9, 9))))
    cli.run(["--input", str(src), "--output", str(tmp_path / "out"), "--splits", "train=1"])
    assert not os.path.exists(layout.join(readers.info(str(tmp_path / "out")).version_dir,
                                          "transform_fn"))
    with pytest.raises(ValueError, match="--no_transform"):
        readers.make_dataset(str(tmp_path / "out"), transform=True)


# --- serving --------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_transform_layer_takes_raw_jpeg_bytes_alone(built, tft_output):
    """Served requests carry no shard columns (nor a label): TFT supplies what is unfed."""
    import tensorflow as tf

    from beam_pipeline.job import analyze

    jpeg = _records(built, "test")[0][1][schema.ENCODED]
    out = tft_output.transform_features_layer()({schema.ENCODED: tf.stack([jpeg, jpeg])})
    assert set(out) == {"image"}  # label needs image/class/label; the image needs nothing else
    assert out["image"].shape == (2, IMAGE_SIZE, IMAGE_SIZE, 3)
    assert analyze.MOMENTS not in built["manifest"]["features"]


@pytest.mark.slow
def test_saved_keras_model_with_the_transform_layer_predicts_from_a_raw_jpeg(
        built, tft_output, tmp_path):
    import tensorflow as tf
    import tf_keras as keras  # the TFT layer is a Keras 2 model

    from readers import transform as transform_lib

    inputs = keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3))
    x = keras.layers.GlobalAveragePooling2D()(inputs)
    model = keras.Model(inputs, keras.layers.Dense(len(CLASSES), activation="softmax")(x))
    serialized, example = _records(built, "test")[0]
    jpeg = example[schema.ENCODED].numpy()
    # What the model predicts on the saved transform applied by hand...
    expected = model(transform_lib.transform_jpegs(tft_output, [jpeg])["image"]).numpy()

    path = str(tmp_path / "served")
    tf.saved_model.save(model, path, signatures=transform_lib.serving_signatures(model, tft_output))
    loaded = tf.saved_model.load(path)
    # ...is what the saved model answers to the raw JPEG bytes, or to the tf.Example.
    from_jpeg = loaded.signatures["serving_jpeg"](image_bytes=tf.constant([jpeg]))["outputs"]
    from_example = loaded.signatures["serving_default"](
        examples=tf.constant([serialized]))["outputs"]
    assert from_jpeg.shape == (1, len(CLASSES))
    np.testing.assert_allclose(from_jpeg.numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(from_example.numpy(), expected, atol=1e-5)
