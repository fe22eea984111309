"""What make_dataset builds, as one frozen value: the arguments checked and resolved (version,
split window, hosts, seed, pixels, batching, reading), from which readers/pipeline.py
assembles the tf.data pipeline. No TensorFlow ops are made here.
"""

import dataclasses
from typing import Any, Optional

from dataset_format import dataset_info as info_lib, slices
from readers import hosts as hosts_lib, images
from readers.arguments import FOREVER  # noqa: F401 - re-exported: DatasetSpec.epochs


@dataclasses.dataclass(frozen=True)
class Batches:
    """How elements are grouped: `size` records a batch (None: unbatched), the last short
    one dropped or not; images at their stored size batched as `native` ("ragged" or
    "padded")."""
    size: Optional[int]
    drop_remainder: bool
    native: str = "ragged"


@dataclasses.dataclass(frozen=True)
class Reading:
    """How the shards are read (readers/records.py, readers/shards.py)."""
    cache: Any = False  # False, True (memory) or a file prefix
    cycle_length: Optional[int] = None
    read_buffer_bytes: Optional[int] = None
    shuffle_buffer: Optional[int] = None
    deterministic: bool = True
    skip_corrupt: bool = False


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """One make_dataset call, resolved. `start` None reads the stream order in training and
    the manifest's order in evaluation; otherwise the resumable order from `start` (a
    Position, a global step, or a callable / variable read as each iteration begins)."""
    info: info_lib.DatasetInfo
    window: slices.Window
    hosts: hosts_lib.Hosts
    input_context: Any
    training: bool
    seed: Optional[int]
    epochs: int  # FOREVER, or epochs to read
    start: Any
    pixels: images.Pixels
    batches: Batches
    reading: Reading
    fields: Any = None  # readers.fields.Fields: the declared fields read beside the label

    @property
    def split(self):
        return self.info.split(self.window.split)

    @property
    def whole_split(self):
        return len(self.window) == sum(s.num_examples for s in self.split.shards)

    @property
    def resumable(self):
        return self.start is not None


def window_of(ds_info, split):
    """The one slices.Window a split spec reads (make_dataset reads one split)."""
    found = slices.windows_of(split, ds_info)
    if len(found) != 1:
        raise ValueError(f"split {split!r}: make_dataset reads one split (or a slice of one); "
                         "concatenate datasets to read several")
    return found[0]


def check_pinned(ds_info, hosts):
    """Several hosts must read one version: each following LATEST could land on another."""
    if hosts.count > 1 and ds_info.followed_latest:
        raise ValueError(
            f"{hosts.count} hosts read this dataset and this one followed LATEST to "
            f"{ds_info.version}: pin one version for all of them, e.g. "
            f"make_dataset(ROOT, ..., version={ds_info.version!r}) or readers.info(ROOT, "
            "version=...), with the id passed to every host (a flag, an environment variable)")


def check_resumable(spec):
    """start= reads the resumable order: training, a whole split, fixed-size batches."""
    if not spec.resumable:
        return
    if not spec.training:
        raise ValueError("start= reads the resumable training order; evaluation reads the "
                         "manifest's order from the start")
    if not spec.whole_split or spec.batches.size is None or spec.pixels.size is None:
        raise ValueError("start= reads a whole split in fixed-size batches: no split slice, "
                         "batch_size=None or image_size=None")
    if spec.hosts.count > 1 and spec.input_context is None:
        raise ValueError(
            f"start= on {spec.hosts.count} hosts ({spec.hosts.source}) needs input_context: "
            "build the dataset in strategy.distribute_datasets_from_function (or pass an "
            "InputContext from jax.process_count()/process_index()); a dataset given to "
            "experimental_distribute_dataset or Model.fit is re-batched by tf.distribute, "
            "which the resumable order cannot follow")


def global_seed(seed, training):
    """The user's seed, else the global one (tf.random.set_seed), else None."""
    if seed is not None or not training:
        return seed
    from tensorflow.python.framework import random_seed

    found, _ = random_seed.get_seed(None)
    return found
