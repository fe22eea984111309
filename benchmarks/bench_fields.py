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

--focused N measures instead, in this process, what fields add to one image's work (CPU
time, medians of alternating rounds over N photos): the row check and its values' JSON
text, the listing line's JSON both ways, the converted image's Example with and without
field features (parsed from the text once), and its catalog row into an Arrow table with
and without field columns. The field bytes two ways, in the same rounds: "fields" as the
writer makes them (fields.encoded, an encoder per schema), "listfeature" as it did before
(fields.features, then each ListFeature's entry). The launcher's further passes over the listing line (each a
parse and a dump, the fields' text a string in it) are not in this figure.

--launcher N measures those: the launcher's whole planning (prepare.prepare: listing,
row checks, identity, the plan's spills) on N photos in this process, CPU ms per image
without and with the fields, medians of alternating rounds.

--side measures the target ("three fields cost <= 10% more per image") in one run: whole
builds of the manifest without and with the fields, alternating (which goes first swaps
each round), at both --sizes each round; a round's CPU per image is each program's slope
between the sizes (start-up cancels), its ratio fields / plain; it prints the median of
the rounds' ratios (PASS at <= 1.10) and the ratio of the median slopes. Then, in the same
run, the launcher's share (--launcher at the larger size) and the writer's (--focused on
--writer_photos, from the listing line on, the image converted before the clock starts),
each as what the fields add over the plain build's CPU per image. Run it under
`nice -n 10` with many rounds on a shared machine:

    nice -n 10 .venv/bin/python benchmarks/bench_fields.py --side --sizes 500,4000 --rounds 15
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
from common import REPO, Record, add_record_argument, build_command, files_of  # noqa: E402
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


def focused(n, rounds, only=None, writer_only=False):
    """Per image CPU ms of the writer's work without and with three fields (see --focused).
    `writer_only`: the launcher's part (the row check, the text, the line's dump) and the
    image's conversion (the same work in both programs, and most of the rounds' noise) done
    before the clock starts: what the fields add to the job's work, from its listing line
    on, without the pixels' ~0.5 ms."""
    import time

    import pyarrow as pa

    sys.path.insert(0, REPO)  # this checkout's package, whatever the environment installed
    from beam_pipeline.job import images, records
    from beam_pipeline.refs import ImageRef
    from dataset_format import catalog_schema, field_rows, fields
    from dataset_format.catalog_schema import CatalogRow

    root = photo_tree(n)
    work = tempfile.mkdtemp(prefix="bench-fields-")
    _, rich, _ = manifests(root, work)
    rows = [json.loads(line) for line in open(rich)]
    datas = [open(r["uri"], "rb").read() for r in rows]
    schema = fields.from_json(SCHEMA).with_classes({"tags": TAGS})
    plain_arrow, rich_arrow = catalog_schema.arrow_schema(), catalog_schema.arrow_schema(schema)

    # How the writer gets a record's field bytes: the per-schema encoder (fields.encoded),
    # and, as the baseline, ListFeatures (fields.features) encoded entry by entry.
    encoders = {"plain": None, "fields": fields.encoded, "listfeature": fields.features}
    if only:  # one of them alone (for an instruction count: see --only)
        encoders = {only: encoders[only]}
    elif writer_only:  # the writer as it is
        del encoders["listfeature"]

    def line_of(row, data, with_fields):  # the launcher's part: the row check, the line
        text = field_rows.row_text(schema, row)[0] if with_fields else None
        return ImageRef(row["uri"], row["uri"], row["label"], "train", len(data), "s",
                        fields=text).to_json()

    given = {w: [line_of(row, data, w) for row, data in zip(rows, datas)] for w in (False, True)}
    converted = [images.convert(data) for data in datas] if writer_only else None

    def one_pass(name):
        encode = encoders[name]
        with_fields = encode is not None
        catalog_rows = []
        start = time.process_time()
        for i, (row, data) in enumerate(zip(rows, datas)):
            line = given[with_fields][i] if writer_only else line_of(row, data, with_fields)
            ref = ImageRef.from_json(line)
            encoded = converted[i] if writer_only else images.convert(data)
            values = fields.values_from_text(ref.fields) if with_fields else None
            extra = encode(schema, values) if with_fields else None
            parts, length = records.example_parts(encoded, 0, ref.label, ref.key, None, extra)
            catalog_rows.append(CatalogRow(key=ref.key, label=ref.label, length=length,
                                           fields=values).to_dict())
        pa.Table.from_pylist(catalog_rows, schema=rich_arrow if with_fields else plain_arrow)
        return 1000 * (time.process_time() - start) / len(rows)

    got = {name: [] for name in encoders}
    for name in encoders:  # imports and caches warm (the first pass costs ~1 ms an image more)
        one_pass(name)
    for _ in range(rounds):
        for name in encoders:
            got[name].append(one_pass(name))
    medians = {k: statistics.median(v) for k, v in got.items()}
    print(f"{len(rows)} photos, {rounds} alternating rounds: CPU ms per image")
    for k, v in medians.items():
        print(f"{k:11} {v:7.3f}  (rounds: {', '.join(f'{x:.3f}' for x in got[k])})")
    if only:
        return {"cpu_ms_per_image": medians, "rounds": got}
    ratios = {}
    for k in encoders.keys() - {"plain"}:
        ratios[k] = medians[k] / medians["plain"]
        print(f"{k} / plain: {ratios[k]:.3f} (+{medians[k] - medians['plain']:.3f} ms)")
    return {"cpu_ms_per_image": medians, "rounds": got, "ratio": ratios["fields"],
            "ratio_listfeature": ratios.get("listfeature")}


def launcher(n, rounds):
    """Per image CPU ms of the launcher's planning of a first build, without and with the
    three fields (see --launcher)."""
    import shutil
    import time

    sys.path.insert(0, REPO)
    from beam_pipeline.launcher import checks, options as opts, prepare

    work = tempfile.mkdtemp(prefix="bench-fields-")
    plain, rich, schema = manifests(photo_tree(n), work)

    def once(with_fields):
        out = tempfile.mkdtemp(prefix="bench-fields-out-")
        try:
            pipeline_options, build = opts.parse(
                ["--config", os.path.join(REPO, "configs", "local.yaml"), "--input",
                 rich if with_fields else plain, "--output", os.path.join(out, "ds")]
                + (["--schema", schema] if with_fields else []))
            root = checks.preflight(pipeline_options, build)
            start = time.process_time()
            prepare.prepare(build, root)
            return 1000 * (time.process_time() - start) / n
        finally:
            shutil.rmtree(out, ignore_errors=True)

    once(False), once(True)  # imports and caches warm
    got = {"plain": [], "fields": []}
    for _ in range(rounds):
        got["plain"].append(once(False))
        got["fields"].append(once(True))
    medians = {k: statistics.median(v) for k, v in got.items()}
    print(f"{n} photos, {rounds} alternating rounds: launcher CPU ms per image")
    for k, v in medians.items():
        print(f"{k:8} {v:7.4f}  (rounds: {', '.join(f'{x:.4f}' for x in got[k])})")
    print(f"fields - plain: +{medians['fields'] - medians['plain']:.4f} ms")
    return {"cpu_ms_per_image": medians, "rounds": got}


def side_by_side(sizes, rounds, writer_n, workers=0):
    """Whole builds of the manifest without and with the three fields, alternating, at two
    sizes a round (see --side): per round each program's CPU per image (the slope between
    the sizes: start-up cancels) and their ratio; then, in the same run, the launcher's and
    the writer's per-image CPU without and with the fields, as shares of the plain build's.
    `workers`: --direct_num_workers for both programs (0: the config's, a thread per core)."""
    small, large = sizes
    inputs = {}
    engine = ["--direct_num_workers", str(workers)] if workers else []
    for n in sizes:
        work = tempfile.mkdtemp(prefix="bench-fields-")
        plain, rich, schema = manifests(photo_tree(n), work)
        inputs[n] = {"plain": build_command_of(plain, *engine), "fields": build_command_of(
            rich, "--schema", schema, *engine)}
    cpu = {name: {n: [] for n in sizes} for name in ("plain", "fields")}
    slopes = {"plain": [], "fields": []}
    ratios = []
    for r in range(rounds):
        order = ("plain", "fields") if r % 2 == 0 else ("fields", "plain")  # neither always first
        for n in sizes:
            for name in order:
                cpu[name][n].append(measure(inputs[n][name], 1)["cpu"])
        for name in slopes:
            slopes[name].append(1000 * (cpu[name][large][-1] - cpu[name][small][-1])
                                / (large - small))
        ratios.append(slopes["fields"][-1] / slopes["plain"][-1])
        print(f"round {r + 1}: CPU ms/image plain {slopes['plain'][-1]:.3f} fields "
              f"{slopes['fields'][-1]:.3f} ratio {ratios[-1]:.3f}", flush=True)
    whole = {name: statistics.median(v) for name, v in slopes.items()}
    # every round's CPU pooled: the sums' slopes (a round's outlier weighs what its CPU does)
    pooled = (sum(cpu["fields"][large]) - sum(cpu["fields"][small])) / (
        sum(cpu["plain"][large]) - sum(cpu["plain"][small]))
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    at_large = {name: statistics.median(cpu[name][large]) for name in cpu}
    print(f"\nwhole builds, photos {small} and {large}, {rounds} alternating rounds, CPU of "
          "the process tree:")
    print(f"  CPU ms per image (slope): plain {whole['plain']:.3f}, fields {whole['fields']:.3f}")
    print(f"  fields / plain per image: median of the rounds' ratios "
          f"{statistics.median(ratios):.3f} (quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}, "
          f"rounds {min(ratios):.3f}-{max(ratios):.3f}); of the median slopes "
          f"{whole['fields'] / whole['plain']:.3f}; of every round's CPU pooled {pooled:.3f}")
    print(f"  whole build at {large} (start-up included): plain {at_large['plain']:.2f} s, "
          f"fields {at_large['fields']:.2f} s, ratio {at_large['fields'] / at_large['plain']:.3f}")
    print("\nthe launcher alone (in this process):")
    launched = launcher(large, rounds)
    print("\nthe writer alone (in this process, from its listing line on, the image converted "
          "before the clock starts):")
    written = focused(writer_n, rounds, writer_only=True)
    shares = {}
    for part, got in (("launcher", launched), ("writer", written)):
        extra = got["cpu_ms_per_image"]["fields"] - got["cpu_ms_per_image"]["plain"]
        shares[part] = extra / whole["plain"]
    print(f"\nwhat the fields add, as a share of the plain build's {whole['plain']:.3f} ms an "
          f"image: launcher {shares['launcher']:+.1%}, writer {shares['writer']:+.1%}, "
          f"together {shares['launcher'] + shares['writer']:+.1%}; whole builds "
          f"{statistics.median(ratios) - 1:+.1%} (target: <= +10%: "
          f"{'PASS' if statistics.median(ratios) <= 1.10 else 'FAIL'})")
    return {"sizes": sizes, "cpu": cpu, "cpu_ms_per_image": slopes, "ratios": ratios,
            "ratio": statistics.median(ratios), "pooled": pooled, "quartiles": quartiles,
            "launcher": launched, "writer": written,
            "shares": shares}


def build_command_of(src, *extra):
    return lambda out: build_command(src, out, *extra)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--focused", type=int, default=0, metavar="N",
                        help="measure what fields add to one image's work on N photos")
    parser.add_argument("--launcher", type=int, default=0, metavar="N",
                        help="measure what fields add to the launcher's planning on N photos")
    parser.add_argument("--side", action="store_true",
                        help="whole builds without and with the fields, alternating rounds at "
                             "--sizes, then the launcher's and the writer's shares")
    parser.add_argument("--writer_photos", type=int, default=500,
                        help="--side: photos of the writer's in-process measurement")
    parser.add_argument("--workers", type=int, default=0,
                        help="--side: --direct_num_workers of both builds (0: the config's, "
                             "a thread per core; 1: one thread, no contention for the GIL "
                             "between two writers)")
    parser.add_argument("--only", choices=("plain", "fields", "listfeature"),
                        help="--focused: that program alone, e.g. under valgrind --tool="
                             "callgrind for its instruction count (the difference between "
                             "two programs' counts is what one costs more; load moves neither)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="--focused, --launcher, --side: alternating rounds")
    parser.add_argument("--sizes", default="250,1000",
                        help="two photo counts: CPU per image is the slope between them")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--base", help="a checkout of the code before fields")
    add_record_argument(parser)
    args = parser.parse_args()
    record = Record("bench_fields", args)
    if args.focused:
        record.save({"focused": focused(args.focused, args.rounds, args.only)})
        return
    if args.launcher:
        record.save({"launcher": launcher(args.launcher, args.rounds)})
        return
    if args.side:
        sizes = [int(v) for v in args.sizes.split(",")]
        record.save({"side": side_by_side(sizes, args.rounds, args.writer_photos,
                                          args.workers)})
        return
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
