"""verify's record-level half: one shard read end to end, every frame and Example checked
against the manifest's entry, and its `.index` against the frames found (tools/verify.py
checks the rest: counts, sums and the files beside the shards). Files are read through
tools/verify_reads.py: an outage raises StorageUnavailable, never a problem of the file."""

import hashlib

import google_crc32c

from beam_pipeline.store import transient
from beam_pipeline.tools import verify_reads
from dataset_format import examples, fields, layout, schema
from dataset_format.frames import FrameError, crc32c_text, parse_index, read_frame

MAX_PROBLEMS_PER_FILE = 10   # a corrupt shard can fail every record; say so, not 10,000 times
CHUNK = 1 << 20


class _HashingReader:
    """A file wrapper that checksums (CRC-32C, and sha256 when `sha256`: a shard of a version
    written before shards had a CRC-32C) and counts every byte read through it."""

    def __init__(self, f, sha256=False):
        self.f, self.crc, self.size = f, 0, 0
        self.sha256 = hashlib.sha256() if sha256 else None

    def read(self, n):
        data = self.f.read(n)
        self.crc = google_crc32c.extend(self.crc, data)
        if self.sha256 is not None:
            self.sha256.update(data)
        self.size += len(data)
        return data

    def mismatch(self, shard):
        """What differs from the shard's checksum (a ShardInfo), or None."""
        if shard.crc32c is not None and crc32c_text(self.crc) != shard.crc32c:
            return (f"crc32c {crc32c_text(self.crc)} does not match the manifest's "
                    f"{shard.crc32c} (file changed or corrupt)")
        if self.sha256 is not None and self.sha256.hexdigest() != shard.sha256:
            return (f"sha256 {self.sha256.hexdigest()[:12]}… does not match the manifest's "
                    f"{shard.sha256[:12]}… (file changed or corrupt)")
        return None

    def drain(self):
        while True:
            data = self.read(CHUNK)
            if not data:
                return


def _example_fields(record):
    """(label id, class name, encoded bytes, stored sha256, key) of a serialized Example."""
    from tensorflow.core.example import example_pb2

    feature = example_pb2.Example.FromString(record).features.feature

    def one(key, kind):
        values = getattr(feature[key], kind).value if key in feature else []
        if len(values) != 1:
            raise ValueError(f"{key} has {len(values)} values, expected 1")
        return values[0]

    return (one(schema.LABEL, "int64_list"), one(schema.TEXT, "bytes_list").decode(),
            one(schema.ENCODED, "bytes_list"), one(schema.SHA256, "bytes_list").decode(),
            one(schema.FILENAME, "bytes_list").decode())


def check_shard(shard, labels, label_offset, *, write_index, problems, catalog=None,
                split=None, field_schema=None):
    """Read one shard (a ShardInfo) end to end (and its catalog rows, with `catalog`; its
    records' declared fields, with `field_schema`: dataset_format.fields.Schema).

    Returns {class name: records}, or None when the shard is missing or could not be read to
    its end (its records cannot all be counted). Raises StorageUnavailable when a read of it
    (or of its index) failed without proving damage.
    """
    rel, path = shard.name, shard.path
    try:
        raw = verify_reads.Stream(path).start()
    except transient.StorageUnavailable:
        raise
    except Exception as e:  # damage only: verify_reads raises nothing else
        problems.add(rel, "missing (the manifest lists it)" if verify_reads.is_missing(e)
                     else f"unreadable ({_one_line(e)})")
        return None
    counts, frames, shard_problems, complete, seen = {}, [], [], True, []
    f = _HashingReader(raw, sha256=bool(shard.sha256))
    offset = 0
    while True:
        try:
            frame = read_frame(f, offset)
        except FrameError as e:
            shard_problems.append(f"record {len(frames)} at {e}")
            if e.frame_length is None:  # lost the frame boundaries: stop here
                shard_problems[-1] += "; records after it cannot be located"
                complete = False
                f.drain()
                break
            frame = e.record, e.frame_length  # only the bytes are bad: still count it
        if frame is None:
            break
        record, frame_len = frame
        k = len(frames)
        frames.append((offset, frame_len))
        offset += frame_len
        try:
            label, text, encoded, sha, key = _example_fields(record)
        except Exception as e:
            shard_problems.append(f"record {k}: not a valid Example ({e})")
            seen.append((offset - frame_len, frame_len, None, None))
            continue
        seen.append((offset - frame_len, frame_len, key, sha))
        shard_problems += _record_problems(k, label, text, encoded, sha, labels=labels,
                                           label_offset=label_offset)
        if field_schema:
            shard_problems += [f"record {k}: {p}" for p in fields.record_problems(
                field_schema, examples.parse_features(record), schema.FEATURES)]
        counts[text] = counts.get(text, 0) + 1
    if shard.num_bytes is not None and f.size != shard.num_bytes:
        shard_problems.insert(0, f"size {f.size} bytes, manifest says {shard.num_bytes}")
    if (mismatch := f.mismatch(shard)) is not None:
        shard_problems.insert(0, mismatch)
    if complete and len(frames) != shard.num_examples:
        shard_problems.append(f"{len(frames)} records, manifest says {shard.num_examples}")
    for p in shard_problems[:MAX_PROBLEMS_PER_FILE]:
        problems.add(rel, p)
    if len(shard_problems) > MAX_PROBLEMS_PER_FILE:
        problems.add(rel, f"… and {len(shard_problems) - MAX_PROBLEMS_PER_FILE} more problems")
    _check_index(path, rel, frames, complete, required=write_index, problems=problems)
    if catalog is not None:
        catalog.check_shard(rel, split, seen, complete)
    return counts if complete else None


def _record_problems(k, label, text, encoded, sha, *, labels, label_offset):
    """What is wrong with record `k`'s label (against the manifest's classes) and hash."""
    found = []
    if label == fields.NO_LABEL and text == "":
        pass  # no class label (a manifest row with fields)
    elif not 0 <= label - label_offset < len(labels):
        found.append(f"record {k}: label id {label} is outside the {len(labels)} classes")
    elif labels[label - label_offset] != text:
        found.append(f"record {k}: label id {label} is {labels[label - label_offset]!r} in "
                     f"the manifest but the record says {text!r}")
    if hashlib.sha256(encoded).hexdigest() != sha:
        found.append(f"record {k}: {schema.SHA256} does not match {schema.ENCODED}")
    return found


def _one_line(e):
    return " ".join(f"{type(e).__name__}: {e}".split())[:200]


def _check_index(path, rel, frames, complete, *, required, problems):
    """Each index line must be (offset, length) of the frame at that position; when the shard
    could not be read to its end, only the lines for the frames that were read are compared."""
    index = layout.index_name(path)
    name = layout.index_name(rel)
    try:
        data = verify_reads.read_bytes(index)
    except transient.StorageUnavailable:
        raise
    except Exception as e:  # damage only: verify_reads raises nothing else
        if not verify_reads.is_missing(e):
            problems.add(name, f"unreadable ({_one_line(e)})")
        elif required:
            problems.add(name, "missing (write_index is on for this version)")
        return
    try:
        entries = parse_index(data.decode())
    except ValueError:  # (a UnicodeDecodeError too)
        problems.add(name, "not 'offset length' integer pairs")
        return
    if complete and len(entries) != len(frames):
        problems.add(name, f"{len(entries)} lines, the shard has {len(frames)} records")
    bad = [k for k, (e, fr) in enumerate(zip(entries, frames)) if e != fr]
    if bad:
        k = bad[0]
        problems.add(name, f"{len(bad)} line(s) disagree with the shard, first at line {k + 1}: "
                           f"{' '.join(map(str, entries[k]))} vs frame at "
                           f"{frames[k][0]} of length {frames[k][1]}")
