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


def server_time(bucket, name):
    """Now, by the storage server's clock (the Date header of a metadata read of `name`;
    404 answers carry it too). Lock ages compare it with the server's `updated`, so a
    client clock that is off cannot make a live lock look expired."""
    import urllib.parse
    from email.utils import parsedate_to_datetime

    from google.api_core import exceptions
    from google.cloud.storage.retry import DEFAULT_RETRY

    client = bucket.client
    url = client._connection.build_api_url(
        f"/b/{bucket.name}/o/{urllib.parse.quote(name, safe='')}")

    def get():
        response = client._http.request("GET", url, timeout=60)
        if response.status_code >= 400 and response.status_code != 404:
            raise exceptions.from_http_response(response)
        return parsedate_to_datetime(response.headers["Date"])

    return DEFAULT_RETRY(get)()


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
