"""tf.Transform: train statistics, the saved transform graph, the reader and serving (issue 6).

One real build (DirectRunner, in-process, analysis on) is shared by the module. Its inputs use
the ROOT/<split>/<class>/ layout so the splits are known: train images are smooth colour
fields with noise in reds and greys; validation/test images are saturated blue and green, so
any leak of them into the statistics would move the blue/green means by tens of levels.

Stated tolerance (docs/transform.md): the analysis decodes each JPEG at the smallest DCT
scale (1/2, 1/4, 1/8) that keeps its shorter side >= S/4 (at least 32 px), so its statistics
are compared with a full-resolution NumPy pass (Pillow) within MEAN_TOL levels (0..255) and
STD_TOL relative (measured here: < 0.06 levels, < 0.9%). At full scale (images too small to
scale down) the per-image math agrees with NumPy to float rounding (EXACT_TOL).
"""

import io
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from beam_pipeline import analyze, cli
from readers import layout, schema

MEAN_TOL = 1.0    # levels, per channel
STD_TOL = 0.03    # relative, per channel
EXACT_TOL = 1e-3  # levels, at full resolution
IMAGE_SIZE = 32   # --transform_image_size: small, so the graph runs fast in tests
CLASSES = ("apple", "beet", "cherry")
TRAIN_COUNTS = {"apple": 7, "beet": 5, "cherry": 3}  # unbalanced, so frequencies mean something


def _photo(rng, size, tint):
    """A smooth colour field with noise and an edge, like a small photo; RGB uint8."""
    w, h = size
    low = rng.uniform(0, 1, (4, 5, 3)) * 120 + np.asarray(tint, np.float64)
    field = np.asarray(Image.fromarray(low.clip(0, 255).astype(np.uint8)).resize(
        (w, h), Image.BICUBIC), np.float64)
    field[:, : w // 3] *= 0.6
    field += rng.normal(0, 6, field.shape)
    return Image.fromarray(field.clip(0, 255).astype(np.uint8))


def _jpeg(img, quality=90):
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _write_inputs(root):
    rng = np.random.default_rng(6)
    # Mostly small (decoded at full scale), some large enough for 1/2 and 1/4 scale.
    sizes = [(96, 72), (120, 90), (80, 100), (300, 225), (520, 390)]
    n = 0
    for label, count in TRAIN_COUNTS.items():
        tint = {"apple": (110, 20, 10), "beet": (90, 40, 50), "cherry": (70, 60, 60)}[label]
        for i in range(count):
            path = os.path.join(root, "train", label, f"{i:02d}.jpg")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(_jpeg(_photo(rng, sizes[n % len(sizes)], tint)))
            n += 1
    for split, channel in (("validation", 2), ("test", 1)):  # saturated blue / green
        for i, label in enumerate(CLASSES * 2):
            colour = [8 * i, 8 * i, 8 * i]
            colour[channel] = 255 - 4 * i  # a shade per image: every record looks different
            path = os.path.join(root, split, label, f"{i:02d}.jpg")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(_jpeg(Image.new("RGB", (200 + 10 * i, 150), tuple(colour))))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    src = tmp_path_factory.mktemp("transform_inputs")
    _write_inputs(str(src))
    root = str(tmp_path_factory.mktemp("transform_built") / "dataset")
    result = cli.run(["--input", str(src), "--output", root, "--name", "veg",
                      "--num_shards", "2", "--transform_image_size", str(IMAGE_SIZE)])
    assert result["status"] == "published", result
    return dict(result, root=root)


@pytest.fixture(scope="module")
def tft_output(built):
    from readers import transform as transform_lib

    return transform_lib.load(built["root"])


def _records(built, split):
    """[(serialized, parsed dict)] of a split, in manifest (reader eval) order."""
    vdir, manifest = built["version_dir"], built["manifest"]
    files = [layout.join(vdir, s["path"]) for s in manifest["splits"][split]["shards"]]
    spec = schema.feature_spec()
    return [(r.numpy(), tf.io.parse_single_example(r, spec))
            for r in tf.data.TFRecordDataset(files)]


def _numpy_stats(jpegs):
    """Per-channel mean/std over every pixel of the images, decoded in full by Pillow."""
    pixels = np.concatenate([np.asarray(Image.open(io.BytesIO(j)).convert("RGB"),
                                        np.float64).reshape(-1, 3) for j in jpegs])
    return pixels.mean(axis=0), pixels.std(axis=0)


# --- the build ------------------------------------------------------------------------------

def test_manifest_records_the_transform_output(built):
    manifest, vdir = built["manifest"], built["version_dir"]
    t = manifest["transform"]
    assert (t["transform_fn"], t["transformed_metadata"]) == ("transform_fn",
                                                              "transformed_metadata")
    assert os.path.isfile(os.path.join(vdir, "transform_fn", "saved_model.pb"))
    assert os.path.isfile(os.path.join(vdir, "transformed_metadata", "schema.pbtxt"))
    assert t["image_size"] == IMAGE_SIZE and t["statistics"]["split"] == "train"
    assert t["outputs"]["image"]["shape"] == [IMAGE_SIZE, IMAGE_SIZE, 3]
    assert t["outputs"]["label"]["dtype"] == "int64"
    # The TFT temp dir went with the version's .tmp; nothing else was left behind.
    assert not os.path.exists(os.path.join(vdir, ".tmp"))
    assert not os.path.exists(os.path.join(vdir, "transform_tmp"))


def test_label_vocabulary_counts_train_ids_in_id_order(built, tft_output):
    from readers import transform as transform_lib

    manifest = built["manifest"]
    vocabulary = transform_lib.read_label_vocabulary(tft_output)
    assert [name for name, _ in vocabulary] == manifest["labels"] == sorted(CLASSES)
    assert dict(vocabulary) == TRAIN_COUNTS == manifest["splits"]["train"]["label_counts"]
    assert manifest["transform"]["label_vocabulary"]["train_counts"] == TRAIN_COUNTS
    assert manifest["transform"]["statistics"]["num_images"] == sum(TRAIN_COUNTS.values())
    # ...and the ids in the records are the label map's (TFT assigned none).
    for _, ex in _records(built, "train"):
        assert manifest["labels"][int(ex[schema.LABEL])] == ex[schema.TEXT].numpy().decode()


def test_statistics_match_numpy_over_the_train_images(built, tft_output):
    from readers import transform as transform_lib

    t = built["manifest"]["transform"]
    train = [ex[schema.ENCODED].numpy() for _, ex in _records(built, "train")]
    mean, std = _numpy_stats(train)
    np.testing.assert_allclose(t["mean"], mean, atol=MEAN_TOL)
    np.testing.assert_allclose(t["std"], std, rtol=STD_TOL)
    # The manifest's numbers are the ones the saved graph applies.
    graph_mean, graph_std = transform_lib.normalization(tft_output)
    np.testing.assert_allclose(graph_mean, t["mean"], atol=1e-3)
    np.testing.assert_allclose(graph_std, t["std"], rtol=1e-5)


def test_validation_and_test_images_do_not_influence_the_statistics(built):
    t = built["manifest"]["transform"]
    train = [ex[schema.ENCODED].numpy() for _, ex in _records(built, "train")]
    everything = train + [ex[schema.ENCODED].numpy() for split in ("validation", "test")
                          for _, ex in _records(built, split)]
    all_mean, _ = _numpy_stats(everything)
    train_mean, _ = _numpy_stats(train)
    assert np.all(np.abs(all_mean - train_mean)[1:] > 10 * MEAN_TOL)  # a leak would show
    np.testing.assert_allclose(t["mean"], train_mean, atol=MEAN_TOL)


def test_image_moments_are_exact_at_full_scale():
    """The per-image analysis math (no Beam): count, mean and mean square of the pixels."""
    rng = np.random.default_rng(0)
    jpeg = _jpeg(_photo(rng, (90, 70), (60, 60, 60)))
    pixels = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), np.float64).reshape(-1, 3)
    moments = analyze._image_moments(tf.constant(jpeg), min_side=64).numpy()  # 70 < 128: 1/1
    assert moments[0] == 90 * 70
    np.testing.assert_allclose(moments[1:4], pixels.mean(0), atol=EXACT_TOL)
    np.testing.assert_allclose(moments[4:7], np.square(pixels).mean(0), rtol=1e-6)
    small = analyze._ratio_decode(tf.constant(_jpeg(_photo(rng, (520, 390), (0, 0, 0)))), 64)
    assert small.shape[:2] == (98, 130)  # 390 >= 4*64: decoded at 1/4


def test_train_shard_files_picks_train_shards_with_records():
    stats = [{"split": "train", "num_examples": 3, "temp": "a", "path": "x"},
             {"split": "train", "num_examples": 0, "temp": "b", "path": "y"},
             {"split": "validation", "num_examples": 2, "temp": "c", "path": "z"}]
    assert [f for s in stats for f in analyze.train_shard_files(s, "train")] == ["a"]
    with pytest.raises(ValueError, match="--no_transform"):
        list(analyze.train_shard_files({"split": "train", "num_examples": 1, "path": "w"},
                                       "train"))


# --- the reader -----------------------------------------------------------------------------

def test_reader_batch_equals_the_saved_transform_applied_by_hand(built, tft_output):
    import readers

    records = [ex for _, ex in _records(built, "validation")]
    ds = readers.make_dataset(built["root"], "validation", batch_size=len(records),
                              transform=True)
    images, labels = next(iter(ds))
    assert images.shape == (len(records), IMAGE_SIZE, IMAGE_SIZE, 3)
    assert images.dtype == tf.float32 and labels.dtype == tf.int64

    by_hand = tft_output.transform_raw_features({
        schema.ENCODED: tf.stack([ex[schema.ENCODED] for ex in records]),
        schema.LABEL: tf.stack([ex[schema.LABEL] for ex in records])})
    # The reader interleaves shard files; pair each of its images with its record by content.
    diffs = np.abs(images.numpy()[:, None] - by_hand["image"].numpy()[None]).max(axis=(2, 3, 4))
    match = diffs.argmin(axis=1)
    assert sorted(match) == list(range(len(records)))
    assert diffs[np.arange(len(records)), match].max() < 1e-5
    assert labels.numpy().tolist() == by_hand["label"].numpy()[match].tolist()
    assert by_hand["label"].numpy().tolist() == [int(ex[schema.LABEL]) for ex in records]

    # Normalized with the train statistics: (pixel - mean) / std of a flat validation image.
    t = built["manifest"]["transform"]
    jpeg = records[int(match[0])][schema.ENCODED].numpy()
    pixel = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), np.float64)[75, 100]
    expected = (pixel - np.asarray(t["mean"])) / np.asarray(t["std"])
    np.testing.assert_allclose(images.numpy()[0, IMAGE_SIZE // 2, IMAGE_SIZE // 2], expected,
                               atol=0.02)


def test_reader_without_a_transform_output_says_how_to_get_one(tmp_path):
    import readers

    src = tmp_path / "in"
    for label in ("a", "b"):
        (src / label).mkdir(parents=True)
        (src / label / "0.jpg").write_bytes(_jpeg(Image.new("RGB", (16, 16), (9, 9, 9))))
    cli.run(["--input", str(src), "--output", str(tmp_path / "out"), "--no_transform",
             "--splits", "train=1"])
    assert not os.path.exists(layout.join(readers.info(str(tmp_path / "out")).version_dir,
                                          "transform_fn"))
    with pytest.raises(ValueError, match="--no_transform"):
        readers.make_dataset(str(tmp_path / "out"), transform=True)


# --- serving --------------------------------------------------------------------------------

def test_saved_keras_model_with_the_transform_layer_predicts_from_a_raw_jpeg(
        built, tft_output, tmp_path):
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
