"""dataset_format/catalog_schema.py: the catalog's columns, its Arrow schema and the typed row
derived from them, against a fragment written and read back by store/catalog.py."""

import dataclasses

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


def test_a_fragment_row_reads_back_as_the_same_typed_row(tmp_path):
    path = str(tmp_path / "fragment.parquet")
    with catalog.FragmentWriter(path) as writer:
        writer.append(CatalogRow.from_dict(ROW).to_dict())
    (read,) = list(catalog.iter_tables(path))[0].to_pylist()
    assert CatalogRow.from_dict(read) == CatalogRow(**ROW)
    assert CatalogRow.from_dict(read).to_dict() == ROW


def test_an_unknown_column_is_named():
    with pytest.raises(KeyError, match=r"not catalog columns: \['colour'\]"):
        CatalogRow.from_dict(dict(ROW, colour="red"))
