"""TensorFlow Datasets metadata beside the shards, so TFDS reads a version directory as is.

`write(version_dir, manifest)` is a commit hook (commit.commit's `extra_files`): it runs in
the job's last stage, after the shards are renamed and before manifest.json is written, and
writes what `tfds.builder_from_directory(version_dir)` needs (once the shards this version
shares with earlier ones are materialized in it: tools/materialize.py):

  dataset_info.json       splits with shard lengths and bytes, file template, description
  features.json           the FeaturesDict: JPEGs decode to uint8 images, labels are a ClassLabel
  metadata.json           this build's version id and where its manifest is
  image-class-label.labels.txt   the class names, one per line, in id order

Splits with no examples are left out (TFDS cannot read an empty split).
Counts come from the manifest (what the writer counted), never from re-reading the shards.
The FeaturesDict nests on '/': TFDS flattens nested dicts with '/' when it parses a
tf.train.Example, so {'image': {'encoded': Image}} reads the key image/encoded.

The files are written as the JSON that TFDS's own DatasetInfo.write_to_directory produces
(a test compares the two), without importing tensorflow_datasets: that import costs 1-3 s,
a fixed cost of every build's commit stage (and most of a small incremental run's).
"""

import json
import logging

from beam_pipeline.store import files
from dataset_format import fields, layout, schema

# TFDS versions are semantic (x.y.z); ours are build timestamps. The TFDS version follows the
# manifest's format_version, and the build id goes into the description and metadata.json.
TFDS_VERSION_PATTERN = "{format}.0.0"
TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"  # = layout.shard_name
_CLASS = "tensorflow_datasets.core.features."
FEATURES_DICT = _CLASS + "features_dict.FeaturesDict"


def _feature(key, dtype, labels):
    """One feature as TFDS serializes it in features.json."""
    if key == schema.ENCODED:
        return {"image": {"dtype": "uint8", "encodingFormat": "jpeg",
                          "shape": {"dimensions": ["-1", "-1", "3"]}},
                "pythonClassName": _CLASS + "image_feature.Image"}
    if key == schema.LABEL:
        return {"classLabel": {"numClasses": str(len(labels))},
                "pythonClassName": _CLASS + "class_label_feature.ClassLabel"}
    if dtype == "string":
        return {"pythonClassName": _CLASS + "text_feature.Text", "text": {}}
    if dtype in ("int64", "float", "float32"):
        return {"pythonClassName": _CLASS + "scalar.Scalar",
                "tensor": {"dtype": "float32" if dtype != "int64" else "int64",
                           "encoding": "none", "shape": {}}}
    raise ValueError(f"feature {key!r}: dtype {dtype!r} has no TFDS equivalent")


def _field_feature(field, dtype):
    """A declared field's feature: a required scalar is a Scalar or Text, everything else a
    Tensor of any length (an optional scalar: 0 or 1 values; TFDS reads a missing key as
    an empty one)."""
    if field.required and field.type in fields.SCALARS:
        return _feature(field.name, "string" if dtype == "string" else dtype, ())
    return {"pythonClassName": _CLASS + "tensor_feature.Tensor",
            "tensor": {"dtype": {"float": "float32"}.get(dtype, dtype), "encoding": "none",
                       "shape": {"dimensions": ["-1"]}}}


def features_json(labels, features=None, field_schema=None):
    """features.json: the FeaturesDict of our Example keys, nested on '/', and of the
    declared fields' (`field_schema`, a fields.Schema)."""
    nested = {}
    leaves = [(key, _feature(key, dtype, labels))
              for key, dtype in (features or schema.FEATURES).items()]
    for f in field_schema.fields if field_schema else ():
        leaves += [(key, _field_feature(f, dtype)) for key, dtype in f.keys().items()]
    for key, feature in leaves:
        *parents, leaf = key.split("/")
        node = nested
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = feature

    def to_json(node):
        if "pythonClassName" in node:
            return node
        return {"featuresDict": {"features": {k: to_json(v) for k, v in sorted(node.items())}},
                "pythonClassName": FEATURES_DICT}

    return to_json(nested)


def dataset_info_json(manifest):
    """dataset_info.json: name, version and the non-empty splits' shard lengths and bytes."""
    name = manifest["name"]
    splits = []
    for split, s in sorted(manifest["splits"].items()):
        if not s["num_examples"]:
            # TFDS cannot read a split with no examples ("corresponds to no data") and would
            # list it as of unknown size: leave it out, so info.splits lists what can be read.
            continue
        n = len(s["shards"])
        expected = [layout.shard_name(name, split, i, n) for i in range(n)]
        # A shared shard (../VERSION/NAME) is where an earlier version wrote it; TFDS reads
        # it once tools/materialize.py has put it under the template's name here.
        actual = [e if sh["path"].startswith(layout.SHARED_PREFIX) else sh["path"]
                  for e, sh in zip(expected, s["shards"])]
        if expected != actual:
            raise ValueError(f"split {split!r}: shard names {actual[:2]}… do not follow the "
                             f"TFDS template ({expected[:2]}…)")
        splits.append({"filepathTemplate": TEMPLATE, "name": split,
                       "numBytes": str(int(s["num_bytes"])),
                       "shardLengths": [str(int(sh["num_examples"])) for sh in s["shards"]]})
    return {
        "description": (f"{name}, build {manifest['version']}: images as JPEG with class labels "
                        f"({len(manifest['labels'])} classes). Written by "
                        f"{manifest.get('generator', {}).get('package', 'image-tfrecords')}; "
                        f"see manifest.json beside this file."),
        "moduleName": __name__,
        "name": name,
        "splits": splits,
        "version": TFDS_VERSION_PATTERN.format(format=manifest["format_version"]),
    }


def write(version_dir, manifest):
    """Commit hook: write the TFDS files into `version_dir` -> the manifest's "tfds" section
    (None when no TFDS metadata can be written)."""
    if int(manifest.get("label_offset", 0)) != 0:
        logging.warning("label_offset %s: TFDS ClassLabel ids start at 0; no TFDS metadata "
                        "written", manifest["label_offset"])
        return None
    info = dataset_info_json(manifest)
    # ClassLabel.save_metadata names the file after the feature path, '/' -> '-'.
    labels_file = schema.LABEL.replace("/", "-") + layout.TFDS_LABELS_SUFFIX
    contents = {
        layout.TFDS_DATASET_INFO: json.dumps(info, indent=2, sort_keys=True),
        layout.TFDS_FEATURES: json.dumps(features_json(
            manifest["labels"], manifest.get("features"),
            fields.from_json(manifest["fields"]) if manifest.get("fields") else None),
            indent=4, sort_keys=True),
        layout.TFDS_METADATA: json.dumps({"version": manifest["version"], "manifest": layout.MANIFEST}),
        labels_file: "".join(f"{label}\n" for label in manifest["labels"]),
    }
    for name, text in contents.items():
        files.write_bytes(layout.join(version_dir, name), text.encode())
    empty = sorted(s for s, v in manifest["splits"].items() if not v["num_examples"])
    shared = sum(sh["path"].startswith(layout.SHARED_PREFIX)
                 for s in manifest["splits"].values() for sh in s["shards"])
    return {"tfds": {"version": info["version"], "files": sorted(contents),
                     "omitted_splits": empty, "shared_shards": shared}}
