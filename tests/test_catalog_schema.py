"""dataset_format/catalog_schema.py: the catalog's columns, its Arrow schema and the typed row
derived from them, against a fragment written and read back by store/catalog.py."""

import base64
import dataclasses
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_pipeline.store import catalog
from dataset_format import catalog_schema
from dataset_format.catalog_schema import CatalogRow

ROW = {"key": "cat/a.jpg", "uri": "/in/cat/a.jpg", "label": "cat", "label_id": 0,
       "split": "train", "shard": 1, "file": "x-train.tfrecord-00001-of-00002", "position": 3,
       "offset": 120, "length": 44, "sha256": "ab" * 32, "height": 4, "width": 6,
       "input_size": 30, "input_stamp": "1:2", "input_sha256": "cd" * 32, "input_md5": None,
       "phash": -5, "phash_center": 7, "near_descriptor": b"\x01\x02"}


def test_the_row_type_has_a_field_per_column_in_file_order():
    assert [f.name for f in dataclasses.fields(CatalogRow)] == list(catalog_schema.COLUMNS)
    assert catalog.SCHEMA.names == list(catalog_schema.COLUMNS)
    assert [str(f.type) for f in catalog.SCHEMA] == list(catalog_schema.COLUMNS.values())
    assert CatalogRow().key is None  # a column a row lacks is null
    with pytest.raises(dataclasses.FrozenInstanceError):
        CatalogRow().key = "k"
    with pytest.raises(TypeError, match=r"not catalog columns: \['colour'\]"):
        CatalogRow(key="k", colour="red")
    row = CatalogRow(key="k", position=2)
    moved = row.replace(position=3)
    assert (row.position, moved.position, moved.key, moved.uri) == (2, 3, "k", None)
    assert moved == dataclasses.replace(row, position=3)
    with pytest.raises(TypeError, match="colour"):
        row.replace(colour="red")


def test_a_fragment_row_reads_back_as_the_same_typed_row(tmp_path):
    path = str(tmp_path / "fragment.parquet")
    with catalog.FragmentWriter(path) as writer:
        writer.append(CatalogRow.from_dict(ROW))
    (read,) = list(catalog.iter_tables(path))[0].to_pylist()
    assert CatalogRow.from_dict(read) == CatalogRow(**ROW)
    assert CatalogRow.from_dict(read).to_dict() == ROW
    assert list(catalog.read_rows(path)) == [CatalogRow(**ROW)]


def test_typed_rows_write_the_bytes_the_column_dicts_wrote(tmp_path, monkeypatch):
    """The writers build CatalogRows and the fragment turns them into dicts only at the
    Parquet seam: the file is byte for byte what a table of the rows' dicts gives, over
    several row groups and with the nulls of rows written before a column existed."""
    monkeypatch.setattr(catalog, "ROWS_PER_BATCH", 3)
    rows = [dict(ROW, key=f"cat/{i}.jpg", position=i, offset=44 * i, phash=None if i % 2 else i,
                 near_descriptor=None if i % 3 else bytes([i, 7])) for i in range(8)]
    typed = str(tmp_path / "typed.parquet")
    with catalog.FragmentWriter(typed) as writer:
        for row in rows:
            writer.append(CatalogRow.from_dict(row))
    plain = str(tmp_path / "plain.parquet")
    with pq.ParquetWriter(plain, catalog.SCHEMA) as writer:
        for i in range(0, len(rows), 3):
            writer.write_table(pa.Table.from_pylist(rows[i:i + 3], schema=catalog.SCHEMA))
    assert (tmp_path / "typed.parquet").read_bytes() == (tmp_path / "plain.parquet").read_bytes()


def test_a_row_carried_as_json_comes_back_equal():
    """Kept rows cross from the launcher to the job as JSON lines (the descriptor as base64,
    as catalog.iter_rows gives it); an update is a new row (row.replace)."""
    row = CatalogRow.from_dict(ROW)
    text = row.to_json()
    assert json.loads(text)["near_descriptor"] == base64.b64encode(b"\x01\x02").decode()
    assert CatalogRow.from_json(text) == row == CatalogRow.from_json(json.loads(text))
    moved = row.replace(uri="/new/cat/a.jpg", input_stamp="3:4")
    assert CatalogRow.from_json(moved.to_json()).to_dict() == dict(ROW, uri="/new/cat/a.jpg",
                                                                   input_stamp="3:4")
    assert CatalogRow.from_json(row.replace(near_descriptor=None).to_json()
                                ).near_descriptor is None


def test_an_unknown_column_is_named():
    with pytest.raises(KeyError, match=r"not catalog columns: \['colour'\]"):
        CatalogRow.from_dict(dict(ROW, colour="red"))
