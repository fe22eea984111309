"""The on-disk format of a built dataset (docs/format.md), owned by neither side.

The Beam job writes it, the readers and tools read it, and both import it from here. Pure
Python: importing it loads neither TensorFlow nor Apache Beam.
"""
