"""Leftovers of killed runs are cleaned by the next one; the small commands answer in a line.

* A version complete but never published (killed between manifest.json and LATEST) loses
  its manifest at the next build, which resumes its shards and then deletes it: it takes
  no --keep_versions slot. A published version's .tmp/ (killed after LATEST) is deleted.
* A prune stopped part way leaves an incomplete version, never a manifest whose shards are
  gone: the manifest is deleted first.
* `python -m readers` gives one line and exit 2 for what verify names; `sample_data --help`
  prints help.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

from beam_pipeline.store import retention, versions
from dataset_format import layout
from tests.helpers import REPO, build, image_bytes, make_images

NOBODY = 65534


@pytest.mark.slow
def test_a_version_never_published_and_a_published_tmp_are_cleaned_by_the_next_run(
        tmp_path, capsys):
    src, root = tmp_path / "in", tmp_path / "out"
    make_images(src, {"cat": 3, "dog": 3})
    args = ["--num_shards", "1", "--keep_versions", "2", "--keep_superseded_hours", "0"]
    first = build(src, root, *args)["version"]
    make_images(src, {"cat": {"new.jpg": image_bytes((9, 99, 199))}})
    orphan = build(src, root, *args)["version"]
    # The state a run killed between its manifest and LATEST leaves: LATEST still names the
    # first version; and one killed after LATEST moved left its .tmp/ behind.
    (root / layout.LATEST).write_text(json.dumps(layout.latest_record(first)))
    (root / layout.VERSIONS / first / ".tmp" / "listing").mkdir(parents=True)
    (root / layout.VERSIONS / first / ".tmp" / "listing" / "x.jsonl").write_text("[]\n")
    capsys.readouterr()
    third = build(src, root, *args)["version"]
    out = capsys.readouterr().out
    assert f"version {orphan} was never published (a run killed before LATEST)" in out
    # keep 2: the orphan took no slot, so the first version is still kept
    assert versions.list_versions(str(root)) == {first: True, third: True}
    assert not (root / layout.VERSIONS / first / ".tmp").exists()


@pytest.fixture
def open_dir():
    """A fresh folder every user can traverse (pytest's tmp_path is root's alone)."""
    path = tempfile.mkdtemp(prefix="leftovers-")
    os.chmod(path, 0o755)
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


def test_a_prune_stopped_part_way_leaves_no_manifest_without_its_shards(open_dir):
    """The deletion fails half way (a file it may not delete, as nobody): the manifest is
    already gone, so the version is incomplete (deleted by the next cleanup), not a
    complete-looking version whose shards are missing."""
    root = open_dir / "root"
    vdir = root / layout.VERSIONS / "20260101T000000Z"
    (vdir / ".tmp").mkdir(parents=True)
    for name in (layout.MANIFEST, "a-train.tfrecord-00000-of-00001", "zz.index"):
        (vdir / name).write_text("x")
    (vdir / ".tmp" / "kept").write_text("x")  # in a folder only root may change
    for d in (root, root / layout.VERSIONS):
        os.chmod(d, 0o755)
    os.chmod(vdir, 0o777)
    if os.geteuid() == 0:
        os.setegid(NOBODY)
        os.seteuid(NOBODY)
    try:
        with pytest.raises(Exception):
            retention.delete_version(str(root), "20260101T000000Z")
    finally:
        if os.geteuid() != os.getuid():
            os.seteuid(0)
            os.setegid(0)
    assert not (vdir / layout.MANIFEST).exists()
    assert versions.list_versions(str(root)) == {"20260101T000000Z": False}


def _readers(root, *args):
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="0")
    return subprocess.run([sys.executable, "-m", "readers", str(root), *args], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_readers_cli_answers_each_damage_verify_names_in_one_line(built_dataset, tmp_path):
    """Before: TensorFlow's traceback for a corrupt record."""
    root = tmp_path / "ds"
    shutil.copytree(built_dataset["root"], root)
    vdir = root / layout.VERSIONS / built_dataset["version"]
    shards = {split: [vdir / s["path"] for s in info["shards"]]
              for split, info in built_dataset["manifest"]["splits"].items()}
    train, validation = shards["train"][0], shards["validation"][0]
    data = bytearray(train.read_bytes())
    data[len(data) // 2] ^= 0xFF
    train.write_bytes(bytes(data))
    validation.write_bytes(validation.read_bytes()[:100])
    os.remove(shards["test"][0])
    cases = [((), f"{train}: could not read all of records"),
             (("--split", "validation"), f"{validation}: 100 bytes, but manifest.json says"),
             (("--split", "test"), f"{shards['test'][0]}: shard file missing"),
             (("--version", "29990101T000000Z"), "version '29990101T000000Z' does not exist")]
    for args, says in cases:
        done = _readers(root, *args)
        lines = [l for l in done.stderr.splitlines() if l.startswith("error:")]
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert len(lines) == 1 and says in lines[0], done.stderr


def test_sample_data_help_prints_help_and_writes_nothing(tmp_path):
    """Before: it wrote 123 images into a folder named --help."""
    done = subprocess.run([sys.executable, "-m", "beam_pipeline.tools.sample_data", "--help"],
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: ")
    assert "circle, square, triangle" in " ".join(done.stdout.split())
    assert os.listdir(tmp_path) == []
