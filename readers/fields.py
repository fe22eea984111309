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
instead, with no crop and no flip, and the boxes stay as stored. At the stored size
(image_size=None) only training's flip moves them; batches padded to the largest image
("padded" native batching) give boxes as fractions of the padded image. with_keys=True
adds "key"; start= (the resumable order) carries the same values as one flat tuple of
fixed shapes through its checks and realignment (flat, nested).
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


def requested(fields, ds_info):
    """make_dataset's `fields=` (names, or a Fields) -> Fields with the version's declared
    fields (dataset_format.fields.Field) as its names, or None."""
    if fields is None:
        return None
    if not isinstance(fields, Fields):
        fields = Fields(tuple([fields] if isinstance(fields, str) else fields))
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


def _spec(fields, with_keys):
    spec = {schema.ENCODED: tf.io.FixedLenFeature([], tf.string),
            schema.LABEL: tf.io.FixedLenFeature([], tf.int64)}
    if with_keys:  # images.parse_key's feature
        spec[schema.FILENAME] = tf.io.FixedLenFeature([], tf.string, default_value="")
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
    """A map function (record[, seed]) -> (image [H, W, 3], {"label": int32, field: ...[,
    "key"]}), the fields (`wanted`: a Fields of declared fields) padded to their widths;
    `pixels` the reader's images.Pixels, so the pixels are those of the reader without
    fields (a crop's, or at the stored size the whole image's, flipped alike)."""
    fields, augment = wanted.names, wanted.augment
    spec = _spec(fields, pixels.with_keys)

    def to_example(record, *seed):
        ex = tf.io.parse_single_example(record, spec)
        jpeg = ex[schema.ENCODED]
        flip = tf.constant(False)
        if pixels.size is None:  # the stored size: no crop or resize (images.example_fn)
            image = tf.cast(images.decode(jpeg, pixels.dct_method), tf.float32)
            fractions = tf.constant([0.0, 0.0, 1.0, 1.0])
            flip_seed = seed[0] if training and augment else None
        else:
            window, fractions, flip_seed, shape = _windows(
                jpeg, training, augment, seed[0] if seed else None, pixels.crop_fraction)
            crop = images.decode_window(jpeg, window, pixels.dct_method, shape)
            image = tf.image.resize(tf.cast(crop, tf.float32), pixels.size, method="bilinear")
        if flip_seed is not None:  # stateless_random_flip_left_right's draw, kept for boxes
            flip = tf.random.stateless_uniform([], flip_seed) < 0.5
            image = tf.cond(flip, lambda: tf.reverse(image, [1]), lambda: image)
        label = ex[schema.LABEL]  # NO_LABEL (-1): a record without a class stays -1
        out = {"label": tf.cast(tf.where(label == field_types.NO_LABEL, label,
                                         label + pixels.label_shift), tf.int32)}
        for f in fields:
            out[f.name] = _field_value(f, ex, fractions, flip)
        if pixels.size is None and any(f.type == field_types.BOXES for f in fields):
            out[_SIZE] = tf.shape(image)[:2]  # to_dicts: boxes onto a padded batch's images
        if pixels.with_keys:
            out["key"] = ex[schema.FILENAME]
        return pixels.output.apply(image), out

    return to_example


_SIZE = "_size"  # an image's own [height, width] at the stored size, until to_dicts


def flat_fn(training, pixels, wanted):
    """example_fn as (image, label, *the fields' tensors[, key]): one flat tuple of fixed
    shapes, which the resumable order's checks, realignment and batching take as they take
    (image, label[, key]); `nested` makes the dict again."""
    fn = example_fn(training, pixels, wanted)

    def flat(record, *seed):
        image, out = fn(record, *seed)
        return (image, out.pop("label"), *_flatten(out, wanted.names),
                *((out["key"],) if pixels.with_keys else ()))

    return flat


def _flatten(out, fields):
    values = []
    for f in fields:
        v = out[f.name]
        values += ([v["boxes"], v["label"], v["count"]] if f.type == field_types.BOXES
                   else [v] if f.type in field_types.SCALARS else [v["values"], v["count"]])
    return values


def nested(wanted, with_keys):
    """flat_fn's elements (batched or not) -> (image, {"label", fields[, "key"]})."""
    def nest(image, label, *values):
        out, values = {"label": label}, list(values)
        for f in wanted.names:
            if f.type == field_types.BOXES:
                out[f.name] = dict(zip(("boxes", "label", "count"), values[:3]))
                values = values[3:]
            elif f.type in field_types.SCALARS:
                out[f.name] = values.pop(0)
            else:
                out[f.name] = dict(zip(("values", "count"), values[:2]))
                values = values[2:]
        if with_keys:
            out["key"] = values.pop(0)
        return image, out

    return tf.autograph.experimental.do_not_convert(nest)


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


def to_dicts(ds, wanted, padded_images=False):
    """Batches of (images, {"label", fields}) -> {"image", "label", fields}: lists padded
    (ids and labels with -1, numbers with 0, strings with "") or, with `lists` "ragged",
    tf.RaggedTensors cut at each record's length. `padded_images`: batches of images at
    their stored sizes padded to the largest (native_batching="padded"): boxes become
    fractions of the padded image, so they still frame the same pixels."""
    fields, lists = wanted.names, wanted.lists

    def merge(image, rest):
        out = {"image": image, **rest}
        size = out.pop(_SIZE, None)
        for f in fields:
            value = out[f.name]
            if f.type == field_types.BOXES and padded_images:
                value = out[f.name] = dict(value, boxes=_onto_padded(value["boxes"], size,
                                                                     image))
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


def _onto_padded(boxes, size, image):
    """Boxes [B, N, 4] as fractions of each image's own [height, width] (`size` [B, 2]) ->
    fractions of the padded batch's images (`image` [B, H, W, 3])."""
    scale = tf.cast(size, tf.float32) / tf.cast(tf.shape(image)[1:3], tf.float32)  # [B, 2]
    return boxes * tf.tile(scale, [1, 2])[:, None, :]


def _cut(padded, count):
    """A padded list and its length -> the list: ragged in a batch (count [B]), else a slice."""
    if count.shape.rank == 0:  # batch_size=None: one record
        return padded[:count]
    return tf.RaggedTensor.from_tensor(padded, lengths=count)


def multi_hot(ids, num_classes):
    """Class ids [B, max_len] (padded with -1) -> [B, num_classes] float32 0/1 targets, for a
    sigmoid multi-label head."""
    return tf.reduce_max(tf.one_hot(ids, num_classes, dtype=tf.float32), axis=-2)
