"""Declared fields in the reader: `make_dataset(..., fields=["tags", "objects"])` gives dicts
of tensors instead of `(image, label)` pairs.

    {"image": [B, H, W, 3], "label": [B] int32,
     "caption": [B] string (a scalar field; absent: "", -1 for an int, NaN for a float),
     "tags": [B, max_len] int64 class ids, -1 after the last (or ragged: [B, None]; other
             lists pad with 0 or ""),
     "objects": {"boxes": [B, max_len, 4] float32 (ymin, xmin, ymax, xmax, as
                 tf.image.draw_bounding_boxes takes them), "label": [B, max_len] int64 (ids
                 from 1, the Object Detection API's), "count": [B] int32}}

Lists are padded to the schema's max_len per record, so every batching path batches them
as dense tensors (lists="ragged" turns each into a tf.RaggedTensor after batching). Boxes
follow the pixels: training's random-resized crop and flip move them (a box cropped away
entirely is dropped), evaluation's center crop too; `augment=False` resizes the whole image
instead, with no crop and no flip, and the boxes stay as stored.
"""

import dataclasses

import tensorflow as tf

from dataset_format import fields as field_types, schema
from readers import images


@dataclasses.dataclass(frozen=True)
class Fields:
    """What make_dataset's `fields=` asks for: the field names, how lists come out ("padded"
    or "ragged"), and whether training crops and flips (`augment`)."""

    names: tuple
    lists: str = "padded"
    augment: bool = True

    def __post_init__(self):
        if self.lists not in ("padded", "ragged"):
            raise ValueError(f"lists={self.lists!r}: use 'padded' or 'ragged'")


def requested(fields, ds_info, start=None, with_keys=False, image_size=224):
    """make_dataset's `fields=` (names, or a Fields) -> Fields with the version's declared
    fields (dataset_format.fields.Field) as its names, or None."""
    if fields is None:
        return None
    if not isinstance(fields, Fields):
        fields = Fields(tuple([fields] if isinstance(fields, str) else fields))
    if start is not None or with_keys or image_size is None:
        raise ValueError("fields= reads the stream order at a fixed image_size (no start=, "
                         "with_keys= or image_size=None)")
    return dataclasses.replace(fields, names=declared(ds_info, fields))


def declared(ds_info, wanted):
    """The version's declared fields named in `wanted` (a Fields), checked: each exists and a
    list has a max_len (its padded width)."""
    manifest_fields = ds_info.manifest.get("fields")
    schema_ = field_types.from_json(manifest_fields) if manifest_fields else field_types.Schema()
    found = []
    for name in wanted.names:
        try:
            f = schema_.field(name)
        except KeyError as e:
            raise ValueError(f"{ds_info.version_dir}: {e.args[0]}") from None
        if f.type not in field_types.SCALARS and not f.max_len:
            raise ValueError(f"field {name!r} has no max_len in the version's schema: the reader "
                             "pads a list to it (declare one, e.g. max_len: 100)")
        found.append(f)
    return tuple(found)


def _width(f):
    return 1 if f.type in field_types.SCALARS else f.max_len


_DTYPES = {"int64": tf.int64, "float": tf.float32, "string": tf.string}


def _spec(fields):
    spec = {schema.ENCODED: tf.io.FixedLenFeature([], tf.string),
            schema.LABEL: tf.io.FixedLenFeature([], tf.int64)}
    for f in fields:
        for key, dtype in f.keys().items():
            spec[key] = tf.io.VarLenFeature(_DTYPES[dtype])
    return spec


def _pad(values, width, fill):
    """A 1-D tensor -> exactly `width` values (cut to width, then `fill` after the last)."""
    values = values[:width]
    return tf.pad(values, [[0, width - tf.shape(values)[0]]], constant_values=fill)


def _fill(dtype):
    return {tf.int64: tf.constant(-1, tf.int64), tf.float32: tf.constant(0.0),
            tf.string: tf.constant("")}[dtype]


def crop_boxes(boxes, window):
    """Boxes [N, 4] (ymin, xmin, ymax, xmax, fractions of the image) -> the same boxes as
    fractions of `window` (y, x, height, width, fractions of the image), clipped to it, and
    a mask of those left with some area."""
    y, x, h, w = tf.unstack(window)
    ymin, xmin, ymax, xmax = tf.unstack(boxes, axis=1)
    moved = tf.stack([(ymin - y) / h, (xmin - x) / w, (ymax - y) / h, (xmax - x) / w], axis=1)
    moved = tf.clip_by_value(moved, 0.0, 1.0)
    keep = tf.logical_and(moved[:, 2] > moved[:, 0], moved[:, 3] > moved[:, 1])
    return moved, keep


def flip_boxes(boxes):
    """Boxes after a left-right flip of their image."""
    ymin, xmin, ymax, xmax = tf.unstack(boxes, axis=1)
    return tf.stack([ymin, 1.0 - xmax, ymax, 1.0 - xmin], axis=1)


def _windows(jpeg, training, augment, seed, crop_fraction):
    """(pixel window [4] int32 y, x, h, w; the same as fractions [4] float32; flip seed or
    None; the image's shape) of one image: training's random-resized crop, evaluation's center crop, or the
    whole image when `augment` is off."""
    shape = tf.io.extract_jpeg_shape(jpeg)
    if not augment:
        window = tf.stack([0, 0, shape[0], shape[1]])
        flip_seed = None
    elif training:
        crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            shape, bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=crop_seed,
            min_object_covered=0.1, aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0),
            max_attempts=10, use_image_if_no_bounding_boxes=True)
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
    else:
        window = images.center_window(shape[0], shape[1], crop_fraction)
        flip_seed = None
    hw = tf.cast(tf.stack([shape[0], shape[1], shape[0], shape[1]]), tf.float32)
    return window, tf.cast(window, tf.float32) / hw, flip_seed, shape


def example_fn(training, pixels, wanted):
    """A map function (record[, seed]) -> (image [H, W, 3], {"label": int32, field: ...}),
    the fields (`wanted`: a Fields of declared fields) padded to their widths; `pixels` the
    reader's images.Pixels, so a crop's pixels are those of the reader without fields."""
    fields, augment = wanted.names, wanted.augment
    spec = _spec(fields)

    def to_example(record, *seed):
        ex = tf.io.parse_single_example(record, spec)
        jpeg = ex[schema.ENCODED]
        window, fractions, flip_seed, shape = _windows(
            jpeg, training, augment, seed[0] if seed else None, pixels.crop_fraction)
        crop = images.decode_window(jpeg, window, pixels.dct_method, shape)
        image = tf.image.resize(tf.cast(crop, tf.float32), pixels.size, method="bilinear")
        flip = tf.constant(False)
        if flip_seed is not None:
            flip = tf.random.stateless_uniform([], flip_seed) < 0.5
            image = tf.cond(flip, lambda: tf.reverse(image, [1]), lambda: image)
        label = ex[schema.LABEL]  # NO_LABEL (-1): a record without a class stays -1
        out = {"label": tf.cast(tf.where(label == field_types.NO_LABEL, label,
                                         label + pixels.label_shift), tf.int32)}
        for f in fields:
            out[f.name] = _field_value(f, ex, fractions, flip)
        return pixels.output.apply(image), out

    return to_example


def _field_value(f, ex, fractions, flip):
    if f.type == field_types.BOXES:
        sides = [tf.sparse.to_dense(ex[field_types.BBOX[s]]) for s in ("ymin", "xmin", "ymax",
                                                                       "xmax")]
        boxes, keep = crop_boxes(tf.stack(sides, axis=1), fractions)
        boxes = tf.cond(flip, lambda: flip_boxes(boxes), lambda: boxes)
        boxes = tf.boolean_mask(boxes, keep)
        labels = tf.boolean_mask(tf.sparse.to_dense(ex[field_types.BOX_LABEL]), keep)
        count = tf.minimum(tf.shape(labels)[0], f.max_len)
        padded = tf.pad(boxes[:f.max_len], [[0, f.max_len - count], [0, 0]])
        return {"boxes": tf.ensure_shape(padded, [f.max_len, 4]),
                "label": tf.ensure_shape(_pad(labels, f.max_len, _fill(tf.int64)), [f.max_len]),
                "count": count}
    key = f"{f.name}/label" if f.type == field_types.CLASSES else f.name
    values = tf.sparse.to_dense(ex[key])
    if f.type in field_types.SCALARS:  # absent: the fill value
        return _pad(values, 1, _SCALAR_FILL[values.dtype])[0]
    count = tf.minimum(tf.shape(values)[0], f.max_len)
    return {"values": tf.ensure_shape(_pad(values, f.max_len, _fill(values.dtype)), [f.max_len]),
            "count": count}


_SCALAR_FILL = {tf.int64: tf.constant(-1, tf.int64), tf.float32: tf.constant(float("nan")),
                tf.string: tf.constant("")}


def to_dicts(ds, wanted):
    """Batches of (images, {"label", fields}) -> {"image", "label", fields}: lists padded
    (ids and labels with -1, numbers with 0, strings with "") or, with `lists` "ragged",
    tf.RaggedTensors cut at each record's length."""
    fields, lists = wanted.names, wanted.lists

    def merge(image, rest):
        out = {"image": image, **rest}
        for f in fields:
            value = out[f.name]
            if f.type == field_types.BOXES:
                if lists == "ragged":
                    out[f.name] = {k: _cut(value[k], value["count"]) for k in ("boxes", "label")}
                    out[f.name]["count"] = value["count"]
            elif f.type not in field_types.SCALARS:
                out[f.name] = (_cut(value["values"], value["count"]) if lists == "ragged"
                               else value["values"])
        return out

    return ds.map(tf.autograph.experimental.do_not_convert(merge),
                  num_parallel_calls=tf.data.AUTOTUNE)


def _cut(padded, count):
    """A padded list and its length -> the list: ragged in a batch (count [B]), else a slice."""
    if count.shape.rank == 0:  # batch_size=None: one record
        return padded[:count]
    return tf.RaggedTensor.from_tensor(padded, lengths=count)


def multi_hot(ids, num_classes):
    """Class ids [B, max_len] (padded with -1) -> [B, num_classes] float32 0/1 targets, for a
    sigmoid multi-label head."""
    return tf.reduce_max(tf.one_hot(ids, num_classes, dtype=tf.float32), axis=-2)
