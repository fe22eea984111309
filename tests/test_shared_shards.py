"""Versions share shard files: a manifest path `../VERSION/NAME` names a shard an earlier
version of the root wrote (docs/format.md, format version 3)."""

import json
import os
import shutil

import pytest

from dataset_format import layout
from tests.helpers import build, check_invariants, image_bytes, make_images


def test_a_path_of_the_version_itself_is_joined_to_its_directory():
    assert layout.shard_file("gs://b/r/versions/V2", "n-train.tfrecord-00000-of-00002") == \
        "gs://b/r/versions/V2/n-train.tfrecord-00000-of-00002"


@pytest.mark.parametrize("vdir", ["gs://b/r/versions/V2", "gs://b/r/versions/V2/", "/d/versions/V2"])
def test_a_shared_path_names_the_file_in_the_sibling_version(vdir):
    base = vdir.rstrip("/").rsplit("/", 1)[0]
    # resolved textually: gs:// has no directories for a `..` to climb
    assert layout.shard_file(vdir, "../V1/n-train.tfrecord-00003-of-00008") == \
        f"{base}/V1/n-train.tfrecord-00003-of-00008"
    assert ".." not in layout.shard_file(vdir, "../V1/x")


@pytest.mark.parametrize("rel", ["../../V1/x", "../V1/sub/x", "../V1/", "../../x", "../V1/..",
                                 "../x"])
def test_any_other_climbing_path_is_refused_by_name(rel):
    with pytest.raises(ValueError, match=r"not a file of this version nor \.\./VERSION/NAME"):
        layout.shard_file("/d/versions/V2", rel)


def test_sharing_a_shared_file_keeps_the_version_that_wrote_it():
    # V3 reusing V2's shard that V2 took from V1 points at V1 directly: no chains.
    assert layout.shared_path("V2", "n-train.tfrecord-00000-of-00002") == \
        "../V2/n-train.tfrecord-00000-of-00002"
    assert layout.shared_path("V2", "../V1/n-train.tfrecord-00000-of-00002") == \
        "../V1/n-train.tfrecord-00000-of-00002"
    assert layout.shared_parts("../V1/n") == ("V1", "n")


# --- builds ----------------------------------------------------------------------------------

ARGS = ["--name", "pets", "--target_shard_mb", "0.01", "--no_transform"]


def _files(vdir):
    return sorted(os.listdir(vdir)) if os.path.isdir(vdir) else []


def _tfrecords(vdir):
    return [n for n in _files(vdir) if ".tfrecord-" in n and not n.endswith(layout.INDEX_SUFFIX)]


def _read_all(path, version=None):
    """{key: (split, stored JPEG)} through the TensorFlow-free loader, which finds each
    record by the `.index` beside the shard the manifest names."""
    from loaders import SequentialRecords, records

    out = {}
    for split in records.open_info(path, version).splits:
        for ex in SequentialRecords(path, split, version=version, decode=False):
            assert ex.key not in out
            out[ex.key] = (split, bytes(ex.image))
    return out


def _verified(path):
    from beam_pipeline.tools import verify

    assert verify.check(path)["problems"] == []


def _manifest(root, version):
    with open(os.path.join(root, "versions", version, layout.MANIFEST)) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def two_nights(tmp_path_factory):
    """Built once per module, read-only: a first version, then a night adding two images."""
    base = tmp_path_factory.mktemp("nights")
    make_images(base / "src", {"cat": 30, "dog": 30, "owl": 20})
    v1 = build([base / "src"], base / "root", *ARGS)
    make_images(base / "src", {"cat": {"new_a.jpg": image_bytes((1, 2, 3)),
                                       "new_b.jpg": image_bytes((4, 5, 6))}})
    v2 = build([base / "src"], base / "root", *ARGS, "--keep_versions", "0")
    return base, v1, v2


@pytest.fixture
def nights(two_nights, tmp_path):
    """`two_nights` copied for one test to change: (src, root, v1, v2). Two builds per test
    cost ~3 s of the fast subset's CPU; a copy, milliseconds. The copied inputs have new
    paths and ctimes: the next night finds every one moved, hashes it and keeps its record
    (what test_sticky's moved trees check), so its shards are shared all the same."""
    base, v1, v2 = two_nights
    for name in ("src", "root"):
        shutil.copytree(base / name, tmp_path / name, symlinks=True)

    def here(result):
        return {k: v.replace(str(base), str(tmp_path)) if isinstance(v, str) else v
                for k, v in result.items()}

    return tmp_path / "src", str(tmp_path / "root"), here(v1), here(v2)


def test_a_night_that_adds_images_shares_every_unchanged_shard(nights):
    src, root, v1, v2 = nights
    m1, m2 = v1["manifest"], v2["manifest"]
    check_invariants(v2)
    assert m2["format_version"] == 3
    reused = [sh for s in m2["splits"].values() for sh in s["shards"] if sh["origin"] == "hash"]
    own = {sh["path"] for s in m1["splits"].values() for sh in s["shards"] if sh["num_examples"]}
    # Every stored shard of v1 is named where it is, not copied: v2's directory holds the
    # two new images' delta shards alone.
    assert sorted(sh["path"] for sh in reused) == sorted(f"../{v1['version']}/{p}" for p in own)
    assert m2["incremental"]["reused"]["shards"] == len(own)
    assert all(sh["path"].startswith("../") is False for s in m2["splits"].values()
               for sh in s["shards"] if sh["origin"] == "delta")
    assert len(_tfrecords(v2["version_dir"])) == sum(
        1 for s in m2["splits"].values() for sh in s["shards"] if sh["origin"] == "delta")
    # The catalog names the same files as the manifest.
    from beam_pipeline.store import catalog

    rows = list(catalog.iter_rows(os.path.join(v2["version_dir"], layout.CATALOG)))
    assert {r["file"] for r in rows} == {sh["path"] for s in m2["splits"].values()
                                         for sh in s["shards"] if sh["num_examples"]}
    # Readers, the index files and verify follow the manifest's paths.
    _verified(root)
    got, before = _read_all(root), _read_all(v1["version_dir"])
    assert {k: v for k, v in got.items() if k in before} == before
    assert sorted(set(got) - set(before)) == ["cat/new_a.jpg", "cat/new_b.jpg"]

    # A third night shares v1's shards and v2's delta shards where they were written: no
    # chain through v2.
    make_images(src, {"dog": {"new_c.jpg": image_bytes((7, 8, 9))}})
    v3 = build([src], root, *ARGS, "--keep_versions", "0")
    check_invariants(v3)
    paths = {sh["path"] for s in v3["manifest"]["splits"].values() for sh in s["shards"]}
    assert {p.split("/")[1] for p in paths if p.startswith("../")} == {v1["version"],
                                                                      v2["version"]}
    assert {f"../{v1['version']}/{p}" for p in own} <= paths
    _verified(root)
    assert len(_read_all(root)) == 83


def test_tfds_reads_a_sharing_version_once_materialized(nights):
    import tensorflow_datasets as tfds

    from beam_pipeline.tools import materialize

    _, root, v1, v2 = nights
    vdir, m2 = v2["version_dir"], v2["manifest"]
    shared = sum(sh["path"].startswith("../") for s in m2["splits"].values()
                 for sh in s["shards"])
    assert shared and m2["tfds"]["shared_shards"] == shared
    before = _files(v1["version_dir"])
    assert materialize.main([root]) == 0
    assert materialize.materialize(root) == (vdir, 0, 0)  # its manifest names its own files now
    assert _files(v1["version_dir"]) == before
    builder = tfds.builder_from_directory(vdir)
    assert builder.info.version == "3.0.0"
    got = {}
    for split in builder.info.splits:
        for ex in tfds.as_numpy(builder.as_dataset(split=split, decoders={
                "image": {"encoded": tfds.decode.SkipDecoding()}})):
            got[ex["image"]["filename"].decode()] = (split, ex["image"]["encoded"])
    assert got == _read_all(root) and len(got) == 82
    # Hard links locally: no byte copied.
    for split, s in m2["splits"].items():
        for i, sh in enumerate(s["shards"]):
            own = os.path.join(vdir, layout.shard_name("pets", split, i, len(s["shards"])))
            assert os.path.samefile(own, layout.shard_file(vdir, sh["path"]))
    with open(os.path.join(vdir, layout.MANIFEST)) as f:
        assert not _shared_of(json.load(f))
    _verified(root)


# --- retention by reference ------------------------------------------------------------------

def _shared_of(manifest):
    return {p for s in manifest["splits"].values() for sh in s["shards"]
            if (p := sh["path"]).startswith("../")}


@pytest.mark.slow  # three more builds; fast: the prune-killed test and test_model.py's scripted history
def test_retention_deletes_a_shard_only_when_no_kept_version_names_it(nights):
    """v2 was published with --keep_versions 0: no prune ran, the state a build killed
    between publishing and pruning leaves. The next build prunes for both."""
    from beam_pipeline.store import versions

    src, root, v1, v2 = nights
    make_images(src, {"dog": {"new_c.jpg": image_bytes((7, 8, 9))}})
    # A pinned version: inside --keep_superseded_hours nothing is deleted, v1 reads as it did.
    before = _read_all(v1["version_dir"])
    v3 = build([src], root, *ARGS, "--keep_versions", "1")
    assert sorted(versions.list_versions(root).values()) == [True, True, True]
    assert _read_all(root, v1["version"]) == before
    # Outside it: v1 and v2 stop being versions, but the files v3 names stay.
    make_images(src, {"owl": {"new_d.jpg": image_bytes((9, 9, 9))}})
    v4 = build([src], root, *ARGS, "--keep_versions", "1", "--keep_superseded_hours", "0")
    assert versions.list_versions(root) == {v1["version"]: False, v2["version"]: False,
                                            v3["version"]: False, v4["version"]: True}
    held = _shared_of(v4["manifest"])
    for v in (v1, v2, v3):
        want = sorted(n for p in held if p.split("/")[1] == v["version"]
                      for n in (p.split("/")[2], layout.index_name(p.split("/")[2])))
        assert _files(v["version_dir"]) == want  # no manifest, catalog, TFDS file or .tmp
    _verified(root)
    assert len(_read_all(root)) == 84
    # A full rebuild names none of them: every retired directory goes.
    v5 = build([src], root, *ARGS, "--keep_versions", "1", "--keep_superseded_hours", "0",
               "--full_rebuild", "--force")
    assert not _shared_of(v5["manifest"])
    assert versions.list_versions(root) == {v5["version"]: True}
    assert len(_read_all(root)) == 84


def test_a_prune_killed_after_deleting_a_manifest_leaves_what_kept_versions_name(nights):
    """delete_version removes the manifest first: killed right after, the version is an
    incomplete directory with every file; the next prune deletes what nothing names."""
    from beam_pipeline.store import retention, versions

    src, root, v1, v2 = nights
    os.remove(os.path.join(v1["version_dir"], layout.MANIFEST))  # the kill, mid-prune
    assert _read_all(root) and not _files(v1["version_dir"]) == []
    retention.prune(root, v2["version"], keep=1, keep_superseded_hours=0)
    shared = _shared_of(v2["manifest"])
    assert len(_tfrecords(v1["version_dir"])) == len(shared)
    assert {f"../{v1['version']}/{n}" for n in _tfrecords(v1["version_dir"])} == shared
    _verified(root)
    assert len(_read_all(root)) == 82
    # An unreadable kept manifest: retention cannot see every reference, deletes nothing.
    make_images(src, {"dog": {"new_c.jpg": image_bytes((7, 8, 9))}})
    v3 = build([src], root, *ARGS, "--keep_versions", "0")
    with open(os.path.join(v3["version_dir"], layout.MANIFEST), "a") as f:
        f.write("damaged")
    listed = {v: _files(os.path.join(root, "versions", v)) for v in versions.list_versions(root)}
    assert retention.prune(root, v3["version"], keep=1, keep_superseded_hours=0) == []
    assert {v: _files(os.path.join(root, "versions", v)) for v in listed} == listed


def test_dropping_a_duplicate_from_a_shared_shard_writes_this_version_a_copy(nights):
    """--drop_content_duplicates rewrites a shard holding an extra copy: a shared one is
    rewritten into this version, the earlier version's file left as it was."""
    src, root, v1, v2 = nights
    first = sorted(os.listdir(src / "cat"))[0]
    (src / "cat" / "zz_copy.jpg").write_bytes((src / "cat" / first).read_bytes())
    def unchanged(vdir):  # not atime: reading a file is not changing it
        return {n: (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                for n in _files(vdir) if (st := os.stat(os.path.join(vdir, n)))}

    stat = unchanged(v1["version_dir"])
    v3 = build([src], root, *ARGS, "--keep_versions", "0", "--drop_content_duplicates")
    check_invariants(v3)
    assert v3["manifest"]["content_duplicates"]["dropped"] == 1
    assert unchanged(v1["version_dir"]) == stat
    _verified(root)
    assert "cat/zz_copy.jpg" not in _read_all(root) and len(_read_all(root)) == 82


@pytest.mark.slow
def test_on_gcs_a_night_shares_shards_and_retention_keeps_what_is_named(
        gcs, gcs_bucket, tmp_path, gcs_counter):
    """On gs:// a reused shard costs no copy and no stored byte; pruning the version that
    wrote it leaves exactly the objects the kept version names."""
    from beam_pipeline import cli

    make_images(tmp_path / "in", {"cat": 6, "dog": 6})
    base = f"gs://{gcs_bucket}"
    gcs.upload_tree(tmp_path / "in", f"{base}/in")
    root, opts = f"{base}/ds", ["--name", "pets", "--num_shards", "2", "--no_transform",
                                "--keep_versions", "1", "--keep_superseded_hours", "0"]

    def night():
        result = cli.run(["--input", f"{base}/in", "--output", root, *opts])
        assert result.status == "published", result
        return result.version, result.manifest

    v1, m1 = night()
    gcs.upload_bytes(f"{base}/in/cat/new.jpg", image_bytes((3, 200, 9)))
    gcs_counter.reset()
    v2, m2 = night()
    from urllib.parse import unquote

    # No copy of v1's objects: the only copies put this build's own new shard (and its
    # index) at its final name (job/attempts.py).
    copies = [unquote(t) for kind, _, t, _ in gcs_counter.log if kind == "copy"]
    assert copies and not [t for t in copies if f"/versions/{v1}/" in t], copies
    shared = _shared_of(m2)
    assert shared and {p.split("/")[1] for p in shared} == {v1}
    # v1 is retired: its manifest, catalog, TFDS and other files are gone; what v2 names stays.
    left = {uri.rsplit("/", 1)[1] for uri in gcs.list(f"{root}/versions/{v1}/")}
    assert left == {n for p in shared for n in (p.split("/")[2],
                                                layout.index_name(p.split("/")[2]))}
    # v2 stored only its own shards: the new image's delta shard (and empty ones).
    own = {sh["path"] for s in m2["splits"].values() for sh in s["shards"]
           if not sh["path"].startswith("../")}
    assert {uri.rsplit("/", 1)[1] for uri in gcs.list(f"{root}/versions/{v2}/")
            if ".tfrecord-" in uri and not uri.endswith(layout.INDEX_SUFFIX)} == own
    assert sum(sh["num_examples"] for s in m2["splits"].values() for sh in s["shards"]
               if sh["path"] in own) == 1
    _verified(root)
    assert len(_read_all(root)) == 13
