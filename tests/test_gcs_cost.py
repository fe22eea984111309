"""What gs:// work costs in requests and bytes, counted by the proxy in tests/gcs_counting.py
in front of the storage emulator."""

import random

from tests.gcs_counting import kind_of


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
