"""No single input blocks a night: hostile names and contents go through every stage.

A seeded generator writes a tree of file names that archives, phones and scripts produce
(non-UTF-8 bytes, Unicode in both normal forms, quotes, backslashes, tabs, newlines, glob
characters, 200-character names, a right-to-left override) holding photographs of seeded
noise (no two are near-duplicates) and broken files. Builds with
--near_duplicates (a full one, then an incremental one after renames, deletions and
additions) must publish every good image, and give every other file a row in errors.jsonl
with its reason; verify and the reader accept the result. A file the kernel answers EIO
for is not among them: EIO is what a network filesystem answers in an outage, so it fails
the build naming the file (docs/guarantees.md, "Transient is never damage").
"""

import io
import os
import random

import numpy as np
import pytest
from PIL import Image

from beam_pipeline.store import catalog
from dataset_format import layout
from tests.helpers import FAST, build, check_invariants, errors_of, read_records

# Pieces of names seen in the wild; non-UTF-8 bytes are added separately (bytes paths).
NAME_PIECES = ["café", "cafe\u0301", "日本語", "🐱 cat", "two  spaces", 'quo"te', "it's",
               "back\\slash", "tab\tname", "new\nline", "-dash", "%20", "#hash", "q?", "st*r",
               "[br]", "semi;colon", "comma,", "\u202eRTL", "zero\u200bwidth", "dots..",
               " lead", "trail ", "UPPER.JPG-like", "{brace}", "$HOME", "a" * 200]
CLASSES = ["cat", "chat é", "狗"]
BROKEN = {"empty": (b"", "empty_file"), "not_an_image": (b"plain text, not pixels\n",
                                                        "not_an_image")}
ARGS = ["--near_duplicates", "--drop_near_duplicate_leaks", "--max_error_rate", "0.5",
        "--name", "hostile", *FAST]


def photo(rng, fmt):
    """Seeded noise, smoothed a little: a photograph's pHash is as good as random, so no two
    of these are within the near-duplicate radius."""
    side = rng.randrange(40, 72)
    noise = np.random.default_rng(rng.randrange(2**32)).integers(0, 256, (side, side + 7, 3))
    img = Image.fromarray(noise.astype(np.uint8)).resize((side * 2, side * 2 + 14))
    out = io.BytesIO()
    img.save(out, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


def add_photos(root, rng, n, tag=""):
    """n photographs under hostile names in the class folders -> {key: bytes}."""
    good = {}
    for i in range(n):
        name = f"{rng.choice(NAME_PIECES)}{tag}{i}{rng.choice(['.jpg', '.JPG', '.png', '.jpeg'])}"
        key = f"{rng.choice(CLASSES)}/{name}"
        good[key] = photo(rng, "PNG" if name.endswith(".png") else "JPEG")
        os.makedirs(os.path.join(root, os.path.dirname(key)), exist_ok=True)
        with open(os.path.join(root, key), "wb") as f:
            f.write(good[key])
    return good


def hostile_tree(root, seed, n_good=24):
    """Write the tree; -> ({key: bytes} of the good images, {uri (printable): reason} of
    the rest)."""
    rng = random.Random(seed)
    good, bad = add_photos(root, rng, n_good), {}
    for stem, (data, reason) in BROKEN.items():
        path = os.path.join(root, "cat", f"{rng.choice(NAME_PIECES)}{stem}.jpg")
        with open(path, "wb") as f:
            f.write(data)
        bad[path] = reason
    truncated = photo(rng, "JPEG")
    path = os.path.join(root, "狗", "truncated 'x'.jpg")
    with open(path, "wb") as f:
        f.write(truncated[:len(truncated) // 2])
    bad[path] = "truncated"
    for raw in (b"caf\xe9.jpg", b"\xff\xfe latin-1 \xe0.jpg"):  # old zip and Windows archives
        path = os.path.join(os.fsencode(root), b"cat", raw)
        with open(path, "wb") as f:
            f.write(photo(rng, "JPEG"))
        bad[os.fsdecode(path).encode("utf-8", "surrogateescape").decode(
            "utf-8", "backslashreplace")] = "bad_name"
    return good, bad


def stored(result):
    """{key: (split, input sha256)} from the version's catalog."""
    path = os.path.join(result["version_dir"], layout.CATALOG)
    return {r["key"]: (r["split"], r["input_sha256"]) for r in catalog.iter_rows(path)}


def check_version(result, good, bad):
    import hashlib

    check_invariants(result)
    assert {e["uri"]: e["reason"] for e in errors_of(result)} == bad
    rows = stored(result)
    assert rows.keys() == good.keys()
    assert all(rows[k][1] == hashlib.sha256(good[k]).hexdigest() for k in good)
    entry = result["manifest"]["near_duplicates"]  # noise photographs: none at all
    assert (entry["candidates"], entry["pairs"], entry["leaks"]) == (0, 0, 0)
    for path in (entry["path"], entry["rejected_path"]):
        with open(os.path.join(result["version_dir"], path)) as f:
            assert f.read() == ""
    records = [r for rs in read_records(result["version_dir"]).values() for r in rs]
    assert sorted(r["image/filename"].decode() for r in records) == sorted(good)
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_hostile_names_and_contents_never_fail_a_build(tmp_path, seed):
    from beam_pipeline.tools import verify

    src, root = str(tmp_path / "in"), str(tmp_path / "out")
    good, bad = hostile_tree(src, seed)
    first = check_version(build(src, root, *ARGS), good, bad)
    assert verify.main([root]) == 0

    # Renames onto other hostile names, deletions and additions: an incremental run that
    # re-frames, copies and converts.
    rng = random.Random(seed + 100)
    keys = sorted(good)
    for j, key in enumerate(rng.sample(keys, 5)):
        new = f"{os.path.dirname(key)}/{rng.choice(NAME_PIECES)[:30]} moved{j}.jpg"
        os.rename(os.path.join(src, key), os.path.join(src, new))
        good[new] = good.pop(key)
    for key in rng.sample(sorted(set(keys) & set(good)), 3):
        os.remove(os.path.join(src, key))
        del good[key]
    good.update(add_photos(src, rng, 4, tag=" new"))
    second = build(src, root, *ARGS, "--max_delta_share", "1")
    assert second["manifest"].get("incremental"), "expected an incremental run"
    rows = check_version(second, good, bad)
    by_content = {sha: split for split, sha in first.values()}
    assert all(by_content.get(sha, split) == split for split, sha in rows.values())
    assert verify.main([root]) == 0


@pytest.mark.slow
def test_an_image_that_crashes_the_decoder_is_a_row_not_a_failed_build(tmp_path, monkeypatch):
    """libjpeg-turbo failing in a way nobody foresaw (here: a RuntimeError for one input's
    bytes, injected into the third-party decoder) rejects that image as `crashed`."""
    import simplejpeg

    src, rng = str(tmp_path / "in"), random.Random(5)
    good = add_photos(src, rng, 6)
    poison = next(k for k in sorted(good) if not k.endswith(".png"))
    real = simplejpeg.decode_jpeg

    def decode_jpeg(data, *args, **kwargs):
        if bytes(data) == good[poison]:
            raise RuntimeError("libjpeg-turbo: unforeseen")
        return real(data, *args, **kwargs)

    monkeypatch.setattr(simplejpeg, "decode_jpeg", decode_jpeg)
    result = build(src, str(tmp_path / "out"), *ARGS)
    (error,) = errors_of(result)
    assert error == {"uri": os.path.join(src, poison), "stage": "decode", "reason": "crashed",
                     "detail": "RuntimeError: libjpeg-turbo: unforeseen"}
    assert stored(result).keys() == good.keys() - {poison}


def test_a_name_that_is_not_utf8_is_an_error_record_naming_its_bytes(tmp_path):
    """Before: the build failed in planning ('surrogates not allowed'), naming no file."""
    from beam_pipeline.launcher import listing
    from beam_pipeline.refs import ImageRef
    from dataset_format.error_record import ErrorRecord

    os.makedirs(tmp_path / "cat")
    for name in (b"ok.jpg", b"caf\xe9.jpg"):
        with open(os.path.join(os.fsencode(tmp_path), b"cat", name), "wb") as f:
            f.write(photo(random.Random(0), "JPEG"))
    items = list(listing.iter_inputs([str(tmp_path)]))
    assert [i.key for i in items if isinstance(i, ImageRef)] == ["cat/ok.jpg"]
    assert [i for i in items if not isinstance(i, ImageRef)] == [ErrorRecord(
        f"{tmp_path}/cat/caf\\xe9.jpg", "read", "bad_name",
        "the file name is not valid UTF-8; rename it")]


@pytest.mark.slow
def test_an_input_the_kernel_answers_eio_for_fails_the_build_naming_it(
        tmp_path, monkeypatch, capsys):
    """EIO on an input, past the retries, is not proven damage (a disk's bad sector and an
    NFS outage answer alike): the build exits 1 with one line naming the file, nothing is
    published, and no errors.jsonl row blames the image. Before, it was the image's
    "unreadable" row and the version published without it."""
    from beam_pipeline import cli
    from beam_pipeline.store import transient

    monkeypatch.setattr(transient, "RETRY_SECONDS", 1.0)
    src, root = tmp_path / "in", tmp_path / "out"
    add_photos(str(src), random.Random(7), 6)
    eio = src / "cat" / "unreadable.jpg"
    os.symlink("/proc/self/mem", eio)  # exists, and every read of it answers EIO
    got = cli.main(["--input", str(src), "--output", str(root), *FAST])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error")]
    assert got == 1, err
    assert len(lines) == 1 and lines[0].startswith(
        f"error: build failed: cannot read {eio} (OSError: [Errno 5] Input/output error)"), lines
    assert not (root / layout.LATEST).exists()
