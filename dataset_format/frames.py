"""The bytes of a shard: TFRecord frames and the `.index` file beside it, read and written.

Pure Python (no TensorFlow, no Beam), so the writer's workers, the reuse/copy tasks,
verify and inspect_dataset all take the format from here.
"""

import base64
import struct

import google_crc32c


def tfrecord_frame(record):
    """One TFRecord frame: length, masked crc32c of length, data, masked crc32c of data.

    Framed here rather than by tf.io.TFRecordWriter so the bytes can go to any Beam
    FileSystems stream (gs:// included) while offsets for the index are known.
    """
    head, tail = frame_ends((record,), len(record))
    return b"".join((head, record, tail))


def frame_ends(parts, length):
    """The (head, tail) a record given as byte pieces (`length` bytes in all) is framed
    between: the record's CRC is taken over the pieces, so it is never joined (a copy of
    the image bytes) just to be framed."""
    head = struct.pack("<Q", length)
    crc = 0
    for part in parts:
        crc = google_crc32c.extend(crc, part)
    return head + struct.pack("<I", masked_crc(head)), struct.pack("<I", _mask(crc))


def masked_crc(data):
    """TFRecord's masked CRC-32C of `data`."""
    return _mask(google_crc32c.value(data))


def _mask(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def crc32c_text(crc):
    """A whole file's CRC-32C (an int) as the manifest and Cloud Storage write it: the four
    big-endian bytes in base64 (`gsutil hash -c`, an object's `crc32c` metadata)."""
    return base64.b64encode(crc.to_bytes(4, "big")).decode()


def file_crc32c(data):
    """crc32c_text of `data`: a shard's checksum in the manifest."""
    return crc32c_text(google_crc32c.value(data))


class FrameError(ValueError):
    """A TFRecord frame that is cut short or fails a CRC; `offset` is where the frame starts.

    `frame_length` and `record` are set when only the record bytes are bad (the length was
    intact), so reading can go on with the next frame.
    """

    def __init__(self, offset, message, frame_length=None, record=None):
        super().__init__(f"offset {offset}: {message}")
        self.offset, self.frame_length, self.record = offset, frame_length, record


def read_frame(f, offset, check_crc=True):
    """The record of the frame starting at `offset` of the open file `f`, or None at EOF.

    Returns (record bytes, frame length). Raises FrameError when the frame is damaged.
    """
    header = f.read(12)
    if not header:
        return None
    if len(header) < 12:
        raise FrameError(offset, f"truncated frame header ({len(header)} of 12 bytes)")
    length_bytes, (length_crc,) = header[:8], struct.unpack("<I", header[8:])
    if check_crc and masked_crc(length_bytes) != length_crc:
        raise FrameError(offset, "length CRC mismatch (frame header is corrupt)")
    (length,) = struct.unpack("<Q", length_bytes)
    body = f.read(length + 4)
    if len(body) < length + 4:
        raise FrameError(offset, f"truncated record: {length + 4} bytes expected, "
                                 f"{len(body)} left in the file")
    record, (data_crc,) = body[:length], struct.unpack("<I", body[length:])
    if check_crc and masked_crc(record) != data_crc:
        raise FrameError(offset, "data CRC mismatch (record bytes are corrupt)",
                         frame_length=12 + length + 4, record=record)
    return record, 12 + length + 4


# --- .index: the DALI / `tfrecord`-package index, one "offset length" line per record ---------

def index_line(offset, length):
    """The index line of the frame at `offset` that is `length` bytes long."""
    return f"{offset} {length}\n"


def index_bytes(entries):
    """[(offset, frame length)] -> the whole index file."""
    return "".join(index_line(o, n) for o, n in entries).encode()


def parse_index(text):
    """An index file's text -> [(offset, length)]; ValueError when a line is not integers."""
    return [tuple(int(x) for x in line.split()) for line in text.splitlines() if line.strip()]
