"""Shared fixtures: tiny ImageFolder trees and one real build, reused across test files.

* `make_images(root, spec)` (a plain function, also exposed as the `make_images` fixture)
  writes an ImageFolder tree in milliseconds.
* `built_dataset` (session-scoped) runs the real CLI once on the DirectRunner over
  `beam_pipeline.tools.sample_data.generate(..., per_class=12)` and returns what `cli.run` returned.

Treat `built_dataset` as read-only: it is shared by every test in the session. Copy it
(`shutil.copytree(built_dataset["root"], tmp_path / "copy")`) before changing anything.
"""

import io
import logging
import os

import pytest
from PIL import Image

# A colour per class, so a decoded record can be checked against its label.
CLASS_COLOURS = {"cat": (220, 40, 40), "dog": (40, 200, 60), "fox": (40, 60, 220),
                 "owl": (200, 200, 40)}

# sample_data.broken_files(): file name -> the reason the pipeline must give for it.
BROKEN_REASONS = {"empty.jpg": "empty_file", "truncated.jpg": "truncated",
                  "not_an_image.jpg": "not_an_image"}


def image_bytes(colour=(200, 30, 30), size=(24, 16), fmt="JPEG", **save):
    """One solid-colour image encoded as `fmt` (JPEG quality 95 unless given)."""
    if fmt == "JPEG":
        save.setdefault("quality", 95)
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, fmt, **save)
    return buf.getvalue()


def make_images(root, spec, size=(24, 16)):
    """Write an ImageFolder tree under `root`; returns the list of paths written.

    `spec` maps a relative directory to either
      * an int n: n solid-colour JPEGs named 000.jpg, 001.jpg, … whose colour comes from
        CLASS_COLOURS by the directory's last component (a per-index shade otherwise), or
      * a dict {file name: bytes}: those exact files (e.g. broken inputs).
    Example: make_images(tmp, {"cat": 3, "dog": 2, "train/fox": 1}), then
    make_images(tmp, {"cat": {"bad.jpg": b""}}) to add a broken file to cat/. Colours vary slightly per index so that
    every file has distinct bytes (a distinct sha256) but keeps its class colour.
    """
    root = str(root)
    paths = []
    for rel, content in spec.items():
        directory = os.path.join(root, rel)
        os.makedirs(directory, exist_ok=True)
        if isinstance(content, int):
            base = CLASS_COLOURS.get(os.path.basename(rel), (128, 128, 128))
            files = {f"{i:03d}.jpg": image_bytes(tuple(min(255, c + i) for c in base), size)
                     for i in range(content)}
        else:
            files = content
        for name, data in files.items():
            path = os.path.join(directory, name)
            with open(path, "wb") as f:
                f.write(data)
            paths.append(path)
    return paths


@pytest.fixture(name="make_images")
def make_images_fixture():
    """The `make_images(root, spec)` helper as a fixture (see its docstring)."""
    return make_images


@pytest.fixture(scope="session")
def sample_images(tmp_path_factory):
    """A directory made by `sample_data.generate(dir, per_class=12)`: 3 classes x 12 images in
    every variant (JPEG, progressive, PNG, gray, CMYK, palette, EXIF, 16-bit, RGBA, GIF) plus
    the 3 broken files of `sample_data.broken_files()` under circle/. Read-only."""
    from beam_pipeline.tools import sample_data

    directory = tmp_path_factory.mktemp("sample_images")
    sample_data.generate(str(directory), per_class=12)
    return str(directory)


BUILT_ARGS = ["--name", "shapes", "--num_shards", "2", "--max_error_rate", "0.2",
              "--no_transform"]


@pytest.fixture(scope="session")
def built_dataset(sample_images, tmp_path_factory):
    """One real build (DirectRunner, in-process) of `sample_images`; shared and read-only.

    Runs `beam_pipeline.cli.run(["--input", sample_images, "--output", ROOT] + BUILT_ARGS)`
    i.e. name "shapes", 2 shards per split, --max_error_rate 0.2 (the 3 broken files are ~8%),
    --no_transform. Returns the `cli.run` dict plus two keys:
      status       "published"
      version      the version id, e.g. "20261129T220102Z"
      manifest     the manifest.json dict (DESIGN §4)
      version_dir  ROOT/versions/VERSION
      root         ROOT, the dataset root (has LATEST; readers take it)
      input        the sample image directory that was built
    Labels are ["circle", "square", "triangle"]; 36 images written, 3 failed
    (empty_file, truncated, not_an_image).
    """
    from beam_pipeline import cli

    root = str(tmp_path_factory.mktemp("built") / "dataset")
    result = cli.run(["--input", sample_images, "--output", root] + BUILT_ARGS)
    assert result["status"] == "published", result
    return dict(result, root=root, input=sample_images)


@pytest.fixture(autouse=True)
def restore_logger_levels():
    """cli.main quiets Beam/TF loggers process-wide, as a console run should; give every
    other test its levels back."""
    names = ("apache_beam", "absl", "tensorflow")
    levels = {n: logging.getLogger(n).level for n in names}
    yield
    for n, level in levels.items():
        logging.getLogger(n).setLevel(level)
