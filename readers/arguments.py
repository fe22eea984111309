"""make_dataset's arguments, checked before anything is read: each bad value is one
ValueError line naming the parameter, the value and what it accepts (`batch_size='64'`
would otherwise fail deep in TensorFlow, `repeat=-1` as a corrupt batch).

Pure functions of the values: no TensorFlow until a dtype is named.
"""

import numbers

from readers.order import Position

FOREVER = 0  # epochs: repeat=True or -1


def fail(name, value, accepted):
    return ValueError(f"make_dataset: {name}={value!r}: {accepted}")


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def positive_int(name, value, none_means=None):
    """An int >= 1 (numpy ints too; not bools, floats or strings); None when allowed."""
    if value is None and none_means:
        return None
    if not _is_int(value) or value < 1:
        raise fail(name, value, "an int >= 1" + (f", or None ({none_means})" if none_means
                                                 else ""))
    return int(value)


def flag(name, value, none_means=None):
    """True or False (None when it means a default)."""
    if value is None and none_means:
        return None
    if not isinstance(value, bool):
        import numpy as np

        if not isinstance(value, np.bool_):
            raise fail(name, value, "True or False" + (f", or None ({none_means})"
                                                       if none_means else ""))
    return bool(value)


def image_size(value):
    """(height, width) from an int or a pair of ints, or None (each image at its own size)."""
    accepted = "an int >= 1, a (height, width) pair of them, or None (stored size)"
    if value is None:
        return None
    if _is_int(value):
        pair = (value, value)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        pair = tuple(value)
    else:
        raise fail("image_size", value, accepted)
    if not all(_is_int(v) and v >= 1 for v in pair):
        raise fail("image_size", value, accepted)
    return int(pair[0]), int(pair[1])


def seed(value):
    """None or an int."""
    if value is not None and not _is_int(value):
        raise fail("seed", value, "an int, or None (the global seed, if any)")
    return None if value is None else int(value)


def repeat(value):
    """Epochs to read: FOREVER (True or -1), else a count >= 1 (False or None: one)."""
    if value is None or value is False:
        return 1
    if value is True or (_is_int(value) and value == -1):
        return FOREVER
    if not _is_int(value) or value < 1:
        raise fail("repeat", value, "False or 1 (one epoch), an epoch count >= 1, or True "
                                    "or -1 (forever)")
    return int(value)


def label_offset(value):
    if not _is_int(value):
        raise fail("label_offset", value, "an int (labels are 0-based id + label_offset)")
    return int(value)


def crop_fraction(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= 1:
        raise fail("crop_fraction", value, "a number in (0, 1], e.g. 0.875")
    return float(value)


def choice(name, value, accepted):
    if not isinstance(value, str) or value not in accepted:
        raise fail(name, value, f"use one of {accepted}")
    return value


def text(name, value, none_means):
    if value is not None and not isinstance(value, str):
        raise fail(name, value, f"a string, or None ({none_means})")
    return value


def split(value):
    if not isinstance(value, str) or not value.strip():
        raise fail("split", value, "a split name or a TFDS slice of one, e.g. 'train', "
                                   "'train[:10%]'")
    return value


def cache(value):
    """False, True (memory) or a file prefix."""
    if isinstance(value, bool) or (isinstance(value, str) and value):
        return value
    if value is None:
        return False
    raise fail("cache", value, "False, True (memory) or a file prefix (a non-empty string)")


def value_range(value):
    if value is None:
        return None
    ok = (isinstance(value, (tuple, list)) and len(value) == 2 and all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)
        and value[0] < value[1])
    if not ok:
        raise fail("value_range", value, "None or (low, high) numbers with low < high, e.g. "
                                         "(0, 1), (0, 255), (-1, 1)")
    return float(value[0]), float(value[1])


def dtype(value):
    """A TensorFlow dtype: uint8 or a float dtype, given as a dtype, a numpy type or a name."""
    import tensorflow as tf

    accepted = "uint8 or a float dtype (tf.float32, 'float16', 'bfloat16', ...)"
    try:
        found = tf.as_dtype(value)
    except TypeError:
        raise fail("dtype", value, accepted) from None
    if not (found == tf.uint8 or found.is_floating):
        raise fail("dtype", value, accepted)
    return found


def start(value):
    """None, a global step (an int >= 0), a readers.Position, a callable or a variable."""
    if value is None or isinstance(value, Position) or callable(value) or hasattr(
            value, "numpy"):
        return value
    if not _is_int(value) or value < 0:
        raise fail("start", value, "a global step (an int >= 0), a readers.Position, a "
                                   "callable returning one, or a tf.Variable (e.g. "
                                   "optimizer.iterations)")
    return int(value)


def input_context(value):
    if value is not None and not all(hasattr(value, a) for a in (
            "num_input_pipelines", "input_pipeline_id")):
        raise fail("input_context", value, "a tf.distribute.InputContext, or None")
    return value
