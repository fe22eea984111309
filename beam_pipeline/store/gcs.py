"""gs:// objects read and written with generation preconditions (LATEST, ROOT/.lock).

Beam's FileSystems has no compare-and-swap; google-cloud-storage does, through a client
made the way Beam's gcsio makes its own.
"""

import os

_gcs_clients = {}


def gcs_blob(uri):
    """gs://bucket/name -> (google-cloud-storage Bucket, object name), through a client made
    the way Beam's gcsio makes its own (same credentials), one per endpoint and process."""
    from apache_beam.io.gcp.gcsio import GcsIO

    endpoint = os.environ.get("STORAGE_EMULATOR_HOST")  # tests switch emulators
    if endpoint not in _gcs_clients:
        _gcs_clients[endpoint] = GcsIO().client
    bucket, _, name = uri[len("gs://"):].partition("/")
    return _gcs_clients[endpoint].bucket(bucket), name


def read_with_generation(bucket, name, attempts=None):
    """(bytes, generation, updated) of one object, all three of the same generation, or
    (None, 0, None) when there is none. Retries when the object changes between the metadata
    read and the download; RuntimeError after `attempts` such changes (None: no limit)."""
    from google.api_core import exceptions
    from google.cloud.storage.retry import DEFAULT_RETRY

    tries = 0
    while attempts is None or tries < attempts:
        tries += 1
        blob = bucket.get_blob(name, retry=DEFAULT_RETRY)
        if blob is None:
            return None, 0, None
        # Before the download, which resets them from its response headers.
        generation, updated = blob.generation, blob.updated
        try:  # that very generation, so the bytes and the generation belong together
            data = blob.download_as_bytes(if_generation_match=generation, retry=DEFAULT_RETRY)
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            continue  # rewritten or deleted between the two calls: look again
        return data, generation, updated
    raise RuntimeError(f"gs://{bucket.name}/{name}: changing too fast to read")
