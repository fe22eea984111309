"""`python -m beam_pipeline.tools.inspect`: summary text and two sensible PNGs (issue 7)."""

import os
import shutil

import pytest
from PIL import Image

from beam_pipeline.tools import inspect as inspect_cmd
from readers import layout


@pytest.fixture(scope="module")
def inspected(built_dataset, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("inspect"))
    code = inspect_cmd.main([built_dataset["root"], "--out", out, "--n", "9"])
    return code, out


def test_writes_plausible_pngs(inspected):
    code, out = inspected
    assert code == 0
    for name, min_kb in ((inspect_cmd.CONTACT_SHEET, 20), (inspect_cmd.CLASS_COUNTS, 8)):
        path = os.path.join(out, name)
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", name
        assert min_kb * 1024 < os.path.getsize(path) < 3 * 2**20, (name, os.path.getsize(path))
        with Image.open(path) as img:
            assert 300 <= img.width <= 3000 and 200 <= img.height <= 3000, (name, img.size)


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
    with_index = inspect_cmd.sample(built_dataset["version_dir"], manifest, 5, "train", seed=3)
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
    scanned = inspect_cmd.sample(copy, manifest, 5, "train", seed=3)
    assert [(s, t, l, i.tobytes()) for s, t, l, i in scanned] == \
        [(s, t, l, i.tobytes()) for s, t, l, i in with_index]


def test_unknown_split_is_a_clear_error(built_dataset, tmp_path, capsys):
    code = inspect_cmd.main([built_dataset["root"], "--out", str(tmp_path), "--split", "nope"])
    assert code == 2 and "no split 'nope'" in capsys.readouterr().err
