"""The same bytes under a new name: stored inputs matched by the listing's md5, else by
the sha256 of the input read and hashed. Sorted-spill joins only: flat memory.

Why the md5 is enough: GCS computes it over the object's bytes on upload (composite
objects have none: they are hashed as before). Two different byte strings with the same
md5 and size happen by accident with probability ~2^-128 per pair; made on purpose (MD5
collisions can be crafted) they would let an image's stored record stand for the other's
bytes, which whoever can write the input bucket can do anyway by uploading those bytes.
The writer reads each input at its listed generation, so the md5 stored beside a record
(the catalog's input_md5) is that of the bytes it was made from.
"""

import dataclasses
import hashlib
import itertools
import json

from beam_pipeline.algorithms.read_ahead import threaded
from beam_pipeline.algorithms.spill import SortedSpill
from beam_pipeline.refs import ImageRef, Listed
from beam_pipeline.store import gcs, transient

HASH_THREADS = 16  # inputs read at once to hash them (gs:// latency)

SUFFIX_DEPTHS = (2, 1)  # same bytes: prefer the row with the same class/name, then name



def suffix(key, depth):
    """The key's last `depth` path components (class/name, name)."""
    return "/".join(key.split("/")[-depth:])



def by_md5(rest, by_md5, spill_dir, moved, verify):
    """2a. The same bytes under a new name, told by the listing's md5Hash: refs with one are
    matched with the stored inputs of the same (md5, size), none read. -> (refs without an
    md5, refs whose md5 matched nothing), spills by size for by_content."""
    plain, missed = SortedSpill(spill_dir), SortedSpill(spill_dir)
    with SortedSpill(spill_dir) as keyed:
        for size, line in rest:
            ref = Listed._make(json.loads(line))
            if ref.md5 and not verify and ref.sha256 is None:
                keyed.add(f"{ref.md5} {size}", line)
            else:
                plain.add(size, line)
        for line, old in best_matches(keyed, by_md5):
            ref = ImageRef.from_json(line)
            if old is None:
                missed.add(f"{ref.size:020d}", line)
            else:
                row = json.loads(old)
                moved(dataclasses.replace(ref, sha256=row.get("input_sha256")), row, old)
    return plain, missed


def best_matches(refs, rows):
    """Refs and stored rows, both (match key, line) spills -> (ref line, the best stored row
    of the same match key or None): the one with the same class/name, else name, else the
    first."""
    groups = itertools.groupby(rows, key=lambda item: item[0])
    group_key, group = next(groups, (None, None))
    for key, lines in itertools.groupby(refs, key=lambda item: item[0]):
        while group_key is not None and group_key < key:
            group_key, group = next(groups, (None, None))
        best = best_rows(group) if group_key == key else None
        for _, line in lines:
            if best is None:
                yield line, None
                continue
            ref_key = json.loads(line)[0]
            yield line, (best.get((2, suffix(ref_key, 2))) or best.get((1, suffix(ref_key, 1)))
                         or best[0])


def by_content(out, sources, by_sha, spill_dir, moved, published=None):
    """2. The same bytes under a new name: refs of a size some stored input has (`sources`:
    [(refs by size, the stored sizes that could match them)]), or that some published
    input may be (`published(ref)`: the split map's say), are hashed and matched with the
    stored inputs of the same sha256 (see best_matches). -> a spill of the refs still
    unmatched, their sha256 set when they were hashed."""
    unmatched, by_content = SortedSpill(spill_dir), SortedSpill(spill_dir)
    with by_content:
        def candidates():
            for rest, sizes in sources:
                for line, size_seen in first_match(rest, sizes):
                    ref = ImageRef.from_json(line)
                    if size_seen is None and not (published and published(ref)):
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
        for line, old in best_matches(by_content, by_sha):
            if old is None:
                unmatched.add("", line)
            else:
                moved(ImageRef.from_json(line), json.loads(old), old)
    return unmatched


def best_rows(rows):
    """The stored rows of one input sha256 -> {(depth, key suffix): first row, 0: first row}
    (one entry per distinct suffix: small unless the data is one image copied many times)."""
    best = {}
    for _, line in rows:
        key = json.loads(line)["key"]
        best.setdefault(0, line)
        for depth in SUFFIX_DEPTHS:
            best.setdefault((depth, suffix(key, depth)), line)
    return best



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
    in order, reading `threads` inputs at a time (algorithms/read_ahead.py)."""
    return threaded(items, lambda item: input_sha256(item[0].uri, item[0].stamp), threads,
                    depth=2 * threads)


def input_sha256(uri, stamp=""):
    """The sha256 of a file's bytes (read in 1 MiB pieces), or None when it cannot be read
    because of the input itself (gone or replaced since listing, not readable by us
    locally): the shard writer reports it. gs://: one GET at the listed generation through
    the process's one client (Beam's FileSystems.open made a client and three requests per
    object).

    A read that failed for a reason that is not the input's (a 503 past the retries, a
    timeout, a 403 on gs://; EIO, ESTALE on an NFS mount) raises StorageUnavailable: taken
    as unreadable, a renamed image would fall back to its key's split for good."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems


    if uri.startswith("gs://"):
        try:
            return hashlib.sha256(gcs.read_bytes(uri, 0, gcs.listed_generation(stamp))
                                  ).hexdigest()
        except Exception as e:  # vanished or replaced since listing: the shard writer says
            if transient.is_transient(e):
                raise transient.unavailable(e, uri) from e
            return None

    def read():
        digest = hashlib.sha256()
        with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()

    try:
        return transient.retrying(read, uri)
    except transient.StorageUnavailable as e:
        if transient.is_local_outage(e):
            raise
        return None  # e.g. EACCES: the input's own problem, rejected by the shard writer
    except Exception:  # vanished since listing, or unreadable: the shard writer reports it
        return None
