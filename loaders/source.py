"""Random access to a split's records: `len(source)` and `source[i]`.

It fits Grain's `RandomAccessDataSource` protocol (len, getitem taking any SupportsIndex,
thread-safe, picklable, a stable repr for checkpoints) and PyTorch's map-style `Dataset`
(a DataLoader with a sampler shuffles it; each worker opens its own files). Record i is
found by its shard's `.index` line: one ranged read (pread locally, one GET on gs://).
"""

import bisect
import collections
import operator
import threading

from loaders import records

OPEN_FILES = 64  # per process: a split of thousands of shards stays under the fd limit


class RecordSource:
    """The records of `split` of a built dataset, by position in manifest order.

    path: dataset root (follows LATEST once, here), version directory, or a
      `readers.info()` result; `version` pins a version under ROOT/versions/.
    split: a split name or a TFDS spec: "train[:10%]", "train[5000:]", "train+validation".
    decode: True gives Example.image as uint8 [H, W, 3]; False keeps the JPEG bytes.
    transform: applied to each Example in the process that reads it (a DataLoader worker),
      e.g. a crop and resize so that batches stack.
    label_offset: labels are 0-based ids + label_offset, whatever the manifest's own offset.
    hold: True (or a lease length in seconds): retention keeps the version while this
      source is alive (dataset_format/holds.py).
    fields: declared fields to give too (names): records are then FieldsExamples.
    """

    def __init__(self, path, split="train", version=None, decode=True, transform=None,
                 label_offset=0, hold=False, fields=None):
        self.info = records.open_info(path, version, hold)
        self.split = split
        self.spans = records.spans_of(self.info, split)
        self._starts = [0]
        for span in self.spans:
            self._starts.append(self._starts[-1] + span.count)
        self._offsets = records.Offsets(records.file_records(self.info, self.spans))
        self._decoder = records.Decoder(decode, records.label_shift(self.info, label_offset),
                                        transform, records.declared(self.info, fields))
        self._files, self._lock = collections.OrderedDict(), threading.Lock()

    @property
    def class_names(self):
        return list(self.info.labels)

    def __len__(self):
        return self._starts[-1]

    def __getitem__(self, index):
        i = operator.index(index)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"record {i} of a source of {n} records")
        i %= n
        k = bisect.bisect_right(self._starts, i) - 1
        span = self.spans[k]
        position = span.first + i - self._starts[k]
        try:
            offset, length = self._offsets.of(span.path)[position]
            data = self._file(span.path).read_range(offset, length)
        except FileNotFoundError as e:
            raise records.explained(self.info, e) from None
        return self._decoder(data, span.path, position, offset)

    def _file(self, path):
        """The open shard, the least recently used of OPEN_FILES closed when a read needs
        another (a reader still holding it keeps it open until it is done)."""
        with self._lock:
            found = self._files.get(path)
            if found is None:
                found = self._files[path] = records.open_shard(path)
                if len(self._files) > OPEN_FILES:
                    self._files.popitem(last=False)
            else:
                self._files.move_to_end(path)
            return found

    def __getstate__(self):
        state = dict(self.__dict__)
        del state["_files"], state["_lock"]  # open files and locks stay in their process
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._files, self._lock = collections.OrderedDict(), threading.Lock()

    def __repr__(self):
        return (f"RecordSource({self.info.version_dir!r}, split={self.split!r}, "
                f"version={self.info.version!r}, records={len(self)})")
