"""What retention must keep whatever --keep_versions says: tagged versions (refs.py) and
versions a live lease holds (holds.py), judged by the storage's clock.
"""

import dataclasses
import datetime
import logging
import os
import uuid
from typing import Dict, Tuple

from beam_pipeline.store import gcs
from dataset_format import holds, layout, refs, storage


@dataclasses.dataclass(frozen=True)
class Protected:
    tags: Dict[str, Tuple[str, ...]]        # version -> the tags naming it
    held: Dict[str, Tuple[str, ...]]        # version -> the holders of its live leases
    expired: Tuple[holds.Lease, ...]        # leases that lapsed (retention deletes them)

    @property
    def versions(self):
        return set(self.tags) | set(self.held)


NONE = Protected({}, {}, ())  # nothing protected (retention had no version to drop)


def storage_now(root):
    """Now by the clock of the storage ROOT is on, which stamps the leases: on gs:// the
    Date of a server answer (store/gcs.py, as the lock's age); locally the mtime of a probe
    file written and deleted under ROOT/holds/ (on NFS the server's clock)."""
    if root.startswith("gs://"):
        bucket, name = gcs.gcs_blob(layout.join(layout.holds_dir(root), layout.CLOCK_PROBE))
        return gcs.server_time(bucket, name)
    probe = layout.join(layout.holds_dir(root), layout.CLOCK_PROBE + uuid.uuid4().hex)
    os.makedirs(os.path.dirname(probe), exist_ok=True)
    with open(probe, "wb"):
        pass
    try:
        return datetime.datetime.fromtimestamp(os.stat(probe).st_mtime, datetime.timezone.utc)
    finally:
        os.remove(probe)


def read(root):
    """Protected for ROOT now. Raises when the tags or leases cannot be listed or a tag
    read: retention that cannot see every protection must delete nothing."""
    tags = {}
    for name, tag in refs.list_tags(root).items():
        tags.setdefault(tag.version, []).append(name)
    found = [lease for lease in holds.leases(root)
             if not os.path.basename(lease.path).startswith(layout.CLOCK_PROBE)]
    now = storage_now(root) if found else None
    held, expired = {}, []
    for lease in found:
        if lease.live(now):
            held.setdefault(lease.version, []).append(lease.holder)
        else:
            expired.append(lease)
    return Protected({v: tuple(sorted(n)) for v, n in tags.items()},
                     {v: tuple(sorted(h)) for v, h in held.items()}, tuple(expired))


def delete_expired(protected):
    """Delete the lapsed leases (their holders stopped renewing): a refusal is logged."""
    for lease in protected.expired:
        try:
            storage.delete(lease.path)
        except Exception as e:
            logging.warning("lapsed lease %s not deleted (%s)", lease.path, e)
