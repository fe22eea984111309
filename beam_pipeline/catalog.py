"""catalog.parquet: one row per stored example — which image sits where, with what label and hash.

Each shard writer writes its shard's rows as a small Parquet fragment beside the temp
shard; commit appends the fragments, shard by shard, into VDIR/catalog.parquet with one
ParquetWriter, so no process ever holds the whole table (one row group per shard).
Incremental regeneration and users' queries both read it:

    import pandas as pd
    pd.read_parquet("ROOT/versions/V/catalog.parquet").query("split == 'test'")
"""

import io

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

SCHEMA = pa.schema([
    ("key", pa.string()),          # image/filename: path relative to its input root
    ("uri", pa.string()),          # where it was read from
    ("label", pa.string()),
    ("label_id", pa.int64()),
    ("split", pa.string()),
    ("shard", pa.int32()),         # shard index within the split
    ("file", pa.string()),         # shard file name, relative to the version directory
    ("position", pa.int32()),      # record number within the shard
    ("offset", pa.int64()),        # byte offset of its TFRecord frame in the shard file
    ("length", pa.int64()),        # frame length in bytes
    ("sha256", pa.string()),       # of the stored image/encoded bytes
    ("input_size", pa.int64()),
    ("input_mtime", pa.float64()),  # mtime, or GCS update time
])


def fragment_bytes(rows):
    """[dict per example] -> the bytes of a Parquet file with SCHEMA."""
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), out)
    return out.getvalue()


def merge(fragments, path):
    """Append the fragments (in order) into one Parquet file at `path`; returns its row count."""
    rows = 0
    with FileSystems.create(path) as raw, pq.ParquetWriter(raw, SCHEMA) as writer:
        for fragment in fragments:
            with FileSystems.open(fragment) as f:
                table = pq.read_table(io.BytesIO(f.read()), schema=SCHEMA)
            writer.write_table(table)
            rows += table.num_rows
    return rows
