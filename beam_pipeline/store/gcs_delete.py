"""gs:// objects deleted: one, quietly, or a whole prefix in batch requests (8 in flight, a
client per thread). Reads, writes and the generation preconditions: store/gcs.py.
"""

import os
import threading

from beam_pipeline.algorithms.read_ahead import threaded
from beam_pipeline.store.gcs import client, gcs_blob
from dataset_format import storage


def delete(uri):
    """Delete one object; FileNotFoundError when it is not there."""
    from google.api_core import exceptions
    from google.cloud.storage.retry import DEFAULT_RETRY

    bucket, name = gcs_blob(uri)
    try:
        bucket.delete_blob(name, retry=DEFAULT_RETRY)
    except exceptions.NotFound:
        raise FileNotFoundError(f"{uri}: no such object") from None


def delete_quietly(uri):
    """Delete one object; missing is fine, a failure only logged (a temp file that commit's
    clean-up of .tmp/ deletes anyway)."""
    import logging

    from google.api_core import exceptions
    from google.cloud.storage.retry import DEFAULT_RETRY

    bucket, name = gcs_blob(uri)
    try:
        bucket.delete_blob(name, retry=DEFAULT_RETRY)
    except exceptions.NotFound:
        pass
    except Exception as e:
        logging.warning("could not delete %s (%s); the clean-up of .tmp/ will", uri, e)


DELETE_BATCH, DELETE_PARALLEL = 100, 8  # objects per batch request; batches in flight

_per_thread = threading.local()


def delete_prefix(uri, first=None, keep=frozenset()):
    """Delete every object under the gs:// prefix `uri`: listed 1,000 names a page, deleted
    100 to a batch request, 8 batches at a time (a client per thread: a client's batch is
    not thread-safe). Beam's FileSystems.delete lists, makes a client and sends a batch per
    path: three round trips per object, one after another. Missing objects are fine.
    `first`: a name under the prefix deleted alone before the rest, once the listing has
    succeeded (a refused listing leaves everything, the `first` object included). `keep`:
    gs:// uris under the prefix left in place (shards a kept version shares)."""
    bucket, prefix = gcs_blob(uri.rstrip("/") + "/")
    kept = {gcs_blob(k)[1] for k in keep}
    names = [b.name for b in client().list_blobs(bucket.name, prefix=prefix)
             if b.name not in kept]
    if first is not None:
        first_name = gcs_blob(first)[1]
        if first_name in names:
            _delete_batch(bucket.name, [first_name])
            names.remove(first_name)
    batches = [names[i:i + DELETE_BATCH] for i in range(0, len(names), DELETE_BATCH)]
    for _ in threaded(batches, lambda batch: _delete_batch(bucket.name, batch), DELETE_PARALLEL):
        pass
    return len(names)


def _delete_batch(bucket_name, names, attempts=6):
    """One batch request deleting `names`; transient failures (the request's, or 429/5xx
    answers inside it) retried with back-off; 404 is done already."""
    import random
    import time

    for attempt in range(attempts):
        if getattr(_per_thread, "endpoint", None) != os.environ.get("STORAGE_EMULATOR_HOST"):
            _per_thread.client = storage.new_client()
            _per_thread.endpoint = os.environ.get("STORAGE_EMULATOR_HOST")
        bucket = _per_thread.client.bucket(bucket_name)
        try:
            with _per_thread.client.batch(raise_exception=False) as batch:
                for name in names:
                    bucket.delete_blob(name)
            answers = [r.status_code for r in batch._responses]
        except Exception:  # the batch request itself failed (reset, 503): all again
            if attempt == attempts - 1:
                raise
            answers = [503] * len(names)
        failed = [(n, a) for n, a in zip(names, answers)
                  if a >= 300 and a != 404 and a != 429 and a < 500]
        if failed:
            raise OSError(f"gs://{bucket_name}: {len(failed)} deletes refused, e.g. {failed[0]}")
        names = [n for n, a in zip(names, answers) if a == 429 or a >= 500]
        if not names:
            return
        time.sleep(min(8.0, 0.25 * 2 ** attempt) * random.uniform(0.5, 1.5))
    raise OSError(f"gs://{bucket_name}: {len(names)} deletes still failing")
