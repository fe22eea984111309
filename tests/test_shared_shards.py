"""Versions share shard files: a manifest path `../VERSION/NAME` names a shard an earlier
version of the root wrote (docs/format.md, format version 3)."""

import pytest

from dataset_format import layout


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
