"""Which published example each listed image is: sticky splits and change detection.

A split belongs to content, for life. What decides an image's split, in order:
    1. a split folder or manifest column (the user's own choice);
    2. its key, when the previous version held that key with the same bytes;
    3. its bytes, when any version since the last --resplit published them: the previous
       version's record of them (the same file, else the same class/name, name, first key),
       else the split map (store/split_map.py: every content ever published);
    4. new content: its key's hash, by --splits.
So a rename, a renumbering, a swap, a restore or a night the image was missing (a read
failure, a leak exclusion) never moves published bytes; a key whose bytes changed is new
content unless its new bytes were published before. A content published now may reuse or
re-frame the previous version's record of the same bytes; a content only older versions
held is converted again. So a version equals a full build of the same files with the same
split map.

Change detection, for a key the previous version holds:
    same size and stamp (mtime_ns:ctime_ns; a gs:// generation) -> same bytes, not read
    same size, another stamp, both with the listing's md5       -> md5 decides, not read
    same size, another stamp                                    -> read and hashed
    another size                                                -> changed
For a new or changed key, a gs:// input and a stored one that both carry the listing's
md5Hash are matched by (md5, size) without a download, and so is a gs:// input and a
content the split map knows the md5 of; otherwise only a size some published input had
(without a known md5, for an input with one) is worth hashing. So a gs:// night reads no
input to decide identity unless the root once published local files or composite objects
(no md5) of the same size. --verify_inputs hashes every input whatever its stamp or md5.
Streams and external sorts only: the split map is asked about the new or changed keys in
one pass over it, and looked up by sha256 in a merge join (store/split_map_file.py). The
previous catalog is spilled as compact records, not rows (previous.py), and the rows an
image keeps are read back from catalog.parquet by row number when the plan
asks for them (Resolved.refs).

Why the md5 is enough: see same_bytes.py.
"""

import collections
import dataclasses
import enum
import json
from json.encoder import encode_basestring_ascii as json_string  # = json.dumps(a str)

from beam_pipeline.launcher import rules
from beam_pipeline.launcher.previous import (CatalogRows, Previous, RowList, Stored,
                                             fields_digest)
from beam_pipeline.launcher.same_bytes import (  # noqa: F401 (input_sha256: tests)
    by_content, by_md5, first_match, hashed, input_sha256)
from beam_pipeline.refs import (LINE_FIELDS, LINE_KEY, LINE_LABEL, LINE_SHA256, LINE_SIZE,
                                LINE_SPLIT, LINE_STAMP, LINE_URI, ImageRef, Listed,
                                StoredFrame)
from beam_pipeline.algorithms import fast_json
from beam_pipeline.algorithms.buckets import NumberedSpill
from beam_pipeline.algorithms.spill import SortedSpill, join_sorted
from beam_pipeline.store import split_map as split_maps
from dataset_format import layout

class Became(enum.StrEnum):
    """What a listed key became against the previous version (Resolved.counts' keys,
    printed and JSON-encoded as the words)."""

    UNCHANGED = "unchanged"  # same key, same bytes, label and split
    CHANGED = "changed"      # same key; new bytes, or a new label, split or field values
    ADDED = "added"          # new content, split by its key's hash
    MOVED = "moved"          # a stored input's bytes under a new key
    RESTORED = "restored"    # bytes an older version published
    REMOVED = "removed"      # a stored key no longer listed


KINDS = tuple(Became)


@dataclasses.dataclass(frozen=True)
class _Outcomes:
    """What a key that _new_keys resolves becomes: its bytes match a stored input
    (`matched`), bytes some version published (`published`), or nothing (`new`)."""

    matched: Became
    published: Became
    new: Became

    @property
    def new_key(self):  # a key the previous version did not have (else: its bytes changed)
        return self.matched is Became.MOVED


class Sized:
    """`num_images` and `num_bytes` of a value with `per_split` ({split: [count, bytes]}):
    Resolved, and resume's Remainder (the images no taken shard holds)."""

    @property
    def num_images(self):
        return sum(c for c, _ in self.per_split.values())

    @property
    def num_bytes(self):
        return sum(b for _, b in self.per_split.values())


@dataclasses.dataclass
class Resolved(Sized):
    """Every listed image with its final split, and the previous record it may reuse."""

    # Images with a stored record, by previous catalog row number (so their rows are read
    # back in one pass over catalog.parquet): (number, text), the text ImageRef JSON, or the
    # listing line as listed and "[split, input sha256]" the line takes (`add_listed`),
    # then KEPT when identity found the image unchanged (its record reused as it is).
    numbered: NumberedSpill
    # The others, in key order: (key JSON, ImageRef JSON).
    by_key: SortedSpill
    per_split: dict = dataclasses.field(default_factory=dict)  # split -> [count, bytes]
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    rows: object = None           # previous.CatalogRows / RowList: the rows numbered

    @classmethod
    def empty(cls, spill_dir, rows=None):
        return cls(numbered=NumberedSpill(spill_dir), by_key=SortedSpill(spill_dir), rows=rows)

    def changed(self):
        """Whether the listing differs from the previous version's examples at all."""
        return any(self.counts[k] for k in KINDS if k != Became.UNCHANGED)

    def refs(self, columns=None):
        """(ImageRef with its split, previous catalog row dict or None): images with a
        stored record in catalog order, then the others in key order. `columns`: only
        those of the rows (previous.CatalogRows.full); None: every one."""
        for line, _, row in self.numbered_lines(columns):
            yield ImageRef.from_json(line), row

    def ref_lines(self, columns=None):
        """(ImageRef JSON, previous catalog row dict or None), in refs() order."""
        for line, _, row in self.numbered_lines(columns):
            yield line, row

    def numbered_lines(self, columns=None):
        """(ImageRef JSON, previous catalog row number or None, row or None), in refs()
        order."""
        for text, number, row, _ in self._read(columns, False):
            if "\t" in text:  # as listed, and its split and sha256
                yield fast_json.dumps(_listed_fields(text)), number, row
            else:
                yield text, number, row

    def plan_fields(self, columns):
        """(ImageRef.to_json's parsed list, row number or None, row or None, file or None),
        in refs() order, for the incremental plan: an image identity found unchanged (its
        record reused as it is) comes with its previous shard file and no row, so its
        columns are not read back; another with a stored record with `columns` of its row.
        Reading back the plan's columns of every kept row, a dict each, was a third of a
        later night's plan (1M objects: 10.8 of its 23 s under cProfile)."""
        for text, number, row, file in self._read(columns, True):
            yield (_listed_fields(text) if "\t" in text else fast_json.loads(text), number,
                   row, file)

    def _read(self, columns, kept_apart):
        """(numbered text without KEPT, number, row, file): the kept images' files and no
        row when `kept_apart`, else every row with `columns`; then the others."""
        if self.rows is not None and len(self.numbered):
            waiting = collections.deque()

            def numbers():
                for number, text in self.numbered:
                    kept = text.endswith(KEPT)
                    waiting.append(text[:-len(KEPT)] if kept else text)
                    yield number, not (kept and kept_apart)

            wanted = numbers()
            if kept_apart:
                for number, row, file in self.rows.by_number(wanted, columns):
                    yield waiting.popleft(), number, row, None if row is not None else file
            else:
                for number, row in self.rows.full((n for n, _ in wanted), columns):
                    yield waiting.popleft(), number, row, None
            if waiting or next(wanted, None) is not None:
                raise RuntimeError("resolved images name rows past the end of the previous "
                                   "catalog")
        yield from ((line, None, None, None) for _, line in self.by_key)

    def add(self, ref, row, kind):
        """One resolved image; `row`: the previous catalog row number to reuse, or None."""
        self.add_line(ref.key, ref.split, ref.size, ref.to_json(), row, kind)

    def add_line(self, key, split, size, ref_json, row, kind):
        """add() for an ImageRef already in JSON (with its split). Unchanged with a row:
        its record is reused as it is (incremental.kept_as_is holds of it)."""
        self._count(split, size, kind)
        if row is None:
            self.by_key.add(json_string(key), ref_json)
        else:  # a record to reuse or re-frame
            self.counts["stored"] += 1
            self.numbered.add(row, ref_json + KEPT if kind is Became.UNCHANGED else ref_json)

    def add_listed(self, line, split, sha256, size, row, kind):
        """add_line() of an image with a stored record (`row`), given as its listing line
        as listed and the split and sha256 it takes: the ImageRef JSON is made only if a
        plan asks for the text (numbered_lines; the incremental plan parses the line
        anyway). Dumping it here cost a later night ~1 µs an image: ~10 s of one core at 10M."""
        self._count(split, size, kind)
        self.counts["stored"] += 1
        sha = "null" if sha256 is None else json_string(sha256)
        text = f"{line}\t[{json_string(split)}, {sha}]"
        self.numbered.add(row, text + KEPT if kind is Became.UNCHANGED else text)

    def _count(self, split, size, kind):
        counts = self.per_split.setdefault(split, [0, 0])
        counts[0] += 1
        counts[1] += size
        self.counts[kind] += 1


KEPT = "\tkept"  # ends a numbered line identity found unchanged (JSON text holds no tab)


def _listed_fields(text):
    """A numbered text "listing line<TAB>[split, sha256]" -> ImageRef.to_json's list."""
    line, _, taken = text.partition("\t")
    fields = fast_json.loads(line)
    fields[LINE_SPLIT], fields[LINE_SHA256] = fast_json.loads(taken)
    return fields


def resolve(by_key, rows, splits, spill_dir, reuse=True, verify=False, split_map=None):
    """Listed refs (key order; split only where fixed) + the previous catalog's rows and
    the root's split map -> Resolved.

    `rows`: previous.CatalogRows (the catalog, read again by row number), or the rows as
    dicts. rows and split_map both None: no history (a new root, --resplit). rows None with a map:
    the previous catalog is unreadable, so nothing is reused and inputs are hashed to find
    their splits. A map None with rows: the rows' own (a version written before split maps).
    `reuse`: the previous records may be reused (same options and software); otherwise
    rows still give splits but no record is offered. `verify`: hash every input.
    """
    if rows is None and split_map is None:
        return _all_added(Resolved.empty(spill_dir), by_key, splits)
    if not isinstance(rows, CatalogRows):
        rows = RowList(() if rows is None else rows)
    if split_map is None:
        split_map = split_maps.from_rows(row for _, row in rows.identity())
    out = Resolved.empty(spill_dir, rows)
    previous = Previous(spill_dir, rows)
    with (previous, SortedSpill(spill_dir) as orphans, SortedSpill(spill_dir) as changed,
          SortedSpill(spill_dir) as rehash):
        for _, line, old in join_sorted(by_key, previous.by_key):
            if line is None:
                out.counts[Became.REMOVED] += 1
                continue
            fields = fast_json.loads(line)  # ImageRef.to_json's list
            if old is None:
                orphans.add(json_string(fields[LINE_URI]), line)
                continue
            row = Stored._make(fast_json.loads(old))
            if (verify or fields[LINE_SIZE] != row.input_size
                    or fields[LINE_STAMP] != row.input_stamp):
                # not the same file, as _verdict says first: most of a night's 10M keys are,
                # and skip building its Listed and calling _verdict (~1 µs)
                ref = Listed._make(fields)  # its fields by name; no ImageRef built
                verdict = _verdict(ref, row, verify)
                if verdict is HASH:
                    rehash.add(json_string(ref.key), f"[{line},{old}]")
                    continue
                if verdict is OTHER:  # other bytes, which may have been published before
                    changed.add(json_string(ref.uri), line)
                    continue
            # the same bytes (the same file, or the same size and md5)
            split = fields[LINE_SPLIT] or row.split
            listed = fields[LINE_FIELDS] if len(fields) > LINE_FIELDS else None
            kind = _same_values(fields[LINE_LABEL], split, listed, row)
            if reuse:
                out.add_listed(line, split, row.input_sha256, row.input_size, row.row, kind)
            else:
                fields[LINE_SPLIT], fields[LINE_SHA256] = split, row.input_sha256
                out.add_line(fields[LINE_KEY], split, row.input_size, fast_json.dumps(fields),
                             None, kind)
        for (ref, row), same in _hashed_pairs(out, rehash):
            if same:
                ref = dataclasses.replace(ref, split=ref.split or row.split)
                out.add(ref, row.row if reuse else None, _same_bytes(ref, row))
            elif ref.sha256 is None:  # unreadable now: the job rejects it, saying why
                _unknown(out, ref, splits, Became.CHANGED)
            else:
                changed.add(json_string(ref.uri), ref.to_json())
        for spill, outcomes in ((orphans, NEW), (changed, CHANGED)):
            if len(spill):
                _new_keys(out, spill, outcomes, previous, split_map, splits, spill_dir=spill_dir,
                          reuse=reuse, verify=verify)
    return out


def _all_added(out, by_key, splits):
    """No split map (a new root, --resplit): every image is new content, split by its key
    hash unless fixed. What the join below finds without previous rows, with one JSON
    parse per image instead of a dozen JSON round trips and three spills."""
    for _, line in by_key:
        fields = json.loads(line)  # ImageRef.to_json's list (refs.LINE_* positions)
        if fields[LINE_SPLIT] is None:
            fields[LINE_SPLIT] = rules.assign_split(fields[LINE_KEY], splits)
            line = json.dumps(fields)
        out.add_line(fields[LINE_KEY], fields[LINE_SPLIT], fields[LINE_SIZE], line, None,
                     Became.ADDED)
    return out


def _same_bytes(ref, row):
    """Same key, same bytes: unchanged, or changed when its label, split or declared fields
    moved (a manifest row relabelled, a caption or box edited: its record is then
    re-framed)."""
    return _same_values(ref.label, ref.split, ref.fields, row)


def _same_values(label, split, fields, row):
    """_same_bytes of a ref's label, split and declared fields."""
    same = (label == row.label and split == row.split
            and (fields_digest(fields) if fields else None) == row.fields)
    return Became.UNCHANGED if same else Became.CHANGED


HASH, SAME, OTHER = "hash", "same", "other"  # _verdict's answers


def _verdict(ref, row, verify):
    """A listed ref against the stored row of its key (or of its file) -> HASH: same size,
    and neither stamp nor md5 says (changed, or --verify_inputs): read it; SAME: same size
    and stamp (mtime_ns:ctime_ns, a gs:// generation), or same size and md5, both carrying
    the listing's md5Hash; OTHER: other bytes. One function a pair: the join's ~1M calls a
    night were four."""
    same_size = ref.size == row.input_size
    same_stamp = same_size and ref.stamp == row.input_stamp
    md5_decides = bool(ref.md5) and bool(row.input_md5)  # it tells same bytes from other
    if same_size and row.input_sha256 and (verify or not (same_stamp or md5_decides)):
        return HASH
    if same_stamp or (md5_decides and same_size and ref.md5 == row.input_md5):
        return SAME
    return OTHER


def _hashed_pairs(out, spill):
    """A spill of [ref, Stored] pairs -> ((ref with its sha256, Stored), same bytes as the
    row's input?), inputs read HASH_THREADS at a time."""
    def items():
        for _, line in spill:
            fields, row = fast_json.loads(line)
            yield ImageRef.from_fields(fields), Stored(*row)

    for (ref, row), digest in hashed(items()):
        out.counts["hashed"] += 1
        ref = dataclasses.replace(ref, sha256=digest)
        yield (ref, row), digest is not None and digest == row.input_sha256


NEW = _Outcomes(Became.MOVED, Became.RESTORED, Became.ADDED)  # a new key
CHANGED = _Outcomes(Became.CHANGED, Became.CHANGED, Became.CHANGED)  # a key whose bytes changed


def _new_keys(out, refs, outcomes, previous, smap, splits, *, spill_dir, reuse, verify):
    """New keys, or keys whose bytes changed (`refs`, by uri) -> their splits: the same
    file as a stored input under a new key (an input added or removed, a manifest renamed),
    or bytes some version published (moved, renamed, renumbered, swapped, relabelled,
    copied, restored) keep the split those bytes were published in; new content is split
    by its key hash."""
    def moved(ref, row, _=None):
        """`row`: a Stored, or a by-content spill's {"key", "at"} (same_bytes: the ref's
        sha256 set when it was hashed, else None: the record's)."""
        if not isinstance(row, Stored):
            row = previous.record(row["at"])
        out.add(dataclasses.replace(ref, split=ref.split or row.split,
                                    sha256=ref.sha256 or row.input_sha256),
                row.row if reuse else None, outcomes.matched)

    asked = smap.probe(*_map_questions(refs, verify))  # one pass over the map, not held
    wanted = _wanted(refs, verify) if len(refs) <= FILTER_MAX else None
    if wanted is None:
        by_uri, sizes, by_sha, stored_md5, md5_less = previous.others()
    else:
        by_uri, stored_md5 = previous.matching(*wanted)
    with SortedSpill(spill_dir) as rest, SortedSpill(spill_dir) as rehash:
        for line, at in first_match(refs, by_uri):  # 1. the same file
            ref, row = ImageRef.from_json(line), at and previous.record(at)
            verdict = _verdict(ref, row, verify) if outcomes.new_key and row else OTHER
            if verdict is HASH:
                rehash.add(json_string(ref.uri), f"[{ref.to_json()},{json.dumps(row)}]")
            elif verdict is SAME:
                moved(dataclasses.replace(ref, sha256=row.input_sha256), row)
            else:
                rest.add(f"{ref.size:020d}", line)
        for (ref, row), same in _hashed_pairs(out, rehash):
            if same:
                moved(ref, row)
            elif ref.sha256 is None:
                _unknown(out, ref, splits, outcomes.new)
            else:
                rest.add(f"{ref.size:020d}", ref.to_json())
        plain, missed = by_md5(rest, stored_md5, spill_dir, moved, verify)
        if wanted is not None:
            sizes, by_sha, md5_less = previous.by_size(_sizes(plain), _sizes(missed))
        with plain, missed, by_content(out, [(plain, sizes), (missed, md5_less)], by_sha,
                                        spill_dir, moved, _worth_hashing(asked, verify)
                                        ) as unmatched:
            with SortedSpill(spill_dir) as by_digest:  # 3. bytes only older versions
                for _, line in unmatched:            # held, or new content
                    by_digest.add(fast_json.loads(line)[LINE_SHA256] or "", line)
                for line, known in smap.splits_of(by_digest):  # a merge join with the map
                    ref = ImageRef.from_json(line)
                    known = known or (None if verify else asked.split_of_md5(ref.md5, ref.size))
                    out.add(dataclasses.replace(
                        ref, split=ref.split or known or rules.assign_split(ref.key, splits)),
                        None, outcomes.published if known else outcomes.new)


FILTER_MAX = 200_000  # new or changed keys up to which the stored rows spilled for them
                      # are only those they could match (~40 MB of sets at the most)


def _wanted(refs, verify):
    """New or changed keys (a spill of ImageRef JSON) -> (their uris, their (md5, size as
    20 digits) keys): the stored rows they can match by file or by md5."""
    uris, md5s = set(), set()
    for _, line in refs:
        ref = Listed._make(fast_json.loads(line))
        uris.add(ref.uri)
        if ref.md5 and not verify:
            md5s.add((ref.md5, f"{ref.size:020d}"))
    return uris, md5s


def _map_questions(refs, verify):
    """New or changed keys (a spill of ImageRef JSON) -> what the split map is asked of
    them: ((md5, size) of those with a listing md5, unless verify; every size)."""
    md5s, sizes = set(), set()
    for _, line in refs:
        ref = Listed._make(fast_json.loads(line))
        sizes.add(ref.size)
        if ref.md5 and not verify:
            md5s.add((ref.md5, ref.size))
    return md5s, sizes


def _sizes(spill):
    """A spill keyed by size (20 digits) -> its sizes, as ints."""
    return {int(size) for size, _ in spill}


def _worth_hashing(smap, verify):
    """ref -> whether to hash it to look its content up in the split map: a ref with the
    listing's md5 is found by it (no read) unless the map knows its size only without an
    md5 (a content published from a local file or a composite object, or before maps
    carried md5s); a ref without one (local, composite) has a size some content had."""
    def worth(ref):
        if ref.md5 and not verify:
            return (smap.split_of_md5(ref.md5, ref.size) is None
                    and smap.has_size_without_md5(ref.size))
        return smap.has_size(ref.size)
    return worth


def _unknown(out, ref, splits, kind):
    """A ref whose bytes could not be read for hashing: new content as far as we know."""
    out.add(dataclasses.replace(ref, split=ref.split or rules.assign_split(ref.key, splits)),
            None, kind)


FRAME_COLUMNS = ("file", "offset", "length", "phash", "phash_center", "near_descriptor")


def stored_frame(previous_vdir, row):
    """A previous catalog row (FRAME_COLUMNS of it at least) -> where its record's frame
    is."""
    return StoredFrame(layout.shard_file(previous_vdir, row["file"]), row["offset"], row["length"],
                       row.get("phash"), row.get("phash_center"), row.get("near_descriptor"))


@dataclasses.dataclass(frozen=True)
class IdentityConfig:
    """What the identity stage needs of the build options."""

    splits: tuple          # parsed --splits: (name, fraction) pairs
    reuse: bool            # the previous version's records may be reused (policy.can_reuse)
    verify: bool = False   # --verify_inputs: hash every input
    resplit: bool = False  # --resplit: no split map, no previous splits
    stale: frozenset = frozenset()  # previous fields removed or retyped (fields.stale_fields)


def resolve_listing(listing, past, config, spill_dir):
    """The identity stage: the listing's refs (by key) against what the build starts from
    (history.History: the previous catalog when intact, the split map) -> Resolved."""
    rows = (CatalogRows(past.catalog, config.stale) if past.catalog and not config.resplit
            else None)
    return resolve(listing.by_key, rows, config.splits, spill_dir, reuse=config.reuse,
                   verify=config.verify, split_map=past.split_map)
