"""launcher/listing.py (with folders, manifests, walk, stamps) on its own: what each --input
lists (keys, labels, splits, sizes), straight from iter_inputs, with no build. Files hold
fixed bytes: listing reads none."""

import json
import os

import pytest

from beam_pipeline.errors import UserError
from beam_pipeline.launcher.listing import iter_inputs
from beam_pipeline.launcher.stamps import local_stamp
from beam_pipeline.refs import ImageRef


def put(root, *names, data=b"x" * 7):
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def listed(*specs, **kw):
    """iter_inputs -> ({key: ImageRef}, [error record]); keys are unique."""
    refs, errors = {}, []
    for item in iter_inputs([str(s) for s in specs], **kw):
        if isinstance(item, ImageRef):
            assert item.key not in refs, item.key
            refs[item.key] = item
        else:
            errors.append(item)
    return refs, errors


def summary(refs):
    return {key: (ref.label, ref.split) for key, ref in refs.items()}


# --- directories -------------------------------------------------------------------------

def test_a_class_folder_tree_lists_keys_labels_and_absolute_uris(tmp_path):
    root = put(tmp_path / "in", "cat/a.jpg", "cat/sub/b.png", "dog/c.JPEG")
    refs, errors = listed(root)
    assert not errors
    assert summary(refs) == {"cat/a.jpg": ("cat", None), "cat/sub/b.png": ("cat", None),
                             "dog/c.JPEG": ("dog", None)}
    for key, ref in refs.items():
        assert ref.uri == os.path.join(str(root), *key.split("/"))
        assert os.path.isabs(ref.uri)
        assert ref.size == 7 and ref.stamp == local_stamp(os.stat(ref.uri))


def test_split_folders_fix_the_split_and_stay_in_the_key(tmp_path):
    root = put(tmp_path / "in", "train/cat/a.jpg", "validation/dog/b.jpg", "test/dog/c.jpg",
               "other/cat/d.jpg")
    refs, _ = listed(root)
    assert summary(refs) == {
        "train/cat/a.jpg": ("cat", "train"), "validation/dog/b.jpg": ("dog", "validation"),
        "test/dog/c.jpg": ("dog", "test"),
        "other/cat/d.jpg": ("other", None)}  # not a split name: the first folder is the class


def test_edge_names_spaces_unicode_and_dots(tmp_path):
    root = put(tmp_path / "in", "snow leopard/big cat 1.jpg", "café/ü.jpg", "日本/写真.png",
               "dog.v2/a.b.c.jpeg", "dog.v2/..x.jpg", "cat/x.tif", "cat/y.webp")
    refs, _ = listed(root)
    assert summary(refs) == {
        "snow leopard/big cat 1.jpg": ("snow leopard", None), "café/ü.jpg": ("café", None),
        "日本/写真.png": ("日本", None), "dog.v2/a.b.c.jpeg": ("dog.v2", None),
        "cat/x.tif": ("cat", None), "cat/y.webp": ("cat", None)}  # ..x.jpg is hidden


def test_hidden_files_and_other_extensions_are_not_listed(tmp_path):
    root = put(tmp_path / "in", "cat/a.jpg", "cat/.b.jpg", "cat/.DS_Store", "cat/notes.txt",
               "cat/c.jpg.partial", "cat/d", "cat/e.HEIC", "labels.csv")
    refs, errors = listed(root)
    assert list(refs) == ["cat/a.jpg"] and not errors


def test_an_image_outside_a_class_folder_is_a_user_error(tmp_path):
    root = put(tmp_path / "in", "cat/a.jpg", "loose.jpg")
    with pytest.raises(UserError, match="loose.jpg is not in a class folder"):
        listed(root)


def test_a_folder_with_no_images_is_a_user_error(tmp_path):
    root = put(tmp_path / "in", "cat/notes.txt")
    with pytest.raises(UserError, match="no image files found"):
        listed(root)
    with pytest.raises(UserError, match="no such directory"):
        listed(tmp_path / "missing")


def test_several_inputs_prefix_keys_with_their_names(tmp_path):
    a = put(tmp_path / "a", "cat/x.jpg")
    b = put(tmp_path / "b", "cat/x.jpg")
    refs, _ = listed(a, b)
    assert summary(refs) == {"a/cat/x.jpg": ("cat", None), "b/cat/x.jpg": ("cat", None)}
    with pytest.raises(UserError, match="would both prefix their keys with 'a'"):
        listed(a, put(tmp_path / "other" / "a", "dog/y.jpg"))


def test_inputs_over_max_bytes_are_too_large_errors(tmp_path):
    root = put(tmp_path / "in", "cat/small.jpg")
    put(root, "cat/big.jpg", data=b"x" * 2000)
    refs, errors = listed(root, max_bytes=1000)
    assert list(refs) == ["cat/small.jpg"]
    assert [(e.uri, e.reason) for e in errors] == [(str(root / "cat" / "big.jpg"),
                                                      "too_large")]


# --- globs ------------------------------------------------------------------------------

def test_a_glob_keys_from_its_fixed_prefix_and_labels_by_parent_folder(tmp_path):
    root = put(tmp_path / "in", "cat/a.jpg", "cat/b.png", "dog/c.jpg", "dog/deep/d.jpg")
    refs, _ = listed(f"{root}/*/*.jpg")
    assert summary(refs) == {"cat/a.jpg": ("cat", None), "dog/c.jpg": ("dog", None)}
    refs, _ = listed(f"{root}/**.jpg")  # '**' crosses folders; the label is the parent folder
    assert summary(refs) == {"cat/a.jpg": ("cat", None), "dog/c.jpg": ("dog", None),
                             "dog/deep/d.jpg": ("deep", None)}
    refs, _ = listed(f"{root}/[cd]?g/*")
    assert sorted(refs) == ["dog/c.jpg"]


def test_a_glob_matching_nothing_is_a_user_error(tmp_path):
    root = put(tmp_path / "in", "cat/a.jpg")
    with pytest.raises(UserError, match="no files match"):
        listed(f"{root}/*/*.png")


# --- manifests ---------------------------------------------------------------------------

def test_a_csv_manifest_keys_relative_and_absolute_uris(tmp_path):
    data = put(tmp_path / "data", "imgs/a.jpg", "imgs/b.jpg", "imgs/c d.jpg")
    elsewhere = put(tmp_path / "elsewhere", "e.jpg")
    manifest = data / "list.csv"
    manifest.write_text("uri,label,split\n"
                        "imgs/a.jpg,cat,train\n"
                        "./imgs/../imgs/b.jpg,dog,\n"
                        f"{data}/imgs/c d.jpg,dog,test\n"
                        f"{elsewhere}/e.jpg,owl,\n", encoding="utf-8")
    refs, errors = listed(manifest)
    assert not errors
    assert summary(refs) == {
        "imgs/a.jpg": ("cat", "train"), "imgs/b.jpg": ("dog", None),
        "imgs/c d.jpg": ("dog", "test"),  # absolute, under the manifest's folder: relative key
        str(elsewhere / "e.jpg").lstrip("/"): ("owl", None)}  # elsewhere: the path, no '/'
    assert refs["imgs/b.jpg"].uri == str(data / "imgs" / "b.jpg")  # normalised, absolute
    assert refs["imgs/a.jpg"].size == 7


def test_a_jsonl_manifest_lists_like_a_csv_one(tmp_path):
    data = put(tmp_path / "data", "a.jpg", "b.jpg")
    manifest = data / "list.jsonl"
    rows = [{"uri": "a.jpg", "label": "cat", "split": "validation"},
            {"uri": "b.jpg", "label": "dog"}]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    refs, errors = listed(manifest)
    assert summary(refs) == {"a.jpg": ("cat", "validation"), "b.jpg": ("dog", None)}
    assert not errors


def test_manifest_rows_missing_a_file_or_a_field_are_error_records(tmp_path):
    data = put(tmp_path / "data", "a.jpg")
    (data / "folder.jpg").mkdir()
    manifest = data / "list.csv"
    manifest.write_text("uri,label\na.jpg,cat\nmissing.jpg,cat\n,cat\na.jpg,\nfolder.jpg,cat\n")
    refs, errors = listed(manifest)
    assert list(refs) == ["a.jpg"]
    assert [(e.uri, e.reason) for e in errors] == [
        (f"{manifest}:4", "bad_manifest_row"), ("a.jpg", "bad_manifest_row"),
        (str(data / "missing.jpg"), "not_found"), (str(data / "folder.jpg"), "not_found")]


def test_a_manifest_without_its_columns_or_rows_is_a_user_error(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("path,class\na.jpg,cat\n")
    with pytest.raises(UserError, match="columns uri,label"):
        listed(bad)
    empty = tmp_path / "empty.csv"
    empty.write_text("uri,label\n")
    with pytest.raises(UserError, match="manifest has no rows"):
        listed(empty)


def test_a_manifest_input_is_named_by_its_file_stem(tmp_path):
    data = put(tmp_path / "data", "a.jpg")
    (data / "pets.csv").write_text("uri,label\na.jpg,cat\n")
    folder = put(tmp_path / "photos", "dog/b.jpg")
    refs, _ = listed(data / "pets.csv", folder)
    assert summary(refs) == {"pets/a.jpg": ("cat", None), "photos/dog/b.jpg": ("dog", None)}
