#!/usr/bin/env python3
"""The CPU path of image batches with RandomResizedCrop(224): images/s of
ferry.images.load_batch(decode="cpu") into host memory on 1 and 2 threads, beside the full
decode alone (ferry.images.decode_batch, libjpeg-turbo on the same threads).

The CPU decoder decodes only the part of a JPEG the crop box needs (the rows down to the box's
last one, the iMCU columns around it); a whole decode is what it replaces. To compare, run this
with --python naming another build's package folder (a checkout built before the change):

    python bench/bench_image_roi.py                          # this checkout's build
    python bench/bench_image_roi.py --python /tmp/base       # another build, same images

bench/image_region.c times the whole and the part decode (and each + the transform) side by side
on one build, without the batch around them.

Each row is the best of --repeat runs (wall rate, and CPU time per image over all threads, which
other work on a shared machine disturbs less). The set: --count JPEGs of ~500x375 at quality 90 (bench_images.py's, ImageNet-like), written once
as one tar shard under --dir and read from the page cache; each pass is a new epoch (new boxes).
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def make_shard(root, count):
    from bench_images import _one_jpeg
    path = os.path.join(root, f"roi-{count}.tar")
    if os.path.exists(path):
        return path
    os.makedirs(root, exist_ok=True)
    tmp = path + ".part"
    with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(count):
            data = _one_jpeg(i)
            ti = tarfile.TarInfo(f"{i:08d}.jpg")
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    os.replace(tmp, path)
    return path


def timed(fn, images_per_call, seconds):
    """-> (images per second of wall time, CPU milliseconds per image: the process's, all threads)."""
    fn()   # warm: threads, allocations, the page cache
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while True:
        fn()
        n += images_per_call
        if time.perf_counter() - t0 > seconds:
            return n / (time.perf_counter() - t0), (time.process_time() - c0) * 1e3 / n


def best(fn, images_per_call, seconds, repeat):
    """The best of `repeat` runs: a run only loses time to other work on the machine."""
    runs = [timed(fn, images_per_call, seconds) for _ in range(repeat)]
    return max(r[0] for r in runs), min(r[1] for r in runs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=512)
    ap.add_argument("--dir", default=os.environ.get("FERRY_BENCH_DIR", "/tmp/ferry-bench-roi"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs of each row")
    ap.add_argument("--python", help="the ferry package's parent folder (default: this checkout's python/)")
    ap.add_argument("--smoke", action="store_true", help="small and quick (make bench BENCH_ARGS=--smoke)")
    args = ap.parse_args()
    if args.smoke:
        args.count, args.batch, args.seconds, args.repeat = 64, 32, 0.2, 1
    sys.path.insert(0, HERE)
    sys.path.insert(0, args.python or os.path.join(HERE, "..", "python"))
    import numpy as np
    from ferry import images
    import ferry
    print(f"ferry from {os.path.dirname(ferry.__file__)}")
    shard = make_shard(args.dir, args.count)
    s = images.open_shards(shard)
    datas = [s.read(i, "jpg") for i in range(len(s))]
    b = min(args.batch, len(datas))
    out = np.zeros((b, 3, 224, 224), np.uint8)
    for t in [int(v) for v in args.threads.split(",")]:
        epoch = [0]

        def rrc():
            for k in range(0, len(datas) - b + 1, b):
                r = images.load_batch(s, list(range(k, k + b)), out, crop="random_resized", flip=0.5, seed=1,
                                      epoch=epoch[0], decode="cpu", threads=t)
                assert r["written"] == b
            epoch[0] += 1

        def full():
            for k in range(0, len(datas) - b + 1, b):
                images.decode_batch(datas[k:k + b], threads=t)
        per = (len(datas) // b) * b
        rrc_s, rrc_ms = best(rrc, per, args.seconds, args.repeat)
        full_s, full_ms = best(full, per, args.seconds, args.repeat)
        print(f"threads {t}: load_batch RandomResizedCrop(224) {rrc_s:6.0f} img/s {rrc_ms:5.2f} CPU ms/img   "
              f"decode_batch (whole decode, no transform) {full_s:6.0f} img/s {full_ms:5.2f} CPU ms/img")


if __name__ == "__main__":
    main()
