"""Which records of a split each input pipeline (host) reads: a split that does not depend on
the augmentation seed, gives every host the same number of records, and reads each record at
most once per epoch across hosts.

The split's records, in manifest order (shard by shard), are cut into `count` contiguous
ranges whose sizes differ by at most one; pipeline i reads range i. Most shard files land
whole in one range; a file cut by a range boundary is read by both neighbours (each skips to
its part). In training every pipeline then yields the common minimum, floor(N / count)
records an epoch, so all hosts run the same number of steps with full batches; evaluation
yields the whole range (every record exactly once).
"""

import dataclasses
import json
import logging
import os
from typing import Optional, Tuple

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Hosts:
    """This process's place among the input pipelines reading one split."""
    count: int
    index: int
    source: str  # "input_context", "strategy" (its cluster resolver), "TF_CONFIG" or "single"


@dataclasses.dataclass(frozen=True)
class Piece:
    """Records [start, start + count) of one shard file."""
    path: str
    start: int
    count: int
    file_records: int  # the whole file's records, per the manifest
    num_bytes: Optional[int]  # the whole file's size, per the manifest (None: not recorded)


@dataclasses.dataclass(frozen=True)
class HostPlan:
    """What this pipeline reads of a split; `make_dataset` puts it on the dataset as `.plan`."""
    hosts: Hosts
    pieces: Tuple[Piece, ...]
    records: int     # records in this pipeline's range
    per_epoch: int   # records it yields an epoch (training: the minimum over pipelines)
    split_records: int

    @property
    def files(self):
        return sorted({p.path for p in self.pieces})


def detect(input_context=None):
    """Hosts from `input_context`, else from a multi-worker strategy in scope, else TF_CONFIG.

    Without either, one host reads everything. A ParameterServerStrategy cluster (it has
    "ps" tasks) makes its datasets per worker through an input context: not guessed here.
    """
    if input_context is not None:
        return Hosts(int(input_context.num_input_pipelines),
                     int(input_context.input_pipeline_id), "input_context")
    resolved = _from_strategy()
    if resolved:
        return resolved
    return _from_tf_config(os.environ.get("TF_CONFIG", ""))


def _from_strategy():
    import tensorflow as tf

    if not tf.distribute.has_strategy():
        return None
    resolver = getattr(tf.distribute.get_strategy(), "cluster_resolver", None)
    if resolver is None:
        return None
    try:
        cluster = resolver.cluster_spec().as_dict()
    except (AttributeError, ValueError):
        return None
    return _from_cluster(cluster, resolver.task_type, resolver.task_id, "strategy")


def _from_tf_config(text):
    if not text:
        return Hosts(1, 0, "single")
    config = json.loads(text)
    task = config.get("task", {})
    return (_from_cluster(config.get("cluster", {}), task.get("type"), task.get("index", 0),
                          "TF_CONFIG") or Hosts(1, 0, "single"))


def _from_cluster(cluster, task_type, task_id, source):
    """MultiWorkerMirroredStrategy's numbering: the chief is worker 0, then the workers."""
    if not cluster or "ps" in cluster:
        return None
    chiefs, workers = len(cluster.get("chief", [])), len(cluster.get("worker", []))
    if chiefs + workers <= 1 or task_type not in ("chief", "worker"):
        return None  # one worker, or an evaluator: it reads everything
    index = int(task_id or 0) + (chiefs if task_type == "worker" else 0)
    return Hosts(chiefs + workers, index, source)


def plan(split_info, hosts, training, window=None):
    """This pipeline's HostPlan for `split_info` (a dataset_format.dataset_info.SplitInfo);
    `window` (start, stop): only those records of the split (a TFDS slice), in its order."""
    shards = [s for s in split_info.shards if s.num_examples > 0]
    whole = sum(s.num_examples for s in shards)
    first, last = window or (0, whole)
    total = last - first
    if not total:
        raise ValueError(f"split {split_info.name!r} has no records"
                         + (f" in [{first}:{last}]" if (first, last) != (0, whole) else ""))
    if hosts.count > total:
        raise ValueError(f"split {split_info.name!r} has {total} records for {hosts.count} "
                         "input pipelines: every pipeline needs at least one")
    lo, hi = (first + b for b in _bounds(total, hosts.count, hosts.index))
    pieces, offset = [], 0
    for s in shards:
        start, end = max(lo, offset), min(hi, offset + s.num_examples)
        if start < end:
            pieces.append(Piece(s.path, start - offset, end - start, s.num_examples,
                                s.num_bytes))
        offset += s.num_examples
    per_epoch = total // hosts.count if training else hi - lo
    return HostPlan(hosts, tuple(pieces), hi - lo, per_epoch, total)


def _bounds(total, count, index):
    return index * total // count, (index + 1) * total // count


def seed_for(seed, hosts):
    """A per-pipeline seed: reproducible from (seed, pipeline index), different per host."""
    if seed is None:
        return None
    if hosts.count == 1:
        return int(seed)
    import numpy as np

    return int(np.random.SeedSequence([int(seed) & (2**63 - 1), hosts.index])
               .generate_state(1, np.uint64)[0] >> 1)
