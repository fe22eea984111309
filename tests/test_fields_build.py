"""Declared fields through a real build: a JSONL manifest with a caption, tags and boxes ->
Example features, typed catalog columns, the manifest's schema, TFDS features.json; a bad
value -> errors.jsonl; EXIF-rotated and resized images keep their boxes on their pixels."""

import io
import json
import os

import numpy as np
import pytest
from PIL import Image, ImageOps

from dataset_format import examples, fields, frames, layout
from tests.helpers import FAST, build, errors_of

pytestmark = pytest.mark.slow

SCHEMA = {"fields": {
    "caption": {"type": "string"},
    "score": {"type": "float"},
    "tags": {"type": "classes", "max_len": 3},
    "objects": {"type": "boxes", "max_len": 4, "classes": ["dog", "cat"]},
}}
# The upright picture: grey, one red square at BOX (fractions of width and height).
SIZE = (80, 48)  # width, height, upright
BOX = {"xmin": 0.25, "ymin": 0.5, "xmax": 0.5, "ymax": 0.875}
# Pillow's transpose that makes the file's pixel grid from the upright picture, per EXIF
# orientation (its inverse is what a viewer, and the writer, apply).
STORED_AS = {1: None, 3: Image.Transpose.ROTATE_180, 6: Image.Transpose.ROTATE_90,
             8: Image.Transpose.ROTATE_270}


def _upright():
    w, h = SIZE
    pixels = np.full((h, w, 3), 128, np.uint8)
    pixels[int(BOX["ymin"] * h):int(BOX["ymax"] * h), int(BOX["xmin"] * w):int(BOX["xmax"] * w)] = (
        230, 20, 20)
    return Image.fromarray(pixels)


def _jpeg_with_orientation(orientation):
    upright = _upright()
    stored_as = STORED_AS[orientation]
    raw = upright if stored_as is None else upright.transpose(stored_as)
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    raw.save(buf, "JPEG", quality=95, exif=exif.tobytes())
    shown = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(buf.getvalue()))))
    assert shown.shape[:2] == (SIZE[1], SIZE[0])  # what a viewer shows is the upright picture
    return buf.getvalue()


def _records(vdir, manifest):
    out = {}
    for split, info in manifest["splits"].items():
        for shard in info["shards"]:
            with open(os.path.join(vdir, shard["path"]), "rb") as f:
                for record, _ in iter(lambda f=f: frames.read_frame(f, f.tell()), None):
                    parsed = examples.parse_features(record)
                    out[parsed["image/filename"].values[0].decode()] = parsed
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("fields")
    data = base / "data"
    data.mkdir()
    rows = []
    for orientation in (1, 3, 6, 8):
        name = f"o{orientation}.jpg"
        (data / name).write_bytes(_jpeg_with_orientation(orientation))
        rows.append({"uri": name, "label": "pet", "split": "train",
                     "caption": f"orientation {orientation}", "score": orientation,
                     "tags": ["indoor", "grey"] if orientation % 2 else ["outdoor"],
                     "objects": [dict(BOX, label="cat")]})
    rows[0]["tags"] = []
    del rows[2]["label"]  # the class label is optional with fields: o6 has none
    del rows[1]["caption"]  # optional: left out of its Example, null in the catalog
    (data / "bad.jpg").write_bytes(_jpeg_with_orientation(1))
    rows.append({"uri": "bad.jpg", "label": "pet", "split": "train",
                 "objects": [{"xmin": 0.6, "ymin": 0.1, "xmax": 0.2, "ymax": 0.3, "label": "cat"}]})
    manifest = data / "images.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    schema = base / "schema.yaml"
    schema.write_text(json.dumps(SCHEMA))
    result = build(manifest, base / "ds", *FAST, "--schema", schema, "--max_side", "40",
                   "--max_error_rate", "0.5")
    return dict(result, base=base)


def test_a_bad_value_is_an_errors_row_naming_column_and_value(built):
    errors = errors_of(built)
    assert [(e["uri"].rsplit("/", 1)[-1], e["stage"], e["reason"]) for e in errors] == [
        ("bad.jpg", "read", "bad_field")]
    assert errors[0]["detail"].endswith(
        "images.jsonl:5: column 'objects': box is inverted: xmin 0.6 > xmax 0.2: [{\"xmin\": "
        "0.6, \"ymin\": 0.1, \"xmax\": 0.2, \"ymax\": 0.3, \"label\": \"cat\"}]")
    assert built["manifest"]["accounting"]["failed"] == 1
    assert built["manifest"]["accounting"]["written"] == 4


def test_the_class_label_is_optional(built):
    import pandas as pd

    records = _records(built["version_dir"], built["manifest"])
    assert records["o6.jpg"]["image/class/label"].values == (-1,)
    assert records["o6.jpg"]["image/class/text"].values == (b"",)
    assert records["o3.jpg"]["image/class/label"].values == (0,)
    assert built["manifest"]["labels"] == ["pet"]
    assert built["manifest"]["splits"]["train"]["label_counts"] == {"pet": 3, "": 1}
    cat = pd.read_parquet(os.path.join(built["version_dir"], layout.CATALOG)).set_index("key")
    assert (cat.loc["o6.jpg", "label"], cat.loc["o6.jpg", "label_id"]) == ("", -1)


def test_manifest_records_the_schema_with_its_vocabularies(built):
    got = built["manifest"]["fields"]["fields"]
    assert got["tags"] == {"type": "classes", "max_len": 3,
                           "classes": ["grey", "indoor", "outdoor"], "closed": False}
    assert got["objects"]["classes"] == ["dog", "cat"] and got["objects"]["closed"] is True
    assert "schema" in built["manifest"]["config"]


def test_example_features_hold_the_fields(built):
    records = _records(built["version_dir"], built["manifest"])
    o3 = records["o3.jpg"]
    assert o3["tags/text"].values == (b"indoor", b"grey")
    assert o3["tags/label"].values == (1, 0)
    assert o3["image/object/class/label"].values == (2,)  # "cat": id 1, from 1 as the OD API
    assert o3["image/object/class/text"].values == (b"cat",)
    assert o3["image/object/bbox/xmin"].values == pytest.approx((0.25,))
    assert o3["score"].values == (3.0,)
    assert "caption" not in o3  # left out of the manifest row
    assert records["o1.jpg"]["tags/label"].values == ()  # an empty list stays a feature
    assert records["o6.jpg"]["caption"].values == (b"orientation 6",)


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
def test_boxes_stay_on_their_pixels_through_exif_and_resizing(built, orientation):
    """The writer turns the image upright and shrinks it to --max_side 40: the stored box
    still frames the red square, and the grey outside it."""
    record = _records(built["version_dir"], built["manifest"])[f"o{orientation}.jpg"]
    pixels = np.asarray(Image.open(io.BytesIO(record["image/encoded"].values[0])).convert("RGB"))
    h, w, _ = pixels.shape
    assert (w, h) == (40, 24)
    box = {side: record[f"image/object/bbox/{side}"].values[0] for side in fields.BOX_SIDES}
    inside = pixels[int(box["ymin"] * h) + 1:int(box["ymax"] * h) - 1,
                    int(box["xmin"] * w) + 1:int(box["xmax"] * w) - 1].reshape(-1, 3)
    outside = np.concatenate([pixels[:int(box["ymin"] * h) - 1].reshape(-1, 3),
                              pixels[:, int(box["xmax"] * w) + 1:].reshape(-1, 3)])
    assert inside[:, 0].min() > 180 and inside[:, 1].max() < 80       # red
    assert abs(outside.astype(int) - 128).max() < 30                   # grey


def test_catalog_has_typed_field_columns(built):
    import pandas as pd
    import pyarrow.parquet as pq

    path = os.path.join(built["version_dir"], layout.CATALOG)
    schema = pq.read_schema(path)
    assert str(schema.field("score").type) == "double"
    assert str(schema.field("tags").type) == "list<element: string>"
    assert str(schema.field("objects").type).startswith("list<element: struct<xmin: double")
    cat = pd.read_parquet(path).set_index("key")
    assert cat.loc["o3.jpg", "score"] == 3.0
    assert pd.isna(cat.loc["o3.jpg", "caption"])
    assert list(cat.loc["o8.jpg", "tags"]) == ["outdoor"]
    assert cat.loc["o8.jpg", "objects"][0]["label"] == "cat"
    assert [k for k, tags in cat["tags"].items() if "grey" in tags] == ["o3.jpg"]


def test_tfds_reads_the_fields(built):
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(built["version_dir"])
    features = builder.info.features
    assert set(features["image"]["object"]["bbox"].keys()) == {"xmin", "ymin", "xmax", "ymax"}
    by_key = {ex["image"]["filename"].decode(): ex
              for ex in tfds.as_numpy(builder.as_dataset(split="train"))}
    assert sorted(by_key) == ["o1.jpg", "o3.jpg", "o6.jpg", "o8.jpg"]
    assert list(by_key["o3.jpg"]["tags"]["text"]) == [b"indoor", b"grey"]
    assert list(by_key["o3.jpg"]["caption"]) == []
    assert by_key["o8.jpg"]["image"]["object"]["bbox"]["ymax"].tolist() == pytest.approx([0.875])
    assert by_key["o8.jpg"]["score"].tolist() == [8.0]
    assert by_key["o6.jpg"]["image"]["class"]["label"] == -1


# --- the reader ---------------------------------------------------------------------------------

def _boxes_frame_red(images, boxes, counts):
    """Every kept box holds red pixels inside and only grey ones well outside it."""
    checked = 0
    for image, image_boxes, count in zip(images, boxes, counts):
        h, w, _ = image.shape
        red = (image[..., 0] > 0.6) & (image[..., 1] < 0.35)
        for ymin, xmin, ymax, xmax in image_boxes[:count]:
            y0, y1 = int(np.ceil(ymin * h)) + 1, int(np.floor(ymax * h)) - 1
            x0, x1 = int(np.ceil(xmin * w)) + 1, int(np.floor(xmax * w)) - 1
            if y1 > y0 and x1 > x0:
                assert red[y0:y1, x0:x1].mean() > 0.95
                checked += 1
        mask = np.ones_like(red)
        for ymin, xmin, ymax, xmax in image_boxes[:count]:
            mask[max(0, int(ymin * h) - 2):int(np.ceil(ymax * h)) + 2,
                 max(0, int(xmin * w) - 2):int(np.ceil(xmax * w)) + 2] = False
        assert not red[mask].any()
    return checked


def test_reader_gives_fields_as_dicts_with_boxes_on_their_pixels(built):
    import readers

    ds = readers.make_dataset(built["root"], "train", batch_size=4, image_size=32,
                              training=False,
                              fields=readers.Fields(("caption", "score", "tags", "objects"),
                                                    augment=False))
    batch = next(iter(ds))
    assert set(batch) == {"image", "label", "caption", "score", "tags", "objects"}
    assert batch["image"].shape == (4, 32, 32, 3) and batch["tags"].shape == (4, 3)
    assert batch["objects"]["boxes"].shape == (4, 4, 4)
    keys = [k.decode() for k in batch["caption"].numpy()]
    assert sorted(keys) == ["", "orientation 1", "orientation 6", "orientation 8"]
    assert sorted(batch["label"].numpy().tolist()) == [-1, 0, 0, 0]  # o6 has no class
    counts = batch["objects"]["count"].numpy()
    assert counts.tolist() == [1, 1, 1, 1]
    assert batch["objects"]["label"].numpy()[:, 0].tolist() == [2, 2, 2, 2]
    # no crop: the stored boxes as they are (ymin, xmin, ymax, xmax)
    assert batch["objects"]["boxes"].numpy()[0, 0] == pytest.approx([0.5, 0.25, 0.875, 0.5])
    assert _boxes_frame_red(batch["image"].numpy(), batch["objects"]["boxes"].numpy(),
                            counts) == 4


def test_training_crops_and_flips_move_the_boxes_with_the_pixels(built):
    import readers

    ds = readers.make_dataset(built["root"], "train", batch_size=4, image_size=48,
                              training=True, seed=3, repeat=True, fields=["objects"])
    checked = 0
    for batch in ds.take(12):
        objects = batch["objects"]
        checked += _boxes_frame_red(batch["image"].numpy(), objects["boxes"].numpy(),
                                    objects["count"].numpy())
    assert checked >= 12  # most crops keep some of the square


def test_reader_lists_ragged_and_evaluation_center_crop(built):
    import readers

    ds = readers.make_dataset(built["root"], "train", batch_size=4, image_size=32,
                              training=False, fields=readers.Fields(("tags", "objects"),
                                                                    lists="ragged"))
    batch = next(iter(ds))
    tags = sorted(tuple(row) for row in batch["tags"].to_list())
    assert tags == [(), (1, 0), (2,), (2,)]  # grey 0, indoor 1, outdoor 2: sorted, as labels
    boxes = batch["objects"]["boxes"]
    assert isinstance(boxes, tf_ragged()) and boxes.shape[0] == 4
    assert _boxes_frame_red(batch["image"].numpy(), boxes.to_tensor().numpy(),
                            batch["objects"]["count"].numpy()) >= 1


def test_unbatched_ragged_lists_are_cut_to_their_length(built):
    import readers

    ds = readers.make_dataset(built["root"], "train", batch_size=None, image_size=32,
                              training=False, fields=readers.Fields(("tags", "objects"),
                                                                    lists="ragged"))
    got = sorted(tuple(e["tags"].numpy().tolist()) for e in ds)
    assert got == [(), (1, 0), (2,), (2,)]
    assert {tuple(e["objects"]["boxes"].shape) for e in ds} <= {(0, 4), (1, 4)}


def test_reader_fields_with_keys_pair_each_value_with_its_record(built):
    import readers

    ds = readers.make_dataset(built["root"], "train", batch_size=4, image_size=32,
                              training=False, with_keys=True,
                              fields=readers.Fields(("caption", "objects"), augment=False))
    batch = next(iter(ds))
    keys = [k.decode() for k in batch["key"].numpy()]
    assert sorted(keys) == ["o1.jpg", "o3.jpg", "o6.jpg", "o8.jpg"]
    captions = dict(zip(keys, (c.decode() for c in batch["caption"].numpy())))
    assert captions == {"o1.jpg": "orientation 1", "o3.jpg": "", "o6.jpg": "orientation 6",
                        "o8.jpg": "orientation 8"}
    assert _boxes_frame_red(batch["image"].numpy(), batch["objects"]["boxes"].numpy(),
                            batch["objects"]["count"].numpy()) == 4


@pytest.mark.parametrize("native", ["ragged", "padded"])
def test_reader_fields_at_the_stored_size_flip_boxes_with_the_pixels(built, native):
    """image_size=None: whole images at 40x24, the pixels of the reader without fields (the
    same flips), each box on its red square, flipped ones too."""
    import readers

    def read(**kw):
        return readers.make_dataset(built["root"], "train", batch_size=2, image_size=None,
                                    training=True, seed=5, repeat=True,
                                    native_batching=native, **kw).take(6)

    def dense(images):
        return images.to_tensor().numpy() if native == "ragged" else images.numpy()

    xmins = set()
    for plain, batch in zip(read(), read(fields=["objects"])):
        images = dense(batch["image"])
        assert images.shape == (2, 24, 40, 3)
        np.testing.assert_array_equal(images, dense(plain[0]))
        np.testing.assert_array_equal(batch["label"].numpy(), plain[1].numpy())
        objects = batch["objects"]
        boxes, counts = objects["boxes"].numpy(), objects["count"].numpy()
        assert counts.tolist() == [1, 1]
        assert _boxes_frame_red(images, boxes, counts) == 2
        xmins.update(round(float(x), 3) for x in boxes[:, 0, 1])
    assert xmins == {0.25, 0.5}  # as stored, and flipped (1 - xmax)


def test_boxes_onto_a_padded_batch_keep_their_pixels():
    """Native "padded" batches: an image smaller than the batch's largest is padded at the
    bottom and right, so its boxes shrink to fractions of the padded size."""
    import tensorflow as tf

    from readers.fields import _onto_padded

    images = tf.zeros([2, 48, 80, 3])
    boxes = tf.constant([[[0.5, 0.25, 0.875, 0.5]], [[0.5, 0.25, 0.875, 0.5]]])
    got = _onto_padded(boxes, tf.constant([[48, 80], [24, 40]]), images).numpy()
    assert got.tolist() == [[[0.5, 0.25, 0.875, 0.5]], [[0.25, 0.125, 0.4375, 0.25]]]


def test_reader_fields_from_a_start_position(built):
    """start= (the resumable order): the same pixels and labels as without fields, each
    step's fields on their records, and a resumed stream is the rest of the first."""
    import readers

    def read(start, **kw):
        return list(readers.make_dataset(built["root"], "train", batch_size=2, image_size=32,
                                         seed=7, start=start, with_keys=True, **kw))

    plain, full = read(0), read(0, fields=["tags", "objects", "caption"])
    assert len(full) == len(plain) == 2
    tags = {"o1.jpg": [-1, -1, -1], "o3.jpg": [1, 0, -1], "o6.jpg": [2, -1, -1],
            "o8.jpg": [2, -1, -1]}
    for (image, label, keys), batch in zip(plain, full):
        np.testing.assert_array_equal(batch["image"].numpy(), image.numpy())
        np.testing.assert_array_equal(batch["label"].numpy(), label.numpy())
        got = [k.decode() for k in batch["key"].numpy()]
        assert got == [k.decode() for k in keys.numpy()]
        assert dict(zip(got, batch["tags"].numpy().tolist())) == {k: tags[k] for k in got}
        assert [c.decode() for c in batch["caption"].numpy()] == [
            "" if k == "o3.jpg" else f"orientation {k[1]}" for k in got]
        assert _boxes_frame_red(batch["image"].numpy(), batch["objects"]["boxes"].numpy(),
                                batch["objects"]["count"].numpy()) >= 1
    resumed = read(1, fields=["tags", "objects", "caption"])
    assert len(resumed) == 1
    np.testing.assert_array_equal(resumed[0]["image"].numpy(), full[1]["image"].numpy())
    assert resumed[0]["key"].numpy().tolist() == full[1]["key"].numpy().tolist()


def tf_ragged():
    import tensorflow as tf

    return tf.RaggedTensor


def test_unknown_field_is_one_line(built):
    import readers

    with pytest.raises(ValueError, match=r"no field 'colour' \(fields: caption, score, tags, "
                                         r"objects\)"):
        readers.make_dataset(built["root"], "train", batch_size=2, fields=["colour"])


def test_a_keras_model_trains_a_step_on_multi_label_tags(built):
    """The end-to-end promise: a multi-label dataset, read as (image, multi-hot tags),
    trains a tiny Keras model for a step."""
    import keras
    import tensorflow as tf

    import readers
    from readers.fields import multi_hot

    meta = readers.info(built["root"])
    classes = meta.manifest["fields"]["fields"]["tags"]["classes"]
    ds = readers.make_dataset(meta, "train", batch_size=2, image_size=32, seed=1,
                              fields=["tags"])
    ds = ds.map(lambda x: (x["image"], multi_hot(x["tags"], len(classes))))
    images, targets = next(iter(ds))
    assert targets.shape == (2, 3) and set(np.unique(targets.numpy())) <= {0.0, 1.0}
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(len(classes), activation="sigmoid")])
    model.compile("sgd", "binary_crossentropy")
    history = model.fit(ds, epochs=1, steps_per_epoch=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert tf.reduce_all(tf.math.is_finite(model.predict(images, verbose=0)))


# --- loaders, verify, inspect -------------------------------------------------------------------

def test_loaders_give_the_fields_without_tensorflow(built):
    from loaders import FieldsExample, RecordSource, SequentialRecords

    source = RecordSource(built["root"], "train", fields=["tags", "objects", "caption", "score"])
    by_key = {source[i].key: source[i] for i in range(len(source))}
    o3 = by_key["o3.jpg"]
    assert isinstance(o3, FieldsExample) and o3.image.shape == (24, 40, 3)
    assert o3.fields == {"tags": [1, 0], "objects": {"boxes": [[0.5, 0.25, 0.875, 0.5]],
                                                     "label": [2]},
                         "caption": None, "score": 3.0}
    assert by_key["o6.jpg"].fields["caption"] == "orientation 6"
    stream = SequentialRecords(built["root"], "train", fields=["tags"])
    assert sorted(tuple(e.fields["tags"]) for e in stream) == [(), (1, 0), (2,), (2,)]
    with pytest.raises(ValueError, match="no field 'colour'"):
        RecordSource(built["root"], "train", fields=["colour"])


def test_verify_checks_the_fields(built):
    from beam_pipeline.tools import verify

    assert verify.main([built["version_dir"]]) == 0


def test_inspect_draws_the_boxes(built):
    from beam_pipeline.tools import drawing, samples

    got = samples.sample(built["version_dir"], built["manifest"], 4)
    for _, _, _, image in got:
        pixels = np.asarray(image)
        assert (pixels == drawing.BOX_COLOURS[0]).all(axis=-1).sum() >= 20  # the outline


def test_every_exif_orientation_keeps_its_box_on_its_marker(tmp_path):
    """One build of all 8 EXIF orientations (the mirrored 2, 4, 5, 7 too; the writer's
    conversion of each: tests/test_box_orientation.py), resized by --max_side: each stored
    box frames its red marker, and the blue dot is top left."""
    from tests.test_box_orientation import BOX as MARKER, assert_box_on_marker, stored_file

    data = tmp_path / "data"
    data.mkdir()
    rows = []
    for orientation in range(1, 9):
        (data / f"o{orientation}.jpg").write_bytes(stored_file(orientation))
        rows.append({"uri": f"o{orientation}.jpg", "label": "pet",
                     "objects": [dict(MARKER, label="cat")]})
    (data / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "schema.json").write_text(json.dumps({"fields": {"objects": SCHEMA["fields"][
        "objects"]}}))
    result = build(data / "m.jsonl", tmp_path / "ds", *FAST, "--schema",
                   tmp_path / "schema.json", "--max_side", "40")
    records = _records(result["version_dir"], result["manifest"])
    assert sorted(records) == [f"o{o}.jpg" for o in range(1, 9)]
    for name, record in records.items():
        pixels = np.asarray(Image.open(io.BytesIO(record["image/encoded"].values[0])))
        assert pixels.shape == (24, 40, 3), name
        stored = {side: record[f"image/object/bbox/{side}"].values[0] for side in MARKER}
        assert stored == pytest.approx(MARKER), name
        assert_box_on_marker(pixels)
