"""The build flags as plain argparse, so `--help` answers without importing Beam or TF."""

import argparse

from beam_pipeline import defaults


def boolean(text):
    """'true'/'false' (and friends) -> bool, so flags, YAML and template strings agree."""
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


NEAR_DUPLICATE_RADIUS = defaults.NEAR_DUPLICATE_RADIUS


def add_build_args(parser):
    """Every build option; BuildOptions (a PipelineOptions) registers exactly these."""
    # ~85 lines: one add() per flag with its help, a table rather than logic.
    add = parser.add_argument
    add("--input", action="append", default=None,
        help="Image directory (DIR/<class>/… or DIR/<split>/<class>/…), glob, or .csv/.jsonl "
             "manifest with columns uri,label[,split]; local or gs://. Repeatable.")
    add("--output", default=None, help="Dataset root, local dir or gs://bucket/prefix.")
    add("--name", default="images", help="Dataset name used in shard file names.")
    add("--splits", default="train=0.8,validation=0.1,test=0.1",
        help="Split fractions for images whose split is not fixed by layout or manifest.")
    add("--num_shards", type=int, default=0,
        help="Shards per split; 0 = auto, ~--target_shard_mb each.")
    add("--target_shard_mb", type=float, default=128.0, help="Target shard size for auto.")
    add("--max_side", type=int, default=0,
        help="Resize images whose longer side exceeds this; 0 = never.")
    add("--validate", choices=("decode", "header"), default="decode",
        help="decode: strictly decode every image (a JPEG stored as it came at DCT scale "
             "1/8: every coefficient is still entropy-decoded, where corruption shows) and "
             "reject data that loses pixels (default); header: only check headers, for "
             "inputs you trust.")
    add("--reencode", choices=("auto", "always"), default="auto",
        help="auto: store baseline RGB JPEGs byte for byte; always: re-encode every image.")
    add("--jpeg_quality", type=int, default=90, help="JPEG quality when encoding (1-100).")
    add("--max_pixels", type=int, default=89_478_485,
        help="Reject images with more pixels than this (decompression bombs).")
    add("--max_image_mb", type=float, default=1024.0,
        help="Inputs larger than this (MiB) are rejected as too_large, never read.")
    add("--max_error_rate", type=float, default=0.01,
        help="Fail without publishing when more than this fraction of inputs is rejected.")
    add("--label_file", default=None,
        help="Text file with one class name per line; line order gives the label ids.")
    add("--schema", default=None,
        help="YAML or JSON file declaring the manifest's further columns (fields: int, float, "
             "string, list[...], classes, boxes; docs/format.md), checked for every row; "
             "'infer' reads them from the manifests and prints the schema to keep.")
    add("--sink", choices=("shards", "beam"), default="shards",
        help="shards: one DoFn call writes each planned shard (default); "
             "beam: beam.io.WriteToTFRecord, for comparison.")
    add("--write_index", type=boolean, default=True,
        help="Write a DALI/tfrecord-style .index file next to each shard.")
    add("--transform", type=boolean, nargs="?", const=True, default=False,
        help="Also compute tensorflow-transform statistics and a transform graph (off by "
             "default: the default build and reader never need it).")
    add("--no_transform", dest="transform", action="store_false", default=False,
        help="Same as --transform=false.")
    add("--transform_image_size", type=int, default=224,
        help="Image size the transform graph resizes to.")
    add("--force", type=boolean, nargs="?", const=True, default=False,
        help="Rebuild even when inputs and options are unchanged.")
    add("--drop_content_duplicates", type=boolean, nargs="?", const=True, default=False,
        help="Store one copy of byte-identical images (the key that sorts first); count the "
             "others as duplicates. Without it they are only reported (duplicates.jsonl).")
    add("--near_duplicates", type=boolean, nargs="?", const=True, default=False,
        help="Store two perceptual hashes and a descriptor per image (catalog columns "
             "phash, phash_center, near_descriptor) and report pairs of near-duplicates, e.g. "
             "resized, re-compressed or lightly cropped copies: the hashes propose, the "
             "descriptor confirms (near_duplicates.jsonl; verify warns when a pair spans train "
             "and an evaluation split). Off by default: it adds ~1/5 to the per-image cost "
             "of a default build.")
    add("--near_duplicate_radius", type=int, default=NEAR_DUPLICATE_RADIUS,
        help="Hamming distance (bits of 64) within which two images are candidates for the "
             "descriptor to confirm (the least over their hashes' four pairs).")
    add("--drop_near_duplicate_leaks", type=boolean, nargs="?", const=True, default=False,
        help="With --near_duplicates: leave out evaluation images with a confirmed pair "
             "with a train image, counted as leaks. Without it they are only reported.")
    add("--full_rebuild", type=boolean, nargs="?", const=True, default=False,
        help="Convert every image again instead of reusing the previous version's records.")
    add("--resplit", type=boolean, nargs="?", const=True, default=False,
        help="Split every image by its key hash again, forgetting the splits earlier "
             "versions published (which are otherwise kept for life). Converts everything.")
    add("--verify_inputs", type=boolean, nargs="?", const=True, default=False,
        help="Hash every input instead of trusting unchanged size, mtime and ctime (or a "
             "gs:// generation): certainty for a full read.")
    add("--max_delta_share", type=float, default=0.25,
        help="Rebuild in full when shards added by incremental runs would hold more than "
             "this share of a split's examples.")
    add("--keep_versions", type=int, default=0,
        help="After publishing, keep this many newest complete versions; 0 = keep all. "
             "Older ones go only once superseded longer than --keep_superseded_hours ago.")
    add("--keep_superseded_hours", type=float, default=48.0,
        help="--keep_versions never deletes a version superseded less than this long ago "
             "(a training job may have pinned it).")
    add("--max_hours", type=float, default=0.0,
        help="Bound on a build's wall time in hours (fractions allowed); 0 = none. A local "
             "or cron build still running after this long stops, frees the root's lock and "
             "exits 1. On Dataflow the service cancels the job "
             "(max_workflow_runtime_walltime_seconds), and the root's lock handed to the job "
             "expires then, so the next build takes it.")
    add("--wait", type=boolean, nargs="?", const=True, default=False,
        help="When another build holds --output, wait for it instead of exiting with status 2.")
    add("--verbose", type=boolean, nargs="?", const=True, default=False,
        help="Show tracebacks, Beam's logging and TensorFlow's start-up lines.")


def wants_verbose(argv):
    """Whether the command line turns --verbose on, read before anything heavy loads."""
    verbose = False
    for i, arg in enumerate(argv):
        if arg == "--verbose":
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            try:
                verbose = boolean(nxt) if not nxt.startswith("-") and nxt else True
            except argparse.ArgumentTypeError:
                verbose = True
        elif arg.startswith("--verbose="):
            try:
                verbose = boolean(arg.split("=", 1)[1])
            except argparse.ArgumentTypeError:
                verbose = True
    return verbose


def help_parser():
    parser = argparse.ArgumentParser(
        prog="python -m beam_pipeline", description="Image files -> sharded TFRecords.",
        allow_abbrev=False,
        epilog="Other flags must be Beam pipeline options (e.g. --runner, --project, "
               "--direct_num_workers); an unknown flag or config key is an error (exit 2).")
    parser.add_argument("--config", help="YAML file of option: value defaults; flags win.")
    add_build_args(parser)
    return parser
