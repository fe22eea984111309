"""Image files -> sharded TFRecords, as an Apache Beam batch job (docs/architecture.md, docs/format.md)."""

import os

# Arrow's default allocator (mimalloc) keeps tens of MB of pages for each thread that made a
# catalog table of a few MB (the shard writers' threads, commit's fragment readers): 40-70
# MB of a local 20,000-photo build's peak RSS, more with more shards. The system allocator
# gives them back. Arrow reads this at its first allocation, so it is set before anything
# here imports pyarrow; a pool the user chose is kept.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

# Beam's local worker processes import this package: a quiet CLI's workers stay quiet too
# (tf_quiet/__init__.py; it imports neither Beam nor TensorFlow).
import tf_quiet  # noqa: F401

__version__ = "0.1.0"
