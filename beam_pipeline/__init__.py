"""Image files -> sharded TFRecords, as an Apache Beam batch job (see DESIGN.md)."""

__version__ = "0.1.0"
