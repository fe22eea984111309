"""A model-based test of regeneration: generated sequences of changes against a model.

Hypothesis drives a small tree of real-looking images (seeded gradients and noise, JPEG
and uncompressed PNG, so many files share a size) through adds, deletes, renames, moves
between class folders and inputs, bytes replaced with the same size and mtime, inputs
added and removed, and builds (default, --full_rebuild, --resplit, --force). The model
is the files on disk plus the previous version's split map; after every build:

  * the accounting adds up (listed = written + duplicates + failed; shard files, sizes and
    hashes as the manifest says) and `verify` finds no problem;
  * every stored record is byte-identical to the one a full build would make from the
    file's current bytes (images.convert + records.make_example), and the catalog's
    input_sha256 is the file's: "a version equals a full build of the same files with
    the same split map";
  * no example in the previous version changed split without --resplit: a key keeps
    its split, a new key whose bytes the previous version held takes that example's
    split, new content is split by its key hash;
  * only bytes no stored record was made from are decoded (manifest build.converted);
  * an unchanged listing is "up to date"; anything touched is seen.

Profiles: `fast` (derandomized, one sequence, in the fast subset) and `long` (`slow`;
MODEL_EXAMPLES sequences of MODEL_STEPS steps, from the environment; each build also
compared with a real --full_rebuild of a copy).
"""

import hashlib
import io
import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)
from PIL import Image

from beam_pipeline.job import images, records
from beam_pipeline.launcher import plan
from dataset_format import examples, frames, layout, schema
from tests.helpers import build, check_invariants

CLASSES = ("cat", "dog", "owl")
INPUTS = ("in0", "in1")
SPLITS = plan.parse_splits("train=0.6,validation=0.2,test=0.2")
ARGS = ["--name", "m", "--splits", "train=0.6,validation=0.2,test=0.2",
        "--target_shard_mb", "0.003", "--no_transform", "--max_error_rate", "1",
        "--write_index", "true"]
MODES = {"default": [], "full_rebuild": ["--full_rebuild"], "resplit": ["--resplit"],
         "force": ["--force"]}
SEEDS = st.integers(0, 40)
CHANGES_PER_BUILD = 4  # then a build is the only rule left: every sequence builds often  # few contents: the same bytes turn up under several names


def tiny_image(seed, fmt):
    """A 20x14 seeded image, like a photo thumbnail: a gradient, a block and some noise.
    PNG is stored uncompressed, so every PNG has the same size (and can be swapped)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:14, 0:20]
    base = rng.integers(0, 256, 3)
    pixels = base + 4 * x[..., None] - 3 * y[..., None] + rng.normal(0, 12, (14, 20, 3))
    top, left = rng.integers(0, 8), rng.integers(0, 12)
    pixels[top:top + 6, left:left + 8] = rng.integers(0, 256, 3)
    img = Image.fromarray(pixels.clip(0, 255).astype(np.uint8), "RGB")
    buf = io.BytesIO()
    if fmt == "png":
        img.save(buf, "PNG", compress_level=0)
    else:
        img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


class Regeneration(RuleBasedStateMachine):
    """Files under self.tmp/in0, in1 (<class>/<name>); builds into self.tmp/root."""

    real_full_build = False
    totals = {"steps": 0, "builds": 0, "published": 0, "up_to_date": 0, "sequences": 0}

    def __init__(self):
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="model-")
        self.root = os.path.join(self.tmp, "root")
        self.active = ["in0"]                  # the inputs passed to the next build
        self.previous = None                   # {key: (split, input sha256, uri)} of LATEST
        self.labels = []                       # LATEST's label list
        self.signature = None                  # the listing LATEST was built from
        self.counter = 0
        self.pending = 0                       # changes since the last build
        for i, label in enumerate(CLASSES):    # never empty: an input needs an image
            self._write(f"in0/{label}/seed{i}.jpg", tiny_image(i, "jpg"))
        self._write("in1/cat/seed9.png", tiny_image(9, "png"))
        Regeneration.totals["sequences"] += 1

    def teardown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    # --- the files -----------------------------------------------------------------------

    def _write(self, rel, data):
        path = os.path.join(self.tmp, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

    def files(self, inputs=INPUTS):
        out = []
        for name in inputs:
            for label in CLASSES:
                folder = os.path.join(self.tmp, name, label)
                if os.path.isdir(folder):
                    out += [f"{name}/{label}/{f}" for f in sorted(os.listdir(folder))]
        return out

    def _pick(self, i, inputs=INPUTS):
        files = self.files(inputs)
        return files[i % len(files)] if files else None

    def _removable(self, rel):
        """Whether `rel` can leave its input without leaving it empty (a UserError)."""
        name = rel.split("/")[0]
        return name not in self.active or len(self.files([name])) > 1

    def _fresh_name(self, prefix):
        self.counter += 1
        return f"{prefix}{self.counter}"

    def step(self, change=True):
        Regeneration.totals["steps"] += 1
        self.pending += change

    @rule(where=st.sampled_from(INPUTS), label=st.sampled_from(CLASSES), seed=SEEDS,
          fmt=st.sampled_from(["jpg", "png"]))
    @precondition(lambda self: self.pending < CHANGES_PER_BUILD)
    def add_image(self, where, label, seed, fmt):
        self.step()
        self._write(f"{where}/{label}/{self._fresh_name('n')}.{fmt}", tiny_image(seed, fmt))

    @rule(i=st.integers(0, 10_000))
    @precondition(lambda self: self.pending < CHANGES_PER_BUILD)
    def delete_image(self, i):
        self.step()
        rel = self._pick(i)
        if rel and self._removable(rel):
            os.remove(os.path.join(self.tmp, rel))

    def _move(self, rel, where, label, name):
        if where != rel.split("/")[0] and not self._removable(rel):
            return
        target = os.path.join(self.tmp, where, label, name)
        if not os.path.exists(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.rename(os.path.join(self.tmp, rel), target)  # bytes and mtime travel along

    @rule(i=st.integers(0, 10_000), where=st.sampled_from(INPUTS))
    @precondition(lambda self: self.pending < CHANGES_PER_BUILD)
    def rename_or_move_image(self, i, where):
        """A new name, in the same input or the other one (a folder moved)."""
        self.step()
        rel = self._pick(i)
        if rel:
            ext = rel.rsplit(".", 1)[1]
            self._move(rel, where, rel.split("/")[1], f"{self._fresh_name('m')}.{ext}")

    @rule(i=st.integers(0, 10_000), label=st.sampled_from(CLASSES))
    @precondition(lambda self: self.pending < CHANGES_PER_BUILD)
    def relabel_image(self, i, label):
        """The same file name in another class folder."""
        self.step()
        rel = self._pick(i)
        if rel:
            where, _, name = rel.split("/")
            self._move(rel, where, label, name)

    @rule(i=st.integers(0, 10_000), seed=SEEDS)
    @precondition(lambda self: self.pending < CHANGES_PER_BUILD)
    def replace_keeping_size_and_mtime(self, i, seed):
        """cp -p / rsync -a / tar: other bytes, the same size and mtime."""
        self.step()
        pngs = [f for f in self.files() if f.endswith(".png")]
        if not pngs:
            return
        path = os.path.join(self.tmp, pngs[i % len(pngs)])
        data = tiny_image(seed, "png")
        st_before = os.stat(path)
        assert len(data) == st_before.st_size
        with open(path, "wb") as f:
            f.write(data)
        os.utime(path, ns=(st_before.st_atime_ns, st_before.st_mtime_ns))

    @rule()
    @precondition(lambda self: self.pending < CHANGES_PER_BUILD)
    def add_or_remove_input(self):
        self.step()
        if "in1" in self.active:
            self.active.remove("in1")
        elif self.files(["in1"]):
            self.active.append("in1")

    # --- builds --------------------------------------------------------------------------

    def key(self, rel):
        """The key a listed file gets: relative to its input, prefixed when several."""
        return rel if len(self.active) > 1 else rel.split("/", 1)[1]

    def listing_signature(self):
        stats = []
        for rel in self.files(self.active):
            st_ = os.stat(os.path.join(self.tmp, rel))
            stats.append((rel, st_.st_size, st_.st_mtime_ns, st_.st_ctime_ns))
        return tuple(self.active), tuple(stats)

    @initialize()
    def first_build(self):
        self.build("default")

    @rule(mode=st.sampled_from(sorted(MODES)))
    def build(self, mode):
        self.step(change=False)
        self.pending = 0
        Regeneration.totals["builds"] += 1
        signature = self.listing_signature()
        unchanged = self.previous is not None and signature == self.signature
        expect = "up_to_date" if unchanged and mode in ("default", "full_rebuild") else (
            "published")
        inputs = [os.path.join(self.tmp, name) for name in self.active]
        result = build(inputs, self.root, *ARGS, *MODES[mode], expect=expect)
        Regeneration.totals[expect] += 1
        if expect == "up_to_date":
            return
        self.check_version(result, mode)
        if self.real_full_build:
            self.check_against_full_build(result, inputs)
        self.signature = signature

    def expected_split(self, key, sha, uri, mode):
        """The split map: the previous version's split for the key; else for the same file
        under a new key; else for the same bytes, preferring the same class/name, then
        name, then the first key; else the key hash. --resplit: the key hash."""
        if mode == "resplit" or self.previous is None:
            return plan.assign_split(key, SPLITS)
        if key in self.previous:
            return self.previous[key][0]
        same = {k: split for k, (split, s, u) in self.previous.items() if s == sha}
        for k, split in same.items():
            if self.previous[k][2] == uri:
                return split
        for depth in (2, 1, 0):
            tail = key.split("/")[-depth:] if depth else []
            known = sorted(k for k in same if (k.split("/")[-depth:] if depth else []) == tail)
            if known:
                return same[known[0]]
        return plan.assign_split(key, SPLITS)

    def check_version(self, result, mode):
        from beam_pipeline.tools import verify

        manifest = check_invariants(result)  # accounting, shard sizes and hashes, LATEST
        assert verify.check(result["root"])["problems"] == []
        labels = manifest["labels"]
        assert labels[:len(self.labels)] == self.labels, "a label id moved"
        listed = {self.key(rel): rel for rel in self.files(self.active)}
        got = stored_examples(result["version_dir"], manifest)
        assert sorted(got) == sorted(listed), "stored keys are not the listed files"
        assert manifest["accounting"] == dict(manifest["accounting"], listed=len(listed),
                                              written=len(listed), failed=0, duplicates=0)
        catalog = {r["key"]: r for r in catalog_rows(result["version_dir"])}
        published = {}
        for key, rel in listed.items():
            uri = os.path.join(self.tmp, rel)
            data = open(uri, "rb").read()
            sha = hashlib.sha256(data).hexdigest()
            split, record = got[key]
            expected = full_build_record(data, key, rel.split("/")[-2], labels)
            assert record == expected, f"{key}: the stored record is not its file's"
            assert catalog[key]["input_sha256"] == sha and catalog[key]["split"] == split
            want = self.expected_split(key, sha, uri, mode)
            assert split == want, f"{key} is in {split}, not {want} ({mode})"
            published[key] = (split, sha, uri)
        build = manifest["build"]
        assert build["converted"] + build["reframed"] <= len(listed)
        assert build["converted"] == self.expected_decodes(published, mode), build
        self.previous, self.labels = published, labels

    def expected_decodes(self, published, mode):
        """Only bytes no stored record was made from are decoded (unless --full_rebuild or
        --resplit): a kept key, a moved, renamed, relabelled or copied image costs none."""
        if self.previous is None or mode in ("full_rebuild", "resplit"):
            return len(published)
        stored = {sha for _, sha, _ in self.previous.values()}
        return sum(1 for key, (_, sha, _) in published.items()
                   if not (self.previous[key][1] == sha if key in self.previous
                           else sha in stored))

    def check_against_full_build(self, result, inputs):
        """A real --full_rebuild on a copy of the root (its split map: this version)."""
        copy = os.path.join(self.tmp, "copy")
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(self.root, copy)
        full = build(inputs, copy, *ARGS, "--full_rebuild", "--force")
        assert full["manifest"]["build"]["reframed"] == 0
        assert (stored_examples(full["version_dir"], full["manifest"])
                == stored_examples(result["version_dir"], result["manifest"]))
        shutil.rmtree(copy)

    @invariant()
    def inputs_exist(self):
        assert all(self.files([name]) for name in self.active)


def full_build_record(data, key, label, labels):
    """The record a full build stores for a file: the writer's own pure functions."""
    encoded = images.convert(data, images.EncodeOptions())
    return records.make_example(encoded, labels.index(label), label, key)


def stored_examples(vdir, manifest):
    """{key: (split, serialized Example)}, read frame by frame (CRCs checked)."""
    out = {}
    for split, info in manifest["splits"].items():
        for shard in info["shards"]:
            with open(os.path.join(vdir, shard["path"]), "rb") as f:
                offset = 0
                while (found := frames.read_frame(f, offset)) is not None:
                    record, length = found
                    key = examples.parse_example(record)[schema.FILENAME].decode()
                    assert key not in out, f"{key} stored twice"
                    out[key] = (split, record)
                    offset += length
    return out


def catalog_rows(vdir):
    from beam_pipeline.store import catalog

    return list(catalog.iter_rows(layout.join(vdir, layout.CATALOG)))


COMMON = dict(deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
FAST = settings(max_examples=3, stateful_step_count=20, derandomize=True, **COMMON)
LONG = settings(max_examples=int(os.environ.get("MODEL_EXAMPLES", "5")),
                stateful_step_count=int(os.environ.get("MODEL_STEPS", "30")), **COMMON)


def run_profile(profile, real_full_build, capsys, name):
    before = dict(Regeneration.totals)
    Regeneration.TestCase.settings = profile
    Regeneration.real_full_build = real_full_build
    try:
        Regeneration.TestCase().runTest()
    finally:
        Regeneration.real_full_build = False
    ran = {k: v - before[k] for k, v in Regeneration.totals.items()}
    with capsys.disabled():
        print(f"\nregeneration model ({name}): {ran}")
    assert ran["published"] >= 2


def test_regeneration_model_fast(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # Beam's option parsing asks the terminal otherwise
    run_profile(FAST, False, capsys, "fast")


@pytest.mark.slow
def test_regeneration_model_long(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    run_profile(LONG, True, capsys, "long")
