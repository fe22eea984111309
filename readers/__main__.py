"""`python -m readers ROOT`: describe a dataset and read one batch back, as training would."""

import argparse
import re
import time

import readers
import tf_quiet


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m readers", description=__doc__,
                                     allow_abbrev=False)
    parser.add_argument("path", help="dataset root (uses LATEST) or a version directory")
    parser.add_argument("--version",
                        help="a version id under ROOT/versions/ or a tag (default: LATEST)")
    parser.add_argument("--split", default="train")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--verbose", action="store_true",
                        help="also show TensorFlow's start-up lines")
    args = parser.parse_args(argv)
    tf_quiet.install(args.verbose)  # before TensorFlow loads
    try:
        _read_one_batch(args)
    except (OSError, KeyError, ValueError) as e:  # no dataset, no such split, ...
        if args.verbose:
            raise
        parser.exit(2, f"error: {e.args[0] if isinstance(e, KeyError) else e}\n")
    except Exception as e:  # a missing, cut or corrupt shard: TensorFlow's OpError
        if args.verbose or not type(e).__module__.startswith("tensorflow"):
            raise
        parser.exit(2, f"error: {_op_error_line(e)}\n")


def _op_error_line(e):
    """TensorFlow's error -> its one line: the reader's own assertion (which names the shard
    and the records), else the first line of the message without TensorFlow's node names."""
    text = getattr(e, "message", None) or str(e)
    if "assertion failed: [" in text:
        return text.split("assertion failed: [", 1)[1].split("]\n", 1)[0].rstrip("]")
    line = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return re.sub(r"\{\{[^}]*\}\}\s*", "", line).strip()


def _read_one_batch(args):
    import numpy as np

    ds_info = readers.info(args.path, args.version)  # one manifest read; pins the version
    start = time.monotonic()
    ds = readers.make_dataset(ds_info, split=args.split, batch_size=args.batch_size,
                              image_size=args.image_size, training=False, repeat=False)
    images, labels = next(iter(ds))
    names = ds_info.labels
    print(f"Read back {ds_info.version_dir} ({args.split}): one batch of images "
          f"{tuple(images.shape)} {images.dtype.name} in {time.monotonic() - start:.1f}s; labels "
          f"{[names[i] for i in np.asarray(labels).tolist()][:8]}"
          f"{' …' if len(labels) > 8 else ''}")


if __name__ == "__main__":
    main()
