"""TFDS split specs ("train[:10%]", "train[5000:]", "test+validation[2shard:]") as record ranges.

The same syntax and rounding as `tfds.load(split=...)`, computed from the manifest's counts
(no TensorFlow, no TFDS): a percent boundary is round(p * N / 100) (Python's round, half to
even), negative boundaries count from the end, "[k shard]" boundaries are sums of shard
lengths, and an absolute boundary past the split's size is an error, as in TFDS. A spec reads
records [start, stop) of a split in manifest order (shard by shard); "+" joins specs.
"""

import dataclasses
import re

_SUB_SPEC = re.compile(r"^(?P<split>[\w-]+)(\[(?P<selector>[\d\w%:.-]+)\])?$")
_BOUNDARY = re.compile(r"^((?P<val>-?[\d_.]+)(?P<unit>%|shard)?)?$")
_PLUS = re.compile(r"\s*\+\s*")


@dataclasses.dataclass(frozen=True)
class Slice:
    """One split with optional boundaries, as written: unit "abs", "%" or "shard"."""
    split: str
    start: object = None  # int (abs, shard), float (%), or None
    stop: object = None
    unit: str = "abs"


@dataclasses.dataclass(frozen=True)
class Window:
    """Records [start, stop) of `split`, in manifest order."""
    split: str
    start: int
    stop: int

    def __len__(self):
        return self.stop - self.start


def parse(spec):
    """A split spec -> its Slices; ValueError naming the spec when it is not TFDS's syntax."""
    spec = str(spec).strip()
    parts = _PLUS.split(spec) if spec else []
    if not parts:
        raise ValueError(f"split {spec!r}: empty")
    return tuple(_parse_one(part, spec) for part in parts)


def _parse_one(part, spec):
    bad = ValueError(f"split {spec!r}: {part!r} is not NAME, NAME[a:b] (counts, a% or "
                     "a shard, negative from the end) or NAME[k shard]")
    match = _SUB_SPEC.match(part)
    if not match:
        raise bad
    if match["split"] == "all":
        raise ValueError(f"split {spec!r}: 'all' is not supported; join the splits with '+'")
    selector = match["selector"]
    if selector is None:
        return Slice(match["split"])
    bounds = [_BOUNDARY.match(x) for x in selector.split(":")]
    if not all(bounds) or not any(b.group(0) for b in bounds) or len(bounds) > 2:
        raise bad
    if len(bounds) == 1:  # "train[3shard]": one shard
        unit = bounds[0]["unit"] or "abs"
        if unit != "shard":
            raise ValueError(f"split {spec!r}: a single index needs the shard unit "
                             "(NAME[k shard]); counts and percents take a slice, NAME[a:b]")
        start = bounds[0]["val"]
        stop = int(start) + 1
    else:
        start, stop = bounds[0]["val"], bounds[1]["val"]
        unit = bounds[0]["unit"] or bounds[1]["unit"] or "abs"
    try:
        convert = float if unit == "%" else int
        start = None if start is None else convert(start)
        stop = None if stop is None else convert(stop)
    except ValueError:
        raise bad from None
    if unit == "%" and (abs(start or 0) > 100 or abs(stop or 0) > 100):
        raise ValueError(f"split {spec!r}: percent boundaries are in [-100, 100]")
    return Slice(match["split"], start, stop, unit)


def window(piece, shard_lengths):
    """A Slice and its split's records per shard (manifest order) -> its Window."""
    n = sum(shard_lengths)
    start, stop = piece.start, piece.stop
    if piece.unit == "%":
        start = 0 if start is None else int(round(start * n / 100.0))
        stop = n if stop is None else int(round(stop * n / 100.0))
    elif piece.unit == "shard":
        start = 0 if start is None else sum(shard_lengths[:start])
        if stop is not None and stop <= 0:
            stop = len(shard_lengths) + stop
        stop = n if stop is None else sum(shard_lengths[:stop])
    else:
        start = 0 if start is None else start
        stop = n if stop is None else stop
    if abs(start) > n or abs(stop) > n:
        raise ValueError(f"split {piece.split!r}: slice [{start}:{stop}] is outside its "
                         f"{n} records")
    start = n + start if start < 0 else start
    stop = n + stop if stop < 0 else stop
    return Window(piece.split, start, max(start, stop))


def windows(spec, shard_lengths_of):
    """A split spec -> its Windows, given `shard_lengths_of(split)` (records per shard)."""
    return tuple(window(piece, shard_lengths_of(piece.split)) for piece in parse(spec))


def windows_of(spec, ds_info):
    """A split spec -> Windows over a dataset_info.DatasetInfo (unknown split: KeyError
    listing the splits it has)."""
    return windows(spec, lambda split: [s.num_examples for s in ds_info.split(split).shards])


def is_plain(spec):
    """True when `spec` names a whole split, with no slice and no '+'."""
    return bool(re.fullmatch(r"[\w-]+", str(spec).strip()))
