"""Plain helpers shared by the tests: import them (`from tests.helpers import build, …`).

The fixtures that use them live in tests/fixtures.py (registered by tests/conftest.py);
nothing imports conftest by name. One helper per job:

* `REPO`                   the repository root (a pathlib.Path)
* `image_bytes`, `make_images`   tiny solid-colour images / an ImageFolder tree in milliseconds
* `noise_image(size, sigma, seed)`   Gaussian grey noise like Image.effect_noise, but seeded
* `build(inputs, root, …)`       the real CLI, in-process (FnApiRunner), one call per build
* `read_records(vdir)`           every record of a built version, parsed, in manifest order
* `shard_files`, `errors_of`, `check_invariants`   the manifest and errors.jsonl (docs/format.md)
* `assert_same_arrays(a, b)`     two runs' outputs: same length, same arrays, in order
"""

import dataclasses
import hashlib
import io
import json
import os
import pathlib
import random

from PIL import Image

from dataset_format import frames

REPO = pathlib.Path(__file__).resolve().parents[1]

# A colour per class, so a decoded record can be checked against its label.
CLASS_COLOURS = {"cat": (220, 40, 40), "dog": (40, 200, 60), "fox": (40, 60, 220),
                 "owl": (200, 200, 40)}

# sample_data.broken_files(): file name -> the reason the pipeline must give for it.
BROKEN_REASONS = {"empty.jpg": "empty_file", "truncated.jpg": "truncated",
                  "not_an_image.jpg": "not_an_image"}

# The shared build's options (tests/fixtures.py `built_dataset`).
BUILT_ARGS = ["--name", "shapes", "--num_shards", "2", "--max_error_rate", "0.2",
              "--no_transform"]

# Options for a small dedicated build: one shard per split.
FAST = ["--no_transform", "--num_shards", "1"]


# --- inputs -------------------------------------------------------------------------------------

def image_bytes(colour=(200, 30, 30), size=(24, 16), fmt="JPEG", **save):
    """One solid-colour image encoded as `fmt` (JPEG quality 95 unless given)."""
    if fmt == "JPEG":
        save.setdefault("quality", 95)
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, fmt, **save)
    return buf.getvalue()


def noise_image(size, sigma, seed=0):
    """A grey ("L") image of Gaussian noise around 128, like Image.effect_noise, but from a
    seed: effect_noise is unseeded, so its bytes (and libjpeg's messages about damage to
    them) changed from run to run."""
    import numpy as np

    width, height = size
    noise = np.random.default_rng(seed).normal(128, sigma, (height, width))
    return Image.fromarray(noise.clip(0, 255).astype(np.uint8), "L")


def make_images(root, spec, size=(24, 16)):
    """Write an ImageFolder tree under `root`; returns the list of paths written.

    `spec` maps a relative directory to either
      * an int n: n solid-colour JPEGs named 000.jpg, 001.jpg, … whose colour comes from
        CLASS_COLOURS by the directory's last component (a per-index shade otherwise), or
      * a dict {file name: bytes}: those exact files (e.g. broken inputs).
    Example: make_images(tmp, {"cat": 3, "dog": 2, "train/fox": 1}), then
    make_images(tmp, {"cat": {"bad.jpg": b""}}) to add a broken file to cat/. Colours vary
    slightly per index so that every file has distinct bytes (a distinct sha256) but keeps its
    class colour.
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


# --- a build ------------------------------------------------------------------------------------

def build(inputs, root, *args, expect="published"):
    """Run the real CLI in-process: `--input` for each of `inputs` (one path or a list of
    them), `--output root`, then `args`. Checks the status is `expect` (None: no check) and
    returns the fields of `cli.run`'s result (launcher.runner.Published, or Submitted,
    prepare.UpToDate) as a dict, plus "root"."""
    from beam_pipeline import cli

    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    argv = [a for spec in inputs for a in ("--input", str(spec))]
    result = cli.run(argv + ["--output", str(root)] + [str(a) for a in args])
    if expect is not None:
        assert result.status == expect, result
    return dict(fields_of(result), root=str(root))


def fields_of(result):
    """A build result's fields (status included) as a dict, shallow: the manifest is shared."""
    return {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}


# --- what a build wrote -------------------------------------------------------------------------

def shard_files(result):
    """[(split, manifest shard entry)] in manifest order."""
    return [(split, shard) for split, info in result["manifest"]["splits"].items()
            for shard in info["shards"]]


def read_records(version_dir, manifest=None):
    """Every record of a built version with plain tf.data (what any trainer would do; it
    checks each frame's CRCs), in manifest order: {(split, shard file name): [record]}.

    A record is a dict of the schema's features (tf.io.parse_example: int, bytes), plus
    "_raw" (the serialized Example) and "_decoded_shape" (tf.io.decode_jpeg's shape).
    `manifest` defaults to the version's manifest.json.
    """
    import tensorflow as tf

    from dataset_format import layout, schema

    version_dir = str(version_dir)
    if manifest is None:
        with open(os.path.join(version_dir, layout.MANIFEST)) as f:
            manifest = json.load(f)
    spec = schema.feature_spec()
    out = {}
    for split, info in manifest["splits"].items():
        for shard in info["shards"]:
            raws = [r.numpy() for r in tf.data.TFRecordDataset(
                os.path.join(version_dir, shard["path"]))]
            out[(split, shard["path"])] = records = []
            if not raws:
                continue
            parsed = {k: v.numpy() for k, v in tf.io.parse_example(raws, spec).items()}
            for i, raw in enumerate(raws):
                record = {k: v[i] if isinstance(v[i], bytes) else int(v[i])
                          for k, v in parsed.items()}
                record["_raw"] = raw
                record["_decoded_shape"] = tuple(
                    tf.io.decode_jpeg(record[schema.ENCODED]).shape)
                records.append(record)
    return out


def errors_of(result_or_vdir):
    """errors.jsonl of a build result or a version directory, as a list of dicts."""
    from dataset_format import layout

    vdir = (result_or_vdir["version_dir"] if isinstance(result_or_vdir, dict)
            else str(result_or_vdir))
    with open(os.path.join(vdir, layout.ERRORS)) as f:
        return [json.loads(line) for line in f if line.strip()]


def check_invariants(result):
    """The invariants of a published build (docs/format.md); returns the manifest."""
    from dataset_format import layout

    m, vdir = result["manifest"], result["version_dir"]
    acc = m["accounting"]
    assert acc["listed"] == (acc["duplicates"] + acc["failed"] + acc["written"]
                             + acc.get("leaks", 0)), acc
    assert acc["written"] == sum(s["num_examples"] for s in m["splits"].values())
    assert acc["written"] == sum(sh["num_examples"] for _, sh in shard_files(result))
    assert m["errors"]["count"] == acc["failed"] == len(errors_of(result))
    for split, info in m["splits"].items():
        assert info["num_examples"] == sum(sh["num_examples"] for sh in info["shards"])
        assert info["num_bytes"] == sum(sh["num_bytes"] for sh in info["shards"])
        assert sum(info["label_counts"].values()) == info["num_examples"]
        n = len(info["shards"])
        for i, shard in enumerate(info["shards"]):
            path = shard["path"]
            assert not os.path.isabs(path) and "://" not in path
            if path.startswith(layout.SHARED_PREFIX):  # an earlier version's file, shared
                owner, name = layout.shared_parts(path)
                assert owner < m["version"], path
                assert layout.parse_shard_name(name)[:2] == (m["name"], split), path
            else:
                assert "/" not in path and path == layout.shard_name(m["name"], split, i, n)
            data = pathlib.Path(layout.shard_file(vdir, path)).read_bytes()
            assert len(data) == shard["num_bytes"]
            assert frames.file_crc32c(data) == shard["crc32c"] and "sha256" not in shard
    assert m["errors"]["path"] == layout.ERRORS
    root = result.get("root") or os.path.dirname(os.path.dirname(vdir))
    with open(os.path.join(root, layout.LATEST)) as f:
        assert json.load(f) == layout.latest_record(m["version"])
    assert not os.path.exists(os.path.join(vdir, ".tmp")), "temp files left behind"
    return m


# --- comparing two runs -------------------------------------------------------------------------

def assert_same_arrays(first, again):
    """Two runs gave the same non-empty sequence of arrays (zip alone would pass on an empty
    or shorter second run)."""
    import numpy as np

    first, again = list(first), list(again)
    assert first, "the first run gave nothing to compare"
    assert len(again) == len(first), (len(again), len(first))
    for i, (a, b) in enumerate(zip(first, again)):
        assert np.array_equal(a, b), f"element {i} differs"


def same_arrays(first, again):
    """True when two sequences of arrays have the same length and equal elements."""
    import numpy as np

    first, again = list(first), list(again)
    return len(first) == len(again) and all(np.array_equal(a, b) for a, b in zip(first, again))


def assert_dead_run_gone_or_shared(root, published, killed):
    """After the next build: the killed run's directory is deleted, or (it finished shards
    the next build took, shared where they are) left incomplete, holding only files the
    latest manifest names."""
    from beam_pipeline.store import versions
    from dataset_format import dataset_info

    listed = versions.list_versions(root)
    assert {v: True for v in published}.items() <= listed.items(), listed
    assert set(listed) - published <= {killed} and listed.get(killed) in (None, False), listed
    if killed in listed:
        _, manifest = dataset_info.load_manifest(root)
        named = {sh["path"] for s in manifest["splits"].values() for sh in s["shards"]}
        assert any(p.startswith(f"../{killed}/") for p in named), named


def examples(result):
    """{key: (split, serialized Example)} of a published version."""
    from dataset_format import schema

    out = {}
    for (split, _), records in read_records(result["version_dir"]).items():
        for r in records:
            key = r[schema.FILENAME].decode()
            assert key not in out, f"{key} stored twice"
            out[key] = (split, r["_raw"])
    return out


def catalog_bytes(shards, rows, seed):
    """A catalog.parquet of `shards` row groups (one per shard, as commit writes them) of
    `rows` seeded rows each -> (its bytes, each row as catalog.read_numbered gives it).
    The storage cost tests and benchmarks/bench_catalog_reads.py read it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from beam_pipeline.store import catalog
    from dataset_format import catalog_schema

    rnd, out, expected = random.Random(seed), io.BytesIO(), []
    with pq.ParquetWriter(out, catalog.SCHEMA) as writer:
        for s in range(shards):
            group = []
            for p in range(rows):
                key = f"class{rnd.randrange(100):03d}/{s:04d}_{p:04d}_{rnd.getrandbits(40):x}.jpg"
                sha = hashlib.sha256(key.encode()).hexdigest()
                group.append(dict(
                    key=key, uri=f"gs://in/{key}", label=key[:8], label_id=int(key[5:8]),
                    split="train", shard=s, file=f"night-train.tfrecord-{s:05d}-of-{shards:05d}",
                    position=p, offset=p * 4_000, length=4_000, sha256=sha, height=48, width=64,
                    input_size=rnd.randrange(1 << 20), input_stamp=f"gen:{rnd.getrandbits(50)}",
                    input_sha256=sha, input_md5=sha[:22] + "==", phash=rnd.getrandbits(63),
                    phash_center=rnd.getrandbits(63), near_descriptor=None))
            writer.write_table(pa.Table.from_pylist(group, schema=catalog.SCHEMA))
            expected += [catalog_schema.CatalogRow.from_dict(catalog_schema.nest_fields(r))
                         for r in group]
    return out.getvalue(), expected
