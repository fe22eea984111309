"""What declared fields cost a build: the same photographs from a JSONL manifest, with and
without three fields (a caption, 1-4 tags, 1-3 boxes), alternating in one run.

    .venv/bin/python benchmarks/bench_fields.py [--sizes 250,1000] [--repeat 3] [--base DIR]

Programs, each the default local command (configs/local.yaml) on the same files:
  folder     the photo tree as a directory input: the build without any manifest
  manifest   a JSONL manifest of uri, label
  fields     the same manifest with caption, tags and objects columns, and --schema
  base       with --base DIR (a checkout of the code before fields, e.g. from git archive):
             that code's folder build, for "datasets without fields cost what they did"
It prints median wall and CPU seconds (user + system of the process tree) per program and
size, CPU per image as the slope between the two sizes (the ~3 s of start-up cancels), and
the ratios fields / manifest and folder / base. Inputs are seeded (benchmarks/photos.py).
"""

import argparse
import json
import os
import random
import shlex
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from bench_pipeline import measure  # noqa: E402
from common import Record, add_record_argument, build_command, files_of  # noqa: E402
from photos import photo_tree  # noqa: E402

TAGS = [f"tag{i:02d}" for i in range(20)]
OBJECTS = ["cat", "dog", "car", "tree", "person"]
SCHEMA = {"fields": {"caption": {"type": "string"},
                     "tags": {"type": "classes", "max_len": 4},
                     "objects": {"type": "boxes", "max_len": 3, "classes": OBJECTS}}}


def manifests(root, out):
    """(manifest without fields, manifest with them, schema file) for the photos under root."""
    rng = random.Random(0)
    plain, rich = [], []
    for path in files_of(root):
        row = {"uri": path, "label": os.path.basename(os.path.dirname(path))}
        plain.append(row)
        boxes = []
        for _ in range(rng.randint(1, 3)):
            x0, y0 = rng.random() * 0.6, rng.random() * 0.6
            boxes.append({"xmin": round(x0, 4), "ymin": round(y0, 4),
                          "xmax": round(x0 + 0.1 + rng.random() * 0.3, 4),
                          "ymax": round(y0 + 0.1 + rng.random() * 0.3, 4),
                          "label": rng.choice(OBJECTS)})
        rich.append(dict(row, caption=f"a photograph of {row['label']} number {rng.randrange(10**6)}",
                         tags=rng.sample(TAGS, rng.randint(1, 4)), objects=boxes))
    files = []
    for name, rows in (("plain.jsonl", plain), ("fields.jsonl", rich)):
        files.append(os.path.join(out, name))
        with open(files[-1], "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    files.append(os.path.join(out, "schema.json"))
    with open(files[-1], "w") as f:
        json.dump(SCHEMA, f)
    return files


def base_command(base, src, out):
    """The folder build with the code at `base`: run from there, so it (and the workers it
    starts) import that code."""
    return ["sh", "-c", f"cd {shlex.quote(base)} && exec {shlex.join(build_command(src, out))}"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="250,1000",
                        help="two photo counts: CPU per image is the slope between them")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--base", help="a checkout of the code before fields")
    add_record_argument(parser)
    args = parser.parse_args()
    record = Record("bench_fields", args)
    sizes = [int(v) for v in args.sizes.split(",")]
    runs = {}
    for n in sizes:
        root = photo_tree(n)
        work = tempfile.mkdtemp(prefix="bench-fields-")
        plain, rich, schema = manifests(root, work)
        programs = {"folder": lambda out, root=root: build_command(root, out),
                    "manifest": lambda out, plain=plain: build_command(plain, out),
                    "fields": lambda out, rich=rich, schema=schema: build_command(
                        rich, out, "--schema", schema)}
        if args.base:
            programs["base"] = lambda out, root=root: base_command(args.base, root, out)
        for _ in range(args.repeat):  # alternating: the load moves all programs alike
            for name, cmd_of in programs.items():
                runs.setdefault(name, {}).setdefault(n, []).append(measure(cmd_of, 1))
    figures = {name: {n: {key: statistics.median(r[key] for r in rs) for key in ("seconds", "cpu")}
                      for n, rs in by_size.items()} for name, by_size in runs.items()}
    small, large = sizes
    print(f"photos {small} and {large}, medians of {args.repeat} (alternating)")
    print(f"{'program':10} {'wall s':>16} {'cpu s':>16} {'cpu ms/img (slope)':>19}")
    slopes = {}
    for name, f in figures.items():
        slopes[name] = 1000 * (f[large]["cpu"] - f[small]["cpu"]) / (large - small)
        print(f"{name:10} {f[small]['seconds']:7.1f} {f[large]['seconds']:8.1f} "
              f"{f[small]['cpu']:7.1f} {f[large]['cpu']:8.1f} {slopes[name]:19.3f}")
    ratios = {"fields_vs_manifest_cpu_per_image": slopes["fields"] / slopes["manifest"],
              "fields_vs_manifest_cpu": figures["fields"][large]["cpu"]
              / figures["manifest"][large]["cpu"]}
    if args.base:
        ratios["folder_vs_base_cpu_per_image"] = slopes["folder"] / slopes["base"]
        ratios["folder_vs_base_cpu"] = figures["folder"][large]["cpu"] / figures["base"][large]["cpu"]
    for name, value in ratios.items():
        print(f"{name}: {value:.3f}")
    record.save({"programs": figures, "cpu_ms_per_image": slopes, "ratios": ratios, "runs": runs})


if __name__ == "__main__":
    main()
