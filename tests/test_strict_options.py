"""Strict where a typo changes the outcome; lenient where an option changes no record.

* A malformed scheme (`gs:/bucket`), a missing --input, a JSONL manifest value that is not a
  string: exit 2 in one line, before anything is created.
* --splits changed for published images, and a clock behind LATEST: said, before the work.
* Options that change no record (--max_error_rate, --keep_versions, --splits, ...) reuse
  every stored record; options.RECORD_OPTIONS convert again; options.LAYOUT_OPTIONS build
  in full from the stored records (re-framed, none decoded).
"""

import json
import os
import shutil

import pytest

from beam_pipeline import cli
from beam_pipeline.launcher import options as opts
from dataset_format import layout
from tests.helpers import build, image_bytes, make_images


def one_line(capsys, argv, code=2):
    assert cli.main([str(a) for a in argv]) == code
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# --- typos exit 2 before anything is created ---------------------------------------------------

@pytest.mark.parametrize("flag, location", [
    ("--output", "gs:/bucket/x"), ("--output", "gs:bucket/x"), ("--output", "GS://bucket/x"),
    ("--output", "gs:///x"), ("--input", "gs:/bucket/in"), ("--input", "s3://bucket/in")])
def test_a_malformed_scheme_exits_2_and_creates_nothing(tmp_path, monkeypatch, capsys, flag,
                                                        location):
    """Before: `--output gs:/bucket/x` built a local folder ./gs:/bucket/x."""
    make_images(tmp_path / "in", {"cat": 1})
    monkeypatch.chdir(tmp_path)
    args = {"--input": "in", "--output": "out", flag: location}
    line = one_line(capsys, [a for kv in args.items() for a in kv])
    assert line.startswith(f"error: {flag} {location}: ")
    assert ("not a gs:// location" in line) == location.lower().startswith("gs:")
    assert os.listdir(tmp_path) == ["in"]


@pytest.mark.parametrize("spec, says", [("missing", "no such directory"),
                                        ("missing.jsonl", "no such manifest"),
                                        ("missing/*/*.jpg", "no such directory (missing)")])
def test_a_missing_input_exits_2_before_the_output_exists(tmp_path, monkeypatch, capsys, spec,
                                                          says):
    """Before: the output folder was created (and locked) first."""
    monkeypatch.chdir(tmp_path)
    assert one_line(capsys, ["--input", spec, "--output", "out"]) == \
        f"error: --input {spec}: {says}"
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("row, column, shown", [
    ({"uri": "cat/000.jpg", "label": ["dog"]}, "label", '["dog"]'),
    ({"uri": "cat/000.jpg", "label": 1}, "label", "1"),
    ({"uri": 7, "label": "cat"}, "uri", "7"),
    ({"uri": "cat/000.jpg", "label": "cat", "split": False}, "split", "false")])
def test_a_jsonl_value_that_is_not_a_string_exits_2_with_file_and_line(tmp_path, capsys, row,
                                                                       column, shown):
    """Before: str() made the label ["dog"] a class "['dog']", and 1 and "1" one class."""
    make_images(tmp_path, {"cat": 2})
    path = tmp_path / "list.jsonl"
    path.write_text(json.dumps({"uri": "cat/001.jpg", "label": "cat"}) + "\n"
                    + json.dumps(row) + "\n")
    assert one_line(capsys, ["--input", path, "--output", tmp_path / "out"]) == \
        f"error: {path}:2: {column} must be a JSON string, not {shown}"
    assert not (tmp_path / "out" / layout.VERSIONS).exists()


# --- said before the work -----------------------------------------------------------------------

@pytest.mark.slow
def test_a_clock_behind_latest_is_refused_before_the_work(tmp_path, capsys):
    """Before: the build ran to its end, then failed blaming a concurrent build."""
    src, root = tmp_path / "in", tmp_path / "out"
    make_images(src, {"cat": 3})
    first = build(src, root, "--num_shards", "1")
    future = "29990101T000000Z"  # what LATEST names when this machine's clock is behind
    shutil.copytree(first["version_dir"], root / layout.VERSIONS / future)
    (root / layout.LATEST).write_text(json.dumps(layout.latest_record(future)))
    capsys.readouterr()
    line = one_line(capsys, ["--input", src, "--output", root])
    assert f"{root}: this machine's clock reads " in line
    assert f"before the latest version, {future}" in line and "Set the clock" in line
    assert sorted(os.listdir(root / layout.VERSIONS)) == [first["version"], future]


@pytest.mark.slow
def test_changed_splits_apply_to_new_images_and_the_summary_says_so(tmp_path, capsys):
    src, root = tmp_path / "in", tmp_path / "out"
    make_images(src, {"cat": 12, "dog": 12})
    first = build(src, root, "--num_shards", "1")
    make_images(src, {"cat": {"new.jpg": image_bytes((1, 2, 3))}})
    capsys.readouterr()
    second = build(src, root, "--num_shards", "1", "--splits", "train=0.2,test=0.8")
    out = capsys.readouterr().out
    assert ("note: --splits changed from train=0.8,validation=0.1,test=0.1 to "
            "train=0.2,test=0.8: it applies to new images only; the 24 published image(s) "
            "listed keep their splits") in out
    assert out.index("note: --splits") > out.index("Published")  # in the summary
    before = {s: n["num_examples"] for s, n in first["manifest"]["splits"].items()}
    after = {s: n["num_examples"] for s, n in second["manifest"]["splits"].items()}
    assert sum(after.values()) == 25 and all(after[s] >= n for s, n in before.items())
    assert second["manifest"]["build"]["converted"] == 1  # --splits changes no record
    capsys.readouterr()
    make_images(src, {"dog": {"newer.jpg": image_bytes((3, 2, 1))}})
    build(src, root, "--num_shards", "1", "--splits", "train=0.2,test=0.8")
    assert "--splits changed" not in capsys.readouterr().out  # said once


# --- which options change records ---------------------------------------------------------------

def test_record_and_layout_options_are_build_options_and_disjoint():
    own = {a.dest for a in opts._own_actions()}
    assert opts.RECORD_OPTIONS <= own and opts.LAYOUT_OPTIONS <= own
    assert not opts.RECORD_OPTIONS & opts.LAYOUT_OPTIONS
    assert opts.changed({"jpeg_quality": 90, "max_error_rate": 0.01},
                        {"jpeg_quality": 80, "max_error_rate": 0.05},
                        opts.RECORD_OPTIONS) == ["jpeg_quality"]


@pytest.mark.slow
def test_options_that_change_no_record_reuse_every_record_and_the_others_do_not(tmp_path):
    """Before: `--max_error_rate 0.05` alone converted every image again (the whole config
    was compared); so did --keep_versions, --target_shard_mb and the rest."""
    src, root = tmp_path / "in", tmp_path / "out"
    make_images(src, {"cat": 6, "dog": 6}, size=(40, 30))
    base = ["--num_shards", "1", "--reencode", "always", "--max_delta_share", "1"]
    build(src, root, *base)

    def rebuild(*args):
        """A rebuild with one new image and `args` -> (converted, reframed, incremental)."""
        rebuild.n = getattr(rebuild, "n", 0) + 1
        make_images(src, {"cat": {f"new{rebuild.n}.jpg": image_bytes((17 * rebuild.n % 256, 250 - 13 * rebuild.n, 90))}})
        m = build(src, root, *base, *args)["manifest"]
        return m["build"]["converted"], m["build"]["reframed"], "incremental" in m

    images = lambda: 12 + rebuild.n  # noqa: E731
    for args in (["--max_error_rate", "0.05"], ["--keep_versions", "5"],
                 ["--splits", "train=0.5,validation=0.25,test=0.25"], ["--name", "pets"],
                 ["--max_image_mb", "500"], ["--keep_superseded_hours", "1"]):
        assert rebuild(*args) == (1, 0, True), args  # only the new image is decoded
        base += args
    # layout options: a full build from the stored records, decoding only the new image
    for args in (["--num_shards", "2"], ["--write_index", "false"]):
        assert rebuild(*args) == (1, images() - 1, False), args
        base += args
    # record options: every image converted again
    for args in (["--jpeg_quality", "80"], ["--max_side", "32"], ["--validate", "header"],
                 ["--near_duplicates"]):
        assert rebuild(*args)[:2] == (images(), 0), args
        base += args


@pytest.mark.slow
def test_a_beam_sink_build_is_refused_on_a_root_with_a_split_map(tmp_path, capsys):
    """Before: one `--sink beam` build (no catalog) erased the split map for every later
    night: the next build split every image by its key hash again."""
    src, root = tmp_path / "in", tmp_path / "out"
    make_images(src, {"cat": 3, "dog": 3})
    first = build(src, root, "--num_shards", "1")
    line = one_line(capsys, ["--input", src, "--output", root, "--sink", "beam", "--force"])
    assert line == (f"error: --sink beam writes no catalog, so it would erase the split map of "
                    f"{root} (the splits its published images keep for life); build the "
                    "comparison into another --output, or add --resplit to start the split map "
                    "over")
    assert os.listdir(root / layout.VERSIONS) == [first["version"]]
    beam = build(src, root, "--num_shards", "1", "--sink", "beam", "--resplit")
    assert beam["manifest"]["config"]["sink"] == "beam"
