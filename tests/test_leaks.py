"""Near-duplicates in the build: the writer's perceptual hash, near_duplicates.jsonl, the
manifest, verify's warning, leaks left out of evaluation, incremental grouping, inspect's sheet."""

import io
import json
import os

import numpy as np
import pandas as pd
import pytest
import simplejpeg
from PIL import Image, ImageOps

from beam_pipeline.dedup import descriptor, leaks, perceptual
from beam_pipeline.job import images
from beam_pipeline.dedup import near_duplicates as grouping
from dataset_format import layout
from tests.helpers import build, check_invariants
from tests.test_format_doc import check as check_documented


def photo_like(seed, h=240, w=320):
    """Smooth random blobs from a seed: a stand-in photo with its own perceptual hash."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    return Image.fromarray(small, "RGB").resize((w, h), Image.Resampling.BICUBIC)


def encoded(img, fmt="JPEG", **save):
    buf = io.BytesIO()
    img.save(buf, fmt, **save)
    return buf.getvalue()


def test_writer_hashes_the_pass_through_jpeg_from_its_scaled_decode():
    data = encoded(photo_like(1), quality=90)
    out = images.convert(data, images.EncodeOptions(), with_phash=True)
    assert out.passed_through and out.data == data
    small = simplejpeg.decode_jpeg(data, "GRAY", min_width=32, min_height=32, strict=True)
    assert small.shape[:2] == (30 * 2, 40 * 2)  # DCT-scaled 1/4: >= 32 px a side
    assert (out.phash, out.phash_center) == perceptual.phash_pair(small)
    assert out.phash == perceptual.phash(small)
    full = np.asarray(photo_like(1))
    assert perceptual.hamming(out.phash, perceptual.phash(full)) <= 4
    assert images.convert(data, images.EncodeOptions()).phash is None  # not asked: no hash


def test_writer_hashes_the_stored_pixels_of_a_reencoded_image():
    img = photo_like(2)
    out = images.convert(encoded(img, "PNG"), images.EncodeOptions(max_side=160),
                         with_phash=True)
    assert not out.passed_through and (out.width, out.height) == (160, 120)
    stored = images.decode(encoded(img, "PNG"), images.EncodeOptions(max_side=160))
    assert (out.phash, out.phash_center) == perceptual.phash_pair(stored)


def test_scaled_hash_decode_still_rejects_damaged_jpegs():
    data = bytearray(encoded(photo_like(3), quality=90))
    del data[len(data) // 2:len(data) // 2 + 200]  # entropy-coded data torn out
    with pytest.raises(images.ImageError):
        images.convert(bytes(data), images.EncodeOptions(), with_phash=True)


def test_leak_flag_needs_the_hashes(tmp_path):
    from beam_pipeline.errors import UserError
    from beam_pipeline.launcher import flags, options

    assert flags.NEAR_DUPLICATE_RADIUS == grouping.DEFAULT_RADIUS
    with pytest.raises(UserError, match="needs --near_duplicates"):
        options.parse(["--input", str(tmp_path), "--output", str(tmp_path / "o"),
                       "--drop_near_duplicate_leaks"])


# --- builds ---------------------------------------------------------------------------------

def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """DIR/<split>/cat/: 6 distinct photos in train, 3 in test, and in test a 60% PNG copy
    of train/cat/p0.jpg re-exported at quality 70 (the planted leak)."""
    src = str(tmp_path_factory.mktemp("planted"))
    for k in range(6):
        write(f"{src}/train/cat/p{k}.jpg", encoded(photo_like(10 + k), quality=90))
    for k in range(3):
        write(f"{src}/test/cat/q{k}.jpg", encoded(photo_like(20 + k), quality=90))
    copy = photo_like(10).resize((192, 144), Image.Resampling.LANCZOS)
    write(f"{src}/test/cat/copy.png", encoded(Image.open(io.BytesIO(
        encoded(copy, quality=70))), "PNG"))
    return src


@pytest.fixture(scope="module")
def reported(planted, tmp_path_factory):
    return build(planted, tmp_path_factory.mktemp("reported") / "ds", "--near_duplicates")


def read_jsonl(vdir):
    with open(os.path.join(vdir, layout.NEAR_DUPLICATES)) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_planted_cross_split_pair_is_reported_everywhere(reported):
    from beam_pipeline.tools import verify

    (pair,) = read_jsonl(reported["version_dir"])
    assert pair["keys"] == ["test/cat/copy.png", "train/cat/p0.jpg"]
    assert pair["splits"] == ["test", "train"] and "excluded" not in pair and "why" not in pair
    assert pair["hash_distance"] <= grouping.DEFAULT_RADIUS
    assert pair["structure"] <= descriptor.MAX_STRUCTURE and pair["chroma"] <= descriptor.MAX_CHROMA
    m = reported["manifest"]
    rejected = m["near_duplicates"]["rejected"]
    assert m["near_duplicates"] == {
        "path": "near_duplicates.jsonl", "rejected_path": "near_duplicates_rejected.jsonl",
        "hash": "phash64x6+thumb85", "confirm": "luma16-chroma/3", "radius": 8,
        "exact_radius": 8, "found_at_radius": 1.0,
        "max_structure": descriptor.MAX_STRUCTURE, "max_chroma": descriptor.MAX_CHROMA,
        "max_mean_chroma": descriptor.MAX_MEAN_CHROMA,
        "candidates": 1 + rejected, "pairs": 1, "rejected": rejected, "unconfirmable": 0,
        "pairs_across_splits": 1, "components": 1, "images": 2, "leaks": 1, "excluded": 0,
        "incremental": False}
    with open(os.path.join(reported["version_dir"], layout.NEAR_DUPLICATES_REJECTED)) as f:
        assert sum(1 for line in f if json.loads(line)["why"]) == rejected
    assert m["accounting"]["leaks"] == 0 and m["splits"]["test"]["num_examples"] == 4
    check_documented(m, {"always", "unless `--sink beam`", "with `--near_duplicates`"})
    table = pd.read_parquet(os.path.join(reported["version_dir"], layout.CATALOG))
    assert table["phash"].notna().all() and table["phash"].nunique() >= 9  # the copy may tie
    assert table["phash_center"].notna().all() and (table["phash_center"] != table["phash"]).any()
    result = verify.check(reported["root"])
    assert result["problems"] == []
    (warning,) = result["warnings"]
    assert warning.startswith("1 evaluation image(s) are near-duplicates of train images")


@pytest.mark.slow
def test_leaks_are_left_out_of_evaluation_and_counted(planted, tmp_path):
    from beam_pipeline.tools import verify

    result = build(planted, tmp_path / "ds", "--near_duplicates", "--drop_near_duplicate_leaks")
    m = result["manifest"]
    assert m["accounting"] == dict(m["accounting"], listed=10, written=9, duplicates=0,
                                   failed=0, leaks=1)
    assert m["near_duplicates"]["excluded"] == 1
    assert m["splits"]["test"]["num_examples"] == 3 and m["splits"]["train"]["num_examples"] == 6
    (pair,) = read_jsonl(result["version_dir"])
    assert pair["excluded"] == ["test/cat/copy.png"]
    table = pd.read_parquet(os.path.join(result["version_dir"], layout.CATALOG))
    assert "test/cat/copy.png" not in set(table["key"])
    check_invariants(result)
    checked = verify.check(result["root"])
    assert checked["problems"] == [] and checked["warnings"] == []


@pytest.mark.slow
def test_a_ten_percent_crop_is_found_through_the_central_hash_and_left_out(tmp_path):
    """The test split holds train/cat/p31.jpg cropped to its central 90% (5% off each edge):
    the whole images' hashes are 16 bits apart, beyond the radius; the original's central
    hash is the crop's whole one."""
    src = str(tmp_path / "src")
    for k in (31, 32, 33):
        write(f"{src}/train/cat/p{k}.jpg", encoded(photo_like(k), quality=90))
    write(f"{src}/test/cat/q34.jpg", encoded(photo_like(34), quality=90))
    crop = encoded(photo_like(31).crop((16, 12, 304, 228)), quality=85)
    write(f"{src}/test/cat/crop.jpg", crop)
    original = images.convert(encoded(photo_like(31), quality=90), images.EncodeOptions(),
                              with_phash=True)
    cropped = images.convert(crop, images.EncodeOptions(), with_phash=True)
    assert perceptual.hamming(original.phash, cropped.phash) == 16
    assert perceptual.hamming(original.phash_center, cropped.phash) == 0
    result = build(src, tmp_path / "ds", "--near_duplicates", "--drop_near_duplicate_leaks")
    (pair,) = read_jsonl(result["version_dir"])
    assert pair == dict(pair, keys=["test/cat/crop.jpg", "train/cat/p31.jpg"],
                        splits=["test", "train"], hash_distance=0,
                        excluded=["test/cat/crop.jpg"])
    assert pair["structure"] <= descriptor.MAX_STRUCTURE  # a window of the original lines up
    m = result["manifest"]
    assert m["accounting"] == dict(m["accounting"], listed=5, written=4, duplicates=0,
                                   failed=0, leaks=1)
    assert m["near_duplicates"]["hash"] == "phash64x6+thumb85"
    assert m["near_duplicates"]["excluded"] == 1
    assert m["splits"]["test"]["num_examples"] == 1
    table = pd.read_parquet(os.path.join(result["version_dir"], layout.CATALOG))
    row = table.set_index("key").loc["train/cat/p31.jpg"]
    assert (perceptual.from_signed(int(row["phash"])),
            perceptual.from_signed(int(row["phash_center"]))) == (original.phash,
                                                                  original.phash_center)
    check_invariants(result)


@pytest.mark.slow
def test_incremental_run_compares_new_images_with_old_ones_only(planted, tmp_path,
                                                                monkeypatch):
    import shutil

    src = str(tmp_path / "src")
    shutil.copytree(planted, src)
    first = build(src, tmp_path / "ds", "--near_duplicates")
    brighter = np.clip(np.asarray(photo_like(10), np.int16) * 11 // 10, 0, 255)
    write(f"{src}/test/cat/brighter.jpg",
          encoded(Image.fromarray(brighter.astype(np.uint8)), quality=80))
    seen = _note_rows(monkeypatch)
    second = build(src, tmp_path / "ds", "--near_duplicates")
    assert second["manifest"]["incremental"]["from"] == first["version"]
    assert dict(seen)["test/cat/brighter.jpg"] is False
    assert sum(not old for _, old in seen) == 1 and len(seen) == 11  # the rest are old
    pairs = {tuple(p["keys"]) for p in read_jsonl(second["version_dir"])}
    assert ("test/cat/copy.png", "train/cat/p0.jpg") in pairs  # carried from the first run
    assert ("test/cat/brighter.jpg", "train/cat/p0.jpg") in pairs  # new vs old
    assert second["manifest"]["near_duplicates"]["incremental"] is True
    assert second["manifest"]["near_duplicates"]["leaks"] == 2


@pytest.mark.slow
def test_rows_from_a_catalog_without_the_central_hash_group_by_their_whole_hash(planted,
                                                                                tmp_path):
    """A previous version written before phash_center: its rows are kept as they are (null
    centre, nothing decoded again) and still pair with a new brighter copy by whole hash."""
    import shutil

    import pyarrow.parquet as pq

    src = str(tmp_path / "src")
    shutil.copytree(planted, src)
    first = build(src, tmp_path / "ds", "--near_duplicates")
    path = os.path.join(first["version_dir"], layout.CATALOG)
    pq.write_table(pq.read_table(path).drop_columns(["phash_center"]), path)
    brighter = np.clip(np.asarray(photo_like(10), np.int16) * 11 // 10, 0, 255)
    write(f"{src}/test/cat/brighter.jpg",
          encoded(Image.fromarray(brighter.astype(np.uint8)), quality=80))
    second = build(src, tmp_path / "ds", "--near_duplicates")
    assert second["manifest"]["incremental"]["from"] == first["version"]
    pairs = {tuple(p["keys"]) for p in read_jsonl(second["version_dir"])}
    assert ("test/cat/brighter.jpg", "train/cat/p0.jpg") in pairs
    table = pd.read_parquet(os.path.join(second["version_dir"], layout.CATALOG))
    kept = table[table["key"] != "test/cat/brighter.jpg"]
    assert len(kept) == 10 and kept["phash_center"].isna().all() and kept["phash"].notna().all()
    assert not pd.isna(table.set_index("key").loc["test/cat/brighter.jpg", "phash_center"])


@pytest.mark.slow
def test_inspect_draws_the_cross_split_pairs_side_by_side(reported, tmp_path):
    from beam_pipeline.tools import inspect_dataset

    out = str(tmp_path / "inspect")
    assert inspect_dataset.main([reported["root"], "--out", out, "--n", "4"]) == 0
    with Image.open(os.path.join(out, inspect_dataset.NEAR_DUPLICATE_SHEET)) as img:
        sheet = img.convert("RGB")
    assert 2 * 200 <= sheet.width <= 2 * 220 + 20, sheet.size  # two columns: one pair a row
    photos = []
    for box in ((0, 80, sheet.width // 2, sheet.height),  # below the captions
                (sheet.width // 2, 80, sheet.width, sheet.height)):
        half = sheet.crop(box)
        photos.append(half.crop(ImageOps.invert(half).getbbox()).resize((64, 48)))
    left, right = (np.asarray(p, np.float64) for p in photos)
    assert np.abs(left - right).mean() < 12 and left.std() > 30  # one photo twice, not blank


# --- verdicts across versions, and the closest rejects --------------------------------------

def test_previous_verdicts_count_only_when_confirmed_alike(tmp_path):
    """A previous version's pairs are carried over only when its manifest names this build's
    comparison and limits: verdicts under other limits are measured again."""
    vdir = str(tmp_path)
    assert not leaks._confirmed_alike(vdir)  # no manifest
    for near, alike in ((None, False), (leaks.confirm_spec(), True),
                        (dict(leaks.confirm_spec(), confirm="luma16-chroma/1"), False),
                        # proposed by the six stored hashes alone: pairs it held may be missing
                        (dict(leaks.confirm_spec(), hash="phash64x6"), False),
                        (dict(leaks.confirm_spec(), max_chroma=3.0), False),
                        (dict(leaks.confirm_spec(), max_mean_chroma=3.0), False),
                        (dict(leaks.confirm_spec(), max_structure=0.25), False)):
        with open(os.path.join(vdir, layout.MANIFEST), "w") as f:
            json.dump({"near_duplicates": near}, f)
        assert leaks._confirmed_alike(vdir) is alike, near


def test_closest_rejects_lines_name_the_measure_and_the_build_limits(tmp_path):
    from beam_pipeline.tools import near_rejects

    pairs = [grouping.NearPair(("a.jpg", "b.jpg"), ("train", "test"), 6, 0.3412, 0.8, False),
             grouping.NearPair(("c.jpg", "d.jpg"), ("test", "train"), 4, 0.0004, 3.44, False),
             grouping.NearPair(("e.jpg", "f.jpg"), ("train", "train"), 2, 0.26, 0.0, False)]
    with open(tmp_path / layout.NEAR_DUPLICATES_REJECTED, "w") as f:
        f.write("".join(p.to_json() + "\n" for p in pairs))
    manifest = {"near_duplicates": {"rejected_path": layout.NEAR_DUPLICATES_REJECTED,
                                    "rejected": 3, "max_structure": 0.25, "max_chroma": 3.0}}
    lines = near_rejects.closest(str(tmp_path), manifest, 5)
    assert lines == [
        "closest rejected cross-split near-duplicate pairs (2 shown, of 3 rejected in "
        "near_duplicates_rejected.jsonl; limits: structure 0.25, chroma 3.0):",
        "  c.jpg (test) ~ d.jpg (train): 4 bits, structure 0.0004, chroma 3.44, 1.15x the "
        "limit: colour differs (3.44 > 3)",
        "  a.jpg (train) ~ b.jpg (test): 6 bits, structure 0.3412, chroma 0.8, 1.36x the "
        "limit: structure differs (0.3412 > 0.25)"]
    # this build's limits: a pair of a row without the colour grid is held to the means' limit
    mean = grouping.NearPair(("g.jpg", "h.jpg"), ("train", "test"), 3, 0.01, 4.62, False, True)
    with open(tmp_path / layout.NEAR_DUPLICATES_REJECTED, "w") as f:
        f.write("".join(p.to_json() + "\n" for p in pairs[:1] + [mean]))
    manifest["near_duplicates"].update(max_chroma=2.5, max_mean_chroma=4.4)
    assert near_rejects.closest(str(tmp_path), manifest, 5) == [
        "closest rejected cross-split near-duplicate pairs (2 shown, of 3 rejected in "
        "near_duplicates_rejected.jsonl; limits: structure 0.25, chroma 2.5 (of whole means "
        "4.4)):",
        "  g.jpg (train) ~ h.jpg (test): 3 bits, structure 0.01, chroma 4.62, 1.05x the "
        "limit: colour differs (4.62 > 4.4)",
        "  a.jpg (train) ~ b.jpg (test): 6 bits, structure 0.3412, chroma 0.8, 1.36x the "
        "limit: structure differs (0.3412 > 0.25)"]
    assert near_rejects.closest(str(tmp_path), {}, 5) == [
        "no near-duplicate rejects: this version was built without --near_duplicates (or "
        "before rejected candidates were kept)"]


@pytest.mark.slow
def test_verify_prints_the_closest_rejected_cross_split_pairs(reported, tmp_path, capsys):
    """The planted build rejects no cross-split candidate, so a copy of it gets three
    rejected lines (a colour and a structure rejection across splits, one within train):
    verify prints the cross-split ones nearest the build's limits first, each with both
    measures and the one that rejected it."""
    import shutil

    from beam_pipeline.tools import verify

    root = str(tmp_path / "ds")
    shutil.copytree(reported["root"], root)
    vdir = os.path.join(root, os.path.relpath(reported["version_dir"], reported["root"]))
    added = [grouping.NearPair(("test/cat/q0.jpg", "train/cat/p1.jpg"), ("test", "train"), 7,
                               0.4123, 0.5, False),
             grouping.NearPair(("test/cat/q1.jpg", "train/cat/p2.jpg"), ("test", "train"), 5,
                               0.02, 2.75, False),
             grouping.NearPair(("train/cat/p3.jpg", "train/cat/p4.jpg"), ("train", "train"), 3,
                               0.32, 0.0, False)]
    with open(os.path.join(vdir, layout.NEAR_DUPLICATES_REJECTED), "a") as f:
        f.write("".join(p.to_json() + "\n" for p in added))
    assert verify.main([root, "--near_duplicate_rejects", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("closest rejected cross-split near-duplicate pairs (1 shown, of ")
    assert out[1:-1] == [
        "  test/cat/q1.jpg (test) ~ train/cat/p2.jpg (train): 5 bits, structure 0.02, chroma "
        f"2.75, {2.75 / descriptor.MAX_CHROMA:.2f}x the limit: colour differs (2.75 > "
        f"{descriptor.MAX_CHROMA:g})"]
    assert out[-1].startswith("OK ")
    assert verify.main([root, "--near_duplicate_rejects", "5"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out[1:-1]] == [
        "  test/cat/q1.jpg (test) ~ train/cat/p2.jpg (train)",
        "  test/cat/q0.jpg (test) ~ train/cat/p1.jpg (train)"]
    assert out[2].endswith(f"structure differs (0.4123 > {descriptor.MAX_STRUCTURE:g})")
    with pytest.raises(SystemExit):
        verify.main([root, "--near_duplicate_rejects", "-1"])
    assert "--near_duplicate_rejects -1: must be >= 0" in capsys.readouterr().err


@pytest.mark.slow
def test_an_incremental_build_measures_again_what_was_confirmed_otherwise(planted, tmp_path,
                                                                          monkeypatch):
    """The previous version's verdicts were made by another comparison: none is carried
    over; every pair is measured again (the records are reused: the stored descriptor is
    the same), and the planted pair is found again."""
    import shutil

    src = str(tmp_path / "src")
    shutil.copytree(planted, src)
    first = build(src, tmp_path / "ds", "--near_duplicates")
    assert first["manifest"]["near_duplicates"]["confirm"] == leaks.CONFIRM
    brighter = np.clip(np.asarray(photo_like(10), np.int16) * 11 // 10, 0, 255)
    write(f"{src}/test/cat/brighter.jpg",
          encoded(Image.fromarray(brighter.astype(np.uint8)), quality=80))
    monkeypatch.setattr(leaks, "CONFIRM", leaks.CONFIRM + "-next")
    seen = _note_rows(monkeypatch)
    second = build(src, tmp_path / "ds", "--near_duplicates")
    assert second["manifest"]["incremental"]["from"] == first["version"]
    near = second["manifest"]["near_duplicates"]
    assert near["confirm"] == leaks.CONFIRM and near["incremental"] is False
    assert len(seen) == 11 and not any(old for _, old in seen)  # every pair compared
    assert {tuple(p["keys"]) for p in read_jsonl(second["version_dir"])} >= {
        ("test/cat/copy.png", "train/cat/p0.jpg"), ("test/cat/brighter.jpg", "train/cat/p0.jpg")}


def _note_rows(monkeypatch):
    """-> a list the near-duplicate search fills with (key, old) of every row it is given."""
    seen, near_pairs = [], grouping.near_pairs

    def noting(rows, *args, **kw):
        def noted(rows):
            for r in rows:
                seen.append((r.key, r.old))
                yield r
        return near_pairs(noted(rows), *args, **kw)

    monkeypatch.setattr(grouping, "near_pairs", noting)
    return seen
