"""`python -m beam_pipeline.tools.verify`: a clean build passes; damage is caught and named."""

import hashlib
import json
import os
import shutil

import pytest

from beam_pipeline.tools import verify
from dataset_format import layout


@pytest.fixture
def dataset(built_dataset, tmp_path):
    """A private copy of the shared build: (root, version dir, manifest) that may be damaged."""
    root = str(tmp_path / "copy")
    shutil.copytree(built_dataset["root"], root)
    vdir = layout.version_dir(root, built_dataset["version"])
    return root, vdir, built_dataset["manifest"]


def _biggest_shard(manifest):
    return max((sh for s in manifest["splits"].values() for sh in s["shards"]),
               key=lambda sh: sh["num_examples"])


def _rewrite_manifest(vdir, change):
    path = os.path.join(vdir, layout.MANIFEST)
    with open(path) as f:
        manifest = json.load(f)
    change(manifest)
    with open(path, "w") as f:
        json.dump(manifest, f)


def _run_main(path, capsys):
    code = verify.main([path])
    out, err = capsys.readouterr()
    return code, out + err


def test_clean_dataset_passes(dataset, capsys):
    root, vdir, manifest = dataset
    assert verify.verify(root) == []
    assert verify.verify(vdir) == []
    code, text = _run_main(root, capsys)
    assert code == 0
    assert f"{manifest['accounting']['written']} records" in text and "OK" in text


def test_flipped_byte_is_caught(dataset, capsys):
    root, vdir, manifest = dataset
    shard = _biggest_shard(manifest)
    path = os.path.join(vdir, shard["path"])
    with open(path, "r+b") as f:  # a byte in the middle of the second record's data
        f.seek(int(open(layout.index_name(path)).read().splitlines()[1].split()[0]) + 500)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    problems = verify.verify(root)
    assert any(shard["path"] in p and "crc32c" in p for p in problems), problems
    assert any(shard["path"] in p and "record 1" in p and "data CRC mismatch" in p
               for p in problems), problems
    code, text = _run_main(root, capsys)
    assert code == 1
    assert "FAILED" in text and "data CRC mismatch" in text


def test_a_manifest_with_sha256_checksums_is_checked_by_them(dataset):
    """Versions written before shards had a CRC-32C name each shard's sha256 instead."""
    root, vdir, manifest = dataset
    shard = _biggest_shard(manifest)
    path = os.path.join(vdir, shard["path"])

    def to_sha256(m):
        for s in m["splits"].values():
            for sh in s["shards"]:
                with open(os.path.join(vdir, sh["path"]), "rb") as f:
                    sh["sha256"] = hashlib.sha256(f.read()).hexdigest()
                del sh["crc32c"]

    _rewrite_manifest(vdir, to_sha256)
    assert verify.verify(root) == []
    with open(path, "r+b") as f:  # the last byte of the file (the last frame's data CRC)
        f.seek(-1, os.SEEK_END)
        byte = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x01]))
    problems = verify.verify(root)
    assert any(p.startswith(f"{shard['path']}: sha256 ") for p in problems), problems


def test_a_changed_checksum_in_the_manifest_is_caught(dataset):
    root, vdir, manifest = dataset
    shard = _biggest_shard(manifest)

    def change(m):
        for s in m["splits"].values():
            for sh in s["shards"]:
                if sh["path"] == shard["path"]:
                    sh["crc32c"] = "AAAAAA=="

    _rewrite_manifest(vdir, change)
    assert verify.verify(root) == [
        f"{shard['path']}: crc32c {shard['crc32c']} does not match the manifest's AAAAAA== "
        "(file changed or corrupt)"]


def test_missing_shard_is_caught(dataset, capsys):
    root, vdir, manifest = dataset
    shard = _biggest_shard(manifest)
    os.remove(os.path.join(vdir, shard["path"]))
    problems = verify.verify(root)
    assert f"{shard['path']}: missing (the manifest lists it)" in problems
    code, text = _run_main(root, capsys)
    assert code == 1 and shard["path"] in text and "missing" in text


def test_count_mismatch_in_manifest_is_caught(dataset, capsys):
    """A manifest that is self-consistent but claims one more image than the files hold."""
    root, vdir, manifest = dataset
    shard = _biggest_shard(manifest)
    split = next(s for s, v in manifest["splits"].items() if shard in v["shards"])
    label = manifest["labels"][0]

    def claim_one_more(m):
        s = m["splits"][split]
        next(sh for sh in s["shards"] if sh["path"] == shard["path"])["num_examples"] += 1
        s["num_examples"] += 1
        s["label_counts"][label] += 1
        m["accounting"]["written"] += 1
        m["accounting"]["listed"] += 1

    _rewrite_manifest(vdir, claim_one_more)
    problems = verify.verify(root)
    want = shard["num_examples"]
    assert f"{shard['path']}: {want} records, manifest says {want + 1}" in problems, problems
    assert any(f"split {split!r}: class {label!r}" in p and "manifest says" in p
               for p in problems), problems
    code, text = _run_main(root, capsys)
    assert code == 1 and "manifest says" in text


def test_inconsistent_manifest_sums_are_caught(dataset):
    root, vdir, manifest = dataset

    def break_sums(m):
        m["accounting"]["listed"] += 5

    _rewrite_manifest(vdir, break_sums)
    problems = verify.verify(root)
    assert any("listed" in p and "duplicates + failed + written" in p for p in problems)


def test_bad_index_line_is_caught(dataset):
    root, vdir, manifest = dataset
    path = layout.index_name(os.path.join(vdir, _biggest_shard(manifest)["path"]))
    with open(path) as f:
        lines = f.read().splitlines()
    offset, length = lines[1].split()
    lines[1] = f"{offset} {int(length) + 1}"
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    problems = verify.verify(root)
    assert any(".index" in p and "line 2" in p for p in problems), problems


def test_not_a_dataset_exits_2(tmp_path, capsys):
    code, text = _run_main(str(tmp_path), capsys)
    assert code == 2 and "not a dataset" in text
    assert verify.verify(str(tmp_path))  # the function reports it as a problem


def test_a_directory_in_place_of_the_manifest_is_not_a_dataset(dataset, capsys):
    """Proven about the file (IsADirectoryError), so exit 2, not "cannot read" (exit 1)."""
    _, vdir, _ = dataset
    os.remove(os.path.join(vdir, layout.MANIFEST))
    os.mkdir(os.path.join(vdir, layout.MANIFEST))
    code, text = _run_main(vdir, capsys)
    assert code == 2 and "Is a directory" in text and "cannot read" not in text, text


def test_a_directory_in_place_of_the_catalog_is_a_problem_not_an_outage(dataset, capsys):
    root, vdir, manifest = dataset
    path = os.path.join(vdir, manifest["catalog"]["path"])
    os.remove(path)
    os.mkdir(path)
    code, text = _run_main(root, capsys)
    assert code == 1 and f"{manifest['catalog']['path']}: unreadable (IsADirectoryError" in text
    assert "FAILED" in text and "cannot read" not in text, text
