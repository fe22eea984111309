"""TensorFlow Datasets metadata beside the shards, so TFDS reads a version directory as is.

`write(version_dir, manifest)` is a commit hook (commit.commit's `extra_files`): it runs in
the job's last stage, after the shards are renamed and before manifest.json is written, and
writes what `tfds.builder_from_directory(version_dir)` needs:

  dataset_info.json       splits with shard lengths and bytes, file template, description
  features.json           the FeaturesDict: JPEGs decode to uint8 images, labels are a ClassLabel
  metadata.json           this build's version id and where its manifest is
  image-class-label.labels.txt   the class names, one per line, in id order

Splits with no examples are left out (TFDS cannot read an empty split).
Counts come from the manifest (what the writer counted), never from re-reading the shards.
The FeaturesDict nests on '/': TFDS flattens nested dicts with '/' when it parses a
tf.train.Example, so {'image': {'encoded': Image}} reads the key image/encoded.
"""

import logging

from readers import layout, schema

# TFDS versions are semantic (x.y.z); ours are build timestamps. The TFDS version follows the
# manifest's format_version, and the build id goes into the description and metadata.json.
TFDS_VERSION_PATTERN = "{format}.0.0"
TFDS_FILES = ("dataset_info.json", "features.json", "metadata.json")
LABELS_SUFFIX = ".labels.txt"  # ClassLabel names file: image-class-label.labels.txt


def _feature(tfds, np, key, dtype, labels):
    if key == schema.ENCODED:
        return tfds.features.Image(shape=(None, None, 3), encoding_format="jpeg")
    if key == schema.LABEL:
        return tfds.features.ClassLabel(names=list(labels))
    if dtype == "string":
        return tfds.features.Text()
    if dtype == "int64":
        return tfds.features.Scalar(dtype=np.int64)
    if dtype in ("float", "float32"):
        return tfds.features.Scalar(dtype=np.float32)
    raise ValueError(f"feature {key!r}: dtype {dtype!r} has no TFDS equivalent")


def features_dict(labels, features=None):
    """The tfds.features.FeaturesDict for our Example keys, nested on '/'."""
    import numpy as np
    import tensorflow_datasets as tfds

    nested = {}
    for key, dtype in (features or schema.FEATURES).items():
        *parents, leaf = key.split("/")
        node = nested
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = _feature(tfds, np, key, dtype, labels)
    return tfds.features.FeaturesDict(nested)


def dataset_info(version_dir, manifest):
    """A tfds.core.DatasetInfo built from the manifest's labels, features and counts."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core import naming

    name = manifest["name"]
    tfds_version = TFDS_VERSION_PATTERN.format(format=manifest["format_version"])
    identity = tfds.core.DatasetIdentity(
        name=name, version=tfds.core.Version(tfds_version), data_dir=version_dir,
        module_name=__name__)
    split_infos = []
    for split, s in sorted(manifest["splits"].items()):
        if not s["num_examples"]:
            # TFDS cannot read a split with no examples ("corresponds to no data") and would
            # list it as of unknown size: leave it out, so info.splits lists what can be read.
            continue
        template = naming.ShardedFileTemplate(
            data_dir=version_dir, dataset_name=name, split=split, filetype_suffix="tfrecord")
        expected = [template.sharded_filepath(shard_index=i, num_shards=len(s["shards"])).name
                    for i in range(len(s["shards"]))]
        actual = [sh["path"] for sh in s["shards"]]
        if expected != actual:  # layout.shard_name and TFDS's template must agree
            raise ValueError(f"split {split!r}: shard names {actual[:2]}… do not follow the "
                             f"TFDS template ({expected[:2]}…)")
        split_infos.append(tfds.core.SplitInfo(
            name=split, shard_lengths=[int(sh["num_examples"]) for sh in s["shards"]],
            num_bytes=int(s["num_bytes"]), filename_template=template))
    info = tfds.core.DatasetInfo(
        builder=identity,
        description=(f"{name}, build {manifest['version']}: images as JPEG with class labels "
                     f"({len(manifest['labels'])} classes). Written by "
                     f"{manifest.get('generator', {}).get('package', 'image-tfrecords')}; "
                     f"see manifest.json beside this file."),
        features=features_dict(manifest["labels"], manifest.get("features")),
        metadata=tfds.core.MetadataDict(version=manifest["version"],
                                        manifest=layout.MANIFEST),
    )
    info.set_splits(tfds.core.SplitDict(split_infos))
    return info


def write(version_dir, manifest):
    """Commit hook: write the TFDS files into `version_dir` and list them in the manifest."""
    if int(manifest.get("label_offset", 0)) != 0:
        logging.warning("label_offset %s: TFDS ClassLabel ids start at 0; no TFDS metadata "
                        "written", manifest["label_offset"])
        return
    info = dataset_info(version_dir, manifest)
    info.write_to_directory(version_dir)
    # ClassLabel.save_metadata names the file after the feature path, '/' -> '-'.
    files = sorted(TFDS_FILES + (schema.LABEL.replace("/", "-") + LABELS_SUFFIX,))
    empty = sorted(s for s, v in manifest["splits"].items() if not v["num_examples"])
    manifest["tfds"] = {"version": str(info.version), "files": files, "omitted_splits": empty}
