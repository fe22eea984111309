"""verify's catalog check: catalog.parquet reads, it has the manifest's row count, and each
row's (file, position, offset, length) is a record of that shard with the row's key, split
and image sha256. The file is held as bytes and its rows
decoded one shard's row group at a time. A read that fails without proving damage (a 503
past the retries, a 403, EIO) stops verify with one line (StorageUnavailable), not a
problem: the file is not known to be damaged."""

import collections

from beam_pipeline.store import transient
from beam_pipeline.tools.verify_reads import ADVICE
from dataset_format import layout, storage

COLUMNS = ["key", "split", "file", "position", "offset", "length", "sha256"]
MAX_PER_SHARD = 3  # mismatching rows named per shard; the rest counted


class CatalogCheck:
    """Built once per version; check_shard() after each shard is read; finish() at the end."""

    def __init__(self, vdir, manifest, problems):
        import pyarrow.parquet as pq

        self.source = self.name = None
        self.problems, self.groups, self.claimed = problems, collections.defaultdict(list), set()
        entry = manifest.get("catalog")
        if not entry:
            return
        self.name = entry["path"]
        try:
            import pyarrow as pa

            path = layout.join(vdir, self.name)
            # the file's bytes (~60 B a row), not its rows as objects; through
            # dataset_format.storage as the manifest (429/5xx retried, a local EIO too)
            data = transient.retrying(lambda: storage.read_bytes(path), path)
            self.source = pq.ParquetFile(pa.BufferReader(data))
            rows = self.source.metadata.num_rows
            for i in range(self.source.num_row_groups):
                for name in set(self._files_of(i)):
                    self.groups[name].append(i)
        except transient.StorageUnavailable as e:  # not the file's: no problem to report
            raise transient.unavailable(e.__cause__, path, ADVICE) from e.__cause__
        except Exception as e:
            self.source = None
            missing = isinstance(e, FileNotFoundError) or type(e).__name__ == "NotFoundError"
            problems.add(self.name, "missing" if missing else
                         f"unreadable ({' '.join(f'{type(e).__name__}: {e}'.split())[:200]}); "
                         "a build of this root goes around it (its splits are in "
                         "split_map.parquet)")
            return
        if rows != entry.get("rows", rows):
            problems.add(self.name, f"{rows} rows, the manifest says {entry['rows']}")

    def _files_of(self, i):
        column = self.source.schema_arrow.get_field_index("file")  # flat: leaf = field
        stats = self.source.metadata.row_group(i).column(column).statistics
        if stats is not None and stats.has_min_max and stats.min == stats.max:
            return [stats.min]
        return self.source.read_row_group(i, columns=["file"])["file"].to_pylist()

    def check_shard(self, rel, split, records, complete):
        """`records`: [(offset, frame length, key, image sha256)] of shard `rel`, in order
        (key None where the record did not parse); `complete`: the shard was read to its end."""
        if self.source is None:
            return
        rows = []
        for i in self.groups.get(rel, ()):
            self.claimed.add(i)
            table = self.source.read_row_group(i, columns=COLUMNS)
            rows += [r for r in table.to_pylist() if r["file"] == rel]
        rows.sort(key=lambda r: r["position"])
        bad = []
        if complete and len(rows) != len(records):
            bad.append(f"{len(rows)} rows, the shard holds {len(records)} records")
        for row in rows:
            p = row["position"]
            if p < 0 or p >= len(records):
                if complete:
                    bad.append(f"row {row['key']!r}: position {p} is past the shard's end")
                continue
            offset, length, key, sha = records[p]
            if (row["offset"], row["length"]) != (offset, length):
                bad.append(f"row {row['key']!r}: offset {row['offset']} length "
                           f"{row['length']}, record {p} is at {offset} length {length}")
            elif key is not None and (row["key"], row["sha256"]) != (key, sha):
                bad.append(f"row {row['key']!r}: record {p} is {key!r} (sha256 {sha[:12]}…), "
                           f"the row says {row['key']!r} ({row['sha256'][:12]}…)")
            elif row["split"] != split:
                bad.append(f"row {row['key']!r}: split {row['split']!r}, its shard is in "
                           f"{split!r}")
        for message in bad[:MAX_PER_SHARD]:
            self.problems.add(f"{self.name} ({rel})", message)
        if len(bad) > MAX_PER_SHARD:
            self.problems.add(f"{self.name} ({rel})", f"… and {len(bad) - MAX_PER_SHARD} more")

    def finish(self, listed):
        """`listed`: the shard files the manifest names."""
        if self.source is None:
            return
        stray = [i for i in range(self.source.num_row_groups) if i not in self.claimed]
        names = sorted({f for i in stray for f in self._files_of(i)} - set(listed))
        if names:
            self.problems.add(self.name, f"rows for files the manifest does not list: "
                                         f"{', '.join(names[:3])}")
