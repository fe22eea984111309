"""A model-based test of regeneration over whole histories, not pairs of versions.

Hypothesis drives a small tree of real-looking images (tests/model_tree.py: seeded
gradients and noise, JPEG and uncompressed PNG, so many files share a size and few
contents turn up under several names) through what users and tools do to a photo folder
night after night: adds, deletes and restores several nights later, renames, moves between
class folders and inputs, renames onto an existing name, renumbering, swaps and rotations,
bytes replaced with the same size and mtime, near copies, read failures (a broken link for
a few nights), inputs added and removed; and builds: default, --full_rebuild, --resplit,
--force, --near_duplicates --drop_near_duplicate_leaks (leak exclusions), another
--splits, and --sink beam (refused on a root with a split map). After every build:

  * the accounting adds up and `verify` finds no problem; the stored keys are the
    readable listed files less the leaks excluded (each one in an evaluation split);
  * every stored record is byte-identical to what a full build makes from the file's
    current bytes, and the catalog's input_sha256 is the file's;
  * every split is the model's (identity.py's order: a split folder; the key with the
    same bytes; the previous version's record of the bytes; the split map; the key hash
    by this build's --splits), and the history invariant holds: no content ever published
    in one split appears in another, across the whole generated history, unless
    --resplit was run;
  * only bytes no stored record was made from are decoded (manifest build.converted);
  * an unchanged listing with unchanged options is "up to date";
  * retention (--keep_versions 0, 1 or 2; --keep_superseded_hours 0, or 1000 while a
    training job has pinned a version) keeps the newest versions and every pinned one
    readable byte for byte, and leaves in a retired version directory exactly the shared
    shards (and indexes) a kept manifest names: no kept version loses a file, no storage
    is left that nothing names;
  * tags and holds: steps tag LATEST's version (or move a tag there), delete a tag, hold
    LATEST's version with a reader's lease, and let a lease lapse (its last renewal
    backdated past its length); after every build each tagged or held version is complete
    and reads byte for byte as when it was tagged or held, whatever --keep_versions says.

Profiles: `fast` (derandomized, in the fast subset) and `long` (`slow`; MODEL_EXAMPLES
sequences of MODEL_STEPS steps, from the environment; each build also compared with a real
--full_rebuild of a copy).
"""

import json
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

from beam_pipeline.errors import UserError
from beam_pipeline.launcher import rules
from dataset_format import layout
from tests.helpers import build, check_invariants
from tests.model_tree import (CLASSES, INPUTS, Tree, full_build_record, near_copy,
                              stored_examples, tiny_image)

SPLITS = {"a": "train=0.6,validation=0.2,test=0.2", "b": "train=0.3,validation=0.3,test=0.4"}
ARGS = ["--name", "m", "--target_shard_mb", "0.003", "--no_transform", "--max_error_rate",
        "1", "--write_index", "true",
        "--max_delta_share", "0.9"]  # a tree of a few images: most nights incremental, sharing
LEAKS = ["--near_duplicates", "--drop_near_duplicate_leaks"]
MODES = {"default": [], "full_rebuild": ["--full_rebuild"], "resplit": ["--resplit"],
         "force": ["--force"], "leaks": LEAKS, "other_splits": [], "beam": ["--sink", "beam"]}
SEEDS = st.integers(0, 40)  # few contents: the same bytes turn up under several names
CHANGES_PER_BUILD = 4  # then a build is the only rule left: every sequence builds often
INDEX = st.integers(0, 10_000)
PIN_BUILDS = 2  # builds a pinned version must survive (a training run's length)
TAGS = ["release", "paper"]
LEASE_SECONDS = 3600.0  # a lease lapses only when the model says so (lease_lapses)


def changes(f):
    return precondition(lambda self: self.pending < CHANGES_PER_BUILD)(f)


def ref_step(ready):
    """A tag or hold step: one between builds (so drawn sequences still build often), when
    `ready`."""
    return precondition(lambda self: not self.ref_steps and ready(self))


class Regeneration(RuleBasedStateMachine):
    """Files under self.tmp/in0, in1 (<class>/<name>); builds into self.tmp/root."""

    real_full_build = False
    totals = {"steps": 0, "builds": 0, "published": 0, "up_to_date": 0, "refused": 0,
              "sequences": 0, "returned": 0, "retired": 0, "shared": 0, "pins": 0,
              "tags": 0, "holds": 0, "lapsed": 0}

    def __init__(self):
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="model-")
        self.tree = Tree(self.tmp)
        self.root = os.path.join(self.tmp, "root")
        self.active = ["in0"]      # the inputs passed to the next build
        self.previous = None       # {key: (split, input sha256, uri)} of LATEST
        self.config = None         # (splits, leak flags) LATEST was built with
        self.history = {}          # the model's split map: sha256 -> first published split
        self.ever = {}             # sha256 -> every split it was published in (since --resplit)
        self.labels = []           # LATEST's label list
        self.signature = None      # the listing LATEST was built from
        self.pending = 0           # changes since the last build
        self.pinned = {}           # version -> its examples when a training job pinned it
        self.tags = {}             # tag -> (version, its examples when tagged)
        self.leases = {}           # lease path -> (version, its examples when held)
        self.ref_steps = 0         # tag and hold steps since the last build
        for i, label in enumerate(CLASSES):  # never empty: an input needs an image
            self.tree.write(f"in0/{label}/seed{i}.jpg", tiny_image(i, "jpg"))
        self.tree.write("in1/cat/seed9.png", tiny_image(9, "png"))
        Regeneration.totals["sequences"] += 1

    def teardown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def step(self, change=True):
        Regeneration.totals["steps"] += 1
        self.pending += change

    def _pick(self, i, inputs=INPUTS):
        return self.tree.pick(i, inputs)

    def _leaves(self, rel):
        return self.tree.removable(rel, self.active)

    # --- changes to the files --------------------------------------------------------------

    @rule(where=st.sampled_from(INPUTS), label=st.sampled_from(CLASSES), seed=SEEDS,
          fmt=st.sampled_from(["jpg", "png"]))
    @changes
    def add_image(self, where, label, seed, fmt):
        self.step()
        self.tree.write(f"{where}/{label}/{self.tree.fresh_name('n')}.{fmt}",
                        tiny_image(seed, fmt))

    @rule(i=INDEX)
    @changes
    def delete_image(self, i):
        self.step()
        rel = self._pick(i)
        if rel and self._leaves(rel):
            self.tree.delete(rel)

    @rule(i=INDEX)
    @precondition(lambda self: self.pending < CHANGES_PER_BUILD and self.tree.trash)
    def restore_image(self, i):
        """A file deleted one or several nights ago comes back (cp -p from a backup)."""
        self.step()
        self.tree.restore(i)

    def _move(self, rel, where, label, name):
        if where != rel.split("/")[0] and not self._leaves(rel):
            return
        target = f"{where}/{label}/{name}"
        if not os.path.lexists(self.tree.path(target)):
            self.tree.move(rel, target)

    @rule(i=INDEX, where=st.sampled_from(INPUTS))
    @changes
    def rename_or_move_image(self, i, where):
        """A new name, in the same input or the other one (a folder moved)."""
        self.step()
        rel = self._pick(i)
        if rel:
            ext = rel.rsplit(".", 1)[1]
            self._move(rel, where, rel.split("/")[1], f"{self.tree.fresh_name('m')}.{ext}")

    @rule(i=INDEX, label=st.sampled_from(CLASSES))
    @changes
    def relabel_image(self, i, label):
        """The same file name in another class folder."""
        self.step()
        rel = self._pick(i)
        if rel:
            where, _, name = rel.split("/")
            self._move(rel, where, label, name)

    @rule(i=INDEX, j=INDEX)
    @changes
    def rename_onto_existing(self, i, j):
        """mv a b with b there: b's old bytes are gone, b now holds a's."""
        self.step()
        a, b = self._pick(i), self._pick(j)
        if a and b and a != b and self._leaves(a):
            self.tree.delete(b)  # into the trash: it may come back another night
            self.tree.move(a, b)

    @rule(i=INDEX)
    @changes
    def renumber(self, i):
        """Delete one file, rename the rest of its folder down by one (photo tools)."""
        self.step()
        rel = self._pick(i)
        if rel and self._leaves(rel):
            self.tree.renumber(rel)

    @rule(i=INDEX, j=INDEX, k=INDEX)
    @changes
    def swap_or_rotate(self, i, j, k):
        """Names exchanged between two files (a swap) or three (a rotation)."""
        self.step()
        rels = list(dict.fromkeys(r for r in (self._pick(i), self._pick(j), self._pick(k))
                                  if r))
        if len(rels) >= 2:
            self.tree.swap(rels)

    @rule(i=INDEX, seed=SEEDS)
    @changes
    def replace_keeping_size_and_mtime(self, i, seed):
        """cp -p / rsync -a / tar: other bytes, the same size and mtime."""
        self.step()
        size = len(tiny_image(0, "png"))  # a PNG's bytes, whatever name they now have
        pngs = [f for f in self.tree.files(readable_only=True)
                if os.path.getsize(self.tree.path(f)) == size]
        if not pngs:
            return
        rel = pngs[i % len(pngs)]
        data, before = tiny_image(seed, "png"), os.stat(self.tree.path(rel))
        assert len(data) == before.st_size
        self.tree.write(rel, data, before.st_mtime_ns)

    @rule(i=INDEX)
    @changes
    def add_near_copy(self, i):
        """A re-encoded copy of a file beside it: a near-duplicate (a leak when it is
        split away from a train original)."""
        self.step()
        rel = self._pick(i)
        if rel:
            data, _ = self.tree.sha256(rel)
            self.tree.write(f"{rel.rsplit('/', 1)[0]}/{self.tree.fresh_name('c')}.jpg",
                            near_copy(data))

    @rule(i=INDEX)
    @changes
    def fail_read(self, i):
        """The file cannot be read for a while (a broken link where it was)."""
        self.step()
        rel = self._pick(i)
        if rel and self._leaves(rel):
            self.tree.break_read(rel)

    @rule(i=INDEX)
    @precondition(lambda self: self.pending < CHANGES_PER_BUILD and self.tree.broken)
    def read_again(self, i):
        self.step()
        self.tree.heal(i)

    @rule()
    @changes
    def add_or_remove_input(self):
        self.step()
        if "in1" in self.active:
            self.active.remove("in1")
        elif self.tree.files(["in1"], readable_only=True):
            self.active.append("in1")

    def pin_latest(self):
        """A training job pins the version LATEST names (readers.info(root, version=…)) for
        the next PIN_BUILDS builds."""
        with open(os.path.join(self.root, layout.LATEST)) as f:
            version = json.load(f)["version"]
        vdir = layout.version_dir(self.root, version)
        with open(os.path.join(vdir, layout.MANIFEST)) as f:
            self.pinned[version] = [stored_examples(vdir, json.load(f)), PIN_BUILDS]
        Regeneration.totals["pins"] += 1

    # --- tags and holds --------------------------------------------------------------------

    def latest_examples(self):
        with open(os.path.join(self.root, layout.LATEST)) as f:
            version = json.load(f)["version"]
        vdir = layout.version_dir(self.root, version)
        with open(os.path.join(vdir, layout.MANIFEST)) as f:
            return version, stored_examples(vdir, json.load(f))

    @rule(name=st.sampled_from(TAGS))
    @ref_step(lambda self: self.previous is not None)
    def tag_latest(self, name):
        """A release: tag LATEST's version (a tag already there is moved)."""
        from beam_pipeline.store import tags

        self.step(change=False)
        self.ref_steps += 1
        version, examples = self.latest_examples()
        tags.create(self.root, name, version, move=name in self.tags)
        self.tags[name] = (version, examples)
        Regeneration.totals["tags"] += 1

    @rule(name=st.sampled_from(TAGS))
    @ref_step(lambda self: self.tags)
    def delete_tag(self, name):
        from beam_pipeline.store import tags

        self.step(change=False)
        self.ref_steps += 1
        if name in self.tags:
            tags.delete(self.root, name)
            del self.tags[name]

    @rule()
    @ref_step(lambda self: self.previous is not None)
    def hold_latest(self):
        """A training job on another host holds LATEST's version: its lease, as its reader
        writes it (the renewals are the reader's; here the lease is renewed by hand)."""
        from dataset_format import holds, storage

        self.step(change=False)
        self.ref_steps += 1
        version, examples = self.latest_examples()
        path = layout.join(layout.holds_dir(self.root, version), f"model-{len(self.leases)}")
        storage.write_bytes(path, holds.body(version, "model", LEASE_SECONDS))
        self.leases[path] = (version, examples)
        Regeneration.totals["holds"] += 1

    @rule(i=INDEX)
    @ref_step(lambda self: self.leases)
    def lease_lapses(self, i):
        """The job is killed: its lease's last renewal is now longer ago than its length."""
        self.step(change=False)
        self.ref_steps += 1
        path = sorted(self.leases)[i % len(self.leases)]
        stamp = os.stat(path).st_mtime - LEASE_SECONDS - 1
        os.utime(path, (stamp, stamp))
        del self.leases[path]
        Regeneration.totals["lapsed"] += 1

    # --- builds ----------------------------------------------------------------------------

    def key(self, rel):
        """The key a listed file gets: relative to its input, prefixed when several."""
        return rel if len(self.active) > 1 else rel.split("/", 1)[1]

    @initialize()
    def first_build(self):
        self.build("default")

    @rule(mode=st.sampled_from(list(MODES)), keep=st.sampled_from([1, 2, 0]),
          pin=st.booleans())
    def build(self, mode, keep=1, pin=False):  # the first of each: what shrinking tends to
        self.step(change=False)
        self.ref_steps = 0
        if pin and self.previous is not None:
            self.pin_latest()
        Regeneration.totals["builds"] += 1
        splits = SPLITS["b" if mode == "other_splits" else "a"]
        config = (splits, mode == "leaks")
        hours = "1000" if self.pinned else "0"  # a pinned version is inside the window
        args = [*ARGS, "--splits", splits, *MODES[mode], "--keep_versions", str(keep),
                "--keep_superseded_hours", hours]
        inputs = [self.tree.path(name) for name in self.active]
        if mode == "beam":  # no catalog: it could not carry the split map forward
            with pytest.raises(UserError, match="--sink beam writes no catalog"):
                build(inputs, self.root, *args, expect=None)
            Regeneration.totals["refused"] += 1
            return
        self.pending = 0
        signature = self.tree.signature(self.active)
        unchanged = (self.previous is not None and signature == self.signature
                     and config == self.config)
        expect = "up_to_date" if unchanged and mode in ("default", "full_rebuild", "leaks",
                                                        "other_splits") else "published"
        result = build(inputs, self.root, *args, expect=expect)
        Regeneration.totals[expect] += 1
        if expect == "up_to_date":
            return
        self.check_version(result, mode, config)
        self.check_retention(keep)
        for version, pinned in list(self.pinned.items()):  # the training job goes on, or ends
            pinned[1] -= 1
            if not pinned[1]:
                del self.pinned[version]
        if self.real_full_build:
            self.check_against_full_build(result, inputs, args)
        self.signature = signature

    def expected_split(self, key, sha, uri, mode, splits):
        """identity.py's order: the key with the same bytes; the same file under a new key;
        the previous version's record of the bytes (same class/name, name, first key); the
        split map (every content published since --resplit); the key hash."""
        if mode == "resplit" or self.previous is None:
            return rules.assign_split(key, splits)
        if key in self.previous and self.previous[key][1] == sha:
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
        if sha in self.history:
            return self.history[sha]
        return rules.assign_split(key, splits)

    def check_version(self, result, mode, config):
        from beam_pipeline.tools import verify

        manifest = check_invariants(result)  # accounting, shard sizes and hashes, LATEST
        assert verify.check(result["root"])["problems"] == []
        labels = manifest["labels"]
        assert labels[:len(self.labels)] == self.labels, "a label id moved"
        listed = {self.key(rel): rel for rel in self.tree.files(self.active)}
        unreadable = {k for k, rel in listed.items() if rel in self.tree.broken}
        excluded = leaks_excluded(result["version_dir"], manifest)
        got = stored_examples(result["version_dir"], manifest)
        assert sorted(got) == sorted(set(listed) - unreadable - excluded), "stored keys"
        assert manifest["accounting"] == dict(
            manifest["accounting"], listed=len(listed), written=len(got),
            failed=len(unreadable), leaks=len(excluded), duplicates=0)
        catalog = {r["key"]: r for r in catalog_rows(result["version_dir"])}
        splits = rules.parse_splits(config[0])
        published, made = {}, []
        for key, rel in listed.items():
            if key in unreadable:
                continue
            data, sha = self.tree.sha256(rel)
            want = self.expected_split(key, sha, self.tree.path(rel), mode, splits)
            made.append(sha)
            if key in excluded:
                assert want in ("validation", "test"), f"{key}: a {want} image left out"
                continue
            split, record = got[key]
            expected = full_build_record(data, key, rel.split("/")[-2], labels)
            assert record == expected, f"{key}: the stored record is not its file's"
            assert catalog[key]["input_sha256"] == sha and catalog[key]["split"] == split
            assert split == want, f"{key} is in {split}, not {want} ({mode})"
            published[key] = (split, sha, self.tree.path(rel))
        self.check_history(published, mode)
        build = manifest["build"]
        assert build["converted"] == self.expected_decodes(made, mode, config), build
        self.previous, self.labels, self.config = published, labels, config

    def check_history(self, published, mode):
        """The invariant over the whole history: a content published in one split never
        appears in another (since the last --resplit); the model's split map follows."""
        if mode == "resplit":
            self.history, self.ever = {}, {}
        for key, (split, sha, _) in sorted(published.items()):
            if sha in self.ever and split not in self.ever[sha]:
                raise AssertionError(f"{key}: bytes published in {sorted(self.ever[sha])} "
                                     f"are now in {split}")
        before = {sha for _, sha, _ in (self.previous or {}).values()}
        Regeneration.totals["returned"] += len({sha for _, sha, _ in published.values()
                                                if sha in self.history and sha not in before})
        new = {}
        for split, sha, _ in published.values():
            if sha not in self.history:
                new[sha] = min(new.get(sha, split), split)
            self.ever.setdefault(sha, set()).add(split)
        self.history.update(new)

    def expected_decodes(self, made, mode, config):
        """Only bytes no stored record was made from are decoded (unless --full_rebuild,
        --resplit or other options): a kept key, a moved, renamed, swapped or copied image
        costs none; bytes only an older version held are converted again."""
        # --splits is not a record option (options.RECORD_OPTIONS); the leak flags are
        if (self.previous is None or mode in ("full_rebuild", "resplit")
                or config[1] != self.config[1]):
            return len(made)
        stored = {sha for _, sha, _ in self.previous.values()}
        return sum(1 for sha in made if sha not in stored)

    def check_against_full_build(self, result, inputs, args):
        """A real --full_rebuild on a copy of the root (its split map: this version's)."""
        copy = os.path.join(self.tmp, "copy")
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(self.root, copy, symlinks=True)
        full = build(inputs, copy, *args, "--full_rebuild", "--force")
        assert full["manifest"]["build"]["reframed"] == 0
        assert (stored_examples(full["version_dir"], full["manifest"])
                == stored_examples(result["version_dir"], result["manifest"]))
        shutil.rmtree(copy)

    def check_retention(self, keep):
        """Every complete version verifies; the newest `keep` (and, pinned, every one) are
        there, byte for byte; a retired directory holds exactly what kept manifests name."""
        from beam_pipeline.store import shared, versions
        from beam_pipeline.tools import verify

        found = versions.list_versions(self.root)
        complete = sorted((v for v, done in found.items() if done), reverse=True)
        for v in complete:
            assert verify.check(layout.version_dir(self.root, v))["problems"] == [], v
        kept = {v for v, _ in self.tags.values()} | {v for v, _ in self.leases.values()}
        if keep and not self.pinned:  # the newest, and one superseded this very second
            assert len([v for v in complete if v not in kept]) <= keep + 1, complete
        for what, (v, examples) in [*self.tags.items(), *self.leases.items()]:
            assert v in complete, f"version {v} ({what}) deleted"
            vdir = layout.version_dir(self.root, v)
            with open(os.path.join(vdir, layout.MANIFEST)) as f:
                assert stored_examples(vdir, json.load(f)) == examples, f"{what}: {v} changed"
        for v, (examples, _) in self.pinned.items():
            assert v in complete, f"pinned version {v} deleted"
            vdir = layout.version_dir(self.root, v)
            with open(os.path.join(vdir, layout.MANIFEST)) as f:
                assert stored_examples(vdir, json.load(f)) == examples, f"pinned {v} changed"
        held = shared.referenced(self.root, complete)
        for v, done in found.items():
            if not done and v < complete[0]:  # retired: only what a kept version names
                assert set(os.listdir(layout.version_dir(self.root, v))) == held.get(v, set())
        Regeneration.totals["retired"] += sum(1 for v, d in found.items() if not d)
        Regeneration.totals["shared"] += sum(len(n) // 2 for n in held.values())

    @invariant()
    def inputs_exist(self):
        assert all(self.tree.files([name], readable_only=True) for name in self.active)


def leaks_excluded(vdir, manifest):
    """Keys --drop_near_duplicate_leaks left out (near_duplicates.jsonl's `excluded`)."""
    near = manifest.get("near_duplicates")
    if not near:
        return set()
    with open(os.path.join(vdir, near["path"])) as f:
        return {k for line in f if line.strip() for k in json.loads(line).get("excluded", [])}


def catalog_rows(vdir):
    from beam_pipeline.store import catalog

    return list(catalog.iter_rows(layout.join(vdir, layout.CATALOG)))


COMMON = dict(deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
# fast: 2 sequences of 12 steps; the long profile
# (slow) runs 5 x 30 steps with real full builds
FAST = settings(max_examples=2, stateful_step_count=12, derandomize=True, **COMMON)
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


def test_regeneration_model_shares_shards_and_retires_versions(monkeypatch):
    """One scripted history through the same machine, so the fast subset always covers
    what the drawn ones may miss on a tree this small: nights that share shards, a pinned
    version kept through two builds, then retired down to the shards later versions name."""
    monkeypatch.setenv("COLUMNS", "100")
    before = dict(Regeneration.totals)
    machine = Regeneration()
    try:
        machine.first_build()
        for seed in (11, 12, 13):
            machine.add_image("in0", "cat", seed, "jpg")
        machine.build("default", keep=0)            # incremental: the first shards shared
        machine.add_image("in0", "dog", 14, "png")
        machine.build("default", keep=1, pin=True)  # pins LATEST: nothing is deleted
        machine.add_image("in0", "owl", 15, "jpg")
        machine.build("default", keep=1)            # still pinned for this build
        machine.rename_or_move_image(3, "in0")
        machine.build("default", keep=1)            # the pin is over: versions retire
    finally:
        machine.teardown()
    ran = {k: v - before[k] for k, v in Regeneration.totals.items()}
    assert ran["published"] == 5 and ran["pins"] == 1
    assert ran["shared"] >= 3 and ran["retired"] >= 1, ran


def test_regeneration_model_keeps_tagged_and_held_versions(monkeypatch):
    """A scripted history of the tag and hold steps, so the fast subset always covers them:
    a tagged and a held version survive --keep_versions 1 builds byte for byte, then
    retire once the tag is deleted and the lease lapsed."""
    monkeypatch.setenv("COLUMNS", "100")
    before = dict(Regeneration.totals)
    machine = Regeneration()
    try:
        machine.first_build()
        machine.tag_latest("release")
        tagged = machine.tags["release"][0]
        machine.add_image("in0", "cat", 11, "jpg")
        machine.build("default", keep=1)
        machine.hold_latest()
        held = next(iter(machine.leases.values()))[0]
        for seed in (12, 13):
            machine.add_image("in0", "dog", seed, "png")
            machine.build("default", keep=1)        # both kept: checked after each build
        assert {tagged, held} <= set(_complete(machine.root))
        machine.lease_lapses(0)
        machine.ref_steps = 0  # two steps between these builds: the script may
        machine.delete_tag("release")
        machine.add_image("in0", "owl", 14, "jpg")
        machine.build("default", keep=1)            # now both retire
        assert not {tagged, held} & set(_complete(machine.root))
    finally:
        machine.teardown()
    ran = {k: v - before[k] for k, v in Regeneration.totals.items()}
    assert ran["published"] == 5 and (ran["tags"], ran["holds"], ran["lapsed"]) == (1, 1, 1)


def _complete(root):
    from beam_pipeline.store import versions

    return [v for v, done in versions.list_versions(root).items() if done]
