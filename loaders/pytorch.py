"""PyTorch: the sequential reader as an `IterableDataset` split among DataLoader workers.

`loaders.RecordSource` is already a map-style Dataset (len, getitem) and needs nothing from
here. A DataLoader treats a dataset as a stream only when it is an `IterableDataset`, so the
stream is wrapped here; each worker reads its own part (get_worker_info()), so with
`num_workers=W` on `host_count` hosts every record of the split comes out exactly once.
"""

import torch.utils.data

from loaders.sequential import SequentialRecords


class IterableRecords(SequentialRecords, torch.utils.data.IterableDataset):
    """SequentialRecords (same arguments) whose workers are the DataLoader's."""

    def __iter__(self):
        worker = torch.utils.data.get_worker_info()
        if worker is None:  # num_workers=0: the loading process reads the host's whole part
            return self.iterate(0, 1)
        return self.iterate(worker.id, worker.num_workers)

    def __len__(self):
        """Records this host reads an epoch (all its workers)."""
        return sum(s.count for s in self.part(0, 1))
