"""Which published example each listed image is: sticky splits and change detection.

Identity is the key. A key the previous version does not hold is matched by content: the
sha256 of its input bytes against the catalog's input_sha256. A matched image keeps the
split it was published in (a split folder or manifest column, the user's own choice,
wins) and may be re-framed from its stored record; new content is split by its key hash.
So a version equals a full build of the same files with the same split map.

Change detection, for a key the previous version holds:
    same size and stamp (mtime_ns:ctime_ns; a gs:// generation) -> same bytes, not read
    same size, another stamp                                    -> read and hashed
    another size                                                -> changed
For a new key, only a size some stored input has is worth hashing. --verify_inputs hashes
every input whatever its stamp. Streams and external sorts only: flat memory.
"""

import collections
import dataclasses
import hashlib
import itertools
import json
from json.encoder import encode_basestring_ascii as json_string  # = json.dumps(a str)

from beam_pipeline.launcher import plan
from beam_pipeline.refs import ImageRef, StoredFrame
from beam_pipeline.algorithms.spill import SortedSpill
from dataset_format import layout

HASH_THREADS = 16  # inputs read at once to hash them (gs:// latency)
KINDS = ("unchanged", "changed", "added", "moved", "removed")


@dataclasses.dataclass
class Resolved:
    """Every listed image with its final split, and the previous record it may reuse."""

    by_key: SortedSpill           # (key, [ImageRef fields, previous catalog row or None])
    per_split: dict = dataclasses.field(default_factory=dict)  # split -> [count, bytes]
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    @property
    def num_images(self):
        return sum(c for c, _ in self.per_split.values())

    @property
    def num_bytes(self):
        return sum(b for _, b in self.per_split.values())

    def changed(self):
        """Whether the listing differs from the previous version's examples at all."""
        return any(self.counts[k] for k in KINDS if k != "unchanged")

    def refs(self):
        """(ImageRef with its split, previous catalog row dict or None), in key order."""
        for _, line in self.by_key:
            fields, row = json.loads(line)
            yield ImageRef.from_fields(fields), row

    def ref_lines(self):
        """(ImageRef JSON, previous catalog row dict or None), in key order: an image with no
        row is passed on as the text it was spilled as, never parsed."""
        for _, line in self.by_key:
            if line.endswith(NO_ROW):  # a row is a JSON object: its line ends with "}]"
                yield line[1:-len(NO_ROW)], None
            else:
                fields, row = json.loads(line)
                yield ImageRef.from_fields(fields).to_json(), row

    def add(self, ref, row, kind):
        """One resolved image; `row`: the previous catalog row's JSON text, or None."""
        self.add_line(ref.key, ref.split, ref.size, ref.to_json(), row, kind)

    def add_line(self, key, split, size, ref_json, row, kind):
        """add() for an ImageRef already in JSON (with its split)."""
        counts = self.per_split.setdefault(split, [0, 0])
        counts[0] += 1
        counts[1] += size
        self.counts[kind] += 1
        self.counts["stored"] += row is not None  # a record to reuse or re-frame
        self.by_key.add(json_string(key), f"[{ref_json},{row or 'null'}]")


NO_ROW = ",null]"  # the end of a Resolved line without a previous row


SUFFIX_DEPTHS = (2, 1)  # same bytes: prefer the row with the same class/name, then name


def resolve(by_key, rows, splits, spill_dir, reuse=True, verify=False):
    """Listed refs (key order; split only where fixed) + the previous catalog's rows (None:
    no split map, e.g. a new root or --resplit) -> Resolved.

    `reuse`: the previous records may be reused (same options and software); otherwise
    rows still give splits but no record is offered. `verify`: hash every input.
    """
    out = Resolved(by_key=SortedSpill(spill_dir))
    if rows is None:
        return _all_added(out, by_key, splits)
    previous = _Previous(spill_dir, rows)
    with previous, SortedSpill(spill_dir) as orphans, SortedSpill(spill_dir) as rehash:
        for _, line, old in join_by_key(by_key, previous.by_key):
            if line is None:
                out.counts["removed"] += 1
                continue
            ref = plan.Listed._make(json.loads(line))  # its fields; no ImageRef built
            if old is None:
                orphans.add(json_string(ref.uri), line)
                continue
            row = json.loads(old)
            split = ref.split or row["split"]
            if reuse and _must_hash(ref, row, verify):
                rehash.add(json_string(ref.key), f"[{line},{old}]")
            elif _same_stamp(ref, row):
                ref = ref._replace(split=split, sha256=row.get("input_sha256"))
                out.add_line(ref.key, split, ref.size, json.dumps(ref), old if reuse else None,
                             _same_bytes(ref, row))  # a Listed is a tuple: the same JSON
            else:
                out.add_line(ref.key, split, ref.size, json.dumps(ref._replace(split=split)),
                             None, "changed")
        for (ref, row, old), same in _hashed_pairs(out, rehash):
            ref = dataclasses.replace(ref, split=ref.split or row["split"])
            out.add(ref, old if same else None, _same_bytes(ref, row) if same else "changed")
        if len(orphans):
            _new_keys(out, orphans, previous, splits, spill_dir, reuse, verify)
    return out


def _all_added(out, by_key, splits):
    """No split map (a new root, --resplit): every image is new content, split by its key
    hash unless fixed. What the join below finds without previous rows, with one JSON
    parse per image instead of a dozen JSON round trips and three spills."""
    for _, line in by_key:
        fields = json.loads(line)  # ImageRef.to_json's list: key, uri, label, split, size, …
        if fields[3] is None:
            fields[3] = plan.assign_split(fields[0], splits)
            line = json.dumps(fields)
        out.add_line(fields[0], fields[3], fields[4], line, None, "added")
    return out


class _Previous:
    """The previous catalog's rows, spilled by key; by uri, size and content only when
    some listed key is new (`others`)."""

    def __init__(self, spill_dir, rows):
        self.spill_dir, self.spills = spill_dir, []
        self.by_key = self._spill()
        for row in rows or ():
            self.by_key.add(json_string(row["key"]), json.dumps(row))

    def _spill(self):
        self.spills.append(SortedSpill(self.spill_dir))
        return self.spills[-1]

    def others(self):
        """-> (by uri, sizes, by input sha256) spills, built from by_key once."""
        if not hasattr(self, "by_uri"):
            self.by_uri, self.sizes, self.by_sha = self._spill(), self._spill(), self._spill()
            for _, line in self.by_key:
                row = json.loads(line)
                self.by_uri.add(json_string(row["uri"]), line)
                self.sizes.add(f"{row['input_size']:020d}", "")
                if row.get("input_sha256"):
                    self.by_sha.add(row["input_sha256"], line)  # ties: by row text ~ key
        return self.by_uri, self.sizes, self.by_sha

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for spill in self.spills:
            spill.close()


def suffix(key, depth):
    """The key's last `depth` path components (class/name, name)."""
    return "/".join(key.split("/")[-depth:])


def _same_bytes(ref, row):
    """Same key, same bytes: unchanged, or changed when its label or split moved (a manifest
    row relabelled: its record is then re-framed)."""
    return "unchanged" if (ref.label, ref.split) == (row["label"], row["split"]) else "changed"


def _same_stamp(ref, row):
    return ref.size == row["input_size"] and ref.stamp == row.get("input_stamp")


def _must_hash(ref, row, verify):
    """Same size, and a stamp that says nothing (changed, or --verify_inputs): read it."""
    return (ref.size == row["input_size"] and bool(row.get("input_sha256"))
            and (verify or not _same_stamp(ref, row)))


def _hashed_pairs(out, spill):
    """A spill of [ref, row] pairs -> ((ref with its sha256, row, row JSON), same bytes as
    the row's input?), inputs read HASH_THREADS at a time."""
    def items():
        for _, line in spill:
            fields, row = json.loads(line)
            yield ImageRef.from_fields(fields), row

    for (ref, row), digest in hashed(items()):
        out.counts["hashed"] += 1
        ref = dataclasses.replace(ref, sha256=digest)
        yield (ref, row, json.dumps(row)), digest is not None and digest == row["input_sha256"]


def _new_keys(out, orphans, previous, splits, spill_dir, reuse, verify):
    """New keys: a stored input's file under a new key (an input added or removed, a
    manifest renamed), or its bytes under a new name (moved, renamed, relabelled, copied),
    keeps its split; new content is split by the key hash."""
    def moved(ref, row, old):
        out.add(dataclasses.replace(ref, split=ref.split or row["split"]),
                old if reuse else None, "moved")

    by_uri, sizes, by_sha = previous.others()
    with SortedSpill(spill_dir) as rest, SortedSpill(spill_dir) as rehash:
        for line, old in first_match(orphans, by_uri):  # 1. the same file
            ref, row = ImageRef.from_json(line), old and json.loads(old)
            if row and _must_hash(ref, row, verify):
                rehash.add(json_string(ref.uri), f"[{ref.to_json()},{old}]")
            elif row and _same_stamp(ref, row):
                moved(dataclasses.replace(ref, sha256=row.get("input_sha256")), row, old)
            else:
                rest.add(f"{ref.size:020d}", line)
        for (ref, row, old), same in _hashed_pairs(out, rehash):
            if same:
                moved(ref, row, old)
            else:
                rest.add(f"{ref.size:020d}", ref.to_json())
        with _by_content(out, rest, sizes, by_sha, spill_dir, moved) as unmatched:
            for _, line in unmatched:  # 3. new content
                ref = ImageRef.from_json(line)
                out.add(dataclasses.replace(
                    ref, split=ref.split or plan.assign_split(ref.key, splits)), None,
                    "added")


def _by_content(out, rest, sizes, by_sha, spill_dir, moved):
    """2. The same bytes under a new name: refs of a size some stored input has are hashed
    and matched with the stored inputs of the same sha256 (the one with the same class/name,
    else name, else the first). -> a spill of the refs still unmatched."""
    unmatched, by_content = SortedSpill(spill_dir), SortedSpill(spill_dir)
    with by_content:
        def candidates():
            for line, size_seen in first_match(rest, sizes):
                ref = ImageRef.from_json(line)
                if size_seen is None:
                    unmatched.add("", line)
                elif ref.sha256 is not None:  # hashed already (the same file, new stamp)
                    by_content.add(ref.sha256, line)
                else:
                    yield ref, None

        for (ref, _), digest in hashed(candidates()):
            out.counts["hashed"] += 1
            if digest is None:  # unreadable: new content as far as we know; the job says why
                unmatched.add("", ref.to_json())
            else:
                by_content.add(digest, dataclasses.replace(ref, sha256=digest).to_json())
        groups = itertools.groupby(by_sha, key=lambda item: item[0])
        group_sha, rows = next(groups, (None, None))
        for sha, lines in itertools.groupby(by_content, key=lambda item: item[0]):
            while group_sha is not None and group_sha < sha:
                group_sha, rows = next(groups, (None, None))
            best = _best_rows(rows) if group_sha == sha else None
            for _, line in lines:
                ref = ImageRef.from_json(line)
                old = best and (best.get((2, suffix(ref.key, 2))) or
                                best.get((1, suffix(ref.key, 1))) or best[0])
                if old is None:
                    unmatched.add("", line)
                else:
                    moved(ref, json.loads(old), old)
    return unmatched


def _best_rows(rows):
    """The stored rows of one input sha256 -> {(depth, key suffix): first row, 0: first row}
    (one entry per distinct suffix: small unless the data is one image copied many times)."""
    best = {}
    for _, line in rows:
        key = json.loads(line)["key"]
        best.setdefault(0, line)
        for depth in SUFFIX_DEPTHS:
            best.setdefault((depth, suffix(key, depth)), line)
    return best


def join_by_key(new, old):
    """Two (key, line) streams sorted by key -> (key, new line or None, old line or None)."""
    new, old = iter(new), iter(old)
    a, b = next(new, None), next(old, None)
    while a is not None or b is not None:
        if b is None or (a is not None and a[0] < b[0]):
            yield a[0], a[1], None
            a = next(new, None)
        elif a is None or b[0] < a[0]:
            yield b[0], None, b[1]
            b = next(old, None)
        else:
            yield a[0], a[1], b[1]
            a, b = next(new, None), next(old, None)


def first_match(left, right):
    """Two (sort key, line) streams sorted by key -> (left line, the first right line with
    the same key, or None), one per left item."""
    right = iter(right)
    b = next(right, None)
    for key, line in left:
        while b is not None and b[0] < key:
            b = next(right, None)
        yield line, (b[1] if b is not None and b[0] == key else None)


def hashed(items, threads=HASH_THREADS):
    """(ImageRef, x) items -> ((ImageRef, x), sha256 of its input or None if unreadable),
    in order, reading `threads` inputs at a time."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        pending = collections.deque()
        for item in items:
            pending.append((item, pool.submit(input_sha256, item[0].uri)))
            if len(pending) > 2 * threads:
                item, future = pending.popleft()
                yield item, future.result()
        for item, future in pending:
            yield item, future.result()


def input_sha256(uri):
    """The sha256 of a file's bytes (read in 1 MiB pieces), or None when it cannot be read."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    digest = hashlib.sha256()
    try:
        with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except Exception:  # vanished since listing, or unreadable: the shard writer reports it
        return None
    return digest.hexdigest()


def stored_frame(previous_vdir, row):
    """A previous catalog row -> where its record's frame is."""
    return StoredFrame(layout.join(previous_vdir, row["file"]), row["offset"], row["length"],
                       row.get("phash"), row.get("phash_center"), row.get("near_descriptor"))
