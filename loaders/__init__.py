"""Read built datasets without TensorFlow: for PyTorch, JAX (Grain) and plain Python.

    from loaders import RecordSource, SequentialRecords
    source = RecordSource(ROOT, "train")          # len(source), source[i] -> Example
    stream = SequentialRecords(ROOT, "train[:10%]", host_index=0, host_count=1)

Built on the format package alone (manifest, .index offsets, frames, Example parsing):
importing this loads neither TensorFlow nor PyTorch. `loaders.pytorch` has the PyTorch
IterableDataset that splits a stream among DataLoader workers. See docs/reader.md.
"""

from loaders.records import Example, FieldsExample
from loaders.sequential import SequentialRecords
from loaders.source import RecordSource

__all__ = ["Example", "FieldsExample", "RecordSource", "SequentialRecords"]
