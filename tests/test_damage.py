"""Damage never propagates, and verify's advice repairs what it reports.

* A byte flipped in a stored shard is caught on the way into the next version: a reused
  shard's size and crc32c are checked first, copied records' CRCs as they are copied;
  the damaged record is converted again from its input (or rejected when the input is
  gone), and the summary says so.
* verify checks the catalog: it reads, its rows match the records, its offsets point at
  them.
"""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_pipeline.tools import verify
from dataset_format import layout
from tests.helpers import build, check_invariants, make_images
from tests.model_tree import stored_examples, tiny_image

ARGS = ["--name", "pets", "--target_shard_mb", "0.01", "--no_transform", "--max_error_rate",
        "1", "--max_delta_share", "1"]


def flip_a_byte(vdir, manifest, nth_shard=0):
    """One byte inside the first record's image bytes of a shard -> (its path, the row)."""
    from beam_pipeline.store import catalog

    shard = [s for info in manifest["splits"].values() for s in info["shards"]
             if s["num_examples"] > 1][nth_shard]
    row = next(r for r in catalog.iter_rows(layout.join(vdir, layout.CATALOG))
               if r["file"] == shard["path"] and r["position"] == 0)
    path = os.path.join(vdir, shard["path"])
    data = bytearray(open(path, "rb").read())
    data[row["offset"] + row["length"] // 2] ^= 0x40
    open(path, "wb").write(bytes(data))
    return path, row


def tree(tmp_path, n=24):
    src = tmp_path / "src"
    make_images(src, {"cat": {f"{i:03d}.jpg": tiny_image(i, "jpg") for i in range(n)}})
    return src


@pytest.mark.slow
def test_a_flipped_byte_is_converted_again_not_reused_or_copied(tmp_path, capsys):
    src, root = tree(tmp_path), tmp_path / "root"
    v1 = build([src], root, *ARGS)
    assert verify.verify(str(root)) == []
    _, row = flip_a_byte(v1["version_dir"], v1["manifest"])  # a shard the next run reuses
    assert any("CRC" in p for p in verify.verify(str(root)))
    make_images(src, {"cat": {"new.jpg": tiny_image(99, "jpg")}})
    capsys.readouterr()
    v2 = build([src], root, *ARGS)  # before: the damaged file hard-linked, exit 0
    assert "repaired: 1 damaged record(s)" in capsys.readouterr().out
    assert v2["manifest"]["build"] == dict(v2["manifest"]["build"], repaired=1, converted=2)
    assert verify.verify(str(root)) == []
    check_invariants(v2)
    # A copy task (the shard loses a member) meets damage too.
    from beam_pipeline.store import catalog

    _, row = flip_a_byte(v2["version_dir"], v2["manifest"])
    (src / "cat" / "new.jpg").unlink()
    other = next(r for r in catalog.iter_rows(layout.join(v2["version_dir"], layout.CATALOG))
                 if r["file"] == row["file"] and r["key"] != row["key"])
    (src / other["key"]).unlink()
    v3 = build([src], root, *ARGS)
    assert v3["manifest"]["build"]["repaired"] == 1 and verify.verify(str(root)) == []
    v4 = build([src], root, *ARGS, "--force", "--full_rebuild")  # the same records
    assert (stored_examples(v4["version_dir"], v4["manifest"])
            == stored_examples(v3["version_dir"], v3["manifest"]))


@pytest.mark.slow
def test_verify_advises_force_and_force_repairs_every_problem_it_reports(tmp_path):
    src, root = tree(tmp_path), tmp_path / "root"
    v1 = build([src], root, *ARGS)
    vdir = v1["version_dir"]
    flip_a_byte(vdir, v1["manifest"])
    index = [p for p in os.listdir(vdir) if p.endswith(".index")][-1]
    with open(os.path.join(vdir, index), "a") as f:
        f.write("1 2\n")
    problems = verify.verify(str(root))
    assert len(problems) >= 2
    assert verify.main([str(root)]) == 1
    build([src], root, *ARGS, "--force")  # before: the same damage published again
    assert verify.verify(str(root)) == []


@pytest.mark.slow
def test_a_damaged_record_whose_input_is_gone_is_rejected_and_said(tmp_path):
    """The input is gone by the time the job reads it (deleted after listing): the damaged
    record is rejected with a reason, not copied."""
    from beam_pipeline.job import reuse
    from beam_pipeline.job.contracts import ShardFiles, ShardResult
    from beam_pipeline.job.images import EncodeOptions
    from beam_pipeline.job.shards import WriteShardFn
    from beam_pipeline.store import catalog

    src, root = tree(tmp_path, 6), tmp_path / "root"
    v1 = build([src], root, *ARGS, "--num_shards", "1", "--splits", "train=1")
    vdir, manifest = v1["version_dir"], v1["manifest"]
    path, row = flip_a_byte(vdir, manifest)
    os.remove(row["uri"])
    shard = manifest["splits"]["train"]["shards"][0]
    rows = list(catalog.iter_rows(layout.join(vdir, layout.CATALOG)))
    listing = tmp_path / "task.jsonl"
    listing.write_text("\n".join([json.dumps({"source": shard["path"], "crc32c":
                                              shard["crc32c"], "num_bytes":
                                              shard["num_bytes"]})]
                                 + [json.dumps([i, r["uri"], r["input_size"], r["input_stamp"],
                                               None, None]) for i, r in enumerate(rows)]))
    out = tmp_path / "out"
    fn = WriteShardFn(str(out / ".tmp"), "pets", {"train": 1}, {"cat": 0}, EncodeOptions(),
                      True, previous_vdir=vdir)
    fn.setup()
    result = ShardResult(split="train", shard=0,
                         files=ShardFiles(path=shard["path"], temp=str(out / shard["path"]),
                                          catalog_temp=str(out / "fragment.parquet")))
    done = reuse.run("reuse", result, str(listing), vdir, True, redo=fn._redo)
    fn.teardown()
    assert done.written.num_examples == 5 and done.made.repaired == 0
    assert [(e.uri, e.reason) for e in done.errors] == [(row["uri"], "damaged_record")]
    assert "stored record is damaged" in done.errors[0].detail


@pytest.mark.slow
def test_verify_checks_the_catalog(tmp_path):
    src, root = tree(tmp_path, 12), tmp_path / "root"
    v1 = build([src], root, *ARGS)
    path = os.path.join(v1["version_dir"], layout.CATALOG)
    table = pq.read_table(path)
    offsets = table["offset"].to_pylist()
    offsets[1] += 1
    keys = table["key"].to_pylist()
    keys[2], keys[3] = keys[3], keys[2]
    bad = table.set_column(table.schema.get_field_index("offset"), "offset",
                           pa.array(offsets, pa.int64()))
    bad = bad.set_column(bad.schema.get_field_index("key"), "key", pa.array(keys))
    pq.write_table(bad, path)
    problems = verify.verify(str(root))  # before: OK
    assert any("offset" in p and keys[1] in p for p in problems), problems
    assert any(keys[2] in p and "the row says" in p for p in problems), problems
    with open(path, "r+b") as f:
        f.truncate(100)
    assert any(p.startswith("catalog.parquet: unreadable") for p in verify.verify(str(root)))
    os.remove(path)
    assert "catalog.parquet: missing" in verify.verify(str(root))
