"""Image files -> sharded TFRecords, as an Apache Beam batch job (docs/architecture.md, docs/format.md)."""

# Beam's local worker processes import this package: a quiet CLI's workers stay quiet too
# (readers/_quiet.py; it imports neither Beam nor TensorFlow).
from readers import _quiet  # noqa: F401

__version__ = "0.1.0"
