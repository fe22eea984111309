"""What the launcher prints: the plan, progress while a local job runs, and the summary.

The lines it shares with tools/inspect_dataset.py are in beam_pipeline/manifest_text.py.
"""

import json
import sys
import threading
import time

from beam_pipeline.manifest_text import class_table, near_duplicates_line
from beam_pipeline.refs import split_order
from beam_pipeline.store import files, retention
from dataset_format import layout

# TensorFlow decodes a 4032x3024 JPEG in 31.7 ms here (19.5 ms even at ratio=8: entropy
# decoding dominates), so reader decode time follows the stored pixel count.
DECODE_NS_PER_PIXEL = 31.7e6 / (4032 * 3024)
BIG_SIDE, SUGGESTED_MAX_SIDE = 1024, 512


def print_up_to_date(root, version, why="fingerprint unchanged"):
    print(f"{root}: up to date (version {version}, {why}); "
          "nothing written. Use --force to rebuild.")


def print_plan(root, planned, notes=True):
    """The plan line (and the plan's notes, unless the summary will print them)."""
    spec = planned.spec
    print(f"Building {root} version {spec.version}: {planned.images} images "
          f"({planned.bytes / 2**20:.1f} MiB) in "
          f"{', '.join(f'{s}: {n} shard(s)' for s, n in sorted(spec.num_shards.items()))}; "
          f"{planned.rejected} rejected while listing, {spec.listed.duplicates} duplicate(s).",
          flush=True)
    for note in planned.notes if notes else ():
        print(f"  note: {note}", flush=True)


def print_summary(root, published, notes=()):
    """The summary of a published version: accounting, the class table, hints, errors,
    and the plan's `notes`."""
    manifest, vdir, seconds = published.manifest, published.version_dir, published.seconds
    acc = manifest["accounting"]
    print(f"\nPublished {manifest['name']} version {manifest['version']} in {seconds:.1f}s "
          f"({acc['written'] / max(seconds, 1e-9):.0f} img/s)")
    leaks = f" + leaks {acc['leaks']}" if acc.get("leaks") else ""
    print(f"  listed {acc['listed']} = written {acc['written']} + duplicates "
          f"{acc['duplicates']} + failed {acc['failed']}{leaks}")
    print("\n".join(class_table(manifest, split_order(manifest["splits"]))))
    inc = manifest.get("incremental")
    if inc:
        print(f"  incremental from {inc['from']}: {inc['unchanged']} unchanged, {inc['added']} "
              f"added, {inc['changed']} changed, {inc.get('moved', 0)} moved, {inc['removed']} "
              f"removed; shards: "
              f"{inc['reused']['shards']} reused, {inc['rewritten']['shards']} rewritten, "
              f"{inc['added_shards']['shards']} new; {inc['bytes_reused_share']:.0%} of the "
              "bytes reused")
    repaired = manifest.get("build", {}).get("repaired")
    lost = manifest["errors"]["by_reason"].get("damaged_record")
    if repaired or lost:
        print(f"  repaired: {repaired or 0} damaged record(s) of the previous version "
              f"converted again from their inputs" + (f"; {lost} rejected, their inputs "
                                                       "gone (errors.jsonl)" if lost else ""))
    for line in split_map_lines(manifest):
        print(f"  {line}")
    near = near_duplicates_line(manifest)
    if near:
        print(f"  {near}; see {vdir}/{manifest['near_duplicates']['path']}")
    hint = big_image_hint(manifest)
    if hint:
        print(f"  hint: {hint}")
    if manifest["errors"]["count"]:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(manifest["errors"]["by_reason"].items()))
        print(f"  rejected {manifest['errors']['count']} ({reasons}); see {vdir}/{layout.ERRORS}")
    for note in notes:
        print(f"  note: {note}")
    print(f"  files: {vdir}/ (readers take {root})")
    left = leftover_versions(root, manifest)
    if left:
        print(f"  warning: the cleanup could not delete version(s) {', '.join(left)} (a "
              "retention policy, or no delete permission?); published anyway, the next build "
              "tries again")


def leftover_versions(root, manifest):
    """Versions the commit's cleanup should have deleted and could not: what it would
    delete as of the manifest's writing (so not a version that only became due since)."""
    import datetime

    config = manifest.get("config", {})
    written = datetime.datetime.strptime(manifest["created_at"], "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc)
    return retention.prune(root, manifest["version"], config.get("keep_versions", 0),
                          config.get("keep_superseded_hours", retention.KEEP_SUPERSEDED_HOURS),
                          dry_run=True, now=written)


def split_map_lines(manifest):
    """The split map line, then the launcher's notes (damage found, --splits changed)."""
    entry = manifest.get("split_map")
    if not entry:
        return []
    since = f" since {entry['from']}" if entry.get("from") else ""
    return ([f"split map: {entry['contents']} published contents ({entry['added']} new"
             f"{since})"] + [f"note: {note}" for note in entry.get("notes", [])])


def big_image_hint(manifest):
    """A line for the summary when stored images are far larger than a training input."""
    side = (manifest.get("stored_images") or {}).get("median_longer_side")
    config = manifest.get("config") or {}
    if not side or side <= BIG_SIDE or config.get("max_side"):
        return None
    shrink = (SUGGESTED_MAX_SIDE / side) ** 2  # pixels, and roughly JPEG bytes, scale so
    total = sum(s["num_bytes"] for s in manifest["splits"].values())
    pixels = side * side * 3 / 4  # a 4:3 image
    before = pixels * DECODE_NS_PER_PIXEL / 1e6
    return (f"stored images are large (median longer side {side} px); --max_side "
            f"{SUGGESTED_MAX_SIDE} would store ~{1 / shrink:.0f}x fewer bytes "
            f"(~{total * shrink / 2**30:.2f} GiB instead of {total / 2**30:.2f} GiB) and cut "
            f"TensorFlow's decode from ~{before:.1f} ms to ~{before * shrink:.1f} ms per image "
            f"(estimated; decoding at a lower ratio saves little)")


class ProgressPrinter:
    """Sums the shard writers' progress files: images done of total, rate, ETA."""

    def __init__(self, directory, total, period=5.0):
        self.directory, self.total, self.period = directory, total, period
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self.start = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=2)

    def done(self):
        total = 0
        try:  # one listing, one GET per file
            found = files.objects(self.directory + "/*")
        except Exception:  # progress is a courtesy: a listing that fails costs a line
            return 0
        for p in found:
            try:
                total += json.loads(files.read_bytes(p))["done"]
            except Exception:
                pass
        return total

    def _loop(self):
        while not self.stop.wait(self.period):
            done, elapsed = min(self.done(), self.total), time.monotonic() - self.start
            if done < max(1, self.total // 100):
                continue
            rate = done / elapsed
            eta = (self.total - done) / rate if rate else float("inf")
            print(f"  {done}/{self.total} images, {rate:.0f} img/s, ETA {eta:.0f}s",
                  file=sys.stderr, flush=True)
