"""`python -m beam_pipeline.tools.inspect_dataset`: summary text and two sensible PNGs."""

import os
import shutil
import sys

import pytest
from PIL import Image

from beam_pipeline.tools import drawing, samples
from beam_pipeline.tools import inspect_dataset as inspect_cmd
from dataset_format import layout


@pytest.fixture(scope="module")
def inspected(built_dataset, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("inspect"))
    with pytest.MonkeyPatch.context() as mp:
        # The environment ./run_local.sh makes has no plotting library: drawing is Pillow's.
        mp.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
        code = inspect_cmd.main([built_dataset["root"], "--out", out, "--n", "9"])
    return code, out


def test_writes_plausible_pngs(inspected):
    code, out = inspected
    assert code == 0
    for name, min_kb in ((inspect_cmd.CONTACT_SHEET, 20), (inspect_cmd.CLASS_COUNTS, 4)):
        path = os.path.join(out, name)
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", name
        assert min_kb * 1024 < os.path.getsize(path) < 3 * 2**20, (name, os.path.getsize(path))
        with Image.open(path) as img:
            assert 300 <= img.width <= 3000 and 200 <= img.height <= 3000, (name, img.size)


def test_contact_sheet_is_a_grid_of_the_samples(inspected):
    _, out = inspected
    with Image.open(os.path.join(out, inspect_cmd.CONTACT_SHEET)) as img:
        sheet = img.convert("RGB")
    # 9 samples: 3 columns of thumbnails no wider than 200 px each, plus margins.
    assert 3 * 200 <= sheet.width <= 3 * 220 and sheet.height > 3 * 200, sheet.size
    colours = sheet.getcolors(maxcolors=1 << 24)  # [(count, rgb)]
    white = dict((rgb, n) for n, rgb in colours).get(drawing.BACKGROUND, 0)
    assert white < 0.6 * sheet.width * sheet.height, "mostly empty: thumbnails missing?"
    assert len(colours) > 200  # photos, not just captions


def test_class_chart_bars_follow_the_manifest(inspected, built_dataset):
    """Each split's bars cover an area proportional to its examples (equal widths, heights
    proportional to the counts), in the split's colour."""
    _, out = inspected
    manifest = built_dataset["manifest"]
    with Image.open(os.path.join(out, inspect_cmd.CLASS_COUNTS)) as img:
        pixels = {rgb: n for n, rgb in img.convert("RGB").getcolors(maxcolors=1 << 24)}
    splits = samples.ordered_splits(manifest)
    area = {s: pixels.get(drawing.SPLIT_COLOURS[j], 0) for j, s in enumerate(splits)}
    total_area = sum(area.values())
    total = sum(manifest["splits"][s]["num_examples"] for s in splits)
    for s in splits:
        share = manifest["splits"][s]["num_examples"] / total
        assert area[s] / total_area == pytest.approx(share, abs=0.03), (s, area)


@pytest.mark.parametrize("classes", [1, 30, 1000])
def test_class_chart_stays_readable_and_bounded(tmp_path, classes):
    labels = [f"class_{k:04d}" for k in range(classes)]
    manifest = {"name": "x", "version": "V", "labels": labels, "splits": {
        s: {"num_examples": 3 * classes, "shards": [],
            "label_counts": {l: (k * 7 + j) % 40 for k, l in enumerate(labels)}}
        for j, s in enumerate(("train", "validation", "test"))}}
    path = str(tmp_path / "chart.png")
    drawing.class_counts_chart(manifest, path)
    with Image.open(path) as img:
        assert 300 <= img.width <= drawing.MAX_WIDTH and 200 <= img.height <= 3000, img.size


def test_summary_has_counts_and_errors(built_dataset, capsys):
    manifest = built_dataset["manifest"]
    text = inspect_cmd.summary(manifest)
    for split, s in manifest["splits"].items():
        assert f"{split} {s['num_examples']} examples" in text
    for label in manifest["labels"]:
        row = next(line for line in text.splitlines() if line.strip().startswith(label))
        total = sum(s["label_counts"][label] for s in manifest["splits"].values())
        assert row.split()[-1] == str(total)
    acc = manifest["accounting"]
    assert f"listed {acc['listed']} = written {acc['written']}" in text
    for reason, n in manifest["errors"]["by_reason"].items():
        assert f"{reason}: {n}" in text


def test_main_prints_summary(built_dataset, tmp_path, capsys):
    assert inspect_cmd.main([built_dataset["root"], "--out", str(tmp_path), "--n", "0"]) == 0
    out = capsys.readouterr().out
    assert f"written {built_dataset['manifest']['accounting']['written']}" in out
    assert "contact_sheet.png" in out and "class_counts.png" in out


def test_sample_names_match_labels_with_and_without_index(built_dataset, tmp_path):
    manifest = built_dataset["manifest"]
    with_index = samples.sample(built_dataset["version_dir"], manifest, 5, "train", seed=3)
    assert len(with_index) == 5
    for split, text, label, image in with_index:
        assert split == "train" and manifest["labels"][label] == text
        assert image.mode == "RGB" and image.width > 0
    # Without .index files the sampler scans: it must land on the same records.
    copy = str(tmp_path / "v")
    shutil.copytree(built_dataset["version_dir"], copy)
    for name in os.listdir(copy):
        if name.endswith(layout.INDEX_SUFFIX):
            os.remove(os.path.join(copy, name))
    scanned = samples.sample(copy, manifest, 5, "train", seed=3)
    assert [(s, t, l, i.tobytes()) for s, t, l, i in scanned] == \
        [(s, t, l, i.tobytes()) for s, t, l, i in with_index]


def test_unknown_split_is_a_clear_error(built_dataset, tmp_path, capsys):
    code = inspect_cmd.main([built_dataset["root"], "--out", str(tmp_path), "--split", "nope"])
    assert code == 2 and "no split 'nope'" in capsys.readouterr().err


def test_a_missing_shard_is_damage_in_one_line_not_a_traceback(built_dataset, tmp_path,
                                                                capsys):
    """A shard the manifest lists, deleted: exit 1 (damage, not a mistake in the command),
    one line naming the shard (on gs:// it was the client's NotFound as a traceback)."""
    copy = tmp_path / "v"
    shutil.copytree(built_dataset["version_dir"], copy)
    shard = built_dataset["manifest"]["splits"]["train"]["shards"][0]["path"]
    os.remove(copy / shard)
    code = inspect_cmd.main([str(copy), "--out", str(tmp_path), "--n", "1000",
                             "--split", "train"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err == (f"error: {copy / shard} is missing: the version is damaged (python -m "
                   f"beam_pipeline.tools.verify names what else is)\n"), err
