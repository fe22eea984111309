"""What gs:// work costs in requests and bytes, counted by the proxy in tests/gcs_counting.py
in front of the storage emulator."""

import random

import pytest

from tests.gcs_counting import kind_of
from tests.helpers import catalog_bytes, image_bytes


def test_requests_are_classified_as_billed():
    b = "/storage/v1/b/bkt"
    assert kind_of("GET", f"{b}/o?prefix=a%2F&delimiter=%2F") == "list"
    assert kind_of("GET", f"{b}/o/a%2Fx.jpg?projection=noAcl") == "metadata_get"
    assert kind_of("GET", f"{b}/o/a%2Fx.jpg?alt=media&generation=3") == "media_get"
    assert kind_of("GET", "/download/storage/v1/b/bkt/o/a/x.jpg?alt=media") == "media_get"
    assert kind_of("GET", b) == "bucket_get"
    assert kind_of("POST", "/upload/storage/v1/b/bkt/o?uploadType=multipart") == "upload"
    assert kind_of("PUT", "/upload/storage/v1/b/bkt/o?uploadType=resumable&upload_id=1") == "upload"
    assert kind_of("POST", f"{b}/o/a/rewriteTo/b/bkt/o/b") == "copy"
    assert kind_of("DELETE", f"{b}/o/a") == "delete"
    assert kind_of("POST", "/batch/storage/v1") == "batch"


def test_one_client_read_is_one_get_of_the_objects_bytes(gcs, gcs_bucket, gcs_counter):
    from beam_pipeline.store import gcs as store_gcs

    data = random.Random(3).randbytes(70_000)
    gcs.upload_bytes(f"gs://{gcs_bucket}/a/x.jpg", data)
    gcs_counter.reset()
    assert store_gcs.read_bytes(f"gs://{gcs_bucket}/a/x.jpg") == data
    totals = gcs_counter.totals()
    assert totals["media_get"] == 1 and totals["media_bytes"] == len(data)
    assert totals["requests"] - totals.get("bucket_get", 0) == 1


def test_small_files_cost_one_request_each_through_the_shared_client(gcs, gcs_bucket,
                                                                     gcs_counter, monkeypatch):
    """store/files.py on gs://: one request per read, exists, listing or small write (Beam's
    FileSystems made a client per call: a bucket GET, a metadata GET, an empty GET)."""
    from beam_pipeline.store import files, gcs as store_gcs
    from dataset_format import storage

    assert store_gcs.client() is storage.client()  # one factory, one client per process
    base = f"gs://{gcs_bucket}/d"
    steps = [("write", lambda: files.write_bytes(f"{base}/a.json", b'{"n": 1}')),
             ("exists", lambda: files.exists(f"{base}/a.json")),
             ("absent", lambda: files.exists(f"{base}/b.json")),
             ("read", lambda: files.read_json(f"{base}/a.json")),
             ("seek", lambda: files.open_seekable(f"{base}/a.json").read()),
             ("list", lambda: files.objects(f"{base}/*.json"))]
    got = {}
    for name, step in steps:
        before = gcs_counter.totals()
        got[name] = step()
        after = gcs_counter.totals()
        kinds = {k: after.get(k, 0) - before.get(k, 0) for k in ("upload", "metadata_get",
                                                                 "media_get", "list")}
        assert sum(kinds.values()) == 1, (name, kinds)
    assert got["exists"] and not got["absent"] and got["read"] == {"n": 1}
    assert got["seek"] == b'{"n": 1}' and got["list"] == [f"{base}/a.json"]
    with pytest.raises(FileNotFoundError, match="b.json"):
        files.read_bytes(f"{base}/b.json")
    assert gcs_counter.totals().get("bucket_get", 0) <= 1  # the client's first use of it

    monkeypatch.setattr(store_gcs, "CHUNK", 256 << 10)  # GCS's smallest resumable chunk
    data = random.Random(5).randbytes(600 << 10)
    for size, uploads in ((1000, 1), (len(data), 4)):  # small: one request; big: resumable
        before = gcs_counter["upload"]
        with files.create_final(f"{base}/w{size}") as f:
            f.write(data[:size // 2])
            f.write(data[size // 2:size])
        assert gcs.read(f"{base}/w{size}") == data[:size]
        assert gcs_counter["upload"] - before == uploads
        with pytest.raises(RuntimeError), files.create_final(f"{base}/x{size}") as f:
            f.write(data[:size])
            raise RuntimeError("a writer that fails leaves nothing")
        assert not gcs.exists(f"{base}/x{size}")


def test_runs_keep_the_bytes_read_within_a_tenth_of_the_frames():
    from beam_pipeline.store import ranges

    spans = [(0, 100), (100, 50), (155, 40), (400, 100), (505, 10), (2000, 30), (1000, 5)]
    runs = ranges.runs(spans)
    assert [(r.start, r.end, len(r.spans)) for r in runs] == [
        (0, 195, 3), (400, 515, 2), (2000, 2030, 1), (1000, 1005, 1)]
    assert sum(r.end - r.start for r in runs) <= 1.1 * sum(n for _, n in spans)
    assert [(r.start, r.end) for r in ranges.runs(spans, max_bytes=150)][:2] == [(0, 150),
                                                                                (155, 195)]


def test_stored_frames_read_back_by_range_locally(tmp_path):
    from beam_pipeline.store import ranges

    data = random.Random(4).randbytes(5000)
    path = tmp_path / "shard"
    path.write_bytes(data)
    spans = [(0, 10), (10, 990), (3000, 7), (4990, 20)]
    assert list(ranges.read_spans(str(path), spans)) == [
        data[0:10], data[10:1000], data[3000:3007], data[4990:5000]]


def _padded(jpeg, size):
    """`jpeg` made exactly `size` bytes by a comment segment after its SOI marker."""
    n = size - len(jpeg) - 4
    return jpeg[:2] + b"\xff\xfe" + (n + 2).to_bytes(2, "big") + b"\1" * n + jpeg[2:]


def _build(inputs, root, *extra):
    from beam_pipeline import cli

    args = ["--name", "pets", "--num_shards", "2", "--no_transform"]
    result = cli.run([a for uri in inputs for a in ("--input", uri)] + ["--output", root]
                     + args + list(extra))
    assert result.status == "published", result
    return result.manifest


def _media(counter, inside):
    """(GETs, bytes) of the media downloads whose object name holds `inside`."""
    from urllib.parse import unquote

    hits = [down for kind, _, target, down in counter.log
            if kind == "media_get" and inside in unquote(target)]
    return len(hits), sum(hits)


@pytest.mark.slow
def test_renamed_inputs_are_reframed_reading_each_record_once(gcs, gcs_bucket, tmp_path,
                                                              make_images, gcs_counter):
    """Every file under a new name: the build re-frames every stored record, downloading
    about the records' bytes (ranged reads), not a 16 MiB window per record."""
    make_images(tmp_path / "in", {"cat": 6, "dog": 5,
                                  "dog/": {"big.jpg": _padded(image_bytes((9, 9, 9)), 2000)}})
    base = f"gs://{gcs_bucket}"
    gcs.upload_tree(tmp_path / "in", f"{base}/in")
    first = _build([f"{base}/in"], f"{base}/ds")
    for path in sorted((tmp_path / "in").rglob("*.jpg")):
        gcs.upload_bytes(f"{base}/moved/{path.parent.name}/r-{path.name}", path.read_bytes())
    record_bytes = sum(s["num_bytes"] for split in first["splits"].values()
                       for s in split["shards"])
    before = gcs.read_json(f"{base}/ds/LATEST")["version"]
    gcs_counter.reset()
    second = _build([f"{base}/moved"], f"{base}/ds")
    assert second["build"]["reframed"] == 12 and second["build"]["converted"] == 0
    gets, down = _media(gcs_counter, f"/versions/{before}/pets-")
    assert record_bytes <= down <= 1.1 * record_bytes, (down, record_bytes)
    assert gets <= 12
    # The launcher matched the renamed files by the listing's md5: no input was read.
    assert _media(gcs_counter, "/moved/") == (0, 0)
    # Commit read each shard's catalog fragment twice (duplicates, merge), one GET each.
    from urllib.parse import unquote

    import collections

    reads = collections.Counter(
        unquote(target).split("?")[0].rsplit("/", 1)[1] for kind, _, target, _ in gcs_counter.log
        if kind in ("media_get", "metadata_get") and ".catalog.parquet" in unquote(target))
    shards = sum(len(s["shards"]) for s in second["splits"].values())
    assert 1 <= len(reads) <= shards and set(reads.values()) == {2}, reads
    # One storage client per process: its bucket-metadata GET once, not once per call
    # (Beam's FileSystems made ~8 per shard); each shard's listing is read twice, one GET
    # each (its recipe, its refs).
    totals = gcs_counter.totals()
    assert totals.get("bucket_get", 0) <= 10, totals
    listings = collections.Counter(
        unquote(target).split("?")[0] for kind, _, target, _ in gcs_counter.log
        if kind in ("media_get", "metadata_get") and "/.tmp/listing/" in unquote(target))
    assert listings and set(listings.values()) <= {1, 2}, listings

    # A new image of a stored image's size, other bytes: told apart from the stored row,
    # and from every content the split map holds, by md5 (no launcher read), then read once
    # by the writer that converts it.
    new = _padded(image_bytes((7, 250, 9), (24, 16)), 2000)
    gcs.upload_bytes(f"{base}/moved/cat/new.jpg", new)
    gcs_counter.reset()
    third = _build([f"{base}/moved"], f"{base}/ds")
    assert third["build"]["converted"] == 1
    assert _media(gcs_counter, "/moved/") == (1, len(new))


@pytest.mark.slow
def test_manifest_rows_are_stated_by_listing_their_folders(gcs, gcs_bucket, tmp_path,
                                                           make_images, gcs_counter):
    """A manifest of gs:// uris: its folders are listed, not each row read (a metadata GET
    per row per night); a row naming no object is still not_found."""
    make_images(tmp_path / "in", {"cat": 8, "dog": 8})
    base = f"gs://{gcs_bucket}"
    gcs.upload_tree(tmp_path / "in", f"{base}/in")
    rows = ["uri,label"] + [f"{base}/in/{c}/{i:03d}.jpg,{c}" for c in ("cat", "dog")
                            for i in range(8)] + [f"{base}/in/dog/missing.jpg,dog"]
    gcs.upload_bytes(f"{base}/lists/all.csv", ("\n".join(rows) + "\n").encode())
    first = _build([f"{base}/lists/all.csv"], f"{base}/ds", "--max_error_rate", "0.2")
    assert first["accounting"]["written"] == 16 and first["errors"]["by_reason"] == {
        "not_found": 1}
    gcs_counter.reset()
    from beam_pipeline import cli

    again = cli.run(["--input", f"{base}/lists/all.csv", "--output", f"{base}/ds", "--name",
                     "pets", "--num_shards", "2", "--no_transform", "--max_error_rate", "0.2"])
    assert again.status == "up_to_date", again
    from urllib.parse import unquote

    per_input = [e for e in gcs_counter.log if "/in/" in unquote(e[2]) and e[0] != "list"]
    assert per_input == []  # missing.jpg too: the folder's listing says it is not there
    input_lists = [e for e in gcs_counter.log
                   if e[0] == "list" and "prefix=in/" in unquote(e[2])]
    assert len(input_lists) == 2, gcs_counter.log  # one per folder (the root's own listings,
    # of its versions for the leftover cleanup, are not the manifest's)


@pytest.mark.slow
def test_a_manifest_costs_the_same_requests_in_any_row_order(gcs, gcs_bucket, tmp_path,
                                                             gcs_counter):
    """5,000 shuffled rows over 5 folders (one object each exists; the others are
    not_found, told by the folders' listings): the rows are stat'ed in uri order, so each
    batch of 1,000 lists one or two folders. In file order every batch listed all 5: 25
    requests, 0.005 a row."""
    from beam_pipeline.launcher import manifests
    from beam_pipeline.refs import ImageRef
    from dataset_format.error_record import ErrorRecord

    base = f"gs://{gcs_bucket}"
    folders = [f"f{i}" for i in range(5)]
    for folder in folders:
        gcs.upload_bytes(f"{base}/{folder}/000000.jpg", image_bytes((9, 9, 9)))
    uris = [f"{base}/{folder}/{i:06d}.jpg" for folder in folders for i in range(1000)]
    random.Random(40).shuffle(uris)
    manifest = tmp_path / "shuffled.csv"
    manifest.write_text("uri,label\n" + "".join(f"{u},cat\n" for u in uris))
    gcs_counter.reset()
    items = list(manifests.list_manifest(str(manifest)))
    requests = gcs_counter.totals()
    refs = sorted(item.uri for item in items if isinstance(item, ImageRef))
    missing = [item for item in items if isinstance(item, ErrorRecord)]
    assert refs == [f"{base}/{folder}/000000.jpg" for folder in folders]
    assert len(missing) == 4995 and {m.reason for m in missing} == {"not_found"}
    assert requests.get("metadata_get", 0) == 0
    assert requests["list"] <= 5 + len(folders)  # a batch's folders, each batch once
    assert requests["requests"] / len(uris) <= 0.002


def test_a_shuffled_manifest_still_names_the_file_and_line_of_a_bad_uri(tmp_path):
    from beam_pipeline.errors import UserError
    from beam_pipeline.launcher import manifests

    rows = [f"/nowhere/{i:04d}.jpg,cat" for i in range(3000)]
    rows.insert(1700, "s3://bucket/x.jpg,cat")
    random.Random(7).shuffle(rows)
    manifest = tmp_path / "list.csv"
    manifest.write_text("uri,label\n" + "\n".join(rows) + "\n")
    line = rows.index("s3://bucket/x.jpg,cat") + 2
    with pytest.raises(UserError) as e:
        list(manifests.list_manifest(str(manifest)))
    assert str(e.value) == (f"{manifest}:{line}: s3://bucket/x.jpg: only local paths and "
                            "gs:// uris are supported")


@pytest.mark.slow
def test_a_reuse_task_downloads_its_shards_row_groups_not_the_catalog(gcs, gcs_bucket,
                                                                    gcs_counter):
    """catalog.read_numbered, as the reuse and copy tasks of one worker process call it:
    before, each task downloaded the whole catalog (up to 16 MiB; a larger one, its first
    16 MiB and then its rows): 8 tasks of a 40-shard catalog moved 8x its bytes. Now: its
    size and footer once a process, then one ranged GET of each task's row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from beam_pipeline.store import catalog

    shards, rows = 40, 100
    data, expected = catalog_bytes(shards, rows, seed=5)
    path = gcs.upload_bytes(f"gs://{gcs_bucket}/ds/versions/V/catalog.parquet", data)
    metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
    group_bytes = [sum(metadata.row_group(g).column(c).total_compressed_size
                       for c in range(metadata.num_columns)) for g in range(shards)]
    footer = int.from_bytes(data[-8:-4], "little") + 8
    tasks = [[7], [3], [12, 13], [39], [0], [21], [30], [8]]  # a task's rows: its shard's
    numbers = [[n for s in t for n in range(s * rows, (s + 1) * rows)] for t in tasks]
    numbers[1] = numbers[1][:40] + [numbers[1][40]] * 3 + numbers[1][41:]  # repeats allowed
    catalog._FOOTERS.clear()  # a fresh worker process
    gcs_counter.reset()
    for wanted in numbers:
        assert catalog.read_numbered(path, wanted) == [expected[n] for n in wanted]
    reads = [(kind, down) for kind, _, target, down in gcs_counter.log
             if "catalog.parquet" in target]
    media = [down for kind, down in reads if kind == "media_get"]
    read_groups = sum(group_bytes[s] for t in tasks for s in t)
    assert sum(media) <= footer + (64 << 10) + read_groups, (sum(media), len(data))
    assert sum(media) < len(data) / 2  # 8 tasks: less than half the catalog, once
    # the object's size and its footer (one or two ranged GETs) once; a GET per row group
    assert len(reads) <= 1 + 2 + sum(len(t) for t in tasks), reads
    gcs_counter.reset()
    assert catalog.read_numbered(path, numbers[0]) == [expected[n] for n in numbers[0]]
    again = [down for kind, _, target, down in gcs_counter.log if "catalog.parquet" in target]
    assert len(again) == 1 and again[0] == group_bytes[7], again  # the footer is kept


@pytest.mark.slow
def test_a_large_catalogs_footer_is_read_alone_and_its_rows_once(gcs, gcs_bucket, gcs_counter):
    """A gs:// catalog over 16 MiB (files.WHOLE_BYTES). Before: every open downloaded its
    first 16 MiB, threw them away and read it again from the start (a BlobReader), so a
    check of its rows or columns (the launcher's intact-catalog check, split_map.add_catalog,
    previous.CatalogRows) cost 16 MiB, and a whole read 16 MiB more than the file. Now: a
    footer read costs the footer (ranged GETs), a whole read the file once, and a read of
    two row groups far apart no more than the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from beam_pipeline.launcher import previous
    from beam_pipeline.store import catalog, files

    shards, rows = 66, 1000
    data, expected = catalog_bytes(shards, rows, seed=11)
    assert len(data) > files.WHOLE_BYTES
    path = gcs.upload_bytes(f"gs://{gcs_bucket}/ds/versions/V/catalog.parquet", data)
    footer = int.from_bytes(data[-8:-4], "little") + 8
    for name, read, want in [("rows", lambda: catalog.footer(path).num_rows, shards * rows),
                             ("fields", lambda: previous.CatalogRows(path).with_fields(), False)]:
        gcs_counter.reset()
        assert read() == want, name
        gets, down = _media(gcs_counter, "catalog.parquet")
        assert footer <= down <= footer + (64 << 10), (name, down, footer)  # was >= 16 MiB
        assert gets <= 2, (name, gets)

    gcs_counter.reset()  # a whole read: the file's bytes once, and its footer
    table = pa.concat_tables(catalog.iter_tables(path))
    assert table.equals(pq.read_table(pa.BufferReader(data)))
    gets, down = _media(gcs_counter, "catalog.parquet")
    assert len(data) <= down <= len(data) + footer + (64 << 10), (down, len(data))
    assert gets <= 2 + 2 + len(data) // files.WHOLE_BYTES, gets

    gcs_counter.reset()  # two rows, in the first and the last row groups
    wanted = [3, shards * rows - 2]
    got = dict(previous.CatalogRows(path).full(wanted, columns=["key", "split"]))
    assert [got[n]["key"] for n in wanted] == [expected[n].key for n in wanted]
    gets, down = _media(gcs_counter, "catalog.parquet")
    assert down <= len(data) and gets <= 4, (down, gets)
