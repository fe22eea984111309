"""The codec floor: what the pixels alone cost, writing nothing.

`python benchmarks/codec_floor.py SRC [--reencode | --read]`

multiprocessing.Pool(cores); worker i reads every n-th file and runs only libjpeg-turbo
(simplejpeg) on it:
  default     the pipeline's validation: a strict decode to GRAY (no chroma IDCT or colour
              conversion; every coefficient is still entropy-decoded)
  --reencode  strict decode to RGB, encode at quality 90, 4:2:0 (the pipeline's re-encode)
  --read      read the bytes and parse the JPEG header only
No protobuf, no hash, no write: a build can approach these times, not beat them.
"""

import multiprocessing
import os
import sys

import simplejpeg


def run(args):
    paths, mode = args
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        if mode == "read":
            simplejpeg.decode_jpeg_header(data)
        elif mode == "reencode":
            rgb = simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
            simplejpeg.encode_jpeg(rgb, quality=90, colorspace="RGB", colorsubsampling="420")
        else:
            simplejpeg.decode_jpeg(data, colorspace="GRAY", strict=True)
    return len(paths)


def main():
    src = sys.argv[1]
    mode = "reencode" if "--reencode" in sys.argv else "read" if "--read" in sys.argv else "decode"
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs
                   if f.endswith(".jpg"))
    n = os.cpu_count()
    with multiprocessing.Pool(n) as pool:
        done = sum(pool.map(run, [(paths[i::n], mode) for i in range(n)]))
    print(f"decoded {done}")


if __name__ == "__main__":
    main()
