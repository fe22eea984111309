"""JPEGs through libjpeg-turbo (`simplejpeg`): the header walk, EXIF orientation, the strict
decode and what its failures mean, and the rule for storing a JPEG byte for byte.

Strict mode because Pillow decodes damaged JPEG data without a word, while libjpeg-turbo's
warnings tell; the header walk because it answers "pass through or re-encode?" in a few µs.
"""

import dataclasses
import struct

import numpy as np
import simplejpeg
from PIL import Image

from beam_pipeline.job.pixels import ImageError, check_size, fit_size, resize

JPEG_SOI, JPEG_EOI = b"\xff\xd8", b"\xff\xd9"
EXIF_ORIENTATION = 0x0112
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # DHT, JPG, DAC are not frames
_BASELINE = 0xC0
_SOS, _EOI, _APP1, _APP2 = 0xDA, 0xD9, 0xE1, 0xE2
_STANDALONE_MARKERS = frozenset([0x01, *range(0xD0, 0xD8)])  # TEM, RSTn: no length field
# Markers whose segment read_jpeg_header only steps over (or, SOFn, notes): not fill or stuffed
# bytes, not SOS/EOI, not standalone, not APP1/APP2 (EXIF, MPF), which its general path reads.
_PLAIN_SEGMENTS = frozenset(range(0x02, 0xFF)) - _STANDALONE_MARKERS - {_SOS, _EOI, _APP1, _APP2}
_SEGMENT_HEAD = struct.Struct(">BBH").unpack_from  # 0xFF, marker, length
# Pillow's Image.transpose method per EXIF orientation, as ImageOps.exif_transpose applies it.
_UPRIGHT = {1: lambda a: a,
            2: lambda a: a[:, ::-1],                      # FLIP_LEFT_RIGHT
            3: lambda a: a[::-1, ::-1],                   # ROTATE_180
            4: lambda a: a[::-1],                         # FLIP_TOP_BOTTOM
            5: lambda a: a.transpose(1, 0, 2),            # TRANSPOSE
            6: lambda a: a.transpose(1, 0, 2)[:, ::-1],   # ROTATE_270
            7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),  # TRANSVERSE
            8: lambda a: a.transpose(1, 0, 2)[::-1]}      # ROTATE_90


@dataclasses.dataclass(frozen=True)
class JpegHeader:
    """What the segments before the first scan say, and the file with any junk between them
    removed (libjpeg warns "extraneous bytes before marker" and refuses the header in strict
    mode, though no pixel is lost: such a file is decoded from `data` and re-encoded)."""
    data: bytes
    junk: int           # bytes of junk dropped between header segments
    frame: int          # SOFn marker: 0xC0 baseline, 0xC2 progressive, …
    orientation: int    # EXIF orientation 1..8 (1 when absent or unreadable)
    multi_picture: bool  # an MPF segment: more images follow the first one's EOI


def read_jpeg_header(data):
    """Walk a JPEG's segments up to its first scan (SOS); a few µs, no pixel decoded."""
    n, i, junk = len(data), 2, 0
    spans, frame, orientation, exif_seen, multi_picture = [(0, 2)], None, 1, False, False
    while True:
        if i + 4 <= n:  # the usual segment, right where the last one ended: one unpack
            ff, marker, length = _SEGMENT_HEAD(data, i)
            if ff == 0xFF and marker in _PLAIN_SEGMENTS and i + 2 + length <= n:
                if frame is None and marker in _SOF_MARKERS:
                    frame = marker
                spans.append((i, i + 2 + length))
                i += 2 + length
                continue
        j = data.find(b"\xff", i, n - 1)
        if j < 0:
            raise ImageError("decode", "truncated", f"JPEG ends inside its header ({n} bytes)")
        junk += j - i
        while j + 2 < n and data[j + 1] == 0xFF:  # fill bytes are allowed before a marker
            j += 1
        marker = data[j + 1]
        if marker == 0:  # a stuffed zero: still junk
            junk, i = junk + 2, j + 2
            continue
        if marker == _SOS:
            break
        if marker == _EOI:
            raise ImageError("decode", "corrupt",
                             f"JPEG ends (EOI at byte {j}) before any image data")
        if marker in _STANDALONE_MARKERS:
            i = j + 2
            continue
        if j + 4 > n:
            raise ImageError("decode", "truncated", f"JPEG ends inside its header ({n} bytes)")
        end = j + 2 + int.from_bytes(data[j + 2:j + 4], "big")
        if end > n:
            raise ImageError("decode", "truncated",
                             f"JPEG segment 0x{marker:02X} at byte {j} runs past the end "
                             f"({n} bytes)")
        if marker in _SOF_MARKERS and frame is None:
            frame = marker
        elif marker == _APP1 and not exif_seen and data.startswith(b"Exif\0\0", j + 4):
            exif_seen, orientation = True, exif_orientation(data[j + 10:end])
        elif marker == _APP2 and data.startswith(b"MPF\0", j + 4):
            multi_picture = True
        spans.append((j, end))
        i = end
    if frame is None:
        raise ImageError("decode", "corrupt", "JPEG has no frame header (SOF) before its scan")
    if junk:
        data = b"".join(data[a:b] for a, b in spans) + data[j:]
    return JpegHeader(data, junk, frame, orientation, multi_picture)


def exif_orientation(tiff):
    """The Orientation tag of IFD0 in a TIFF-structured EXIF block; 1 when absent or unreadable."""
    try:
        order = {b"II": "<", b"MM": ">"}[bytes(tiff[:2])]
        ifd = struct.unpack_from(order + "I", tiff, 4)[0]
        for k in range(struct.unpack_from(order + "H", tiff, ifd)[0]):
            tag, kind = struct.unpack_from(order + "HH", tiff, ifd + 2 + 12 * k)
            if tag == EXIF_ORIENTATION:
                value = struct.unpack_from(order + ("I" if kind == 4 else "H"), tiff,
                                           ifd + 10 + 12 * k)[0]
                return value if 1 <= value <= 8 else 1
    except (KeyError, struct.error):
        pass
    return 1


def _jpeg_failure(jpeg, message, **decode_args):
    """The ImageError for a JPEG a strict decode refused: truncated, corrupt (libjpeg gives
    up), or corrupt_data (libjpeg decodes on after a warning, with pixels lost)."""
    if "Premature end of JPEG file" in message:
        return ImageError("decode", "truncated", message)
    try:
        simplejpeg.decode_jpeg(jpeg, **decode_args, strict=False)
    except (ValueError, KeyError):
        complete = jpeg.rstrip(b"\0").endswith(JPEG_EOI)
        return ImageError("decode", "corrupt" if complete else "truncated", message)
    return ImageError("decode", "corrupt_data", message)


def frame_size(header, opts):
    """(height, width, colorspace) from the frame header, refusing decompression bombs."""
    try:
        h, w, colorspace, _ = simplejpeg.decode_jpeg_header(header.data)
    except (ValueError, KeyError) as e:
        raise _jpeg_failure(header.data, str(e)) from e
    check_size(w, h, opts)
    return h, w, colorspace


def strict_decode(header, colorspace, target, output="RGB"):
    """Strict libjpeg-turbo decode, DCT-scaled towards `target` (w, h) when that is at most
    half the size (as Pillow's draft mode did); CMYK/YCCK undone with Pillow's Adobe rules."""
    cmyk = colorspace in ("CMYK", "YCCK")
    args = {"colorspace": "CMYK" if cmyk else output,
            "min_width": target[0], "min_height": target[1], "min_factor": 2}
    try:
        pixels = simplejpeg.decode_jpeg(header.data, **args, strict=True)
    except (ValueError, KeyError) as e:
        raise _jpeg_failure(header.data, str(e), **args) from e
    if cmyk:
        h, w, _ = pixels.shape
        pixels = np.asarray(Image.frombuffer("CMYK", (w, h), pixels, "raw", "CMYK;I", 0, 1)
                            .convert("RGB"))
    return pixels


def storable_as_is(header, colorspace, h, w, opts):
    """A complete baseline YCbCr JPEG, upright, within size and junk-free is stored as is."""
    return (opts.reencode == "auto"
            and header.frame == _BASELINE
            and colorspace == "YCbCr"
            and header.orientation == 1
            and not header.junk
            and not header.multi_picture
            and (opts.max_side == 0 or max(h, w) <= opts.max_side)
            and header.data.rstrip(b"\0").endswith(JPEG_EOI))  # a truncated JPEG lacks its EOI


def upright_pixels(header, h, w, colorspace, opts):
    target = fit_size(w, h, opts.max_side)
    pixels = _UPRIGHT[header.orientation](strict_decode(header, colorspace, target))
    return resize(pixels, target[::-1] if header.orientation >= 5 else target)


def is_jpeg(data):
    return data[:3] == b"\xff\xd8\xff"  # what Pillow's JPEG plugin accepts
